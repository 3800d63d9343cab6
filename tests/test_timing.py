import json
import os
import sys

import fastjax  # noqa: F401  (CPU workaround before JAX)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax.tools import timing


def test_block_waits_on_every_array_of_a_pytree():
    waited = []

    class Pending:  # a leaf that records when it is waited on
        def __init__(self, name):
            self.name = name

        def block_until_ready(self):
            waited.append(self.name)

    tree = {"a": Pending("a"), "b": [Pending("b"), 1.0, "text"], "c": (Pending("c"),)}
    assert timing.block(tree) is tree
    assert sorted(waited) == ["a", "b", "c"]


class FakeClock:
    """A deterministic stand-in for time.perf_counter: time moves only when told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def work(self, seconds):
        self.now += seconds


class Pending:
    """A result whose computation finishes only when waited for, like a dispatched JAX array."""

    def __init__(self, clock, seconds):
        self.clock, self.seconds, self.done = clock, seconds, False

    def block_until_ready(self):
        if not self.done:  # like a JAX array: only the first wait waits
            self.clock.work(self.seconds)
            self.done = True


class FakeMachine:
    """Stand-in CPU counters that follow the fake clock: this process keeps ``own`` cores busy and
    other processes ``other`` cores, so the load the harness reads should be ``other``."""

    def __init__(self, clock, own=1.0, other=0.0):
        self.clock, self.own, self.other = clock, own, other

    def __call__(self):
        t = self.clock.now
        return 1000.0 + (self.own + self.other) * t, 5.0 + self.own * t


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    monkeypatch.setattr(timing, "cpu_seconds", FakeMachine(fake))  # a quiet machine unless a test says otherwise
    monkeypatch.setattr(timing.time, "sleep", fake.work)  # the harness's idle wait for the load window
    return fake


def test_time_per_call_reports_seconds_per_call(clock):
    t = timing.time_per_call(lambda: clock.work(0.01), repeats=3, number=2, warmup=0, name="work")
    assert t.seconds == pytest.approx([0.01] * 3) and t.number == 2
    assert t.median == pytest.approx(0.01) and t.q1 <= t.median <= t.q3 and t.best <= t.median
    assert "work" in repr(t)


def test_per_divides_by_units_of_work(clock):
    t = timing.time_per_call(lambda: clock.work(0.02), repeats=3, number=1, warmup=0, per=4)
    assert t.median == pytest.approx(0.005)


def test_the_result_is_waited_for(clock):
    t = timing.time_per_call(lambda: Pending(clock, 0.03), repeats=3, number=2, warmup=0)
    assert t.median == pytest.approx(0.03)  # without the wait it would read 0


def test_sync_last_waits_only_for_the_last_call(clock):
    t = timing.time_per_call(lambda: Pending(clock, 0.03), repeats=2, number=4, warmup=0, sync="last")
    assert t.median == pytest.approx(0.03 / 4)


def test_autorange_picks_number_from_one_timed_call(clock):
    t = timing.time_per_call(lambda: clock.work(0.001), repeats=2, warmup=0, min_repeat_seconds=0.05)
    assert t.number == 50


def test_first_call_includes_everything_it_waits_for(clock):
    assert timing.first_call_seconds(lambda: Pending(clock, 1.5)) == pytest.approx(1.5)


def test_interleaved_times_each_callable_in_turns(clock):
    order = []
    fns = {"a": lambda: order.append("a") or clock.work(0.02), "b": lambda: order.append("b") or Pending(clock, 0.01)}
    out = timing.time_interleaved(fns, repeats=3, per={"a": 2}, sync="each", min_repeat_seconds=0.0)
    assert out["a"].median == pytest.approx(0.01) and out["b"].median == pytest.approx(0.01)
    assert order[-6:] == ["a", "b"] * 3 and out["a"].per == 2 and out["b"].number == 1


@pytest.mark.parametrize("sync", ["each", "last"])
def test_jitted_eager_and_aot_callables_all_time(sync):
    f = lambda x: jnp.sin(x) @ x.T  # noqa: E731
    x = jnp.ones((64, 64))
    jf = jax.jit(f)
    aot = timing.compile_time(jf, x)
    for fn in (f, jf, aot.compiled):
        t = timing.time_per_call(fn, x, repeats=3, sync=sync)
        assert len(t.seconds) == 3 and t.number >= 1 and t.sync == sync


def test_compile_time_is_measured_apart_and_compiled_agrees():
    def g(x):
        return jnp.cumsum(jnp.exp(x) * 3.0) - 1.0

    x = jnp.linspace(0, 1, 1000)
    c = timing.compile_time(jax.jit(g), x)
    assert c.lower_seconds > 0 and c.compile_seconds > 0
    assert c.total_seconds == pytest.approx(c.lower_seconds + c.compile_seconds)
    np.testing.assert_allclose(c.compiled(x), g(x), rtol=1e-6)


def test_compile_time_needs_a_jitted_function():
    with pytest.raises(TypeError, match="lower"):
        timing.compile_time(lambda x: x, 1.0)


def test_count_traces_counts_traces_not_calls():
    counter = timing.count_traces(lambda x, n: x * n)
    f = jax.jit(counter, static_argnums=1)
    for _ in range(3):
        f(jnp.ones(3), 2)
    assert counter.count == 1
    f(jnp.ones(3), 3)  # a new static value re-traces
    f(jnp.ones(4), 3)  # so does a new shape
    assert counter.count == 3
    counter.reset()
    assert counter.count == 0


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="sync"):
        timing.time_per_call(lambda: None, sync="never")
    with pytest.raises(ValueError, match="repeats"):
        timing.time_per_call(lambda: None, repeats=0)


def test_stamp_names_device_and_versions():
    s = timing.stamp()
    assert s["device"].startswith(("CPU", "GPU", "TPU")) and s["jax"] and s["jaxlib"]
    assert s["size"] in ("quick", "full") and isinstance(s["cpu_workaround"], bool)
    text = timing.stamp_text(s)
    assert s["jax"] in text and s["device"] in text


def test_table_and_format():
    a = timing.Timing("a", [1e-3, 2e-3, 3e-3])
    b = timing.Timing("b", [2e-3, 4e-3, 6e-3])
    rows = timing.table([a, b], floor=a, unit="ms")
    assert rows[1]["median (ms)"] == pytest.approx(4.0) and rows[1]["× floor"] == pytest.approx(2.0)
    md = timing.format_table(rows)
    assert md.splitlines()[0].startswith("| variant") and "| b | 4 |" in md


def test_timing_round_trips_through_json():
    t = timing.Timing("b", [2e-3, 4e-3, 6e-3], number=5, per=10, sync="last", compile_seconds=0.5, extra={"k": 1})
    back = timing.Timing.from_dict(json.loads(json.dumps(t.as_dict())))
    assert back == t and back.median == pytest.approx(4e-3)


def test_format_seconds():
    assert timing.format_seconds(2.5) == "2.5 s"
    assert timing.format_seconds(0.0031) == "3.1 ms"
    assert timing.format_seconds(4.2e-6) == "4.2 µs"
    assert timing.format_seconds(3e-9) == "3 ns"


@pytest.mark.parametrize("other, flagged", [(0.0, False), (0.3, False), (1.5, True)])
def test_the_load_of_other_processes_is_read_and_flagged(clock, monkeypatch, other, flagged):
    monkeypatch.setattr(timing, "cpu_seconds", FakeMachine(clock, own=2.0, other=other))
    t = timing.time_per_call(lambda: clock.work(0.01), repeats=7, number=5, warmup=0, name="floor")
    assert t.load == pytest.approx(other)
    assert bool(t.noise) == flagged and ("busy" in t.noise) == flagged
    if flagged:
        assert "1.5 CPU cores" in t.noise and "busy" in repr(t)


def test_interleaved_timings_share_the_load_of_the_run(clock, monkeypatch):
    monkeypatch.setattr(timing, "cpu_seconds", FakeMachine(clock, other=1.0))
    out = timing.time_interleaved({"a": lambda: clock.work(0.02), "b": lambda: clock.work(0.01)}, repeats=5,
                                  min_repeat_seconds=0.0)
    assert [t.load for t in out.values()] == pytest.approx([1.0, 1.0]) and all(t.noise for t in out.values())


def test_a_short_timing_waits_until_the_load_can_be_read(clock, monkeypatch):
    monkeypatch.setattr(timing, "cpu_seconds", FakeMachine(clock, own=0.0, other=0.8))
    slept = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: slept.append(s) or clock.work(s))
    t = timing.time_per_call(lambda: clock.work(0.001), repeats=5, number=1, warmup=0)
    assert slept == pytest.approx([timing.MIN_LOAD_WINDOW - 0.005])  # 5 ms of repeats: topped up, idle
    assert t.median == pytest.approx(0.001) and t.load == pytest.approx(0.8)
    timing.time_per_call(lambda: clock.work(0.1), repeats=5, number=1, warmup=0)
    assert len(slept) == 1  # a long enough timing does not wait


def test_without_cpu_counters_only_the_spread_is_judged(clock, monkeypatch):
    monkeypatch.setattr(timing, "cpu_seconds", lambda: None)  # e.g. no psutil and no /proc
    monkeypatch.setattr(timing.time, "sleep", lambda s: pytest.fail("nothing to wait for"))
    steady = timing.time_per_call(lambda: clock.work(0.01), repeats=7, number=10, warmup=0)
    assert steady.load is None and steady.noise == ""
    jumpy = iter([0.01, 0.03, 0.01, 0.04, 0.01, 0.05, 0.02])
    noisy = timing.time_per_call(lambda: clock.work(next(jumpy)), repeats=7, number=1, warmup=0)
    assert noisy.load is None and noisy.noise.startswith("noisy: IQR")
    assert timing.Timing("three", [1.0, 5.0, 9.0]).noise == ""  # too few repeats to judge a spread


def test_real_cpu_counters_move_forward():
    first = timing.cpu_seconds()
    sum(i * i for i in range(200_000))  # some CPU time for this process
    second = timing.cpu_seconds()
    if first is None:
        pytest.skip("no psutil and no /proc/stat here")
    assert second[0] >= first[0] >= 0 and second[1] >= first[1] >= 0


def test_proc_stat_is_read_without_psutil(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # importing it now raises ImportError
    if not os.path.exists("/proc/stat"):
        assert timing.cpu_seconds() is None
        return
    machine, own = timing.cpu_seconds()
    assert machine > 0 and own >= 0


def test_load_and_verdict_survive_json():
    t = timing.Timing("floor", [1e-3] * 5, load=1.25)
    data = json.loads(json.dumps(t.as_dict()))
    assert data["noise"] == t.noise and "busy" in data["noise"]
    back = timing.Timing.from_dict(data)
    assert back == t and back.load == 1.25 and back.noise == t.noise
    old = {k: v for k, v in t.as_dict().items() if k not in ("load", "noise")}  # saved before the detector
    assert timing.Timing.from_dict(old).load is None


def test_table_says_busy_under_flagged_rows_only():
    quiet = [timing.Timing("jit", [1e-3] * 5, load=0.0), timing.Timing("floor", [5e-4] * 5, load=0.1)]
    rows = timing.table(quiet, floor=quiet[1])
    assert rows.note == "" and "⚠" not in timing.format_table(rows) and "busy" not in timing.format_table(rows)
    busy = [timing.Timing("eager", [2e-3] * 5, load=1.4), *quiet]
    md = timing.format_table(timing.table(busy, floor=busy[-1]))
    note = md.splitlines()[-1]
    assert note.startswith("⚠") and "busy machine (CPU cores other processes kept busy): eager: 1.4." in note
    assert "jit" not in note and "floor" not in note and "spread" not in note
    wide = timing.Timing("jumpy", [1e-3, 1e-3, 3e-3, 5e-3, 5e-3], load=0.0)
    assert "Repeats spread widely (IQR / median): jumpy: 133%." in timing.noise_note([wide, busy[0]])
    assert md.count("\n| ") == 3 and md.splitlines()[-2] == ""  # three rows, a blank line, the note
    assert timing.format_table([{"a": 1.0}]) == "| a |\n|---|\n| 1 |"  # hand-made rows: no note


def test_stamp_counts_busy_timings():
    s = timing.stamp()
    assert {"timings", "noisy_timings", "max_other_cores"} <= s.keys()
    s.update(timings=12, noisy_timings=0, max_other_cores=0.1)
    assert "busy" not in timing.stamp_text(s)
    s.update(noisy_timings=3, max_other_cores=1.7)
    assert "⚠ 3 of 12 timings in this run were busy or noisy" in timing.stamp_text(s)
    assert "1.7 CPU cores" in timing.stamp_text(s)
    old = {k: v for k, v in s.items() if k not in ("timings", "noisy_timings", "max_other_cores")}
    assert "⚠" not in timing.stamp_text(old)


# --- fair races: each side at its best thread count, and a witness that decides ---

class Knob:
    """A side's thread knob in a fake machine: the callable's time depends on the setting."""

    def __init__(self, n=2):
        self.n, self.history = n, []

    def get(self):
        return self.n

    def set(self, n):
        self.n = n
        self.history.append(n)


def test_a_side_with_a_knob_races_at_each_setting_and_keeps_its_fastest(clock):
    knob = Knob(2)
    per_thread = {1: 0.005, 2: 0.012}  # like PyTorch on a busy 2-core machine: one thread is faster
    calls = {1: 0, 2: 0}

    def torch_like():
        calls[knob.n] += 1
        clock.work(per_thread[knob.n])

    out = timing.time_interleaved({"torch": torch_like, "jax": lambda: clock.work(0.004)}, repeats=5,
                                  min_repeat_seconds=0.0, settings=(1, 2), prune=0,
                                  threads={"torch": timing.Threads("PyTorch", knob.get, knob.set),
                                           "jax": timing.Threads("XLA", lambda: 2)})
    assert out["torch"].median == pytest.approx(0.005) and out["torch"].extra["threads"] == "PyTorch 1 thread"
    assert out["torch"].extra["threads_tried"] == {"PyTorch 1 thread": pytest.approx(0.005),
                                                   "PyTorch 2 threads": pytest.approx(0.012)}
    assert out["jax"].extra["threads"] == "XLA 2 threads (fixed at start)"
    assert calls[1] >= 5 and calls[2] >= 5  # both settings raced every round (no pruning asked)
    assert knob.n == 2  # the knob is put back


def test_a_setting_far_slower_than_the_best_is_not_run_again_after_the_first_round(clock):
    knob = Knob(2)
    calls = {1: 0, 2: 0}

    def torch_like():
        calls[knob.n] += 1
        clock.work({1: 0.005, 2: 0.2}[knob.n])  # 40x slower at 2 threads, as measured beside a busy process

    out = timing.time_interleaved({"torch": torch_like}, repeats=6, min_repeat_seconds=0.0, settings=(1, 2),
                                  threads={"torch": timing.Threads("PyTorch", knob.get, knob.set)})
    assert out["torch"].extra["threads"] == "PyTorch 1 thread" and len(out["torch"].seconds) == 6
    assert calls[2] == 2  # its warm-up and its first round only
    assert calls[1] == 1 + 6


class SharedMachine:
    """CPU counters that follow the fake clock, where other processes' cores change while the race runs."""

    def __init__(self, clock):
        self.clock, self.busy, self.other_cpu, self.last = clock, 0.0, 0.0, 0.0

    def __call__(self):
        self.other_cpu += self.busy * (self.clock.now - self.last)
        self.last = self.clock.now
        own = 1.0 * self.clock.now
        return 1000.0 + own + self.other_cpu, own


