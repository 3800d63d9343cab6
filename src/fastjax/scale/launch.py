"""Start N JAX processes on this machine, as a cluster's scheduler would, and collect what they return.

``run(script, num_processes)`` picks a free port on 127.0.0.1, starts ``python script`` once per
process with the environment variables below, waits for all of them, and returns what each one saved
with ``save_result``. Every failure ends in an exception, never a hang: a process that exits with an
error (its stderr tail in the message), a process that could not join the others within its
``jax.distributed.initialize`` timeout (naming it and the processes that never started), or the whole
run passing ``timeout``. On any failure every process still running is killed.

The job stays on this machine and dies with its launcher:

- Process 0's coordination service listens on 127.0.0.1 only. ``jax.distributed.initialize`` binds it
  to ``coordinator_bind_address``, by default ``[::]:PORT`` (every interface: anyone on the network
  could reach it); without that argument it reads ``JAX_COORDINATOR_BIND_ADDRESS`` (jax 0.10.2 to
  0.12, ``jax/_src/distributed.py``), which ``run`` sets to ``127.0.0.1:PORT``.
- Each worker dies with the process that called ``run``, even one killed outright (a dead notebook
  kernel): on Linux through the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``,
  set by a small wrapper that then ``exec``s the worker), elsewhere through a wrapper that waits on the
  worker and kills it when its own parent is gone (``WATCH_SECONDS``).

The worker reads its part from the environment (a cluster's launcher, such as SLURM's ``srun``, sets
its own variables, which ``jax.distributed.initialize()`` reads by itself)::

    jax.distributed.initialize(coordinator_address=os.environ[COORDINATOR],
                               num_processes=int(os.environ[NUM_PROCESSES]),
                               process_id=int(os.environ[PROCESS_ID]),
                               initialization_timeout=int(os.environ[JOIN_TIMEOUT]))
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastjax import checks

COORDINATOR = "FASTJAX_COORDINATOR"  # "127.0.0.1:PORT": where process 0 serves the coordination service
NUM_PROCESSES = "FASTJAX_NUM_PROCESSES"
PROCESS_ID = "FASTJAX_PROCESS_ID"
JOIN_TIMEOUT = "FASTJAX_JOIN_TIMEOUT"  # seconds jax.distributed.initialize waits for the others
OUT = "FASTJAX_OUT"  # folder where save_result writes process-<id>.npz
BIND = "JAX_COORDINATOR_BIND_ADDRESS"  # read by jax.distributed.initialize when not given the argument
WATCH_SECONDS = 0.5  # where there is no parent-death signal: how often a worker's wrapper checks its parent
# How a worker is tied to its launcher: "pdeathsig" (Linux) or "watch" (elsewhere, and to test it).
DEATH_LINK = "pdeathsig" if sys.platform.startswith("linux") else "watch"
# Run as ``python -c WRAPPER LINK PARENT_PID WATCH_SECONDS script args...``: the worker dies with PARENT_PID.
WRAPPER = """\
import ctypes, os, signal, subprocess, sys, time
link, parent, every, argv = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), [sys.executable, *sys.argv[4:]]
if link == "pdeathsig":
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG, kept across exec
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the launcher died before prctl took effect
        sys.exit("the launcher is gone")
    os.execv(sys.executable, argv)
child = subprocess.Popen(argv)
while child.poll() is None:
    if os.getppid() != parent:  # the launcher is gone: take the worker down with this wrapper
        child.kill()
        child.wait()
        sys.exit("the launcher is gone")
    time.sleep(every)
if child.returncode < 0:  # killed by a signal: end the same way, so that the launcher reports it
    signal.signal(-child.returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -child.returncode)
