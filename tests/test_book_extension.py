"""_ext/fastjax_book.py, the book's Sphinx extension: the repository its buttons open, and its Colab links."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT
from fastjax.setup import colab

pytest.importorskip("sphinx", reason="the book's extension needs Sphinx (the pinned leg's book extra)")
sys.path.insert(0, str(ROOT / "_ext"))
import fastjax_book  # noqa: E402
from sphinx.errors import ExtensionError  # noqa: E402

DEFAULT = "https://github.com/fastjax-book/fastjax"


def configured(monkeypatch, value: str | None, url: str = DEFAULT):
    """A Sphinx app and config as Jupyter Book makes them from _config.yml, after the extension's config-inited."""
    if value is None:
        monkeypatch.delenv(colab.REPOSITORY_ENV, raising=False)
    else:
        monkeypatch.setenv(colab.REPOSITORY_ENV, value)
    config = SimpleNamespace(html_theme_options={"repository_url": url} if url else {})
    app = SimpleNamespace(config=config)
    fastjax_book.follow_repository(app, config)
    return app


def test_a_local_build_keeps_config_yml_s_repository(monkeypatch):
    app = configured(monkeypatch, None)
    assert app.config.html_theme_options["repository_url"] == DEFAULT
    source = [f"git clone {DEFAULT}"]
    fastjax_book.name_repository_in_pages(app, "chapters/workshop", source)
    assert source == [f"git clone {DEFAULT}"]


def test_a_forks_build_opens_the_fork_and_names_it_in_pages(monkeypatch):
    app = configured(monkeypatch, "someone/fork")
    assert app.config.html_theme_options["repository_url"] == "https://github.com/someone/fork"
    source = [f"git clone {DEFAULT}\n[issues]({DEFAULT}/issues)"]
    fastjax_book.name_repository_in_pages(app, "chapters/workshop", source)
    assert source == ["git clone https://github.com/someone/fork\n[issues](https://github.com/someone/fork/issues)"]
    url = fastjax_book.colab_notebook_url("https://colab.research.google.com", app.config.html_theme_options["repository_url"],
                                          "", "chapters/pln/00-model")
    assert url == "https://colab.research.google.com/github/someone/fork/blob/notebooks/chapters/pln/00-model.ipynb"


def test_a_bad_repository_stops_the_build_with_its_name(monkeypatch):
    with pytest.raises(ExtensionError, match="FASTJAX_REPOSITORY must be OWNER/NAME"):
        configured(monkeypatch, "not a repository")


def test_no_repository_url_no_buttons_to_follow(monkeypatch):
    app = configured(monkeypatch, "someone/fork", url="")
    assert app.config.html_theme_options == {}


def test_colab_links_need_a_github_repository():
    with pytest.raises(ExtensionError, match="repository.url must be https://github.com/ORG/REPO"):
        fastjax_book.colab_notebook_url("https://colab.research.google.com", "https://gitlab.com/a/b", "", "x")
