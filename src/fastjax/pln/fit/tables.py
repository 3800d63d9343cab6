"""Reading and checking the command's input (the counts, offsets and covariates tables), before JAX.

``counts``: a CSV (or TSV) table of counts, samples in rows, species or genes in columns, a ``.npy``
file, or a ``.npz`` file holding ``counts`` and optionally ``offsets`` and ``covariates``. A first row of
names is a header; a first column of names, or a first column with no name in the header (the index
pandas' and R's writers add), holds row names: both are skipped, with a note for the index. A first
column that counts 0, 1, 2, … and a first row that counts k, k+1, k+2, … are refused as an unnamed index
and a header of numeric names (``_check_counts_table``). ``--offsets``: log-offsets of the counts' shape
(as pyPLNmodels takes them: the log of each sample's sequencing depth, say); ``--covariates``: numbers,
one row per sample (an intercept column is added unless ``--no-intercept``); where both files name their
rows, the names must agree. Every problem is a ValueError (or FileNotFoundError) naming the file, the row
or column and what to do.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
import time
import stat
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastjax import checks, pln

MISSING = ("", "NA", "NaN", "nan")  # cells read as missing values (NaN), which the fit refuses
FLOAT32_EXACT = 2**24  # the largest count float32 holds exactly, with every integer below it
# Offsets are logs (of a sample's depth, say): e^25 is 7e10 reads. Larger ones are raw totals, not logs.
OFFSET_LIMIT = 25.0
ID_ROWS = 8  # a first column of counts rising strictly over at least this many rows is read as sample IDs
SETTLE_SECONDS = 2.0  # a text file changed this recently and ending mid-line is checked for growth
# A first header cell that names sample IDs: the column under it holds row names, numbers or not.
ID_WORDS = ("sample", "samples", "sample_id", "sampleid", "#sampleid", "sample id", "id", "ids", "index", "name",
            "names", "barcode", "cell", "cell_id", "run", "accession", "subject")
WHERE = "(rows and columns count the table's numbers from 0, after any header row and row-name column)"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _delimiter(path: Path, first_line: str) -> str | None:
    if path.suffix.lower() in (".tsv", ".tab"):
        return "\t"
    for sep in ("\t", ";", ","):  # a ';' file writes decimals with commas: ';' before ','
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
    before = path.stat()
    data = path.read_bytes()
    if not data.endswith(b"\n") and time.time() - before.st_mtime < SETTLE_SECONDS:
        time.sleep(0.25)  # a file written a moment ago that ends mid-line: is it still being written?
    after = path.stat()
    if len(data) != after.st_size or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise ValueError(f"{path}: the {name} file changed while it was read (is it still being written?): run the "
                         "command once it is complete")
    for magic, kind, fix in ((b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip)"),
                             (b"PK\x03\x04", "a zip archive", "extract the table from it (or name a .npz file .npz)"),
                             (b"\x93NUMPY", "a NumPy .npy file", "give it the suffix .npy")):
        if data.startswith(magic):
            raise ValueError(f"{path}: the {name} file is {kind}, not a text table: {fix}")
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
    columns: list[str] | None = None  # the header's names of the numbers' columns (None: no header)


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
    body = ((k, cells(line)) for k, line in lines)
    second = next(body, (None, None))
    named = lambda c: not _is_number(c) and c not in MISSING  # noqa: E731
    # A header: names after the first cell (a taxon may be named NA, as long as one other name is not a
    # missing value), or numbers after an empty first cell above rows that start with names (pandas'
    # to_csv of a table with an index and numbered columns).
    header = (all(not _is_number(c) for c in (top[1:] or top)) and any(named(c) for c in (top[1:] or top))) or (
        len(top) > 1 and top[0] == "" and second[1] is not None and named(second[1][0]))
    k0, row0 = second if header else (first[0], top)
    rest = body if header else itertools.chain([second] if second[0] is not None else [], body)
    if row0 is None:
        raise ValueError(f"{path}: the {name} file has a header and no rows")
    if header and top[-1] == "" and len(top) == len(row0) + 1:
        raise ValueError(f"{path}: the header (line {first[0]}) ends with an empty name (a separator at its end): "
                         f"delete the last {sep or 'space'!r} of that line")
    if header and len(top) not in (len(row0), len(row0) - 1):
        raise ValueError(f"{path}: the header (line {first[0]}) names {len(top)} columns and row 0 (line {k0}) has "
                         f"{len(row0)} cells: give each column one name")
    index = header and (len(top) == len(row0) - 1 or (top[0] == "" and len(top) == len(row0) > 1))
    ids = header and not index and top[0].strip().lower() in ID_WORDS and len(row0) > 1
    names_column = index or ids or named(row0[0])
    if index:
        warnings.warn(f"{path}: the header does not name the first column: read as row names (the index "
                      f"pandas' to_csv and R's write.csv add), not as {name}", stacklevel=2)
    if ids and _is_number(row0[0]):
        warnings.warn(f"{path}: the first column is named {top[0]!r}: read as the samples' names, not as {name}",
                      stacklevel=2)
    columns = (top if len(top) == len(row0) - 1 else top[1:] if names_column else top) if header else None
    width = len(row0) - names_column
    if width == 0:
        raise ValueError(f"{path}: line {k0} holds no numbers, only {row0[0][:40]!r}: not a table of {name}")
    values: list[list[float]] = []
    names: list[str] = []
    for i, (k, row) in enumerate(itertools.chain([(k0, row0)], rest)):
        if len(row) != width + names_column:
            raise ValueError(f"{path}: {name} row {i} (line {k}) has {len(row)} cells, row 0 has "
                             f"{width + names_column} (a ragged table): give every row the same number of cells")
        if names_column:
            if not (index or ids) and (_is_number(row[0]) or row[0] in MISSING):
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
                comma = sep != "," and re.fullmatch(r"[-+]?[0-9]*,[0-9]+", cell)
                fix = f"a decimal comma: write {cell.replace(',', '.')}" if comma else "fix that cell"
                raise ValueError(f"{path}: {name} holds {cell[:40]!r}, not a number, at row {i}, column {j} "
                                 f"(line {k}) {WHERE}: {fix}") from None
        values.append(out)
    values = np.array(values, dtype=np.float64)
    if not header:
        _numeric_header(path, values, first[0])
    return Table(values, names if names_column else None, header, columns)


def _numeric_header(path: Path, values: np.ndarray, line: int) -> None:
    """Refuse a first row that reads as numbers but is a header of numeric names (OTU IDs, gene IDs): whole
    numbers, all different, each above every number below it in its column (as counts, that happens by
    chance with probability about n⁻ᵖ)."""
    n, p = values.shape
    top = values[0]
    if n < 3 or p < 3 or not np.all(np.isfinite(values)) or np.any(top != np.round(top)):
        return
    consecutive = np.array_equal(top, top[0] + np.arange(p))  # _check_counts_table names that one
    if not consecutive and len(set(top.tolist())) == p and np.all(top > values[1:].max(axis=0)):
        shown = ", ".join(f"{v:.0f}" for v in top[:3])
        raise ValueError(f"{path}: row 0 (line {line}) holds {shown}, …: whole numbers, all different, each above every "
                         "number below it: a header of numeric names (OTU or gene IDs), not a sample. Give the columns "
                         f"names that are not numbers (such as otu{top[0]:.0f}), or delete the row")


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


def _beside_counts(path: Any, what: str, counts: Any) -> tuple[Any, Any]:
    """The path and values of a table read beside the counts (``what``: "offsets" or "covariates"), its rows
    checked against the counts' names where both files name them."""
    path = _regular_file(path, what)
    other = read_table(path, what)
    _same_rows(path, other.names, counts.names, what)
    return path, other.values


