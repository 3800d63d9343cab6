"""Fit a PLN to your own counts with one command, fast from its second run on.

    python -m fastjax.pln.fit counts.csv [--offsets F] [--covariates F] [--out F.npz]
    python -m fastjax.pln.fit counts.csv --ranks 1-10 [...]            # PLN-PCA of each rank, BIC and ICL
    python -m fastjax.pln.fit counts.csv --bootstrap 200 [--seed S] [...]  # intervals for the coefficients

``counts``: a CSV (or TSV) table of counts, samples in rows, species or genes in columns, a ``.npy``
file, or a ``.npz`` file holding ``counts`` and optionally ``offsets`` and ``covariates``. A first row of
names is a header; a first column of names, or a first column with no name in the header (the index
pandas' and R's writers add), holds row names: both are skipped, with a note for the index. A first
column that counts 0, 1, 2, … and a first row that counts k, k+1, k+2, … are refused as an unnamed index
and a header of numeric names (``_check_counts_table``). ``--offsets``: log-offsets of
the counts' shape (as pyPLNmodels takes them: the log of each sample's sequencing depth, say);
``--covariates``: numbers, one row per sample (an intercept column is added unless ``--no-intercept``);
where both files name their rows, the names must agree. The fit is Part VI's
(``fastjax.pln.floor.fit_fast``, pyPLNmodels' optimizer and stopping rule), in float32; it prints the
ELBO and, with ``--out``, writes ``M``, ``S``, ``B``, ``Σ`` and the ELBOs. Exit status: 0 fitted, 2 bad
input (a message naming the file, the row or column and what to do, before JAX is imported), 1 the fit
or the writing of ``--out`` failed.

Part IV's fits (chapters/many), each one program of many fits (``fastjax.pln.many``, exported from the
chapters), in float32, with the same input checks, exit statuses, cache and ``--out``:

- ``--ranks SPEC`` (``1-10``, ``2,4,6``, ``3``, or a mix such as ``1-3,5``): a PLN-PCA of each rank, the
  members padded to the largest rank and masked (``many.fit_collection``), each from a start of
  pyPLNmodels' kind computed in NumPy (``collection.pca_start``) and stopped by pyPLNmodels' rule; prints
  each rank's ELBO, BIC, ICL and iterations, and the rank each criterion chooses (lower is better, as
  pyPLNmodels' ``best_model``). A rank is at most the number of count columns, and than n − 1. ``--out``
  holds the table, every member's ELBOs and the parameters of the member BIC chooses (``write_ranks``).
- ``--bootstrap B`` (2 to ``BOOTSTRAP_LIMIT``; ``--seed``, default 0): B refits of Part I's PLN on samples
  of the rows drawn with replacement (``collection.bootstrap_samples``) and the fit of all the rows, as one
  program (``many.bootstrap``); prints each coefficient of the fit of all rows with its 95 % percentile
  interval. A sample whose covariates are not of full column rank is bad input. ``--out``: the intervals
  and every refit's coefficients (``write_bootstrap``).

Their programs are cached as the fit's is, under keys that also name the program and its members
(``cache_what``'s ``program``) and hash Part IV's sources (``MANY_SOURCES``); a loaded one must give every
member's first ELBO as NumPy's float64 does (``check_first_pca_elbos``, ``check_first_bootstrap_elbos``).
The samples' seed is an input, not part of the program: another seed reuses the program.

What makes it fast (chapters/floor/04-first-result.md measures each step): the data are read and
checked before JAX is imported; the fit runs as one program, compiled once per data shape and kept in
the user's cache folder as a serialized executable (``jax.experimental.serialize_executable``); a later
run loads it without importing the fit's modules (optax, Part VI's floor), tracing, lowering or compiling.

What the cache guarantees (``open_cache``, ``load_executable``). Loading a serialized executable runs
code from the file (it is a pickle, and the executable is machine code), so the command trusts a file
only as far as the folder that holds it, as Python trusts ``__pycache__``:

- the path above the cache folder is resolved once (``os.path.realpath``), then every folder from ``/``
  down to the cache folder is opened one by one, relative to the one above, with ``O_NOFOLLOW``, and
  checked on its open descriptor (``fstat``: nothing can be swapped between the check and the use): each
  owned by you or root and writable by no one else (root's sticky folders such as ``/tmp`` excepted: there
  others cannot rename or remove what is yours), the cache folder itself yours and not a symbolic link.
  A folder that fails is not used at all: a warning, and the fit compiles in memory;
- the file is opened relative to that descriptor with ``O_NOFOLLOW``, must be a regular file of yours
  with mode 0600, and is read once: what is checked is what is loaded;
- its bytes carry an HMAC-SHA256 keyed by a random secret kept in the cache folder (``secret.key``,
  mode 0600), written with the file and checked before anything is unpickled. It proves that the file
  was written by a process that could read that secret, i.e. by you (this command, or code running as
  you or as root, which could do anything anyway) and that not one byte has changed since: not a file
  planted by hand or restored from elsewhere, not one damaged on disk. It cannot prove more: nothing
  stored beside a file proves who wrote it against someone who can write as you;
- the file also records what it was compiled for (``cache_what``: versions, device, CPU, flags, shapes,
  the fit's source); a file for anything else is not loaded. The loaded program's first ELBO (at the
  start, before any update) must match NumPy's float64 value of the same ELBO (``check_first_elbo``);
- a file that fails any check, fails to load, or was written for something else is removed (the folder
  is yours) and the program compiled again, with one line saying why. A cache that cannot be written is
  a warning: the fit still runs and writes its result.

What this does not cover: a file that passes every check is run as it is, so a bug of XLA's that breaks
a program only when it is reloaded could still crash the process (the one met so far, jaxlib's LAPACK
fill-in, is handled in ``load_executable``); and the ELBO check sees the first iteration only.

``--out`` is written to a temporary file in the same folder, flushed, synced to disk and renamed over the
target: a failed write leaves the old file as it was and no temporary behind.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the command's stages (--json) are timed from here (after fastjax, fastjax.pln)

import fastjax  # noqa: E402,F401  (the CPU workaround, before jax)

import argparse
import csv
import hashlib
import hmac
import itertools
import json
import os
import pickle
import secrets
import stat
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastjax import checks, pln

PROG = "python -m fastjax.pln.fit"
CACHE_FORMAT = 2  # bump when what the cache holds changes, so that old files are not read
FIT_SOURCES = ("__init__.py", "floor.py", "rungs.py", "rprop.py", "fit.py")  # the fit's code, hashed into the key
MANY_SOURCES = ("many.py", "collection.py")  # and Part IV's, for --ranks and --bootstrap
FIT_PACKAGES = ("jax", "jaxlib", "optax", "numpy")  # their versions are in the key (optax's code is traced into the fit)
SLOW_STAGE_SECONDS = 2.0  # a stage that lasts longer gets a progress line
# XLA's CPU backend at optimization level 0 (LLVM's least work): chapters/floor/04 measures the compile
# about halved and each iteration slower; worth it for a one-off fit of small data, not for a long fit.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}
MISSING = ("", "NA", "NaN", "nan")  # cells read as missing values (NaN), which the fit refuses
FLOAT32_EXACT = 2**24  # the largest count float32 holds exactly, with every integer below it
# Offsets are logs (of a sample's depth, say): e^25 is 7e10 reads. Larger ones are raw totals, not logs.
OFFSET_LIMIT = 25.0
MAXITER_LIMIT = 10**6  # the program keeps one float32 ELBO per iteration: 4 MB at this cap
RANK_LIMIT = 100_000  # --ranks: above any number of count columns this command can fit (checked against p after)
BOOTSTRAP_LIMIT = 10_000  # --bootstrap: every refit is held in memory at once (oaks: about 0.5 MB per refit)
LEVEL = 0.95  # --bootstrap's percentile intervals
ROUNDING_LAMBDA = 7.0  # the probabilistic rounding bound's λ (first_pca_elbo_rtol)
MAGIC = b"fastjax.pln.fit\n"
SECRET_NAME, SECRET_BYTES = "secret.key", 32
WHERE = "(rows and columns count the table's numbers from 0, after any header row and row-name column)"


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


def _regular_file(path: str | os.PathLike, name: str) -> Path:
    """``path`` if it is a regular file; else FileNotFoundError or ValueError naming it and what it is."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{name} file not found: {path}") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read the {name} file ({err.strerror})") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{path}: the {name} file is a folder; name a file in it")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: the {name} file is not a regular file (a device, a pipe or a socket); name a file")
    return path


