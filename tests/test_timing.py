import json

import fastjax  # noqa: F401  (CPU workaround before JAX)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import timing


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


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
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
