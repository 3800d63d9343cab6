"""The command line: ``python -m fastjax.pln.fit`` (or ``fastjax-fit``) reads its arguments, checks them and
the input (``tables``), runs the fit (``fits``), prints and writes the result (``output``). Exit status: 0
fitted, 2 bad input (a message naming the file, the row or column and what to do, before JAX is imported;
or a program larger than the free memory, before it runs), 1 the fit or the writing of ``--out`` failed, 130
interrupted (Ctrl-C: one line, within a step of ``run.interruptible``).

What the output says: each member's stop (by the tolerance, or at ``--maxiter``; ``--json``'s ``converged``
list, with ``n`` and ``p`` of the table read; with ``--converge``, each member's stop by
``fits.lbfgs_until_flat``'s rule and its ``converge_iterations``), and the columns by the input's names, in its
order, with the columns dropped for holding only zeros (also in ``--out``: ``columns``, ``dropped``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fastjax import pln
from fastjax.pln.fit.clock import STARTED
from fastjax.pln.fit.cache import cache_folder
from fastjax.pln.fit.cores import use_every_core
from fastjax.pln.fit.fits import (BootstrapResult, RanksResult, fit, fit_bootstrap, fit_ranks, prepare_bootstrap,
                                  prepare_ranks)
from fastjax.pln.fit.options import (LEVEL, check_bootstrap, check_maxiter, check_out, check_seed, check_tol,
                                     parse_ranks)
from fastjax.pln.fit.output import _print_bootstrap, _print_fit, _print_ranks, write_bootstrap, write_ranks, write_result
from fastjax.pln.fit.run import NotEnoughMemory
from fastjax.pln.fit.tables import read_input

PROG = "python -m fastjax.pln.fit"
DESCRIPTION = "Fit a PLN to your own counts with one command, fast from its second run on."
# XLA's CPU backend at optimization level 0 (LLVM's least work): chapters/floor/04 measures the compile
# about halved and each iteration slower; worth it for a one-off fit of small data, not for a long fit.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    p.add_argument("counts", help="counts: CSV/TSV (samples in rows), .npy, or .npz with counts[, offsets, covariates]")
    p.add_argument("--offsets", help="log-offsets of the counts' shape (CSV/TSV or .npy)")
    p.add_argument("--covariates", help="covariates, one row per sample (CSV/TSV or .npy)")
    p.add_argument("--no-intercept", action="store_true", help="do not add a column of ones to the covariates")
    p.add_argument("--ranks", metavar="SPEC",
                   help="fit a PLN-PCA of each rank (1-10, 2,4,6 or 3) as one program: ELBO, BIC and ICL per rank, "
                        "and the rank each criterion chooses")
    p.add_argument("--converge", action="store_true",
                   help="then fit on to the optimum (float64, L-BFGS on the same ELBO) instead of stopping where "
                        "pyPLNmodels' rule or --maxiter leaves the fit (each rank of --ranks, each refit of "
                        "--bootstrap)")
    p.add_argument("--bootstrap", metavar="B",
                   help=f"refit on B samples of the rows drawn with replacement, as one program: {100 * LEVEL:g} %% "
                        "percentile intervals of the coefficients")
    p.add_argument("--seed", metavar="S", help="the random seed of --bootstrap's samples (default 0)")
    p.add_argument("--out", help="write the result to this .npz file: M, S, B, Sigma and the ELBOs (with --ranks: the "
                                 "table and the member BIC chooses; with --bootstrap: the intervals and every refit's B)")
    p.add_argument("--maxiter", type=int, default=pln.MAXITER, help=f"iteration cap (default {pln.MAXITER}, pyPLNmodels')")
    p.add_argument("--tol", type=float, default=pln.TOL, help=f"stopping criterion in (0, 1) (default {pln.TOL}, pyPLNmodels')")
    p.add_argument("--cache", default=None, help=f"folder of compiled fits (default {cache_folder()})")
    p.add_argument("--no-cache", action="store_true", help="compile, keep nothing")
    p.add_argument("--quick-compile", action="store_true",
                   help="compile at XLA's backend optimization level 0: a shorter first run, slower iterations")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true", help="print the result and each stage's seconds as JSON (implies --quiet)")
    return p


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _say(caught: list[warnings.WarningMessage], word: str) -> None:
    for w in caught:
        print(f"{PROG}: {word}: {w.message}", file=sys.stderr)


def _finite(a: Any) -> Any:
    """``a`` as JSON can hold it: ±inf (an unbounded interval) as null."""
    return np.where(np.isfinite(a), a, None).tolist()


def _stages(stamps: list[float], seconds: dict[str, float], program: str) -> list[list[Any]]:
    """The command's stages and their seconds, for --json (python -m imports fastjax and fastjax.pln before
    this module starts: they fall in the rest)."""
    loaded = program.startswith("loaded")
    stages = [["the command's other imports", stamps[0] - STARTED], ["read and check the data", stamps[1] - stamps[0]],
              ["import jax", seconds["import_jax"]],
              ["start the backend; " + ("load the compiled fit" if loaded else "trace, lower, compile the fit"),
               seconds["program"]], ["the fit itself", seconds["fit"]]]
    if "converge" in seconds:
        stages += [["--converge: " + ("load" if "convergence loaded" in program else "trace, lower, compile") +
                    " its program", seconds["converge_program"]], ["--converge: the fits", seconds["converge"]]]
    return stages


def main(argv: list[str] | None = None, every_core: bool = False) -> int:
    """Run the command; return its exit status (0 fitted, 2 bad input, 1 the fit or writing --out failed,
    130 interrupted by Ctrl-C: one line, no traceback). ``every_core`` (the command as a process, ``run``):
    ask JAX for one device per core before it starts (``cores.use_every_core``), which changes the devices
    of the whole process; left False where the command is called in a process that goes on."""
    try:
        return _main(argv, every_core)
    except KeyboardInterrupt:
        return _fail("interrupted (Ctrl-C); nothing was written", 130)


def run() -> None:
    """The command as a process (``python -m fastjax.pln.fit``, and ``fastjax-fit`` from ``[project.scripts]``):
    ``main``'s status as its exit status. Interrupted, it exits at once (``os._exit``): the call into XLA
    still running in a worker thread (``run.interruptible``) cannot be stopped, and would hold the exit. Read
    by a pipe that closed early (``| head``), it stops quietly, as Python's documentation advises for
    SIGPIPE: no traceback, stdout pointed at /dev/null so that the exit's flush raises nothing more."""
    try:
        code = main(every_core=True)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _main(argv: list[str] | None, every_core: bool) -> int:
    args = parser().parse_args(argv)
    stamps = [time.perf_counter()]
    try:
        check_tol(args.tol)
        check_maxiter(args.maxiter)
        if args.out is not None:
            check_out(args.out, {"counts": args.counts, "offsets": args.offsets, "covariates": args.covariates})
        ranks = parse_ranks(args.ranks) if args.ranks is not None else None
        n_boot = check_bootstrap(args.bootstrap) if args.bootstrap is not None else None
        if ranks is not None and n_boot is not None:
            raise ValueError("--ranks and --bootstrap are two different fits: give one of them")
        if args.seed is not None and n_boot is None:
            raise ValueError("--seed is the seed of --bootstrap's samples: give it with --bootstrap B")
        seed = check_seed(args.seed) if args.seed is not None else 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            given = read_input(args.counts, args.offsets, args.covariates, intercept=not args.no_intercept)
            data = given.data
            collection = prepare_ranks(data, ranks) if ranks is not None else None
            boot = prepare_bootstrap(data, n_boot, seed) if n_boot is not None else None
        _say(caught, "note")
        if n_boot is not None and n_boot < 100:
            print(f"{PROG}: note: {n_boot} refits give rough {100 * LEVEL:g} % intervals (their ends lie near the "
                  "smallest and largest refit); 200 or more is usual", file=sys.stderr)
    except (OSError, ValueError, TypeError) as err:
        return _fail(str(err), 2)
    except MemoryError:
        return _fail("the input does not fit in memory" + (f" with {args.bootstrap} samples of --bootstrap: give "
                     "fewer" if args.bootstrap is not None else ""), 2)
    cache = None if args.no_cache else Path(args.cache) if args.cache else cache_folder()
    stamps.append(time.perf_counter())
    options = dict(cache=cache, progress=not (args.quiet or args.json),
                   compile_options=QUICK_COMPILE if args.quick_compile else None)
    imported = time.perf_counter()
    if every_core and (collection is not None or boot is not None):  # one JAX device per core, members on each
        use_every_core(len(collection.ranks) if collection is not None else boot.samples.counts.shape[0])
    imported = time.perf_counter() - imported  # JAX's import, when use_every_core made it
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            if collection is not None:
                result: Any = fit_ranks(data, collection, args.maxiter, args.tol, converge=args.converge, **options)
            elif boot is not None:
                result = fit_bootstrap(data, boot, args.maxiter, args.tol, converge=args.converge, **options)
            else:
                result = fit(data, args.maxiter, args.tol, converge=args.converge, **options)
    except (FloatingPointError, ValueError) as err:
        _say(caught, "warning")
        return _fail(f"the fit failed: {err}", 1)
    except NotEnoughMemory as err:
        _say(caught, "warning")
        return _fail(f"{err}: give fewer {'refits' if n_boot else 'ranks' if ranks else 'samples'}", 2)
    except MemoryError:
        return _fail("the fits do not fit in memory at once: give fewer ranks or refits", 1)
    _say(caught, "warning")
    result.seconds["import_jax"] += imported
    n, p, d = data.shape
    stages = _stages(stamps, result.seconds, result.program)
    shape = dict(n=n, p=p, columns=given.kept, dropped=[given.columns[j] for j in given.dropped])
    if given.dropped:
        print(f"{PROG}: note: the columns fitted are the input's but {', '.join(shape['dropped'])} (only zeros), in "
              "the input's order", file=sys.stderr)
    if isinstance(result, RanksResult):
        if args.json:
            converge = {} if result.converge_iterations is None else dict(
                converge_iterations=result.converge_iterations.tolist())
            print(json.dumps(dict(ranks=result.ranks, ELBO=result.elbo.tolist(), BIC=result.bic.tolist(),
                                  ICL=result.icl.tolist(), iterations=result.iterations.tolist(),
                                  converged=result.converged(args.maxiter).tolist(), **converge,
                                  best_BIC=result.best("BIC"), best_ICL=result.best("ICL"), program=result.program,
                                  stages=stages, **shape)))
        else:
            _print_ranks(result, data, args.maxiter)
        write = write_ranks
    elif isinstance(result, BootstrapResult):
        if args.json:
            converge = {} if result.converge_iterations is None else dict(
                converge_iterations=result.converge_iterations.tolist())
            print(json.dumps(dict(refits=int(result.coefs.shape[0]), seed=result.seed, level=result.level,
                                  B=result.coef.tolist(), low=_finite(result.low), high=_finite(result.high),
                                  iterations=result.iterations.tolist(),
                                  converged=result.converged(args.maxiter).tolist(), **converge,
                                  empty_columns=[given.kept[j] for j in np.flatnonzero(result.empty.any(axis=0))],
                                  program=result.program, stages=stages, **shape)))
        else:
            _print_bootstrap(result, data, not args.no_intercept, given.kept, args.maxiter)
        write = write_bootstrap
    else:
        if args.json:
            k = result.converge_iterations
            converge = {} if k is None else dict(converge_iterations=k)
            print(json.dumps(dict(elbo=result.elbo, iterations=len(result.elbos) - (k or 0),
                                  converged=[bool(result.converged(args.tol))], **converge, program=result.program,
                                  stages=stages, **shape)))
        else:
            _print_fit(result, data, args.maxiter, args.tol)
        write = write_result
    if args.out:
        try:
            write(result, args.out, columns=np.asarray(given.kept), dropped=np.asarray(shape["dropped"], dtype=str))
        except OSError as err:
            return _fail(f"could not write {args.out} ({err.strerror or err}); it is as it was before this run", 1)
    return 0


