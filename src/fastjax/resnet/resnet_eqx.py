"""Tools around the Equinox twin of :mod:`fastjax.resnet.resnet_nnx`: build, load NNX weights, read, predict.

The network itself (``EqxResNet``, ``eqx_forward``, ``eqx_loss_fn``) is written in chapter
``resnet/00-network`` and exported to :mod:`fastjax.resnet.rungs`; it is re-exported here as
``ResNet``, ``forward`` and ``loss_fn``. Equinox layers act on one example, channels first
``(C, H, W)``; the batch comes from ``jax.vmap(..., axis_name="batch")``, over which BatchNorm averages. Its running statistics live
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
from fastjax.resnet.digits import check_batch
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.resnet.rungs import EqxResNet as ResNet
from fastjax.resnet.rungs import eqx_forward as forward
from fastjax.resnet.rungs import eqx_loss_fn as loss_fn

__all__ = ["ResNet", "accuracy", "forward", "from_nnx", "from_weights", "loss_fn", "make_model", "predict", "weights"]


def make_model(config: ResNetConfig, seed: int = 0) -> tuple[ResNet, eqx.nn.State]:
    """A freshly initialised network and its BatchNorm state (``eqx.nn.make_with_state``)."""
    return eqx.nn.make_with_state(ResNet)(config, jax.random.key(seed))


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
    """Build the Equinox network holding the weights of :func:`fastjax.resnet.resnet_nnx.weights`
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
            old_mean, old_var = state.get(m.batch_state_index)  # dtypes as Equinox makes them (float64 under x64)
            state = state.set(m.batch_state_index, (jnp.asarray(w[f"{name}.mean"], old_mean.dtype),
                                                    jnp.asarray(w[f"{name}.var"], old_var.dtype)))
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
    """The Equinox twin of an NNX :class:`fastjax.resnet.resnet_nnx.ResNet`, with the same weights."""
    from fastjax.resnet import resnet_nnx

    return from_weights(resnet_nnx.weights(nnx_model), nnx_model.config)


def weights(model: ResNet, state: eqx.nn.State) -> dict[str, np.ndarray]:
    """The weights in the NNX layout and naming of :func:`fastjax.resnet.resnet_nnx.weights` (running
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
