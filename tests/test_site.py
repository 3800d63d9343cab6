"""The built site, opened in a real browser (headless Chromium through Playwright): phase 2 of the suite.

The module builds the book once in the quick size with warnings as errors, from the chapters that
tests/test_chapters.py (phase 1) executed and kept in ``_build/executed/``: a copy of the book whose
pages are those executed notebooks, each marked so that myst-nb renders it without running it
again. Pages that phase 1 leaves to the build (the Results page, which reads what the part chapters
saved) are executed by this build. A cell error fails the build and names the page. The module then
serves ``_build/html`` on 127.0.0.1 and opens every page: it loads, has no console error, no missing
image, no broken internal link, a Colab button that opens the chapter's ``.ipynb``, and every figure
its executed notebook made. Screenshots of the landing page and of the first page of each part go to
``_build/screenshots/`` for a developer to look at.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml

from conftest import EXECUTED, ROOT, toc_files
from fastjax.setup.colab import repository_url

pytestmark = [pytest.mark.site]

# The browser, looked for in the order scripts/install-tools.sh uses (which installs Debian's chromium
# only when none is found): FASTJAX_CHROMIUM, else the first of these on the PATH.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> Path | None:
    """FASTJAX_CHROMIUM when set, else the first of ``BROWSERS`` on the PATH; None when there is none."""
    if os.environ.get("FASTJAX_CHROMIUM"):
        return Path(os.environ["FASTJAX_CHROMIUM"])
    found = next(filter(None, map(shutil.which, BROWSERS)), None)
    return Path(found) if found else None


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BUILD_TIMEOUT = 1200  # seconds: renders every page, executes the pages phase 1 left to the build
SCREENSHOTS = ROOT / "_build" / "screenshots"
PAGES = toc_files()
BOOK_FILES = ("_config.yml", "_toc.yml", "_ext", "chapters", "images")
IMAGE_MIMES = ("image/svg+xml", "image/png", "image/jpeg", "image/gif")
# myst-nb shows the first of these that an output has (its HTML priority list)
RENDER_PRIORITY = ("application/vnd.jupyter.widget-view+json", "application/javascript", "text/html",
                   *IMAGE_MIMES, "text/markdown", "text/latex", "text/plain")


@dataclass
class Build:
    returncode: int
    log: str
    out: Path

    @property
    def html(self) -> Path:
        return self.out / "_build" / "html"

    @property
    def executed(self) -> Path:
        return self.out / "_build" / "jupyter_execute"


MD_LINK = re.compile(r"\]\(([^)\s#]+)\.md(#[^)\s]*)?\)")


def relink(text: str, page: str, reused: set[str]) -> str:
    """Point Markdown links ``[x](other.md)`` of ``page`` at ``other.ipynb`` where that page is a notebook now."""
    def swap(m: re.Match) -> str:
        target = (Path(page).parent / m.group(1)).as_posix()
        target = str(Path(os.path.normpath(target)))
        return f"]({m.group(1)}.ipynb{m.group(2) or ''})" if target in reused else m.group(0)
    return MD_LINK.sub(swap, text)


def book_from_executed(dest: Path) -> list[str]:
    """A copy of the book in ``dest`` whose pages are phase 1's executed notebooks; return those pages."""
    for name in BOOK_FILES:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    reused = {page for page in PAGES if (EXECUTED / f"{page}.ipynb").is_file()
              and (EXECUTED / f"{page}.ipynb").stat().st_mtime >= (ROOT / f"{page}.md").stat().st_mtime}
    for page in PAGES:
        if page in reused:
            nb = json.loads((EXECUTED / f"{page}.ipynb").read_text())
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
                    cell["source"] = relink(source, page, reused)
            (dest / f"{page}.md").unlink()
            (dest / f"{page}.ipynb").write_text(json.dumps(nb))
        else:
            md = dest / f"{page}.md"
            md.write_text(relink(md.read_text(), page, reused))
    return sorted(reused)


