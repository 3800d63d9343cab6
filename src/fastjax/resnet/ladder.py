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
# a weight by about lr = 3e-3), while Part VI's faster floor stays 1.1e-5 apart for ten steps; in float64
# neither difference grows (below). Why the Equinox twin's float32 difference grows, we have not found.
# A bound that the float32 weights of every such pair meet after n steps is about the distance n steps
# move a weight, which a wrong step meets too. And a float32 bound on the first gradient is a bound on
# how a program's sums are ordered, which changes with the CPU: the eager step's first gradient was
# 2e-6 of its norm from the floor's with AVX2 code and 2.3e-5 (blocks.0.bn1.bias) with AVX-512 code,
# the same program on the same machine (XLA_FLAGS=--xla_cpu_max_isa=...). So the same-step checks run
# in float64, where the bound follows from the unit roundoff and holds for any instruction set:
#
# 1. The first gradient (assert_same_gradients), from the same weights and batch: each array within a
#    bound of the reference in the 2-norm. Derivation: a program's relative error in a gradient is κ·u,
#    with u the unit roundoff and κ what its sums and the network's depth make of it. κ can be read off
#    float32, where the error is visible: the float32 first gradients of the eager step, the Equinox twin
#    and the floor were at most 2.7e-5 of their norm from the float64 gradient (quick size, every
#    --xla_cpu_max_isa from SSE4_2 to AVX512), κ ≈ 450. ROUNDING_GROWTH = 1,000 is the κ the checks
#    assume, and tests/test_resnet_ladder.py (run under every instruction set by tests/test_isa.py) fails
#    where a rung's float32 gradient needs more. Two programs then differ by at most 2·κ·u:
#    - in float64 (runs built with float64=True; u = 1.1e-16): 2.2e-13 (measured: 3.4e-14 at most, eager
#      against the floor with AVX-512 code). GRAD_RTOL_F64 = 1e-10 is that times 450, for networks deeper
#      than the ones measured. The tests compare in float64.
#    - in float32 (u = 6.0e-8): GRAD_RTOL_F32 = 2·κ·u = 1.2e-4 (measured: 3.9e-5 at most, eager against
#      the floor with AVX-512 code, 2e-6 with AVX2). The chapters compare their float32 runs with it.
#    Either way a gradient 1 % off (scaled by 1.01) is 1e-2 off, a dropped term more.
#    The gradient is read from Adam's first moment after the first step: from zero, mu = (1 - b1)·g.
# 2. The weights after n steps in float64 (assert_same_weights, on runs made with float64=True): float64
#    rounding (unit roundoff 1.1e-16) is far below Adam's eps (1e-8), so no entry's rounding is amplified.
#    Measured at full size after ten steps: 2.5e-14 (Equinox twin), 6.1e-15 (faster floor), the same as
#    after one step (no growth); running statistics 6.4e-15 of their scale. WEIGHT_ATOL_F64 = 1e-10
#    (absolute on weights of order 0.01 to 1; relative to the largest entry for running statistics) is
#    4,000 times the largest measured and 10⁶ float64 roundings of an O(1) weight.
# 3. The float32 losses (assert_same_losses), as a check that the float32 program the book times trains
#    at all: see FIRST_LOSS_RTOL and LOSS_RTOL below.
# Programs that trace the same step (the NNX paths) end with identical float32 weights and are checked
# tightly (assert_allclose) in their chapters and tests.
ROUNDING_GROWTH = 1_000
U32, U64 = float(np.finfo(np.float32).eps) / 2, float(np.finfo(np.float64).eps) / 2  # unit roundoffs
GRAD_RTOL_F64 = 1e-10
GRAD_RTOL_F32 = 2 * ROUNDING_GROWTH * U32
WEIGHT_ATOL_F64 = 1e-10
ADAM_B1 = 0.9  # optax.adam's default first-moment decay, which R.TX uses (tests/test_resnet_ladder.py checks)
BATCH_STATS = (".mean", ".var")


# One forward pass of two float32 programs from identical weights (the logits, a batch's statistics, the
# first loss): each program is κ·u32 off the exact result, so two differ by at most 2·κ·u32 with the κ
# above (a gradient passes through the network twice, a forward pass once): FORWARD_RTOL_F32 = 1.2e-4,
# in the norm of each array (assert_same_forward) and for the first loss. Every Adam step then amplifies
# the difference (see above): measured at full size after 10 steps, 6.7e-3 relative for the Equinox twin
# (NCHW) and 3.5e-4 for the rolled scan, against 1e-6 or less in the quick size. No rounding argument
# bounds that growth, so LOSS_RTOL = 2e-2 is not derived: it catches a float32 step that stops training
# or trains another network; the float64 checks above catch everything else.
FORWARD_RTOL_F32 = 2 * ROUNDING_GROWTH * U32
FIRST_LOSS_RTOL, LOSS_RTOL = FORWARD_RTOL_F32, 2e-2


def assert_same_forward(ours: Any, ref: Any, what: str = "") -> float:
    """Assert that two float32 programs' results of one forward pass from the same weights (arrays, or
    dicts of arrays such as running statistics) agree: each array within ``FORWARD_RTOL_F32`` of the
    reference in the 2-norm. Return the largest relative difference."""
    ours = ours if isinstance(ours, dict) else {"": ours}
    ref = ref if isinstance(ref, dict) else {"": ref}
    gaps = _norm_gaps(ours, ref, what)
    for k, gap in gaps.items():
        if not gap <= FORWARD_RTOL_F32:  # also fails on NaN
            raise AssertionError(f"{what} {k}: differs by {gap:.2e} of its norm (allowed {FORWARD_RTOL_F32:.1e})")
    return max(gaps.values())


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


