"""Every chapter of _toc.yml executed once, top to bottom, in a fresh kernel (phase 1 of the suite).

Each chapter is converted from MyST markdown with jupytext and run with nbclient, in its own folder,
the way the book build runs it. The executed notebook is kept in ``_build/executed/`` and marked so
that the book build of tests/test_site.py (phase 2) renders it without running it again: one
execution per chapter per test run. Pages that read what other chapters saved (the Results page)
are executed by that build instead, after them.
"""

from __future__ import annotations

import os
import re
from importlib.util import find_spec
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from conftest import EXECUTED, ROOT, toc_files

CELL_TIMEOUT = 600  # seconds per cell
NOTEBOOK_TIMEOUT = 900  # seconds per chapter (pytest-timeout)
# Pages that read what other chapters saved run in the build (phase 2), after them: the Results page
# (pln/07 and resnet/07's ladders), the workshop page (every practice page's recorded run times)
BUILD_EXECUTES = {"chapters/results", "chapters/workshop"}
# Pages that race another library (pyPLNmodels, PyTorch): marked ``races``, and scripts/run-tests.sh runs
# them alone, one at a time, after the other pages (two pages at once on two cores would time each race
# beside another page, and the races' witness would then, rightly, publish no ratio).
RACES = {"chapters/pln/07-results", "chapters/floor/04-first-result", "chapters/resnet/08-pytorch",
         "chapters/many/01-pca-collection", "chapters/many/02-bootstrap", "chapters/many/03-resnet-sweep",
         "chapters/scale/01-single-cell"}


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def part(page: str) -> str:
    """The xdist group of a page: its part folder, so that each part runs in order on one worker."""
    parts = Path(page).parts
    return parts[1] if len(parts) > 2 else "pages"


