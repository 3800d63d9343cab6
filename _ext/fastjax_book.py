"""The book's local Sphinx extension: only what stock Jupyter Book settings cannot do.

**Colab links.** Colab cannot open MyST markdown, and sphinx-book-theme always builds its Colab link
to the page's source file, ``{colab_url}/github/{org}/{repo}/blob/{branch}/{page}.md`` (its
``launch_buttons`` settings choose the service and branch, never the file; see
sphinx_book_theme/header_buttons/launch.py). This extension rewrites that link to
``{colab_url}/github/{org}/{repo}/blob/{NOTEBOOKS_BRANCH}/{page}.ipynb``, the notebook that
``.github/workflows/notebooks.yml`` generates (``python -m fastjax.setup.colab``) on every push to main.
The org and repository come from ``repository.url`` in ``_config.yml``.

**The repository.** ``repository.url`` of ``_config.yml`` is the default; ``FASTJAX_REPOSITORY``
(``OWNER/NAME`` or the URL; the workflows set it to the repository they run in) replaces it for the
repository, issues and Colab buttons, so that a fork's site opens the fork
(``fastjax.setup.colab.repository_url`` reads it, for the Colab notebooks too). Page text that writes the
default URL (the workshop's ``git clone``) gets the one in use.

**Scripts.** Sphinx 7.4 writes an inline script twice when an extension adds it after the builder
started (once with filename ``None``, once with ``''``); sphinx-thebe's ``const THEBE_JS_URL = ...``
then throws "already declared" on every page (no setting turns sphinx-thebe's script off while the
launch buttons are on). ``drop_duplicate_scripts`` keeps the first copy.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

NOTEBOOKS_BRANCH = "notebooks"
LAUNCH_GROUP = "launch-buttons"


def colab_notebook_url(colab_url: str, repository_url: str, path_to_docs: str, pagename: str) -> str:
    """The Colab URL of the generated notebook of ``pagename`` on the notebooks branch."""
    parsed = urlparse(repository_url)
    parts = [p for p in parsed.path.split("/") if p]
    if parsed.netloc != "github.com" or len(parts) < 2:
        raise ExtensionError(f"repository.url must be https://github.com/ORG/REPO for Colab links; got {repository_url!r}")
    org, repo = parts[0], parts[1].removesuffix(".git")
    prefix = path_to_docs.strip("/")
    path = f"{prefix}/{pagename}.ipynb" if prefix else f"{pagename}.ipynb"
    return f"{colab_url.rstrip('/')}/github/{org}/{repo}/blob/{NOTEBOOKS_BRANCH}/{path}"


def rewrite_colab_button(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any],
                         doctree: nodes.document | None) -> None:
    """Runs after sphinx-book-theme's ``add_launch_buttons`` (priority 501) on every page."""
    buttons = context.get("header_buttons")
    if not buttons:
        return
    groups = [b for b in buttons if b.get("label") == LAUNCH_GROUP]
    if not groups:
        return
    options = app.config.html_theme_options
    colab_url = options.get("launch_buttons", {}).get("colab_url", "")
    for group in groups:
        for button in group.get("buttons", []):
            if button.get("text") == "Colab":
                button["url"] = colab_notebook_url(colab_url, options["repository_url"],
                                                   options.get("path_to_docs", ""), pagename)
                button["tooltip"] = "Open this chapter as a notebook in Colab"


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any],
                           doctree: nodes.document | None) -> None:
    """Keep one copy of each script (same file or same inline body) in the page's script list."""
    seen, kept = set(), []
    for script in context.get("script_files", []):
        attributes = getattr(script, "attributes", {})
        key = (getattr(script, "filename", script) or "", tuple(sorted(attributes.items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    if "script_files" in context:
        context["script_files"] = kept


def follow_repository(app: Sphinx, config: Any) -> None:
    """On ``config-inited``: the repository in use (``FASTJAX_REPOSITORY``, else ``_config.yml``'s) for every button."""
    from fastjax.setup.colab import repository_url

    options = config.html_theme_options
    default = options.get("repository_url", "")
    if not default:
        return  # no repository buttons
    try:
        options["repository_url"] = repository_url(default)
    except ValueError as e:
        raise ExtensionError(str(e)) from e
    app.fastjax_default_repository = default  # for name_repository_in_pages


def name_repository_in_pages(app: Sphinx, docname: str, source: list[str]) -> None:
    """On ``source-read``: where the repository in use is not the default, page text names the one in use."""
    default = getattr(app, "fastjax_default_repository", "")
    repository = app.config.html_theme_options.get("repository_url", "")
    if default and repository != default:
        source[0] = source[0].replace(default, repository)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", follow_repository)
    app.connect("source-read", name_repository_in_pages)
    app.connect("html-page-context", rewrite_colab_button, priority=600)
    app.connect("html-page-context", drop_duplicate_scripts, priority=600)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
