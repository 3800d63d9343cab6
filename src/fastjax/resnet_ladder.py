"""Every rung of the Part II ladder as one compact, importable train step, and their measurement.

Each builder returns a :class:`Rung`: ``run(images, labels)`` does one dispatch (one train
step, or ``K`` steps for the scan rungs, whose inputs are then stacked ``(K, batch, ...)``) and
returns the loss(es); ``weights()`` reads the current weights in NNX layout; ``traces`` counts
how often the jitted body was traced. All rungs start from the same weights (``seed``), use
Adam, and train the same network, so their loss trajectories agree (the tests check it).
Chapters teach each rung in the page and check it against the rung built here.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fastjax import digits, resnet_eqx, resnet_nnx, sizes
from fastjax.resnet_nnx import ResNetConfig
from fastjax.timing import Timing, block, count_traces, time_interleaved, time_per_call

LEARNING_RATE = 3e-3
NNX_RUNGS = ("no-jit", "nnx.jit", "split/merge", "nnx.cached_partial", "nnx.jit(graph=False)",
             "nnx.jit_partial", "scan K=10", "scan K=10 unroll", "NamedTuple")
EQX_RUNGS = ("eqx.filter_jit", "eqx flatten trick", "eqx pytree + jax.jit")
SCAN_K = 10


def settings() -> Any:
    """The sizes in force: network shape, batch size, steps and timing repeats."""
    return sizes.choose(
        quick=dict(config=ResNetConfig(width=8, stages=2, blocks=1), batch=32, steps=40, repeats=5),
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


@functools.lru_cache(maxsize=None)
def optimizer() -> optax.GradientTransformation:
    """Adam, the optimizer of every rung: one shared object. (``nnx.Optimizer`` keeps it as a
    static attribute, so a new ``optax.adam(...)`` object makes ``nnx.jit`` trace again.)"""
    return optax.adam(LEARNING_RATE)


def nnx_train_step(model: nnx.Module, opt: nnx.Optimizer, images: jax.Array, labels: jax.Array) -> jax.Array:
    """One NNX train step, in place: gradient of the loss, Adam update; returns the loss."""
    loss, grads = nnx.value_and_grad(resnet_nnx.loss_fn)(model, images, labels)
    opt.update(model, grads)
    return loss


class TrainState(NamedTuple):
    """A functional train state: parameters, BatchNorm statistics, optax state (pure dicts)."""

    params: Any
    batch_stats: Any
    opt_state: Any


def functional_step(graphdef: Any, tx: optax.GradientTransformation) -> Callable:
    """``step(state, images, labels) -> (state, loss)`` on a :class:`TrainState`, pure JAX."""

    def step(ts: TrainState, images: jax.Array, labels: jax.Array) -> tuple[TrainState, jax.Array]:
        def loss(params):
            model = nnx.merge(graphdef, params, ts.batch_stats)
            value = resnet_nnx.loss_fn(model, images, labels)
            return value, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))

        (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(ts.params)
        updates, opt_state = tx.update(grads, ts.opt_state, ts.params)
        return TrainState(optax.apply_updates(ts.params, updates), stats, opt_state), value

    return step


def train_state(model: nnx.Module, tx: optax.GradientTransformation) -> tuple[Any, TrainState]:
    """Split an NNX model into its graph definition and a :class:`TrainState` of pure dicts."""
    graphdef, params, stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    params, stats = nnx.to_pure_dict(params), nnx.to_pure_dict(stats)
    return graphdef, TrainState(params, stats, tx.init(params))


def _ts_weights(graphdef: Any, box: list) -> Callable[[], dict[str, np.ndarray]]:
    return lambda: resnet_nnx.weights(nnx.merge(graphdef, box[0].params, box[0].batch_stats))


def _nnx(name: str, config: ResNetConfig, seed: int) -> Rung:
    model = resnet_nnx.make_model(config, seed)
    opt = nnx.Optimizer(model, optimizer(), wrt=nnx.Param)
    weights = lambda: resnet_nnx.weights(model)  # noqa: E731
    counter = count_traces(nnx_train_step)
    if name == "no-jit":
        return Rung(name, lambda x, y: counter(model, opt, x, y), weights, traces=counter)
    if name == "nnx.jit":
        step = nnx.jit(counter)
        return Rung(name, lambda x, y: step(model, opt, x, y), weights, traces=counter)
    if name == "nnx.cached_partial":
        return Rung(name, nnx.cached_partial(nnx.jit(counter), model, opt), weights, traces=counter)
    if name == "nnx.jit(graph=False)":
        step = nnx.jit(counter, graph=False)
        return Rung(name, lambda x, y: step(model, opt, x, y), weights, traces=counter)
    if name == "nnx.jit_partial":
        return Rung(name, nnx.jit_partial(counter, model, opt, graph=False), weights, traces=counter)
    graphdef, state = nnx.split((model, opt))
    box = [state]

    def merged_weights() -> dict[str, np.ndarray]:
        return resnet_nnx.weights(nnx.merge(graphdef, box[0])[0])

    def one(state, x, y):
        m, o = nnx.merge(graphdef, state)
        loss = nnx_train_step(m, o, x, y)
        return nnx.state((m, o)), loss

    if name == "split/merge":
        counter = count_traces(one)
        step = jax.jit(counter)
    elif name.startswith("scan"):
        unroll = SCAN_K if name.endswith("unroll") else 1

        def steps(state, xs, ys):
            return jax.lax.scan(lambda s, xy: one(s, *xy), state, (xs, ys), unroll=unroll)

        counter = count_traces(steps)
        step = jax.jit(counter)
    else:
        raise ValueError(f"unknown rung {name!r}; choose from {NNX_RUNGS + EQX_RUNGS}")

    def run(x, y):
        box[0], loss = step(box[0], x, y)
        return loss

    k = SCAN_K if name.startswith("scan") else 1
    return Rung(name, run, merged_weights, steps_per_call=k, traces=counter)


def _named_tuple(config: ResNetConfig, seed: int, flat: bool) -> Rung:
    tx = optimizer()
    graphdef, ts = train_state(resnet_nnx.make_model(config, seed), tx)
    step = functional_step(graphdef, tx)
    if not flat:
        counter = count_traces(step)
        jitted, box = jax.jit(counter), [ts]

        def run(x, y):
            box[0], loss = jitted(box[0], x, y)
            return loss

        return Rung("NamedTuple", run, _ts_weights(graphdef, box), traces=counter)
    leaves, treedef = jax.tree.flatten(ts)

    def flat_step(leaves, x, y):
        new, loss = step(jax.tree.unflatten(treedef, leaves), x, y)
        return jax.tree.leaves(new), loss

    counter = count_traces(flat_step)
    jitted, box = jax.jit(counter), [leaves]

    def run_flat(x, y):
        box[0], loss = jitted(box[0], x, y)
        return loss

    weights = lambda: _ts_weights(graphdef, [jax.tree.unflatten(treedef, box[0])])()  # noqa: E731
    return Rung("floor", run_flat, weights, traces=counter, extra={"leaves": len(leaves)})


def eqx_step(model: eqx.Module, state: eqx.nn.State, opt_state: Any, images: jax.Array, labels: jax.Array,
             tx: optax.GradientTransformation) -> tuple[eqx.Module, eqx.nn.State, Any, jax.Array]:
    """One Equinox train step (pure): returns the new model, BatchNorm state, optax state, loss."""
    grad_fn = eqx.filter_value_and_grad(resnet_eqx.loss_fn, has_aux=True)
    (loss, state), grads = grad_fn(model, state, images, labels)
    updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), state, opt_state, loss


def _eqx(name: str, config: ResNetConfig, seed: int) -> Rung:
    tx = optimizer()
    model, state = resnet_eqx.from_nnx(resnet_nnx.make_model(config, seed))
    opt_state = tx.init(eqx.filter(model, eqx.is_array))
    params, static = eqx.partition(model, eqx.is_array)
    if name == "eqx.filter_jit":
        counter = count_traces(lambda m, s, o, x, y: eqx_step(m, s, o, x, y, tx))
        jitted, box = eqx.filter_jit(counter), [(model, state, opt_state)]

        def run(x, y):
            *box[0], loss = jitted(*box[0], x, y)
            return loss

        return Rung(name, run, lambda: resnet_eqx.weights(box[0][0], box[0][1]), traces=counter)
    if name == "eqx pytree + jax.jit":
        def pytree_step(p, s, o, x, y):
            m, s, o, loss = eqx_step(eqx.combine(p, static), s, o, x, y, tx)
            return eqx.filter(m, eqx.is_array), s, o, loss

        counter = count_traces(pytree_step)
        jitted, box = jax.jit(counter), [(params, state, opt_state)]

        def run_tree(x, y):
            *box[0], loss = jitted(*box[0], x, y)
            return loss

        return Rung(name, run_tree, lambda: resnet_eqx.weights(eqx.combine(box[0][0], static), box[0][1]),
                    traces=counter)
    if name != "eqx flatten trick":
        raise ValueError(f"unknown rung {name!r}; choose from {NNX_RUNGS + EQX_RUNGS}")
    leaves, treedef = jax.tree.flatten((params, state, opt_state))

    def flat_step(leaves, x, y):
        p, s, o = jax.tree.unflatten(treedef, leaves)
        m, s, o, loss = eqx_step(eqx.combine(p, static), s, o, x, y, tx)
        return jax.tree.leaves((eqx.filter(m, eqx.is_array), s, o)), loss

    counter = count_traces(flat_step)
    jitted, box = jax.jit(counter), [leaves]

    def run_flat(x, y):
        box[0], loss = jitted(box[0], x, y)
        return loss

    def weights():
        p, s, _ = jax.tree.unflatten(treedef, box[0])
        return resnet_eqx.weights(eqx.combine(p, static), s)

    return Rung(name, run_flat, weights, traces=counter, extra={"leaves": len(leaves)})


def build(name: str, config: ResNetConfig | None = None, seed: int = 0) -> Rung:
    """The rung called ``name`` (one of ``NNX_RUNGS``, ``EQX_RUNGS`` or ``"floor"``), freshly built."""
    config = config or settings().config
    if name == "floor":
        return _named_tuple(config, seed, flat=True)
    if name == "NamedTuple":
        return _named_tuple(config, seed, flat=False)
    if name in EQX_RUNGS:
        return _eqx(name, config, seed)
    return _nnx(name, config, seed)


def trajectory(rung: Rung, xs: Any, ys: Any) -> np.ndarray:
    """Train on the stacked batches ``xs (n, batch, 8, 8, 1)``, ``ys (n, batch)``; the n losses.
    ``n`` must be a multiple of the rung's steps per call."""
    xs, ys = jnp.asarray(xs), jnp.asarray(ys)
    k = rung.steps_per_call
    if len(xs) % k:
        raise ValueError(f"{rung.name} runs {k} steps per call; {len(xs)} batches is not a multiple")
    if k == 1:
        return np.array([float(rung.run(x, y)) for x, y in zip(xs, ys)])
    return np.concatenate([np.asarray(rung.run(xs[i:i + k], ys[i:i + k])) for i in range(0, len(xs), k)])