def _norm_gaps(ours: dict, ref: dict, what: str) -> dict[str, float]:
    """``‖ours[k] − ref[k]‖ / ‖ref[k]‖`` (2-norm, in float64) for every array of two dicts with the same keys
    and shapes (an AssertionError where they differ)."""
    _same_keys(ours, ref, what)
    gaps = {}
    for k in ref:
        a, b = np.asarray(ours[k], np.float64), np.asarray(ref[k], np.float64)
        if a.shape != b.shape:
            raise AssertionError(f"{what}: {k} has shape {a.shape} against {b.shape}")
        gaps[k] = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))
    return gaps


def _refuse_float32(ours: dict, ref: dict, what: str, check: str) -> None:
    low = sorted(k for d in (ours, ref) for k in d if np.asarray(d[k]).dtype != np.float64)
    if low:
        raise ValueError(f"{what}: {check} compares float64 runs (build(..., float64=True)); "
                         f"{low[0]} is {np.asarray((ours | ref)[low[0]]).dtype}")


def assert_same_gradients(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str = "") -> float:
    """Assert that two gradients (dicts of arrays in NNX naming, as :func:`first_gradient` reads them) agree:
    each array within the bound of its precision of the reference in the 2-norm, ``‖ours − ref‖ ≤
    rtol·‖ref‖``, with ``rtol`` = ``GRAD_RTOL_F64`` where both are float64 (runs built with
    ``float64=True``, or :func:`float64_first_gradient`) and ``GRAD_RTOL_F32`` otherwise (both derived in
    the comment above them). Return the largest such relative difference."""
    gaps = _norm_gaps(ours, ref, what)
    f64 = all(np.asarray(d[k]).dtype == np.float64 for d in (ours, ref) for k in d)
    rtol = GRAD_RTOL_F64 if f64 else GRAD_RTOL_F32
    for k, gap in gaps.items():
        if not gap <= rtol:  # also fails on NaN
            raise AssertionError(f"{what}: gradient of {k} differs by {gap:.2e} of its norm "
                                 f"(allowed {rtol:.1e} in {'float64' if f64 else 'float32'})")
    return max(gaps.values())


def gradient_gap(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    """The largest ``‖ours − ref‖ / ‖ref‖`` over the arrays of two gradients, in any precision: a
    measurement (of float32 rounding, say), not a check."""
    return max(_norm_gaps(ours, ref, "gradient_gap").values())


def assert_same_weights(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], what: str = "") -> float:
    """Assert that two weight dicts (NNX naming) from float64 runs agree: parameters within
    ``WEIGHT_ATOL_F64``, absolute; BatchNorm running statistics within ``WEIGHT_ATOL_F64`` times their
    largest entry. Float32 weights are refused (a ValueError): float32 training drifts apart by far more
    than rounding (see the comment above ``GRAD_RTOL_F64``). Return the largest parameter difference."""
    _same_keys(ours, ref, what)
    _refuse_float32(ours, ref, what, "assert_same_weights")
    worst = 0.0
    for k in ref:
        stat = k.endswith(BATCH_STATS)
        atol = WEIGHT_ATOL_F64 * (float(np.max(np.abs(ref[k]))) if stat else 1.0)
        np.testing.assert_allclose(ours[k], ref[k], rtol=0, atol=atol, err_msg=f"{what}: {k}")
        if not stat:
            worst = max(worst, float(np.max(np.abs(ours[k] - ref[k]))))
    return worst


# An NNX path that traces the floor's own step (R.train_step) around the same arrays runs the same float32
# program: measured identical losses and weights at both sizes. The relative bound only absorbs a
# recompilation; the absolute one is for weights near zero (BatchNorm biases start at 0).
SAME_STEP_RTOL, SAME_STEP_ATOL = 1e-4, 1e-6


def assert_same_step(losses: np.ndarray, weights: dict[str, np.ndarray], ref_losses: np.ndarray,
                     ref_weights: dict[str, np.ndarray], what: str = "") -> None:
    """Assert that a run of the floor's own traced step matches the floor's float32 run: losses within
    ``SAME_STEP_RTOL``, every weight within ``SAME_STEP_RTOL`` and ``SAME_STEP_ATOL`` (an AssertionError)."""
    _same_keys(weights, ref_weights, what)
    np.testing.assert_allclose(losses, ref_losses, rtol=SAME_STEP_RTOL, err_msg=what)
    for k in weights:
        np.testing.assert_allclose(weights[k], ref_weights[k], rtol=SAME_STEP_RTOL, atol=SAME_STEP_ATOL,
                                   err_msg=f"{what}: {k}")


def weight_drift(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    """The largest absolute difference of the parameters (running statistics left out): a measurement of
    how far two float32 trainings drift apart, not a check."""
    return max(float(np.max(np.abs(ours[k] - ref[k]))) for k in ref if not k.endswith(BATCH_STATS))


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


def float64_first_gradient(name: str, config: ResNetConfig, images: Any, labels: Any, seed: int = 0
                           ) -> dict[str, np.ndarray]:
    """The first gradient of rung ``name`` built with ``float64=True`` from ``seed``, after one step on
    ``images`` (cast to float64) and ``labels``: what :func:`assert_same_gradients` compares. Turns x64 on
    for the run only."""
    with jax.enable_x64(True):
        rung = build(name, config, seed, float64=True)
        trajectory(rung, np.asarray(images, np.float64)[None], np.asarray(labels)[None])
        return rung.gradient()


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
