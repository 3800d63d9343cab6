"""Measuring Part I: the PLN ladder timed in turns, pyPLNmodels' own fit, and the race between them.

The rungs come from ``fastjax.pln.rungs`` (exported from the chapters), so what is timed here is
the code the reader sees. ``python -m fastjax.pln.bench`` runs the race and prints its figures
(``--fit part1``: with Part I's fit); ``--cold N`` times pyPLNmodels' first fit in N fresh processes,
and in N that import ``torch._dynamo`` first. ``--cache-run`` and ``--first-fit`` are the fresh
processes that ``race`` and ``first_fits`` start. ``--whole`` races the scripts as whole processes
(``whole_process``: pyPLNmodels' script, the book's, its caches, ``python -m fastjax.pln.fit``) and
prints their figures as JSON.
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
import warnings
from typing import Any, Callable

import fastjax  # noqa: F401  (the CPU workaround, before jax)
import numpy as np

from fastjax import checks, pln, sizes
from fastjax.tools.timing import Timing, compile_time, first_call_seconds, time_interleaved, time_per_call
from fastjax.tools import timing

TARGET_GAP = pln.TARGET_GAP  # "reached": within 0.05 % of pyPLNmodels' final ELBO


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


_SCAN_FITS: dict[tuple[Any, ...], Any] = {}


def _scan_fit_compiled(p0: Any, data: pln.PlnData, nt: int) -> Any:
    """The AOT-compiled scan fit of ``nt`` iterations (the floor) for data of this shape and dtype, compiled
    once per process (``measure_ladder`` and ``profile_iteration`` both time it)."""
    import jax

    from fastjax.pln import rungs as R

    key = (nt, *((a.shape, str(a.dtype)) for a in jax.tree.leaves((p0, data))))
    if key not in _SCAN_FITS:
        _SCAN_FITS[key] = compile_time(jax.jit(lambda params, data: R.scan_fit(params, data, nt)), p0, data)
    return _SCAN_FITS[key]


def measure_ladder(data: pln.PlnData | None = None) -> dict[str, Any]:
    """Seconds per iteration of every rung, of the floor (the AOT-compiled scan fit) and of Part V's
    floor (``F.fit_fast``, run for the same iterations), timed in turns in one run, compile apart.
    Returns {"rungs", "floor", "floor_fast", "extra"}."""
    import jax

    from fastjax.pln import rungs as R

    cfg = settings()
    data = pln.to_jax(pln.load_oaks_counts(cfg.repeat)) if data is None else data
    n, p, d = data.shape
    nt = cfg.n_time
    p0 = pln.start(data)
    eager = R.EagerPln(data)
    eager_first = first_call_seconds(eager.step)
    aot = _scan_fit_compiled(p0, data, nt)
    st0, model0 = R.PlnState(*p0, pln.optimizer().init(p0)), R.PlnModel.create(data)
    calls = {
        "1 no-jit": (python_loop(eager.step, cfg.n_time_eager), cfg.n_time_eager),
        "2 jit": (python_loop(R.JitPln(data).step, nt), nt),
        "3 scan": (lambda: R.scan_fit_jit(p0, data, n_iter=nt), nt),
        "4 NamedTuple": (lambda: R.namedtuple_fit(st0, data, n_iter=nt), nt),
        "5 pytree class": (lambda: model0.fit(data, n_iter=nt), nt),
    }
    from fastjax.pln import rungs_nnx  # rung 6 (Flax NNX): a module of its own, imported only where timed

    for how, (step, _) in rungs_nnx.nnx_steppers(data).items():
        calls[f"6 {how}"] = (python_loop(step, nt), nt)
    fast_args = (p0, data, np.float32(0), np.float32(math.inf))  # tolerance 0: all nt iterations
    fast = compile_time(_fit("fast"), *fast_args, maxiter=nt)
    calls["Part VI floor: hand gradient, packed Rprop"] = (lambda: fast.compiled(*fast_args), nt)
    calls["floor: AOT-compiled scan"] = (lambda: aot.compiled(p0, data), nt)
    timings = interleaved(calls, cfg.repeats)
    floor = timings.pop()
    floor.compile_seconds = aot.compile_seconds
    floor_fast = timings.pop()
    floor_fast.compile_seconds = fast.compile_seconds
    extra = dict(n=n, p=p, d=d, n_time=nt, n_time_eager=cfg.n_time_eager, size=cfg.size,
                 lower_seconds=aot.lower_seconds, compile_seconds=aot.compile_seconds,
                 eager_first_step_seconds=eager_first)
    return {"rungs": timings, "floor": floor, "floor_fast": floor_fast, "extra": extra}


def profile_iteration(data: pln.PlnData | None = None) -> list[Timing]:
    """Where one JAX iteration's time goes: seconds per iteration of scans that compute more and more of
    it (the ELBO; its p×p log-determinant term with gradient; the ELBO and its gradient; a whole Rprop
    step; the while_loop fit), AOT-compiled, timed in turns. The partial programs add each iteration's
    result to a running sum (one array written per iteration, not every iteration's kept)."""
    import jax

    from fastjax.pln import rungs as R

    cfg = settings()
    data = pln.to_jax(pln.load_oaks_counts(cfg.repeat)) if data is None else data
    nt, p0 = cfg.n_time, pln.start(data)

    def scan_of(fn):  # nt calls of fn(params) in one scan, params nudged so nothing is hoisted out
        def run(params, data):  # fn's results summed as the loop goes: one array of each per iteration is
            def body(carry, _):  # written, as a fit writes its gradient once, not nt of them stacked
                c, total = carry
                return (jax.tree.map(lambda a: a * 1.0000001, c), jax.tree.map(jax.numpy.add, total, fn(c, data))), None
            zero = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), jax.eval_shape(fn, params, data))
            return jax.lax.scan(body, (params, zero), length=nt)[0][1]
        return compile_time(jax.jit(run), p0, data).compiled

    def logdet_term(c, d):  # the p×p part of the ELBO: −(n/2) log|Σ|, Σ in closed form
        return -0.5 * c[0].shape[0] * jax.numpy.linalg.slogdet(pln.closed_form_covariance(d.covariates, *c))[1]

    elbo_only = scan_of(lambda c, d: pln.loss(c, d))
    logdet_grad = scan_of(lambda c, d: jax.grad(logdet_term)(c, d))
    with_grad = scan_of(lambda c, d: jax.value_and_grad(pln.loss)(c, d)[1])
    step = _scan_fit_compiled(p0, data, nt).compiled  # measure_ladder's floor, where it ran in this process
    args = _converge_args(data, math.inf)
    until = compile_time(R.fit_until_converged, *args, maxiter=nt).compiled
    return interleaved({"ELBO": (lambda: elbo_only(p0, data), nt),
                        "log|Σ| term + its gradient": (lambda: logdet_grad(p0, data), nt),
                        "ELBO + gradient": (lambda: with_grad(p0, data), nt),
                        "whole Rprop step (scan)": (lambda: step(p0, data), nt),
                        "whole step + criterion (while_loop)": (lambda: until(*args), nt)}, cfg.repeats + 2)