def _text(path: Path, name: str) -> str:
    """The file's text, which must be UTF-8 (a byte-order mark allowed); else a message naming the byte,
    its line and the encoding it looks like."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
            found, fix = "UTF-16 (it starts with UTF-16's byte-order mark)", "save it as UTF-8 (iconv -f UTF-16 -t UTF-8)"
        elif b"\x00" in data[:4096]:
            found, fix = "binary data, not text", "name a CSV/TSV text file, or a .npy/.npz file with that suffix"
        else:
            found, fix = "Latin-1 or Windows-1252 text, probably", "save it as UTF-8 (iconv -f WINDOWS-1252 -t UTF-8)"
        raise ValueError(f"{path}: the {name} file is not UTF-8: byte 0x{data[err.start]:02x} on line {line} "
                         f"is not valid UTF-8; it looks like {found}: {fix}") from None


class Table(NamedTuple):
    """A table read from a file: its numbers (float64, 2-D), its row names (None: none), whether it had a
    header row (None: not a text file)."""

    values: np.ndarray
    names: list[str] | None
    header: bool | None


def read_csv(path: str | os.PathLike, name: str) -> Table:
    """A numeric table from a CSV/TSV file.

    A first row whose cells (after the first) are all names, not numbers nor missing values, is a header.
    The first column holds row names when its cells are names, or when the header leaves it unnamed (an
    empty first cell, or one cell fewer than the rows: pandas' and R's index), said in a warning then.
    An empty cell, ``NA`` and ``nan`` read as NaN. Rows are read one by one, so a file that is not a table
    fails at its first bad row. Raises ValueError naming the file, the cell and its line.
    """
    path = Path(path)
    lines = ((k, line) for k, line in enumerate(_text(path, name).splitlines(), 1) if line.strip())
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{path}: the {name} file is empty")
    sep = _delimiter(path, first[1])

    def cells(line: str) -> list[str]:
        row = next(csv.reader([line], delimiter=sep)) if sep and '"' in line else line.split(sep)
        return [cell.strip() for cell in row]

    top = cells(first[1])
    header = all(not _is_number(c) and c not in MISSING for c in (top[1:] or top))
    body = ((k, cells(line)) for k, line in lines)
    k0, row0 = next(body, (None, None)) if header else (first[0], top)
    if row0 is None:
        raise ValueError(f"{path}: the {name} file has a header and no rows")
    if header and len(top) not in (len(row0), len(row0) - 1):
        raise ValueError(f"{path}: the header (line {first[0]}) names {len(top)} columns and row 0 (line {k0}) has "
                         f"{len(row0)} cells: give each column one name")
    index = header and (len(top) == len(row0) - 1 or (top[0] == "" and len(top) == len(row0) > 1))
    names_column = index or (not _is_number(row0[0]) and row0[0] not in MISSING)
    if index:
        warnings.warn(f"{path}: the header does not name the first column: read as row names (the index "
                      f"pandas' to_csv and R's write.csv add), not as {name}", stacklevel=2)
    width = len(row0) - names_column
    if width == 0:
        raise ValueError(f"{path}: line {k0} holds no numbers, only {row0[0][:40]!r}: not a table of {name}")
    values: list[list[float]] = []
    names: list[str] = []
    for i, (k, row) in enumerate(itertools.chain([(k0, row0)], body)):
        if len(row) != width + names_column:
            raise ValueError(f"{path}: {name} row {i} (line {k}) has {len(row)} cells, row 0 has "
                             f"{width + names_column} (a ragged table): give every row the same number of cells")
        if names_column:
            if not index and (_is_number(row[0]) or row[0] in MISSING):
                raise ValueError(f"{path}: line {k} starts with {row[0]!r} where the rows above start with a "
                                 "name: give every row a name that is not a number, or none")
            names.append(row[0])
            row = row[1:]
        out = []
        for j, cell in enumerate(row):
            if cell in MISSING:
                out.append(np.nan)
                continue
            try:
                out.append(float(cell))
            except ValueError:
                raise ValueError(f"{path}: {name} holds {cell[:40]!r}, not a number, at row {i}, column {j} "
                                 f"(line {k}) {WHERE}: fix that cell") from None
        values.append(out)
    return Table(np.array(values, dtype=np.float64), names if names_column else None, header)


NOT_NUMPY = ("not a NumPy {suffix} file this command can read (NumPy cannot load it without unpickling, which "
             "could run code): write the table as CSV, or with np.save / np.savez from a numeric array")


def read_table(path: str | os.PathLike, name: str) -> Table:
    """One table from ``path``: ``.npy`` (NumPy's format, never unpickled) or a CSV/TSV text file
    (``read_csv``)."""
    path = _regular_file(path, name)
    if path.suffix.lower() == ".npz":
        raise ValueError(f"{path}: give the {name} as .npy or CSV (a .npz file is read as the counts argument only)")
    if path.suffix.lower() != ".npy":
        return read_csv(path, name)
    try:
        return Table(np.load(path, allow_pickle=False), None, None)
    except Exception:  # ValueError, OSError, EOFError...: numpy's own text advises allow_pickle=True
        raise ValueError(f"{path}: {NOT_NUMPY.format(suffix='.npy')}") from None


def read_matrix(path: str | os.PathLike, name: str) -> np.ndarray:
    """The numbers of ``read_table(path, name)``."""
    return read_table(path, name).values


def _read_npz(path: Path, offsets: bool, covariates: bool) -> tuple[Any, Any, Any]:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in ("counts", "offsets", "covariates") if k in f.files}
            files = sorted(f.files)
    except Exception:  # as read_table: numpy's own text advises allow_pickle=True
        raise ValueError(f"{path}: {NOT_NUMPY.format(suffix='.npz')}") from None
    if "counts" not in arrays:
        raise ValueError(f"{path} holds no array named 'counts' (it has {files}): save the table with "
                         "np.savez(file, counts=...)")
    return arrays["counts"], arrays.get("offsets") if offsets else None, arrays.get("covariates") if covariates else None


def _about(path: Path, check: Any, *args: Any) -> Any:
    """``check(*args)``, its ValueError or TypeError prefixed with the file and, for a text file, the
    convention of its row and column numbers."""
    try:
        return check(*args)
    except (TypeError, ValueError) as err:
        where = f" {WHERE}" if " row " in str(err) and path.suffix.lower() not in (".npy", ".npz") else ""
        raise ValueError(f"{path}: {err}{where}") from None


def _same_rows(path: Path, names: list[str] | None, count_names: list[str] | None, name: str) -> None:
    """Where ``name``'s file names its rows, the counts file must name them alike."""
    if names is None:
        return
    if count_names is None:
        raise ValueError(f"{path}: the first column of the {name} holds text ({names[0][:40]!r}, ...), not "
                         f"numbers: {name} must be numbers (encode a category as 0/1 columns, one per level but "
                         "one); if it names the samples, give the counts file the same first column")
    bad = next((i for i, (a, b) in enumerate(zip(names, count_names)) if a != b), None)
    if bad is not None:
        raise ValueError(f"{path}: row {bad} of the {name} is named {names[bad]!r} where row {bad} of the counts "
                         f"is {count_names[bad]!r}: put both files' rows in the same order")


def _check_counts_table(path: Path, table: Table, y: np.ndarray) -> None:
    """Refuse what is not a table of counts although it reads as one: counts float32 cannot hold, and in a
    text file an unnamed index column and a header of numeric names (consecutive integers)."""
    n, p = y.shape
    if table.header is not None and n >= 3 and p >= 2 and any(np.array_equal(y[:, 0], np.arange(k, n + k)) for k in (0, 1)):
        raise ValueError(f"{path}: column 0 of the counts holds {y[0, 0]:.0f}, {y[1, 0]:.0f}, ..., {y[-1, 0]:.0f} in "
                         "order: an index column, not counts. Delete it (pandas: to_csv(index=False)), or give the "
                         "file a header row that leaves that column's name empty")
    if table.header is False and n >= 2 and p >= 3 and np.array_equal(y[0], y[0, 0] + np.arange(p)):
        raise ValueError(f"{path}: row 0 of the counts holds {y[0, 0]:.0f}, {y[0, 1]:.0f}, ..., {y[0, -1]:.0f} in "
                         "order: a header of numeric column names, not counts. Give the columns names that are not "
                         f"numbers (g{y[0, 0]:.0f}, ...), or delete the row")
    big = np.argwhere(y > FLOAT32_EXACT)
    if big.size:
        i, j = big[0]
        where = f" {WHERE}" if table.header is not None else ""
        raise ValueError(f"{path}: the count {y[i, j]:.6g} at row {i}, column {j}{where} is above 2**24 = "
                         f"{FLOAT32_EXACT:,}, the largest that float32 (the fit's precision) holds exactly: this "
                         "command cannot fit it (pyPLNmodels fits in float64)")


def read_data(counts: str | os.PathLike, offsets: str | os.PathLike | None = None,
              covariates: str | os.PathLike | None = None, intercept: bool = True) -> pln.PlnData:
    """Read and check the input files; return float64 ``PlnData``: ``pln.check_pln_data``'s checks and the
    command's (``_check_counts_table``; offsets that look like logs, at most ``OFFSET_LIMIT``; covariates
    checked in the user's own columns before the intercept is added; more samples than covariates). A
    ``.npz`` counts file may hold ``offsets`` and ``covariates`` too. ``intercept``: a column of ones is
    put before the covariates (with no covariates the model has the intercept alone). Raises
    FileNotFoundError or ValueError naming the file."""
    path = _regular_file(counts, "counts")
    if path.suffix.lower() == ".npz":
        y, o, x = _read_npz(path, offsets is None, covariates is None)
        table = Table(y, None, None)
    else:
        table, o, x = read_table(path, "counts"), None, None
    o_path = x_path = path
    y = _about(path, checks.check_counts, table.values, "counts")
    _check_counts_table(path, table, y)
    n, p = y.shape
    _enough_samples(path, n, 1)  # before the other files are compared with the counts
    if offsets is not None:
        o_path = _regular_file(offsets, "offsets")
        o_table = read_table(o_path, "offsets")
        _same_rows(o_path, o_table.names, table.names, "offsets")
        o = o_table.values
    if o is not None:
        o = _about(o_path, checks.check_matrix, o, "offsets")
        if o.shape != (n, p):
            raise ValueError(f"{o_path}: offsets must have the shape of counts {(n, p)}; got {o.shape}")
        if o.max() > OFFSET_LIMIT:
            i, j = np.unravel_index(np.argmax(o), o.shape)
            raise ValueError(f"{o_path}: offsets are logs (of each sample's sequencing depth, say), but the one at "
                             f"row {i}, column {j} is {o[i, j]:.6g}, above {OFFSET_LIMIT:g} (e^{OFFSET_LIMIT:g} reads): "
                             "these look like raw totals. Take their log (np.log) first")
    if covariates is not None:
        x_path = _regular_file(covariates, "covariates")
        x_table = read_table(x_path, "covariates")
        _same_rows(x_path, x_table.names, table.names, "covariates")
        x = x_table.values
    if x is not None:
        x = _about(x_path, checks.as_array, x, "covariates")
        x = _about(x_path, checks.check_matrix, x[:, None] if x.ndim == 1 else x, "covariates")
        if x.shape[0] != n:
            raise ValueError(f"{x_path}: covariates must have one row per sample of counts ({n}); got {x.shape[0]} rows")
        constant = np.flatnonzero(np.all(x == x[:1], axis=0))
        if intercept and constant.size:
            raise ValueError(f"{x_path}: covariate column {constant[0]} holds {x[0, constant[0]]:.6g} in every row: "
                             "it repeats the intercept column the command adds. Delete the column, or pass "
                             "--no-intercept to keep it as the intercept")
        if intercept:
            x = np.hstack([np.ones((n, 1)), x])
        _about(x_path, checks.check_full_column_rank, x,
               "covariates (after the intercept column the command adds)" if intercept else "covariates")
    elif not intercept:
        raise ValueError("--no-intercept needs covariates: a model needs at least one covariate")
    _enough_samples(path, n, 1 if x is None else x.shape[1])
    return pln.check_pln_data(y, o, x)


def _enough_samples(path: Path, n: int, d: int) -> None:
    if n <= d:
        raise ValueError(f"{path}: {n} sample(s) for {d} covariate column(s), the intercept included: a fit needs "
                         f"more samples than covariates, at least {d + 1}")


# ----------------------------------------------------------------------------- the compiled fit

def fit_program(data: pln.PlnData, tol: Any, target: Any, maxiter: int = pln.MAXITER) -> Any:
    """Part VI's fit from pyPLNmodels' start, as one program: ``F.fit_fast(pln.start(data), data, ...)``."""
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


def cache_what(shape: tuple[int, int, int], maxiter: int, compile_options: dict[str, Any] | None = None,
               program: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the compiled fit of ``shape`` (n, p, d) depends on: the versions of jax, jaxlib, optax (traced
    into the fit) and numpy, Python's, the device and the host CPU, every ``JAX_*`` and ``XLA_*``
    environment variable (``XLA_FLAGS`` among them) and the compile options, the shapes, float32,
    ``maxiter`` and the fit's source files. ``program``: None for the fit; for Part IV's programs what
    they are and how many members (``{"kind": "ranks", "members": 10, "q_max": 10}``, ``{"kind":
    "bootstrap", "members": 201}``), and their source files (``MANY_SOURCES``) join the fit's."""
    import importlib.metadata

    import jax

    device = jax.devices()[0]
    here = Path(__file__).resolve().parent
    files = FIT_SOURCES + (MANY_SOURCES if program is not None else ())
    source = hashlib.sha256(b"".join((here / f).read_bytes() for f in files)).hexdigest()
    what = dict(format=CACHE_FORMAT, versions={k: importlib.metadata.version(k) for k in FIT_PACKAGES},
                python=sys.version, platform=device.platform, device=device.device_kind, devices=jax.device_count(),
                cpu=host_cpu(), env={k: v for k, v in sorted(os.environ.items()) if k.startswith(("JAX_", "XLA_"))},
                shape=[int(v) for v in shape], dtype="float32", maxiter=int(maxiter), source=source,
                options=compile_options or {})
    if program is not None:
        what["program"] = program
    return what


def cache_key(shape: tuple[int, int, int], maxiter: int, compile_options: dict[str, Any] | None = None,
              program: dict[str, Any] | None = None) -> str:
    """The file name of the compiled fit of ``shape`` (n, p, d) (or of Part IV's ``program``): a hash of
    ``cache_what``."""
    what = cache_what(shape, maxiter, compile_options, program)
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


class CacheRejected(Exception):
    """A cache file (or folder) that is not used, and why."""


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _check_folder(fd: int, where: Path, last: bool) -> None:
    st, me = os.fstat(fd), os.geteuid()
    if st.st_uid not in ((me,) if last else (me, 0)):
        raise CacheRejected(f"{where} belongs to user id {st.st_uid}, not to you{'' if last else ' or root'}")
    sticky = st.st_uid == 0 and st.st_mode & stat.S_ISVTX and not last
    if st.st_mode & 0o022 and not sticky:
        raise CacheRejected(f"{where} can be written by others (mode {stat.S_IMODE(st.st_mode):o})")


def open_cache(folder: str | os.PathLike) -> int:
    """An open descriptor of the cache ``folder`` (created, mode 0700, where missing), after checking each
    folder from ``/`` down on its own descriptor (module docstring). Raises CacheRejected or OSError."""
    if not hasattr(os, "O_NOFOLLOW") or os.open not in os.supports_dir_fd:
        raise CacheRejected("this system cannot open files relative to a checked folder")
    full = Path(os.path.abspath(folder))
    parts = Path(os.path.realpath(full.parent)).parts[1:] + ((full.name,) if full.name else ())
    fd, where = os.open("/", _DIR_FLAGS), Path("/")
    try:
        _check_folder(fd, where, last=not parts)
        for k, part in enumerate(parts):
            where = where / part
            try:
                new = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o700, dir_fd=fd)
                new = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:  # ELOOP, ENOTDIR: a symbolic link or a file
                raise CacheRejected(f"{where}: {err.strerror} (the cache folder must be a folder, not a symbolic link)") from None
            os.close(fd)
            fd = new
            _check_folder(fd, where, last=k == len(parts) - 1)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_own(folder_fd: int, name: str, size: int | None = None) -> bytes | None:
    """The bytes of ``name`` in the checked folder, read once from the descriptor that was checked (a regular
    file of yours, mode 0600); None when there is none. Raises CacheRejected."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=folder_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CacheRejected(f"cannot be opened safely ({err.strerror}: a symbolic link?)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheRejected("is not a regular file")
        if st.st_uid != os.geteuid():
            raise CacheRejected(f"belongs to user id {st.st_uid}, not to you")
        if stat.S_IMODE(st.st_mode) != 0o600:
            raise CacheRejected(f"has mode {stat.S_IMODE(st.st_mode):o}, not 600")
        return f.read() if size is None else f.read(size + 1)


def _write_own(folder_fd: int, name: str, data: bytes, replace: bool = True) -> None:
    """Write ``data`` to ``name`` in the checked folder through a new temporary file (mode 0600, synced),
    renamed over ``name`` (``replace``) or linked to it unless it exists; no temporary is left behind."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o600)
            f.write(data)
            f.flush()
            os.fsync(fd)
        if replace:
            os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        else:
            try:
                os.link(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd, follow_symlinks=False)
            except FileExistsError:
                pass
    finally:
        try:
            os.unlink(tmp, dir_fd=folder_fd)
        except FileNotFoundError:
            pass


def cache_secret(folder_fd: int) -> bytes:
    """The cache folder's secret (``SECRET_NAME``, 32 random bytes, mode 0600), made where missing; one that
    fails the file checks is replaced, which makes every file signed with it unprovable."""
    for _ in range(2):
        try:
            key = _read_own(folder_fd, SECRET_NAME, SECRET_BYTES)
        except CacheRejected as why:
            warnings.warn(f"the cache's {SECRET_NAME} {why}: replaced by a new one", stacklevel=2)
            os.unlink(SECRET_NAME, dir_fd=folder_fd)
            key = None
        if key is not None and len(key) == SECRET_BYTES:
            return key
        if key is not None:
            os.unlink(SECRET_NAME, dir_fd=folder_fd)
        _write_own(folder_fd, SECRET_NAME, secrets.token_bytes(SECRET_BYTES), replace=False)
    raise CacheRejected(f"its {SECRET_NAME} cannot be made")


def _signed(secret: bytes, what: dict[str, Any], payload: bytes) -> bytes:
    meta = json.dumps(what, sort_keys=True).encode()
    body = MAGIC + len(meta).to_bytes(8, "little") + meta + payload
    return body + hmac.new(secret, body, hashlib.sha256).digest()


def _unsigned(secret: bytes, what: dict[str, Any], raw: bytes) -> bytes:
    """The payload of a file ``_signed`` wrote for ``what``; else CacheRejected."""
    body, mac = raw[:-32], raw[-32:]
    if len(raw) < len(MAGIC) + 40 or not hmac.compare_digest(hmac.new(secret, body, hashlib.sha256).digest(), mac):
        raise CacheRejected("does not carry this cache's signature (not written by this command, or changed since)")
    size = int.from_bytes(body[len(MAGIC):len(MAGIC) + 8], "little")
    meta = json.loads(body[len(MAGIC) + 8:len(MAGIC) + 8 + size])
    if meta != json.loads(json.dumps(what)):
        changed = sorted(k for k in set(meta) | set(what) if meta.get(k) != what.get(k))
        raise CacheRejected("was compiled for another " + ", ".join(f"{k} ({k}={meta.get(k)})" if k in ("shape", "maxiter")
                                                                    else k for k in changed))
    return body[len(MAGIC) + 8 + size:]


def load_executable(folder_fd: int, name: str, what: dict[str, Any]) -> Any | None:
    """The compiled fit saved as ``name`` in the checked cache folder by ``save_executable`` for ``what``, or
    None when there is none. Raises CacheRejected (the caller removes the file) when it fails a check or
    does not load."""
    raw = _read_own(folder_fd, name)
    if raw is None:
        return None
    payload = _unsigned(cache_secret(folder_fd), what, raw)
    import jax
    from jax.experimental import serialize_executable

    # jaxlib fills in its LAPACK kernels (Cholesky, triangular solves, LU: the fit calls them on CPU) when
    # it first lowers a program that uses one, and deserialize_and_load does not: an executable loaded
    # first calls a null kernel and the process dies (jax-ml/jax#28908, open). Lowering a 1×1 Cholesky,
    # never compiled, fills them in through public API.
    jax.jit(jax.numpy.linalg.cholesky).trace(jax.ShapeDtypeStruct((1, 1), np.float32)).lower()
    try:
        blob, in_tree, out_tree = pickle.loads(payload)  # signed by this cache's secret: written by this command
        return serialize_executable.deserialize_and_load(blob, in_tree, out_tree)
    except Exception as err:
        raise CacheRejected(f"does not load ({type(err).__name__}: {str(err)[:100]})") from None


def serialized(compiled: Any) -> bytes | None:
    """``compiled`` (a ``jax.stages.Compiled``) as the bytes ``load_executable`` reads back, or None when this
    backend cannot serialize it. Call it before the program first runs: XLA:CPU cannot serialize some
    programs once they have run (the bootstrap's: "`LessThan` is not serializable", jaxlib 0.10.2 and
    0.12.0.1), and serializes them before."""
    import jax
    from jax.experimental import serialize_executable

    try:
        return pickle.dumps(serialize_executable.serialize(compiled))
    except (ValueError, NotImplementedError, jax.errors.JaxRuntimeError):
        return None


def save_serialized(payload: bytes, folder_fd: int, name: str, what: dict[str, Any]) -> None:
    """Write ``payload`` (``serialized``) as ``name`` in the checked cache folder, signed (``_signed``), through
    a temporary file renamed over it. Raises OSError or CacheRejected when it cannot be written."""
    _write_own(folder_fd, name, _signed(cache_secret(folder_fd), what, payload))


def save_executable(compiled: Any, folder_fd: int, name: str, what: dict[str, Any]) -> bool:
    """``save_serialized(serialized(compiled), ...)``; False when this backend cannot serialize it."""
    payload = serialized(compiled)
    if payload is None:
        return False
    save_serialized(payload, folder_fd, name, what)
    return True


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


def _open_or_warn(cache: str | os.PathLike) -> int | None:
    try:
        return open_cache(cache)
    except (CacheRejected, OSError) as why:
        text = why.strerror if isinstance(why, OSError) and why.strerror else str(why)
        warnings.warn(f"cache folder {cache} not used: {text}; compiling in memory", stacklevel=3)
        return None


def check_tol(tol: Any) -> float:
    """``tol``, the stopping criterion: a number in (0, 1); else ValueError."""
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating)) or not 0 < tol < 1:
        raise ValueError(f"--tol must be a number in (0, 1), such as {pln.TOL} (pyPLNmodels' default); got {tol!r}")
    return float(tol)


