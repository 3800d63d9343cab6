"""fastjax.tools.compile_sweeps and cache_probe.runs_table on tiny programs: times per size, and a raise
where the ways of writing a loop disagree."""

import jax
import jax.numpy as jnp
import pytest

from fastjax.tools import cache_probe, compile_sweeps


def steps_scan(n, scale=1.0):
    return jax.jit(lambda x: jax.lax.scan(lambda c, _: (c * 0.5 + 1.0, c * scale), x, length=n))


def test_sweep_steps_times_each_way_and_checks_the_numbers():
    ways = {"lax.scan": steps_scan, "again": steps_scan}
    seconds, last, gaps = compile_sweeps.sweep_steps(ways, [1, 2], (jnp.float32(1.0),), same_at_one=None)
    assert [len(v) for v in seconds.values()] == [2, 2] and max(gaps.values()) == 0.0
    with pytest.raises(AssertionError, match="different ELBOs"):
        compile_sweeps.sweep_steps({"lax.scan": steps_scan, "off": lambda n: steps_scan(n, 1.01)}, [2],
                                   (jnp.float32(1.0),), same_at_one=None)


def test_sweep_layers_agrees_between_identical_ways():
    def loss(ws, x):
        return jnp.mean(jax.lax.conv_general_dilated(x, ws[0, 0], (1, 1), "SAME",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC")) ** 2)
    seconds, gap = compile_sweeps.sweep_layers({"a": loss, "b": loss}, [1], jnp.ones((2, 4, 4, 3)), 3)
    assert len(seconds["a"]) == 1 and gap == 0.0


def test_runs_table_names_hits_and_entries():
    run = {"PLN step": {"lower": 0.1, "compile": 0.2, "cache hit": True},
           "ResNet step": {"lower": 0.3, "compile": 0.4, "cache hit": False}, "entries": ["b", "a", "a"]}
    row, = cache_probe.runs_table({"1": run})
    assert row["read from the cache"] == "PLN step" and row["programs in the cache after"] == "a, b"
