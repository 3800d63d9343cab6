"""``python -m fastjax.setup.colab OUT``: every chapter as the notebook Colab opens, the install cell first."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
import yaml

from conftest import ROOT, toc_files
from fastjax.setup import colab


def test_every_page_becomes_a_notebook_whose_first_cell_installs(tmp_path, monkeypatch):
    monkeypatch.delenv(colab.REPOSITORY_ENV, raising=False)
    out = subprocess.run([sys.executable, "-m", "fastjax.setup.colab", str(tmp_path)], cwd=ROOT / "chapters",
                         capture_output=True, text=True, timeout=120, check=True)
    pages = toc_files()
    assert len(out.stdout.splitlines()) == len(pages)
    for page in pages:
        nb = nbformat.read(tmp_path / f"{page}.ipynb", as_version=4)
        assert nb.cells[0].source == colab.install_cell(), page
        assert "jupytext" not in nb.metadata  # a plain notebook
        source = (ROOT / f"{page}.md").read_text()
        assert nb.cells[1].source.strip() in source  # then the chapter, as written


def test_install_cell_is_valid_python_that_does_nothing_outside_colab():
    scope: dict = {}
    exec(compile(colab.install_cell(), "<install cell>", "exec"), scope)  # not Colab, not forced: no pip
    assert "pins" not in scope


def test_find_root_names_the_problem_outside_a_checkout(tmp_path):
    with pytest.raises(FileNotFoundError, match="_toc.yml"):
        colab.find_root(tmp_path)


DEFAULT = "https://github.com/fastjax-book/fastjax"  # _config.yml's repository.url (checked below)


def test_the_repository_is_config_yml_s_unless_fastjax_repository_names_one(monkeypatch):
    monkeypatch.delenv(colab.REPOSITORY_ENV, raising=False)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert colab.repository_url(root=ROOT) == colab.config_repository_url(ROOT) == config["repository"]["url"] == DEFAULT
    assert colab.repository_url("https://github.com/a/b") == "https://github.com/a/b"
    for value in ("someone/fork", "https://github.com/someone/fork", "https://github.com/someone/fork.git",
                  "https://github.com/someone/fork/", " someone/fork\n"):
        monkeypatch.setenv(colab.REPOSITORY_ENV, value)
        assert colab.repository_url(root=ROOT) == "https://github.com/someone/fork", value
    monkeypatch.setenv(colab.REPOSITORY_ENV, "")
    assert colab.repository_url(root=ROOT) == DEFAULT  # empty: the default, as for a local build


@pytest.mark.parametrize("value", ["fork", "https://gitlab.com/a/b", "a/b/c", "a b/c", "http://github.com/a/b"])
def test_a_repository_that_is_not_owner_name_is_refused(monkeypatch, value):
    monkeypatch.setenv(colab.REPOSITORY_ENV, value)
    with pytest.raises(ValueError, match="FASTJAX_REPOSITORY must be OWNER/NAME"):
        colab.repository_url(root=ROOT)


def test_a_forks_notebooks_install_from_the_fork_and_name_it(monkeypatch):
    monkeypatch.setenv(colab.REPOSITORY_ENV, "someone/fork")
    nb = colab.colab_notebook(ROOT / "chapters" / "workshop.md")
    assert 'git+https://github.com/someone/fork"' in nb.cells[0].source
    text = "\n".join(c.source for c in nb.cells)
    assert DEFAULT not in text and "git clone https://github.com/someone/fork" in text
    monkeypatch.delenv(colab.REPOSITORY_ENV)
    nb = colab.colab_notebook(ROOT / "chapters" / "workshop.md")
    assert f'git+{DEFAULT}"' in nb.cells[0].source and f"git clone {DEFAULT}" in "\n".join(c.source for c in nb.cells)


def test_the_default_url_is_written_only_in_config_yml_and_pages():
    """The one place it is set; pages may write it in their text (a fork's build writes the fork's)."""
    tracked = subprocess.run(["git", "grep", "-l", DEFAULT.removeprefix("https://"), "--", ".", ":!tests"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert [f for f in tracked if f != "_config.yml" and not f.startswith("chapters/")] == []
