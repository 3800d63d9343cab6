"""The chapters as Colab opens them: each generated ``.ipynb`` starts with an install cell.

The chapter sources (``chapters/**/*.md``) carry the lesson only. Colab cannot open MyST markdown,
so ``python -m fastjax.setup.colab OUT`` writes every chapter of ``_toc.yml`` as a notebook under ``OUT``
with the install cell put first; the notebooks workflow pushes them to the ``notebooks`` branch
that the book's Colab buttons open.

The install cell installs what Colab lacks (this package with its examples extra: Equinox,
pyPLNmodels, scikit-learn). It keeps Colab's own jax/jaxlib when they are recent enough for the
book, so that nothing downgrades them; when they are older than ``JAX_MIN`` it upgrades JAX and says
so. Outside Colab it does nothing, unless ``FASTJAX_FORCE_INSTALL=1`` (the tests set it, with
``FASTJAX_SOURCE`` pointing at a local checkout).

**The repository** is written in one place, ``repository.url`` of ``_config.yml``. ``FASTJAX_REPOSITORY``
(``OWNER/NAME``, as GitHub's ``GITHUB_REPOSITORY`` gives it, or the URL) replaces it: the workflows set
it to the repository they run in, so that a fork's notebooks install from the fork and its site's
buttons (``_ext/fastjax_book.py``) open the fork. A page that writes the default URL (the workshop's
``git clone``) gets the repository in use instead, in its notebook and on its page.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

REPOSITORY_ENV = "FASTJAX_REPOSITORY"
JAX_MIN = "0.10.2"  # the oldest JAX the book is run with; pyproject.toml's lower bound (a test checks)
GITHUB_REPOSITORY = re.compile(r"(?:https://github\.com/)?([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?/?")

INSTALL_TEMPLATE = '''\
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


def install_cell(repository: str | None = None) -> str:
    """The Colab install cell, installing this package from ``repository`` (default: ``repository_url()``)."""
    return INSTALL_TEMPLATE.format(JAX_MIN=JAX_MIN, REPOSITORY=repository or repository_url())


def config_repository_url(root: Path | None = None) -> str:
    """``repository.url`` of the book's ``_config.yml``: the one place the repository is written."""
    import yaml

    config = yaml.safe_load((find_root(root) / "_config.yml").read_text())
    return config["repository"]["url"]


def repository_url(default: str | None = None, root: Path | None = None) -> str:
    """The book's GitHub repository URL: ``FASTJAX_REPOSITORY`` when set (``OWNER/NAME`` or
    ``https://github.com/OWNER/NAME``), else ``default``, else ``config_repository_url(root)``."""
    value = os.environ.get(REPOSITORY_ENV, "").strip()
    if not value:
        return default or config_repository_url(root)
    match = GITHUB_REPOSITORY.fullmatch(value)
    if match is None:
        raise ValueError(f"{REPOSITORY_ENV} must be OWNER/NAME or https://github.com/OWNER/NAME, not {value!r}")
    return f"https://github.com/{match.group(1)}"


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
    """The chapter (a MyST ``.md``) as a plain notebook whose first cell is ``install_cell()``; where the
    repository in use is not ``_config.yml``'s, its markdown names the one in use."""
    import jupytext
    import nbformat

    nb = jupytext.read(chapter)
    nb.metadata.pop("jupytext", None)  # a plain notebook: no link back to a .md file
    default = config_repository_url(chapter.parent)
    repository = repository_url(default)
    if repository != default:
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = cell.source.replace(default, repository)
    if any(c.cell_type == "code" for c in nb.cells):
        nb.cells.insert(0, nbformat.v4.new_code_cell(install_cell(repository), metadata={"tags": ["colab-install"]}))
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
