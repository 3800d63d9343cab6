"""Fix a jaxlib CPU miscompile before JAX starts, on exactly the releases that have it.

Some jaxlib releases (seen in 0.10.2 and 0.12.0.1) fuse a float32 reduction of elementwise
log/multiply terms, such as the Stirling approximation of log(y!) in the PLN ELBO, into a library
call that returns a wrong sum on CPU (from 0.5 % to 44 % off). The XLA flag ``WORKAROUND_FLAG``
turns that fusion type off. Releases are not trusted by their version string: once per installed
jaxlib and CPU, subprocesses compute the sum under ``jax.jit`` without and with the flag and compare
it with float64 NumPy. The flag is set only when the bug shows and this XLA knows the flag (an
unknown flag in ``XLA_FLAGS`` makes XLA abort).

The answer is kept on disk per jaxlib, Python and CPU (``cpu_features``: the architecture and its
instruction-set extensions, which decide what XLA and its libraries compile to; a home directory is
often shared between machines). Only an answer is kept: a probe in which both runs gave a number, or
in which XLA refused the flag by name; a run that timed out or crashed is tried again on the next
import. Where the cache cannot be written (a read-only or full home), the answer is used in memory,
with one warning. ``forget`` drops what this process keeps in memory (answers and warnings given), as
if it had just started: the next ``probe`` reads the disk again, or probes.

``TOLERANCE`` (what counts as right) is derived from float32 rounding, not guessed: see
``rounding_bound``.

This module must not import jax: XLA reads ``XLA_FLAGS`` once, when its first backend starts
(``backend_started`` only looks at a JAX that something else imported).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

FLAG_NAME = "--xla_cpu_experimental_ynn_fusion_type"
WORKAROUND_FLAG = f"{FLAG_NAME}=-LIBRARY_FUSION_TYPE_REDUCE"
DISABLE_ENV = "FASTJAX_NO_CPU_WORKAROUND"  # "1": never set the flag (to show the bug)
# What counts as right: the relative error of the check's float32 sum against float64 NumPy. Float32
# rounding alone can take that sum, in the worst case and in any summation order (any CPU, any vector
# width), ROUNDING_BOUND = 7.9e-4 from the exact value (``rounding_bound`` derives it: (N - 1) u for
# N = 13,224 terms and u = 2^-24, the terms' own rounding adding 1e-6). The smallest error the bug has
# given, SMALLEST_WRONG_SEEN, is 0.5 % (jaxlib 0.10.2 on the oaks Stirling term; 28 % and 44 % on this
# check with 0.10.2 and 0.12.0.1). TOLERANCE sits at about their geometric mean, 2.5x above the first and
# 2.5x below the second (tests/test_workaround.py asserts both margins). Typical right answers are far
# smaller (1e-7), but 1e-6 would not do: the same float32 terms summed one by one in ascending order,
# a legal order, are 4.3e-6 off.
TOLERANCE = 2e-3
SMALLEST_WRONG_SEEN = 5e-3
PROBE_VERSION = 2  # bump when the probe or its cache changes, so that cached answers are not reused

# The check: ``relative_error`` of a jitted float32 Stirling sum (the PLN ELBO's constant term, on
# counts the size of the oaks data) against float64 NumPy. The probe runs it in a subprocess.
CHECK = """\
import numpy as np, jax, jax.numpy as jnp
y = np.random.default_rng(0).integers(0, 3000, size=(116, 114)).astype(np.float32)
def stirling_sum(y):
    y1 = y + (y == 0)
    return jnp.sum(0.5 * jnp.log(2 * jnp.pi * y1) + y1 * jnp.log(y1 / jnp.e))
y1 = y.astype(np.float64) + (y == 0)
exact = np.sum(0.5 * np.log(2 * np.pi * y1) + y1 * np.log(y1 / np.e))
got = float(jax.jit(stirling_sum)(jnp.asarray(y)))
relative_error = abs(got - exact) / abs(exact)
"""
PROBE = CHECK + 'import json; print(json.dumps({"relative_error": relative_error}))\n'


def check_in_this_process() -> float:
    """The check's relative error computed by JAX in this process, with whatever XLA_FLAGS it started with."""
    scope: dict = {}
    exec(compile(CHECK, "<fastjax cpu check>", "exec"), scope)
    return float(scope["relative_error"])


