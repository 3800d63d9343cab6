"""Every tolerance in src/, chapters/ and tests/ has a row in notes/TOLERANCES.md saying what it compares
and why the bound is what it is; a new tolerance without a row, or a row whose tolerance is gone, fails."""

from __future__ import annotations

import re

from tolerance_sites import TABLE, sites, table_rows

KINDS = {"float64", "derived", "same program", "exact", "measured", "not rounding"}


def test_every_tolerance_has_a_row():
    missing = sorted(set(sites()) - table_rows())
    assert not missing, ("tolerances without a row in notes/TOLERANCES.md (file | tolerance | compares | kind | why):\n"
                         + "\n".join(f"| `{f}` | `{k}` | | | |" for f, k in missing))


def test_every_row_names_a_tolerance_that_exists():
    stale = sorted(table_rows() - set(sites()))
    assert not stale, f"rows of notes/TOLERANCES.md whose tolerance is no longer in that file: {stale}"


def test_every_row_says_what_it_compares_and_why():
    bad = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))] if line.startswith("| `") else []
        if cells and "/" not in cells[0]:  # the header's table of kinds
            continue
        if cells and (len(cells) != 5 or cells[3] not in KINDS or len(cells[2]) < 8 or len(cells[4]) < 15):
            bad.append(line)
    assert not bad, f"rows need 5 cells, a kind from {sorted(KINDS)} and real text:\n" + "\n".join(bad)


def test_the_finder_sees_each_kind_of_tolerance(tmp_path, monkeypatch):
    import tolerance_sites as T

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("FOO_RTOL = 1e-3\nnp.testing.assert_allclose(a, b, rtol=f(x, y), atol=0)\n"
                                          "assert gap <= 2e-5, gap\n# rtol=1 in a comment\nelbo_rtol = 3e-9 * k\n")
    monkeypatch.setattr(T, "ROOT", tmp_path)
    assert set(T.sites()) == {("src/m.py", "FOO_RTOL = 1e-3"), ("src/m.py", "rtol=f(x, y)"), ("src/m.py", "atol=0"),
                              ("src/m.py", "assert <= 2e-5"), ("src/m.py", "elbo_rtol = 3e-9 * k")}
