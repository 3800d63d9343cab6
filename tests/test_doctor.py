"""``python -m fastjax.setup.doctor``: one line per check, and a non-zero exit on a broken install or a wrong sum."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from fastjax.setup import doctor, workaround

pytestmark = pytest.mark.xdist_group("doctor")  # the module fixture runs the doctor once


def run_doctor(*, env: dict[str, str] | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """Run the doctor in a fresh interpreter; ``prelude`` runs first (to break the install)."""
    code = f"{prelude}\nimport runpy, sys\nsys.argv = ['doctor']\nrunpy.run_module('fastjax.setup.doctor', run_name='__main__')"
    full_env = {k: v for k, v in os.environ.items() if k not in (workaround.DISABLE_ENV, "XLA_FLAGS")}
    full_env.update({"FASTJAX_SIZE": "quick", "JAX_PLATFORMS": "cpu", **(env or {})})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def healthy() -> subprocess.CompletedProcess:
    return run_doctor()


def lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    """check name -> 'pass' or 'FAIL'."""
    out = {}
    for line in result.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("pass", "FAIL"):
            out[words[1]] = words[0]
    return out


def test_doctor_passes_here_and_reports_every_check(healthy):
    if __import__("importlib.util").util.find_spec("torch") is None:
        assert healthy.returncode == 1 and lines(healthy)["torch"] == "FAIL"  # the newest leg has no torch
    else:
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        assert set(lines(healthy).values()) == {"pass"}
    for name in ("python", "jax", "jaxlib", "flax", "equinox", "optax", "size", "devices", "CPU", "ELBO"):
        assert name in lines(healthy), f"{name} missing from:\n{healthy.stdout}"


def by_name(rows) -> dict[str, tuple[bool, str, str]]:
    return {name.split()[0]: (ok, found, todo) for name, ok, found, todo in rows}


def test_a_missing_package_fails_and_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "equinox", None)  # `import equinox` now raises ImportError
    ok, found, todo = by_name(doctor.checks())["equinox"]
    assert not ok and "Equinox variants" in found and todo.startswith("pip install")


def test_a_bad_size_fails(monkeypatch, capsys):
    monkeypatch.setenv("FASTJAX_SIZE", "huge")
    assert not by_name(doctor.checks())["size"][0]
    assert doctor.main() == 1 and "FAIL  size" in capsys.readouterr().out


def test_a_wrong_sum_fails_with_the_fix_off():
    probe = workaround.probe()
    if probe is None or not probe.needs_flag:
        pytest.skip("this jaxlib computes the sum right without the fix")
    result = run_doctor(env={workaround.DISABLE_ENV: "1"})
    assert result.returncode == 1 and lines(result)["ELBO"] == "FAIL"
    assert "the CPU fix is off" in result.stdout
