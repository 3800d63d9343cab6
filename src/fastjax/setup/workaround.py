"""Fix a jaxlib CPU miscompile before JAX starts, on exactly the releases that have it.

Some jaxlib releases (seen in 0.10.2 and 0.12.0.1) fuse a float32 reduction of elementwise
log/multiply terms, such as the Stirling approximation of log(y!) in the PLN ELBO, into a library
call that returns a wrong sum on CPU (from 0.5 % to 44 % off). The XLA flag ``WORKAROUND_FLAG``
turns that fusion type off. Releases are not trusted by their version string: once per installed
jaxlib, a subprocess computes the sum under ``jax.jit`` without and with the flag and compares it
with float64 NumPy. The answer is cached on disk, and the flag is set only when the bug shows and
this XLA knows the flag (an unknown flag in ``XLA_FLAGS`` makes XLA abort).

This module must not import jax: XLA reads ``XLA_FLAGS`` once, when its first backend starts
(``backend_started`` only looks at a JAX that something else imported).
"""

from __future__ import annotations

import json
import os
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
TOLERANCE = 1e-6  # relative error of the float32 sum against float64 NumPy that counts as right
PROBE_VERSION = 1  # bump when the probe changes, so that cached answers are not reused

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


@dataclass
class Probe:
    """What the probe found for one jaxlib: the error without and with the flag (None: XLA refused it)."""

    jaxlib: str
    error_without: float | None
    error_with: float | None
    note: str = ""

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


def jaxlib_version() -> str | None:
    """The installed jaxlib version string, or None when jaxlib is not installed."""
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def cache_file(version: str) -> Path:
    """Where the probe's answer for jaxlib ``version`` (and this Python) is kept, under
    ``$XDG_CACHE_HOME/fastjax`` (default ``~/.cache/fastjax``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastjax"
    tag = f"{version}-py{sys.version_info.major}.{sys.version_info.minor}-v{PROBE_VERSION}"
    return base / f"cpu-probe-{tag}.json"


def _run_probe(flags: str, timeout: float) -> tuple[float | None, str]:
    """The probe's relative error with ``XLA_FLAGS=flags`` on CPU, or (None, why) when it failed."""
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


def probe(refresh: bool = False, timeout: float = 120.0) -> Probe | None:
    """Probe the installed jaxlib (cached per jaxlib and Python); None when jaxlib is missing."""
    version = jaxlib_version()
    if version is None:
        return None
    cache = cache_file(version)
    if not refresh and cache.is_file():
        try:
            return Probe(**json.loads(cache.read_text()))
        except (ValueError, TypeError):
            pass  # a damaged cache file: probe again
    without, why_without = _run_probe("", timeout)
    with_flag, why_with = _run_probe(WORKAROUND_FLAG, timeout) if without is not None else (None, "")
    note = f"without the flag: {why_without}" if without is None else (f"with the flag: {why_with}" if why_with else "")
    result = Probe(version, without, with_flag, note)
    if without is not None:  # only a probe that ran is worth keeping
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp") as f:
            json.dump(asdict(result), f)
        os.replace(f.name, cache)
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
