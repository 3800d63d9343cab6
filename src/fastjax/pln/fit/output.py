"""The command's output: its results printed, and written to ``--out`` (a ``.npz`` archive written to a
temporary file in the same folder, flushed, synced to disk and renamed over the target: a failed write
leaves the old file as it was and no temporary behind)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

from fastjax import pln
from fastjax.pln.fit.cache import remove_stale_temps, temp_name
from fastjax.pln.fit.fits import (CONVERGE_MAXITER, CONVERGE_RTOL, CONVERGE_WINDOW, BootstrapResult, FitResult,
                                  RanksResult)
from fastjax.pln.fit.options import ranks_text


def write_npz(out: str | os.PathLike, **arrays: Any) -> None:
    """Write ``arrays`` to ``out`` (a .npz archive, under exactly that name) through a temporary file in its
    folder (``cache.temp_name``), flushed, synced and renamed over ``out``: a failed write leaves ``out`` as
    it was and no temporary behind, and one left by a run that was killed is removed by the next
    (``cache.remove_stale_temps``). An existing ``out`` keeps its permission bits; a new one gets those
    ``open()`` would give it. Raises OSError."""
    out = Path(out)
    remove_stale_temps(out.parent, out.name)
    tmp = out.parent / temp_name(out.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            mode = stat.S_IMODE(os.stat(out, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # as a file made by open() would be
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_result(result: FitResult, out: str | os.PathLike, **names: Any) -> None:
    """Write ``result``'s ``M``, ``S``, ``B``, ``Sigma`` and ELBOs to ``out`` (``write_npz``). Raises OSError."""
    more = {} if result.converge_iterations is None else dict(converge_iterations=result.converge_iterations)
    write_npz(out, M=result.m, S=result.s, B=result.coef, Sigma=result.covariance, elbos=result.elbos, **more, **names)


def write_ranks(result: RanksResult, out: str | os.PathLike, **names: Any) -> None:
    """Write the collection's table (``ranks``, ``ELBO``, ``BIC``, ``ICL``, ``iterations``), the ranks chosen
    (``best_BIC``, ``best_ICL``), every member's ELBO per iteration (``elbos``, NaN past its stop) and the
    parameters of the member BIC chooses (``M``, ``S``, loadings ``C``, ``B``, ``Sigma = C Cᵀ``) to ``out``
    (``write_npz``). Raises OSError."""
    best = result.best("BIC")
    chosen = result.member(best)
    more = {} if result.converge_iterations is None else dict(converge_iterations=result.converge_iterations)
    write_npz(out, ranks=np.asarray(result.ranks), ELBO=result.elbo, BIC=result.bic, ICL=result.icl,
              iterations=result.iterations, **more, best_BIC=best, best_ICL=result.best("ICL"), elbos=result.elbos,
              M=chosen.m, S=chosen.s, C=chosen.components, B=chosen.coef, Sigma=chosen.components @ chosen.components.T,
              **names)


def write_bootstrap(result: BootstrapResult, out: str | os.PathLike, **names: Any) -> None:
    """Write the coefficients of all rows (``B``), their interval (``low``, ``high``, at ``level``), every
    refit's coefficients (``coefs``), the drawn rows (``rows``), the ``seed`` and each member's
    ``iterations`` (all the rows first; with ``--converge``, ``converge_iterations`` too) to ``out``
    (``write_npz``). Raises OSError."""
    more = {} if result.converge_iterations is None else dict(converge_iterations=result.converge_iterations)
    write_npz(out, B=result.coef, low=result.low, high=result.high, level=result.level, coefs=result.coefs,
              rows=result.rows, seed=result.seed, iterations=result.iterations, empty=result.empty, **more, **names)


def _covariate_names(d: int, intercept: bool) -> list[str]:
    return [("intercept" if intercept and k == 0 else f"covariate {k - intercept}") for k in range(d)]


def _converge_line(seconds: dict[str, float], what: str) -> str:
    return (f"--converge: then L-BFGS, in float64, took {what} on until its ELBO gained less than "
            f"{CONVERGE_RTOL:g} of itself over {CONVERGE_WINDOW} iterations (at most {CONVERGE_MAXITER:,}); "
            f"{seconds['converge']:.3f} s")


def _print_fit(result: FitResult, data: pln.PlnData, maxiter: int, tol: float) -> None:
    n, p, d = data.shape
    k = result.converge_iterations
    its = len(result.elbos) - (k or 0)
    if k is None:
        stop = "criterion below tol" if result.converged(tol) else f"maxiter {maxiter} reached"
    else:
        its = f"{its}+{k}"
        stop = "converged" if result.converged(tol) else f"at {CONVERGE_MAXITER:,} L-BFGS iterations, still gaining"
    print(f"PLN fit of {n} samples × {p} counts, {d} covariate(s): ELBO {result.elbo:.6g} after "
          f"{its} iterations ({stop}); program {result.program}; fit {result.seconds['fit']:.3f} s")
    if k is not None:
        print(_converge_line(result.seconds, "the fit"))


