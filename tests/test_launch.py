"""fastjax.scale.launch: JAX processes on 127.0.0.1 that fit the PLN together, and clear errors, never hangs.

The two-process fit runs the worker script of chapters/scale/03-processes.md (its ``%%writefile``
cell), so the test checks the code the reader sees.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import jupytext
import numpy as np
import pytest
from conftest import ROOT

from fastjax.scale import launch, sharding

CHAPTER = ROOT / "chapters" / "scale" / "03-processes.md"
ENV = {"JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1"}
JOIN_ONLY = """\
import os
import jax
from fastjax.scale import launch, sharding
jax.distributed.initialize(coordinator_address=os.environ[launch.COORDINATOR],
                           num_processes=int(os.environ[launch.NUM_PROCESSES]),
                           process_id=int(os.environ[launch.PROCESS_ID]),
                           initialization_timeout=int(os.environ[launch.JOIN_TIMEOUT]))
launch.save_result(index=jax.process_index(), devices=jax.device_count())
"""


def chapter_worker(folder: Path) -> Path:
    """The chapter's worker script (the cell that starts with %%writefile), written to ``folder``."""
    cells = [c.source for c in jupytext.read(CHAPTER).cells
             if c.cell_type == "code" and c.source.startswith("%%writefile")]
    assert len(cells) == 1, "the chapter should write exactly one worker script"
    path = folder / "fit_over_processes.py"
    path.write_text(cells[0].split("\n", 1)[1])
    return path


def our_children() -> list[str]:
    """Processes whose parent is this test process (a leftover worker would show here)."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "ps -o" not in line]


@pytest.mark.timeout(120)
def test_two_processes_fit_like_one(tmp_path):
    import jax
    import jax.numpy as jnp

    from fastjax import pln
    from fastjax.pln.rungs import scan_fit_jit

    repeat, n_iter = 2, 20
    run = launch.run(chapter_worker(tmp_path), 2, args=(repeat, n_iter, 1), env=ENV, timeout=100)
    got = run.results[0]
    assert run.results[1].keys() == {"fit_seconds", "all_reduce_seconds", "compile_seconds", "all_reduces_in_loop"}
    assert int(got["all_reduces_in_loop"]) >= 1  # the processes' sums meet in the loop
    full = pln.load_oaks_counts(repeat)
    data = pln.to_jax(full)
    (m, s), elbos = scan_fit_jit(pln.start(data), data, n_iter=n_iter)
    with jax.enable_x64(True):
        data64 = pln.to_jax(full, jnp.float64)
        (m64, s64), elbos64 = scan_fit_jit(pln.start(data64), data64, n_iter=n_iter)
        m64, s64, elbos64 = np.asarray(m64), np.asarray(s64), np.asarray(elbos64)
    m, s, elbos = np.asarray(m), np.asarray(s), np.asarray(elbos)
    assert got["m"].shape == m.shape and got["elbos"].shape == (n_iter,)
    # the chapter's rule: as close to the single-process float32 fit as float32 is to float64
    sharding.check_same_fit((got["m"], got["s"], got["elbos"]), (m, s, elbos), (m64, s64, elbos64),
                            final_gap=pln.TARGET_GAP)
    # and over 20 steps few signs have flipped yet: the whole ELBO trajectory within a few float32
    # epsilons per step (measured 4e-7 at most; float32 vs float64 1.5e-6)
    np.testing.assert_allclose(got["elbos"], elbos, rtol=1e-5)
    assert our_children() == []


@pytest.mark.timeout(60)
def test_a_process_that_never_comes_gives_a_join_timeout(tmp_path):
    script = tmp_path / "join.py"
    script.write_text(JOIN_ONLY)
    t0 = time.perf_counter()
    with pytest.raises(launch.JoinTimeout, match=r"process 0 of 2 could not join.*never started: \[1\]"):
        launch.run(script, 2, env=ENV, timeout=50, join_timeout=1, start_only=[0])
    assert time.perf_counter() - t0 < 50  # the join timeout ended it, not the run's timeout
    assert our_children() == []


@pytest.mark.timeout(60)
def test_processes_join_and_return_results(tmp_path):
    script = tmp_path / "join.py"
    script.write_text(JOIN_ONLY)
    run = launch.run(script, 2, env=ENV, timeout=50, join_timeout=30)
    assert [int(r["index"]) for r in run.results] == [0, 1]
    assert all(int(r["devices"]) == 2 for r in run.results)  # each sees the devices of both


@pytest.mark.timeout(60)
def test_a_crash_names_the_process_and_quotes_its_stderr(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['FASTJAX_PROCESS_ID'] == '1':\n"
                      "    sys.exit('process 1 breaks on purpose')\n"
                      "time.sleep(60)\n")
    t0 = time.perf_counter()
    with pytest.raises(launch.ProcessFailed, match=r"process 1 of 2 exited with code 1(.|\n)*breaks on purpose"):
        launch.run(script, 2, timeout=50)
    assert time.perf_counter() - t0 < 20  # process 0 (sleeping) was killed, not waited for
    assert our_children() == []


@pytest.mark.timeout(60)
def test_a_run_past_its_timeout_is_killed(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(launch.ProcessFailed, match=r"still ran after the run's timeout of 1 s"):
        launch.run(script, 2, timeout=1)
    assert our_children() == []


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_processes": 0}, ValueError, "num_processes must be positive"),
    ({"num_processes": 1.5}, TypeError, "num_processes must be an integer"),
    ({"num_processes": 2, "timeout": 0}, ValueError, "timeout must be a positive number"),
    ({"num_processes": 2, "join_timeout": -1}, ValueError, "join_timeout must be positive"),
    ({"num_processes": 2, "start_only": [2]}, ValueError, r"start_only must name distinct process ids in \[0, 2\)"),
    ({"num_processes": 2, "start_only": [0, 0]}, ValueError, "start_only must name distinct"),
])
def test_bad_arguments_say_what_is_wrong(tmp_path, kwargs, error, match):
    script = tmp_path / "ok.py"
    script.write_text("")
    with pytest.raises(error, match=match):
        launch.run(script, **kwargs)


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py does not exist"):
        launch.run(tmp_path / "nope.py", 2)


def test_save_result_outside_a_launched_process_says_so(monkeypatch):
    monkeypatch.delenv(launch.OUT, raising=False)
    with pytest.raises(RuntimeError, match="started by fastjax.scale.launch.run"):
        launch.save_result(x=np.zeros(1))


def test_free_port_is_free():
    import socket

    port = launch.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
