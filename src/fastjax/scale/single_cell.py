"""The evidence of Part V's single-cell page (chapters/scale/01-single-cell.md): the race's figures per
iteration and to the target, the p×p algebra timed alone, and the time per iteration against the genes.

``race_figures`` turns ``fastjax.pln.bench.race``'s result into the page's figures and its table;
``algebra_share`` times the dense algebra of one iteration beside a whole iteration of Part VI's fit;
``per_iteration_by_genes`` times a few iterations of pyPLNmodels and both JAX fits for more and more genes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fastjax import pln, sizes
from fastjax.pln import bench as bench_pln, floor as F, rungs as R
from fastjax.tools import timing


def race_figures(result: dict) -> tuple[dict, list[dict]]:
    """``(race, rows)``: the race's iterations, seconds (to converge and to the target), compile, the
    seconds per iteration of each side and the speed-ups; and its table, one row per contender."""
    race = dict(
        torch_iters=result["pyplnmodels_iterations"], torch_seconds=result["pyplnmodels_seconds"],
        torch_iters_to_target=result["pyplnmodels_iters_to_target"], torch_to_target=result["pyplnmodels_seconds_to_target"],
        jax_iters=result["jax_iterations"], jax_seconds=result["jax_seconds"],
        jax_iters_to_target=result["jax_iters_to_target"], jax_to_target=result["jax_seconds_to_target"],
        compile=result["jax_compile_seconds"], part1_seconds=result["jax_part1_seconds"])
    race["torch_per_iter"] = race["torch_seconds"] / race["torch_iters"]
    race["jax_per_iter"] = race["jax_seconds"] / race["jax_iters"]
    race["part1_per_iter"] = race["part1_seconds"] / race["jax_iters"]
    race["speedup_iter"] = race["torch_per_iter"] / race["jax_per_iter"]
    race["speedup_part1_iter"] = race["torch_per_iter"] / race["part1_per_iter"]
    race["speedup_target"] = race["torch_to_target"] / race["jax_to_target"]
    race["speedup_target_compile"] = race["torch_to_target"] / (race["jax_to_target"] + race["compile"])
    rows = [
        {"": "pyPLNmodels (torch)", "iterations": race["torch_iters"], "ms / iteration": 1e3 * race["torch_per_iter"],
         "iterations to target": race["torch_iters_to_target"], "s to target": race["torch_to_target"],
         "compile s": 0.0},
        {"": "JAX, Part I's fit", "iterations": race["jax_iters"], "ms / iteration": 1e3 * race["part1_per_iter"],
         "iterations to target": "", "s to target": "", "compile s": ""},
        {"": "JAX, Part VI's fit", "iterations": race["jax_iters"], "ms / iteration": 1e3 * race["jax_per_iter"],
         "iterations to target": race["jax_iters_to_target"], "s to target": race["jax_to_target"],
         "compile s": race["compile"]}]
    return race, rows


def dense_algebra(m, s):
    """The p×p work of one iteration: RᵀR, the Cholesky factor of Σ, R Σ⁻¹ and diag(Σ⁻¹)."""
    r = m - jnp.mean(m, axis=0)  # intercept only: B is the column mean
    col_sq = jnp.sum(s * s, axis=0)
    chol = jnp.linalg.cholesky((r.T @ r + jnp.diag(col_sq)) / m.shape[0])
    return F.precision_products(r, chol, col_sq)


def algebra_loop(m, s, k):
    """k rounds of the algebra in one program (as in the fit's loop), the carry nudged so none is hoisted."""
    def body(c, _):
        r_prec, prec_diag = dense_algebra(c, s)
        return c * 1.0000001, jnp.sum(r_prec) + jnp.sum(prec_diag)
    return jax.lax.scan(body, m, length=k)[1]


def algebra_share(data: pln.PlnData) -> dict[str, timing.Timing]:
    """The dense algebra alone and a whole iteration of Part VI's fit (tolerance 0), per iteration, each
    compiled ahead of time and timed in turns."""
    k_alg = sizes.pick(20, 5)
    start = pln.start(data)
    fit_args = (start, data, jnp.float32(0), jnp.float32(math.inf))  # tolerance 0: all k_alg iterations
    algebra = timing.compile_time(jax.jit(algebra_loop, static_argnums=2), *start, k_alg).compiled
    whole = timing.compile_time(F.fit_fast, *fit_args, maxiter=k_alg).compiled
    return timing.time_interleaved({"dense algebra": lambda: algebra(*start), "Part VI iteration": lambda: whole(*fit_args)},
                                   repeats=sizes.pick(7, 3), per={"dense algebra": k_alg, "Part VI iteration": k_alg})


def per_iteration_by_genes(n: int, genes: list[int], n_sweep: int, witness: timing.Witness) -> dict[str, list[float]]:
    """Milliseconds per iteration of pyPLNmodels' ``fit()`` and of both JAX fits (compiled once per shape,
    compile apart) on the first ``n`` cells and each of ``genes`` genes, ``n_sweep`` iterations a fit, in
    turns (medians); ``witness`` records the machine's load under the name "sweep"."""
    per_iter = {"pyPLNmodels (torch)": [], "JAX, Part I's fit": [], "JAX, Part VI's fit": []}
    for g in genes:
        sub_np = pln.load_scrna_counts(n, g)
        sub = pln.to_jax(sub_np)
        args = pln.start(sub), sub, jnp.float32(0), jnp.float32(math.inf)  # tolerance 0: run all iterations
        fits = {"JAX, Part I's fit": timing.compile_time(R.fit_until_converged, *args, maxiter=n_sweep).compiled,
                "JAX, Part VI's fit": timing.compile_time(F.fit_fast, *args, maxiter=n_sweep).compiled}
        for few in fits.values():
            timing.block(few(*args))  # its first run, apart
        seconds = {k: [] for k in per_iter}
        for _ in range(sizes.pick(3, 1)):  # in turns; pyPLNmodels' own fit time, as in the race
            with witness.measure("sweep"):
                seconds["pyPLNmodels (torch)"].append(bench_pln.fit_pyplnmodels(sub_np, maxiter=n_sweep)[1] / n_sweep)
                for k, few in fits.items():
                    seconds[k].append(timing.time_per_call(few, *args, repeats=1, number=1, warmup=0).median / n_sweep)
        for k, v in seconds.items():
            per_iter[k].append(float(np.median(v)) * 1e3)
    return per_iter
