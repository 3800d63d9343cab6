"""The book's local Sphinx extension: Colab links, the workshop schedule, small page fixes.

**Colab.** Colab cannot open MyST markdown. sphinx-book-theme builds its Colab link as
``{colab_url}/github/{org}/{repo}/blob/{branch}/{page}.md``; this extension rewrites that link to
``{colab_url}/github/{org}/{repo}/blob/{NOTEBOOKS_BRANCH}/{page}.ipynb``, the notebook that
``.github/workflows/notebooks.yml`` generates with jupytext on every push to main. The org and
repository come from ``repository.url`` in ``_config.yml``. Pages without code cells get no launch
buttons (there is nothing to run).

On the site, the first cell of each chapter (``fastjax.colab.INSTALL_CELL``, which does nothing
outside Colab) is folded behind a "Show the Colab install cell" toggle, so readers start with the lesson.

**Schedule.** The ``{workshop-schedule}`` directive: the pages of ``_toc.yml`` in order with the run
time of each, as measured by this build's execution (myst-nb's records).

**Scripts.** Sphinx 7.4 writes an inline script twice when an extension adds it after the builder
started (once with filename ``None``, once with ``''``); sphinx-thebe's ``const THEBE_JS_URL = ...``
then throws "already declared" on every page. ``drop_duplicate_scripts`` keeps the first copy.

**Defaults.** The theme logs "Got invalid theme mode" on a first visit unless the template variable
``default_mode`` is set: it is set to ``auto`` (follow the reader's system).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective

NOTEBOOKS_BRANCH = "notebooks"
LAUNCH_GROUP = "launch-buttons"
EXEC_TABLE_KEY = "has_exec_table"  # myst-nb re-writes pages with this key after new executions


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


def _has_code(doctree: nodes.document | None) -> bool:
    if doctree is None:
        return False
    return any(node.get("nb_element") == "cell_code" for node in doctree.findall(nodes.container))


def rewrite_colab_button(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any],
                         doctree: nodes.document | None) -> None:
    """Runs after sphinx-book-theme's ``add_launch_buttons`` (priority 501) on every page."""
    buttons = context.get("header_buttons")
    if not buttons:
        return
    groups = [b for b in buttons if b.get("label") == LAUNCH_GROUP]
    if not groups:
        return
    if not _has_code(doctree):
        context["header_buttons"] = [b for b in buttons if b.get("label") != LAUNCH_GROUP]
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


class FoldInstallCell(SphinxPostTransform):
    """Fold the Colab install cell's source (myst-nb's own hide-input, set before it runs at 199)."""

    default_priority = 190
    formats = ("html",)

    def run(self, **kwargs: Any) -> None:
        from fastjax.colab import INSTALL_CELL

        for node in self.document.findall(nodes.container):
            if node.get("nb_element") != "cell_code" or node.get("hide_mode") or not node.children:
                continue
            source = node.children[0]
            if source.get("nb_element") == "cell_code_source" and source.astext().strip() == INSTALL_CELL.strip():
                node["hide_mode"] = "input"
                node["prompt_show"] = "Show the Colab install cell"
                node["prompt_hide"] = "Hide the Colab install cell"


# ---------------------------------------------------------------- the workshop schedule


class ScheduleNode(nodes.General, nodes.Element):
    """Placeholder, replaced by the schedule table once every chapter has executed."""


class WorkshopSchedule(SphinxDirective):
    """``{workshop-schedule}``: every page of _toc.yml in order, its part and its run time."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from myst_nb.sphinx_ import NbMetadataCollector

        NbMetadataCollector.set_doc_data(self.env, self.env.docname, EXEC_TABLE_KEY, True)
        return [ScheduleNode()]


def _toc_order(env: Any) -> list[tuple[str, str]]:
    """(part caption, docname) for every page of the external table of contents, in order."""
    site_map = getattr(env, "external_site_map", None)
    if site_map is None:
        return [("", name) for name in sorted(env.found_docs)]
    out: list[tuple[str, str]] = []

    def walk(docname: str, caption: str) -> None:
        out.append((caption, docname))
        for subtree in site_map[docname].subtrees:
            for item in subtree.files():
                walk(item, subtree.caption or caption)

    walk(site_map.root.docname, "")
    return out


class ScheduleTransform(SphinxPostTransform):
    """Fill the schedule with the run times that myst-nb recorded (seconds, this build)."""

    default_priority = 8  # before the references are resolved

    def run(self, **kwargs: Any) -> None:
        from myst_nb.sphinx_ import NbMetadataCollector

        for node in list(self.document.findall(ScheduleNode)):
            data = NbMetadataCollector.get_doc_data(self.env)
            node.replace_self(self._table(data))

    def _table(self, data: dict[str, dict]) -> nodes.table:
        header = ["Part", "Chapter", "Run time (s)"]
        table = nodes.table(classes=["colwidths-auto", "workshop-schedule"])
        group = nodes.tgroup(cols=len(header))
        table += group
        for _ in header:
            group += nodes.colspec(colwidth=1)
        thead, tbody = nodes.thead(), nodes.tbody()
        group += thead
        group += tbody
        thead += nodes.row("", *[nodes.entry("", nodes.paragraph(text=h)) for h in header])
        here = self.env.docname
        total, previous = 0.0, None
        for caption, docname in _toc_order(self.env):
            if docname == here:
                continue  # this page is not a session
            exec_data = data.get(docname, {}).get("exec_data") or {}
            runtime = exec_data.get("runtime")
            if runtime is None:
                continue  # a page without code: nothing ran
            total += runtime
            link = pending_xref(refdoc=here, reftarget="/" + docname, reftype="doc", refdomain="std",
                                refexplicit=False, refwarn=True, classes=["xref", "doc"])
            link += nodes.inline(text=docname)
            status = "" if exec_data.get("succeeded", True) else " (failed)"
            shown_caption, previous = ("" if caption == previous else caption), caption
            tbody += nodes.row("", nodes.entry("", nodes.paragraph(text=shown_caption)),
                               nodes.entry("", nodes.paragraph("", "", link)),
                               nodes.entry("", nodes.paragraph(text=f"{runtime:.0f}{status}")))
        tbody += nodes.row("", nodes.entry("", nodes.paragraph(text="")),
                           nodes.entry("", nodes.paragraph("", "", nodes.strong(text="All chapters"))),
                           nodes.entry("", nodes.paragraph("", "", nodes.strong(text=f"{total:.0f}"))))
        return table


def page_defaults(app: Sphinx, config: Any) -> None:
    """A valid theme colour mode when none is set (``auto``: follow the reader's system)."""
    config.html_context.setdefault("default_mode", "auto")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", page_defaults)
    app.connect("html-page-context", rewrite_colab_button, priority=600)
    app.connect("html-page-context", drop_duplicate_scripts, priority=600)
    app.add_node(ScheduleNode)
    app.add_directive("workshop-schedule", WorkshopSchedule)
    app.add_post_transform(ScheduleTransform)
    app.add_post_transform(FoldInstallCell)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
