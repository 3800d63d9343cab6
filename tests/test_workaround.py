"""The jaxlib CPU miscompile and its fix, each in a fresh process (XLA reads its flags once).

The first tests run on every leg: with fastjax imported first, a jitted float32 sum of the ELBO's
Stirling term matches float64 NumPy within ``workaround.TOLERANCE`` (on a jaxlib the probe finds
buggy, this fails if the fix is removed; tests/test_doctor.py shows the same sum wrong with the fix
off). Then the tolerance's margins (float32 rounding on one side, the bug on the other), the probe's
cache (only answers kept, per CPU, a read-only home survived), and the decision logic with a fake
probe: no version list, no flag on an XLA that lacks it, a one-line warning for each bad situation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
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


# ----------------------------------------------------------------------------- the tolerance's margins

U = 2.0**-24  # float32's unit roundoff


def stirling_terms():
    """The check's counts and terms: (y1 as float32, the terms in float32 computed by NumPy, in float64)."""
    y = np.random.default_rng(0).integers(0, 3000, size=(116, 114)).astype(np.float32).ravel()  # as CHECK
    y1 = y + (y == 0)
    t32 = np.float32(0.5) * np.log(np.float32(2 * np.pi) * y1) + y1 * np.log(y1 / np.float32(np.e))
    y64 = y1.astype(np.float64)
    return y1, t32.astype(np.float32), 0.5 * np.log(2 * np.pi * y64) + y64 * np.log(y64 / np.e)


def test_the_tolerance_sits_between_float32_rounding_and_the_bug_with_a_margin_each_side():
    bound = workaround.rounding_bound()
    assert 7.8e-4 < bound < 8.0e-4  # (N - 1) u = 7.88e-4 for N = 13,224 terms, the terms' own rounding 1e-6
    assert 2 * bound <= workaround.TOLERANCE  # a right answer, however it was summed, sits well inside
    assert 2 * workaround.TOLERANCE <= workaround.SMALLEST_WRONG_SEEN  # the mildest wrong one far outside


def test_float32_sums_in_any_order_stay_inside_the_bound_and_one_passes_1e_6():
    """The bound is a worst case: real float32 sums of the check's terms, in the orders a CPU may take
    (pairwise, one by one, sorted either way, 8 or 16 vector lanes), all sit inside it, and inside the
    tolerance. One of them, ascending one by one, is more than 1e-6 off: a tolerance of 1e-6 would call
    a right answer wrong."""
    _, t32, t64 = stirling_terms()
    exact = t64.sum()

    def err(total) -> float:
        return abs(float(total) - exact) / abs(exact)

    def one_by_one(t, axis=None):
        return np.cumsum(t, axis=axis, dtype=np.float32)[-1]  # NumPy's cumsum adds in order

    def lanes(t, k):  # k running sums, one per vector lane, then the lanes and the tail
        cut = t.size - t.size % k
        return one_by_one(np.concatenate([one_by_one(t[:cut].reshape(-1, k), axis=0), t[cut:]]))

    errors = {"pairwise": err(np.sum(t32, dtype=np.float32)), "in order": err(one_by_one(t32)),
              "ascending": err(one_by_one(np.sort(t32))), "descending": err(one_by_one(np.sort(t32)[::-1])),
              "8 lanes": err(lanes(t32, 8)), "16 lanes": err(lanes(t32, 16))}
    bound = workaround.rounding_bound()
    assert all(e <= bound for e in errors.values()), errors
    assert errors["ascending"] > 1e-6, errors


def test_xlas_float32_log_is_within_the_bounds_assumption():
    """``rounding_bound`` assumes each log right to 16 units of u (relative): measure XLA's jitted log on
    the check's arguments (2 pi y and y / e, rounded to float32 as JAX rounds them) against float64."""
    import jax
    import jax.numpy as jnp

    y1, _, _ = stirling_terms()
    for x in (np.float32(2 * np.pi) * y1, y1 / np.float32(np.e)):
        got = np.asarray(jax.jit(jnp.log)(jnp.asarray(x)), np.float64)
        exact = np.log(x.astype(np.float64))
        ulps = np.abs(got - exact) / (U * np.maximum(np.abs(exact), np.finfo(np.float32).tiny))
        assert ulps.max() <= 16, f"XLA's float32 log is {ulps.max():.1f} u off somewhere"


