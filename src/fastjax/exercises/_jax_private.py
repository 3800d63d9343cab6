"""The self-checks' only reach into JAX's private modules, kept here so that a JAX release that moves them
breaks one small file (tests/test_exercises.py runs both on the pinned and on the newest JAX).

- :func:`outermost_jitted_function`: the function being compiled, read from the ``cache_miss`` frame of
  ``jax/_src/pjit.py`` on the stack (JAX's compile event names the program, not the function, and does not
  say whether it is one of JAX's own eager operations).
- :func:`array_class`: the class of JAX's arrays (``jax._src.array.ArrayImpl``), whose ``_value`` property
  is where every read of an array's value by Python passes (``float()``, ``bool()``, ``.tolist()``, print).

Everything else the checks count comes through public APIs: compilations through ``jax.monitoring``, the
programs run through ``jax.profiler.trace``.
"""

from __future__ import annotations

import sys
from typing import Any

_PJIT_FILE = "jax/_src/pjit.py"


def outermost_jitted_function(frame: Any = None) -> Any:
    """The ``fun`` of the outermost ``cache_miss`` frame of JAX's pjit on the stack above ``frame`` (the
    caller's by default): the function whose program is being compiled; None where there is none."""
    frame, fun = frame or sys._getframe(1), None
    while frame is not None:
        code = frame.f_code
        if code.co_name == "cache_miss" and code.co_filename.replace("\\", "/").endswith(_PJIT_FILE):
            fun = frame.f_locals.get("fun", fun)  # keep going: the outermost is the one compiled
        frame = frame.f_back
    return fun


def is_primitive_application(fun: Any) -> bool:
    """Whether ``fun`` is JAX's wrapper that applies one primitive outside jit (``x[:k]``, ``x + 1``)."""
    return bool(getattr(fun, "_apply_primitive", False))


def array_class() -> type:
    """The class of JAX's arrays, whose ``_value`` property hands an array's value to Python."""
    from jax._src.array import ArrayImpl

    if not isinstance(ArrayImpl.__dict__.get("_value"), property):
        raise RuntimeError("this JAX's array class has no _value property: the self-checks cannot count host reads")
    return ArrayImpl
