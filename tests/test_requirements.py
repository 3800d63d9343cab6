"""requirements.txt, the file Binder and ``pip install -r requirements.txt`` read, runs the chapters.

It names the package with its extras and no version (pyproject.toml is the one dependency list). A
bare virtual environment, with nothing but what the file installs, executes the landing page, whose
table lists the versions of what the chapters use: the examples extra must have brought them. The
environment is made with the machinery of tests/test_colab.py (pip's constraints and wheel folders,
uv where setup-env.sh put it; a copy of the checkout, so that the editable install leaves nothing in
the working tree).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jupytext
import pytest

from conftest import ROOT
from test_colab import CLEAN_COPY_IGNORE, add_kernel, clean_env, constraints_file, execute_notebook, install_base

REQUIREMENTS = ROOT / "requirements.txt"
CHAPTER = "chapters/index"  # the cheapest page that imports fastjax; its table names what is installed


def requirement_lines() -> list[str]:
    return [line.strip() for line in REQUIREMENTS.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_requirements_names_the_package_with_extras_and_no_version():
    lines = requirement_lines()
    assert len(lines) == 1, f"requirements.txt holds one line, the package with its extras: {lines}"
    match = re.fullmatch(r"-e \.\[([\w,-]+)\]", lines[0])
    assert match, f"requirements.txt must install this checkout with extras, not {lines[0]!r}"
    extras = set(match.group(1).split(","))
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(declared), f"extras pyproject.toml lacks: {extras - set(declared)}"
    assert {"examples", "run"} <= extras, "the chapters need the examples extra and the run extra (jupytext, ipykernel)"
    assert "pyproject.toml" in REQUIREMENTS.read_text(), "the comment says where the versions are"


@pytest.mark.pinned  # installs torch; the newest leg has none
@pytest.mark.timeout(600)
def test_a_bare_environment_installed_from_requirements_runs_a_chapter(tmp_path):
    source = tmp_path / "checkout"
    shutil.copytree(ROOT, source, ignore=CLEAN_COPY_IGNORE)
    venv = tmp_path / "bare"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    constraints = constraints_file(tmp_path / "constraints.txt")
    env = clean_env(PIP_CONSTRAINT=str(constraints), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    # as a reader would: `pip install -r requirements.txt` in the checkout. No bytecode compiled at
    # install: the kernel compiles what the page imports, and torch (installed, never imported here)
    # would cost most of the time.
    install_base(python, ["-r", "requirements.txt"], env, cwd=source, compile_bytecode=False)
    jupyter_path = add_kernel(python, tmp_path / "jupyter", env)
    run_env = clean_env(PATH=env["PATH"], JUPYTER_PATH=str(jupyter_path), FASTJAX_SIZE="quick",
                        FASTJAX_MEASUREMENTS=str(tmp_path / "measurements"))
    code = execute_notebook(jupytext.read(source / f"{CHAPTER}.md"), CHAPTER, python, tmp_path, run_env, source)
    shown = "".join(o.get("data", {}).get("text/markdown", "") for c in code for o in c.outputs)
    for package in ("jax", "flax", "equinox", "optax", "pyPLNmodels", "torch", "scikit-learn"):
        assert re.search(rf"\| {re.escape(package)} \| \d", shown), f"{package} is not installed:\n{shown}"
