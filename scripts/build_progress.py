"""Read jupyter-book's output on stdin, pass it through, and add one progress line per executed chapter.

    [3/20] chapters/pln/02-jit executed in 41 s; about 9 min left (from this machine's last build)

The time left comes from the run times of the last build of the same size on this machine
(``_build/exec-times-<size>.json``, written at the end), or else from the mean of the chapters so far.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from fastjax.setup.colab import toc_files  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Sphinx colours its output even in a pipe
READING = re.compile(r"reading sources\.\.\. \[\s*\d+%\] (\S+)")
EXECUTED = re.compile(r"(?:(\S+)\.(?:md|ipynb): )?Executed notebook in ([\d.]+) seconds")


def main() -> None:
    size = os.environ.get("FASTJAX_SIZE", "full")
    record = ROOT / "_build" / f"exec-times-{size}.json"
    before = json.loads(record.read_text()) if record.is_file() else {}
    pages = toc_files(ROOT)
    times: dict[str, float] = {}
    current = None
    for line in sys.stdin:
        sys.stdout.write(line)
        for segment in ANSI.sub("", line).split("\r"):  # Sphinx rewrites its "reading sources" line with carriage returns
            current = handle(segment, current, pages, times, before)
        sys.stdout.flush()
    if times:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({**before, **times}, indent=1))
        print(f"executed {len(times)} pages in {sum(times.values()) / 60:.1f} min (size {size})")


def handle(segment: str, current: str | None, pages: list[str], times: dict[str, float],
           before: dict[str, float]) -> str | None:
    """Note the page being read; after an execution, print the progress line. Return the current page."""
    if m := READING.search(segment):
        return m.group(1)
    m = EXECUTED.search(segment)
    if m is None:
        return current
    if m.group(1):  # the executed file's path: the page is that path below the book's root
        path = Path(m.group(1))
        if path.is_absolute() and path.is_relative_to(ROOT):
            current = str(path.relative_to(ROOT))
    if current is None:
        return None
    times[current] = float(m.group(2))
    left = [p for p in pages if p not in times]  # Sphinx reads pages in name order, not the toc order
    mean = sum(times.values()) / len(times)
    estimate = sum(before.get(p, mean) for p in left)
    source = "from this machine's last build" if before else "from the mean so far"
    print(f"\n[{len(times)}/{len(pages)}] {current} executed in {times[current]:.0f} s; "
          f"about {estimate / 60:.0f} min left ({source})", flush=True)
    return current


if __name__ == "__main__":
    main()
