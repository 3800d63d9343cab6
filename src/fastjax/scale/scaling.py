"""The scaling sweep of Part V's devices page (chapters/scale/02-devices.md): the PLN fit and Part II's
NNX train step, compiled ahead of time on meshes over the first k devices, timed in turns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fastjax import pln
from fastjax.pln import bench as bench_pln, rungs as R
from fastjax.resnet import resnet_nnx, rungs as RR
from fastjax.scale import sharding
from fastjax.tools import timing


def over_meshes(data: pln.PlnData, counts, n_iter: int, config, images, labels, rounds: int) -> dict[str, timing.Timing]:
    """For each device count k of ``counts``: the PLN fit (``n_iter`` iterations, tolerance 0, per iteration)
    and one NNX train step (``split_merge_step`` on the batch ``images, labels``), data split by rows over a
    mesh of k devices (automatic axes), the parameters replicated; medians of ``rounds`` rounds in turns,
    named 'PLN, k devices' and 'ResNet step, k devices'."""
    calls = {}
    for k in counts:
        m_k = sharding.sample_mesh(k, explicit=False)
        args = (sharding.shard_rows(pln.start(data), m_k), sharding.shard_rows(data, m_k), jnp.float32(0),
                jnp.float32(jnp.inf))
        fit_k = timing.compile_time(R.fit_until_converged, *args, maxiter=n_iter).compiled
        calls[f"PLN, {k} devices"] = ((lambda f=fit_k, a=args: f(*a)), n_iter)
        model = resnet_nnx.make_model(config, seed=0)
        graphdef, state = nnx.split((model, nnx.Optimizer(model, RR.TX, wrt=nnx.Param)))
        net_args = (sharding.replicate(state, m_k), *sharding.shard_rows((images, labels), m_k))
        step_k = timing.compile_time(jax.jit(RR.split_merge_step(graphdef)), *net_args).compiled
        calls[f"ResNet step, {k} devices"] = ((lambda f=step_k, a=net_args: f(*a)), 1)
    return {t.name: t for t in bench_pln.interleaved(calls, rounds)}
