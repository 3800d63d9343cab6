"""fastjax.scale.launch: JAX processes on 127.0.0.1 that fit the PLN together, and clear errors, never hangs.

The two-process fit runs the worker script of chapters/scale/03-processes.md (its ``%%writefile``
cell), so the test checks the code the reader sees.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
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
    assert run.results[1].keys() == {"fit_seconds", "all_reduce_seconds", "compile_seconds", "all_reduces_per_call"}
    assert int(got["all_reduces_per_call"]) >= n_iter  # the processes' sums meet in every iteration
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
    ({"num_processes": 2, "timeout": 0}, ValueError, "timeout must be a finite positive number"),
    ({"num_processes": 2, "timeout": float("inf")}, ValueError, "timeout must be a finite positive number.*inf"),
    ({"num_processes": 2, "timeout": float("nan")}, ValueError, "timeout must be a finite positive number.*nan"),
    ({"num_processes": 2, "timeout": "60"}, TypeError, "timeout must be a number of seconds; got str"),
    ({"num_processes": 2, "join_timeout": -1}, ValueError, "join_timeout must be positive"),
    ({"num_processes": 2, "start_only": [2]}, ValueError, r"start_only must name distinct process ids in \[0, 2\)"),
    ({"num_processes": 2, "start_only": [0, 0]}, ValueError, "start_only must name distinct"),
])
def test_bad_arguments_say_what_is_wrong(tmp_path, kwargs, error, match):
    script = tmp_path / "ok.py"
    script.write_text("")
    with pytest.raises(error, match=match):
        launch.run(script, **kwargs)


LISTENERS = """\
import os
import jax
from fastjax.scale import launch
port = int(os.environ[launch.COORDINATOR].rsplit(":", 1)[1])
jax.distributed.initialize(coordinator_address=os.environ[launch.COORDINATOR],
                           num_processes=int(os.environ[launch.NUM_PROCESSES]),
                           process_id=int(os.environ[launch.PROCESS_ID]),
                           initialization_timeout=int(os.environ[launch.JOIN_TIMEOUT]))
listening = []  # local addresses of the sockets listening on the coordinator's port (Linux's tables)
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                listening.append(address)
launch.save_result(listening=listening)
"""


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
def test_the_coordination_service_listens_on_loopback_only(tmp_path):
    """Without a bind address, jax.distributed.initialize listens on [::]:PORT, every interface; the
    launcher binds it to 127.0.0.1 (gRPC may listen on it as ::ffff:127.0.0.1, the same address)."""
    script = tmp_path / "listeners.py"
    script.write_text(LISTENERS)
    run = launch.run(script, 2, env=ENV, timeout=50, join_timeout=30)
    listening = [proc_net_address(str(a)) for a in run.results[0]["listening"]]
    assert listening and all(a == ipaddress.ip_address("127.0.0.1") for a in listening), listening


def proc_net_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in the machine's byte order, little-endian
    here), an IPv4-mapped IPv6 address as the IPv4 one."""
    raw = b"".join(bytes.fromhex(text[i:i + 8])[::-1] for i in range(0, len(text), 8))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address


def test_proc_net_addresses_are_read_right():
    assert proc_net_address("0100007F") == ipaddress.ip_address("127.0.0.1")
    assert proc_net_address("0000000000000000FFFF00000100007F") == ipaddress.ip_address("127.0.0.1")
    assert proc_net_address("00000000000000000000000000000000") == ipaddress.ip_address("::")  # all interfaces


PARENT = """\
import sys
from fastjax.scale import launch
launch.DEATH_LINK = sys.argv[2]
launch.run(sys.argv[1], 2, timeout=100)
"""
SLEEPER = """\
import os, time
from pathlib import Path
folder = Path(os.environ["PIDS"])
(folder / f"{os.getpid()}.tmp").write_text("")
(folder / f"{os.getpid()}.tmp").rename(folder / f"{os.getpid()}.pid")
time.sleep(100)
"""


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("link", ["pdeathsig", "watch"] if sys.platform.startswith("linux") else ["watch"])
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_workers_die_with_a_killed_launcher(tmp_path, link):
    """The launcher's process is killed outright (SIGKILL: no finally, no cleanup, as a dead kernel):
    its workers go too, instead of sleeping on as orphans."""
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pids = tmp_path / "pids"
    pids.mkdir()
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "sleeper.py"), link],
                              env={**os.environ, "PIDS": str(pids)})
    deadline = time.perf_counter() + 60
    while len(list(pids.glob("*.pid"))) < 2:
        assert parent.poll() is None and time.perf_counter() < deadline, "the workers did not start"
        time.sleep(0.05)
    workers = [int(f.stem) for f in pids.glob("*.pid")]
    assert all(alive(w) for w in workers)
    parent.kill()
    parent.wait()
    deadline = time.perf_counter() + 10
    while any(alive(w) for w in workers) and time.perf_counter() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if alive(w)]
    for w in left:  # clean up before failing
        os.kill(w, signal.SIGKILL)
    assert left == [], f"workers {left} outlived their launcher"


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