def check_maxiter(maxiter: Any) -> int:
    """``maxiter``: a positive integer up to ``MAXITER_LIMIT``; else TypeError or ValueError."""
    maxiter = checks.check_positive_int(maxiter, "--maxiter")
    if maxiter > MAXITER_LIMIT:
        raise ValueError(f"--maxiter must be at most {MAXITER_LIMIT:,} (the fit keeps one ELBO per iteration); "
                         f"got {maxiter:,}")
    return maxiter


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
    try:
        out, program = None, "loaded from the cache"
        if folder is not None:
            try:
                compiled = load_executable(folder, name, prog.what)
                if compiled is not None:
                    seconds["program"], t0 = time.perf_counter() - t0, time.perf_counter()
                    out = jax.block_until_ready(compiled(*prog.args))
                    seconds["fit"] = time.perf_counter() - t0
                    prog.first(out)
            except Exception as why:  # CacheRejected, or the program fails to run: never a crash, never its result
                why = why if isinstance(why, CacheRejected) else f"does not run ({type(why).__name__}: {str(why)[:100]})"
                warnings.warn(f"the cached {prog.noun} {Path(cache) / name} {why}: removed, compiling again", stacklevel=3)
                out = None
                try:
                    os.unlink(name, dir_fd=folder)
                except OSError:
                    pass
        if out is None:
            with _Progress(prog.compiling, progress):
                import functools

                lowered = jax.jit(functools.partial(prog.function, maxiter=maxiter)).trace(*prog.args).lower()
                compiled = lowered.compile(compiler_options=compile_options) if compile_options else lowered.compile()
                payload = serialized(compiled) if folder is not None else None  # before it runs (``serialized``)
            program = "compiled"
            seconds["program"], t0 = time.perf_counter() - t0, time.perf_counter()
            with _Progress("fitting", progress):
                out = jax.block_until_ready(compiled(*prog.args))
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
    finally:
        if folder is not None:
            os.close(folder)
    return out, program