sys.exit(child.returncode)
"""
# What jaxlib writes to stderr when jax.distributed.initialize gives up waiting for the other
# processes (it aborts the process; seen with jaxlib 0.10.2 and 0.12.0.1).
JOIN_FAILURE_SIGNS = ("RegisterTask", "Barrier timed out")
STDERR_TAIL = 15  # lines of a failed process's stderr quoted in the error


class ProcessFailed(RuntimeError):
    """A worker process exited with an error, or the run passed its time limit."""


class JoinTimeout(ProcessFailed, TimeoutError):
    """A worker gave up waiting for the others in ``jax.distributed.initialize``."""


@dataclass
class Run:
    """What ``run`` returns: each process's saved arrays (``{}`` if it saved none), its stdout, and
    the wall-clock seconds from the first start to the last exit."""

    results: list[dict[str, np.ndarray]]
    stdout: list[str]
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_result(**arrays: Any) -> Path:
    """In a worker started by ``run``: save ``arrays`` (NumPy-convertible) for the launcher to read."""
    missing = [k for k in (OUT, PROCESS_ID) if k not in os.environ]
    if missing:
        raise RuntimeError(f"save_result works in a process started by fastjax.scale.launch.run; {missing} not set")
    path = Path(os.environ[OUT]) / f"process-{int(os.environ[PROCESS_ID])}.npz"
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items()})
    return path


def _tail(path: Path, lines: int = STDERR_TAIL) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    kept = [line for line in text if not line.lstrip().startswith("@ ")]  # drop C++ stack frames
    # backquotes become quotes: Sphinx's IPython-traceback lexer stops at a backquote, so a book built
    # with warnings as errors failed on a page that shows this error
    return "\n".join(kept[-lines:]).replace("`", "'") or "(no output on stderr)"


def _kill(procs: dict[int, subprocess.Popen]) -> None:
    """Kill each process we started (its whole process group), then reap it."""
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs.values():
        p.wait()


def _failure(i: int, code: int, err: Path, num_processes: int, started: list[int], join_timeout: int) -> ProcessFailed:
    tail = _tail(err)
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    if any(sign in tail for sign in JOIN_FAILURE_SIGNS):
        never = sorted(set(range(num_processes)) - set(started))
        who = f"processes never started: {never}" if never else "one of the others crashed or could not connect"
        return JoinTimeout(f"process {i} of {num_processes} could not join the others within its "
                           f"initialization_timeout of {join_timeout} s ({who}); it {how}. "
                           f"Its stderr ends with:\n{tail}")
    return ProcessFailed(f"process {i} of {num_processes} {how}. Its stderr ends with:\n{tail}")


def run(script: str | Path, num_processes: int, args: Sequence[str] = (), timeout: float = 120.0,
        join_timeout: int = 60, env: dict[str, str] | None = None, start_only: Sequence[int] | None = None) -> Run:
    """Run ``python script *args`` as processes 0 … num_processes−1 of one JAX job on 127.0.0.1.

    ``timeout``: seconds for the whole run (finite); ``join_timeout``: seconds each process gives
    ``jax.distributed.initialize`` (passed in ``FASTJAX_JOIN_TIMEOUT``); ``env``: extra environment
    variables; ``start_only``: start only these process ids (to show what happens when one is missing).
    Raises ``ProcessFailed``/``JoinTimeout`` (every started process killed) instead of hanging."""
    num_processes = checks.check_positive_int(num_processes, "num_processes")
    join_timeout = checks.check_positive_int(join_timeout, "join_timeout")
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"script {script} does not exist")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds; got {type(timeout).__name__} {timeout!r}")
    if not (math.isfinite(timeout) and timeout > 0):  # inf (or nan) would let a stuck job hang forever
        raise ValueError(f"timeout must be a finite positive number of seconds; got {timeout!r}")
    started = list(range(num_processes)) if start_only is None else [int(i) for i in start_only]
    if not started or len(set(started)) != len(started) or not all(0 <= i < num_processes for i in started):
        raise ValueError(f"start_only must name distinct process ids in [0, {num_processes}); got {start_only}")
    folder = Path(tempfile.mkdtemp(prefix="fastjax-launch-"))
    address = f"127.0.0.1:{free_port()}"
    base = {**os.environ, **(env or {}), COORDINATOR: address, BIND: address,
            NUM_PROCESSES: str(num_processes), JOIN_TIMEOUT: str(join_timeout), OUT: str(folder)}
    tie = [sys.executable, "-c", WRAPPER, DEATH_LINK, str(os.getpid()), str(WATCH_SECONDS)]  # dies with us
    procs: dict[int, subprocess.Popen] = {}
    t0 = time.perf_counter()
    try:
        for i in started:
            with open(folder / f"process-{i}.out", "w") as out, open(folder / f"process-{i}.err", "w") as err:
                procs[i] = subprocess.Popen([*tie, str(script), *map(str, args)], stdout=out, stderr=err,
                                            env={**base, PROCESS_ID: str(i)}, start_new_session=True)
        while True:
            codes = {i: p.poll() for i, p in procs.items()}
            failed = [i for i, c in codes.items() if c not in (None, 0)]
            if failed:
                # the root cause first: a crash rather than the others' failure to reach it
                errs = [_failure(i, codes[i], folder / f"process-{i}.err", num_processes, started, join_timeout)
                        for i in failed]
                raise next((e for e in errs if not isinstance(e, JoinTimeout)), errs[0])
            if all(c == 0 for c in codes.values()):
                break
            if time.perf_counter() - t0 > timeout:
                running = [i for i, c in codes.items() if c is None]
                raise ProcessFailed(f"processes {running} of {num_processes} still ran after the run's timeout of "
                                    f"{timeout:g} s; all were killed. Process {running[0]}'s stderr ends with:\n"
                                    f"{_tail(folder / f'process-{running[0]}.err')}")
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
        results = []
        for i in range(num_processes):
            saved = folder / f"process-{i}.npz"
            if saved.exists():
                with np.load(saved) as f:
                    results.append({k: f[k] for k in f.files})
            else:
                results.append({})
        stdout = [(folder / f"process-{i}.out").read_text() if i in procs else "" for i in range(num_processes)]
        return Run(results, stdout, seconds)
    finally:
        _kill(procs)
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
