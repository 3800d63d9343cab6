"""Measuring Part I: the PLN ladder timed in turns, pyPLNmodels' own fit, and the race between them.

The rungs come from ``fastjax.rungs.pln`` (exported from the chapters), so what is timed here is
the code the reader sees. Run ``python -m fastjax.bench_pln --cache-run DIR`` only from ``race``:
it is the fresh process that compiles the converging fit with JAX's persistent cache in ``DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import fastjax  # noqa: F401  (the CPU workaround, before jax)
import numpy as np

from fastjax import pln, sizes
from fastjax.timing import Timing, compile_time, first_call_seconds, time_interleaved, time_per_call

TARGET_GAP = 5e-4  # "reached": within 0.05 % of pyPLNmodels' final ELBO


def settings() -> Any:
    """The sizes in force: data repeats, iterations of a fit, iterations per timed call, repeats."""
    return sizes.choose(
        quick=dict(repeat=1, n_iter=30, n_time=20, n_time_eager=2, repeats=3, race_repeats=3),
        full=dict(repeat=100, n_iter=400, n_time=100, n_time_eager=3, repeats=5, race_repeats=5),
    )


def python_loop(step: Callable[[], Any], n: int) -> Callable[[], Any]:
    """A callable that runs ``step()`` ``n`` times in a Python loop and returns the last result."""
    def run() -> Any:
        out = None
        for _ in range(n):
            out = step()
        return out
    return run


def interleaved(calls: dict[str, tuple[Callable[[], Any], int]], rounds: int) -> list[Timing]:
    """``timing.time_interleaved`` with one call per round; ``calls``: name -> (fn, iterations per call)."""
    out = time_interleaved({name: fn for name, (fn, _) in calls.items()}, repeats=rounds,
                           per={name: per for name, (_, per) in calls.items()}, sync="each", min_repeat_seconds=0.0)
    return list(out.values())


def measure_ladder(data: pln.PlnData | None = None) -> dict[str, Any]:
    """Seconds per iteration of every rung and of the floor (the AOT-compiled scan fit), timed in
    turns in one run, compile apart. Returns {"rungs", "floor", "extra"}."""
    import jax

    from fastjax.rungs import pln as R

    cfg = settings()
    data = pln.to_jax(pln.load_oaks_counts(cfg.repeat)) if data is None else data
    n, p, d = data.shape
    nt = cfg.n_time
    p0 = pln.start(data)
    eager = R.EagerPln(data)
    eager_first = first_call_seconds(eager.step)
    aot = compile_time(jax.jit(lambda params, data: R.scan_fit(params, data, nt)), p0, data)
    st0, model0 = R.PlnState(*p0, pln.optimizer().init(p0)), R.PlnModel.create(data)
    calls = {
        "1 no-jit": (python_loop(eager.step, cfg.n_time_eager), cfg.n_time_eager),
        "2 jit": (python_loop(R.JitPln(data).step, nt), nt),
        "3 scan": (lambda: R.scan_fit_jit(p0, data, n_iter=nt), nt),
        "4 NamedTuple": (lambda: R.namedtuple_fit(st0, data, n_iter=nt), nt),
        "5 pytree class": (lambda: model0.fit(data, n_iter=nt), nt),
    }
    for how, (step, _) in R.nnx_steppers(data).items():
        calls[f"6 {how}"] = (python_loop(step, nt), nt)
    calls["floor: AOT-compiled scan"] = (lambda: aot.compiled(p0, data), nt)
    timings = interleaved(calls, cfg.repeats)
    floor = timings.pop()
    floor.compile_seconds = aot.compile_seconds
    extra = dict(n=n, p=p, d=d, n_time=nt, n_time_eager=cfg.n_time_eager, size=cfg.size,
                 lower_seconds=aot.lower_seconds, compile_seconds=aot.compile_seconds,
                 eager_first_step_seconds=eager_first)
    return {"rungs": timings, "floor": floor, "extra": extra}


def profile_iteration(data: pln.PlnData | None = None) -> list[Timing]:
    """Where one JAX iteration's time goes: seconds per iteration of scans that compute more and more of
    it (the ELBO; its p×p log-determinant term with gradient; the ELBO and its gradient; a whole Rprop
    step; the while_loop fit), AOT-compiled, timed in turns."""
    import jax

    from fastjax.rungs import pln as R

    cfg = settings()
    data = pln.to_jax(pln.load_oaks_counts(cfg.repeat)) if data is None else data
    nt, p0 = cfg.n_time, pln.start(data)

    def scan_of(fn):  # nt calls of fn(params) in one scan, params nudged so nothing is hoisted out
        def run(params, data):
            def body(c, _):
                return jax.tree.map(lambda a: a * 1.0000001, c), fn(c, data)
            return jax.lax.scan(body, params, length=nt)[1]
        return compile_time(jax.jit(run), p0, data).compiled

    def logdet_term(c, d):  # the p×p part of the ELBO: −(n/2) log|Σ|, Σ in closed form
        return -0.5 * c[0].shape[0] * jax.numpy.linalg.slogdet(pln.closed_form_covariance(d.covariates, *c))[1]

    elbo_only = scan_of(lambda c, d: pln.loss(c, d))
    logdet_grad = scan_of(lambda c, d: jax.grad(logdet_term)(c, d))
    with_grad = scan_of(lambda c, d: jax.value_and_grad(pln.loss)(c, d)[1])
    step = compile_time(jax.jit(lambda params, data: R.scan_fit(params, data, nt)), p0, data).compiled
    args = _converge_args(data, math.inf)
    until = compile_time(R.fit_until_converged, *args, maxiter=nt).compiled
    return interleaved({"ELBO": (lambda: elbo_only(p0, data), nt),
                        "log|Σ| term + its gradient": (lambda: logdet_grad(p0, data), nt),
                        "ELBO + gradient": (lambda: with_grad(p0, data), nt),
                        "whole Rprop step (scan)": (lambda: step(p0, data), nt),
                        "whole step + criterion (while_loop)": (lambda: until(*args), nt)}, cfg.repeats + 2)


def fit_pyplnmodels(data: pln.PlnData, dtype: str = "float32", maxiter: int = pln.MAXITER,
                    tol: float = pln.TOL) -> tuple[Any, float, np.ndarray, np.ndarray]:
    """``pyPLNmodels.Pln(...).fit()`` quietly, in float32 (its own) or float64 (its tensors cast, the
    offsets taken at full precision): (model, seconds, ELBO before each update, cumulative seconds)."""
    import torch
    from pyPLNmodels import Pln

    model = Pln(np.asarray(data.counts), offsets=np.asarray(data.offsets), exog=np.asarray(data.covariates),
                add_const=False)
    old = torch.get_default_dtype()
    if dtype == "float64":
        torch.set_default_dtype(torch.float64)  # pyPLNmodels makes S with torch.ones: the default dtype
        for name, value in (("_endog", data.counts), ("_exog", data.covariates), ("_offsets", data.offsets)):
            setattr(model, name, torch.from_numpy(np.asarray(value, np.float64)))
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            t0 = time.perf_counter()
            model.fit(maxiter=maxiter, tol=tol)
            seconds = time.perf_counter() - t0
    finally:
        torch.set_default_dtype(old)
    elbos = np.array([float(e) for e in model._elbo_criterion_monitor.elbo_list])
    return model, seconds, elbos, np.asarray(model._time_recorder.running_times)


def first_reaching(elbos: np.ndarray, target: float, gap: float = TARGET_GAP) -> int | None:
    """Index of the first ELBO within ``gap`` (relative) of ``target``, or None."""
    hit = np.flatnonzero(np.asarray(elbos) >= target - gap * abs(target))
    return int(hit[0]) if hit.size else None


def _converge_args(data: pln.PlnData, target: float) -> tuple[Any, ...]:
    import jax.numpy as jnp

    return pln.start(data), data, jnp.float32(pln.TOL), jnp.float32(target)


def cache_run(cache_dir: str, repeat: int, target: float) -> dict[str, float]:
    """In this (fresh) process: the converging fit's first call, compile included, with JAX's persistent
    compilation cache in ``cache_dir``; then a warm call. Seconds."""
    import jax

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from fastjax.rungs import pln as R
    from fastjax.timing import block

    data = pln.to_jax(pln.load_oaks_counts(repeat))
    args = _converge_args(data, target)
    t0 = time.perf_counter()
    block(R.fit_until_converged(*args))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    block(R.fit_until_converged(*args))
    return {"first_call_seconds": first, "warm_call_seconds": time.perf_counter() - t0}


def _fresh_process(cache_dir: str, repeat: int, target: float) -> dict[str, float]:
    cmd = [sys.executable, "-m", "fastjax.bench_pln", "--cache-run", cache_dir, "--repeat", str(repeat),
           "--target", repr(target)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy(), timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def race(repeat: int | None = None, torch_threads: int | None = None) -> dict[str, Any]:
    """pyPLNmodels' ``Pln.fit`` (defaults) against the JAX fit that stops by the same rule (one
    ``lax.while_loop``, compiled once): time to converge and to reach pyPLNmodels' final ELBO (within
    0.05 %), compile apart, compile included, and in a fresh process with a warm persistent cache.
    Medians over ``race_repeats`` runs, taken in turns. Seconds."""
    import torch

    from fastjax.rungs import pln as R

    cfg = settings()
    repeat = cfg.repeat if repeat is None else repeat
    if torch_threads:
        torch.set_num_threads(torch_threads)
    data_np = pln.load_oaks_counts(repeat)
    data = pln.to_jax(data_np)
    fit_pyplnmodels(pln.load_oaks_counts(1), maxiter=5)  # warm-up: torch's first fit is slower
    aot = compile_time(R.fit_until_converged, *_converge_args(data, math.inf))
    runs, jax_conv, jax_target = [], [], []
    target = None
    for _ in range(cfg.race_repeats):  # in turns, so that a change of load hits both alike
        runs.append(fit_pyplnmodels(data_np))
        target = float(runs[0][2][-1]) if target is None else target
        jax_conv.append(time_per_call(aot.compiled, *_converge_args(data, math.inf), repeats=1, number=1,
                                      warmup=0).median)
        reach = target - TARGET_GAP * abs(target)
        jax_target.append(time_per_call(aot.compiled, *_converge_args(data, reach), repeats=1, number=1,
                                        warmup=0).median)
    _, p_elbos, p_times = runs[0][0], runs[0][2], runs[0][3]
    k_p = first_reaching(p_elbos, target)
    _, j_elbos, crit = aot.compiled(*_converge_args(data, math.inf))
    j_elbos = np.asarray(j_elbos)[: int(crit.count)]
    _, _, crit_t = aot.compiled(*_converge_args(data, target - TARGET_GAP * abs(target)))
    with tempfile.TemporaryDirectory() as cache:
        _fresh_process(cache, repeat, target)  # fills the cache
        warm = _fresh_process(cache, repeat, target)
    compile_s = aot.lower_seconds + aot.compile_seconds
    med = lambda xs: float(np.median(xs))  # noqa: E731
    p_conv, p_target = med([r[1] for r in runs]), med([r[3][k_p] for r in runs])
    j_conv, j_target = med(jax_conv), med(jax_target)
    return dict(
        n=data.shape[0], p=data.shape[1], repeats=cfg.race_repeats, torch_threads=torch.get_num_threads(),
        target_elbo=target, pyplnmodels_iterations=len(p_elbos), pyplnmodels_iters_to_target=k_p + 1,
        pyplnmodels_seconds=p_conv, pyplnmodels_seconds_to_target=p_target, pyplnmodels_elbos=p_elbos.tolist(),
        pyplnmodels_running_seconds=p_times.tolist(),
        jax_iterations=len(j_elbos), jax_final_elbo=float(j_elbos[-1]), jax_iters_to_target=int(crit_t.count),
        jax_elbos=j_elbos.tolist(), jax_seconds=j_conv, jax_seconds_to_target=j_target,
        jax_compile_seconds=compile_s, jax_fresh_process_cached_seconds=warm["first_call_seconds"],
        speedup_converge_compile_excluded=p_conv / j_conv,
        speedup_converge_compile_included=p_conv / (j_conv + compile_s),
        speedup_converge_cache_warm=p_conv / warm["first_call_seconds"],
        speedup_target_compile_excluded=p_target / j_target,
        speedup_target_compile_included=p_target / (j_target + compile_s),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-run", metavar="DIR", help="time the first call with the persistent cache in DIR")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--target", type=float, default=math.inf)
    args = parser.parse_args(argv)
    if args.cache_run:
        print(json.dumps(cache_run(args.cache_run, args.repeat, args.target)))
    else:
        print(json.dumps({k: v for k, v in race().items() if not isinstance(v, list)}, indent=2))


if __name__ == "__main__":
    main()