def _print_ranks(result: RanksResult, data: pln.PlnData, maxiter: int) -> None:
    n, p, d = data.shape
    print(f"PLN-PCA of {n} samples × {p} counts, {d} covariate(s), ranks {ranks_text(result.ranks)} as one program: "
          f"program {result.program}; fit {result.seconds['fit']:.3f} s")
    more = result.converge_iterations is not None
    if more:
        print(_converge_line(result.seconds, "each rank"))
    print(f"{'rank':>5} {'ELBO':>14} {'BIC':>14} {'ICL':>14} {'iterations':>10}  stopped")
    converged = result.converged(maxiter)
    for i, q in enumerate(result.ranks):
        its = f"{result.iterations[i]}+{result.converge_iterations[i]}" if more else f"{result.iterations[i]}"
        stop = (("converged" if converged[i] else f"at {CONVERGE_MAXITER:,}") if more else
                "converged (tol)" if converged[i] else "at --maxiter")
        print(f"{q:>5} {result.elbo[i]:>14.8g} {result.bic[i]:>14.8g} {result.icl[i]:>14.8g} {its:>10}  {stop}")
    by_bic, by_icl = result.best("BIC"), result.best("ICL")
    print(f"rank chosen by BIC: {by_bic}; by ICL: {by_icl}")
    if result.ranks[-1] in (by_bic, by_icl):
        larger = (f": try larger ranks, such as --ranks {result.ranks[-1]}-{min(p, n - 1, 2 * result.ranks[-1])}"
                  if result.ranks[-1] < min(p, n - 1) else " (and the largest this table allows)")
        print(f"the rank chosen is the largest tried; a larger one may do better{larger}")
    _print_stops(converged, maxiter, "members", more)


def _print_stops(converged: np.ndarray, maxiter: int, what: str, converge: bool = False) -> None:
    if converge:
        if not converged.all():
            print(f"{int(np.sum(~converged))} of {converged.size} {what} reached {CONVERGE_MAXITER:,} L-BFGS iterations "
                  "still gaining: their ELBO is where that takes them")
        return
    capped = int(np.sum(~converged))
    if capped:
        print(f"{capped} of {converged.size} {what} stopped at --maxiter {maxiter}, not by the tolerance: their ELBO is "
              "where that many iterations take it (as pyPLNmodels reports it); a larger --maxiter goes further")


def _print_bootstrap(result: BootstrapResult, data: pln.PlnData, intercept: bool, columns: list[str],
                     maxiter: int) -> None:
    n, p, d = data.shape
    n_boot = result.coefs.shape[0]
    print(f"PLN bootstrap of {n} samples × {p} counts, {d} covariate(s): {n_boot} refits on rows drawn with "
          f"replacement (seed {result.seed}) and the fit of all rows, as one program: program {result.program}; "
          f"fit {result.seconds['fit']:.3f} s")
    converge = result.converge_iterations is not None
    if converge:
        print(_converge_line(result.seconds, "every fit"))
    lo, hi = 50 * (1 - result.level), 50 * (1 + result.level)
    print(f"{100 * result.level:g} % percentile intervals of the coefficients B (the fit of all rows; the {lo:g} % "
          f"and {hi:g} % quantiles of the {n_boot} refits):")
    names = _covariate_names(d, intercept)
    width, cwidth = max(9, *map(len, names)), max(6, *map(len, columns))
    print(f"{'covariate':>{width}} {'column':>{cwidth}} {'B':>11} {f'{lo:g} %':>11} {f'{hi:g} %':>11}")
    for k in range(d):
        for j in range(p):
            print(f"{names[k]:>{width}} {columns[j]:>{cwidth}} {result.coef[k, j]:>11.5g} {result.low[k, j]:>11.5g} "
                  f"{result.high[k, j]:>11.5g}")
    inside = int(np.sum((result.coef >= result.low) & (result.coef <= result.high)))
    print(f"{inside} of {d * p} coefficients of the fit of all rows lie inside their interval")
    for j in np.flatnonzero(result.empty.any(axis=0)):
        print(f"column {columns[j]} holds only zeros in {int(result.empty[:, j].sum())} of {n_boot} refits: their fit of "
              "it has no finite coefficients (they run to −∞), so its intervals are unbounded (-inf, inf)")
    _print_stops(result.converged(maxiter), maxiter, "fits (all rows and refits)", converge)
