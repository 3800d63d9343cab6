"""Find every tolerance in the sources: the keyword arguments rtol=, atol=, rel=, abs= (numpy, pytest.approx,
fastjax.exercises.same_arrays), constants and variables whose name says tolerance (…RTOL, …ATOL, …TOL, TOLERANCE, …_GAP,
…BAND, SLOW_FACTOR, …GROWTH; …rtol, …atol, …tol), and literal bounds in asserts (``assert gap < 1e-5``). tests/test_tolerances.py checks
that each one has a row in notes/TOLERANCES.md. ``python tests/tolerance_sites.py`` prints the sites."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "notes" / "TOLERANCES.md"
KEYWORD = re.compile(r"\b(rtol|atol|rel|abs)=(?!=)")  # a keyword argument (an assignment has spaces: LOCAL)
CONSTANT = re.compile(r"^\s*((?:[A-Z][A-Z0-9_]*_)?(?:RTOL|ATOL|TOL|TOLERANCE|GAP|BAND|SLOW_FACTOR|GROWTH)(?:_[A-Z0-9_]+)?"
                      r"(?:\s*,\s*[A-Z][A-Z0-9_]*)*)\s*(?::[^=]+)?=\s*(.+?)\s*(?:#.*)?$")
LOCAL = re.compile(r"^\s*([a-z][a-z0-9_]*(?:rtol|atol|tol)[0-9]*)\s+=\s+(.+?)\s*(?:#.*)?$")  # elbo_rtol = ...
ASSERT_BOUND = re.compile(r"^\s*assert\b.*?(<=|<|>=|>)\s*(-?\d+(?:\.\d+)?e-?\d+)")


def _expression(text: str, start: int) -> str:
    """The argument expression starting at ``text[start]``: up to the first , or ) at depth 0."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        i += 1
    return " ".join(text[start:i].split())


def source_files() -> list[Path]:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "chapters").rglob("*.md"), *(ROOT / "tests").glob("*.py")]
    return sorted(p for p in files if p.name not in ("tolerance_sites.py", "test_tolerances.py"))


def sites() -> dict[tuple[str, str], list[int]]:
    """{(file, tolerance as written): [line numbers]} over every source file."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in source_files():
        rel = str(path.relative_to(ROOT))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0] if path.suffix == ".py" or not line.lstrip().startswith("#") else ""
            if line.lstrip().startswith("#"):
                continue
            keys = [f"{m.group(1)}={_expression(code, m.end())}" for m in KEYWORD.finditer(code)]
            m = CONSTANT.match(code) or LOCAL.match(code)
            if m:
                keys.append(f"{' '.join(m.group(1).split())} = {m.group(2).strip()}")
            m = ASSERT_BOUND.match(code)
            if m:
                keys.append(f"assert {m.group(1)} {m.group(2)}")
            for key in keys:
                found.setdefault((rel, key), []).append(n)
    return found


def table_rows() -> set[tuple[str, str]]:
    """The (file, tolerance) pairs that notes/TOLERANCES.md gives a row."""
    rows = set()
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 4 and cells[0].startswith("`") and "/" in cells[0] and cells[1].startswith("`"):
            rows.add((cells[0].strip("`"), cells[1].strip("`").replace("\\|", "|")))
    return rows


if __name__ == "__main__":
    for (f, key), lines in sorted(sites().items()):
        print(f"{f}\t{key}\t{','.join(map(str, lines))}")
