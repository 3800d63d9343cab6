"""Fit a PLN to your own counts with one command, fast from its second run on.

    python -m fastjax.pln.fit counts.csv [--offsets F] [--covariates F] [--out F.npz]

``counts``: a CSV (or TSV) table of counts, samples in rows, species or genes in columns (a header
row and a first column of row names are recognised and skipped), a ``.npy`` file, or a ``.npz`` file
holding ``counts`` and optionally ``offsets`` and ``covariates``. ``--offsets``: log-offsets of the
counts' shape (as pyPLNmodels takes them: the log of each sample's sequencing depth, say);
``--covariates``: one row per sample (an intercept column is added unless ``--no-intercept``). The
fit is Part V's (``fastjax.pln.floor.fit_fast``, pyPLNmodels' optimizer and stopping rule), in
float32; it prints the ELBO and, with ``--out``, writes ``M``, ``S``, ``B``, ``Σ`` and the ELBOs.

What makes it fast (chapters/floor/04-first-result.md measures each step): the data are read and
checked before JAX is imported (bad input fails at once, with a message naming the problem); the
fit runs as one program, compiled once per data shape and kept in the user's cache folder as a
serialized executable (``jax.experimental.serialize_executable``); a later run loads it without
importing the fit's modules (optax, Part V's floor), tracing, lowering or compiling.

Loading a serialized executable runs code from the file (it is a pickle), so this command loads only
files that it wrote itself: in its own folder (``cache_folder()``, mode 0700), owned by you and
writable by no one else, under a name that hashes the jax and jaxlib versions, the device, the host
CPU, the XLA flags, the data's shapes and the fit's source. Never point ``--cache`` at files from elsewhere.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the command's stages (--json) are timed from here (after fastjax, fastjax.pln)

import fastjax  # noqa: E402,F401  (the CPU workaround, before jax)

import argparse
import csv
import hashlib
import json
import os
import pickle
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastjax import checks, pln

PROG = "python -m fastjax.pln.fit"
CACHE_FORMAT = 1  # bump when what the cache holds changes, so that old files are not read
FIT_SOURCES = ("__init__.py", "floor.py", "rungs.py", "rprop.py", "fit.py")  # the fit's code, hashed into the key
SLOW_STAGE_SECONDS = 2.0  # a stage that lasts longer gets a progress line
# XLA's CPU backend at optimization level 0 (LLVM's least work): chapters/floor/04 measures the compile
# about halved and each iteration slower; worth it for a one-off fit of small data, not for a long fit.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


# ----------------------------------------------------------------------------- reading the input

def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _delimiter(path: Path, first_line: str) -> str | None:
    if path.suffix.lower() in (".tsv", ".tab"):
        return "\t"
    for sep in (",", "\t", ";"):
        if sep in first_line:
            return sep
    return None  # runs of spaces


def read_csv(path: str | os.PathLike, name: str) -> np.ndarray:
    """A numeric table from a CSV/TSV file (float64, 2-D). A first row with a non-number is a header, a
    first column of non-numbers holds row names: both are skipped. Raises ValueError naming the file and
    the first cell that is not a number (an empty cell, ``NA`` and ``nan`` read as NaN)."""
    path = Path(path)
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    rows_text = [line for line in lines if line.strip()]
    if not rows_text:
        raise ValueError(f"{path}: the {name} file is empty")
    sep = _delimiter(path, rows_text[0])
    rows = list(csv.reader(rows_text, delimiter=sep)) if sep else [line.split() for line in rows_text]
    rows = [[cell.strip() for cell in row] for row in rows]
    header = not all(_is_number(c) or c == "" for c in rows[0][1:]) or (len(rows[0]) == 1 and not _is_number(rows[0][0]))
    body = rows[1:] if header else rows
    if not body:
        raise ValueError(f"{path}: the {name} file has a header and no rows")
    names = all(not _is_number(r[0]) and r[0] not in ("", "NA", "nan", "NaN") for r in body)
    if names:
        body = [r[1:] for r in body]
    width = len(body[0])
    for i, r in enumerate(body):
        if len(r) != width:
            raise ValueError(f"{path}: {name} row {i} has {len(r)} values, row 0 has {width} (a ragged table)")
    out = np.empty((len(body), width))
    for i, r in enumerate(body):
        for j, cell in enumerate(r):
            if cell in ("", "NA", "NaN", "nan"):
                out[i, j] = np.nan
            else:
                try:
                    out[i, j] = float(cell)
                except ValueError:
                    raise ValueError(f"{path}: {name} holds {cell!r}, not a number, at row {i}, column {j} "
                                     "(counted from 0, after any header row and row-name column)") from None
    return out


def read_matrix(path: str | os.PathLike, name: str) -> np.ndarray:
    """One table from ``path``: ``.npy`` (NumPy's format) or a CSV/TSV text file (``read_csv``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{name} file not found: {path}")
    if path.suffix.lower() == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except ValueError as err:
            raise ValueError(f"{path}: not a NumPy array file ({err})") from None
    return read_csv(path, name)


def read_data(counts: str | os.PathLike, offsets: str | os.PathLike | None = None,
              covariates: str | os.PathLike | None = None, intercept: bool = True) -> pln.PlnData:
    """Read and check the input files; return float64 ``PlnData`` (``pln.check_pln_data``'s checks).
    A ``.npz`` counts file may hold ``offsets`` and ``covariates`` too. ``intercept``: a column of ones
    is put before the covariates (with no covariates the model has the intercept alone)."""
    path = Path(counts)
    if path.suffix.lower() == ".npz":
        if not path.is_file():
            raise FileNotFoundError(f"counts file not found: {path}")
        with np.load(path, allow_pickle=False) as f:
            if "counts" not in f:
                raise ValueError(f"{path} holds no array named 'counts' (it has {sorted(f.files)})")
            y = f["counts"]
            o = f["offsets"] if offsets is None and "offsets" in f else None
            x = f["covariates"] if covariates is None and "covariates" in f else None
    else:
        y, o, x = read_matrix(path, "counts"), None, None
    if offsets is not None:
        o = read_matrix(offsets, "offsets")
    if covariates is not None:
        x = read_matrix(covariates, "covariates")
    if x is not None:
        x = checks.as_array(x, "covariates")
        x = x[:, None] if x.ndim == 1 else x
        if intercept and x.ndim == 2:
            x = np.hstack([np.ones((x.shape[0], 1)), x])
    elif not intercept:
        raise ValueError("--no-intercept needs covariates: a model needs at least one covariate")
    return pln.check_pln_data(y, o, x)


# ----------------------------------------------------------------------------- the compiled fit

def fit_program(data: pln.PlnData, tol: Any, target: Any, maxiter: int = pln.MAXITER) -> Any:
    """Part V's fit from pyPLNmodels' start, as one program: ``F.fit_fast(pln.start(data), data, ...)``."""
    from fastjax.pln import floor as F

    return F.fit_fast(pln.start(data), data, tol, target, maxiter=maxiter)


_EXPORT_REGISTERED: list[bool] = []


def register_for_export() -> None:
    """Let ``jax.export`` serialize the fit's pytrees (``pln.PlnData`` in, ``pln.Criterion`` out), once per
    process: a process that deserializes an exported fit must call it too."""
    if _EXPORT_REGISTERED:
        return
    from jax import export

    for cls in (pln.PlnData, pln.Criterion):
        export.register_namedtuple_serialization(cls, serialized_name=f"fastjax.pln.{cls.__name__}")
    _EXPORT_REGISTERED.append(True)


def cache_folder() -> Path:
    """Where the command keeps its compiled fits: ``$XDG_CACHE_HOME/fastjax/pln-fit`` (default
    ``~/.cache/fastjax/pln-fit``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fastjax" / "pln-fit"


def host_cpu() -> str:
    """The host CPU's model and instruction-set flags, hashed (XLA compiles CPU code for the host's own
    instructions: an executable from another CPU may not run here): from ``/proc/cpuinfo`` where there is
    one, else the ``platform`` module's words."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            words = sorted({line.strip() for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))})
    except OSError:
        words = []
    text = "\n".join(words) or f"{platform.machine()} {platform.processor()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_key(shape: tuple[int, int, int], maxiter: int, compile_options: dict[str, Any] | None = None) -> str:
    """A name for the compiled fit of ``shape`` (n, p, d): a hash of everything the executable depends
    on (jax, jaxlib, the device and the host CPU, XLA_FLAGS and compile options, the shapes, float32,
    ``maxiter``, the fit's source files)."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    here = Path(__file__).resolve().parent
    source = hashlib.sha256(b"".join((here / f).read_bytes() for f in FIT_SOURCES)).hexdigest()
    what = dict(format=CACHE_FORMAT, jax=jax.__version__, jaxlib=jaxlib.__version__, platform=device.platform,
                device=device.device_kind, devices=jax.device_count(), cpu=host_cpu(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                shape=list(shape), dtype="float32", maxiter=maxiter, source=source, options=compile_options or {})
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _trusted(path: Path) -> bool:
    """True when ``path`` and its folder belong to this user and no one else can write them."""
    for p in (path, path.parent):
        st = p.stat()
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
            return False
    return True


def load_executable(path: Path) -> Any | None:
    """The compiled fit saved at ``path`` by ``save_executable``, or None when there is none, it is not
    this user's own (``_trusted``), or it no longer loads (it is then removed)."""
    if not path.is_file():
        return None
    if not _trusted(path):
        warnings.warn(f"{path} is not yours alone (owner or write bits): not loaded, compiling instead", stacklevel=2)
        return None
    import jax
    from jax.experimental import serialize_executable

    # jaxlib fills in its LAPACK kernels (Cholesky, triangular solves, LU: the fit calls them on CPU) when
    # it first lowers a program that uses one, and deserialize_and_load does not: an executable loaded
    # first calls a null kernel and the process dies (jax-ml/jax#28908, open). Lowering a 1×1 Cholesky,
    # never compiled, fills them in through public API.
    jax.jit(jax.numpy.linalg.cholesky).trace(jax.ShapeDtypeStruct((1, 1), np.float32)).lower()
    try:
        blob, in_tree, out_tree = pickle.loads(path.read_bytes())
        return serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
    except Exception:  # written by an older or broken run: drop it and compile again
        path.unlink(missing_ok=True)
        return None


