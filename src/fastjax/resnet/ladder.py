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

# How the book checks that two programs train the network the same way. Two programs that compute the
# same step (eager against compiled, NCHW against NHWC, patches against XLA's convolutions) differ in
# float32 by the order of their sums, and Adam turns that into weight differences that say little about
# the step: it divides each gradient entry by its own running size, so an entry near zero, whose float32
# rounding is a large part of it, gets a step that rounding changes by far more than it changes the
# gradient as a whole. Measured at full size (float32, same start, same batches): the weights of the
# Equinox twin and of the floor are 1.2e-5 apart after one step and 9.1e-3 after ten (an Adam step moves
# a weight by about lr = 3e-3), while Part V's faster floor stays 1.1e-5 apart for ten steps; in float64
# neither difference grows (below). Why the Equinox twin's float32 difference grows, we have not found.
# A bound that the float32 weights of every such pair meet after n steps is about the distance n steps
# move a weight, which a wrong step meets too. So three checks:
#
# 1. The first gradient (assert_same_gradients), from the same weights and batch, in float32: both
#    programs compute it, nothing has been amplified yet. Each array within GRAD_RTOL of the
#    reference, in the 2-norm: entries near zero differ by far more than 1e-5 of themselves (5 % measured
#    at full size), which the norm weighs by their size. Measured worst at full size: 2.1e-6 (Equinox
#    twin), 2.0e-6 (eager), 1.2e-6 (faster floor); at the quick size 2.3e-6. 1e-5 is 5 times the worst
#    measured; a gradient 1 % off (scaled by 1.01) is 1e-2 off, a dropped term more.
#    The gradient is read from Adam's first moment after the first step: from zero, mu = (1 - b1)·g.
# 2. The weights after n steps in float64 (assert_same_weights, on runs made with float64=True): float64
#    rounding (unit roundoff 1.1e-16) is far below Adam's eps (1e-8), so no entry's rounding is amplified.
#    Measured at full size after ten steps: 2.5e-14 (Equinox twin), 6.1e-15 (faster floor), the same as
#    after one step (no growth); running statistics 6.4e-15 of their scale. WEIGHT_ATOL_F64 = 1e-10
#    (absolute on weights of order 0.01 to 1; relative to the largest entry for running statistics) is
#    4,000 times the largest measured and 10⁶ float64 roundings of an O(1) weight.
# 3. The losses in float32 (assert_same_losses): the first to FIRST_LOSS_RTOL, the rest to LOSS_RTOL.
# Programs that trace the same step (the NNX paths) end with identical float32 weights and are checked
# tightly (assert_allclose) in their chapters and tests.
GRAD_RTOL = 1e-5
WEIGHT_ATOL_F64 = 1e-10
ADAM_B1 = 0.9  # optax.adam's default first-moment decay, which R.TX uses (tests/test_resnet_ladder.py checks)
BATCH_STATS = (".mean", ".var")


# Losses of two programs that round differently, from the same weights: the first loss is one forward
# pass on identical weights, so it differs by rounding only (1e-5 relative allows for any CPU). Every
# Adam step then amplifies the difference (see above): measured at full size after 10 steps, 6.7e-3
# relative for the Equinox twin (NCHW) and 3.5e-4 for the rolled scan, against 1e-6 or less in the quick
# size. We allow 2e-2 after the first step, three times the largest measured: it catches a step that
# stops training or trains another network, not a subtle error (the gradient check is for that).
FIRST_LOSS_RTOL, LOSS_RTOL = 1e-5, 2e-2


