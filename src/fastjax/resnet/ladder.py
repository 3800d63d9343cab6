"""The Part II rungs, built ready to run: each wraps the code exported from its chapter.

Each builder returns a :class:`Rung`: ``run(images, labels)`` does one dispatch (one train step,
or ``K`` steps for the scan rungs, whose inputs are then stacked ``(K, batch, ...)``) and returns
the loss(es); ``weights()`` reads the current weights in NNX layout; ``traces`` counts how often
the jitted body was traced. The step code itself lives in :mod:`fastjax.resnet.rungs` (written in
the chapters); this module only binds it to fresh weights. Every rung starts from the same weights
(``seed``) and uses the same Adam, so their loss trajectories agree (the tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fastjax import sizes
from fastjax.resnet import digits, resnet_eqx, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools.timing import count_traces

NNX_RUNGS = ("no-jit", "nnx.jit", "split/merge", "nnx.cached_partial", "nnx.jit(graph=False)",
             "nnx.jit_partial", "scan K=10", "scan K=10 unroll", "NamedTuple")
EQX_RUNGS = ("eqx.filter_jit", "eqx flatten trick", "eqx pytree + jax.jit")
SCAN_K = 10
# Weights after n Adam steps of two programs that round float32 differently (eager against compiled,
# NCHW against NHWC): float32 training is chaotic, so the two runs drift apart, and no margin below the
# bound holds at every size (a tenth of one step per step failed at full size on a conv kernel: 3.6e-3
# after 10 steps). The bound: an Adam step moves a weight by about the learning rate at most, so n steps
# of two runs can be about 2·n·lr apart. That is what we check; the first loss (assert_same_losses)
# is the tight check that both programs compute the same step. Measured at full size: 9.1e-3 for the
# Equinox twin after 10 steps (6e-2 allowed), 8.0e-6 eager against compiled after 5 steps. Programs that
# trace the same step (the NNX paths) end with identical weights and are checked tightly in their
# chapters instead.
# BatchNorm's running statistics ('.mean', '.var') are not Adam steps but averages of activations, which
# drift apart like the losses do, on the scale of the activations: they get LOSS_RTOL times the largest
# entry of that statistic, absolute (a running mean near 0 has no scale of its own). Measured at full size
# after 10 steps (Equinox twin): 5.2e-3 on a running variance of 1.6, 4.3e-3 on a running mean whose
# largest entry is 0.93.
WEIGHT_ATOL_PER_STEP = 2 * R.LEARNING_RATE
BATCH_STATS = (".mean", ".var")


# Losses of two programs that round differently, from the same weights: the first loss is one forward
# pass on identical weights, so it differs by rounding only (1e-5 relative allows for any CPU). Every
# Adam step then amplifies the difference (float32 training is chaotic): measured at full size after
# 10 steps, 6.7e-3 relative for the Equinox twin (NCHW) and 3.5e-4 for the rolled scan, against 1e-6
# or less in the quick size. We allow 2e-2 after the first step, three times the largest measured.
FIRST_LOSS_RTOL, LOSS_RTOL = 1e-5, 2e-2


def assert_same_losses(ours: np.ndarray, ref: np.ndarray, what: str = "") -> float:
    """Assert that two loss trajectories from the same weights agree (first loss to ``FIRST_LOSS_RTOL``,
    the rest to ``LOSS_RTOL``); return the largest relative difference."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: {ours.shape} losses against {ref.shape}"
    np.testing.assert_allclose(ours[:1], ref[:1], rtol=FIRST_LOSS_RTOL, err_msg=f"{what}: first loss")
    np.testing.assert_allclose(ours, ref, rtol=LOSS_RTOL, err_msg=what)
    return float(np.max(np.abs(ours / ref - 1)))


def assert_same_weights(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], n_steps: int) -> float:
    """Assert that two weight dicts (NNX layout) after ``n_steps`` Adam steps agree: parameters within
    ``n_steps * WEIGHT_ATOL_PER_STEP``, absolute; BatchNorm statistics within ``LOSS_RTOL`` times their
    largest entry. Return the largest absolute difference of the parameters."""
    assert ours.keys() == ref.keys(), f"different weights: {sorted(set(ours) ^ set(ref))}"
    for k in ours:
        stat = k.endswith(BATCH_STATS)
        atol = LOSS_RTOL * float(np.max(np.abs(ref[k]))) if stat else n_steps * WEIGHT_ATOL_PER_STEP
        np.testing.assert_allclose(ours[k], ref[k], rtol=0, atol=atol, err_msg=k)
    return max(float(np.max(np.abs(ours[k] - ref[k]))) for k in ours if not k.endswith(BATCH_STATS))


def settings() -> Any:
    """The sizes in force: network shape, batch size, steps and timing repeats. The quick network has
    one stage: compiling the train step dominates a quick build, and it grows with the layers."""
    return sizes.choose(
        quick=dict(config=ResNetConfig(width=8, stages=1, blocks=1), batch=32, steps=40, repeats=5),
        full=dict(config=ResNetConfig(width=16, stages=3, blocks=2), batch=96, steps=600, repeats=9),
    )


@dataclass
class Rung:
    """One variant: ``run`` does one dispatch of ``steps_per_call`` train steps."""

    name: str
    run: Callable[[jax.Array, jax.Array], jax.Array]
    weights: Callable[[], dict[str, np.ndarray]]
    steps_per_call: int = 1
    traces: count_traces | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _carried(name: str, jitted: Callable, carry: Any, weights: Callable[[Any], dict], counter: count_traces,
             k: int = 1, **extra: Any) -> Rung:
    """A rung whose jitted step maps ``(carry, images, labels) -> (carry, loss)``."""
    box = [carry]

    def run(x, y):
        box[0], loss = jitted(box[0], x, y)
        return loss

    return Rung(name, run, lambda: weights(box[0]), steps_per_call=k, traces=counter, extra=dict(extra))