def save_executable(compiled: Any, path: Path) -> bool:
    """Write ``compiled`` (a ``jax.stages.Compiled``) to ``path`` (mode 0600, folder 0700); False when
    this backend cannot serialize its executables."""
    from jax.experimental import serialize_executable

    try:
        payload = pickle.dumps(serialize_executable.serialize(compiled))
    except (ValueError, NotImplementedError):
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:  # mkstemp makes it 0600
        f.write(payload)
    os.replace(tmp, path)
    return True


class FitResult(NamedTuple):
    """A fit: ``M``, ``S`` (n×p), ``B`` (d×p), ``Σ`` (p×p) in float64 NumPy, the ELBO of each iteration,
    the criterion at the end, where the program came from and the seconds of each stage."""

    m: np.ndarray
    s: np.ndarray
    coef: np.ndarray
    covariance: np.ndarray
    elbos: np.ndarray
    criterion: float
    program: str
    seconds: dict[str, float]

    @property
    def elbo(self) -> float:
        """The last ELBO."""
        return float(self.elbos[-1])


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


def fit(data: pln.PlnData, maxiter: int = pln.MAXITER, tol: float = pln.TOL, cache: str | os.PathLike | None = None,
        progress: bool = False, compile_options: dict[str, Any] | None = None) -> FitResult:
    """Fit ``data`` (NumPy ``PlnData``, e.g. from ``read_data``) with ``fit_program``, compiled once per
    shape (with XLA's ``compile_options``, e.g. ``QUICK_COMPILE``): loaded from ``cache`` (a folder; None:
    no cache) when this command saved it there before."""
    maxiter = checks.check_positive_int(maxiter, "maxiter")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0; got {tol!r}")
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    import jax

    seconds["import_jax"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    data32 = pln.PlnData(*(np.asarray(a, np.float32) for a in data[:3]), np.float32(data.log_factorial))
    args = (data32, np.float32(tol), np.float32(np.inf))  # target +inf: stop by the criterion or maxiter
    key = cache_key(data.shape, maxiter, compile_options)
    path = Path(cache) / f"{key}.jaxexe" if cache is not None else None
    compiled = load_executable(path) if path is not None else None
    program = "loaded from the cache"
    if compiled is None:
        n, p, _ = data.shape
        with _Progress(f"compiling the fit for {n}×{p} counts (once per shape)", progress):
            import functools

            lowered = jax.jit(functools.partial(fit_program, maxiter=maxiter)).trace(*args).lower()
            compiled = lowered.compile(compiler_options=compile_options) if compile_options else lowered.compile()
        program = "compiled"
        if path is not None:
            program += ", saved to the cache" if save_executable(compiled, path) else " (this backend cannot save it)"
    seconds["program"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with _Progress("fitting", progress):
        (m, s), elbos, crit = jax.block_until_ready(compiled(*args))
    seconds["fit"] = time.perf_counter() - t0
    pln.check_fit(elbos, crit)
    m, s = np.asarray(m, np.float64), np.asarray(s, np.float64)
    x = np.asarray(data.covariates, np.float64)
    return FitResult(m, s, pln.closed_form_coef(x, m, np), pln.closed_form_covariance(x, m, s, np),
                     np.asarray(elbos)[: int(crit.count)], float(crit.value), program, seconds)


# ----------------------------------------------------------------------------- the command

def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("counts", help="counts: CSV/TSV (samples in rows), .npy, or .npz with counts[, offsets, covariates]")
    p.add_argument("--offsets", help="log-offsets of the counts' shape (CSV/TSV or .npy)")
    p.add_argument("--covariates", help="covariates, one row per sample (CSV/TSV or .npy)")
    p.add_argument("--no-intercept", action="store_true", help="do not add a column of ones to the covariates")
    p.add_argument("--out", help="write M, S, B, Sigma and the ELBOs to this .npz file")
    p.add_argument("--maxiter", type=int, default=pln.MAXITER, help=f"iteration cap (default {pln.MAXITER}, pyPLNmodels')")
    p.add_argument("--tol", type=float, default=pln.TOL, help=f"stopping criterion (default {pln.TOL}, pyPLNmodels')")
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


def main(argv: list[str] | None = None) -> int:
    """Run the command; return its exit status (0 fitted, 2 bad input, 1 the fit failed)."""
    args = parser().parse_args(argv)
    stamps = [time.perf_counter()]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data = read_data(args.counts, args.offsets, args.covariates, intercept=not args.no_intercept)
        for w in caught:
            print(f"{PROG}: note: {w.message}", file=sys.stderr)
        checks.check_positive_int(args.maxiter, "--maxiter")
        if args.out is not None and not Path(args.out).resolve().parent.is_dir():
            raise ValueError(f"--out: the folder of {args.out} does not exist")
    except (OSError, ValueError, TypeError) as err:
        return _fail(str(err), 2)
    cache = None if args.no_cache else Path(args.cache) if args.cache else cache_folder()
    stamps.append(time.perf_counter())
    try:
        result = fit(data, args.maxiter, args.tol, cache, progress=not (args.quiet or args.json),
                     compile_options=QUICK_COMPILE if args.quick_compile else None)
    except (FloatingPointError, ValueError) as err:
        return _fail(f"the fit failed: {err}", 1)
    n, p, d = data.shape
    if args.json:
        seconds = result.seconds
        loaded = result.program.startswith("loaded")
        # python -m imports fastjax and fastjax.pln before this module starts: they fall in the rest
        stages = [["the command's other imports", stamps[0] - STARTED], ["read and check the data", stamps[1] - stamps[0]],
                  ["import jax", seconds["import_jax"]],
                  ["start the backend; " + ("load the compiled fit" if loaded else "trace, lower, compile the fit"),
                   seconds["program"]], ["the fit itself", seconds["fit"]]]
        print(json.dumps(dict(elbo=result.elbo, iterations=len(result.elbos), program=result.program, stages=stages)))
    stop = "criterion below tol" if abs(result.criterion) < args.tol else f"maxiter {args.maxiter} reached"
    if not args.json:
        print(f"PLN fit of {n} samples × {p} counts, {d} covariate(s): ELBO {result.elbo:.6g} after "
              f"{len(result.elbos)} iterations ({stop}); program {result.program}; fit {result.seconds['fit']:.3f} s")
    if args.out:
        np.savez(args.out, M=result.m, S=result.s, B=result.coef, Sigma=result.covariance, elbos=result.elbos)
    return 0


if __name__ == "__main__":
    sys.exit(main())