def fit(data: pln.PlnData, maxiter: int = pln.MAXITER, tol: float = pln.TOL, cache: str | os.PathLike | None = None,
        progress: bool = False, compile_options: dict[str, Any] | None = None) -> FitResult:
    """Fit ``data`` (NumPy ``PlnData``, e.g. from ``read_data``) with ``fit_program``, compiled once per
    shape (with XLA's ``compile_options``, e.g. ``QUICK_COMPILE``): loaded from ``cache`` (a folder; None:
    no cache) when this command saved it there before (module docstring: the checks). Problems with the
    cache are warnings (UserWarning, one line each); FloatingPointError when the fit fails."""
    maxiter, tol = check_maxiter(maxiter), check_tol(tol)
    seconds, t0 = _import_jax()
    n, p, _ = data.shape
    prog = Program(fit_program, (_float32(data), np.float32(tol), np.float32(np.inf)),
                   cache_what(data.shape, maxiter, compile_options), "fit",
                   f"compiling the fit for {n}×{p} counts (once per shape)",
                   first=lambda out: check_first_elbo(out[1], data), valid=lambda out: checked_elbos(out[1], out[2]))
    ((m, s), elbos, crit), program = run_program(prog, maxiter, cache, progress, compile_options, seconds, t0)
    elbos = checked_elbos(elbos, crit)
    m, s = np.asarray(m, np.float64), np.asarray(s, np.float64)
    x = np.asarray(data.covariates, np.float64)
    return FitResult(m, s, pln.closed_form_coef(x, m, np), pln.closed_form_covariance(x, m, s, np),
                     elbos, float(crit.value), program, seconds)


