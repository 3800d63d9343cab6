"""Method-4's evidence: races run on fresh busy machines, with the calls' own times logged.

``on_busy_machines`` runs each race function (``race(slow, fast, x) -> ratio``) several times, each run on a
fresh machine from ``machine()`` (an object whose ``wrap(fn)`` returns ``fn`` as it runs there, such as the
page's ``BusyMachine``), and logs each call's own time, waited for, before the machine adds its waits.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import jax
import numpy as np


class BusyRaces(NamedTuple):
    """One race function's results: the ratio of each run, and the own times (seconds) of all its calls."""

    ratios: list[float]
    own_slow: list[float]
    own_fast: list[float]

    @property
    def median(self) -> float:
        """The median of the runs' ratios."""
        return float(np.median(self.ratios))

    @property
    def own_ratio(self) -> float:
        """The median own time of the slow program's calls over the fast one's."""
        return float(np.median(self.own_slow) / np.median(self.own_fast))


def own_time_logged(fn: Callable[..., Any], log: list[float]) -> Callable[..., Any]:
    """``fn``, each call waited for and its own time appended to ``log``: the time a busy machine scales."""
    def call(*args: Any) -> Any:
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        log.append(time.perf_counter() - t0)
        return out
    return call


def on_busy_machines(races: dict[str, Callable[..., float]], machine: Callable[[], Any], slow: Callable[..., Any],
                     fast: Callable[..., Any], x: Any, runs: int) -> dict[str, BusyRaces]:
    """Each race of ``races`` run ``runs`` times on ``slow`` and ``fast`` with input ``x``, each run on a fresh
    ``machine()``: ``{name: BusyRaces}``."""
    if not races or runs < 1:
        raise ValueError(f"on_busy_machines needs at least one race and one run; got {list(races)} and runs={runs}")
    out = {}
    for name, race in races.items():
        got = BusyRaces([], [], [])
        for _ in range(runs):
            busy = machine()
            got.ratios.append(float(race(busy.wrap(own_time_logged(slow, got.own_slow)),
                                         busy.wrap(own_time_logged(fast, got.own_fast)), x)))
        out[name] = got
    return out
