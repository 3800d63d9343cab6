"""fastjax.pln.fit on generated tables (Hypothesis, issue 37 item 5): one clean table of counts written in
many harmless ways (separators, headers, row names, pandas' index, quotes, line ends, a byte-order mark,
padding, number formats, an offsets file of zeros), with at most one bad mutation in one of the three files
(a bad cell, a ragged row, another encoding, an index column, a numeric header, one row, huge and tiny
values, raw or missing offsets, text, constant or missing covariates). The command, run in this process
through its ``main``, must fit with the clean table's ELBO to the bit when nothing is bad, and exit 2 with
a message naming the bad file when something is: never a traceback, never another answer."""

from __future__ import annotations

import io
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import fastjax  # noqa: F401
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from fastjax.pln import fit as fitcmd  # noqa: E402

COUNTS = np.random.default_rng(3).poisson(3.0, size=(12, 4))
MAXITER = 20  # a short fit: the same program for every harmless table
BAD_CELLS = ["x", "-1", "2.5", "nan", "", "NA", "inf", "1e30", str(2**24 + 1), "1e-30", "0x3", "3 4"]
TABLE_BAD = ["cell", "ragged", "latin1", "utf16", "index", "numeric_header", "one_row"]
OFFSETS_BAD = ["raw", "nan", "shape"]
COVARIATES_BAD = ["text", "constant", "nan", "rows"]
MUTATIONS = ([("nowhere", None)] + [("counts", b) for b in TABLE_BAD] + [("offsets", b) for b in OFFSETS_BAD]
             + [("covariates", b) for b in COVARIATES_BAD])
EXAMPLES = {None: 60, "cell": 60, "ragged": 20}  # examples per mutation; 10 for the others


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = fitcmd.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("property") / "cache"


@pytest.fixture(scope="module")
def clean_elbo(cache, tmp_path_factory):
    path = tmp_path_factory.mktemp("clean") / "c.csv"
    np.savetxt(path, COUNTS, fmt="%d", delimiter=",")
    code, out, err = run([str(path), "--cache", str(cache), "--maxiter", str(MAXITER), "--json"])
    assert code == 0, err
    return json.loads(out)["elbo"]


@st.composite
def tables(draw, where, bad):
    sep = draw(st.sampled_from([",", "\t", ";", " ", "  "]))
    header = draw(st.sampled_from(["none", "names", "quoted"] if sep == "," else ["none", "names"]))
    rows = draw(st.sampled_from(["none", "names"] + (["pandas"] if header != "none" and sep.strip() else [])))
    style = dict(sep=sep, header=header, rows=rows, crlf=draw(st.booleans()), bom=draw(st.booleans()),
                 pad=draw(st.booleans()) and bool(sep.strip()), number=draw(st.sampled_from(["{:d}", "{:.1f}", "{:d}e0"])),
                 blank=draw(st.booleans()), zero_offsets=draw(st.booleans()))
    if bad == "cell":
        bad = ("cell", draw(st.integers(0, COUNTS.shape[0] - 1)), draw(st.integers(0, COUNTS.shape[1] - 1)),
               draw(st.sampled_from(BAD_CELLS)))
    elif bad == "ragged":
        bad = ("ragged", draw(st.integers(0, COUNTS.shape[0] - 1)), draw(st.sampled_from(["drop", "add"])))
    return style, where, bad


