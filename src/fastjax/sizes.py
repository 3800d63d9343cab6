"""The quick/full size switch: one environment variable, the same code path in both sizes.

``FASTJAX_SIZE=quick`` runs every chapter in minutes on a 2-core CPU (tests, CI, workshops);
``FASTJAX_SIZE=full`` gives the published results. When the variable is unset the size is
``quick`` under CI (``CI`` set) or pytest, and ``full`` otherwise.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

SIZE_ENV = "FASTJAX_SIZE"
SIZES = ("quick", "full")


def current_size() -> str:
    """The size in force: ``"quick"`` or ``"full"``."""
    raw = os.environ.get(SIZE_ENV, "").strip().lower()
    if raw:
        if raw not in SIZES:
            raise ValueError(f"{SIZE_ENV} must be one of {SIZES}; got {raw!r}")
        return raw
    if os.environ.get("CI") or os.environ.get("PYTEST_CURRENT_TEST"):
        return "quick"
    return "full"


def is_quick() -> bool:
    """True when the quick size is in force."""
    return current_size() == "quick"


def pick(quick: Any, full: Any) -> Any:
    """Return ``quick`` or ``full`` according to the size in force."""
    return quick if is_quick() else full


def choose(quick: dict[str, Any], full: dict[str, Any]) -> SimpleNamespace:
    """Pick one of two size tables with the same keys; returns them as attributes.

    >>> s = choose(quick=dict(n_iter=50), full=dict(n_iter=1000))  # doctest: +SKIP
    >>> s.n_iter  # doctest: +SKIP
    """
    if set(quick) != set(full):
        missing = sorted(set(quick) ^ set(full))
        raise ValueError(f"quick and full sizes must set the same keys; differ in {missing}")
    return SimpleNamespace(size=current_size(), **pick(quick, full))
