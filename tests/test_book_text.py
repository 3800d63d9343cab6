"""The book's text, read without running it: the reader's words only, glued figures that are figures,
and hand-written "next" links that follow _toc.yml.

- No chapter speaks of the project's trackers (issues, goals set elsewhere, "met"/"missed"): a reader
  does not know them. Upstream issues are fine where the sentence links to the tracker.
- A glue shown with a number format (``{glue:text}`name:.2f```) must hold a number in the quick build's
  executed notebooks (_build/executed, written by tests/test_chapters.py); text there means a sentence
  that reads wrong at that size. Skipped where no executed notebooks are present.
- No page is over 500 lines of source and the book shrinks towards 14,000 lines: the pages not yet cut
  are listed with their length now, which they may not pass.
- A line that says where to go next (``**Next:**``, "Back to", "on to") names the page that _toc.yml puts
  next.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import pytest

from conftest import EXECUTED, ROOT, toc_files

# ----------------------------------------------------------------------------- tracker language

TRACKER = [
    (re.compile(r"\bissues?\s*#?\d+", re.I), "an issue by number"),
    (re.compile(r"\b(the|this|that|a|later|earlier|another|next|previous)\s+issues?\b(?!\s*\[)", re.I), "an issue"),
    (re.compile(r"\bPart [IVX]+ issues?\b"), "an issue"),
    (re.compile(r"\bgoals?\b[^.\n]{0,80}\b(set|met|missed|meets|misses)\b", re.I), "a goal met or missed"),
    (re.compile(r"\b(set|met|missed|meets|misses)\b[^.\n]{0,80}\bgoals?\b", re.I), "a goal met or missed"),
    (re.compile(r"\bgoals?,?\s+measured\b", re.I), "goals, measured"),
    (re.compile(r"\b(is|are|was|were)\s+(met|missed)\b", re.I), "met or missed"),
    (re.compile(r"""["']met["']"""), "a column named met"),
    (re.compile(r"\b(asked for this page|the brief|ticket)\b", re.I), "the project's own paperwork"),
]
UPSTREAM = re.compile(r"github\.com/[^/\s)]+/[^/\s)]+/(issues|pull)/\d+|\[[^\]]*#\d+\]")


def tracker_language(text: str) -> list[str]:
    """Each place in ``text`` that speaks of the project's trackers, as 'line N: what: excerpt'. An issue
    named in a sentence that links to its tracker (an upstream bug) is the reader's business, not ours."""
    found = []
    for pattern, what in TRACKER:
        for m in pattern.finditer(text):
            window = text[max(0, m.start() - 200):m.end() + 200]
            if what.startswith("an issue") and UPSTREAM.search(window):
                continue
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"line {line}: {what}: {text[max(0, m.start() - 40):m.end() + 40]!r}")
    return found


def test_the_tracker_finder_finds_each_kind():
    for text in ("The issue that asked for this page set goals.", "the goal of 20× set in issue 39",
                 "The goal of 10× over pyPLNmodels' fits (issue 39) is missed at this size.",
                 "## The goals, measured", 'row = {"goal": g, "met": "yes"}', "A later issue asked for 2×.",
                 "it misses the 3× goal at this size"):
        assert tracker_language(text), text
    for text in ("This is the open JAX issue\n[jax#12868](https://github.com/jax-ml/jax/issues/12868) (slow).",
                 "[OpenBLAS issue 5171](https://github.com/OpenMathLib/OpenBLAS/issues/5171)",
                 "The goal of the capstone is the speed-up of the reference.", "why a cache missed",
                 "the first time it meets it"):
        assert not tracker_language(text), text


@pytest.mark.parametrize("page", toc_files())
def test_no_chapter_speaks_of_the_trackers(page):
    found = tracker_language((ROOT / f"{page}.md").read_text())
    assert found == [], f"{page}: say what was measured and what it means instead:\n" + "\n".join(found)


