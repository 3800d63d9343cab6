"""The generated Colab notebooks run in a fresh environment that has only Colab's base.

A new virtual environment gets what Colab ships (jax, jaxlib, flax, optax, numpy, matplotlib, and
ipykernel plus nbclient to run a notebook). A chapter is turned into the notebook Colab opens
(``fastjax.setup.colab.colab_notebook``: the install cell first) and executed there with
``FASTJAX_FORCE_INSTALL=1``, so that its first cell installs the rest (this book's package with its
examples extra: Equinox, pyPLNmodels, torch, scikit-learn) from a copy of this checkout. One
environment serves both cases a reader meets, in turn (one install of torch, not two):

- **too old**: the environment starts with a JAX older than ``fastjax.setup.colab.JAX_MIN``. The landing
  page's install cell must upgrade it, say so, and end in a working kernel;
- **current**: then Colab's JAX is recent enough. A PLN chapter (pyPLNmodels, torch, the fit) must
  run top to bottom, and its install cell must keep jax/jaxlib as they were (it never downgrades them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT
from fastjax.setup.colab import JAX_MIN, colab_notebook

pytestmark = pytest.mark.pinned
OLD_BASE = {"jax": "0.9.2", "jaxlib": "0.9.2", "flax": "0.12.0"}  # older than JAX_MIN: the cell must upgrade
COLAB_BASE = ("jax", "jaxlib", "flax", "optax", "numpy", "matplotlib")
RUNNER = ("ipykernel", "nbclient", "nbformat")
INSTALLED_BY_THE_CELL = ("fastjax", "equinox", "pyPLNmodels", "torch", "scikit-learn")
KERNEL = "fastjax-colab-test"
# pip reads its machine-wide constraints from its config; PIP_CONSTRAINT replaces that setting, so
# the file given to pip repeats those lines and pins torch to the build of this environment.
MACHINE_CONSTRAINTS = Path("/etc/xdg/pip/constraints.txt")
CLEAN_COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "_build", ".tools", "node_modules", "*.ipynb",
                                           ".pytest_cache", "__pycache__", "build", "*.egg-info")

DRIVER = """\
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
client = NotebookClient(nb, kernel_name=sys.argv[3], timeout=600, resources={"metadata": {"path": sys.argv[4]}})
try:
    client.execute()
finally:
    nbformat.write(nb, sys.argv[2])
"""

VERSIONS = """\
import json
from importlib import metadata
out = {}
for name in %r:
    try:
        out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def versions(python: Path, names) -> dict[str, str | None]:
    out = subprocess.run([str(python), "-c", VERSIONS % (tuple(names),)], capture_output=True, text=True,
                         check=True, timeout=60)
    return json.loads(out.stdout)


def here(name: str) -> str:
    return metadata.version(name)


def constraints_file(path: Path) -> Path:
    lines = []
    for source in filter(None, [os.environ.get("PIP_CONSTRAINT"), str(MACHINE_CONSTRAINTS)]):
        for item in source.split():
            if Path(item).is_file():
                lines += [ln for ln in Path(item).read_text().splitlines() if not ln.lstrip().startswith("torch==")]
    try:
        torch = here("torch")  # the build installed here (a CPU build on the CI machine)
    except metadata.PackageNotFoundError:
        torch = "2.13.0"
    lines.append(f"torch=={torch}")
    path.write_text("\n".join(lines) + "\n")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE is set on the CI machine: without it dropped, each of the two kernels
    # compiled jax, flax and torch from source again; with it dropped, the second kernel reuses what
    # the first compiled, as it would in a reader's runtime.
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "XLA_FLAGS", "JUPYTER_PATH", "PYTEST_CURRENT_TEST", "MPLBACKEND",
            "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # PIP_NO_COMPILE=0 is pip's --no-compile: pip stores the value in the option's "compile" field, so
    # 0 means "do not compile" (checked in a fresh venv: with 1, __pycache__ is still written). Here
    # pip installed torch in 42 s with byte-compiling and in 14 s without; this test is about what gets
    # installed and whether the notebook runs, and Python compiles what the notebook imports anyway.
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_COMPILE="0", **extra)
    return env


def install_base(python: Path, packages: list[str], env: dict[str, str], cwd: Path | None = None,
                 compile_bytecode: bool = True) -> None:
    """Install Colab's base into the test's environment: with the uv that setup-env.sh put beside this
    Python, given pip's settings (scripts/pip_settings_for_uv.py), else with pip. Only the base: the
    install cells under test run pip, as on Colab. (Measured here, quiet: pip 25 s, uv 11.5 s; with the
    bytecode kept between kernels too, this test took 81 s instead of 107 s.) tests/test_requirements.py
    installs requirements.txt with it (``cwd``: where its relative paths start, as pip reads them)."""
    uv = Path(sys.executable).with_name("uv")
    if uv.exists():
        settings = subprocess.run([sys.executable, str(ROOT / "scripts" / "pip_settings_for_uv.py")], env=env,
                                  capture_output=True, text=True, check=True, timeout=60).stdout.split()
        compile_option = ["--compile-bytecode"] if compile_bytecode else []
        cmd = [str(uv), "pip", "install", "--quiet", "--python", str(python), *compile_option, *settings, *packages]
    else:
        cmd = [str(python), "-m", "pip", "install", "-q", *packages]
    subprocess.run(cmd, check=True, env=env, timeout=300, cwd=cwd)


