"""fastjax.pln.first_result_report: what the first-result page reads off a race, on a made-up race."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastjax import pln
from fastjax.pln import first_result_report as report
from fastjax.tools.timing import Ratio


def contender(kind, wall, elbo, first=False, first_ever=False, speedup=None):
    r = {"kind": kind, "first": first, "first_ever": first_ever, "wall": wall, "wall_quartiles": (wall, wall),
         "cpu": wall, "peak_mib": 100.0, "threads": "1",
         "runs": [{"printed": {"elbo": elbo, "iterations": 12}}]}
    if speedup is not None:
        r["speedup"] = speedup
        r["speedup_ratio"] = Ratio("pyPLNmodels", kind, speedup)
    return r


RES = {"n": 116, "p": 114, "rounds": 1,
       "contenders": {"pyPLNmodels": contender("pyplnmodels", 4.0, -100.0),
                      "book": contender("book", 2.0, -100.0 * (1 + pln.TARGET_GAP / 2), speedup=2.0),
                      "command, first run": contender("command", 1.5, -100.0, first=True, speedup=2.5)}}
CHOSEN = [SimpleNamespace(name=name, compile_options=None) for name in RES["contenders"]]


def test_row_finds_a_contender_by_kind_or_none():
    assert report.row(RES, "command", True, chosen=CHOSEN)[0] == "command, first run"
    assert report.row(RES, "command", chosen=CHOSEN) == (None, None)


def test_said_fills_in_or_says_the_whole_other_sentence():
    assert report.said(RES, CHOSEN, "{a} and {b}", "no", a=("book",), b=("pyplnmodels",)) == "2.00 s and 4.00 s"
    assert report.said(RES, CHOSEN, "{a}", "not raced here", a=("persistent",)) == "not raced here"


def test_against_pypln_reads_the_ratio_either_way():
    assert report.against_pypln(RES["contenders"]["book"]) == "ran 2.0× as fast as pyPLNmodels' script"
    slow = contender("book", 8.0, -100.0, speedup=0.5)
    assert report.against_pypln(slow) == "took 2.0× the time of pyPLNmodels' script"
    assert "no torch" in report.against_pypln(RES["contenders"]["pyPLNmodels"])
    busy = dict(slow, speedup_ratio=Ratio("pyPLNmodels", "book", None, why="2 cores busy"))
    assert "busy (2 cores busy)" in report.against_pypln(busy)


def test_the_table_has_a_row_per_contender():
    assert report.table(RES).count("\n") >= 1 + len(RES["contenders"])


def test_check_same_elbo_passes_within_the_gap_and_raises_beyond_it():
    assert "3 fitting scripts" in report.check_same_elbo({1: RES}, "pyplnmodels")[0]
    apart = {"n": 116, "contenders": {"pyPLNmodels": contender("pyplnmodels", 4.0, -100.0),
                                      "book": contender("book", 2.0, -100.0 * (1 + 2 * pln.TARGET_GAP))}}
    with pytest.raises(AssertionError, match="not the same fit"):
        report.check_same_elbo({1: apart}, "pyplnmodels")


def test_stage_sums_the_stages_by_prefix_and_pypln_said_reads_them():
    staged = {"pyPLNmodels' script": [("import torch", 1.0), ("import pyPLNmodels", 0.5), ("fit", 2.0)]}
    assert report.stage(staged, "pyPLNmodels' script", "import") == 1.5
    assert report.stage(staged, "missing", "import") == 0
    runs = {"runs": [{"printed": {"fit_imported_torch_dynamo": True}}]}
    said = report.pypln_said(staged, runs)
    assert "imports take 1.50 s" in said and "fit 2.00 s" in said and "imported `torch._dynamo`" in said
    assert "did not run" in report.pypln_said(staged, None)


def test_imports_beyond_counts_each_new_module_once_by_package():
    rows = [SimpleNamespace(name="jax", own=1.0), SimpleNamespace(name="optax", own=0.2),
            SimpleNamespace(name="optax.tree", own=0.1), SimpleNamespace(name="fastjax", own=0.05)]
    assert report.imports_beyond(rows, {"jax"}) == pytest.approx({"optax": 0.3, "fastjax": 0.05})
