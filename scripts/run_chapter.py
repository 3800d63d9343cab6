"""Execute one chapter outside the book and print its text outputs (a tool for writing chapters).

Usage: .venv/bin/python scripts/run_chapter.py chapters/measuring.md [--save out.ipynb]
The size follows FASTJAX_SIZE as usual. Cells tagged raises-exception may fail; others may not.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapter", type=Path)
    parser.add_argument("--save", type=Path, help="write the executed notebook here")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args()
    nb = jupytext.read(args.chapter)
    t0 = time.perf_counter()
    client = NotebookClient(nb, timeout=args.timeout, resources={"metadata": {"path": str(args.chapter.parent)}})
    try:
        client.execute()
    finally:  # print what ran, also when a cell failed: its printed numbers say why
        report(nb, args.save)
    print(f"executed {args.chapter} in {time.perf_counter() - t0:.1f} s")


def report(nb: nbformat.NotebookNode, save: Path | None) -> None:
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                print(f"[{i}] {out.text.rstrip()}")
            elif out.output_type == "error":
                print(f"[{i}] {out.ename}: {out.evalue}")
            elif "text/markdown" in out.get("data", {}):
                print(f"[{i}] {out['data']['text/markdown']}")
            elif "image/png" in out.get("data", {}):
                print(f"[{i}] <figure>")
    if save:
        nbformat.write(nb, save)


if __name__ == "__main__":
    main()