def counts_text(style, bad) -> bytes:
    """The clean counts written in ``style``, with the bad mutation ``bad`` (a counts one) if any."""
    n, p = COUNTS.shape
    cells = [[style["number"].format(int(v)) for v in row] for row in COUNTS]
    names = [f"g{j}" for j in range(p)]
    kind = bad[0] if isinstance(bad, tuple) else bad
    if kind == "cell":
        cells[bad[1]][bad[2]] = bad[3]
    elif kind == "ragged":
        cells[bad[1]] = cells[bad[1]][:-1] if bad[2] == "drop" else cells[bad[1]] + ["1"]
    elif kind == "latin1":
        names = [f"espèce{j}" for j in range(p)]
    elif kind == "index":
        cells, names = [[str(i)] + row for i, row in enumerate(cells)], ["idx"] + names
    elif kind == "one_row":
        cells = cells[:1]
    header = style["header"]
    if kind == "numeric_header":
        header, names = "names", [str(101 + j) for j in range(p)]
    elif kind == "latin1" and header == "none":
        header = "names"
    if header == "quoted":
        names = [f'"{name}"' for name in names]
    rows = style["rows"]
    if rows == "names":
        cells = [[f"s{i}"] + row for i, row in enumerate(cells)]
        names = ["sample"] + names
    elif rows == "pandas":
        cells, names = [[str(i)] + row for i, row in enumerate(cells)], [""] + names
    join = (f" {style['sep']} " if style["pad"] else style["sep"]).join
    lines = ([join(names)] if header != "none" else []) + [join(row) for row in cells]
    end = "\r\n" if style["crlf"] else "\n"
    text = end.join(lines) + end + (end * 2 if style["blank"] else "")
    if kind == "utf16":
        return text.encode("utf-16")
    if kind == "latin1":
        return text.encode("latin-1")
    return ("\ufeff" if style["bom"] else "").encode() + text.encode()


def write_inputs(folder: Path, style, where, bad) -> tuple[list[str], Path | None]:
    """The files of one example and the command's arguments; the file that holds the bad mutation."""
    n, p = COUNTS.shape
    suffix = ".tsv" if style["sep"] == "\t" else ".txt" if not style["sep"].strip() else ".csv"
    counts = folder / f"counts{suffix}"
    counts.write_bytes(counts_text(style, bad if where == "counts" else None))
    argv, culprit = [str(counts)], counts if where == "counts" else None
    if where == "offsets" or style["zero_offsets"]:
        offsets = np.zeros((n, p))
        if where == "offsets" and bad == "raw":
            offsets[:] = 20_000
        elif where == "offsets" and bad == "nan":
            offsets[2, 1] = np.nan
        elif where == "offsets" and bad == "shape":
            offsets = offsets[:, 1:]
        np.savetxt(folder / "offsets.csv", offsets, delimiter=",")
        argv += ["--offsets", str(folder / "offsets.csv")]
        culprit = folder / "offsets.csv" if where == "offsets" else culprit
    if where == "covariates":
        path = folder / "covariates.csv"
        x = np.arange(n, dtype=float)[:, None] / n
        if bad == "text":
            path.write_text("".join(f"{'AB'[i % 2]},{x[i, 0]}\n" for i in range(n)))
        else:
            x = np.ones((n, 1)) if bad == "constant" else x[: n - 1] if bad == "rows" else x
            if bad == "nan":
                x[3, 0] = np.nan
            np.savetxt(path, x, delimiter=",")
        argv += ["--covariates", str(path)]
        culprit = path
    return argv, culprit


@pytest.mark.parametrize("where, bad", MUTATIONS, ids=[f"{w}-{b}" for w, b in MUTATIONS])
def test_a_table_fits_as_the_clean_one_or_exits_2_naming_the_bad_file(cache, clean_elbo, where, bad):
    @settings(max_examples=EXAMPLES.get(bad, 10), derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(example=tables(where, bad))
    def check(example):
        style, where, bad = example
        with tempfile.TemporaryDirectory() as folder:
            argv, culprit = write_inputs(Path(folder), style, where, bad)
            code, out, err = run(argv + ["--cache", str(cache), "--maxiter", str(MAXITER), "--json"])
        assert "Traceback" not in err
        if bad is None:
            assert code == 0, err
            assert json.loads(out)["elbo"] == clean_elbo  # the same numbers, the same program: the same bits
        else:
            assert code == 2, (example, out, err)
            assert err.startswith(f"{fitcmd.PROG}: error: {culprit}") and err.count("\n") == 1, err

    check()