def test_relink_points_md_links_at_notebooks():
    text = "[a](01-no-jit.md) [b](../measuring.md#x) [c](02-jit.md) [d](https://x.org/y.md)"
    out = relink(text, "chapters/pln/00-model", {"chapters/pln/01-no-jit", "chapters/measuring"})
    assert out == "[a](01-no-jit.ipynb) [b](../measuring.ipynb#x) [c](02-jit.md) [d](https://x.org/y.md)"


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Build:
    out = tmp_path_factory.mktemp("book")
    book = out / "src"
    book.mkdir()
    reused = book_from_executed(book)
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(book), "--path-output", str(out),
           "--builder", "html", "-W", "--keep-going"]
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "PYTEST_CURRENT_TEST")}
    env["FASTJAX_SIZE"] = "quick"
    # fastjax, imported by other tests in this process, added its CPU fix to XLA_FLAGS: each chapter
    # applies it itself, as it would for a reader
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "ynn_fusion_type" not in f)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=BUILD_TIMEOUT, cwd=book)
    log = f"pages rendered from phase 1's executed notebooks: {len(reused)} of {len(PAGES)}\n"
    return Build(proc.returncode, log + proc.stdout + proc.stderr, out)


@pytest.fixture(scope="module")
def html(build) -> Path:
    if not (build.html / "chapters" / "index.html").exists():
        pytest.skip("the book build produced no HTML (see test_book_builds_with_W)")
    return build.html


def test_book_builds_with_W(build):
    problems = [line for line in build.log.splitlines()
                if re.search(r"WARNING|ERROR|Traceback", line) and not line.startswith("[IPKernelApp]")]
    assert build.returncode == 0, "jupyter-book build -W failed:\n" + "\n".join(problems[:40] or [build.log[-4000:]])
    assert (build.html / "chapters" / "index.html").exists()


def test_every_page_is_executed_once(build):
    """Phase 1 executed every chapter it could; the build executed only what phase 1 left to it."""
    executed_by_build = re.findall(r"Executed notebook in", build.log)
    left = [p for p in PAGES if not (EXECUTED / f"{p}.ipynb").is_file()]
    assert len(executed_by_build) <= len(left), f"the build re-executed pages phase 1 had run: {build.log[:2000]}"


# ---------------------------------------------------------------- what the cells print

# Warning text: a Python warning category ("UserWarning: ...", "TqdmWarning: ..."), a logging level
# ("WARNING:absl:...", "[W] WARNING ..."), or a glog warning line from XLA ("W0512 10:31:02.123 ...").
WARNING_TEXT = re.compile(r"\b[A-Z]\w*Warning\b|\bWARNING\b|^W\d{4} \d\d:\d\d:\d\d", re.M)
EXPECTED_WARNING = "expected-warning"  # the cell tag of a cell whose lesson is a warning (notes/CONVENTIONS.md)


@dataclass
class CellOnPage:
    """One code cell of a built page: its tags, its first line of code and the text of its outputs."""
    index: int
    tags: set[str] = field(default_factory=set)
    code: str = ""
    output: str = ""

    def warnings(self) -> list[str]:
        """The output lines holding warning text."""
        return [line.strip() for line in self.output.splitlines() if WARNING_TEXT.search(line)]


