"""Measuring the Part II ladder: per-step times against the floor, the async-dispatch sweep, and
flatten round trips. The rungs themselves come from :mod:`fastjax.resnet.ladder` (which binds the
code exported from the chapters); nothing here is a lesson, only measurement.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fastjax import sizes
from fastjax.resnet import floor as FL, ladder, resnet_eqx, resnet_nnx, rungs as R
from fastjax.resnet.ladder import SCAN_K, Rung, build, settings, training_batches
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools import profiling
from fastjax.tools.timing import Timing, block, time_interleaved, time_per_call

LADDER = ("no-jit", "nnx.jit", "eqx.filter_jit", "split/merge", "nnx.cached_partial", "nnx.jit(graph=False)",
          "nnx.jit_partial", "eqx flatten trick", "scan K=10", "scan K=10 unroll", "NamedTuple",
          "eqx pytree + jax.jit")


FASTER_FLOOR = "Part VI floor: small convolutions as products"


def dispatch_floor() -> Callable[[], jax.Array]:
    """The cheapest jitted call: the identity on a scalar already on the device."""
    ident, x = jax.jit(lambda a: a), jnp.zeros(())
    return lambda: ident(x)


def measure_ladder(names: tuple[str, ...] | None = None, repeats: int | None = None) -> dict[str, Any]:
    """Seconds per train step of every rung, side by side in one run (round robin), with the
    floor and the dispatch floor, in the sizes in force. Steps are dispatched back to back
    (waiting on the last one): a training loop's view.
    Part VI's faster floor step (same weights, same batch) runs in the same turns.
    Returns ``{"rungs": [Timing], "floor": Timing, "floor_fast": Timing, "dispatch_floor": Timing, "extra": {...}}``."""
    s = settings()
    names = names or LADDER
    repeats = repeats or s.repeats
    xs, ys = (jnp.asarray(a) for a in training_batches(SCAN_K, s.batch))
    rungs = {name: build(name, s.config) for name in (*names, "floor")}
    fns, per = {}, {}
    for name, rung in rungs.items():
        args = (xs, ys) if rung.steps_per_call > 1 else (xs[0], ys[0])
        fns[name] = (lambda r=rung, a=args: r.run(*a))
        per[name] = rung.steps_per_call
    fns["dispatch floor"] = dispatch_floor()
    fns[FASTER_FLOOR] = _floor_steps(s.config, xs[0], ys[0])[0]["faster floor"]  # Part VI's, same weights
    per[FASTER_FLOOR] = 1
    slow = {n: fns.pop(n) for n in list(fns) if n == "no-jit"}
    timings = time_interleaved(fns, repeats, per)
    if slow:  # eager steps take 10⁴× longer: timed apart, with fewer repeats
        timings["no-jit"] = time_per_call(slow["no-jit"], name="no-jit", repeats=3, number=1, sync="last")
    extra = {"config": vars(s.config).copy(), "batch": s.batch, "scan_k": SCAN_K, "size": s.size,
             "traces": {n: r.traces.count for n, r in rungs.items() if r.traces is not None},
             "floor_leaves": rungs["floor"].extra["leaves"]}
    return {"rungs": [timings[n] for n in names], "floor": timings["floor"], "floor_fast": timings[FASTER_FLOOR],
            "dispatch_floor": timings["dispatch floor"], "extra": extra}


def sweep_settings() -> Any:
    """Widths, rungs, steps per timed run, repeats and time budget of the async-dispatch sweep, in the
    sizes in force (the quick size sweeps three rungs only: each rung and width is one more compilation).

    A step's compute grows with the square of the width, so the widest networks dominate the sweep. On
    the 2-core CPU of CI at the full size (batch 96; measured while other work ran, so high), one floor
    step took 50 ms at width 16, 0.31 s at 32, 1.3 s at 64 and 15 s at 128, and the sweep runs about
    1,000 steps per width: width 128 alone would take hours and ran past the build's 900 s per cell.
    ``budget`` (seconds) stops the sweep before a width whose predicted cost (the last width's, times
    the cube of the width ratio: the step times above grew 4 to 11 times per doubling) would pass it;
    on a GPU every width fits."""
    return sizes.choose(
        quick=dict(widths=(4, 16), names=("nnx.jit", "eqx.filter_jit", "floor"), steps=20, repeats=3,
                   budget=120.0),
        full=dict(widths=(4, 8, 16, 32, 64, 128), names=("nnx.jit", "split/merge", "eqx.filter_jit",
                                                          "eqx flatten trick", "floor"), steps=30, repeats=5,
                  budget=480.0))


def return_and_result(run: Callable[[], Any], repeats: int) -> tuple[float, float]:
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
                  names: tuple[str, ...] | None = None, repeats: int | None = None,
                  budget: float | None = None) -> dict[str, Any]:
    """Total seconds of ``n_steps`` steps dispatched back to back (waiting on the last), for each
    rung and network width; the overhead over the floor; the width past which it stays under 5 %;
    and, per rung and width, the seconds until one call returns and until its result is ready.
    Widths are swept in increasing order until the next one's predicted cost would pass ``budget``
    seconds (see ``sweep_settings``); ``"skipped"`` lists the widths left out."""
    s, sw = settings(), sweep_settings()
    widths, n_steps, repeats = widths or sw.widths, n_steps or sw.steps, repeats or sw.repeats
    names, budget = names or sw.names, budget or sw.budget
    if list(widths) != sorted(widths):
        raise ValueError(f"widths must increase (the budget predicts each from the last); got {widths}")
    x, y = (jnp.asarray(a[0]) for a in training_batches(1, s.batch))
    totals: dict[str, list[float]] = {n: [] for n in names}
    returns: dict[str, list[float]] = {n: [] for n in names}
    results: dict[str, list[float]] = {n: [] for n in names}
    done: list[int] = []
    start, last = time.perf_counter(), None  # last: (width, seconds it took)
    for w in widths:
        if last is not None:
            predicted = last[1] * (w / last[0]) ** 3
            if time.perf_counter() - start + predicted > budget:
                break
        began = time.perf_counter()
        done.append(w)
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
            back, ready = return_and_result(lambda r=r: r.run(x, y), repeats=max(5, repeats))
            returns[n].append(back)
            results[n].append(ready)
        last = (w, time.perf_counter() - began)
    overhead = {n: [a / f - 1 for a, f in zip(totals[n], totals["floor"])] for n in names if n != "floor"}
    return {"widths": done, "skipped": [w for w in widths if w not in done], "budget": budget,
            "steps": n_steps, "batch": s.batch, "seconds": totals,
            "overhead": overhead, "below_5pct": {n: below(done, o) for n, o in overhead.items()},
            "return_seconds": returns, "result_seconds": results}


def return_rows(sweep: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """From :func:`measure_sweep`: per width, each rung's time to return from a call and to its result
    (ms, "return / result"), and per rung the median share of the time to result spent before returning."""
    names = list(sweep["return_seconds"])
    rows = [{"width": w, **{f"{n}: return / result (ms)": f"{sweep['return_seconds'][n][i] * 1e3:.3g} / "
                            f"{sweep['result_seconds'][n][i] * 1e3:.3g}" for n in names}}
            for i, w in enumerate(sweep["widths"])]
    share = {n: float(np.median(np.array(sweep["return_seconds"][n]) / np.array(sweep["result_seconds"][n])))
             for n in names}
    return rows, share


def round_trips(tree: Any, n: int) -> Callable[[], None]:
    """``n`` flatten+unflatten round trips of ``tree`` in one Python loop, returning nothing: timed
    as one call, the harness adds no per-trip work (no flatten of a result, no wait per leaf)."""
    def go() -> None:
        for _ in range(n):
            leaves, treedef = jax.tree.flatten(tree)
            jax.tree.unflatten(treedef, leaves)
    return go


def measure_flatten(config: ResNetConfig | None = None, n: int | None = None) -> list[Timing]:
    """Seconds per flatten+unflatten round trip of (model, optimizer state), timed as batches of
    ``n`` round trips: Equinox objects as they are; with ``optax.flatten`` (Adam state as one
    vector each); a flat list of the same arrays; NNX (model, optimizer) as pytrees, and split/merge."""
    config = config or settings().config
    n = n or sizes.pick(200, 2_000)
    twin, state = resnet_eqx.from_nnx(resnet_nnx.make_model(config))
    params = eqx.filter(twin, eqx.is_array)
    as_is = (twin, state, R.TX.init(params))
    with_optax_flatten = (twin, state, optax.flatten(R.TX).init(params))
    leaves = jax.tree.leaves(as_is)
    model = resnet_nnx.make_model(config)
    opt = nnx.Optimizer(model, R.TX, wrt=nnx.Param)
    graphdef, nstate = nnx.split((model, opt))

    def split_merge() -> None:
        for _ in range(n):
            nnx.merge(graphdef, nnx.split((model, opt))[1])

    cases = {
        f"eqx (model, Adam) as is: {len(leaves)} leaves": round_trips(as_is, n),
        f"eqx model, optax.flatten(Adam): {len(jax.tree.leaves(with_optax_flatten))} leaves":
            round_trips(with_optax_flatten, n),
        f"flat list: {len(leaves)} arrays": round_trips(leaves, n),
        f"nnx (model, optimizer) as pytrees: {len(jax.tree.leaves((model, opt)))} leaves": round_trips((model, opt), n),
        f"nnx.split + nnx.merge: {len(jax.tree.leaves(nstate))} arrays": split_merge,
    }
    t = time_interleaved(cases, repeats=3, per={c: n for c in cases}, min_repeat_seconds=0.0)
    return list(t.values())


NHWC_LABELS = "b01f_01io->b01f"  # NHWC input, HWIO kernel, NHWC output: the layout XLA:CPU hands to Eigen


def convolutions(hlo: str) -> dict[str, int]:
    """Convolutions of an HLO module counted by place (top level / in a loop) and layout."""
    count: dict[str, int] = {}
    for ins in profiling.instructions(hlo).values():
        if ins["op"] == "convolution" and not ins["in_fusion"]:
            key = f"{'in a loop' if ins['in_loop'] else 'top level'}, {'NHWC/HWIO' if ins['labels'] == NHWC_LABELS else 'other layout'}"
            count[key] = count.get(key, 0) + 1
    return count


def trace_ops(trace_file: str | Path, hlo: str) -> list[dict[str, Any]]:
    """Total time of each HLO op of one program in a ``jax.profiler`` trace (``*.trace.json.gz``),
    slowest first: name, opcode, layout, inside a loop or not, calls, total ms (and share); the
    reading, parsing and summing are :mod:`fastjax.tools.profiling`'s."""
    return profiling.top_ops(profiling.read_trace(trace_file), hlo)