def add_kernel(python: Path, folder: Path, env: dict[str, str]) -> Path:
    """Register a kernel of ``python`` named ``KERNEL`` under ``folder`` only; return its JUPYTER_PATH."""
    subprocess.run([str(python), "-m", "ipykernel", "install", "--prefix", str(folder), "--name", KERNEL],
                   check=True, env=env, capture_output=True, timeout=60)
    return folder / "share" / "jupyter"


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:3] if x.isdigit())


def run_notebook(chapter: str, python: Path, tmp_path: Path, env: dict[str, str], source: Path):
    """Run the chapter as Colab gets it in the test's kernel; return what its install cell printed."""
    nb = colab_notebook(ROOT / f"{chapter}.md")
    assert "FASTJAX_FORCE_INSTALL" in nb.cells[0].source, "the Colab notebook must start with the install cell"
    code = execute_notebook(nb, chapter, python, tmp_path, env, source)
    return "".join(o.get("text", "") for o in code[0].outputs)


def execute_notebook(nb, chapter: str, python: Path, tmp_path: Path, env: dict[str, str], source: Path):
    """Execute ``nb`` (the chapter ``chapter`` of the checkout ``source``) top to bottom with the
    test's kernel (``KERNEL`` on ``env``'s JUPYTER_PATH), run by ``python``; return its code cells."""
    name = chapter.replace("/", "_")
    notebook, executed = tmp_path / f"{name}.ipynb", tmp_path / f"{name}.executed.ipynb"
    nbformat.write(nb, notebook)
    workdir = source / Path(chapter).parent
    result = subprocess.run([str(python), "-c", DRIVER, str(notebook), str(executed), KERNEL, str(workdir)],
                            capture_output=True, text=True, env=env, timeout=480)
    assert result.returncode == 0, f"{chapter} failed in the Colab-like environment:\n{result.stderr[-6000:]}"
    ran = nbformat.read(executed, as_version=4)
    code = [c for c in ran.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{chapter}: not every cell ran"
    assert not any(o.get("output_type") == "error" for c in code for o in c.outputs
                   if "raises-exception" not in c.metadata.get("tags", [])), f"{chapter}: a cell raised"
    return code


@pytest.mark.timeout(900)
def test_colab_notebooks_run_in_a_colab_like_environment(tmp_path):
    # 1. Colab's base with a JAX that is too old for the book, and nothing else.
    venv = tmp_path / "colab"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    constraints = constraints_file(tmp_path / "constraints.txt")
    env = clean_env(PIP_CONSTRAINT=str(constraints), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    pins = [f"{p}=={OLD_BASE.get(p, here(p))}" for p in COLAB_BASE]
    install_base(python, [*pins, *RUNNER], env)
    old = versions(python, COLAB_BASE + INSTALLED_BY_THE_CELL)
    assert all(old[p] is None for p in INSTALLED_BY_THE_CELL), old
    assert release(old["jax"]) < release(JAX_MIN), old

    # 2. A kernel of that environment, known only to this test.
    jupyter_path = add_kernel(python, tmp_path / "jupyter", env)

    # 3. The install cells install from a copy of this checkout (a copy, so that pip's build leaves
    #    nothing behind in the working tree).
    source = tmp_path / "checkout"
    shutil.copytree(ROOT, source, ignore=CLEAN_COPY_IGNORE)
    run_env = clean_env(PIP_CONSTRAINT=str(constraints), PATH=env["PATH"],
                        JUPYTER_PATH=str(jupyter_path),
                        FASTJAX_FORCE_INSTALL="1", FASTJAX_SOURCE=source.as_uri(),
                        FASTJAX_SIZE="quick", FASTJAX_MEASUREMENTS=str(tmp_path / "measurements"))

    # 4. Too old: the landing page's cell upgrades JAX, says so, and installs what Colab lacks.
    said = run_notebook("chapters/index", python, tmp_path, run_env, source)
    upgraded = versions(python, COLAB_BASE + INSTALLED_BY_THE_CELL)
    assert f"This runtime has JAX {old['jax']}" in said and "upgrading JAX" in said, said
    assert release(upgraded["jax"]) >= release(JAX_MIN) and release(upgraded["jaxlib"]) >= release(JAX_MIN), upgraded
    missing = [p for p in INSTALLED_BY_THE_CELL if upgraded[p] is None]
    assert missing == [], f"the install cell did not install {missing}"
    assert upgraded["torch"] == constraints.read_text().split("torch==")[-1].strip(), "pip pulled another torch"

    # 5. Current: a PLN chapter runs top to bottom, and its cell keeps Colab's JAX as it was.
    said = run_notebook("chapters/pln/00-model", python, tmp_path, run_env, source)
    after = versions(python, COLAB_BASE + INSTALLED_BY_THE_CELL)
    assert "upgrading JAX" not in said, said
    assert {p: after[p] for p in ("jax", "jaxlib")} == {p: upgraded[p] for p in ("jax", "jaxlib")}