# ----------------------------------------------------------------------------- many fits as one program (Part IV)

def collection_program(params: Any, data_and_masks: Any, tol: Any, target: Any, maxiter: int = pln.MAXITER) -> Any:
    """Part IV's PLN-PCA collection as one program (``fastjax.pln.many.fit_collection``, chapters/many/01)."""
    from fastjax.pln import many

    return many.fit_collection(params, data_and_masks, tol, target, maxiter=maxiter)


def bootstrap_program(samples: pln.PlnData, tol: Any, target: Any, maxiter: int = pln.MAXITER) -> Any:
    """Part IV's bootstrap as one program (``fastjax.pln.many.bootstrap``, chapters/many/02)."""
    from fastjax.pln import many

    return many.bootstrap(samples, tol, target, maxiter=maxiter)


def parse_ranks(spec: str) -> list[int]:
    """``--ranks``: ``1-10``, ``2,4,6``, ``3`` or a mix (``1-3,5``) as sorted ranks, each once; else ValueError
    naming the part that is wrong."""
    parts = [part.strip() for part in str(spec).split(",")]
    if not any(parts):
        raise ValueError(f"--ranks needs ranks, such as 1-10, 2,4,6 or 3; got {spec!r}")
    ranges = []
    for part in parts:
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"--ranks {spec}: {part!r} is neither a rank (a whole number, such as 3) nor a range of "
                             "them (such as 1-10)") from None
        if first < 1:
            raise ValueError(f"--ranks {spec}: ranks start at 1 (a rank-q model has q latent dimensions); got {first}")
        if last < first:
            raise ValueError(f"--ranks {spec}: the range {part} runs backwards; write {last}-{first}")
        if last > RANK_LIMIT:
            raise ValueError(f"--ranks {spec}: rank {last} is above {RANK_LIMIT:,}; a rank is at most the number of "
                             "count columns")
        ranges.append(range(first, last + 1))
    return sorted(set(itertools.chain.from_iterable(ranges)))


