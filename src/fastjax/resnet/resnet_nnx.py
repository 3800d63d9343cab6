"""A small ResNet in Flax NNX for 8×8 digits: basic residual blocks, BatchNorm, global average pool.

Images are NHWC ``(batch, 8, 8, 1)``. The stem is a 3×3 convolution to ``width`` channels; stage
``s`` holds ``blocks`` basic blocks of ``width·2ˢ`` channels, the first of which halves the
spatial size from the second stage on. Convolutions have no bias (BatchNorm follows each one).
Weights can be read as a canonical dict (:func:`weights`) that :mod:`fastjax.resnet.resnet_eqx` loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fastjax import checks
from fastjax.resnet.digits import N_CLASSES, check_batch

BN_MOMENTUM = 0.9  # running statistics forget old batches fast enough for short runs


@dataclass(frozen=True)
class ResNetConfig:
    """Shape of the network: stem ``width`` channels, ``stages`` stages of ``blocks`` blocks."""

    width: int = 8
    stages: int = 2
    blocks: int = 1

    def __post_init__(self) -> None:
        for name in ("width", "stages", "blocks"):
            checks.check_positive_int(getattr(self, name), name)

    def stage_widths(self) -> list[int]:
        """Channels of each stage: width, 2·width, 4·width, ..."""
        return [self.width * 2**s for s in range(self.stages)]


def _conv(c_in: int, c_out: int, k: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    pad = (k - 1) // 2
    return nnx.Conv(c_in, c_out, (k, k), strides=(stride, stride), padding=((pad, pad), (pad, pad)),
                    use_bias=False, rngs=rngs)


class Block(nnx.Module):
    """Basic residual block: conv-BN-relu-conv-BN, plus a 1×1 conv-BN shortcut when shapes change."""

    def __init__(self, c_in: int, c_out: int, stride: int, rngs: nnx.Rngs):
        self.conv1 = _conv(c_in, c_out, 3, stride, rngs)
        self.bn1 = nnx.BatchNorm(c_out, momentum=BN_MOMENTUM, rngs=rngs)
        self.conv2 = _conv(c_out, c_out, 3, 1, rngs)
        self.bn2 = nnx.BatchNorm(c_out, momentum=BN_MOMENTUM, rngs=rngs)
        if stride != 1 or c_in != c_out:
            self.proj = _conv(c_in, c_out, 1, stride, rngs)
            self.proj_bn = nnx.BatchNorm(c_out, momentum=BN_MOMENTUM, rngs=rngs)
        else:
            self.proj = self.proj_bn = None

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        short = x if self.proj is None else self.proj_bn(self.proj(x))
        return nnx.relu(y + short)


class ResNet(nnx.Module):
    """The Part II network: ``ResNet(config, rngs=nnx.Rngs(seed))(images) -> logits (batch, 10)``."""

    def __init__(self, config: ResNetConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.stem = _conv(1, config.width, 3, 1, rngs)
        self.stem_bn = nnx.BatchNorm(config.width, momentum=BN_MOMENTUM, rngs=rngs)
        blocks, c_in = [], config.width
        for s, c_out in enumerate(config.stage_widths()):
            for b in range(config.blocks):
                blocks.append(Block(c_in, c_out, 2 if (s > 0 and b == 0) else 1, rngs))
                c_in = c_out
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(c_in, N_CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


def init_weights(model: ResNet, seed: int) -> None:
    """Overwrite the weights in place with NumPy draws: He-normal convolutions (std √(2/fan_in)),
    head N(0, 1/fan_in), zero biases, unit scales, BatchNorm statistics 0 and 1."""
    rng = np.random.default_rng(seed)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat))):
        shape, leaf = var[...].shape, str(path[-1])
        if leaf == "kernel":
            fan_in = int(np.prod(shape[:-1]))
            gain = 1.0 if path[0] == "head" else 2.0
            value = rng.standard_normal(shape) * np.sqrt(gain / fan_in)
        else:
            value = np.ones(shape) if leaf in ("scale", "var") else np.zeros(shape)
        var[...] = jnp.asarray(value, dtype=jnp.float32)


def make_model(config: ResNetConfig, seed: int = 0) -> ResNet:
    """A fresh network in train mode (BatchNorm uses batch statistics), built without running
    any JAX initialiser: the structure comes from ``nnx.eval_shape`` (no compilation) and the
    weights from :func:`init_weights`, so creating a model costs milliseconds, not seconds."""
    abstract = nnx.eval_shape(lambda: ResNet(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), state)
    model = nnx.merge(graphdef, state)
    init_weights(model, seed)
    return model


def predict(model: ResNet, images, batch_size: int = 512) -> np.ndarray:
    """Class predictions with the running BatchNorm statistics (eval mode); ``images`` is checked."""
    images = checks.check_images(images, (8, 8, 1), "images")
    model.eval()
    try:
        out = [np.asarray(jnp.argmax(model(jnp.asarray(images[i:i + batch_size])), -1))
               for i in range(0, len(images), batch_size)]
    finally:
        model.train()
    return np.concatenate(out)


def accuracy(model: ResNet, images, labels) -> float:
    """Fraction of correctly classified images (eval mode)."""
    images, labels = check_batch(images, labels)
    return float(np.mean(predict(model, images) == labels))


def weights(model: ResNet) -> dict[str, np.ndarray]:
    """Every parameter and BatchNorm statistic as NumPy, keyed by path ('blocks.0.conv1.kernel'),
    in NNX layout (conv kernels HWIO, dense kernel (in, out))."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat)))
    return {".".join(map(str, path)): np.asarray(var[...]) for path, var in flat}