def test_each_callable_gets_the_load_measured_during_its_own_calls(clock, monkeypatch):
    machine = SharedMachine(clock)
    monkeypatch.setattr(timing, "cpu_seconds", machine)

    def quiet():
        machine(); machine.busy = 0.0
        clock.work(0.05)

    def loaded():  # another process takes 1.5 cores while this one runs
        machine(); machine.busy = 1.5
        clock.work(0.05)
        machine(); machine.busy = 0.0

    out = timing.time_interleaved({"quiet": quiet, "loaded": loaded}, repeats=6, min_repeat_seconds=0.0)
    assert out["loaded"].load == pytest.approx(1.5, abs=0.01) and out["loaded"].busy
    assert out["quiet"].load == pytest.approx(0.0, abs=0.01) and not out["quiet"].busy


def test_a_sound_race_gives_its_ratio_and_the_settings():
    slow = timing.Timing("PyTorch eager", [0.010, 0.011, 0.0105], load=0.02, extra={"threads": "PyTorch 1 thread"})
    fast = timing.Timing("floor", [0.002, 0.0021, 0.002], load=0.01, extra={"threads": "XLA 2 threads"})
    r = timing.ratio(slow, fast)
    assert r.measured and r.value == pytest.approx(0.0105 / 0.002) and r.why == ""
    assert r.threads == {"PyTorch eager": "PyTorch 1 thread", "floor": "XLA 2 threads"}
    assert r.text() == f"{0.0105 / 0.002:.2f}×"
    assert r.says("JAX is {x:.1f}× faster.") == f"JAX is {0.0105 / 0.002:.1f}× faster."


