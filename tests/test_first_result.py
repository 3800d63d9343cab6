"""fastjax.pln.first_result: processes measured from outside, races in turns, stages and import times read back."""

from __future__ import annotations

import os
import sys

import fastjax  # noqa: F401
import numpy as np
import pytest

from fastjax.pln import first_result as W


def test_run_process_measures_wall_cpu_and_memory():
    # a process that holds ~200 MB and spins ~0.3 s of CPU: the OS's counts must see both
    code = ("import json, time\nb = bytearray(200 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\n"
            "t = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint(json.dumps({'ok': 1}))")
    run = W.run_process([sys.executable, "-c", code])
    assert run.printed == {"ok": 1}
    assert run.peak_mib > 190 and run.cpu >= 0.3 and run.wall >= run.cpu * 0.5


def test_run_process_reports_a_failure_with_its_stderr():
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        W.run_process([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])


def test_contenders_quick_keeps_the_race_small():
    full, quick = W.contenders(), W.contenders(quick=True)
    assert {c.name for c in quick} < {c.name for c in full}
    kinds = {(c.kind, c.first) for c in quick}
    assert {("pyplnmodels", False), ("book", False), ("command", True), ("command", False), ("jax", False),
            ("jax+lapack", False)} <= kinds
    assert not any(c.first_ever for c in quick)


def test_race_of_the_two_floors_gives_medians_and_ratios_per_round():
    chosen = [c for c in W.contenders() if c.kind in ("jax", "numpy")]
    out = W.race(rounds=2, chosen=chosen)
    jax_row, numpy_row = (out["contenders"][c.name] for c in chosen)
    assert out["n"] == 116 and out["rounds"] == 2 and len(jax_row["runs"]) == 2
    assert jax_row["over_jax_floor"] == 1.0  # each round's JAX process over itself
    assert numpy_row["over_jax_floor"] < 1.0  # numpy alone starts faster than numpy + jax
    q1, q3 = jax_row["wall_quartiles"]
    assert q1 <= jax_row["wall"] <= q3 and jax_row["peak_mib"] > numpy_row["peak_mib"]
    assert "speedup" not in jax_row  # no pyPLNmodels in this race


def test_stages_add_up_to_the_wall_time():
    run = {"wall": 2.0, "printed": {"stages": [["a", 0.5], ["b", 1.0]]}}
    result = {"contenders": {"x": {"runs": [run, {**run, "wall": 3.0}, run]}}}
    parts = W.stages(result, "x")
    assert parts[0][0].startswith("interpreter start-up") and parts[0][1] == pytest.approx(0.5)
    assert dict(parts[1:]) == {"a": 0.5, "b": 1.0}
    assert W.stages({"contenders": {"y": {"runs": [{"wall": 1.0, "printed": {}}]}}}, "y") == []


def test_import_times_reads_python_x_importtime():
    rows = W.import_times(["-c", "import json"])
    names = {r.name: (r.seconds, r.depth) for r in rows}
    assert all(0 <= r.own <= r.seconds for r in rows)
    assert names["json"][1] == 0 and names["json.decoder"][1] >= 1
    assert all(s >= 0 for s, _ in names.values())
    order = [r.name for r in rows]
    assert order.index("json.decoder") < order.index("json")  # Python reports a module after what it imported
    with pytest.raises(RuntimeError, match="failed"):
        W.import_times(["-c", "import no_such_module_here"])


def test_scripts_format_and_write(tmp_path):
    race = W.Race(tmp_path, repeat=1)
    assert race.data.is_file() and np.load(race.data)["counts"].shape == (116, 114)
    for kind, path in race.scripts.items():
        compile(path.read_text(), str(path), "exec")  # each script is valid Python
        assert not path.stem in ("numpy", "jax")  # a script named numpy.py would shadow numpy
    book = race.scripts["persistent"].read_text()
    assert "jax_persistent_cache_min_compile_time_secs" in book and "maxiter=400" in book