def _same_rows(path: Path, names: list[str] | None, count_names: list[str] | None, name: str) -> None:
    """Where ``name``'s file names its rows, the counts file must name them alike."""
    if names is None:
        return
    if count_names is None:
        advice = ("encode a category as 0/1 columns, one per level but one" if name == "covariates" else
                  "log-offsets, one per count")
        raise ValueError(f"{path}: the first column of the {name} holds text ({names[0][:40]!r}, ...), not "
                         f"numbers: {name} must be numbers ({advice}); if it names the samples, give the counts "
                         "file the same first column")
    bad = next((i for i, (a, b) in enumerate(zip(names, count_names)) if a != b), None)
    if bad is not None:
        raise ValueError(f"{path}: row {bad} of the {name} is named {names[bad]!r} where row {bad} of the counts "
                         f"is {count_names[bad]!r}: put both files' rows in the same order")


def _check_counts_table(path: Path, table: Table, y: np.ndarray) -> None:
    """Refuse what is not a table of counts although it reads as one: counts float32 cannot hold, and in a
    text file an unnamed index column and a header of numeric names (consecutive integers)."""
    n, p = y.shape
    first = y[:, 0]
    counting = n >= 3 and any(np.array_equal(first, np.arange(k, n + k)) for k in (0, 1))
    rising = n >= ID_ROWS and bool(np.all(np.diff(first) > 0))  # by chance: 1 in n! (40,320 at 8 rows)
    if table.header is not None and p >= 2 and (counting or rising):
        raise ValueError(f"{path}: column 0 of the counts holds {y[0, 0]:.0f}, {y[1, 0]:.0f}, ..., {y[-1, 0]:.0f} in "
                         "order: an index column (sample IDs), not counts. Delete it (pandas: to_csv(index=False)), "
                         "name it 'sample' in the header, or give the file a header row that leaves that column's "
                         "name empty")
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


class Input(NamedTuple):
    """The input read (``read_input``): the data to fit, the names of the counts' columns as the input has
    them (the header's, else their numbers from 0), and the numbers of those removed for holding only
    zeros (``pln.check_pln_data``)."""

    data: pln.PlnData
    columns: list[str]
    dropped: list[int]

    @property
    def kept(self) -> list[str]:
        """The names of the columns fitted, in the input's order."""
        return [c for j, c in enumerate(self.columns) if j not in set(self.dropped)]


def read_data(counts: str | os.PathLike, offsets: str | os.PathLike | None = None,
              covariates: str | os.PathLike | None = None, intercept: bool = True) -> pln.PlnData:
    """The data of ``read_input``."""
    return read_input(counts, offsets, covariates, intercept).data


def read_input(counts: str | os.PathLike, offsets: str | os.PathLike | None = None,
               covariates: str | os.PathLike | None = None, intercept: bool = True) -> Input:
    """Read and check the input files; return float64 ``PlnData`` (``Input``'s ``data``): ``pln.check_pln_data``'s checks and the
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
        o_path, o = _beside_counts(offsets, "offsets", table)
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
        x_path, x = _beside_counts(covariates, "covariates", table)
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
    columns = table.columns if table.columns is not None and len(table.columns) == p else [str(j) for j in range(p)]
    return Input(pln.check_pln_data(y, o, x), columns, np.flatnonzero(y.sum(axis=0) == 0).tolist())


def _enough_samples(path: Path, n: int, d: int) -> None:
    if n <= d:
        raise ValueError(f"{path}: {n} sample(s) for {d} covariate column(s), the intercept included: a fit needs "
                         f"more samples than covariates, at least {d + 1}")

