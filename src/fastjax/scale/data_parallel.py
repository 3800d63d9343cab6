"""Part II's two ResNet twins trained on one device, or data-parallel over a mesh (chapters/scale/02-devices.md):
the batch split by rows over the devices, the parameters and the optimizer state replicated."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
from flax import nnx

from fastjax.resnet import resnet_eqx, resnet_nnx, rungs as RR
from fastjax.scale import sharding


def _batches(xs, ys, mesh):
    for x, y in zip(xs, ys):
        yield (x, y) if mesh is None else sharding.shard_rows((x, y), mesh)


def nnx_train(config, xs, ys, mesh=None):
    """One NNX step per batch (``split_merge_step``): (final state, losses, the jitted step, its last arguments)."""
    model = resnet_nnx.make_model(config, seed=0)
    graphdef, state = nnx.split((model, nnx.Optimizer(model, RR.TX, wrt=nnx.Param)))
    step = jax.jit(RR.split_merge_step(graphdef))
    state = state if mesh is None else sharding.replicate(state, mesh)
    losses = []
    for x, y in _batches(xs, ys, mesh):
        state, loss = step(state, x, y)
        losses.append(float(loss))
    return state, np.array(losses), step, (state, x, y)


def eqx_train(config, xs, ys, mesh=None):
    """The same with the Equinox twin (``pytree_step``): (final arrays, losses, the jitted step, its last arguments)."""
    model, bn = resnet_eqx.make_model(config, seed=0)
    params, static = eqx.partition(model, eqx.is_array)
    opt = RR.TX.init(params)
    step = jax.jit(RR.pytree_step(static))
    if mesh is not None:
        params, bn, opt = sharding.replicate((params, bn, opt), mesh)
    losses = []
    for x, y in _batches(xs, ys, mesh):
        params, bn, opt, loss = step(params, bn, opt, x, y)
        losses.append(float(loss))
    return (params, bn, opt), np.array(losses), step, (params, bn, opt, x, y)