def assert_same_losses(ours: np.ndarray, ref: np.ndarray, what: str = "") -> float:
    """Assert that two loss trajectories from the same weights agree (first loss to ``FIRST_LOSS_RTOL``,
    the rest to ``LOSS_RTOL``); return the largest relative difference."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape:
        raise AssertionError(f"{what}: {ours.shape} losses against {ref.shape}")
    np.testing.assert_allclose(ours[:1], ref[:1], rtol=FIRST_LOSS_RTOL, err_msg=f"{what}: first loss")
    np.testing.assert_allclose(ours, ref, rtol=LOSS_RTOL, err_msg=what)
    return float(np.max(np.abs(ours / ref - 1)))


def _same_keys(ours: dict, ref: dict, what: str) -> None:
    if ours.keys() != ref.keys():
        raise AssertionError(f"{what}: different arrays: {sorted(set(ours) ^ set(ref))}")


def assert_same_gradients(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str = "") -> float:
    """Assert that two gradients (dicts of arrays in NNX naming, as :func:`first_gradient` reads them) agree:
    each array within ``GRAD_RTOL`` of the reference in the 2-norm, ``‖ours − ref‖ ≤ GRAD_RTOL·‖ref‖``.
    Return the largest such relative difference."""
    _same_keys(ours, ref, what)
    worst = 0.0
    for k in ref:
        a, b = np.asarray(ours[k], np.float64), np.asarray(ref[k], np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"{what}: {k} has shape {a.shape} against {b.shape}")
        gap = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))
        if not gap <= GRAD_RTOL:  # also fails on NaN
            raise AssertionError(f"{what}: gradient of {k} differs by {gap:.2e} of its norm (allowed {GRAD_RTOL:.0e})")
        worst = max(worst, gap)
    return worst


def assert_same_weights(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str = "") -> float:
    """Assert that two weight dicts (NNX naming) from float64 runs agree: parameters within
    ``WEIGHT_ATOL_F64``, absolute; BatchNorm running statistics within ``WEIGHT_ATOL_F64`` times their
    largest entry. Float32 weights are refused (a ValueError): float32 training drifts apart by far more
    than rounding (see the comment above ``GRAD_RTOL``). Return the largest parameter difference."""
    _same_keys(ours, ref, what)
    low = sorted(k for d in (ours, ref) for k in d if np.asarray(d[k]).dtype != np.float64)
    if low:
        raise ValueError(f"{what}: assert_same_weights compares float64 runs (build(..., float64=True)); "
                         f"{low[0]} is {np.asarray((ours | ref)[low[0]]).dtype}")
    worst = 0.0
    for k in ref:
        stat = k.endswith(BATCH_STATS)
        atol = WEIGHT_ATOL_F64 * (float(np.max(np.abs(ref[k]))) if stat else 1.0)
        np.testing.assert_allclose(ours[k], ref[k], rtol=0, atol=atol, err_msg=f"{what}: {k}")
        if not stat:
            worst = max(worst, float(np.max(np.abs(ours[k] - ref[k]))))
    return worst


def to_float64(tree: Any) -> Any:
    """``tree`` with every floating-point array cast to float64 (the rest, such as Adam's integer step count, kept).
    Call it inside ``with jax.enable_x64(True):``; outside, JAX has no float64 and a RuntimeError says so."""
    if jax.dtypes.canonicalize_dtype(jnp.float64) != jnp.float64:
        raise RuntimeError("float64 needs x64: call this inside `with jax.enable_x64(True):`")
    floating = lambda a: isinstance(a, (jax.Array, np.ndarray)) and jnp.issubdtype(a.dtype, jnp.floating)  # noqa: E731
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if floating(a) else a, tree)


def _dotted(tree: Any) -> dict[str, np.ndarray]:
    """A nested mapping of arrays (an nnx.State or plain dicts) as ``{'a.b.c': array}``."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(tree) if isinstance(tree, nnx.State)
                                                           else tree)[0]:
        out[".".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path)] = np.asarray(leaf)
    return out


def first_gradient(adam_state: Any, params_like: Callable[[Any], dict[str, np.ndarray]] | None = None
                   ) -> dict[str, np.ndarray]:
    """The gradient of the first step, read from Adam's state after exactly one step from a fresh state:
    its first moment is then ``(1 − b1)·g``. ``adam_state`` is ``optax.adam``'s state (an
    ``nnx.Optimizer``'s ``opt_state`` or optax's own); ``params_like`` maps its first moment to NNX
    naming where it is not nested dicts (Equinox). A state past its first step raises a ValueError."""
    scale = adam_state[0]
    count = int(np.asarray(scale.count[...] if isinstance(scale.count, nnx.Variable) else scale.count))
    if count != 1:
        raise ValueError(f"Adam has taken {count} steps: the first moment is the gradient only after exactly one")
    mu = params_like(scale.mu) if params_like is not None else _dotted(scale.mu)
    return {k: np.asarray(v) / (1 - ADAM_B1) for k, v in mu.items()}


