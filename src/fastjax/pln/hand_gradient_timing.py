"""What the pieces of the hand-written PLN gradient (``fastjax.pln.floor``) cost, as
chapters/floor/01-pln-gradient.md measures them: where the time of ``jax.grad``'s fit goes
(``autodiff_time``), the ways of applying Σ⁻¹ as kernels of their own (``time_sigma_kernels``), the p×p
and n×n algebra where n < p (``time_wide``), one iteration's flops and bytes (``iteration_cost``), whole
fits against their roofline (``against_roofline``), and the fit under several OpenBLAS idle-thread
waits, one fresh process each (``time_openblas_waits``, ``openblas_table``, ``openblas_glues``); and, for
chapters/floor/02-rprop-memory.md, the new floor raced against Part I's (``race_floors``). Each function also checks
that what it times computes the same numbers, and raises (``AssertionError``) where it does not.
Timings are the caller's to report; nothing here is a timed assertion.

    python -m fastjax.pln.hand_gradient_timing SHAPES N_ITER REPEATS CACHE   # one OpenBLAS probe process
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

import fastjax  # noqa: F401  (the CPU workaround and OpenBLAS's wait, before jax)
import jax
import jax.numpy as jnp
import numpy as np

from fastjax import pln
from fastjax.pln import floor as F, rungs as R
from fastjax.tools import profiling, timing


def autodiff_time(compiled: Any, args: tuple) -> dict[str, Any]:
    """Where the time of ``compiled`` (Part I's fit, ``jax.grad`` of ``pln.loss``) goes, traced on ``args``
    (params, data, ...): the traced ops, op time shared by kind, and the LAPACK calls of its loop by the
    matrix they work on, Σ (p×p) or XᵀX (for B): how many, and their share of op time. Checks that those
    on Σ are an LU factorisation and two triangular solves."""
    p = args[1].counts.shape[1]
    ops = profiling.traced_ops(compiled, *args)
    share = {r["op name"]: r["share"] for r in ops}
    in_loop = [c for c in profiling.library_calls(compiled.as_text()) if c["in_loop"]]
    on_sigma = [c for c in in_loop if c["operands"][0][-1] == p]
    on_xtx = [c for c in in_loop if c["operands"][0][-1] != p]
    kernels = sorted(c["kernel"] for c in on_sigma)
    if kernels != ["getrf", "trsm", "trsm"]:  # LU, and 2 solves
        raise AssertionError(kernels)
    return {"ops": ops, "shares": profiling.shares_by_kind(ops),
            "sigma calls": len(on_sigma), "sigma share": sum(share.get(c["name"], 0.0) for c in on_sigma),
            "xtx calls": len(on_xtx), "xtx share": sum(share.get(c["name"], 0.0) for c in on_xtx)}


def kernel_inputs(data: pln.PlnData) -> tuple[Any, Any, Any, Any]:
    """R, Σ's Cholesky factor L, D's diagonal and Σ⁻¹ at pyPLNmodels' start (computed in NumPy, as float32)."""
    m, s = pln.start(data)
    x = data.covariates
    r = m - x @ np.linalg.solve(x.T @ x, x.T @ m)
    col_sq = np.sum(s * s, axis=0)
    sigma = (r.T @ r + np.diag(col_sq)) / r.shape[0]
    return tuple(jnp.asarray(np.asarray(a, np.float32)) for a in (r, np.linalg.cholesky(sigma), col_sq,
                                                                   np.linalg.inv(sigma)))


def solves_alone(r, chol):
    """Only the two triangular solves of the "two solves" way: R Σ⁻¹ = (L⁻ᵀ L⁻¹ Rᵀ)ᵀ."""
    w = jax.scipy.linalg.solve_triangular(chol, r.T, lower=True)
    return jax.scipy.linalg.solve_triangular(chol, w, lower=True, trans="T").T


def time_sigma_kernels(data_np: dict[str, pln.PlnData], repeats: int):
    """On each shape: the two ways of ``F.precision_products``, the two triangular solves alone and the
    product R Σ⁻¹ alone, each its own program, timed in turns. Checks that the three ways give R Σ⁻¹, that
    the solves alone are two LAPACK calls and copies, and their flops. Returns (table rows,
    {shape: (solve flop/s, product flop/s)}, {shape: {program: ms}})."""
    rows, rates, kernel_ms = [], {}, {}
    for name, d in data_np.items():
        r, chol, col_sq, precision = kernel_inputs(d)
        n, p = r.shape
        programs = {"two solves": (jax.jit(lambda r, c, q: F.precision_products(r, c, q, False)), (r, chol, col_sq)),
                    "Σ⁻¹, then one product": (jax.jit(lambda r, c, q: F.precision_products(r, c, q, True)),
                                              (r, chol, col_sq)),
                    "the two solves alone": (jax.jit(solves_alone), (r, chol)),
                    "the product R Σ⁻¹ alone": (jax.jit(lambda r, s: r @ s), (r, precision))}
        compiled = {k: (f.lower(*a).compile(), a) for k, (f, a) in programs.items()}
        t = timing.time_interleaved({k: (lambda c=c, a=a: c(*a)) for k, (c, a) in compiled.items()}, repeats=repeats)
        kernel_ms[name] = {k: 1e3 * v.median for k, v in t.items()}
        expected = np.asarray(r, np.float64) @ np.asarray(precision, np.float64)
        for k in ("two solves", "Σ⁻¹, then one product", "the two solves alone"):  # the same numbers (float32 rounding apart)
            out = compiled[k][0](*compiled[k][1])
            # 1e-3 of the largest entry: float32 solves with cond(Σ) ~1e2-1e3 here (measured ~1e-6)
            np.testing.assert_allclose(out if k == "the two solves alone" else out[0], expected, rtol=0,
                                       atol=1e-3 * np.max(np.abs(expected)))
        alone_hlo = compiled["the two solves alone"][0].as_text()
        # alone: the two LAPACK calls, and around them only the copies that put operands in LAPACK's column-major order
        if not (profiling.unfused(alone_hlo) == {"custom-call": 2}):
            raise AssertionError((name, profiling.unfused(alone_hlo)))
        if not (all(set(f["ops"]) <= {"copy", "transpose"} for f in profiling.fusions(alone_hlo))):
            raise AssertionError(name)
        solve_cost = profiling.cost(compiled["the two solves alone"][0])
        if not (solve_cost["library flops"] == 2 * n * p * p):  # two trsm: p² flops per right-hand side, n of them, twice
            raise AssertionError('failed: solve_cost["library flops"] == 2 * n * p * p')
        product_flops = profiling.cost(compiled["the product R Σ⁻¹ alone"][0])["flops"]
        rates[name] = (solve_cost["library flops"] / t["the two solves alone"].median,
                       product_flops / t["the product R Σ⁻¹ alone"].median)
        faster = min(("two solves", "Σ⁻¹, then one product"), key=lambda k: t[k].median)
        rule = "Σ⁻¹, then one product" if n > 2 * p else "two solves"
        rows.append({"data": name, "n": n, "p": p, **{f"{k} (ms)": 1e3 * t[k].median for k in compiled},
                     "solves Gflop/s": rates[name][0] / 1e9, "product Gflop/s": rates[name][1] / 1e9,
                     "solve rate / product rate": rates[name][0] / rates[name][1],
                     "n > 2p picks": rule, "faster here": faster})
    return rows, rates, kernel_ms


def sigma_way(r, col_sq):
    """R Σ⁻¹, diag(Σ⁻¹) and log|Σ| through Σ's Cholesky factor (the p×p way of value_and_grad_by_hand)."""
    chol = jnp.linalg.cholesky((r.T @ r + jnp.diag(col_sq)) / r.shape[0])
    return (*F.precision_products(r, chol, col_sq), 2 * jnp.sum(jnp.log(jnp.diag(chol))))


def k_way(r, col_sq):
    """The same three through the n×n matrix K (``F.wide_products``)."""
    return F.wide_products(r, col_sq)[:3]


def time_wide(data: pln.PlnData, repeats: int) -> tuple[list[dict], dict[str, timing.Timing]]:
    """The p×p and the n×n way on ``data`` (at the start of a fit), each compiled alone, timed in turns;
    checks they give the same three results. Returns (rows with ms and Gflop, the timings)."""
    r, _, col_sq, _ = kernel_inputs(data)
    ways = {"p×p: Σ's Cholesky factor": jax.jit(sigma_way).lower(r, col_sq).compile(),
            "n×n: K's Cholesky factor": jax.jit(k_way).lower(r, col_sq).compile()}
    t = timing.time_interleaved({k: (lambda c=c: c(r, col_sq)) for k, c in ways.items()}, repeats=repeats)
    through_sigma, through_k = (ways[k](r, col_sq) for k in ways)
    for a, b in zip(through_sigma, through_k):  # the same three results (float32 rounding apart)
        # 1e-3 of the largest entry: float32 with cond(Σ) up to ~1e3 here (measured ~1e-5)
        np.testing.assert_allclose(a, b, atol=1e-3 * float(jnp.max(jnp.abs(a))), rtol=0)
    return [{"way": k, "ms": 1e3 * t[k].median, "Gflop": profiling.cost(c)["flops"] / 1e9}
            for k, c in ways.items()], t


def iteration_cost(loss: Any, data: pln.PlnData, tx: Any = None) -> dict[str, Any]:
    """Flops and bytes of one iteration (value, gradient by ``loss``, update by ``tx``, default
    ``pln.optimizer()``) on ``data``, compiled as a program of its own, LAPACK calls included (``profiling.cost``)."""
    tx = pln.optimizer() if tx is None else tx

    def step(params, opt_state, data):
        value, grads = jax.value_and_grad(loss)(params, data)
        updates, opt_state = tx.update(grads, opt_state, params)
        return jax.tree.map(jnp.add, params, updates), opt_state, value

    p0 = pln.start(data)
    return profiling.cost(jax.jit(step).lower(p0, tx.init(p0), data).compile())


def against_roofline(fits: dict[str, dict[str, tuple[Any, Any]]], args: dict[str, tuple], n_iter: int,
                     repeats: int, flops_per_s: float, bytes_per_s: float) -> tuple[list[dict], dict, dict]:
    """Per iteration, on each shape, the compiled fits ``fits[shape][label] = (compiled fit, its loss)``
    timed in turns on ``args[shape]``, each against its roofline (flops and bytes of one iteration by
    ``iteration_cost``, LAPACK calls included). Checks that the fits end at the same ELBO by the book's rule
    (``pln.TARGET_GAP``). Returns (table rows, {shape: first label's time / second's},
    {(shape, label): fraction of the roofline})."""
    rows, speedups, fractions = [], {}, {}
    for name, compiled in fits.items():
        t = timing.time_interleaved({label: (lambda c=c: c(*args[name])) for label, (c, _) in compiled.items()},
                                    repeats=repeats, per={label: n_iter for label in compiled})
        ends = {label: float(np.asarray(c(*args[name])[1])[n_iter - 1]) for label, (c, _) in compiled.items()}
        first, second = list(compiled)
        # Rprop follows the signs of two roundings of one gradient: an entry within rounding of 0 can take the
        # other branch, and no rounding argument bounds where that leads; the last ELBOs are the same fit by the
        # book's rule (pln.TARGET_GAP)
        if not (abs(pln.relative_gap(ends[second], ends[first])) < pln.TARGET_GAP):
            raise AssertionError((name, ends))
        for label, (_, loss) in compiled.items():
            c = iteration_cost(loss, args[name][1])
            bound = profiling.roofline(c["flops"], c["bytes accessed"], flops_per_s, bytes_per_s)
            fractions[(name, label)] = profiling.fraction_of_roofline(t[label].median, bound)
            rows.append({"data": name, "gradient": label, "ms / iteration": 1e3 * t[label].median,
                         "Gflop": c["flops"] / 1e9, "MB": c["bytes accessed"] / 1e6,
                         "LAPACK's MB": c["library bytes"] / 1e6, "bound ms": 1e3 * bound["bound s"],
                         "limit": bound["limit"], "fraction of roofline": fractions[(name, label)]})
        speedups[name] = t[first].median / t[second].median
    return rows, speedups, fractions


def _probe(shapes: dict[str, list], n_iter: int, repeats: int, cache: str) -> dict[str, float]:
    """Seconds per iteration of the fit with the hand gradient on each shape, in this process."""
    jax.config.update("jax_compilation_cache_dir", cache)  # one compile for all the processes
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    fits, args = {}, {}  # compiled by the first process; the others load them from the cache
    for name, (kind, size) in shapes.items():
        d = pln.to_jax(pln.load_oaks_counts(size) if kind == "oaks" else pln.load_scrna_counts(*size))
        args[name] = (pln.start(d), d, jnp.float32(0), jnp.float32(math.inf))
        fits[name] = R.fit_until_converged.lower(*args[name], maxiter=n_iter, loss=F.loss_by_hand).compile()
    t = timing.time_interleaved({k: (lambda k=k: fits[k](*args[k])) for k in fits}, repeats=repeats,
                                per={k: n_iter for k in fits})
    return {k: v.median for k, v in t.items()}


def time_openblas_waits(settings: dict[str, dict[str, str]], shapes: dict[str, tuple], n_iter: int, repeats: int,
                        rounds: int, cache: str) -> list[dict]:
    """The fit with the hand gradient on ``shapes`` (name -> (kind, size)), timed in one fresh process per
    setting (environment variables), the settings in turns, ``rounds`` times. The processes share the
    persistent compilation cache ``cache``, so they run the same compiled programs. Returns one row per
    process: round, setting, and seconds per iteration per shape."""
    runs = []
    for round_ in range(rounds):
        for setting, variables in settings.items():
            # OpenBLAS also reads OMP_NUM_THREADS (a test runner may set it to 1): only the setting decides here
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
            env.update(variables)
            out = subprocess.run([sys.executable, "-m", __name__, json.dumps(shapes), str(n_iter), str(repeats), cache],
                                 capture_output=True, text=True, env=env, timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"the probe process for {setting!r} failed:\n{out.stderr[-2000:]}")
            runs.append({"round": round_ + 1, "setting": setting, **json.loads(out.stdout.strip().splitlines()[-1])})
    return runs



def openblas_table(runs: list[dict], settings: dict[str, dict[str, str]], reference: str) -> tuple[dict, list[dict]]:
    """From ``time_openblas_waits``' rows: the median seconds per iteration of each setting on each shape,
    and one table row per process (its setting's variables, ms per iteration, and × ``reference``'s median)."""
    shapes = [k for k in runs[0] if k not in ("round", "setting")]
    blas = {s: {k: float(np.median([r[k] for r in runs if r["setting"] == s])) for k in shapes} for s in settings}
    env_text = {s: " ".join(f"{k}={v}" for k, v in e.items()) for s, e in settings.items()}
    table = [{"process": r["round"], "setting": f"{r['setting']} ({env_text[r['setting']]})",
              **{f"{k}, ms / iteration": 1e3 * r[k] for k in shapes},
              **{f"{k}, × {reference}": r[k] / blas[reference][k] for k in shapes}} for r in runs]
    return blas, table


# beyond the spread of such whole-process runs: the margin the control's reading needs
OPENBLAS_SPREAD_TOL = 1.1


def openblas_glues(blas: dict[str, dict[str, float]], shapes: dict[str, str], reference: str = "import fastjax",
                   tall: str = "middle") -> dict[str, Any]:
    """The floor page's figures from ``openblas_table``'s medians: for each ``shapes[key] = shape``,
    ``blas_{key}_default`` / ``_short`` / ``_one`` (each setting's time over ``reference``'s) and
    ``blas_best_{key}`` (the fastest setting); and ``blas_reading``, what the control of no OpenBLAS threads
    says about the ``tall`` shape, in words chosen by the measurement."""
    out: dict[str, Any] = {}
    for key, shape in shapes.items():
        for name, setting in (("default", "OpenBLAS's default"), ("short", "the shortest wait"),
                              ("one", "one OpenBLAS thread")):
            out[f"blas_{key}_{name}"] = blas[setting][shape] / blas[reference][shape]
        out[f"blas_best_{key}"] = min(blas, key=lambda s: blas[s][shape])
    t = shapes[tall]
    slower = blas["OpenBLAS's default"][t] > OPENBLAS_SPREAD_TOL * blas[reference][t]
    faster = blas["one OpenBLAS thread"][t] <= OPENBLAS_SPREAD_TOL * blas[reference][t]
    out["blas_reading"] = (
        "With no OpenBLAS threads at all, the tall fit took at most 1.1× its time under the setting of import "
        "fastjax, while OpenBLAS's default made it more than 1.1× as long: the time that the default wait costs "
        "there is time of OpenBLAS's idle threads, not of its calls" if slower and faster else
        "The control does not separate the two here (against the setting of import fastjax, the default wait did "
        "not make the tall fit more than 1.1× as long, or one OpenBLAS thread did): on this machine we cannot say "
        "that the idle threads take time from XLA's")
    return out


# the last ELBOs of the floor fits after the same iterations (chapters/floor/02-rprop-memory): measured equal
LAST_ELBO_TOL = 1e-5


def loop_carries(fit: Any, args: tuple, n_iter: int, **kw: Any) -> int:
    """How many n×p float32 arrays the fit's while loop carries (data, parameters, optimizer state), read from
    its lowered program (no compile)."""
    n, p = args[1].counts.shape
    line = next(ln for ln in fit.lower(*args, maxiter=n_iter, **kw).as_text().splitlines() if "stablehlo.while" in ln)
    return line.count(f"tensor<{n}x{p}xf32>")


def race_floors(datasets: dict[str, pln.PlnData], fits: dict[str, tuple], compiled_fit: Any, n_iter: int, repeats: int,
                flops_per_s: float, bytes_per_s: float) -> dict[str, Any]:
    """The floor page's race (chapters/floor/02-rprop-memory): on each data set, the fits ``fits[label] =
    (fit, kwargs, loss, optimizer)`` compiled by ``compiled_fit(label, data)``, ``n_iter`` iterations each,
    timed in turns, each against its roofline. Raises AssertionError unless the fits end at the same last ELBO
    (``LAST_ELBO_TOL``), the packed state's loop carries two n×p arrays fewer, and ``floor.fit_fast`` packs
    exactly where M has at least ``floor.PACKED_FROM`` entries. Returns the table's rows (``floor_rows``), the
    medians and roofline fractions by (data, label), one row per data set on the packing rule, and the
    compiled fits with their arguments."""
    out: dict[str, Any] = {"floor_rows": [], "t": {}, "fraction": {}, "rule_rows": [], "compiled": {}}
    first = next(iter(fits))
    for name, d in datasets.items():
        a = (pln.start(d), d, jnp.float32(0), jnp.float32(math.inf))
        compiled = {k: compiled_fit(k, d) for k in fits}
        out["compiled"][name] = (compiled, a)
        t = timing.time_interleaved({k: (lambda c=c: c(*a)) for k, c in compiled.items()}, repeats=repeats,
                                    per={k: n_iter for k in compiled})
        last = {k: float(np.asarray(c(*a)[1])[n_iter - 1]) for k, c in compiled.items()}
        # the same iterations (two roundings of one gradient; Rprop follows signs): measured equal last ELBOs
        if not max(abs(v / last[first] - 1) for v in last.values()) <= LAST_ELBO_TOL:
            raise AssertionError(f"{name}: the fits end apart: {last}")
        with_torch_state = loop_carries(R.fit_until_converged, a, n_iter, loss=F.loss_by_hand)
        with_packed_state = loop_carries(R.fit_until_converged, a, n_iter, loss=F.loss_by_hand,
                                         optimizer=F.fast_optimizer)
        if with_packed_state != with_torch_state - 2:  # one state array per parameter instead of two
            raise AssertionError(f"{name}: the packed loop carries {with_packed_state}, torch's {with_torch_state}")
        packs = loop_carries(F.fit_fast, a, n_iter) == with_packed_state
        if packs != (d.counts.size >= F.PACKED_FROM):
            raise AssertionError(f"{name}: fit_fast packs={packs} with {d.counts.size} entries of M")
        labels = list(fits)
        torch_label, packed_label = labels[1], labels[2]
        paid = t[packed_label].median < t[torch_label].median
        out["rule_rows"].append({"data": name, "entries of M": d.counts.size, "F.fit_fast packs": "✓" if packs else "",
                                 "packing paid here": "✓" if paid else "",
                                 "packed / torch's state": t[packed_label].median / t[torch_label].median})
        for k, (_, _, loss, opt) in fits.items():
            c = iteration_cost(loss, d, opt())  # one iteration as its own program, LAPACK calls included
            bound = profiling.roofline(c["flops"], c["bytes accessed"], flops_per_s, bytes_per_s)
            out["t"][(name, k)] = t[k].median
            out["fraction"][(name, k)] = profiling.fraction_of_roofline(t[k].median, bound)
            out["floor_rows"].append({"data": name, "fit": k, "ms / iteration": 1e3 * t[k].median,
                                      f"× {first}": t[k].median / t[first].median,
                                      "bound ms": 1e3 * bound["bound s"], "limit": bound["limit"],
                                      "fraction of roofline": out["fraction"][(name, k)]})
    return out


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