class _Cells(HTMLParser):
    """Collect myst-nb's cells (``div.cell``, tags as ``tag_<name>`` classes) with their input and output text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.cells: list[CellOnPage] = []
        self.stack: list[set[str]] = []  # the classes of each open div
        self.cell_depth: int | None = None

    def handle_starttag(self, tag, attrs):
        if tag != "div":
            return
        classes = set((dict(attrs).get("class") or "").split())
        self.stack.append(classes)
        if "cell" in classes and self.cell_depth is None:
            self.cell_depth = len(self.stack)
            tags = {c.removeprefix("tag_") for c in classes if c.startswith("tag_")}
            self.cells.append(CellOnPage(len(self.cells), tags))

    def handle_endtag(self, tag):
        if tag != "div" or not self.stack:
            return
        if self.cell_depth == len(self.stack):
            self.cell_depth = None
        self.stack.pop()

    def handle_data(self, data):
        if self.cell_depth is None:
            return
        cell = self.cells[-1]
        if any("cell_output" in classes for classes in self.stack):
            cell.output += data
        elif any("cell_input" in classes for classes in self.stack):
            cell.code += data


def cells_on_page(page_html: str) -> list[CellOnPage]:
    """The code cells of a page of the built book, in order."""
    parser = _Cells()
    parser.feed(page_html)
    parser.close()
    for cell in parser.cells:
        cell.code = next((line.strip() for line in cell.code.splitlines() if line.strip()), "")
    return parser.cells


def stray_warnings(page_html: str) -> list[str]:
    """Warning text in outputs of cells not tagged ``expected-warning``: one line per hit, naming the cell."""
    return [f"cell {c.index + 1} ({c.code[:60]}): {line[:300]}"
            for c in cells_on_page(page_html) if EXPECTED_WARNING not in c.tags for line in c.warnings()]


def unneeded_warning_tags(page_html: str) -> list[str]:
    """Cells tagged ``expected-warning`` that show no warning (the tag outlived the warning)."""
    return [f"cell {c.index + 1} ({c.code[:60]})" for c in cells_on_page(page_html)
            if EXPECTED_WARNING in c.tags and not c.warnings()]


_PAGE = """<main><div class="cell {tags}docutils container">
<div class="cell_input docutils container"><div class="highlight-ipython3 notranslate"><div class="highlight"><pre>
<span></span><span class="n">{code}</span></pre></div></div></div>
<div class="cell_output docutils container">
<div class="output {kind} highlight-myst-ansi notranslate"><div class="highlight"><pre><span></span>{out}
</pre></div></div></div></div>
<p>UserWarning named in prose is not an output</p></main>"""


@pytest.mark.parametrize("kind", ["stderr", "stream", "text_plain", "traceback"])
@pytest.mark.parametrize("out", [
    "/tmp/ipykernel_1/1.py:2: UserWarning: counts: removed 1 column(s)",
    ".venv/lib/python3.11/site-packages/tqdm/auto.py:21: TqdmWarning: IProgress not found.",
    "WARNING:absl:No GPU/TPU found, falling back to CPU.",
    "W0512 10:31:02.123456 1234 cpu_client.cc:123] something",
    "&lt;frozen importlib&gt; DeprecationWarning",
])
def test_warning_text_in_any_output_is_found(kind, out):
    page = _PAGE.format(tags="", code="import pyPLNmodels", kind=kind, out=out)
    found = stray_warnings(page)
    assert len(found) == 1 and found[0].startswith("cell 1 (import pyPLNmodels): ")
    assert stray_warnings(_PAGE.format(tags="tag_expected-warning ", code="x", kind=kind, out=out)) == []


@pytest.mark.parametrize("out", ["state-only donation: no warning, data intact: True",
                                 "eager fit: 100%|##########| 50/50 [00:01&lt;00:00, 45.2it/s]",
                                 "⚠ Not a quiet measurement.", "warnings caught: 0"])
def test_output_without_warning_text_passes(out):
    assert stray_warnings(_PAGE.format(tags="", code="x", kind="stream", out=out)) == []


def test_warning_text_in_code_or_prose_is_not_an_output():
    page = _PAGE.format(tags="", code="warnings.warn(UserWarning(...))", kind="stream", out="done")
    assert stray_warnings(page) == []


def test_each_cell_keeps_its_own_tags_and_outputs():
    first = _PAGE.format(tags="tag_expected-warning tag_hide-cell ", code="a", kind="stderr", out="UserWarning: x")
    second = _PAGE.format(tags="", code="b", kind="stderr", out="RuntimeWarning: y")
    cells = cells_on_page(first + second)
    assert [(c.code, c.tags) for c in cells] == [("a", {"expected-warning", "hide-cell"}), ("b", set())]
    assert stray_warnings(first + second) == ["cell 2 (b): RuntimeWarning: y"]


def test_a_warning_tag_on_a_cell_that_shows_none_is_named():
    page = _PAGE.format(tags="tag_expected-warning ", code="quiet()", kind="stream", out="done")
    assert unneeded_warning_tags(page) == ["cell 1 (quiet())"]


@pytest.mark.parametrize("name", PAGES)
def test_no_warning_the_chapter_does_not_mean_to_show(html, name):
    """Warning text in an output fails unless the cell is tagged expected-warning; fix a warning at its
    source (or tag the cell where showing it is the lesson), never by hiding the stderr of a page."""
    page = (html / f"{name}.html").read_text(errors="replace")
    assert stray_warnings(page) == [], f"{name}.html shows warnings no cell means to show (tag: {EXPECTED_WARNING})"
    assert unneeded_warning_tags(page) == [], f"{name}.html: cells tagged {EXPECTED_WARNING} show no warning"


# ---------------------------------------------------------------- server and browser


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture(scope="module")
def server(html):
    handler = functools.partial(_QuietHandler, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.timeout = 10
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    chromium = find_chromium()
    if chromium is None or not chromium.exists():
        pytest.fail(f"no browser ({chromium or ' or '.join(BROWSERS) + ' on the PATH'}): apt-get install -y chromium, "
                    "or set FASTJAX_CHROMIUM to a Chromium or Chrome (never let Playwright download a browser)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@dataclass
class PageVisit:
    status: int | None
    console_errors: list[str]
    links: list[str]
    images: list[dict]
    colab: list[str]
    text: str


def visit(browser, server: str, path: str, screenshot: Path | None = None) -> PageVisit:
    """Open one page: wait for it, take a screenshot, then open every dropdown and read the DOM."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []

    def local(url: str) -> bool:
        return url.startswith(server) or url.startswith(("data:", "blob:", "about:"))

    # Nothing but this server is reachable here: refuse the rest at once (CDN scripts, fonts). The
    # pattern matches only other hosts, so the server's own requests need no Python handler.
    page.route(re.compile(rf"^(?!{re.escape(server)}/)https?://"), lambda route: route.abort())
    page.on("console", lambda m: errors.append(f"{m.text} (at {m.location.get('url')})")
            if m.type == "error" and local(m.location.get("url") or server) else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}") if local(r.url) else None)
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}")
            if r.status >= 400 and local(r.url) and not r.url.endswith("favicon.ico") else None)
    try:
        response = page.goto(f"{server}/{path}", wait_until="load", timeout=30_000)
        page.wait_for_load_state("networkidle", timeout=15_000)
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        images = page.evaluate("""async () => {
            document.querySelectorAll('details').forEach(d => { d.open = true; });
            const imgs = [...document.images];
            imgs.forEach(i => { i.loading = 'eager'; });
            await Promise.race([
                Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; }))),
                new Promise(r => setTimeout(r, 10000))]);
            return imgs.map(i => ({src: i.getAttribute('src'), url: i.src, width: i.naturalWidth}));
        }""")
        text = page.evaluate("() => [...document.querySelectorAll('main p')].map(p => p.innerText).join('\\n')")
        links = page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
        colab = page.eval_on_selector_all("a[href*='colab.research.google.com']", "as => as.map(a => a.href)")
        return PageVisit(response.status if response else None, errors, links, images, colab, text)
    finally:
        context.close()


