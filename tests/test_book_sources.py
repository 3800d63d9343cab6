"""The book build reads exactly the pages of _toc.yml, whatever else lies in the folder.

README's two commands leave virtual environments (.venv, .venv312), tools (.tools) and build output
beside the book; a build after the tests once read .venv312's packages' .md and .rst files as pages
and failed. Here Sphinx is set up with the book's real configuration (as jupyter-book makes it) in a
folder holding a stub of every page of _toc.yml and such decoys, and asked which documents it found.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import ROOT, toc_files

DECOYS = (".venv312/lib/python3.12/site-packages/pkg/README.md", ".venv312/lib/python3.12/header0.rst",
          ".venv/share/doc/x.md", ".tools/node_modules/a/README.md", "node_modules/b/README.md",
          "_build/html/_sources/c.md", "notes/d.md", "stray/notes.md", ".hidden.md", "chapters/.ipynb_checkpoints/e.md")


def test_a_build_reads_the_pages_of_the_toc_and_nothing_else(tmp_path: Path):
    pytest.importorskip("jupyter_book", reason="the book build is installed in the pinned leg")
    from jupyter_book.config import get_final_config
    from sphinx.application import Sphinx

    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "_ext", tmp_path / "_ext")
    for page in toc_files():
        path = tmp_path / f"{page}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {page}\n")
    for decoy in DECOYS:
        path = tmp_path / decoy
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# not a page\n\ntext\n")
    config, _ = get_final_config(user_yaml=tmp_path / "_config.yml", cli_config={"latex_individualpages": False},
                                 sourcedir=tmp_path)
    app = Sphinx(srcdir=str(tmp_path), confdir=None, outdir=str(tmp_path / "_out"),
                 doctreedir=str(tmp_path / "_doctrees"), buildername="dummy", confoverrides=config,
                 status=None, warning=None)
    app.env.find_files(app.config, app.builder)
    found = set(app.env.found_docs)
    assert found - set(toc_files()) == set(), "the build would read files that are not pages of _toc.yml"
    assert set(toc_files()) - found == set(), "the build would miss pages of _toc.yml"
