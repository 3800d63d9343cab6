"""The jaxlib CPU miscompile and its fix, each in a fresh process (XLA reads its flags once).

The first tests run on every leg: with fastjax imported first, a jitted float32 sum of the ELBO's
Stirling term matches float64 NumPy to 1e-6 (on a jaxlib the probe finds buggy, this fails if the
fix is removed; tests/test_doctor.py shows the same sum wrong with the fix off). The rest check the
decision logic with a fake probe: no version list, no flag on an XLA that lacks it, a one-line
warning for each bad situation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fastjax.setup import workaround

CHECK = r"""
import json, fastjax
from fastjax.setup import workaround
print(json.dumps({"error": workaround.check_in_this_process(), "active": fastjax.workaround_active()}))
"""


def run_check(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", workaround.DISABLE_ENV)}
    out = subprocess.run([sys.executable, "-c", CHECK], env={**clean, "JAX_PLATFORMS": "cpu", **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probe() -> workaround.Probe:
    result = workaround.probe()
    assert result is not None and result.error_without is not None, f"the probe did not run: {result}"
    return result


def test_elbo_sum_is_right_with_fastjax_imported_first():
    result = run_check()
    assert result["error"] <= workaround.TOLERANCE, f"jitted float32 sum off by {result['error']:.2e}"


def test_the_fix_is_on_exactly_when_the_probe_says_so(probe):
    assert run_check()["active"] == probe.needs_flag


def test_probe_is_cached_per_jaxlib(probe, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    monkeypatch.setattr(workaround, "_run_probe", lambda flags, timeout: (calls.append(flags), (0.3, ""))[1])
    first = workaround.probe()
    second = workaround.probe()
    assert first == second and len(calls) == 2  # once without and once with the flag, then from the cache
    assert list(tmp_path.glob("fastjax/cpu-probe-*.json"))


def fake(monkeypatch, result: workaround.Probe | None, started: bool = False, flags: str = "") -> None:
    monkeypatch.setattr(workaround, "probe", lambda refresh=False, timeout=120.0: result)
    monkeypatch.setattr(workaround, "backend_started", lambda: started)
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.delenv(workaround.DISABLE_ENV, raising=False)


BUGGY = workaround.Probe("9.9.9", error_without=0.4, error_with=1e-7)


def test_flag_is_added_once_and_keeps_other_flags(monkeypatch):
    fake(monkeypatch, BUGGY, flags="--xla_dump_to=/tmp/x")
    assert workaround.apply_cpu_workaround() and workaround.apply_cpu_workaround()
    flags = os.environ["XLA_FLAGS"].split()
    assert flags.count(workaround.WORKAROUND_FLAG) == 1 and "--xla_dump_to=/tmp/x" in flags


def test_no_flag_where_the_sum_is_right(monkeypatch):
    fake(monkeypatch, workaround.Probe("9.9.9", error_without=1e-8, error_with=1e-8))
    assert not workaround.apply_cpu_workaround() and os.environ["XLA_FLAGS"] == ""


def test_no_flag_where_xla_does_not_know_it(monkeypatch):
    fake(monkeypatch, workaround.Probe("9.9.9", error_without=0.4, error_with=None, note="Unknown flag"))
    with pytest.warns(RuntimeWarning, match="does not fix it here"):
        assert not workaround.apply_cpu_workaround()
    assert os.environ["XLA_FLAGS"] == ""


def test_warns_when_jax_already_started(monkeypatch):
    fake(monkeypatch, BUGGY, started=True)
    with pytest.warns(RuntimeWarning, match="Restart the kernel"):
        assert not workaround.apply_cpu_workaround()


def test_leaves_a_users_own_value_alone_and_says_so(monkeypatch):
    fake(monkeypatch, BUGGY, flags=f"{workaround.FLAG_NAME}=")
    with pytest.warns(RuntimeWarning, match="left it alone"):
        assert not workaround.apply_cpu_workaround()
    assert os.environ["XLA_FLAGS"] == f"{workaround.FLAG_NAME}="


def test_a_broken_jaxlib_gets_one_line_not_an_abort(monkeypatch):
    fake(monkeypatch, workaround.Probe("9.9.9", error_without=None, error_with=None, note="exit -6: abort"))
    with pytest.warns(RuntimeWarning, match="could not check jaxlib 9.9.9"):
        assert not workaround.apply_cpu_workaround()


def test_an_unknown_flag_is_caught_by_the_probe_not_by_an_abort(monkeypatch):
    """The probe really runs XLA with a flag it does not know: it reports the failure, this process lives."""
    monkeypatch.setattr(workaround, "WORKAROUND_FLAG", "--xla_no_such_flag_for_fastjax=1")
    error, why = workaround._run_probe(workaround.WORKAROUND_FLAG, timeout=120)
    assert error is None and why.startswith("exit")


BACKEND = r"""
import json, sys, fastjax
from fastjax.setup import workaround
unimported = workaround.backend_started()
jax_loaded = "jax" in sys.modules
import jax
count = jax.config.jax_num_cpu_devices
before = workaround.backend_started()
same = jax.config.jax_num_cpu_devices == count
jax.numpy.ones(1).block_until_ready()
print(json.dumps([unimported, jax_loaded, before, same, workaround.backend_started(), len(jax.devices("cpu"))]))
"""


def test_backend_started_tells_without_starting_it_or_importing_jax():
    """False before the first computation (JAX not imported, or imported), leaving jax_num_cpu_devices as
    it was, so the backend starts with its default one CPU device; True after it."""
    clean = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    out = subprocess.run([sys.executable, "-c", BACKEND], env={**clean, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False, False, True, True, 1]


def test_cache_file_is_per_jaxlib_and_python(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    a, b = workaround.cache_file("1.2.3"), workaround.cache_file("1.2.4")
    assert a != b and a.parent == b.parent == tmp_path / "fastjax"
    assert "1.2.3" in a.name and f"py{sys.version_info.major}.{sys.version_info.minor}" in a.name