def kernel_env() -> dict[str, str]:
    """This environment without the CPU fix that fastjax set in this process: each chapter sets it itself."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "ynn_fusion_type" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, as in the book build
    return env


def unraised(nb) -> list[int]:
    """Indices of code cells tagged raises-exception that did not raise."""
    return [i for i, c in enumerate(code_cells(nb)) if "raises-exception" in c.metadata.get("tags", [])
            and not any(o.get("output_type") == "error" for o in c.get("outputs", []))]


def wrongly_raised(nb) -> list[str]:
    """One line per code cell tagged raises-exception whose error is not the class its ``raises``
    option names (``:raises: ValueError`` under the tag), or that names none: a cell that fails on
    purpose must fail the way the page says, not with any error at all."""
    out = []
    for i, c in enumerate(code_cells(nb)):
        if "raises-exception" not in c.metadata.get("tags", []):
            continue
        want = c.metadata.get("raises")
        errors = [o.get("ename") for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if not want:
            out.append(f"code cell {i + 1}: tagged raises-exception without a ':raises: ExceptionClass' line")
        elif errors and errors[0] != want:
            out.append(f"code cell {i + 1}: raised {errors[0]}, but its ':raises:' line says {want}")
    return out


def numpy_glues(nb) -> list[str]:
    """Names of glued values that are NumPy scalars: under NumPy 2 their text is ``np.float64(...)``,
    which a ``{glue:text}`name:.2f``` role cannot format (the book build fails with -W). Glue ``float(x)``."""
    out = []
    for c in code_cells(nb):
        for o in c.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            text = o.get("data", {}).get("application/papermill.record/text/plain", "")
            if name and isinstance(text, str) and text.startswith("np."):
                out.append(f"{name} = {text}")
    return out


def execute(page: str) -> nbformat.NotebookNode:
    """Run ``page`` top to bottom in a fresh kernel, in its folder; return the executed notebook."""
    nb = jupytext.read(ROOT / f"{page}.md")
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str((ROOT / page).parent)}})
    client.execute(env=kernel_env())
    return nb


def test_the_pages_that_race_another_library_are_marked_to_run_alone():
    racing = {page for page in toc_files()
              if re.search(r"time_interleaved\(.*threads=|torch_threads\(\)|first_result\.race\(|bench_pln\.race\(|"
                           r"pca_race\(|bootstrap_race\(|race_step\(",
                           (ROOT / f"{page}.md").read_text(), re.S)}
    assert racing - {"chapters/measuring"} <= RACES, f"races not run alone: {sorted(racing - RACES)}"
    assert RACES <= set(toc_files())


def test_every_chapter_is_in_the_toc():
    on_disk = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "chapters").rglob("*.md")}
    listed = set(toc_files())
    assert on_disk - listed == set(), "chapters missing from _toc.yml"
    assert listed - on_disk == set(), "_toc.yml names files that do not exist"


def test_no_chapter_source_carries_the_colab_install_cell():
    for page in toc_files():
        assert "FASTJAX_FORCE_INSTALL" not in (ROOT / f"{page}.md").read_text(), f"{page}: install cell in the source"


def test_wrongly_raised_finds_a_cell_that_failed_another_way_or_names_no_class():
    def cell(ename, raises):
        c = nbformat.v4.new_code_cell("f()", metadata={"tags": ["raises-exception"]})
        if raises:
            c.metadata["raises"] = raises
        c.outputs = [nbformat.v4.new_output("error", ename=ename, evalue="", traceback=[])]
        return c

    nb = nbformat.v4.new_notebook(cells=[cell("ValueError", "ValueError"), cell("NameError", "ValueError"),
                                         cell("ValueError", None)])
    found = wrongly_raised(nb)
    assert len(found) == 2 and "raised NameError, but its ':raises:' line says ValueError" in found[0]
    assert "without a ':raises: ExceptionClass' line" in found[1]


def test_every_raises_cell_in_the_sources_names_its_class():
    missing = [f"{page}: code cell {i + 1}" for page in toc_files()
               for i, c in enumerate(code_cells(jupytext.read(ROOT / f"{page}.md")))
               if "raises-exception" in c.metadata.get("tags", []) and not c.metadata.get("raises")]
    assert missing == [], "tagged raises-exception without ':raises: ExceptionClass': " + ", ".join(missing)


def test_numpy_glues_finds_a_glued_numpy_scalar():
    def glued(name, text):
        c = nbformat.v4.new_code_cell("glue(...)")
        c.outputs = [nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": text},
                                            metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}})]
        return c

    nb = nbformat.v4.new_notebook(cells=[glued("a", "np.float64(1.5)"), glued("b", "1.5"), glued("c", "'np.x'")])
    assert numpy_glues(nb) == ["a = np.float64(1.5)"]


def test_unraised_finds_a_tagged_cell_that_did_not_raise():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1", metadata={"tags": ["raises-exception"]}),
                                         nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception"]})])
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="", traceback=[])]
    assert unraised(nb) == [0]


@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("page", [pytest.param(p, marks=[pytest.mark.xdist_group(part(p)),
                                                         *([pytest.mark.races] if p in RACES else [])])
                                  for p in toc_files() if p not in BUILD_EXECUTES])
def test_chapter_executes(page):
    if not code_cells(jupytext.read(ROOT / f"{page}.md")):
        pytest.skip("a page without code")
    try:
        nb = execute(page)
    except CellExecutionError as err:
        if find_spec("torch") is None and re.search(r"No module named '(torch|pyPLNmodels)", str(err)):
            pytest.skip(f"{page} needs torch, which this leg does not install")
        pytest.fail(f"{page}: a cell failed\n{err}", pytrace=False)
    silent = [i + 1 for i in unraised(nb)]
    assert silent == [], f"{page}: code cells {silent} (counting from 1) are tagged raises-exception but did not raise"
    wrong = wrongly_raised(nb)
    assert wrong == [], f"{page}: " + "; ".join(wrong)
    glued = numpy_glues(nb)
    assert glued == [], f"{page}: NumPy scalars glued (glue float(x) instead): " + ", ".join(glued)
    # keep it for the book build (phase 2), which must render it without executing it again
    nb.metadata["mystnb"] = {"execution_mode": "off"}
    target = EXECUTED / f"{page}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)


def test_the_test_command_runs_the_racing_pages_alone_after_the_others_for_the_book():
    """The pinned leg's notebooks make the book: its racing pages run alone, after the others. The newest
    leg only checks that every page runs, so its racing pages share the parallel phase."""
    script = (ROOT / "scripts" / "run-tests.sh").read_text()
    assert '-m "not site and not races"' in script, "the pinned leg's parallel phase must leave the racing pages out"
    assert 'alone -m "races and not site"' in script
    assert "-p no:xdist" in script  # one page at a time
    assert '-m "not site and not pinned" "$@"' in script  # the newest leg: every page, two at a time