@pytest.fixture(scope="module")
def visits(browser, server, html) -> dict[str, PageVisit]:
    """Every page of the table of contents, plus the generated index and search pages."""
    first_of_part = FIRST_OF_PART
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)
    out = {}
    for name in [*PAGES, "genindex", "search"]:
        shot = SCREENSHOTS / (name.replace("/", "__") + ".png") if name in first_of_part else None
        out[name] = visit(browser, server, f"{name}.html", shot)
    return out


def first_page_of_each_part() -> set[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    firsts = {toc["root"]}
    for part in toc.get("parts", []):
        if part.get("chapters"):
            firsts.add(part["chapters"][0]["file"])
    return firsts


FIRST_OF_PART = first_page_of_each_part()  # the landing page and the first page of each part


# ---------------------------------------------------------------- what the reader sees


@pytest.mark.parametrize("name", [*PAGES, "genindex", "search"])
def test_page_loads_cleanly(visits, name):
    v = visits[name]
    assert v.status == 200
    assert v.console_errors == []


@pytest.mark.parametrize("name", [*PAGES, "genindex", "search"])
def test_no_image_is_missing(visits, name):
    broken = [i["src"] for i in visits[name].images if i["width"] == 0]
    assert broken == [], f"images that did not load on {name}"


@pytest.mark.parametrize("name", PAGES)
def test_markdown_tables_are_rendered(visits, name):
    # a Markdown table that reached the page as text (e.g. a cell's Markdown output not parsed)
    raw = [line for line in visits[name].text.splitlines() if re.search(r"\|\s*:?[-—–]+:?\s*\|", line)]
    assert raw == [], f"{name} shows Markdown tables as raw text"


def test_root_redirects_to_the_landing_page(browser, server):
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{server}/index.html")
        page.wait_for_url(re.compile(r"chapters/index\.html"), timeout=10_000)
    finally:
        context.close()


@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> frozenset[str]:
    text = path.read_text(errors="replace")
    return frozenset(re.findall(r'\b(?:id|name)="([^"]+)"', text))


@pytest.mark.parametrize("name", [*PAGES, "genindex", "search"])
def test_internal_links_resolve(visits, server, html, name):
    broken = []
    for href in visits[name].links:
        if not href.startswith(server + "/"):
            continue  # another site: not checked offline
        parsed = urlparse(href)
        target = html / unquote(parsed.path).lstrip("/")
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href} (no file)")
        elif parsed.fragment and target.suffix == ".html" and unquote(parsed.fragment) not in _ids(target):
            broken.append(f"{href} (no anchor)")
    assert broken == [], f"broken internal links on {name}"