@pytest.mark.parametrize("slow_seconds, load, why", [
    ([0.010, 0.011, 0.0105], 1.9, "1.9 CPU cores busy while PyTorch eager ran"),  # another process took CPU
    ([0.010, 0.200, 0.257], 0.0, "median was 20.0× its fastest run"),  # the median far above its fastest call
    ([0.010, 0.011, 0.040, 0.012, 0.039], 0.0, "the rounds disagreed"),  # rounds that disagree
])
def test_an_unsound_race_is_not_measured_and_says_why(slow_seconds, load, why):
    slow = timing.Timing("PyTorch eager", slow_seconds, load=load)
    fast = timing.Timing("floor", [0.002] * len(slow_seconds), load=0.0)
    r = timing.ratio(slow, fast)
    assert r.value is None and not r.measured and why in r.why
    assert r.text() == "not measured (the machine was busy)"
    sentence = r.says("JAX is {x:.1f}× faster.")
    assert "{x" not in sentence and "not measured" in sentence and "quiet machine" in sentence and why in sentence
    assert r.says("JAX is {x:.1f}× faster.", otherwise="The step race").startswith("The step race: the machine was busy")


def test_a_ratio_survives_being_saved_and_read_back():
    r = timing.Ratio("a", "b", None, "other processes kept 2.0 CPU cores busy", {"a": "PyTorch 1 thread", "b": None})
    plain = json.loads(json.dumps(timing.to_plain({"race": {"ratio": r, "t": timing.Timing("t", [1.0])}})))
    back = timing.from_plain(plain)
    assert back["race"]["ratio"] == r and isinstance(back["race"]["t"], timing.Timing)


def test_thread_settings_are_one_and_one_per_core_unless_the_reader_says_otherwise(monkeypatch):
    monkeypatch.delenv("FASTJAX_THREADS", raising=False)
    s = timing.thread_settings()
    assert s[0] == 1 and s[-1] == timing.cores() and len(set(s)) == len(s)
    monkeypatch.setenv("FASTJAX_THREADS", "4,1")
    assert timing.thread_settings() == (1, 4)
    for bad in ("0", "two", "1,-2"):
        monkeypatch.setenv("FASTJAX_THREADS", bad)
        with pytest.raises(ValueError, match="FASTJAX_THREADS must be thread counts"):
            timing.thread_settings()


def test_children_waited_for_count_as_this_processes_own_cpu():
    import subprocess

    before = timing.cpu_seconds()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    after = timing.cpu_seconds()
    child = os.times()
    assert before is not None and after is not None
    assert after[1] - before[1] >= 0.05 and child.children_user + child.children_system > 0
