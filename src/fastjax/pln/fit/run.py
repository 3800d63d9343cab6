"""Running a program of the command: loaded from the cache or compiled (and saved), run, its first ELBOs
checked against NumPy's float64 ones and every fit in it checked (``run_program``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastjax import pln
from fastjax.pln.fit import cache as _cache
from fastjax.pln.fit.cache import CacheRejected, open_cache, save_serialized, serialized

SLOW_STAGE_SECONDS = 2.0  # a stage that lasts longer gets a progress line
# The fits' LAPACK calls (jaxlib's Cholesky factors and triangular solves) run in SciPy's OpenBLAS, whose threads
# wait for each other when another process holds a core. Part VI's fit per iteration, one fresh process per
# setting in turns, 3 rounds, on the 2-core CPU (fastjax.pln.hand_gradient_timing.time_openblas_waits):
# with one OpenBLAS thread against OpenBLAS's own, quiet: 0.90x the time at p = 114 (oaks; 0.323 against
# 0.358 ms), 1.00x at p = 114 with n = 11,600, 0.78x at p = 256 and 0.95x at p = 512 (n = 2,000), but 1.25x at
# p = 1,000 (n = 2,000). Beside one spinning process per core, 3 rounds in turns, fresh processes: the
# bootstrap program over 8 oaks refits 163 against 341 ms per refit (medians; rounds 0.17-0.63x), one oaks
# fit 164 against 900 ms (rounds 0.14-0.52x): OpenBLAS's threads, on a busy machine, cost up to several times. So up to this many count
# columns, the programs run with one thread.
ONE_BLAS_THREAD_UP_TO = 512
ROUNDING_LAMBDA = 7.0  # the probabilistic rounding bound's λ (first_pca_elbo_rtol)


def _float32_sum_rtol(terms: int, condition: float) -> float:
    """How far a float32 sum of ``terms`` terms may lie from its float64 value, relative: any order of adding
    N terms is off by at most (N − 1)·u32 times the sum of their magnitudes (Higham §4.2), which is
    ``condition`` times the sum; doubled for the rounding of the inputs to float32 (and, for the PLN, the
    float32 log-determinant of Σ)."""
    return 2 * terms * float(np.finfo(np.float32).eps / 2) * condition


def first_elbo_rtol(data: pln.PlnData) -> float:
    """How far the program's float32 ELBO at the start may lie from NumPy's float64 one, relative: a sum of
    N = n·p terms (``_float32_sum_rtol``) whose magnitudes add up to ``pln.elbo_condition`` times the ELBO."""
    m, s = pln.start(data)
    n, p, _ = data.shape
    return _float32_sum_rtol(n * p, pln.elbo_condition(m, s, data))


def check_first_elbo(elbos: Any, data: pln.PlnData) -> None:
    """Raise CacheRejected unless the program's first ELBO (at pyPLNmodels' start, before any update) is
    NumPy's float64 value of it within ``first_elbo_rtol``: a program that computes another function is
    caught before its result is used."""
    m, s = pln.start(data)
    want, got = float(pln.profiled_elbo(m, s, data, np)), float(np.asarray(elbos)[0])
    rtol = first_elbo_rtol(data)
    if not abs(got - want) <= rtol * abs(want):
        raise CacheRejected(f"gives the ELBO {got:.7g} at the start, where it is {want:.7g}")


def first_pca_elbo_rtol(start: Any, data: pln.PlnData, mask: Any) -> float:
    """As ``first_elbo_rtol`` for a PLN-PCA member (``start``, ``mask``: ``collection.pad``'s): N = n·p + d +
    q + 2 terms (n·p outer terms, each with a sum of d + q + 2 products), whose magnitudes add up to
    ``collection.pca_elbo_condition`` times the ELBO. The worst case, N·u32 times that, is loose here (1e-2
    to 3e-2 on oaks at ranks 1 to 10, where the PCA start cancels much: condition 22 to 67) and would let
    pass a program that adds 1 to every count (it moves these ELBOs by 3e-2 to 7e-2). So the bound is the
    probabilistic one: rounding errors that behave as independent, mean-zero random variables add up to at
    most λ·√N·u times the sum of the magnitudes with probability at least 1 − 2N·exp(−λ²/2) (Higham and
    Mary, *A new approach to probabilistic rounding error analysis*, SIAM J. Sci. Comput. 41(5), 2019);
    λ = ``ROUNDING_LAMBDA`` = 7 makes that 1 − 6e-7 on oaks; doubled for the inputs' rounding to float32."""
    from fastjax.pln import collection as col

    n, p, d = data.shape
    terms = n * p + d + int(np.sum(mask)) + 2
    u32 = float(np.finfo(np.float32).eps / 2)
    return 2 * ROUNDING_LAMBDA * float(np.sqrt(terms)) * u32 * col.pca_elbo_condition(start, data, mask)


def check_first_pca_elbos(elbos: Any, starts: Any, masks: np.ndarray, data: pln.PlnData) -> None:
    """Raise CacheRejected unless every member's first ELBO (at its start, before any update) is NumPy's
    float64 ``collection.pca_elbo`` there, within ``first_pca_elbo_rtol``."""
    from fastjax.pln import collection as col

    for i, mask in enumerate(masks):
        start = col.PcaParams(*(np.asarray(a)[i] for a in starts))
        want, got = float(col.pca_elbo(start, data, mask, np)), float(np.asarray(elbos)[i, 0])
        rtol = first_pca_elbo_rtol(start, data, mask)
        if not abs(got - want) <= rtol * abs(want):
            raise CacheRejected(f"gives the ELBO {got:.7g} at the start of rank {int(np.sum(mask))}, where it is {want:.7g}")


def first_converge_elbo_rtol(params: Any, data: pln.PlnData, mask: Any) -> float:
    """As ``first_pca_elbo_rtol``, for the float64 program of ``--converge``: the worst case of a float64 sum
    of N = n·p + d + q + 2 terms, (N − 1)·u64 times the sum of their magnitudes (Higham §4.2), doubled."""
    from fastjax.pln import collection as col

    n, p, d = data.shape
    terms = n * p + d + int(np.sum(mask)) + 2
    return 2 * terms * float(np.finfo(np.float64).eps / 2) * col.pca_elbo_condition(params, data, mask)


def check_first_converge_elbos(elbos: Any, params: Any, masks: np.ndarray, data: pln.PlnData) -> None:
    """Raise CacheRejected unless every member's first ELBO in ``--converge``'s program (at the parameters
    the collection ended at, before any L-BFGS step) is NumPy's float64 ``collection.pca_elbo`` there, within
    ``first_converge_elbo_rtol``."""
    from fastjax.pln import collection as col

    for i, mask in enumerate(masks):
        member = col.PcaParams(*(np.asarray(a, np.float64)[i] for a in params))
        want, got = float(col.pca_elbo(member, data, mask, np)), float(np.asarray(elbos)[i, 0])
        if not abs(got - want) <= first_converge_elbo_rtol(member, data, mask) * abs(want):
            raise CacheRejected(f"gives the ELBO {got:.12g} where rank {int(np.sum(mask))} ended, where it is {want:.12g}")


def check_first_converge_fit_elbo(got: Any, m: Any, s: Any, data: pln.PlnData, member: str = "") -> None:
    """Raise CacheRejected unless ``got``, the first ELBO of a ``--converge`` program with the PLN fit (at the
    ``(m, s)`` the float32 fit ended at, before any L-BFGS step), is NumPy's float64 profiled ELBO there
    within the worst case of a float64 sum of N = n·p terms, (N − 1)·u64 times the sum of their magnitudes
    (``pln.elbo_condition`` times the ELBO; Higham §4.2), doubled."""
    m, s = np.asarray(m, np.float64), np.asarray(s, np.float64)
    n, p, _ = data.shape
    rtol = 2 * n * p * float(np.finfo(np.float64).eps / 2) * pln.elbo_condition(m, s, data)
    want, got = float(pln.profiled_elbo(m, s, data, np)), float(got)
    if not abs(got - want) <= rtol * abs(want):
        raise CacheRejected(f"gives the ELBO {got:.12g} where {member or 'the fit'} ended, where it is {want:.12g}")


def check_first_bootstrap_elbos(elbos: Any, samples: pln.PlnData) -> None:
    """``check_first_elbo`` for every member of a bootstrap program (``samples`` stacked on axis 0)."""
    for b in range(np.shape(samples.counts)[0]):
        sample = pln.PlnData(*(np.asarray(a)[b] for a in samples[:3]), float(np.asarray(samples.log_factorial)[b]))
        try:
            check_first_elbo(np.asarray(elbos)[b], sample)
        except CacheRejected as why:
            raise CacheRejected(f"(member {b}) {why}") from None


def checked_elbos(elbos: Any, crit: pln.Criterion, member: str = "") -> np.ndarray:
    """The ELBOs of one fit up to where it stopped; FloatingPointError (naming ``member``, e.g. ``"rank 3: "``)
    when one is not finite, or when one is 0 or above (impossible for counts: float32 lost every digit)."""
    elbos = np.asarray(elbos)[: int(crit.count)]
    try:
        pln.check_fit(elbos, crit)
    except FloatingPointError as err:  # pln's advice (eager gradient, float64) is not the command's
        raise FloatingPointError(member + str(err).split("; evaluate")[0] + "; check that the offsets are logs and "
                                 "the counts what you meant, or fit with pyPLNmodels in float64") from None
    if elbos.size and elbos.max() >= 0:  # a float32 sum that lost every digit lands on 0 or above
        raise FloatingPointError(f"{member}the fit's ELBO reached {elbos.max():.6g}, impossible for counts (it bounds "
                                 "a log-probability, below 0): the float32 fit lost its precision; fit with "
                                 "pyPLNmodels in float64")
    return elbos


def _member(crit: pln.Criterion, i: int) -> pln.Criterion:
    return pln.Criterion(*(np.asarray(f)[i] for f in crit))



class _Progress:
    """A line on stderr while a stage runs longer than ``SLOW_STAGE_SECONDS`` (elapsed seconds)."""

    def __init__(self, what: str, enabled: bool):
        self.what, self.enabled, self.done = what, enabled, threading.Event()

    def _run(self) -> None:
        t0, tty = time.perf_counter(), sys.stderr.isatty()
        if self.done.wait(SLOW_STAGE_SECONDS):
            return
        while True:
            elapsed = time.perf_counter() - t0
            line = f"{self.what}: {elapsed:.0f} s"
            sys.stderr.write("\r" + line if tty else line + "\n")
            sys.stderr.flush()
            if self.done.wait(1.0 if tty else 10.0):
                if tty:
                    sys.stderr.write(f"\r{self.what}: {time.perf_counter() - t0:.1f} s, done\n")
                return

    def __enter__(self) -> "_Progress":
        if self.enabled:
            threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()


def _open_or_warn(cache: str | os.PathLike) -> int | None:
    try:
        return open_cache(cache)
    except (CacheRejected, OSError) as why:
        text = why.strerror if isinstance(why, OSError) and why.strerror else str(why)
        warnings.warn(f"cache folder {cache} not used: {text}; compiling in memory", stacklevel=3)
        return None



def interruptible(call: Any) -> Any:
    """``call()``, run in a worker thread while this (the main) thread waits in steps of 0.1 s: Python runs
    its signal handlers in the main thread between bytecodes only, so a Ctrl-C during one long call into
    XLA (a compile, a program of many fits) would wait for its end; waiting here, KeyboardInterrupt
    comes within a step. The worker cannot be stopped: the command then exits (``cli.run``)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = call()
        except BaseException as err:  # handed to the main thread
            box["err"] = err

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
    if "err" in box:
        raise box["err"]
    return box["out"]


@contextlib.contextmanager
def blas_threads(p: int) -> Any:
    """One OpenBLAS thread while the block runs, for a table of ``p`` ≤ ``ONE_BLAS_THREAD_UP_TO`` count columns
    (``threadpoolctl``; SciPy's OpenBLAS is loaded first, as jaxlib's LAPACK calls would load it); else as is."""
    if p > ONE_BLAS_THREAD_UP_TO:
        yield
        return
    import scipy.linalg  # noqa: F401  (SciPy's OpenBLAS, where jaxlib runs its LAPACK calls)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


class NotEnoughMemory(Exception):
    """A program that needs more memory than this machine has free (``check_memory``)."""


def available_memory() -> int | None:
    """The bytes this machine can give a process now (Linux's ``MemAvailable``); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def program_bytes(compiled: Any) -> int | None:
    """The bytes a compiled program holds while it runs, as XLA plans them (``memory_analysis``: its
    arguments, outputs and temporaries on one device, times the devices it runs on: ``cores``' split, whose
    CPU devices share the machine's memory); None where the backend does not say."""
    try:
        m = compiled.memory_analysis()
        one = int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # not every backend or loaded executable has one
        return None
    return one * program_devices(compiled)


def program_devices(compiled: Any) -> int:
    """How many devices a compiled program runs on (its outputs' shardings; 1 where they do not say)."""
    try:
        import jax

        return max(len(s.device_set) for s in jax.tree.leaves(compiled.output_shardings))
    except Exception:  # no shardings said: one device
        return 1


def check_memory(compiled: Any, noun: str) -> None:
    """Raise NotEnoughMemory, with both figures, when ``compiled`` needs more than this machine has free:
    before it runs, not after it has run for minutes."""
    need, free = program_bytes(compiled), available_memory()
    if need is not None and free is not None and need > free:
        raise NotEnoughMemory(f"the {noun} needs {need / 1e9:.2f} GB of memory at once and this machine has "
                              f"{free / 1e9:.2f} GB free")


class Program(NamedTuple):
    """A program the command compiles once per shape and caches: ``function(*args, maxiter=...)``, what it
    depends on (``cache_what``), its name in messages (``noun``: "fit", "collection", "bootstrap"), the
    progress line while it compiles, ``first`` (of its output: raises CacheRejected unless its first ELBOs
    are NumPy's) and ``valid`` (of its output: raises FloatingPointError unless every fit in it is one)."""

    function: Any
    args: tuple[Any, ...]
    what: dict[str, Any]
    noun: str
    compiling: str
    first: Any
    valid: Any


def _import_jax() -> tuple[dict[str, float], float]:
    t0 = time.perf_counter()
    import jax  # noqa: F401

    now = time.perf_counter()
    return {"import_jax": now - t0}, now


def _float32(data: pln.PlnData) -> pln.PlnData:
    """``data`` as the program takes it: float32 NumPy (``log_factorial`` a scalar, or a vector when stacked)."""
    return pln.PlnData(*(np.asarray(a, np.float32) for a in data[:3]), np.asarray(data.log_factorial, np.float32))


def run_program(prog: Program, maxiter: int, cache: str | os.PathLike | None, progress: bool,
                compile_options: dict[str, Any] | None, seconds: dict[str, float], t0: float) -> tuple[Any, str]:
    """Run ``prog``: loaded from ``cache`` when this command saved it there before and it passes every check
    (module docstring), else compiled (and saved). Returns its output and where the program came from;
    fills ``seconds`` ("program": from ``t0`` to a program in hand, "fit": running it). Problems with the
    cache are warnings (UserWarning, one line each); FloatingPointError when the fit fails."""
    import jax

    name = hashlib.sha256(json.dumps(prog.what, sort_keys=True).encode()).hexdigest()[:32] + ".jaxexe"
    folder = _open_or_warn(cache) if cache is not None else None
    if folder is not None:
        _cache.remove_stale_temps(folder)
        try:
            _cache.cache_secret(folder)  # a cache whose secret cannot be had is not used: no program is blamed
        except (CacheRejected, OSError) as why:
            text = why.strerror if isinstance(why, OSError) and why.strerror else str(why)
            warnings.warn(f"cache folder {cache} not used: {text}; compiling in memory", stacklevel=3)
            os.close(folder)
            folder = None
    try:
        out, program = None, "loaded from the cache"
        if folder is not None:
            try:
                compiled = _cache.load_executable(folder, name, prog.what)
                if compiled is not None:
                    check_memory(compiled, prog.noun)
                    seconds["program"], t0 = time.perf_counter() - t0, time.perf_counter()
                    with blas_threads(int(prog.what["shape"][1])):
                        out = interruptible(lambda: jax.block_until_ready(compiled(*prog.args)))
                    seconds["fit"] = time.perf_counter() - t0
                    prog.first(out)
            except NotEnoughMemory:
                raise
            except Exception as why:  # CacheRejected, or the program fails to run: never a crash, never its result
                why = why if isinstance(why, CacheRejected) else f"does not run ({type(why).__name__}: {str(why)[:100]})"
                out = None
                try:
                    os.unlink(name, dir_fd=folder)
                    gone = "removed"
                except OSError:  # a folder in its place, say
                    gone = "could not be removed (remove it by hand)"
                warnings.warn(f"the cached {prog.noun} {Path(cache) / name} {why}: {gone}, compiling again",
                              stacklevel=3)
        if out is None:
            with _Progress(prog.compiling, progress):
                import functools

                def build() -> Any:
                    lowered = jax.jit(functools.partial(prog.function, maxiter=maxiter)).trace(*prog.args).lower()
                    return lowered.compile(compiler_options=compile_options) if compile_options else lowered.compile()

                compiled = interruptible(build)
                payload = serialized(compiled) if folder is not None else None  # before it runs (``serialized``)
            check_memory(compiled, prog.noun)
            program = "compiled"
            seconds["program"], t0 = time.perf_counter() - t0, time.perf_counter()
            with _Progress("fitting", progress), blas_threads(int(prog.what["shape"][1])):
                out = interruptible(lambda: jax.block_until_ready(compiled(*prog.args)))
            seconds["fit"] = time.perf_counter() - t0
        prog.valid(out)
        if program == "compiled":
            try:
                prog.first(out)
            except CacheRejected as why:  # not a cache problem: a bug of the fit's or of XLA's
                raise FloatingPointError(f"the program just compiled {why}") from None
            if folder is not None:
                try:
                    if payload is not None:
                        save_serialized(payload, folder, name, prog.what)
                    program += ", saved to the cache" if payload is not None else " (this backend cannot save it)"
                except (OSError, CacheRejected) as why:
                    text = why.strerror if isinstance(why, OSError) and why.strerror else str(why)
                    warnings.warn(f"the compiled {prog.noun} could not be saved in {cache}: {text}; the fit goes on",
                                  stacklevel=3)
                    program += " (not saved)"
        if program_devices(compiled) > 1:
            program += f", on {program_devices(compiled)} cores at once"
    finally:
        if folder is not None:
            os.close(folder)
    return out, program