def pyplnmodels() -> Any:
    """The ``pyPLNmodels`` module, imported without the deprecation warning of the pkg_resources it imports."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import pyPLNmodels
    return pyPLNmodels


def fit_pyplnmodels(data: pln.PlnData, dtype: str = "float32", maxiter: int = pln.MAXITER,
                    tol: float = pln.TOL) -> tuple[Any, float, np.ndarray, np.ndarray]:
    """``pyPLNmodels.Pln(...).fit()`` quietly, in float32 (its own) or float64 (its tensors cast, the
    offsets taken at full precision): (model, seconds, ELBO before each update, cumulative seconds)."""
    import torch

    model = pyplnmodels().Pln(np.asarray(data.counts), offsets=np.asarray(data.offsets), exog=np.asarray(data.covariates),
                add_const=False)
    seconds, elbos = fit_quietly(model, data, dtype, maxiter, tol)
    return model, seconds, elbos, np.asarray(model._time_recorder.running_times)


def fit_quietly(model: Any, data: pln.PlnData, dtype: str, maxiter: int, tol: float,
                start: tuple[str, ...] = ()) -> tuple[float, np.ndarray]:
    """``model.fit()`` of a pyPLNmodels model, its printing silenced, in float32 (its own) or float64 (its
    data, and the start tensors named in ``start``, cast; torch's default dtype float64 meanwhile, as
    pyPLNmodels makes some tensors with it): (seconds, the ELBO before each update)."""
    import torch

    old = torch.get_default_dtype()
    if dtype == "float64":
        torch.set_default_dtype(torch.float64)  # pyPLNmodels makes S with torch.ones: the default dtype
        for name, value in (("_endog", data.counts), ("_exog", data.covariates), ("_offsets", data.offsets)):
            setattr(model, name, torch.from_numpy(np.asarray(value, np.float64)))
        for name in start:
            setattr(model, name, getattr(model, name).detach().double())
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            t0 = time.perf_counter()
            model.fit(maxiter=maxiter, tol=tol)
            seconds = time.perf_counter() - t0
    finally:
        torch.set_default_dtype(old)
    return seconds, np.array([float(e) for e in model._elbo_criterion_monitor.elbo_list])


def closure_retraces(data: pln.PlnData, n_objects: int = 3) -> dict[bool, int]:
    """How often rung 2's Rprop update is traced over ``n_objects`` fits of 3 steps, each object wrapping
    its update in a new ``jax.jit``: by ``tx_per_object`` (True: each object makes its optimizer, so a new
    ``update`` closure; False: all use the module's). One trace counter per function
    (chapters/pln/02-jit.md: the retrace comes from the new closure, not from the new ``jax.jit``)."""
    import jax

    from fastjax.pln import rungs as R

    counters: dict[Any, timing.count_traces] = {}

    class Recompiling(R.JitPln):
        def __init__(self, data: pln.PlnData, tx_per_object: bool):
            super().__init__(data)
            update = pln.optimizer().update if tx_per_object else R.tx.update  # a new closure, or the module's
            self._update = jax.jit(counters.setdefault(update, timing.count_traces(update)))

        def step(self) -> Any:
            value, grads = R.grad_fn(self.params, self.data)
            updates, self.opt_state = self._update(grads, self.opt_state, self.params)
            self.params = R.apply_fn(self.params, updates)
            return -value

    traces = {}
    for tx_per_object in (True, False):
        counters.clear()
        for _ in range(n_objects):
            Recompiling(data, tx_per_object).fit(3)
        traces[tx_per_object] = sum(c.count for c in counters.values())
    return traces


def fit_with(tx: Any, params: tuple[Any, Any], data: pln.PlnData, n_iter: int) -> tuple[tuple[Any, Any], Any]:
    """``n_iter`` updates of (M, S) with the optax transformation ``tx``: Part I's compiled fit
    (``rungs.fit_until_converged``) with ``tx`` as its optimizer and a tolerance of 0, so that every update
    runs (chapters/pln/00-model.md). The final (M, S) and the ELBO before each update, the same numbers as
    Part I's ``lax.scan`` fit (``rungs.scan_fit``) gives for pyPLNmodels' Rprop."""
    import jax
    import jax.numpy as jnp

    from fastjax.pln import rungs

    dtype = jax.tree.leaves(params)[0].dtype
    params, elbos, _ = jax.jit(rungs.fit_until_converged, static_argnames=("maxiter", "optimizer"))(
        params, data, jnp.zeros((), dtype), jnp.asarray(jnp.inf, dtype), maxiter=n_iter, optimizer=lambda: tx)
    return params, elbos


def rprop_toy_paths(n: int = 8, lr: float = 0.01) -> dict[str, np.ndarray]:
    """``n`` Rprop steps on a toy loss with sign flips, from one start, in float64: the paths (one row per
    step) of ``torch.optim.Rprop``, ``fastjax.pln.rprop.rprop`` and ``optax.rprop`` (chapters/pln/00-model.md)."""
    import jax
    import jax.numpy as jnp
    import optax
    import torch

    from fastjax.pln.rprop import rprop

    x0 = np.linspace(-1.0, 2.0, 4)

    def optax_path(tx: Any) -> np.ndarray:
        x, out = jnp.asarray(x0), []
        state = tx.init(x)
        for _ in range(n):
            g = jax.grad(lambda x: jnp.sum((x - 1.0) ** 4 + 0.1 * jnp.sin(5 * x)))(x)
            updates, state = tx.update(g, state, x)
            x = optax.apply_updates(x, updates)
            out.append(np.asarray(x))
        return np.array(out)

    x = torch.tensor(x0, requires_grad=True)
    opt, torch_path = torch.optim.Rprop([x], lr=lr), []
    for _ in range(n):
        opt.zero_grad()
        torch.sum((x - 1.0) ** 4 + 0.1 * torch.sin(5 * x)).backward()
        opt.step()
        torch_path.append(x.detach().numpy().copy())
    with jax.enable_x64(True):
        return {"torch": np.array(torch_path), "fastjax": optax_path(rprop(lr)), "optax.rprop": optax_path(optax.rprop(lr))}


def pyplnmodels_elbo64(model: Any, data: pln.PlnData) -> float:
    """pyPLNmodels' own profiled-ELBO formula (``pyPLNmodels.calculations.elbos.profiled_elbo_pln``, which
    ``Pln.compute_elbo`` calls) evaluated in float64 at a fitted model's latent parameters, on ``data`` (the
    counts, offsets and covariates the model was fitted to, at full precision). Beside the book's own
    formula in float64, the two differ by float64 rounding only: pyPLNmodels' float32 ELBO differs by
    float32 rounding, which depends on how torch orders its sums on this CPU."""
    import torch
    from pyPLNmodels.calculations.elbos import profiled_elbo_pln

    as64 = lambda a: torch.as_tensor(np.asarray(a, np.float64))  # noqa: E731
    with torch.no_grad():
        return float(profiled_elbo_pln(endog=as64(data.counts), exog=as64(data.covariates),
                                       offsets=as64(data.offsets),
                                       latent_mean=as64(model._latent_mean.detach().numpy()),
                                       latent_sqrt_variance=as64(model._latent_sqrt_variance.detach().numpy())))


def first_reaching(elbos: np.ndarray, target: float, gap: float = TARGET_GAP) -> int | None:
    """Index of the first ELBO within ``gap`` (relative) of ``target``, or None."""
    hit = np.flatnonzero(np.asarray(elbos) >= target - gap * abs(target))
    return int(hit[0]) if hit.size else None


def _converge_args(data: pln.PlnData, target: float) -> tuple[Any, ...]:
    import jax.numpy as jnp

    return pln.start(data), data, jnp.float32(pln.TOL), jnp.float32(target)


FITS = ("fast", "part1")  # Part V's floor (hand gradient, packed Rprop) and Part I's while_loop fit


def _fit(name: str) -> Any:
    """The compiled-once JAX fit called ``name`` (both have ``fit_until_converged``'s signature)."""
    from fastjax.pln import floor as F, rungs as R

    if name not in FITS:
        raise ValueError(f"fit must be one of {FITS}; got {name!r}")
    return F.fit_fast if name == "fast" else R.fit_until_converged


def cache_run(cache_dir: str, data_file: str, target: float, fit: str = "fast") -> dict[str, float]:
    """In this (fresh) process: the converging fit's first call, compile included, with JAX's persistent
    compilation cache in ``cache_dir``, on the data saved in ``data_file`` (``.npz``); then a warm call. Seconds."""
    import jax

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from fastjax.tools.timing import block

    with np.load(data_file) as f:
        data = pln.to_jax(pln.PlnData(f["counts"], f["offsets"], f["covariates"], float(f["log_factorial"])))
    args = _converge_args(data, target)
    t0 = time.perf_counter()
    block(_fit(fit)(*args))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    block(_fit(fit)(*args))
    return {"first_call_seconds": first, "warm_call_seconds": time.perf_counter() - t0}


def _fresh_process(*flags: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "fastjax.pln.bench", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy(), timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_fits(processes: int = 3, repeat: int = 1) -> dict[str, list[dict[str, float]]]:
    """pyPLNmodels' first ``Pln.fit()`` in a fresh process, then a second one (oaks stacked ``repeat``
    times), in ``processes`` new processes of each kind, taken in turns: ``"plain"``, and ``"preimport"``,
    which imports ``torch._dynamo`` before its first fit (torch's ``Optimizer.__init__`` imports it on
    first use, and that import is the first fit's one-time cost). Seconds."""
    out: dict[str, list[dict[str, float]]] = {"plain": [], "preimport": []}
    for _ in range(processes):
        out["plain"].append(_fresh_process("--first-fit", "--repeat", str(repeat)))
        out["preimport"].append(_fresh_process("--first-fit", "--preimport", "--repeat", str(repeat)))
    return out


def first_fit_here(repeat: int, preimport: bool) -> dict[str, float]:
    """Optionally ``import torch._dynamo``, then two ``Pln.fit()``, in this process (first_fits' fresh ones). Seconds."""
    import torch  # noqa: F401  (imported before the clock starts, as in any fit)

    with warnings.catch_warnings():  # pyPLNmodels imports pkg_resources, which announces its own deprecation
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import pyPLNmodels  # noqa: F401

    data = pln.load_oaks_counts(repeat)
    out = {}
    if preimport:
        t0 = time.perf_counter()
        import torch._dynamo  # noqa: F401

        out["import_torch_dynamo_seconds"] = time.perf_counter() - t0
    out["first_fit_seconds"] = fit_pyplnmodels(data)[1]
    out["second_fit_seconds"] = fit_pyplnmodels(data)[1]
    return out


def _spread(values: list[float]) -> list[float]:
    """[first quartile, third quartile] of ``values``."""
    return [float(np.percentile(values, 25)), float(np.percentile(values, 75))]


def race(data: pln.PlnData | None = None, fit: str = "fast", repeats: int | None = None,
         torch_threads: int | None = None, fresh_process: bool = True) -> dict[str, Any]:
    """pyPLNmodels' ``Pln.fit`` (defaults) against the JAX fit ``fit`` (``"fast"``: Part V's floor, the
    default; ``"part1"``: Part I's), which stops by the same rule in one compiled ``lax.while_loop``: time
    to converge and to reach pyPLNmodels' final ELBO (within 0.05 %), compile apart, compile included, and
    (``fresh_process``) in a fresh process with a warm persistent cache. ``data``: NumPy ``PlnData``
    (default: oaks at the bench's size). Both sides are warmed up first (pyPLNmodels' first fit in a
    process is slower: its first torch optimizer imports ``torch._dynamo``, see ``first_fits``); then
    ``repeats`` rounds, each running every contender once, in turns, so that a change of load hits all alike. Part I's fit runs in every round too (the old floor).
    pyPLNmodels runs at 1 torch thread and at one per core (``torch_threads``: that one only) and keeps its
    faster setting (``threads``). Figures are medians; ``spread`` gives the quartiles of the per-round values
    and ratios; ``ratios`` holds each speed-up as a ``timing.Ratio``, "not measured" where the witness saw a
    busy machine. Seconds."""
    import torch

    _fit(fit)  # a known fit, or a ValueError naming the choices
    cfg = settings()
    repeats = cfg.race_repeats if repeats is None else checks.check_positive_int(repeats, "repeats")
    data_np = pln.load_oaks_counts(cfg.repeat) if data is None else data
    if not isinstance(data_np.counts, np.ndarray):
        raise TypeError("race needs the data as NumPy arrays (pln.load_*_counts or pln.check_pln_data), "
                        f"not {type(data_np.counts).__name__}: pyPLNmodels gets the same numbers")
    data = pln.to_jax(data_np)
    compiled = {name: compile_time(_fit(name), *_converge_args(data, math.inf)) for name in FITS}
    ours = compiled[fit]
    # warm-up, untimed: the first fit in a process is slower (it imports torch._dynamo); it also gives the
    # target, pyPLNmodels' final ELBO (the same at every thread count: its rounds are checked below)
    first_run = fit_pyplnmodels(data_np)[2:]
    target = float(first_run[0][-1])
    k_p = first_reaching(first_run[0], target)
    to_target = {}  # torch threads -> pyPLNmodels' seconds to the target in each of its fits (its own clock)

    def pyplnmodels_fit() -> None:
        _, _, p_elbos, p_times = fit_pyplnmodels(data_np)
        to_target.setdefault(torch.get_num_threads(), []).append(float(p_times[k_p]))  # same iterations every run

    converge, reach = _converge_args(data, math.inf), _converge_args(data, target - TARGET_GAP * abs(target))
    fns = {"pyPLNmodels": pyplnmodels_fit, "JAX": lambda: ours.compiled(*converge),
           "JAX to target": lambda: ours.compiled(*reach), "Part I's JAX": lambda: compiled["part1"].compiled(*converge)}
    t = time_interleaved(fns, repeats, min_repeat_seconds=0.0, warmup=1, settings=(torch_threads,) if torch_threads else None,
                         threads={"pyPLNmodels": timing.torch_threads(),
                                  **{n: timing.xla_threads() for n in fns if n != "pyPLNmodels"}})
    p_t = t["pyPLNmodels"]
    p_target = Timing("pyPLNmodels to target", to_target[p_t.extra["thread_count"]][-repeats:], load=p_t.load)
    runs = {"pyplnmodels_seconds": p_t.seconds, "pyplnmodels_seconds_to_target": p_target.seconds,
            "jax_seconds": t["JAX"].seconds, "jax_seconds_to_target": t["JAX to target"].seconds,
            "jax_part1_seconds": t["Part I's JAX"].seconds}
    p_elbos, p_times = first_run
    _, j_elbos, crit = ours.compiled(*converge)
    pln.check_fit(j_elbos, crit)
    j_elbos = np.asarray(j_elbos)[: int(crit.count)]
    _, _, crit_t = ours.compiled(*reach)
    compile_s = ours.lower_seconds + ours.compile_seconds
    med = {k: float(np.median(v)) for k, v in runs.items()}
    plus_compile = lambda tm: Timing(tm.name + " + compile", [s + compile_s for s in tm.seconds], load=tm.load,  # noqa: E731
                                     extra=tm.extra)
    ratios = {  # each a timing.Ratio: pyPLNmodels' time over the JAX time measured beside it, or "not measured"
        "converge_compile_excluded": timing.ratio(p_t, t["JAX"]),
        "converge_compile_included": timing.ratio(p_t, plus_compile(t["JAX"])),
        "target_compile_excluded": timing.ratio(p_target, t["JAX to target"]),
        "target_compile_included": timing.ratio(p_target, plus_compile(t["JAX to target"])),
        "part1_converge_compile_excluded": timing.ratio(p_t, t["Part I's JAX"]),
    }
    per_round = {
        "speedup_converge_compile_excluded": [a / b for a, b in zip(runs["pyplnmodels_seconds"], runs["jax_seconds"])],
        "speedup_target_compile_excluded": [a / b for a, b in zip(runs["pyplnmodels_seconds_to_target"],
                                                                  runs["jax_seconds_to_target"])],
        "speedup_part1_converge_compile_excluded": [a / b for a, b in zip(runs["pyplnmodels_seconds"],
                                                                          runs["jax_part1_seconds"])],
    }
    out = dict(
        n=data.shape[0], p=data.shape[1], fit=fit, repeats=repeats, torch_threads=p_t.extra["thread_count"],
        threads={"pyPLNmodels": p_t.extra["threads"], "JAX": t["JAX"].extra["threads"]},
        threads_tried=p_t.extra["threads_tried"],
        target_elbo=target, pyplnmodels_iterations=len(p_elbos), pyplnmodels_iters_to_target=k_p + 1,
        pyplnmodels_seconds=med["pyplnmodels_seconds"], pyplnmodels_seconds_to_target=med["pyplnmodels_seconds_to_target"],
        pyplnmodels_elbos=p_elbos.tolist(), pyplnmodels_running_seconds=p_times.tolist(),
        jax_iterations=len(j_elbos), jax_final_elbo=float(j_elbos[-1]), jax_iters_to_target=int(crit_t.count),
        jax_elbos=j_elbos.tolist(), jax_seconds=med["jax_seconds"], jax_seconds_to_target=med["jax_seconds_to_target"],
        jax_part1_seconds=med["jax_part1_seconds"], jax_compile_seconds=compile_s,
        ratios=ratios, loads={n: tm.load for n, tm in t.items()},
        runs=runs, spread={**{k: _spread(v) for k, v in runs.items()}, **{k: _spread(v) for k, v in per_round.items()}},
    )
    if fresh_process:
        with tempfile.TemporaryDirectory() as folder:
            data_file = os.path.join(folder, "data.npz")
            np.savez(data_file, **data_np._asdict())
            flags = ("--cache-run", os.path.join(folder, "cache"), "--data", data_file, "--target", repr(target), "--fit", fit)
            _fresh_process(*flags)  # fills the cache
            warm = _fresh_process(*flags)
        out["jax_fresh_process_cached_seconds"] = warm["first_call_seconds"]
        out["ratios"]["converge_cache_warm"] = timing.ratio(  # the pyPLNmodels side's witness decides (one fresh run)
            p_t, Timing("JAX, fresh process, cache warm", [warm["first_call_seconds"]], load=t["JAX"].load))
    return out


def whole_process(repeats: tuple[int, ...] | None = None, rounds: int | None = None) -> dict[str, Any]:
    """The whole-process race of ``fastjax.pln.first_result`` (chapters/floor/04-first-result.md) on oaks
    stacked each of ``repeats`` times (default: 1 at the quick size, 1 and 100 at full), ``rounds`` rounds
    in turns (default 2 quick, 5 full): per size, each script's median wall, CPU and peak memory and its
    per-round ratios to pyPLNmodels' script and to a bare JAX process."""
    from fastjax.pln import first_result

    quick = settings().size == "quick"
    repeats = ((1,) if quick else (1, 100)) if repeats is None else repeats
    rounds = (2 if quick else 5) if rounds is None else rounds
    return {f"n={116 * r}": first_result.race(repeat=r, rounds=rounds, quick=quick) for r in repeats}


def time_nnx_paths(data: Any, n_time: int, rounds: int) -> tuple[list[Timing], Timing]:
    """Chapter 6's timings (chapters/pln/06-split-merge.md): each way to call rung 6's NNX train step from a
    Python loop (``rungs_nnx.nnx_steppers``, and ``nnx.cached_partial`` where this Flax has it), each on a
    fresh model, against one ``jax.jit`` step on plain arrays, in turns; per iteration. Returns the NNX
    paths' timings (named "6 <path>") and the plain step's."""
    import jax
    import optax
    from flax import nnx

    from fastjax.pln.rungs_nnx import new_nnx, nnx_steppers, nnx_train_step

    tx = pln.optimizer()

    @jax.jit
    def plain_step(params, opt_state, data):
        value, grads = jax.value_and_grad(pln.loss)(params, data)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, -value

    box = {"p": pln.start(data)}
    box["s"] = tx.init(box["p"])

    def plain() -> Any:
        box["p"], box["s"], e = plain_step(box["p"], box["s"], data)
        return e

    calls = {f"6 {how}": (python_loop(step, n_time), n_time) for how, (step, _) in nnx_steppers(data).items()}
    if hasattr(nnx, "cached_partial"):
        cached = nnx.cached_partial(nnx.jit(nnx_train_step), *new_nnx(data))
        calls["6 nnx.cached_partial"] = (python_loop(lambda: cached(data), n_time), n_time)
    calls["jax.jit step on arrays"] = (python_loop(plain, n_time), n_time)
    ts = interleaved(calls, rounds=rounds)
    return ts[:-1], ts[-1]


_FIRST_STEPS = """
import json, sys
import fastjax
from fastjax import pln
from fastjax.pln.rungs import EagerPln
from fastjax.tools import timing
model = EagerPln(pln.to_jax(pln.load_oaks_counts(int(sys.argv[1]))))
first = timing.first_call_seconds(model.step)
print(json.dumps({"first": first, "second": timing.first_call_seconds(model.step)}))
"""


def eager_first_steps(repeat: int, timeout: float = 600) -> dict[str, float]:
    """Seconds of rung 1's first and second eager steps in a fresh Python process (where no operation is
    compiled yet), on oaks stacked ``repeat`` times: ``{"first": ..., "second": ...}``
    (chapters/pln/01-no-jit.md)."""
    out = subprocess.run([sys.executable, "-c", _FIRST_STEPS, str(repeat)], capture_output=True, text=True,
                         check=True, timeout=timeout)
    return json.loads(out.stdout.strip().splitlines()[-1])


# What chapters/pln/07-results.md prints and says of a :func:`race` result.

def race_report(race_: dict[str, Any]) -> str:
    """The race's figures as lines of text: threads, each side's iterations, seconds and ELBO, the fresh
    process and Part I's fit, and every ratio (the ratio of medians, or "not measured")."""
    r = race_
    lines = [f"n = {r['n']:,}; medians of {r['repeats']} rounds; threads: " + "; ".join(f"{k}: {v}" for k, v in r["threads"].items())
             + " (pyPLNmodels tried " + ", ".join(f"{k}: {v:.2f} s" for k, v in r["threads_tried"].items() if v) + ")",
             f"pyPLNmodels: {r['pyplnmodels_iterations']} iterations in {r['pyplnmodels_seconds']:.3f} s, "
             f"final ELBO {r['target_elbo']:,.2f}; within 0.05 % after {r['pyplnmodels_iters_to_target']} "
             f"iterations, {r['pyplnmodels_seconds_to_target']:.3f} s",
             f"JAX:         {r['jax_iterations']} iterations in {r['jax_seconds']:.3f} s "
             f"+ compile {r['jax_compile_seconds']:.2f} s, final ELBO {r['jax_final_elbo']:,.2f}; "
             f"within 0.05 % after {r['jax_iters_to_target']} iterations, {r['jax_seconds_to_target']:.3f} s",
             f"JAX, fresh process, persistent cache warm: {r['jax_fresh_process_cached_seconds']:.3f} s to converge",
             f"Part I's fit (the old floor): {r['jax_part1_seconds']:.3f} s to converge"]
    lines += [f"speed-up, {key.replace('_', ' ')}: {x.text()}" for key, x in r["ratios"].items()]
    return "\n".join(lines)


def race_sentence(race_: dict[str, Any]) -> str:
    """The race's answer in one sentence, or, where the witness saw a busy machine, the sentence that says
    so (one witness for the whole race: its rounds ran together)."""
    r = race_["ratios"]
    if not all(v.measured for v in r.values()):
        return next(v for v in r.values() if not v.measured).says("", otherwise="The race against pyPLNmodels")
    return ("Against pyPLNmodels, with the same algorithm and the same stopping rule, the compiled JAX fit of Part VI "
            f"converges {r['converge_compile_excluded'].value:.1f}× faster with compile time apart (Part I's own fit: "
            f"{r['part1_converge_compile_excluded'].value:.1f}×), {r['converge_compile_included'].value:.2f}× with it "
            f"included, and {r['converge_cache_warm'].value:.2f}× in a fresh process that finds the compiled program in "
            "the persistent cache.")


def race_timings(race_: dict[str, Any]) -> list[Timing]:
    """The race's runs as timings for a chart, each with the load its witness read."""
    runs, load, compile_s = race_["runs"], race_["loads"], race_["jax_compile_seconds"]
    return [Timing("pyPLNmodels (torch)", runs["pyplnmodels_seconds"], load=load["pyPLNmodels"]),
            Timing("Part I's fit, compiled", runs["jax_part1_seconds"], load=load["Part I's JAX"]),
            Timing("Part VI's fit + compile", [s + compile_s for s in runs["jax_seconds"]], load=load["JAX"]),
            Timing("Part VI's fit, fresh process, cache warm", [race_["jax_fresh_process_cached_seconds"]], load=load["JAX"]),
            Timing("Part VI's fit, compiled", runs["jax_seconds"], load=load["JAX"])]


def trend(over_scan: dict[int, dict[str, float]], rung: str, fmt: str) -> str:
    """A rung's time over the scan's at two n (``over_scan``: n -> rung -> ratio), and which way it went
    (10 %: beyond the spread of such runs)."""
    small_n, large_n = sorted(over_scan)
    a, b = over_scan[small_n][rung], over_scan[large_n][rung]
    way = "fell" if b < a / 1.1 else "rose" if b > a * 1.1 else "changed by less than 10 %"
    return f"{a:{fmt}}× at n = {small_n:,} and {b:{fmt}}× at n = {large_n:,} ({way})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole", action="store_true",
                        help="race the scripts as whole processes (--repeat-list sizes, --rounds rounds)")
    parser.add_argument("--repeat-list", type=int, nargs="+", help="(with --whole) oaks stacked these many times")
    parser.add_argument("--cache-run", metavar="DIR", help="(race's own) time the first call with the persistent cache in DIR")
    parser.add_argument("--data", help="(with --cache-run) the .npz file of the data")
    parser.add_argument("--fit", choices=FITS, default="fast", help="the JAX fit (default: Part V's)")
    parser.add_argument("--target", type=float, default=math.inf)
    parser.add_argument("--first-fit", action="store_true", help="(first_fits' own) time this process' first two fits")
    parser.add_argument("--preimport", action="store_true", help="(with --first-fit) import torch._dynamo first")
    parser.add_argument("--cold", type=int, metavar="N",
                        help="pyPLNmodels' first and second fit in N fresh processes, and in N that import torch._dynamo first")
    parser.add_argument("--repeat", type=int, default=1, help="oaks stacked this many times (--first-fit, --cold)")
    parser.add_argument("--scrna", type=int, nargs=2, metavar=("CELLS", "GENES"),
                        help="race on pyPLNmodels' single-cell counts instead of oaks")
    parser.add_argument("--rounds", type=int, help="rounds of the race (default: the size's)")
    args = parser.parse_args(argv)
    if args.whole:
        print(json.dumps(whole_process(tuple(args.repeat_list) if args.repeat_list else None, args.rounds), indent=2))
    elif args.cache_run:
        print(json.dumps(cache_run(args.cache_run, args.data, args.target, args.fit)))
    elif args.first_fit:
        print(json.dumps(first_fit_here(args.repeat, args.preimport)))
    elif args.cold:
        fits = first_fits(args.cold, args.repeat)
        print(json.dumps(fits, indent=2))
        for kind, rows in fits.items():
            print(kind + ": " + ", ".join(f"{k} {np.median([r[k] for r in rows]):.3f} s" for k in rows[0]) + " (medians)")
    else:
        data = pln.load_scrna_counts(*args.scrna) if args.scrna else None
        result = race(data, fit=args.fit, repeats=args.rounds, fresh_process=not args.scrna)
        print(json.dumps({k: v for k, v in result.items() if not isinstance(v, (list, dict))}, indent=2))
        print(json.dumps(result["spread"], indent=2))
        print("threads:", result["threads"])
        for key, r in result["ratios"].items():  # "not measured" where the witness saw a busy machine
            print(f"speed-up, {key.replace('_', ' ')}: {r.text()}" + (f" ({r.why})" if r.why else ""))


if __name__ == "__main__":
    main()