def ranks_text(ranks: list[int]) -> str:
    """``ranks`` as ``1-10`` where they follow one another, else ``2, 4, 6``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def check_bootstrap(value: Any) -> int:
    """``--bootstrap``: a whole number of refits from 2 to ``BOOTSTRAP_LIMIT``; else ValueError."""
    try:
        n_boot = int(str(value).strip())
    except ValueError:
        raise ValueError(f"--bootstrap must be a whole number of refits, such as 200; got {value!r}") from None
    if n_boot < 2:
        raise ValueError(f"--bootstrap must be at least 2 (the number of refits on resampled rows: 200 is usual); "
                         f"got {n_boot}")
    if n_boot > BOOTSTRAP_LIMIT:
        raise ValueError(f"--bootstrap must be at most {BOOTSTRAP_LIMIT:,} (all refits are held in memory at once); "
                         f"got {n_boot:,}")
    return n_boot


def check_seed(value: Any) -> int:
    """``--seed``: a whole number, 0 or more; else ValueError."""
    try:
        seed = int(str(value).strip())
    except ValueError:
        raise ValueError(f"--seed must be a whole number, such as 0; got {value!r}") from None
    if seed < 0:
        raise ValueError(f"--seed must be 0 or more (NumPy's generators take no negative seed); got {seed}")
    return seed


class Collection(NamedTuple):
    """The members of a PLN-PCA collection before the fit: their ranks, their starts (``collection.pca_start``,
    float64, padded to the largest rank by ``collection.pad``) and their masks."""

    ranks: list[int]
    starts: Any
    masks: np.ndarray


def prepare_ranks(data: pln.PlnData, ranks: list[int]) -> Collection:
    """Check ``ranks`` against ``data`` (each at most the number of count columns, and than n − 1) and draw
    each member's start (NumPy, before JAX); else ValueError."""
    from fastjax.pln import collection as col

    n, p, _ = data.shape
    if ranks[-1] > p:
        raise ValueError(f"--ranks {ranks_text(ranks)}: rank {ranks[-1]} is above the number of count columns, {p} "
                         "(after any column of zeros is removed): a rank is at most that")
    if ranks[-1] > n - 1:
        raise ValueError(f"--ranks {ranks_text(ranks)}: rank {ranks[-1]} needs more samples: the PCA that starts a "
                         f"member has at most n − 1 = {n - 1} components for {n} samples")
    starts, masks = col.pad([col.pca_start(data, q) for q in ranks])
    return Collection(ranks, starts, masks)


class Bootstrap(NamedTuple):
    """A bootstrap before the fit: the samples, member 0 all the rows as they are and members 1..B drawn
    with replacement (stacked NumPy ``PlnData``), the drawn row indices (B × n) and the seed."""

    samples: pln.PlnData
    rows: np.ndarray
    seed: int


def prepare_bootstrap(data: pln.PlnData, n_boot: int, seed: int = 0) -> Bootstrap:
    """Draw ``n_boot`` samples of the rows of ``data`` (``collection.bootstrap_samples``, NumPy, before JAX) and
    put all the rows in front; ValueError when a sample's covariates are not of full column rank (its
    coefficients would not be defined)."""
    from fastjax.pln import collection as col

    drawn, rows = col.bootstrap_samples(data, n_boot, seed)
    d = data.covariates.shape[1]
    for b in range(n_boot):
        rank = np.linalg.matrix_rank(drawn.covariates[b])
        if rank < d:
            raise ValueError(f"--bootstrap: sample {b} (seed {seed}) draws rows whose covariates have rank {rank}, "
                             f"not {d}: its coefficients are not defined. A covariate that is constant, or non-zero "
                             "in few rows, does that; drop or merge such covariates")
    whole = col.resample_rows(data, np.arange(data.shape[0]))
    samples = pln.PlnData(*(np.concatenate([np.asarray(a)[None], np.asarray(b)]) for a, b in zip(whole, drawn)))
    return Bootstrap(samples, rows, seed)


class RanksResult(NamedTuple):
    """A PLN-PCA collection fitted: the ranks, each member's ELBO, BIC, ICL (``collection.member_criteria``)
    and iterations, its parameters (float64, padded, with the masks) and ELBO of each iteration (members ×
    maxiter, NaN past its stop), where the program came from and the seconds of each stage."""

    ranks: list[int]
    elbo: np.ndarray
    bic: np.ndarray
    icl: np.ndarray
    iterations: np.ndarray
    params: Any
    masks: np.ndarray
    elbos: np.ndarray
    program: str
    seconds: dict[str, float]

    def best(self, criterion: str = "BIC") -> int:
        """The rank that ``criterion`` ("BIC" or "ICL", lower is better) chooses."""
        return int(self.ranks[int(np.argmin(self.bic if criterion == "BIC" else self.icl))])

    def member(self, rank: int) -> Any:
        """The parameters of the member of ``rank``, without padding (``collection.PcaParams``)."""
        from fastjax.pln import collection as col

        i = self.ranks.index(rank)
        return col.unpad(col.PcaParams(*(np.asarray(a)[i] for a in self.params)), rank)


