"""Every chapter in _toc.yml, converted from MyST markdown to .ipynb and executed with nbmake."""

from __future__ import annotations

import jupytext
import nbformat
import pytest
from nbmake.nb_run import NotebookRun

from conftest import ROOT, toc_files
from fastjax.colab import INSTALL_CELL

CHAPTERS = [f for f in toc_files()]
CELL_TIMEOUT = 600  # seconds per cell
NOTEBOOK_TIMEOUT = 900  # seconds per chapter (pytest-timeout)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_every_chapter_is_in_the_toc():
    on_disk = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "chapters").rglob("*.md")}
    listed = set(CHAPTERS)
    assert on_disk - listed == set(), "chapters missing from _toc.yml"
    assert listed - on_disk == set(), "_toc.yml names files that do not exist"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_starts_with_the_install_cell(chapter):
    nb = jupytext.read(ROOT / f"{chapter}.md")
    cells = code_cells(nb)
    if not cells:
        pytest.skip("a page without code")
    assert cells[0].source.strip() == INSTALL_CELL.strip(), "first code cell must be fastjax.colab.INSTALL_CELL"


@pytest.mark.timeout(NOTEBOOK_TIMEOUT)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_executes(chapter, tmp_path):
    nb = jupytext.read(ROOT / f"{chapter}.md")
    if not code_cells(nb):
        pytest.skip("a page without code")
    path = tmp_path / (chapter.replace("/", "__") + ".ipynb")
    nbformat.write(nb, path)
    result = NotebookRun(path, default_timeout=CELL_TIMEOUT).execute()
    if result.error is not None:
        pytest.fail(f"{chapter}: cell {result.error.failing_cell_index} failed\n{result.error.trace}", pytrace=False)