def test_children_start_without_the_flag_import_fastjax_set_here(monkeypatch):
    from fastjax.setup.workaround import WORKAROUND_FLAG

    monkeypatch.setenv("XLA_FLAGS", f"--xla_dump_to=/tmp/x {WORKAROUND_FLAG}")
    assert W.fresh_env()["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    monkeypatch.setenv("XLA_FLAGS", WORKAROUND_FLAG)
    assert "XLA_FLAGS" not in W.fresh_env()
    code = "import os, json; print(json.dumps({'flags': os.environ.get('XLA_FLAGS')}))"
    assert W.run_process([sys.executable, "-c", code]).printed == {"flags": None}


def test_each_computing_script_gets_its_threads_through_its_own_variable(tmp_path):
    setup = W.Race(tmp_path, repeat=1)
    _, env = setup.command(W.Contender("p", "pyplnmodels"), 0, threads=1)
    assert env["OMP_NUM_THREADS"] == "1" and "PJRT_NPROC" not in env or env.get("PJRT_NPROC") == os.environ.get("PJRT_NPROC")
    _, env = setup.command(W.Contender("c", "command"), 0, threads=2)
    assert env["PJRT_NPROC"] == "2"
    assert W.Contender("j", "jax").threads_env is None


def test_the_race_keeps_each_scripts_faster_thread_count_and_a_busy_race_gives_no_ratio(monkeypatch):
    from fastjax.tools import timing

    walls = {("pyplnmodels", "1"): 1.6, ("pyplnmodels", "2"): 40.0, ("book", "1"): 0.5, ("book", "2"): 0.4}
    calls = []

    def fake_run(args, env):
        kind = "pyplnmodels" if "script_pyplnmodels" in " ".join(args) else "book"
        n = env.get("OMP_NUM_THREADS" if kind == "pyplnmodels" else "PJRT_NPROC")
        calls.append((kind, n))
        return W.Run(walls[(kind, n)], walls[(kind, n)], 100.0, {})

    monkeypatch.setattr(W, "run_process", fake_run)
    monkeypatch.setattr(W, "export_fit", lambda *a, **k: 1.0)
    chosen = [W.Contender("pyPLNmodels' script", "pyplnmodels"), W.Contender("book's script", "book")]
    out = W.race(rounds=3, chosen=chosen, settings=(1, 2))
    p, b = (out["contenders"][c.name] for c in chosen)
    assert p["threads"] == "OMP_NUM_THREADS=1" and b["threads"] == "PJRT_NPROC=2"
    assert calls.count(("pyplnmodels", "2")) == 1  # 25x slower in the first round: not run again
    assert b["speedup"] == pytest.approx(1.6 / 0.4)
    quiet = b["speedup_ratio"]
    assert quiet.value is None or quiet.value == pytest.approx(4.0)  # None only if this machine was busy meanwhile

    class Busy:  # other processes keep 1.5 cores busy: the witness must refuse the ratio
        def __init__(self):
            self.t = 0.0

        def __call__(self):
            self.t += 1.0
            return 1000.0 + 2.5 * self.t, self.t

    monkeypatch.setattr(timing, "cpu_seconds", Busy())
    monkeypatch.setattr(timing, "_clock", lambda: Busy.now)
    Busy.now = 0.0

    def slow_run(args, env):
        Busy.now += 1.0
        return fake_run(args, env)

    monkeypatch.setattr(W, "run_process", slow_run)
    busy = W.race(rounds=3, chosen=chosen, settings=(1, 2))["contenders"]["book's script"]["speedup_ratio"]
    assert busy.value is None and "CPU cores busy" in busy.why and busy.text().startswith("not measured")

    # quick: pyPLNmodels still tries both counts; the book's script runs once a round, at XLA's default
    monkeypatch.setattr(W, "run_process", fake_run)
    walls[("book", None)] = 0.45
    calls.clear()
    quick = W.race(rounds=2, chosen=chosen, settings=(1, 2), quick=True)["contenders"]
    assert {n for k, n in calls if k == "book"} == {None} and {n for k, n in calls if k == "pyplnmodels"} == {"1", "2"}
    assert quick["book's script"]["threads"] == "default" and quick["pyPLNmodels' script"]["threads"] == "OMP_NUM_THREADS=1"