def fit_ranks(data: pln.PlnData, collection: Collection, maxiter: int = pln.MAXITER, tol: float = pln.TOL,
              cache: str | os.PathLike | None = None, progress: bool = False,
              compile_options: dict[str, Any] | None = None) -> RanksResult:
    """Fit the PLN-PCA members of ``collection`` (``prepare_ranks``) to ``data`` as one program
    (``collection_program``), in float32, cached as ``fit`` caches its program."""
    from fastjax.pln import collection as col

    maxiter, tol = check_maxiter(maxiter), check_tol(tol)
    seconds, t0 = _import_jax()
    n, p, _ = data.shape
    ranks, masks = collection.ranks, collection.masks
    starts32 = col.PcaParams(*(np.asarray(a, np.float32) for a in collection.starts))
    args = (starts32, (_float32(data), np.asarray(masks, np.float32)), np.float32(tol), np.float32(np.inf))
    program = dict(kind="ranks", members=len(ranks), q_max=int(masks.shape[1]))

    def valid(out: Any) -> None:
        for i, q in enumerate(ranks):
            checked_elbos(np.asarray(out[1])[i], _member(out[2], i), f"rank {q}: ")

    prog = Program(collection_program, args, cache_what(data.shape, maxiter, compile_options, program), "collection",
                   f"compiling the collection of ranks {ranks_text(ranks)} for {n}×{p} counts (once per shape)",
                   first=lambda out: check_first_pca_elbos(out[1], collection.starts, masks, data), valid=valid)
    (params, elbos, crit), where = run_program(prog, maxiter, cache, progress, compile_options, seconds, t0)
    params = col.PcaParams(*(np.asarray(a, np.float64) for a in params))
    table = col.member_criteria(params, elbos, crit, masks, data)
    return RanksResult(list(ranks), table["ELBO"], np.asarray(table["BIC"]), np.asarray(table["ICL"]),
                       np.asarray(crit.count), params, masks, np.asarray(elbos), where, seconds)


class BootstrapResult(NamedTuple):
    """A bootstrap fitted: ``coef`` the B (d×p) of all the rows, ``coefs`` each refit's (n_boot × d × p), the
    percentile interval (``low``, ``high``) at ``level``, the drawn rows, the seed, each member's
    iterations (all the rows first), where the program came from and the seconds of each stage."""

    coef: np.ndarray
    coefs: np.ndarray
    low: np.ndarray
    high: np.ndarray
    level: float
    rows: np.ndarray
    seed: int
    iterations: np.ndarray
    program: str
    seconds: dict[str, float]


def fit_bootstrap(data: pln.PlnData, boot: Bootstrap, maxiter: int = pln.MAXITER, tol: float = pln.TOL,
                  cache: str | os.PathLike | None = None, progress: bool = False,
                  compile_options: dict[str, Any] | None = None, level: float = LEVEL) -> BootstrapResult:
    """Refit ``boot``'s samples (``prepare_bootstrap``: all the rows, then the drawn ones) as one program
    (``bootstrap_program``), in float32, cached as ``fit`` caches its program; the percentile interval at
    ``level`` of each coefficient from the drawn samples' refits."""
    from fastjax.pln import collection as col

    maxiter, tol = check_maxiter(maxiter), check_tol(tol)
    seconds, t0 = _import_jax()
    n, p, _ = data.shape
    members = int(np.shape(boot.samples.counts)[0])
    program = dict(kind="bootstrap", members=members)

    def valid(out: Any) -> None:
        for b in range(members):
            checked_elbos(np.asarray(out[1])[b], _member(out[2], b), "the fit of all rows: " if b == 0 else f"refit {b}: ")

    prog = Program(bootstrap_program, (_float32(boot.samples), np.float32(tol), np.float32(np.inf)),
                   cache_what(data.shape, maxiter, compile_options, program), "bootstrap",
                   f"compiling the bootstrap of {members - 1} refits for {n}×{p} counts (once per shape)",
                   first=lambda out: check_first_bootstrap_elbos(out[1], boot.samples), valid=valid)
    (coefs, _, crit), where = run_program(prog, maxiter, cache, progress, compile_options, seconds, t0)
    coefs = np.asarray(coefs, np.float64)
    low, high = col.percentile_interval(coefs[1:], level)
    return BootstrapResult(coefs[0], coefs[1:], low, high, level, boot.rows, boot.seed, np.asarray(crit.count),
                           where, seconds)


# ----------------------------------------------------------------------------- writing --out

def write_npz(out: str | os.PathLike, **arrays: Any) -> None:
    """Write ``arrays`` to ``out`` (a .npz archive, under exactly that name) through a temporary file in its
    folder, flushed, synced and renamed over ``out``: a failed write leaves ``out`` as it was and no
    temporary behind. Raises OSError."""
    out = Path(out)
    fd, tmp = _tempfile(out)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_result(result: FitResult, out: str | os.PathLike) -> None:
    """Write ``result``'s ``M``, ``S``, ``B``, ``Sigma`` and ELBOs to ``out`` (``write_npz``). Raises OSError."""
    write_npz(out, M=result.m, S=result.s, B=result.coef, Sigma=result.covariance, elbos=result.elbos)


def write_ranks(result: RanksResult, out: str | os.PathLike) -> None:
    """Write the collection's table (``ranks``, ``ELBO``, ``BIC``, ``ICL``, ``iterations``), the ranks chosen
    (``best_BIC``, ``best_ICL``), every member's ELBO per iteration (``elbos``, NaN past its stop) and the
    parameters of the member BIC chooses (``M``, ``S``, loadings ``C``, ``B``, ``Sigma = C Cᵀ``) to ``out``
    (``write_npz``). Raises OSError."""
    best = result.best("BIC")
    chosen = result.member(best)
    write_npz(out, ranks=np.asarray(result.ranks), ELBO=result.elbo, BIC=result.bic, ICL=result.icl,
              iterations=result.iterations, best_BIC=best, best_ICL=result.best("ICL"), elbos=result.elbos,
              M=chosen.m, S=chosen.s, C=chosen.components, B=chosen.coef, Sigma=chosen.components @ chosen.components.T)


def write_bootstrap(result: BootstrapResult, out: str | os.PathLike) -> None:
    """Write the coefficients of all rows (``B``), their interval (``low``, ``high``, at ``level``), every
    refit's coefficients (``coefs``), the drawn rows (``rows``), the ``seed`` and each member's
    ``iterations`` (all the rows first) to ``out`` (``write_npz``). Raises OSError."""
    write_npz(out, B=result.coef, low=result.low, high=result.high, level=result.level, coefs=result.coefs,
              rows=result.rows, seed=result.seed, iterations=result.iterations)


def _tempfile(out: Path) -> tuple[int, str]:
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # as a file made by open() would be
    return fd, tmp


def check_out(out: str) -> Path:
    """``--out``: a new or existing ``.npz`` file in a folder that exists and can be written; else ValueError."""
    path = Path(out)
    if path.suffix.lower() != ".npz":
        raise ValueError(f"--out {out}: the result is a NumPy .npz archive; give a name that ends in .npz "
                         f"(such as {path.with_suffix('.npz').name})")
    if path.is_dir():
        raise ValueError(f"--out {out} is a folder; name a file in it")
    if not path.resolve().parent.is_dir():
        raise ValueError(f"--out: the folder of {out} does not exist")
    if not os.access(path.resolve().parent, os.W_OK):
        raise ValueError(f"--out: the folder of {out} cannot be written: choose another folder")
    return path


# ----------------------------------------------------------------------------- the command