def rounding_bound(log_ulps: float = 16.0) -> float:
    """The largest relative error that float32 rounding alone can give the check's sum (first order in
    u = 2^-24), in any summation order: what a right answer can be off by, on any CPU.

    Each term ``0.5 log(2 pi y) + y log(y / e)`` is computed with six roundings (the constants 2 pi
    and e, the product, the quotient, the product by y, the addition) and two logs, each assumed right
    to ``log_ulps`` units of u relative (generous: tests/test_workaround.py measures XLA's terms
    against float64 and checks each term's error against this model). Then any order of summing N
    terms adds at most gamma_(N-1) = (N-1) u / (1 - (N-1) u) times the sum of their magnitudes
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2). The float64
    reference adds (N + 6) 2^-53. Needs NumPy (not JAX).
    """
    import numpy as np

    u = 2.0**-24
    y = np.random.default_rng(0).integers(0, 3000, size=(116, 114)).astype(np.float64).ravel()  # as CHECK
    y1 = y + (y == 0)
    log_a, log_b = np.log(2 * np.pi * y1), np.log(y1 / np.e)
    terms = 0.5 * log_a + y1 * log_b
    per_term = u * (1 + 0.5 * log_ulps * np.abs(log_a) + 2 * y1 + (log_ulps + 1) * y1 * np.abs(log_b) + np.abs(terms))
    n = terms.size
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    exact = abs(terms.sum())
    return float((per_term.sum() + gamma * (np.abs(terms).sum() + per_term.sum())) / exact + (n + 6) * 2.0**-53)


@dataclass
class Probe:
    """What the probe found for one jaxlib on one CPU: the error without and with the flag (None: the
    run failed, ``note`` says why), and the CPU (``cpu_features()``) it ran on."""

    jaxlib: str
    error_without: float | None
    error_with: float | None
    note: str = ""
    cpu: str = ""

    @property
    def buggy(self) -> bool:
        return self.error_without is not None and self.error_without > TOLERANCE

    @property
    def flag_known(self) -> bool:
        return self.error_with is not None

    @property
    def needs_flag(self) -> bool:
        """The bug shows, this XLA knows the flag, and the flag fixes it."""
        return self.buggy and self.flag_known and self.error_with <= TOLERANCE

    @property
    def flag_refused(self) -> bool:
        """XLA refused the flag by name ("Unknown flag in XLA_FLAGS"): a lasting answer, not a mishap."""
        return self.error_with is None and UNKNOWN_FLAG in self.note

    @property
    def complete(self) -> bool:
        """Worth keeping on disk: both runs gave a number, or XLA refused the flag by name. A run that
        timed out or crashed is not an answer: the next import probes again."""
        return self.error_without is not None and (self.error_with is not None or self.flag_refused)


UNKNOWN_FLAG = "Unknown flag"  # what XLA writes (then aborts) for a flag it does not know, e.g.
# "Unknown flag in XLA_FLAGS: --xla_..." (parse_flags_from_env.cc, jaxlib 0.10.2 and 0.12.0.1)
CPUINFO = Path("/proc/cpuinfo")
# x86 instruction-set extensions, as /proc/cpuinfo names them: what LLVM (XLA's code generator) and the
# libraries XLA:CPU calls (YNNPACK, oneDNN) choose their code by. Other flags (power management, bugs,
# virtualisation) are left out, so that two machines with the same instruction set share the answer.
X86_ISA = re.compile(r"^(sse|ssse|pni|avx|fma|f16c|bmi|abm|lzcnt|popcnt|movbe|adx|aes|vaes|pclmul|vpclmul|sha"
                     r"|gfni|amx|xop|3dnow|cx16|rdrand|rdseed|prefetchw)")