def test_the_probes_answer_here_is_on_the_right_side_of_the_tolerance(probe):
    """Measured on this machine: with the flag (or where the sum is right without it) the error sits
    far inside the tolerance; where the bug shows, far outside."""
    right = probe.error_with if probe.needs_flag else probe.error_without
    assert right <= workaround.rounding_bound() <= workaround.TOLERANCE / 2
    if probe.buggy:
        assert probe.error_without >= 2 * workaround.TOLERANCE


# ----------------------------------------------------------------------------- the probe's cache

class FakeRuns:
    """Stand-in for ``workaround.run_probe``: the answers without and with the flag, each call counted."""

    def __init__(self, without=(0.3, ""), with_flag=(1e-7, "")):
        self.answers = {"": without, workaround.WORKAROUND_FLAG: with_flag}
        self.calls: list[str] = []

    def __call__(self, flags: str, timeout: float):
        self.calls.append(flags)
        return self.answers[flags]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder and no answers kept in this process's memory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workaround.forget()
    yield tmp_path
    workaround.forget()  # the fake answers stay out of the rest of the session


def cached(folder) -> list:
    return sorted(folder.glob("fastjax/cpu-probe-*.json"))


def test_probe_is_cached_per_jaxlib(fresh_cache, monkeypatch):
    runs = FakeRuns()
    monkeypatch.setattr(workaround, "run_probe", runs)
    first = workaround.probe()
    workaround.forget()  # as in a new process: read back from disk
    second = workaround.probe()
    assert first == second and first.needs_flag
    assert runs.calls == ["", workaround.WORKAROUND_FLAG]  # once without and once with the flag, then the cache
    assert len(cached(fresh_cache)) == 1


@pytest.mark.parametrize("failure", ["the probe took over 120 s", "exit -11: Segmentation fault"])
def test_a_failed_with_flag_run_is_not_cached_and_is_retried(fresh_cache, monkeypatch, failure):
    runs = FakeRuns(with_flag=(None, failure))
    monkeypatch.setattr(workaround, "run_probe", runs)
    first = workaround.probe()
    assert first.error_without == 0.3 and first.error_with is None and not first.complete
    assert cached(fresh_cache) == []
    runs.answers[workaround.WORKAROUND_FLAG] = (1e-7, "")  # the next import: the with-flag run works
    second = workaround.probe()
    assert second.needs_flag and runs.calls == ["", workaround.WORKAROUND_FLAG] * 2
    assert len(cached(fresh_cache)) == 1


def test_a_failed_no_flag_run_is_not_cached(fresh_cache, monkeypatch):
    runs = FakeRuns(without=(None, "the probe took over 120 s"))
    monkeypatch.setattr(workaround, "run_probe", runs)
    assert workaround.probe().error_without is None and workaround.probe().error_without is None
    assert runs.calls == ["", ""] and cached(fresh_cache) == []  # the with-flag run is not even tried


def test_a_flag_xla_refuses_by_name_is_an_answer_and_is_cached(fresh_cache, monkeypatch):
    refused = "exit -6: F1125 parse_flags_from_env.cc:234] Unknown flag in XLA_FLAGS: --xla_cpu_..."
    runs = FakeRuns(with_flag=(None, refused))
    monkeypatch.setattr(workaround, "run_probe", runs)
    first = workaround.probe()
    assert first.flag_refused and first.complete and not first.flag_known
    workaround.forget()
    assert workaround.probe() == first and len(runs.calls) == 2 and len(cached(fresh_cache)) == 1