def eqx_first_gradient(opt_state: Any, static: Any, bn_state: Any) -> dict[str, np.ndarray]:
    """:func:`first_gradient` of an Equinox rung, in NNX naming: Adam's first moment has the structure of
    the model's arrays (``eqx.partition``'s first part), ``static`` the rest, ``bn_state`` the BatchNorm state."""
    def params_like(mu: Any) -> dict[str, np.ndarray]:
        named = resnet_eqx.weights(eqx.combine(mu, static), bn_state)
        return {k: v for k, v in named.items() if not k.endswith(BATCH_STATS)}

    return first_gradient(opt_state, params_like)


def trajectory_with_gradient(rung: Rung, xs: Any, ys: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """:func:`trajectory`, and the gradient of its first step (``rung.gradient`` read after that step);
    for a fresh rung of one step per call."""
    if rung.gradient is None or rung.steps_per_call != 1:
        raise ValueError(f"{rung.name} cannot show its first gradient: it runs {rung.steps_per_call} steps per call")
    first = trajectory(rung, xs[:1], ys[:1])
    gradient = rung.gradient()
    return np.concatenate([first, trajectory(rung, xs[1:], ys[1:])]), gradient


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
    gradient: Callable[[], dict[str, np.ndarray]] | None = None  # after exactly one step: see first_gradient


def _carried(name: str, jitted: Callable, carry: Any, weights: Callable[[Any], dict], counter: count_traces,
             k: int = 1, gradient: Callable[[Any], dict] | None = None, **extra: Any) -> Rung:
    """A rung whose jitted step maps ``(carry, images, labels) -> (carry, loss)``; ``weights`` and
    ``gradient`` read the carry."""
    box = [carry]

    def run(x, y):
        box[0], loss = jitted(box[0], x, y)
        return loss

    return Rung(name, run, lambda: weights(box[0]), steps_per_call=k, traces=counter, extra=dict(extra),
                gradient=None if gradient is None else (lambda: gradient(box[0])))


def _model(config: ResNetConfig, seed: int, float64: bool) -> resnet_nnx.ResNet:
    model = resnet_nnx.make_model(config, seed)
    if float64:  # before the optimizer is made, so that Adam's moments are float64 too
        nnx.update(model, to_float64(nnx.state(model)))
    return model


def _nnx(name: str, config: ResNetConfig, seed: int, float64: bool) -> Rung:
    model = _model(config, seed, float64)
    opt = nnx.Optimizer(model, R.TX, wrt=nnx.Param)
    counter = count_traces(R.train_step)
    objects = dict(weights=lambda: resnet_nnx.weights(model), traces=counter,
                   gradient=lambda: first_gradient(opt.opt_state))
    if name == "no-jit":
        return Rung(name, lambda x, y: counter(model, opt, x, y), **objects)
    if name == "nnx.jit":
        step = nnx.jit(counter)
        return Rung(name, lambda x, y: step(model, opt, x, y), **objects)
    if name in ("nnx.cached_partial", "nnx.jit(graph=False)", "nnx.jit_partial"):
        return Rung(name, R.nnx_fast_path(name, model, opt, counter), **objects)
    if name == "floor":
        graphdef, treedef, leaves = R.floor_start(model, opt)
        counter = count_traces(R.floor_step(graphdef, treedef))
        merged = lambda ls: nnx.merge(graphdef, jax.tree.unflatten(treedef, ls))  # noqa: E731
        return _carried(name, jax.jit(counter), leaves, lambda ls: resnet_nnx.weights(merged(ls)[0]), counter,
                        gradient=lambda ls: first_gradient(merged(ls)[1].opt_state), leaves=len(leaves))
    graphdef, state = nnx.split((model, opt))
    weights = lambda st: resnet_nnx.weights(nnx.merge(graphdef, st)[0])  # noqa: E731
    if name == "split/merge":
        counter = count_traces(R.split_merge_step(graphdef))
        return _carried(name, jax.jit(counter), state, weights, counter,
                        gradient=lambda st: first_gradient(nnx.merge(graphdef, st)[1].opt_state))
    if name.startswith("scan"):  # K steps per call: no state after exactly one step, so no gradient
        counter = count_traces(R.scan_steps(graphdef, unroll=SCAN_K if name.endswith("unroll") else 1))
        return _carried(name, jax.jit(counter), state, weights, counter, k=SCAN_K)
    raise ValueError(f"unknown rung {name!r}; choose from {NNX_RUNGS + EQX_RUNGS + ('floor',)}")


def _named_tuple(config: ResNetConfig, seed: int, float64: bool) -> Rung:
    graphdef, ts = R.train_state(_model(config, seed, float64))
    counter = count_traces(R.state_step(graphdef))
    weights = lambda t: resnet_nnx.weights(nnx.merge(graphdef, t.params, t.batch_stats))  # noqa: E731
    return _carried("NamedTuple", jax.jit(counter), ts, weights, counter,
                    gradient=lambda t: first_gradient(t.opt_state))


def _eqx(name: str, config: ResNetConfig, seed: int, float64: bool) -> Rung:
    model, state = resnet_eqx.from_nnx(resnet_nnx.make_model(config, seed))
    if float64:
        model, state = to_float64(model), to_float64(state)
    opt_state = R.TX.init(eqx.filter(model, eqx.is_array))
    params, static = eqx.partition(model, eqx.is_array)

    def gradient(adam_state, bn_state):
        return eqx_first_gradient(adam_state, static, bn_state)

    if name == "eqx.filter_jit":
        counter = count_traces(R.eqx_train_step)
        jitted, box = eqx.filter_jit(counter), [(model, state, opt_state)]

        def run(x, y):
            *box[0], loss = jitted(*box[0], x, y)
            return loss

        return Rung(name, run, lambda: resnet_eqx.weights(box[0][0], box[0][1]), traces=counter,
                    gradient=lambda: gradient(box[0][2], box[0][1]))
    if name == "eqx pytree + jax.jit":
        counter = count_traces(R.pytree_step(static))
        jitted = jax.jit(counter)

        def carried(c, x, y):
            *c, loss = jitted(*c, x, y)
            return tuple(c), loss

        weights = lambda c: resnet_eqx.weights(eqx.combine(c[0], static), c[1])  # noqa: E731
        return _carried(name, carried, (params, state, opt_state), weights, counter,
                        gradient=lambda c: gradient(c[2], c[1]))
    if name != "eqx flatten trick":
        raise ValueError(f"unknown rung {name!r}; choose from {NNX_RUNGS + EQX_RUNGS + ('floor',)}")
    leaves, treedef = jax.tree.flatten((params, state, opt_state))
    counter = count_traces(R.flatten_trick_step(treedef, static))

    def weights(ls):
        p, s, _ = jax.tree.unflatten(treedef, ls)
        return resnet_eqx.weights(eqx.combine(p, static), s)

    def trick_gradient(ls):
        _, s, o = jax.tree.unflatten(treedef, ls)
        return gradient(o, s)

    return _carried(name, jax.jit(counter), leaves, weights, counter, gradient=trick_gradient, leaves=len(leaves))


def build(name: str, config: ResNetConfig | None = None, seed: int = 0, float64: bool = False) -> Rung:
    """The rung called ``name`` (one of ``NNX_RUNGS``, ``EQX_RUNGS`` or ``"floor"``), freshly built.
    ``float64=True`` builds it on float64 weights (call it, and run it on float64 images, inside
    ``with jax.enable_x64(True):``): the runs that :func:`assert_same_weights` compares."""
    config = config or settings().config
    if name == "NamedTuple":
        return _named_tuple(config, seed, float64)
    if name in EQX_RUNGS:
        return _eqx(name, config, seed, float64)
    return _nnx(name, config, seed, float64)


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