def training_batches(n_steps: int, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n_steps`` batches of the training split (the same for every rung)."""
    sp = digits.split()
    return digits.stack_batches(sp.train_images, sp.train_labels, batch, n_steps, seed)


def dispatch_floor() -> Callable[[], jax.Array]:
    """The cheapest jitted call: the identity on a scalar already on the device."""
    ident, x = jax.jit(lambda a: a), jnp.zeros(())
    return lambda: ident(x)


def measure_ladder(names: tuple[str, ...] | None = None, repeats: int | None = None) -> dict[str, Any]:
    """Per-step time of every rung, side by side in one run, with the floor (``jax.jit`` of the
    same step on a flat list of arrays) and the dispatch floor (jitted identity), in the sizes in
    force. Steps are dispatched back to back (waiting on the last one): a training loop's view.
    Returns ``{"rungs": [Timing], "floor": Timing, "dispatch_floor": Timing, "extra": {...}}``."""
    s = settings()
    names = names or ("no-jit", "nnx.jit", "eqx.filter_jit", "split/merge", "nnx.cached_partial",
                      "nnx.jit(graph=False)", "nnx.jit_partial", "eqx flatten trick", "scan K=10",
                      "scan K=10 unroll", "NamedTuple", "eqx pytree + jax.jit")
    repeats = repeats or s.repeats
    xs, ys = (jnp.asarray(a) for a in training_batches(SCAN_K, s.batch))
    rungs = {name: build(name, s.config) for name in (*names, "floor")}
    fns, per = {}, {}
    for name, rung in rungs.items():
        args = (xs, ys) if rung.steps_per_call > 1 else (xs[0], ys[0])
        fns[name] = (lambda r=rung, a=args: r.run(*a))
        per[name] = rung.steps_per_call
    fns["dispatch floor"] = dispatch_floor()
    slow = {n: fns.pop(n) for n in list(fns) if n == "no-jit"}
    timings = time_interleaved(fns, repeats, per)
    if slow:  # eager steps take 10⁴× longer: timed apart, with fewer repeats
        timings["no-jit"] = time_per_call(slow["no-jit"], name="no-jit", repeats=3, number=1, sync="last")
    extra = {"config": vars(s.config).copy(), "batch": s.batch, "scan_k": SCAN_K, "size": s.size,
             "traces": {n: r.traces.count for n, r in rungs.items() if r.traces is not None},
             "floor_leaves": rungs["floor"].extra["leaves"]}
    return {"rungs": [timings[n] for n in names], "floor": timings["floor"],
            "dispatch_floor": timings["dispatch floor"], "extra": extra}


SWEEP_RUNGS = ("nnx.jit", "split/merge", "eqx.filter_jit", "eqx flatten trick", "floor")


def sweep_settings() -> Any:
    """Widths, steps per timed run and repeats of the async-dispatch sweep, in the sizes in force."""
    return sizes.choose(quick=dict(widths=(4, 16), steps=20, repeats=3),
                        full=dict(widths=(4, 8, 16, 32, 64, 128), steps=30, repeats=5))


def _return_and_result(run: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median seconds until one call returns, and until its result is ready."""
    back, ready = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = run()
        t1 = time.perf_counter()
        block(out)
        back.append(t1 - t0)
        ready.append(time.perf_counter() - t0)
    return float(np.median(back)), float(np.median(ready))


def below(widths: list[int], overhead: list[float], limit: float = 0.05) -> int | None:
    """The smallest width from which every overhead (fraction of the floor) stays under ``limit``."""
    for i, w in enumerate(widths):
        if all(o < limit for o in overhead[i:]):
            return w
    return None


def measure_sweep(widths: tuple[int, ...] | None = None, n_steps: int | None = None,
                  names: tuple[str, ...] = SWEEP_RUNGS, repeats: int | None = None) -> dict[str, Any]:
    """Total seconds of ``n_steps`` steps dispatched back to back (waiting on the last), for each
    rung and network width; the overhead over the floor; the width past which it stays under 5 %;
    and, per rung and width, the seconds until one call returns and until its result is ready."""
    s, sw = settings(), sweep_settings()
    widths, n_steps, repeats = widths or sw.widths, n_steps or sw.steps, repeats or sw.repeats
    x, y = (jnp.asarray(a[0]) for a in training_batches(1, s.batch))
    totals: dict[str, list[float]] = {n: [] for n in names}
    returns: dict[str, list[float]] = {n: [] for n in names}
    results: dict[str, list[float]] = {n: [] for n in names}
    for w in widths:
        config = ResNetConfig(width=w, stages=s.config.stages, blocks=s.config.blocks)
        rungs = {n: build(n, config) for n in names}

        def many(r: Rung) -> Callable[[], Any]:
            def go():
                out = None
                for _ in range(n_steps):
                    out = r.run(x, y)
                return out
            return go

        t = time_interleaved({n: many(r) for n, r in rungs.items()}, repeats, min_repeat_seconds=0.0)
        for n, r in rungs.items():
            totals[n].append(t[n].median)
            back, ready = _return_and_result(lambda r=r: r.run(x, y), repeats=max(5, repeats))
            returns[n].append(back)
            results[n].append(ready)
    overhead = {n: [a / f - 1 for a, f in zip(totals[n], totals["floor"])] for n in names if n != "floor"}
    return {"widths": list(widths), "steps": n_steps, "batch": s.batch, "seconds": totals,
            "overhead": overhead, "below_5pct": {n: below(list(widths), o) for n, o in overhead.items()},
            "return_seconds": returns, "result_seconds": results}


def measure_flatten(config: ResNetConfig | None = None, round_trips: int | None = None) -> list[Timing]:
    """Seconds per flatten+unflatten round trip of (model, optimizer state), timed over many round
    trips: Equinox objects as they are; with ``optax.flatten`` (Adam state as one vector each);
    a flat list of the same arrays; NNX (model, optimizer) as pytrees, and with split/merge."""
    config = config or settings().config
    round_trips = round_trips or sizes.pick(100, 2_000)
    twin, state = resnet_eqx.from_nnx(resnet_nnx.make_model(config))
    params = eqx.filter(twin, eqx.is_array)
    as_is = (twin, state, optimizer().init(params))
    flat_tx = optax.flatten(optimizer())
    with_optax_flatten = (twin, state, flat_tx.init(params))
    leaves = jax.tree.leaves(as_is)
    model = resnet_nnx.make_model(config)
    opt = nnx.Optimizer(model, optimizer(), wrt=nnx.Param)
    graphdef, nstate = nnx.split((model, opt))

    def round_trip(tree: Any) -> Callable[[], Any]:
        def go():
            for _ in range(round_trips):
                flat, treedef = jax.tree.flatten(tree)
                jax.tree.unflatten(treedef, flat)
        return go

    def split_merge():
        for _ in range(round_trips):
            nnx.merge(graphdef, nnx.split((model, opt))[1])

    cases = {
        f"eqx (model, Adam) as is: {len(jax.tree.leaves(as_is))} leaves": round_trip(as_is),
        f"eqx model, optax.flatten(Adam): {len(jax.tree.leaves(with_optax_flatten))} leaves":
            round_trip(with_optax_flatten),
        f"flat list: {len(leaves)} arrays": round_trip(leaves),
        f"nnx (model, optimizer) as pytrees: {len(jax.tree.leaves((model, opt)))} leaves": round_trip((model, opt)),
        f"nnx.split + nnx.merge: {len(jax.tree.leaves(nstate))} arrays": split_merge,
    }
    t = time_interleaved(cases, repeats=3, per={n: round_trips for n in cases}, sync="each", min_repeat_seconds=0.0)
    return list(t.values())