def test_a_damaged_or_stale_cache_entry_is_probed_again(fresh_cache, monkeypatch):
    runs = FakeRuns()
    monkeypatch.setattr(workaround, "run_probe", runs)
    path = workaround.cache_file(workaround.jaxlib_version())
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert workaround.probe().needs_flag and len(runs.calls) == 2
    incomplete = {"jaxlib": "x", "error_without": 0.3, "error_with": None, "note": "with the flag: exit 1: oops",
                  "cpu": workaround.cpu_features()}  # written by an older fastjax that kept failed runs
    path.write_text(json.dumps(incomplete))
    workaround.forget()
    assert workaround.probe().needs_flag and len(runs.calls) == 4


def test_the_cache_is_keyed_on_the_cpu(fresh_cache, monkeypatch):
    """A home directory shared by two machines: each CPU gets its own answer, and an entry that names
    another CPU (a hash collision, a hand-copied file) is not trusted."""
    runs = FakeRuns()
    monkeypatch.setattr(workaround, "run_probe", runs)
    monkeypatch.setattr(workaround, "cpu_features", lambda: "x86_64: avx avx2 fma sse sse2")
    workaround.probe()
    monkeypatch.setattr(workaround, "cpu_features", lambda: "x86_64: avx avx2 avx512f fma sse sse2")
    other = workaround.probe()
    assert len(runs.calls) == 4 and len(cached(fresh_cache)) == 2 and "avx512f" in other.cpu
    version = workaround.jaxlib_version()
    a, b = (workaround.cache_file(version, cpu) for cpu in ("x86_64: avx", "aarch64: asimd"))
    assert a != b and a.parent == b.parent
    # the entry for the first CPU, copied under the second CPU's name, is probed again
    first = workaround.cache_file(version, "x86_64: avx avx2 fma sse sse2")
    first.replace(workaround.cache_file(version, "x86_64: avx avx2 avx512f fma sse sse2"))
    workaround.forget()
    assert workaround.probe().cpu == "x86_64: avx avx2 avx512f fma sse sse2" and len(runs.calls) == 6


X86_CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC
flags		: fpu vme sse sse2 ht constant_tsc pni ssse3 fma sse4_1 avx hypervisor avx2 bmi2 sha_ni
bugs		: sysret_ss_attrs

