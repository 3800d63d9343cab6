"""The Equinox twin of :mod:`fastjax.resnet_nnx`: the same network, with Equinox's stateful BatchNorm.

Equinox layers act on one example, channels first ``(C, H, W)``; the batch comes from
``jax.vmap(..., axis_name="batch")``, over which BatchNorm averages. Its running statistics live
in an ``eqx.nn.State`` next to the model. ``mode="batch"`` normalises with the batch statistics
in training, as NNX does, and keeps the same running averages (zeros and ones to start,
momentum ``BN_MOMENTUM``); in inference it divides them by ``1 - momentumᵗ`` after ``t`` updates, where NNX
uses them as they are. :func:`from_nnx` loads NNX weights (``t`` set to 0, so both agree).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from fastjax import checks
from fastjax.digits import N_CLASSES, check_batch
from fastjax.resnet_nnx import BN_MOMENTUM, ResNetConfig, cross_entropy

AXIS = "batch"


def _conv(c_in: int, c_out: int, k: int, stride: int, key: jax.Array) -> eqx.nn.Conv2d:
    return eqx.nn.Conv2d(c_in, c_out, k, stride=stride, padding=(k - 1) // 2, use_bias=False, key=key)


def _bn(c: int) -> eqx.nn.BatchNorm:
    return eqx.nn.BatchNorm(c, axis_name=AXIS, momentum=BN_MOMENTUM, mode="batch")


class Block(eqx.Module):
    """Basic residual block, as in the NNX network (1×1 projection when shapes change)."""

    conv1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: eqx.nn.BatchNorm
    proj: eqx.nn.Conv2d | None
    proj_bn: eqx.nn.BatchNorm | None

    def __init__(self, c_in: int, c_out: int, stride: int, key: jax.Array):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1, self.bn1 = _conv(c_in, c_out, 3, stride, k1), _bn(c_out)
        self.conv2, self.bn2 = _conv(c_out, c_out, 3, 1, k2), _bn(c_out)
        if stride != 1 or c_in != c_out:
            self.proj, self.proj_bn = _conv(c_in, c_out, 1, stride, k3), _bn(c_out)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        y, state = self.bn1(self.conv1(x), state)
        y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
        if self.proj is None:
            short = x
        else:
            short, state = self.proj_bn(self.proj(x), state)
        return jax.nn.relu(y + short), state


class ResNet(eqx.Module):
    """One example ``(1, 8, 8)`` and the BatchNorm state in, ``(logits (10,), state)`` out."""

    stem: eqx.nn.Conv2d
    stem_bn: eqx.nn.BatchNorm
    blocks: list[Block]
    head: eqx.nn.Linear

    def __init__(self, config: ResNetConfig, key: jax.Array):
        keys = iter(jax.random.split(key, 2 + config.stages * config.blocks))
        self.stem, self.stem_bn = _conv(1, config.width, 3, 1, next(keys)), _bn(config.width)
        blocks, c_in = [], config.width
        for s, c_out in enumerate(config.stage_widths()):
            for b in range(config.blocks):
                blocks.append(Block(c_in, c_out, 2 if (s > 0 and b == 0) else 1, next(keys)))
                c_in = c_out
        self.blocks = blocks
        self.head = eqx.nn.Linear(c_in, N_CLASSES, key=next(keys))

    def __call__(self, x: jax.Array, state: eqx.nn.State) -> tuple[jax.Array, eqx.nn.State]:
        x, state = self.stem_bn(self.stem(x), state)
        x = jax.nn.relu(x)
        for block in self.blocks:
            x, state = block(x, state)
        return self.head(x.mean(axis=(1, 2))), state


def make_model(config: ResNetConfig, seed: int = 0) -> tuple[ResNet, eqx.nn.State]:
    """A freshly initialised network and its BatchNorm state (``eqx.nn.make_with_state``)."""
    return eqx.nn.make_with_state(ResNet)(config, jax.random.key(seed))


def forward(model: ResNet, state: eqx.nn.State, images: jax.Array) -> tuple[jax.Array, eqx.nn.State]:
    """Logits ``(batch, 10)`` of NHWC images and the updated state (batch axis named ``"batch"``)."""
    chw = jnp.transpose(images, (0, 3, 1, 2))
    return jax.vmap(model, axis_name=AXIS, in_axes=(0, None), out_axes=(0, None))(chw, state)


def loss_fn(model: ResNet, state: eqx.nn.State, images: jax.Array,
            labels: jax.Array) -> tuple[jax.Array, eqx.nn.State]:
    """Mean cross-entropy (nats per example) and the updated BatchNorm state."""
    logits, state = forward(model, state, images)
    return cross_entropy(logits, labels), state


def predict(model: ResNet, state: eqx.nn.State, images: Any, batch_size: int = 512) -> np.ndarray:
    """Class predictions with the running statistics (inference mode)."""
    images = checks.check_images(images, (8, 8, 1), "images")
    inf = eqx.nn.inference_mode(model)
    out = [np.asarray(jnp.argmax(forward(inf, state, jnp.asarray(images[i:i + batch_size]))[0], -1))
           for i in range(0, len(images), batch_size)]
    return np.concatenate(out)


def accuracy(model: ResNet, state: eqx.nn.State, images: Any, labels: Any) -> float:
    """Fraction of correctly classified images (inference mode)."""
    images, labels = check_batch(images, labels)
    return float(np.mean(predict(model, state, images) == labels))


def _layers(model: ResNet) -> list[tuple[str, Any]]:
    out = [("stem", model.stem), ("stem_bn", model.stem_bn)]
    for i, b in enumerate(model.blocks):
        out += [(f"blocks.{i}.{n}", getattr(b, n)) for n in ("conv1", "bn1", "conv2", "bn2", "proj", "proj_bn")
                if getattr(b, n) is not None]
    return out + [("head", model.head)]


def from_weights(w: dict[str, np.ndarray], config: ResNetConfig) -> tuple[ResNet, eqx.nn.State]:
    """Build the Equinox network holding the weights of :func:`fastjax.resnet_nnx.weights`
    (conv kernels HWIO → OIHW, dense (in, out) → (out, in)); BatchNorm counters start at 0."""
    model, state = eqx.filter_eval_shape(make_model, config)  # structure only: nothing runs
    layers = _layers(model)
    expected = sum(4 if isinstance(m, eqx.nn.BatchNorm) else (2 if isinstance(m, eqx.nn.Linear) else 1)
                   for _, m in layers)
    if len(w) != expected:
        raise ValueError(f"expected {expected} weight arrays for {config}; got {len(w)}")
    new = []
    for name, m in layers:
        if isinstance(m, eqx.nn.Conv2d):
            new.append(np.transpose(w[f"{name}.kernel"], (3, 2, 0, 1)))
        elif isinstance(m, eqx.nn.Linear):
            new += [w[f"{name}.kernel"].T, w[f"{name}.bias"]]
        else:
            new += [w[f"{name}.scale"], w[f"{name}.bias"]]
            state = state.set(m.batch_state_index, (jnp.asarray(w[f"{name}.mean"]), jnp.asarray(w[f"{name}.var"])))
            state = state.set(m.batch_counter, jnp.array(0))  # weakly typed int, as Equinox makes it

    def where(mdl: ResNet) -> list[jax.Array]:
        out = []
        for _, m in _layers(mdl):
            out += [m.weight] if isinstance(m, eqx.nn.Conv2d) else [m.weight, m.bias]
        return out

    olds = where(model)
    for old, arr in zip(olds, new):
        if old.shape != arr.shape:
            raise ValueError(f"weight of shape {arr.shape} does not fit a layer of shape {old.shape}")
    model = eqx.tree_at(where, model, [jnp.asarray(a, dtype=o.dtype) for a, o in zip(new, olds)])
    return model, state


def from_nnx(nnx_model: Any) -> tuple[ResNet, eqx.nn.State]:
    """The Equinox twin of an NNX :class:`fastjax.resnet_nnx.ResNet`, with the same weights."""
    from fastjax import resnet_nnx

    return from_weights(resnet_nnx.weights(nnx_model), nnx_model.config)


def weights(model: ResNet, state: eqx.nn.State) -> dict[str, np.ndarray]:
    """The weights in the NNX layout and naming of :func:`fastjax.resnet_nnx.weights` (running
    statistics as stored, before Equinox's inference-time debiasing)."""
    out: dict[str, np.ndarray] = {}
    for name, m in _layers(model):
        if isinstance(m, eqx.nn.Conv2d):
            out[f"{name}.kernel"] = np.transpose(np.asarray(m.weight), (2, 3, 1, 0))
        elif isinstance(m, eqx.nn.Linear):
            out[f"{name}.kernel"], out[f"{name}.bias"] = np.asarray(m.weight).T, np.asarray(m.bias)
        else:
            mean, var = state.get(m.batch_state_index)
            out.update({f"{name}.scale": np.asarray(m.weight), f"{name}.bias": np.asarray(m.bias),
                        f"{name}.mean": np.asarray(mean), f"{name}.var": np.asarray(var)})
    return dict(sorted(out.items()))