def html_text(page_html: str) -> str:
    """The text of a built page, with each link's address kept beside its text."""
    text = re.sub(r"<a\s[^>]*href=\"([^\"]*)\"[^>]*>", r" \1 ", page_html)
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", text, flags=re.S)
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", text))


def test_no_built_page_speaks_of_the_trackers():
    built = ROOT / "_build" / "html"
    pages = [built / f"{page}.html" for page in toc_files() if (built / f"{page}.html").exists()]
    if not pages:
        pytest.skip("no built book in _build/html (scripts/build-book.sh builds it)")
    found = {str(p.relative_to(built)): tracker_language(html_text(p.read_text())) for p in pages}
    found = {k: v for k, v in found.items() if v}
    assert found == {}, found


# ----------------------------------------------------------------------------- glued figures

NUMBER_FORMAT = re.compile(r"\{glue:text\}`([^`:]+):([^`]*[0-9]*[bcdeEfFgGnoxX%])`")


def glued_values(nb: dict) -> dict[str, str]:
    """Each glued name of an executed notebook and the text/plain of its value (a repr: '1.5', "'text'")."""
    out = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            data = o.get("data", {})
            text = data.get("application/papermill.record/text/plain", data.get("text/plain"))
            if name and text is not None:
                out[name] = "".join(text) if isinstance(text, list) else text
    return out


def text_under_a_number_format(nb: dict) -> list[str]:
    """Each ``{glue:text}`name:spec``` of the notebook's Markdown whose glued value is not a number."""
    values = glued_values(nb)
    found = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for name, spec in NUMBER_FORMAT.findall(source):
            value = values.get(name)
            if value is None:
                continue  # glued on another page, or not at all: the build itself fails on that
            try:
                float(value)
            except ValueError:
                found.append(f"{name}:{spec} holds {value}")
    return found


def test_the_glue_reader_finds_text_under_a_number_format():
    def glued(name, text):
        return {"cell_type": "code", "outputs": [{"output_type": "display_data", "metadata": {"scrapbook": {"name": name}},
                                                  "data": {"application/papermill.record/text/plain": text}}]}

    nb = {"cells": [glued("a", "1.5"), glued("b", "'not raced at the quick size'"), glued("c", "7"),
                    {"cell_type": "markdown", "source": "{glue:text}`a:.2f` s, {glue:text}`b:.2f` s, "
                                                        "{glue:text}`c:.0f` runs, {glue:text}`b` as words"}]}
    assert text_under_a_number_format(nb) == ["b:.2f holds 'not raced at the quick size'"]


def executed_notebooks() -> list[Path]:
    return sorted(EXECUTED.rglob("*.ipynb")) if EXECUTED.exists() else []


@pytest.mark.skipif(not executed_notebooks(), reason="no executed notebooks in _build/executed "
                    "(tests/test_chapters.py writes them)")
def test_every_glue_under_a_number_format_holds_a_number():
    found = {}
    for path in executed_notebooks():
        bad = text_under_a_number_format(json.loads(path.read_text()))
        if bad:
            found[str(path.relative_to(EXECUTED))] = bad
    assert found == {}, ("a sentence shows text where it formats a number; glue the whole sentence instead: "
                         f"{found}")


# ----------------------------------------------------------------------------- previous/next