def _floor_steps(config: ResNetConfig, x: Any, y: Any) -> tuple[dict[str, Callable[[], Any]], Any]:
    """Part II's floor step and Part VI's faster floor step (``fastjax.resnet.floor.faster_floor_step``,
    chapters/floor/03-resnet-floor.md), jitted, from the same weights, as calls on one batch; checked
    to give the same first loss (``ladder.FIRST_LOSS_RTOL``)."""
    model = resnet_nnx.make_model(config, seed=0)
    graphdef, treedef, leaves = R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))
    steps = {"floor": jax.jit(R.floor_step(graphdef, treedef)),
             "faster floor": jax.jit(FL.faster_floor_step(graphdef, treedef))}
    first = {name: np.asarray(step(leaves, x, y)[1])[None] for name, step in steps.items()}
    ladder.assert_same_losses(first["faster floor"], first["floor"], "faster floor")
    return {name: (lambda st=st: st(leaves, x, y)) for name, st in steps.items()}, leaves


def measure_floor(config: ResNetConfig | None = None, batch: int | None = None,
                  repeats: int | None = None) -> list[Timing]:
    """Seconds per train step of Part II's floor and Part VI's faster floor, side by side in one run, from
    the same weights on the same batch, in the sizes in force. Returns ``[floor, faster floor]``."""
    s = settings()
    config, batch, repeats = config or s.config, batch or s.batch, repeats or s.repeats
    x, y = (jnp.asarray(a[0]) for a in training_batches(1, batch))
    calls, _ = _floor_steps(config, x, y)
    t = time_interleaved(calls, repeats)
    return [t["floor"], t["faster floor"]]
