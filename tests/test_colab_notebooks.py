"""``python -m fastjax.colab OUT``: every chapter as the notebook Colab opens, the install cell first."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT, toc_files
from fastjax import colab


def test_every_page_becomes_a_notebook_whose_first_cell_installs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fastjax.colab", str(tmp_path)], cwd=ROOT / "chapters",
                         capture_output=True, text=True, timeout=120, check=True)
    pages = toc_files()
    assert len(out.stdout.splitlines()) == len(pages)
    for page in pages:
        nb = nbformat.read(tmp_path / f"{page}.ipynb", as_version=4)
        assert nb.cells[0].source == colab.INSTALL_CELL, page
        assert "jupytext" not in nb.metadata  # a plain notebook
        source = (ROOT / f"{page}.md").read_text()
        assert nb.cells[1].source.strip() in source  # then the chapter, as written


def test_install_cell_is_valid_python_that_does_nothing_outside_colab():
    scope: dict = {}
    exec(compile(colab.INSTALL_CELL, "<install cell>", "exec"), scope)  # not Colab, not forced: no pip
    assert "pins" not in scope


def test_find_root_names_the_problem_outside_a_checkout(tmp_path):
    with pytest.raises(FileNotFoundError, match="_toc.yml"):
        colab.find_root(tmp_path)
