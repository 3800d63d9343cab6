"""The chapters as Colab opens them: each generated ``.ipynb`` starts with an install cell.

The chapter sources (``chapters/**/*.md``) carry the lesson only. Colab cannot open MyST markdown,
so ``python -m fastjax.colab OUT`` writes every chapter of ``_toc.yml`` as a notebook under ``OUT``
with ``INSTALL_CELL`` put first; the notebooks workflow pushes them to the ``notebooks`` branch
that the book's Colab buttons open.

The install cell installs what Colab lacks (this package with its examples extra: Equinox,
pyPLNmodels, scikit-learn). It keeps Colab's own jax/jaxlib when they are recent enough for the
book, so that nothing downgrades them; when they are older than ``JAX_MIN`` it upgrades JAX and says
so. Outside Colab it does nothing, unless ``FASTJAX_FORCE_INSTALL=1`` (the tests set it, with
``FASTJAX_SOURCE`` pointing at a local checkout).
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPOSITORY = "https://github.com/fastjax-book/fastjax"  # also repository.url in _config.yml (a test checks)
JAX_MIN = "0.10.2"  # the oldest JAX the book is run with; pyproject.toml's lower bound (a test checks)

INSTALL_CELL = f'''\
# Colab only: install this book's helper package and what Colab lacks (locally: see README.md).
import os, re, subprocess, sys
if "google.colab" in sys.modules or os.environ.get("FASTJAX_FORCE_INSTALL") == "1":
    from importlib.metadata import PackageNotFoundError, version
    def installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None
    def release(v):
        return tuple(int(x) for x in re.findall(r"\\d+", v)[:3])
    JAX_MIN = "{JAX_MIN}"
    source = os.environ.get("FASTJAX_SOURCE", "git+{REPOSITORY}")
    jax_now = installed("jax")
    if jax_now and release(jax_now) >= release(JAX_MIN):
        pins = [f"jax=={{jax_now}}", f"jaxlib=={{installed('jaxlib')}}"]  # keep Colab's JAX: never downgrade it
    else:
        extra = "[cuda12]" if installed("jax-cuda12-plugin") else ""
        pins = [f"jax{{extra}}>={{JAX_MIN}}"]
        print(f"This runtime has JAX {{jax_now}}; the book needs {{JAX_MIN}} or newer: upgrading JAX.")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"fastjax[examples] @ {{source}}", *pins], check=True)
    if "jax" in sys.modules and installed("jax") != jax_now:
        print("JAX was already imported in this runtime: restart it (Runtime > Restart session), then run on.")'''


def find_root(start: Path | None = None) -> Path:
    """The book's root: the nearest folder at or above ``start`` (default: here) holding ``_toc.yml``."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    raise FileNotFoundError(f"no _toc.yml at or above {here}: run this inside the book's checkout")


def toc_files(root: Path | None = None) -> list[str]:
    """Every page named in ``_toc.yml``, in order, without suffix (e.g. ``'chapters/measuring'``)."""
    import yaml

    root = find_root(root)
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    out = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                out.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", []))
    return out


def colab_notebook(chapter: Path):
    """The chapter (a MyST ``.md``) as a plain notebook whose first cell is ``INSTALL_CELL``."""
    import jupytext
    import nbformat

    nb = jupytext.read(chapter)
    nb.metadata.pop("jupytext", None)  # a plain notebook: no link back to a .md file
    if any(c.cell_type == "code" for c in nb.cells):
        nb.cells.insert(0, nbformat.v4.new_code_cell(INSTALL_CELL, metadata={"tags": ["colab-install"]}))
    return nb


def write_notebooks(out: Path, root: Path | None = None) -> list[Path]:
    """Write every chapter of ``_toc.yml`` as ``OUT/<page>.ipynb`` (install cell first); return the paths."""
    import nbformat

    root = find_root(root)
    paths = []
    for page in toc_files(root):
        target = out / f"{page}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(colab_notebook(root / f"{page}.md"), target)
        paths.append(target)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write every chapter as a Colab notebook (install cell first).")
    parser.add_argument("out", type=Path, help="folder to write <page>.ipynb files into")
    args = parser.parse_args(argv)
    for path in write_notebooks(args.out):
        print(path)


if __name__ == "__main__":
    main()
