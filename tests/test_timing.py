import json
import time

import fastjax  # noqa: F401  (CPU workaround before JAX)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import timing


def test_block_waits_on_every_array_of_a_pytree():
    tree = {"a": jnp.ones(3) * 2, "b": [jnp.zeros(2), 1.0, "text"]}
    assert timing.block(tree) is tree


def test_time_per_call_measures_a_known_sleep():
    t = timing.time_per_call(time.sleep, 0.01, repeats=3, number=2, warmup=0, name="sleep")
    assert len(t.seconds) == 3 and t.number == 2
    assert 0.009 < t.median < 0.05
    assert t.q1 <= t.median <= t.q3 and t.best <= t.median
    assert "sleep" in repr(t)


def test_per_divides_by_units_of_work():
    t = timing.time_per_call(time.sleep, 0.02, repeats=3, number=1, warmup=0, per=4)
    assert 0.004 < t.median < 0.012


@pytest.mark.parametrize("sync", ["each", "last"])
def test_jitted_eager_and_aot_callables_all_time(sync):
    f = lambda x: jnp.sin(x) @ x.T  # noqa: E731
    x = jnp.ones((64, 64))
    jf = jax.jit(f)
    aot = timing.compile_time(jf, x)
    for fn in (f, jf, aot.compiled):
        t = timing.time_per_call(fn, x, repeats=3, sync=sync)
        assert t.median > 0 and t.number >= 1 and t.sync == sync


def test_autorange_picks_enough_calls_for_fast_functions():
    t = timing.time_per_call(lambda: None, repeats=2, min_repeat_seconds=0.01)
    assert t.number > 100


def test_the_result_is_waited_for():
    # A slow jitted computation: without blocking the call returns in microseconds.
    f = jax.jit(lambda x: jnp.linalg.matrix_power(x, 64))
    x = jnp.eye(400) * 0.5
    timing.block(f(x))
    t = timing.time_per_call(f, x, repeats=3, number=1)
    t0 = time.perf_counter()
    timing.block(f(x))
    one_call = time.perf_counter() - t0
    assert t.median > 0.2 * one_call


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


def test_first_call_includes_compilation():
    c = float(np.random.default_rng().uniform(1, 2))  # a new program each run: never in a compile cache
    f = jax.jit(lambda x: jnp.tanh(x) * c + x[::-1])
    x = jnp.ones(1000)
    first = timing.first_call_seconds(f, x)
    later = timing.time_per_call(f, x, repeats=3)
    assert first > later.median


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


def test_table_and_format_and_save(tmp_path):
    a = timing.Timing("a", [1e-3, 2e-3, 3e-3])
    b = timing.Timing("b", [2e-3, 4e-3, 6e-3])
    rows = timing.table([a, b], floor=a, unit="ms")
    assert rows[1]["median (ms)"] == pytest.approx(4.0) and rows[1]["× floor"] == pytest.approx(2.0)
    md = timing.format_table(rows)
    assert md.splitlines()[0].startswith("| variant") and "| b | 4 |" in md
    path = timing.save_results(tmp_path / "r.json", {"demo": [a, b]}, note="x")
    data = json.loads(path.read_text())
    assert data["note"] == "x" and data["timings"]["demo"][1]["median"] == pytest.approx(4e-3)
    assert "jax" in data["stamp"]


def test_format_seconds():
    assert timing.format_seconds(2.5) == "2.5 s"
    assert timing.format_seconds(0.0031) == "3.1 ms"
    assert timing.format_seconds(4.2e-6) == "4.2 µs"
    assert timing.format_seconds(3e-9) == "3 ns"
