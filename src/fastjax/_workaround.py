"""Apply the XLA:CPU workaround for a jaxlib miscompile, before JAX starts.

jaxlib 0.10.x on CPU fuses some reductions into a library call that returns a wrong sum
(several tenths of a percent off) for elementwise log/multiply expressions such as the
Stirling approximation of log(y!). Turning that fusion type off gives the right answer.
This module must not import jax: XLA reads ``XLA_FLAGS`` once, when its first backend starts.
"""

from __future__ import annotations

import os
import sys
import warnings
from importlib import metadata

WORKAROUND_FLAG = "--xla_cpu_experimental_ynn_fusion_type=-LIBRARY_FUSION_TYPE_REDUCE"
DISABLE_ENV = "FASTJAX_NO_CPU_WORKAROUND"

# jaxlib releases on which the miscompile was seen and the flag exists (an unknown flag makes
# XLA abort, so the flag is never set blindly on other releases).
AFFECTED_JAXLIB = ("0.10.",)


def jaxlib_version() -> str | None:
    """The installed jaxlib version string, or None when jaxlib is not installed."""
    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def needs_workaround(version: str | None = None) -> bool:
    """True when the given (default: installed) jaxlib is one with the CPU miscompile."""
    version = jaxlib_version() if version is None else version
    return version is not None and version.startswith(AFFECTED_JAXLIB)


def workaround_active() -> bool:
    """True when the workaround flag is in ``XLA_FLAGS`` of this process."""
    return WORKAROUND_FLAG in os.environ.get("XLA_FLAGS", "").split()


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # pragma: no cover - private API moved
        return False


def apply_cpu_workaround() -> bool:
    """Add the flag to ``XLA_FLAGS`` when the installed jaxlib needs it; return whether it is active."""
    if os.environ.get(DISABLE_ENV) == "1" or not needs_workaround():
        return workaround_active()
    if workaround_active():
        return True
    if _backend_started():
        warnings.warn(
            "JAX had already started before fastjax was imported, so the fix for a jaxlib "
            f"{jaxlib_version()} CPU miscompile could not be applied. Restart the kernel and "
            "import fastjax before running any JAX computation.",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + WORKAROUND_FLAG).strip()
    return True