POINTER = re.compile(r"^\s*(\*\*)?(Next|Back to)\b[^:\n]{0,30}:|\bor on to\b", re.M)
LINK = re.compile(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`|\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def resolve(target: str, page: str) -> str | None:
    """The page (as in _toc.yml) that link ``target`` on ``page`` names, or None for an outside link."""
    if "://" in target or target.startswith("#"):
        return None
    target = re.sub(r"\.(md|ipynb|html)$", "", target.split("#")[0])
    base = Path(page).parent
    path = Path(target.lstrip("/")) if target.startswith("/") else base / target
    parts = []
    for part in path.parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def wrong_pointers(page: str, text: str, following: str | None) -> list[str]:
    """Each line of ``text`` (the source of ``page``) that says where to go next and does not name
    ``following``, the page after it in _toc.yml."""
    out = []
    for line in FENCE.sub("", text).splitlines():
        if not POINTER.search(line):
            continue
        m = POINTER.search(line)
        links = [resolve(a or b, page) for a, b in LINK.findall(line[m.start():])]
        links = [x for x in links if x]
        if not links or links[0] != following:
            out.append(f"{page}: {line.strip()!r} should name {following}")
    return out


def test_the_pointer_finder_finds_a_wrong_or_missing_next():
    assert wrong_pointers("chapters/pln/07-results", "**Next:** [the practice](08-practice)", "chapters/pln/08-practice") == []
    assert wrong_pointers("chapters/tools/05-practice", "Next: Part IV, {doc}`../many/01-pca-collection`.",
                          "chapters/many/01-pca-collection") == []
    assert wrong_pointers("chapters/pln/07-results", "**Back to the start:** [0](00-model), or on to Part II.",
                          "chapters/pln/08-practice")
    assert wrong_pointers("chapters/floor/05-practice", "**Next:** the {doc}`../workshop` page.", "chapters/floor/04-first-result")
    assert wrong_pointers("chapters/x/a", "Back to the start, or on to the results.", "chapters/x/b")
    assert wrong_pointers("chapters/x/a", "```python\n# Next: anything\n```\n", "chapters/x/b") == []


def test_hand_written_next_links_follow_the_toc():
    pages = toc_files()
    wrong = []
    for page, following in zip(pages, pages[1:] + [None]):
        wrong += wrong_pointers(page, (ROOT / f"{page}.md").read_text(), following)
    assert wrong == [], "\n".join(wrong)


# ----------------------------------------------------------------------------- length

PAGE_LINES = 500  # a page a reader can hold: its lesson and recipe first, the evidence collapsed or in the package
BOOK_LINES = 14_000  # the whole book's chapter source, every check kept


def chapter_lines() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sorted((ROOT / "chapters").rglob("*.md"))}


def test_no_page_is_longer_than_a_reader_can_hold():
    lines = chapter_lines()
    over = {page: n for page, n in lines.items() if n > PAGE_LINES}
    assert over == {}, f"pages over {PAGE_LINES} lines of source: {over}"


def test_the_book_does_not_grow_back():
    total = sum(chapter_lines().values())
    assert total <= BOOK_LINES, f"{total} lines of chapter source; at most {BOOK_LINES}"


# ----------------------------------------------------------------------------- the first screen

FIRST_SCREEN = 45  # lines of source after the jupytext header: about what a reader sees before scrolling


def first_screen(text: str) -> str:
    lines = text.splitlines()
    start = lines.index("---", 1) + 1 if lines and lines[0] == "---" else 0
    return "\n".join(lines[start:start + FIRST_SCREEN])


def lacks_a_lesson_screen(text: str) -> list[str]:
    """What a page's first screen lacks of its lesson: a recipe to copy (a code block or cell) and a measured
    answer (a value glued from a cell)."""
    screen = first_screen(text)
    return ([] if "```" in screen else ["a recipe (code)"]) + ([] if "{glue" in screen else ["a glued measured answer"])


def test_the_first_screen_finder_sees_what_is_missing():
    header = "---\njupytext: {}\n---\n"
    assert lacks_a_lesson_screen(header + "# T\n\nText.\n") == ["a recipe (code)", "a glued measured answer"]
    assert lacks_a_lesson_screen(header + "# T\n\n```python\nf()\n```\n\nIt ran {glue:text}`x:.1f`× faster.\n") == []
    assert lacks_a_lesson_screen(header + "# T\n" + "\n" * 60 + "```python\nf()\n```\n{glue:text}`x`\n") != []


@pytest.mark.parametrize("page", [p for p in toc_files() if p != "chapters/index"])
def test_every_page_leads_with_its_recipe_and_its_measured_answer(page):
    missing = lacks_a_lesson_screen((ROOT / f"{page}.md").read_text())
    assert missing == [], f"{page}: its first {FIRST_SCREEN} lines lack {' and '.join(missing)}"