def _executed(build: Build, name: str) -> dict | None:
    path = build.executed / f"{name}.ipynb"
    return json.loads(path.read_text()) if path.exists() else None


def _has_code(nb: dict | None) -> bool:
    return nb is not None and any(c["cell_type"] == "code" and "".join(c["source"]).strip() for c in nb["cells"])


def _colab_target() -> str:
    org_repo = urlparse(repository_url(root=ROOT)).path.strip("/")  # FASTJAX_REPOSITORY, else _config.yml's
    return f"https://colab.research.google.com/github/{org_repo}/blob/notebooks/"


def test_repository_buttons_open_the_repository_in_use(visits):
    """_config.yml's repository, or FASTJAX_REPOSITORY's where the workflows set it (a fork's site opens the fork)."""
    url = repository_url(root=ROOT)
    links = visits[PAGES[0]].links
    assert url in links and any(link.startswith(f"{url}/issues/new") for link in links), links


@pytest.mark.parametrize("name", PAGES)
def test_chapter_opens_as_a_notebook_in_colab(visits, build, html, name):
    if not _has_code(_executed(build, name)):
        assert visits[name].colab == [], "a page without code needs no Colab button"
        return
    expected = _colab_target() + f"{name}.ipynb"
    assert visits[name].colab == [expected]


def _image_outputs(nb: dict) -> list[str]:
    """File names myst-nb gives the images a notebook shows: sha256 of the bytes plus extension."""
    names = []
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] != "code" or tags & {"remove-output", "remove-cell"}:
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            shown = next((m for m in RENDER_PRIORITY if m in data), None)
            if shown in IMAGE_MIMES:
                content = data[shown]
                content = "".join(content) if isinstance(content, list) else content
                raw = ("\n".join(content.splitlines()).encode() if shown == "image/svg+xml"
                       else base64.b64decode(content))
                ext = {"image/svg+xml": ".svg", "image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif"}[shown]
                names.append(hashlib.sha256(raw).hexdigest() + ext)
    return names


@pytest.mark.parametrize("name", PAGES)
def test_every_figure_is_on_the_page(visits, build, name):
    nb = _executed(build, name)
    if nb is None:
        pytest.skip("no executed notebook for this page")
    shown = {Path(urlparse(i["url"]).path).name for i in visits[name].images if i["width"] > 0}
    missing = [f for f in _image_outputs(nb) if f not in shown]
    assert missing == [], f"{name}: figures in the executed notebook that are not on the page"


@pytest.mark.parametrize("name", PAGES)
def test_a_chapter_that_plots_shows_a_figure(visits, build, name):
    # catches figures that are never displayed (e.g. a non-inline Matplotlib backend in the kernels)
    nb = _executed(build, name)
    if nb is None:
        pytest.skip("no executed notebook for this page")
    plots = [c for c in nb["cells"] if c["cell_type"] == "code"
             and re.search(r"\bplt\.|\bplots\.plot_\w+\(", "".join(c["source"]))]
    if not plots:
        pytest.skip("no plotting code")
    assert _image_outputs(nb), f"{name} has plotting code but its notebook shows no figure"


def test_the_workshop_page_shows_every_exercise_measured(build):
    """The workshop page runs in the build, after every practice page recorded its solution's time."""
    nb = _executed(build, "chapters/workshop")
    assert nb is not None, "the build did not execute the workshop page"
    printed = "".join(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"])
                      for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
    m = re.search(r"(\d+) exercises: (\d+) in the practice pages of (\d+) parts, and the capstone; "
                  r"(\d+) solutions measured by this build", printed)
    assert m, "the workshop page did not print its count of exercises"
    assert int(m[2]) >= 28 and int(m[3]) == 7 and int(m[1]) == int(m[2]) + 1, m[0]  # 4 per part in seven parts
    assert m[4] == m[1], f"solutions without a recorded time: {m[0]}"


def test_screenshots_were_saved(visits):
    shots = sorted(SCREENSHOTS.glob("*.png"))
    assert len(shots) == len(FIRST_OF_PART)
    assert all(s.stat().st_size > 10_000 for s in shots), "a screenshot looks empty"