def _nnx(name: str, config: ResNetConfig, seed: int) -> Rung:
    model = resnet_nnx.make_model(config, seed)
    opt = nnx.Optimizer(model, R.TX, wrt=nnx.Param)
    counter = count_traces(R.train_step)
    if name == "no-jit":
        return Rung(name, lambda x, y: counter(model, opt, x, y), lambda: resnet_nnx.weights(model), traces=counter)
    if name == "nnx.jit":
        step = nnx.jit(counter)
        return Rung(name, lambda x, y: step(model, opt, x, y), lambda: resnet_nnx.weights(model), traces=counter)
    if name in ("nnx.cached_partial", "nnx.jit(graph=False)", "nnx.jit_partial"):
        return Rung(name, R.nnx_fast_path(name, model, opt, counter), lambda: resnet_nnx.weights(model),
                    traces=counter)
    if name == "floor":
        graphdef, treedef, leaves = R.floor_start(model, opt)
        counter = count_traces(R.floor_step(graphdef, treedef))
        weights = lambda ls: resnet_nnx.weights(nnx.merge(graphdef, jax.tree.unflatten(treedef, ls))[0])  # noqa: E731
        return _carried(name, jax.jit(counter), leaves, weights, counter, leaves=len(leaves))
    graphdef, state = nnx.split((model, opt))
    weights = lambda st: resnet_nnx.weights(nnx.merge(graphdef, st)[0])  # noqa: E731
    if name == "split/merge":
        counter = count_traces(R.split_merge_step(graphdef))
        return _carried(name, jax.jit(counter), state, weights, counter)
    if name.startswith("scan"):
        counter = count_traces(R.scan_steps(graphdef, unroll=SCAN_K if name.endswith("unroll") else 1))
        return _carried(name, jax.jit(counter), state, weights, counter, k=SCAN_K)
    raise ValueError(f"unknown rung {name!r}; choose from {NNX_RUNGS + EQX_RUNGS + ('floor',)}")


def _named_tuple(config: ResNetConfig, seed: int) -> Rung:
    graphdef, ts = R.train_state(resnet_nnx.make_model(config, seed))
    counter = count_traces(R.state_step(graphdef))
    weights = lambda t: resnet_nnx.weights(nnx.merge(graphdef, t.params, t.batch_stats))  # noqa: E731
    return _carried("NamedTuple", jax.jit(counter), ts, weights, counter)


def _eqx(name: str, config: ResNetConfig, seed: int) -> Rung:
    model, state = resnet_eqx.from_nnx(resnet_nnx.make_model(config, seed))
    opt_state = R.TX.init(eqx.filter(model, eqx.is_array))
    params, static = eqx.partition(model, eqx.is_array)
    if name == "eqx.filter_jit":
        counter = count_traces(R.eqx_train_step)
        jitted, box = eqx.filter_jit(counter), [(model, state, opt_state)]

        def run(x, y):
            *box[0], loss = jitted(*box[0], x, y)
            return loss

        return Rung(name, run, lambda: resnet_eqx.weights(box[0][0], box[0][1]), traces=counter)
    if name == "eqx pytree + jax.jit":
        counter = count_traces(R.pytree_step(static))
        jitted = jax.jit(counter)

        def carried(c, x, y):
            *c, loss = jitted(*c, x, y)
            return tuple(c), loss

        weights = lambda c: resnet_eqx.weights(eqx.combine(c[0], static), c[1])  # noqa: E731
        return _carried(name, carried, (params, state, opt_state), weights, counter)
    if name != "eqx flatten trick":
        raise ValueError(f"unknown rung {name!r}; choose from {NNX_RUNGS + EQX_RUNGS + ('floor',)}")
    leaves, treedef = jax.tree.flatten((params, state, opt_state))
    counter = count_traces(R.flatten_trick_step(treedef, static))

    def weights(ls):
        p, s, _ = jax.tree.unflatten(treedef, ls)
        return resnet_eqx.weights(eqx.combine(p, static), s)

    return _carried(name, jax.jit(counter), leaves, weights, counter, leaves=len(leaves))


def build(name: str, config: ResNetConfig | None = None, seed: int = 0) -> Rung:
    """The rung called ``name`` (one of ``NNX_RUNGS``, ``EQX_RUNGS`` or ``"floor"``), freshly built."""
    config = config or settings().config
    if name == "NamedTuple":
        return _named_tuple(config, seed)
    if name in EQX_RUNGS:
        return _eqx(name, config, seed)
    return _nnx(name, config, seed)


def trajectory(rung: Rung, xs: Any, ys: Any) -> np.ndarray:
    """Train on the stacked batches ``xs (n, batch, 8, 8, 1)``, ``ys (n, batch)``; the n losses.
    ``n`` must be a multiple of the rung's steps per call. Reads the losses once, at the end."""
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    k = rung.steps_per_call
    if len(xs) % k:
        raise ValueError(f"{rung.name} runs {k} steps per call; {len(xs)} batches is not a multiple")
    if k == 1:
        return np.array([rung.run(x, y) for x, y in zip(xs, ys)])
    return np.concatenate([np.asarray(rung.run(xs[i:i + k], ys[i:i + k])) for i in range(0, len(xs), k)])


def training_batches(n_steps: int, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n_steps`` batches of the training split (the same for every rung)."""
    sp = digits.split()
    return digits.stack_batches(sp.train_images, sp.train_labels, batch, n_steps, seed)
