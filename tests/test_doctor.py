"""``python -m fastjax.doctor``: the report, and that it fails loudly on a broken install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from fastjax import _workaround, doctor

pytestmark = pytest.mark.xdist_group("doctor")  # the module fixture runs the doctor once


def run_doctor(*, env: dict[str, str] | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """Run the doctor in a fresh interpreter; ``prelude`` runs first (to break the install)."""
    code = f"{prelude}\nimport runpy, sys\nsys.argv = ['doctor']\nrunpy.run_module('fastjax.doctor', run_name='__main__')"
    full_env = {k: v for k, v in os.environ.items() if k != "FASTJAX_NO_CPU_WORKAROUND"}
    # this test process imported fastjax, which put the fix into XLA_FLAGS: start the child without it
    flags = [f for f in full_env.get("XLA_FLAGS", "").split() if f != _workaround.WORKAROUND_FLAG]
    full_env.update({"XLA_FLAGS": " ".join(flags), "FASTJAX_SIZE": "quick", **(env or {})})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          cwd=ROOT, timeout=180)


@pytest.fixture(scope="module")
def healthy() -> subprocess.CompletedProcess:
    return run_doctor()


def test_doctor_passes_on_this_machine(healthy):
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "All good" in healthy.stdout


@pytest.mark.parametrize("name", ["python", "jax", "jaxlib", "flax", "equinox", "optax", "pyPLNmodels",
                                  "torch", "scikit-learn", "size", "CPU fix", "devices", "probe"])
def test_doctor_reports(healthy, name):
    lines = [line.split() for line in healthy.stdout.splitlines() if line.startswith("  ")]
    assert any(" ".join(words).startswith(name) for words in lines), f"{name} missing from:\n{healthy.stdout}"


def test_doctor_reports_the_size_in_force(healthy):
    assert any(line.split()[:2] == ["size", "quick"] for line in healthy.stdout.splitlines()), healthy.stdout


def test_a_missing_package_fails_and_is_named():
    # None in sys.modules makes `import equinox` raise ImportError, as if it were not installed.
    result = run_doctor(prelude="import sys; sys.modules['equinox'] = None")
    assert result.returncode == 1
    assert "equinox does not import" in result.stderr
    assert "Equinox" in result.stderr  # says which chapters need it


def test_a_bad_size_fails():
    result = run_doctor(env={"FASTJAX_SIZE": "huge"})
    assert result.returncode == 1
    assert "FASTJAX_SIZE" in result.stderr


@pytest.mark.skipif(not _workaround.needs_workaround(), reason="this jaxlib has no known CPU miscompile")
def test_the_probe_catches_the_miscompile_when_the_fix_is_off():
    result = run_doctor(env={"FASTJAX_NO_CPU_WORKAROUND": "1", "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 1, result.stdout
    assert "probe" in result.stderr and "CPU fix is off" in result.stderr
    assert "WRONG" in result.stdout


def test_probe_result_tolerance():
    assert doctor.ProbeResult(jitted=100.0, reference=100.0).ok
    assert not doctor.ProbeResult(jitted=100.5, reference=100.0).ok  # 5e-3, the size of the miscompile
    assert doctor.ProbeResult(jitted=100.0005, reference=100.0).relative_error == pytest.approx(5e-6)