processor	: 1
flags		: fpu sse avx512f
"""
ARM_CPUINFO = """processor	: 0
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes sve i8mm bf16
CPU implementer	: 0x41
"""


@pytest.mark.parametrize("text, expected", [
    (X86_CPUINFO, ["avx", "avx2", "bmi2", "fma", "pni", "sha_ni", "sse", "sse2", "sse4_1", "ssse3"]),
    (ARM_CPUINFO, ["aes", "asimd", "bf16", "evtstrm", "fp", "i8mm", "sve"]),
])
def test_cpu_features_read_the_instruction_set_of_the_first_processor(tmp_path, monkeypatch, text, expected):
    info = tmp_path / "cpuinfo"
    info.write_text(text)
    monkeypatch.setattr(workaround, "CPUINFO", info)
    features = workaround.cpu_features()
    assert features.split(": ", 1)[1].split() == expected  # no hypervisor, constant_tsc, ...; not processor 1's


def test_cpu_features_without_proc_cpuinfo_or_sysctl(tmp_path, monkeypatch, fresh_cache):
    """On a machine without /proc/cpuinfo (macOS without sysctl on the PATH, Windows): the architecture
    and platform.processor(), and the probe and its cache still work."""
    monkeypatch.setattr(workaround, "CPUINFO", tmp_path / "no-such-file")
    monkeypatch.setattr(workaround.shutil, "which", lambda name: None)
    monkeypatch.setattr(workaround.platform, "processor", lambda: "Intel64 Family 6 Model 85 Stepping 7, GenuineIntel")
    features = workaround.cpu_features()
    assert features == f"{workaround.platform.machine()}: Intel64 Family 6 Model 85 Stepping 7, GenuineIntel"
    monkeypatch.setattr(workaround, "run_probe", FakeRuns())
    assert workaround.probe().cpu == features and len(cached(fresh_cache)) == 1


def test_a_cache_that_cannot_be_written_warns_once_and_keeps_the_answer_in_memory(tmp_path, monkeypatch, fresh_cache):
    """A read-only or full home: here the cache folder's parent is a file (mkdir fails whoever runs the
    test, root included), then a full disk (the write fails)."""
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    runs = FakeRuns()
    monkeypatch.setattr(workaround, "run_probe", runs)
    with pytest.warns(RuntimeWarning, match="could not save its CPU probe's answer") as caught:
        first = workaround.probe()
        second = workaround.probe()  # from memory: no second probe, no second warning
    assert first == second and first.needs_flag and len(runs.calls) == 2 and len(caught) == 1

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "full"))

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workaround.tempfile, "NamedTemporaryFile", full)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process already: silent now
        assert workaround.probe().needs_flag
    assert not list((tmp_path / "full" / "fastjax").glob("*.tmp"))
    # forget(): as a new process, nothing kept in memory and nothing warned yet: it probes and warns again
    calls = len(runs.calls)
    workaround.forget()
    with pytest.warns(RuntimeWarning, match="could not save its CPU probe's answer") as caught:
        assert workaround.probe().needs_flag
    assert len(runs.calls) == calls + 2 and len(caught) == 1


def test_forget_drops_the_answer_in_memory_not_the_one_on_disk(fresh_cache, monkeypatch):
    runs = FakeRuns()
    monkeypatch.setattr(workaround, "run_probe", runs)
    first = workaround.probe()
    for path in cached(fresh_cache):  # the answer on disk, damaged: only the one in memory is left
        path.write_text("{not json")
    assert workaround.probe() == first and len(runs.calls) == 2  # from memory
    workaround.forget()
    assert workaround.probe() == first and len(runs.calls) == 4  # forgotten: probed again


def test_no_home_directory_falls_back_to_the_temp_folder(tmp_path, monkeypatch):
    """No XDG_CACHE_HOME and no home to be found (Path.home() raises in Python 3.12): the temp folder."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(workaround.tempfile, "gettempdir", lambda: str(tmp_path))

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(workaround.Path, "home", staticmethod(no_home))
    assert workaround.cache_file("1.2.3").parent == tmp_path / "fastjax"


IMPORT = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import fastjax
    from fastjax.setup import workaround
    again = workaround.probe()  # the doctor and the chapter ask again: the answer is in memory
print(json.dumps({"active": fastjax.CPU_WORKAROUND, "needs": again.needs_flag,
                  "warnings": [str(w.message) for w in caught]}))
"""


def test_import_fastjax_survives_a_read_only_home(tmp_path, probe):
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", workaround.DISABLE_ENV)}
    env.update(XDG_CACHE_HOME=str(blocker / "cache"), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", IMPORT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["active"] == got["needs"] == probe.needs_flag
    assert len(got["warnings"]) == 1 and "could not save" in got["warnings"][0], got["warnings"]
    # as a user of the fit command sees it: one line, no source line of fastjax's under it
    out = subprocess.run([sys.executable, "-c", "import fastjax"], env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 0 and len(lines) == 1 and lines[0].startswith("fastjax:0: RuntimeWarning: fastjax could not save"), out.stderr


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """The XDG spec: a relative XDG_CACHE_HOME is ignored (else a folder appears wherever the user stands)."""
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert workaround.cache_file("1.2.3").is_absolute()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert workaround.cache_file("1.2.3").parent == tmp_path / "fastjax"


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
    error, why = workaround.run_probe(workaround.WORKAROUND_FLAG, timeout=120)
    assert error is None and why.startswith("exit") and workaround.UNKNOWN_FLAG in why  # what flag_refused reads


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
    assert workaround.cache_file("1.2.3") == workaround.cache_file("1.2.3", workaround.cpu_features())
    assert a != b and a.parent == b.parent == tmp_path / "fastjax"
    assert "1.2.3" in a.name and f"py{sys.version_info.major}.{sys.version_info.minor}" in a.name
