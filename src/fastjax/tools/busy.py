"""Making a machine busy on purpose, to show what the timing harness does on one (chapters/measuring).

- ``busy_loops(n)``: a context manager that runs ``n`` processes of ``while True: pass`` for the length of
  its block, and always stops them (killed and waited for in a ``finally``), so none outlives the block.
- ``thread_names()``: the names of this process's threads, read from ``/proc/self/task`` (Linux only;
  elsewhere an empty list): XLA's CPU workers are the ``tf_XLAEigen`` ones.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

# how long the loops get to start before the block runs
START_SECONDS = 0.3


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` busy Python processes during the block (given to it), stopped after it whatever happens."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(START_SECONDS)
        yield loops
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()


def thread_names() -> list[str]:
    """The names of this process's threads (Linux only: elsewhere, an empty list)."""
    try:
        return [open(f"/proc/self/task/{tid}/comm").read().strip() for tid in os.listdir("/proc/self/task")]
    except OSError:
        return []