def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("counts", help="counts: CSV/TSV (samples in rows), .npy, or .npz with counts[, offsets, covariates]")
    p.add_argument("--offsets", help="log-offsets of the counts' shape (CSV/TSV or .npy)")
    p.add_argument("--covariates", help="covariates, one row per sample (CSV/TSV or .npy)")
    p.add_argument("--no-intercept", action="store_true", help="do not add a column of ones to the covariates")
    p.add_argument("--ranks", metavar="SPEC",
                   help="fit a PLN-PCA of each rank (1-10, 2,4,6 or 3) as one program: ELBO, BIC and ICL per rank, "
                        "and the rank each criterion chooses")
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


def _stages(stamps: list[float], seconds: dict[str, float], program: str) -> list[list[Any]]:
    """The command's stages and their seconds, for --json (python -m imports fastjax and fastjax.pln before
    this module starts: they fall in the rest)."""
    loaded = program.startswith("loaded")
    return [["the command's other imports", stamps[0] - STARTED], ["read and check the data", stamps[1] - stamps[0]],
            ["import jax", seconds["import_jax"]],
            ["start the backend; " + ("load the compiled fit" if loaded else "trace, lower, compile the fit"),
             seconds["program"]], ["the fit itself", seconds["fit"]]]


def _covariate_names(d: int, intercept: bool) -> list[str]:
    return [("intercept" if intercept and k == 0 else f"covariate {k - intercept}") for k in range(d)]


def _print_ranks(result: RanksResult, data: pln.PlnData, maxiter: int) -> None:
    n, p, d = data.shape
    print(f"PLN-PCA of {n} samples × {p} counts, {d} covariate(s), ranks {ranks_text(result.ranks)} as one program: "
          f"program {result.program}; fit {result.seconds['fit']:.3f} s")
    print(f"{'rank':>5} {'ELBO':>14} {'BIC':>14} {'ICL':>14} {'iterations':>10}")
    for i, q in enumerate(result.ranks):
        print(f"{q:>5} {result.elbo[i]:>14.8g} {result.bic[i]:>14.8g} {result.icl[i]:>14.8g} {result.iterations[i]:>10}")
    by_bic, by_icl = result.best("BIC"), result.best("ICL")
    edge = (" (the largest rank tried: a larger one may do better)"
            if result.ranks[-1] in (by_bic, by_icl) and result.ranks[-1] < min(p, n - 1) else "")
    print(f"rank chosen by BIC: {by_bic}; by ICL: {by_icl}{edge}")
    capped = int(np.sum(result.iterations >= maxiter))
    if capped:
        print(f"({capped} of {len(result.ranks)} members stopped at --maxiter {maxiter}, not by the criterion: their "
              "ELBO is where that many iterations take it, as pyPLNmodels reports it)")


def _print_bootstrap(result: BootstrapResult, data: pln.PlnData, intercept: bool) -> None:
    n, p, d = data.shape
    n_boot = result.coefs.shape[0]
    print(f"PLN bootstrap of {n} samples × {p} counts, {d} covariate(s): {n_boot} refits on rows drawn with "
          f"replacement (seed {result.seed}) and the fit of all rows, as one program: program {result.program}; "
          f"fit {result.seconds['fit']:.3f} s")
    lo, hi = 50 * (1 - result.level), 50 * (1 + result.level)
    print(f"{100 * result.level:g} % percentile intervals of the coefficients B (the fit of all rows; the {lo:g} % "
          f"and {hi:g} % quantiles of the {n_boot} refits):")
    names = _covariate_names(d, intercept)
    width = max(9, *map(len, names))
    print(f"{'covariate':>{width}} {'column':>6} {'B':>11} {f'{lo:g} %':>11} {f'{hi:g} %':>11}")
    for k in range(d):
        for j in range(p):
            print(f"{names[k]:>{width}} {j:>6} {result.coef[k, j]:>11.5g} {result.low[k, j]:>11.5g} "
                  f"{result.high[k, j]:>11.5g}")
    inside = int(np.sum((result.coef >= result.low) & (result.coef <= result.high)))
    print(f"{inside} of {d * p} coefficients of the fit of all rows lie inside their interval")


def main(argv: list[str] | None = None) -> int:
    """Run the command; return its exit status (0 fitted, 2 bad input, 1 the fit or writing --out failed)."""
    args = parser().parse_args(argv)
    stamps = [time.perf_counter()]
    try:
        check_tol(args.tol)
        check_maxiter(args.maxiter)
        if args.out is not None:
            check_out(args.out)
        ranks = parse_ranks(args.ranks) if args.ranks is not None else None
        n_boot = check_bootstrap(args.bootstrap) if args.bootstrap is not None else None
        if ranks is not None and n_boot is not None:
            raise ValueError("--ranks and --bootstrap are two different fits: give one of them")
        if args.seed is not None and n_boot is None:
            raise ValueError("--seed is the seed of --bootstrap's samples: give it with --bootstrap B")
        seed = check_seed(args.seed) if args.seed is not None else 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data = read_data(args.counts, args.offsets, args.covariates, intercept=not args.no_intercept)
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
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            if collection is not None:
                result: Any = fit_ranks(data, collection, args.maxiter, args.tol, **options)
            elif boot is not None:
                result = fit_bootstrap(data, boot, args.maxiter, args.tol, **options)
            else:
                result = fit(data, args.maxiter, args.tol, **options)
    except (FloatingPointError, ValueError) as err:
        _say(caught, "warning")
        return _fail(f"the fit failed: {err}", 1)
    except MemoryError:
        return _fail("the fits do not fit in memory at once: give fewer ranks or refits", 1)
    _say(caught, "warning")
    n, p, d = data.shape
    stages = _stages(stamps, result.seconds, result.program)
    if isinstance(result, RanksResult):
        if args.json:
            print(json.dumps(dict(ranks=result.ranks, ELBO=result.elbo.tolist(), BIC=result.bic.tolist(),
                                  ICL=result.icl.tolist(), iterations=result.iterations.tolist(),
                                  best_BIC=result.best("BIC"), best_ICL=result.best("ICL"), program=result.program,
                                  stages=stages)))
        else:
            _print_ranks(result, data, args.maxiter)
        write = write_ranks
    elif isinstance(result, BootstrapResult):
        if args.json:
            print(json.dumps(dict(refits=int(result.coefs.shape[0]), seed=result.seed, level=result.level,
                                  B=result.coef.tolist(), low=result.low.tolist(), high=result.high.tolist(),
                                  program=result.program, stages=stages)))
        else:
            _print_bootstrap(result, data, intercept=not args.no_intercept)
        write = write_bootstrap
    else:
        if args.json:
            print(json.dumps(dict(elbo=result.elbo, iterations=len(result.elbos), program=result.program, stages=stages)))
        else:
            stop = "criterion below tol" if abs(result.criterion) < args.tol else f"maxiter {args.maxiter} reached"
            print(f"PLN fit of {n} samples × {p} counts, {d} covariate(s): ELBO {result.elbo:.6g} after "
                  f"{len(result.elbos)} iterations ({stop}); program {result.program}; fit {result.seconds['fit']:.3f} s")
        write = write_result
    if args.out:
        try:
            write(result, args.out)
        except OSError as err:
            return _fail(f"could not write {args.out} ({err.strerror or err}); it is as it was before this run", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