def _cpuinfo_flags(path: Path | None = None) -> list[str] | None:
    """The instruction-set flags of the first processor in ``path`` (default ``CPUINFO``, Linux), or None."""
    path = CPUINFO if path is None else path
    try:
        with open(path, errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "flags":  # x86
                    return sorted(w for w in value.split() if X86_ISA.match(w))
                if key == "features":  # ARM: every word is an instruction-set feature
                    return sorted(value.split())
                if not line.strip():  # the first processor's block has ended
                    break
    except OSError:
        pass
    return None


def _sysctl_flags() -> list[str] | None:
    """macOS: the CPU's features from sysctl (x86 words, or Apple silicon's ``hw.optional`` set to 1)."""
    if shutil.which("sysctl") is None:
        return None
    try:
        out = subprocess.run(["sysctl", "machdep.cpu.features", "machdep.cpu.leaf7_features", "hw.optional"],
                             capture_output=True, text=True, timeout=10).stdout  # unknown names: skipped
    except (OSError, subprocess.SubprocessError):
        return None
    words = []
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.startswith("hw.optional."):
            words += [key.removeprefix("hw.optional.")] if value.strip() == "1" else []
        else:
            words += value.split()
    return sorted(words) or None


def instruction_set_flags() -> list[str] | None:
    """This CPU's instruction-set extensions as /proc/cpuinfo (Linux) or sysctl (macOS) names them, or None."""
    return _cpuinfo_flags() or _sysctl_flags()


def cpu_features() -> str:
    """This CPU as the probe's cache sees it: the architecture and its instruction-set extensions (from
    /proc/cpuinfo on Linux, sysctl on macOS), else the architecture and ``platform.processor()`` (on
    Windows its family, model and stepping)."""
    arch = platform.machine() or "unknown"
    flags = instruction_set_flags()
    if flags is None:
        return f"{arch}: {platform.processor() or 'unknown processor'}"
    return f"{arch}: {' '.join(flags)}"


def jaxlib_version() -> str | None:
    """The installed jaxlib version string, or None when jaxlib is not installed."""
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def cache_file(version: str, cpu: str | None = None) -> Path:
    """Where the probe's answer for jaxlib ``version``, this Python and the CPU ``cpu`` (default: this
    one, ``cpu_features()``) is kept, under ``$XDG_CACHE_HOME/fastjax`` when that is an absolute path (default ``~/.cache/fastjax``)."""
    cpu = cpu_features() if cpu is None else cpu
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec: a relative one is ignored (it would land in the working folder)
        base = Path(xdg) / "fastjax"
    else:
        try:
            base = Path.home() / ".cache" / "fastjax"
        except RuntimeError:  # no home directory to be found (Python 3.12 raises, 3.11 returns "~")
            base = Path(tempfile.gettempdir()) / "fastjax"
    digest = hashlib.sha256(cpu.encode()).hexdigest()[:12]
    tag = f"{version}-py{sys.version_info.major}.{sys.version_info.minor}-cpu{digest}-v{PROBE_VERSION}"
    return base / f"cpu-probe-{tag}.json"


def run_probe(flags: str, timeout: float) -> tuple[float | None, str]:
    """The check's relative error in a fresh CPU-only process started with ``XLA_FLAGS=flags``, or
    (None, why) when that process failed or took over ``timeout`` seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"the probe took over {timeout:.0f} s"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {out.returncode}: {last[:200]}"
    return float(json.loads(out.stdout.strip().splitlines()[-1])["relative_error"]), ""


_in_memory: dict[Path, Probe] = {}  # answers this process found or read (where the disk cannot keep them)
_warned: set[str] = set()  # warnings given once per process


def forget() -> None:
    """Forget the probe answers this process keeps in memory and the warnings it has given, as a new
    process would start: the next ``probe`` reads the answer on disk (or probes again), and a cache that
    cannot be written warns again. The answers on disk stay."""
    _in_memory.clear()
    _warned.clear()


def _load(cache: Path, cpu: str) -> Probe | None:
    """The answer kept in ``cache`` for the CPU ``cpu``, or None (none, unreadable, damaged, another CPU)."""
    try:
        kept = Probe(**json.loads(cache.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # absent, unreadable or damaged: probe again
    return kept if kept.cpu == cpu and kept.complete else None


def _save(cache: Path, result: Probe) -> None:
    """Write ``result`` to ``cache`` atomically; on an OS error (read-only or full disk) warn once."""
    tmp = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as f:
            tmp = f.name
            json.dump(asdict(result), f)
        os.replace(tmp, cache)
    except OSError as err:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if "save" not in _warned:
            _warned.add("save")
            # one line, "fastjax: RuntimeWarning: ...": no source line of fastjax's to puzzle a user of the command
            warnings.warn_explicit(f"fastjax could not save its CPU probe's answer in {cache.parent} ({err}); it uses "
                                   "the answer in this process only, and the next Python process probes again (a few "
                                   "seconds). Set XDG_CACHE_HOME to a writable folder to keep it.",
                                   RuntimeWarning, filename="fastjax", lineno=0, module="fastjax")


def probe(refresh: bool = False, timeout: float = 120.0) -> Probe | None:
    """Probe the installed jaxlib on this CPU (cached per jaxlib, Python and CPU); None when jaxlib is
    missing. Only a complete answer (``Probe.complete``) is kept, on disk and in this process."""
    version = jaxlib_version()
    if version is None:
        return None
    cpu = cpu_features()
    cache = cache_file(version, cpu)
    if not refresh:
        kept = _in_memory.get(cache) or _load(cache, cpu)
        if kept is not None:
            return kept
    without, why_without = run_probe("", timeout)
    with_flag, why_with = run_probe(WORKAROUND_FLAG, timeout) if without is not None else (None, "")
    note = f"without the flag: {why_without}" if without is None else (f"with the flag: {why_with}" if why_with else "")
    result = Probe(version, without, with_flag, note, cpu)
    if result.complete:  # an answer, not a mishap: keep it
        _in_memory[cache] = result
        _save(cache, result)
    return result


def _flags() -> list[str]:
    return os.environ.get("XLA_FLAGS", "").split()


def workaround_active() -> bool:
    """True when the workaround flag is in ``XLA_FLAGS`` of this process."""
    return WORKAROUND_FLAG in _flags()


def backend_started() -> bool:
    """True once JAX has started its backends (created its devices) in this process. It neither starts
    them nor imports JAX: with JAX not imported yet, nothing can have started.

    JAX has no public query for this (jax 0.10.2 to 0.12; what it has, ``backends_are_initialized``, is
    private, in its ``xla_bridge``). So this is a probe through public API: JAX refuses to change the
    option ``jax_num_cpu_devices`` once its backends have started (``jax.config.update`` raises
    RuntimeError, "... should be updated before backends are initialized"); before that the change is
    accepted, and undone at once. Fallback, for a JAX without that option: False (not known to have
    started).
    """
    if "jax" not in sys.modules:
        return False
    import jax

    try:
        count = jax.config.jax_num_cpu_devices
    except AttributeError:  # no such option: cannot tell
        return False
    try:
        jax.config.update("jax_num_cpu_devices", count + 1)  # any other value: refused once started
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", count)  # accepted: not started; put it back
    return False


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def apply_cpu_workaround() -> bool:
    """Add the flag to ``XLA_FLAGS`` when the probe says this jaxlib needs it; return whether it is active."""
    if os.environ.get(DISABLE_ENV) == "1" or workaround_active():
        return workaround_active()
    own = [f for f in _flags() if f.startswith(FLAG_NAME + "=")]
    result = probe()
    if result is None or result.error_without is None:
        if result is not None:
            _warn(f"fastjax could not check jaxlib {result.jaxlib} for its CPU miscompile ({result.note}); "
                  "no fix applied. Run `python -m fastjax.setup.doctor` to see whether sums are right.")
        return False
    if not result.needs_flag:
        if result.buggy:
            _warn(f"jaxlib {result.jaxlib} miscompiles a float32 CPU sum (relative error {result.error_without:.1e}) "
                  f"and {FLAG_NAME} does not fix it here ({result.note or result.error_with}): CPU results may be wrong.")
        return False
    if own:
        _warn(f"XLA_FLAGS already sets {own[0]}, so fastjax left it alone; jaxlib {result.jaxlib} needs "
              f"{WORKAROUND_FLAG} for right CPU sums (unset yours, or use that value).")
        return False
    if backend_started():
        _warn(f"JAX had already started before fastjax was imported, so the fix for a jaxlib {result.jaxlib} "
              "CPU miscompile could not be applied. Restart the kernel and import fastjax before running "
              "any JAX computation.")
        return False
    os.environ["XLA_FLAGS"] = " ".join([*_flags(), WORKAROUND_FLAG])
    return True
