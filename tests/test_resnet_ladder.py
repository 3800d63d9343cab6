"""Every rung of the Part II ladder trains the same network the same way, and each is traced once."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from fastjax.resnet import bench as B, ladder as L
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools import timing
from fastjax.tools.timing import Timing

# One stage keeps each rung's compile short (most of this file's time): the rungs differ in how
# they call the step, not in the network (tests/test_resnet.py checks the deeper twins).
CONFIG = ResNetConfig(width=4, stages=1, blocks=1)
N_STEPS, BATCH = 10, 16


@pytest.fixture(scope="module")
def batches():
    return L.training_batches(N_STEPS, BATCH)


@pytest.fixture(scope="module")
def reference(batches):
    rung = L.build("nnx.jit", CONFIG)
    return L.trajectory(rung, *batches), rung.weights()


@pytest.mark.parametrize("name", [n for n in L.NNX_RUNGS + L.EQX_RUNGS + ("floor",) if n != "nnx.jit"])
def test_every_rung_follows_the_same_trajectory(name, batches, reference):
    ref_losses, ref_weights = reference
    rung = L.build(name, CONFIG)
    losses = L.trajectory(rung, *batches)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4)
    weights = rung.weights()
    assert weights.keys() == ref_weights.keys()
    if name in L.EQX_RUNGS:  # another program: the chapters' rule for programs that round differently
        L.assert_same_weights(weights, ref_weights, N_STEPS)
    else:  # the same traced step
        for k in weights:
            np.testing.assert_allclose(weights[k], ref_weights[k], rtol=1e-4, atol=1e-5, err_msg=k)
    calls = N_STEPS // rung.steps_per_call
    assert rung.traces.count == (calls if name == "no-jit" else 1)


def test_trajectory_needs_whole_scan_chunks(batches):
    rung = L.build("scan K=10", CONFIG)
    xs, ys = batches
    with pytest.raises(ValueError, match="not a multiple"):
        L.trajectory(rung, xs[:5], ys[:5])


def test_unknown_rung_is_rejected():
    with pytest.raises(ValueError, match="unknown rung"):
        L.build("jit everything", CONFIG)


def test_interleaved_timing_returns_one_timing_per_callable():
    out = timing.time_interleaved({"a": lambda: 1, "b": B.dispatch_floor()}, repeats=3, per={"a": 2})
    assert set(out) == {"a", "b"} and all(isinstance(t, Timing) for t in out.values())
    assert len(out["a"].seconds) == 3 and out["a"].per == 2


def test_measure_ladder_shape(monkeypatch):
    monkeypatch.setattr(B, "settings", lambda: type("S", (), dict(
        config=CONFIG, batch=BATCH, steps=N_STEPS, repeats=1, size="quick"))())
    out = B.measure_ladder(names=("nnx.jit", "split/merge"), repeats=1)
    assert set(out) == {"rungs", "floor", "floor_fast", "dispatch_floor", "extra"}
    assert out["floor_fast"].name == B.FASTER_FLOOR and out["floor_fast"].median > 0
    assert [t.name for t in out["rungs"]] == ["nnx.jit", "split/merge"]
    assert out["extra"]["traces"] == {"nnx.jit": 1, "split/merge": 1, "floor": 1}


def _scan_of_conv(dims):
    x = jnp.ones((2, 4, 4, 3)) if dims[0] == "NHWC" else jnp.ones((2, 3, 4, 4))
    w = jnp.ones((3, 3, 3, 3))

    def body(c, _):
        return jax.lax.conv_general_dilated(c, w, (1, 1), "SAME", dimension_numbers=dims), None

    return jax.jit(lambda c: jax.lax.scan(body, c, None, length=3)[0]).lower(x).compile().as_text()


def test_convolutions_are_counted_by_place_and_layout():
    assert B.convolutions(_scan_of_conv(("NHWC", "HWIO", "NHWC"))) == {"in a loop, NHWC/HWIO": 1}
    assert B.convolutions(_scan_of_conv(("NCHW", "OIHW", "NCHW"))) == {"in a loop, other layout": 1}
    top = jax.jit(lambda c: c * 2).lower(jnp.ones(3)).compile().as_text()
    assert B.convolutions(top) == {}


def test_trace_ops_sums_the_ops_of_one_program(tmp_path):
    f = jax.jit(lambda c: jax.lax.scan(lambda c, _: (jnp.sin(c) @ c, None), c, None, length=4)[0])
    x = jnp.ones((32, 32))
    compiled = f.lower(x).compile()
    compiled(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        compiled(x).block_until_ready()
    trace = next(tmp_path.rglob("*.trace.json.gz"))
    rows = B.trace_ops(trace, compiled.as_text())
    assert rows and all(r["calls"] >= 1 and r["total ms"] >= 0 for r in rows)
    assert any(r["in_loop"] for r in rows)
    assert [r["total ms"] for r in rows] == sorted((r["total ms"] for r in rows), reverse=True)


class _Counted:
    unflattens = 0

    def __init__(self, x):
        self.x = x


jax.tree_util.register_pytree_node(
    _Counted, lambda c: ((c.x,), None),
    lambda _, children: (setattr(_Counted, "unflattens", _Counted.unflattens + 1), _Counted(*children))[1])


def test_round_trips_returns_nothing_and_runs_n_times():
    _Counted.unflattens = 0
    assert B.round_trips(_Counted(jnp.ones(2)), 5)() is None
    assert _Counted.unflattens == 5


def test_assert_same_losses_checks_the_first_loss_tightly_and_the_rest_loosely():
    ref = np.array([2.0, 1.5, 1.0])
    assert L.assert_same_losses(ref * [1, 1.01, 0.99], ref) == pytest.approx(0.01)
    with pytest.raises(AssertionError, match="first loss"):
        L.assert_same_losses(ref * [1 + 1e-4, 1, 1], ref)
    with pytest.raises(AssertionError):
        L.assert_same_losses(ref * [1, 1.05, 1], ref)
    with pytest.raises(AssertionError, match="losses against"):
        L.assert_same_losses(ref[:2], ref)


def test_assert_same_weights_allows_a_tenth_of_a_step_per_step():
    ref = {"w": np.zeros(3)}
    step = L.WEIGHT_ATOL_PER_STEP
    assert L.assert_same_weights({"w": np.array([0.0, 1.9 * step, 0.0])}, ref, n_steps=2) == pytest.approx(1.9 * step)
    with pytest.raises(AssertionError):
        L.assert_same_weights({"w": np.array([0.0, 2.1 * step, 0.0])}, ref, n_steps=2)
    with pytest.raises(AssertionError, match="different weights"):
        L.assert_same_weights({"v": np.zeros(3)}, ref, n_steps=2)


def test_batchnorm_statistics_are_compared_on_their_own_scale():
    ref = {"bn.mean": np.array([0.0, 10.0]), "bn.bias": np.zeros(2)}
    L.assert_same_weights({"bn.mean": np.array([0.1, 10.1]), "bn.bias": np.zeros(2)}, ref, n_steps=1)
    with pytest.raises(AssertionError, match="bn.mean"):
        L.assert_same_weights({"bn.mean": np.array([0.5, 10.0]), "bn.bias": np.zeros(2)}, ref, n_steps=1)


def test_the_sweep_stops_before_a_width_its_budget_cannot_pay(monkeypatch):
    """A fake clock: each step of width w costs (w/4)³ hundredths of a second, as the budget predicts."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def fake_build(name, config):
        def run(x, y):
            clock[0] += 0.01 * (config.width / 4) ** 3
        return B.Rung(name, run, weights=dict)

    monkeypatch.setattr(B, "build", fake_build)
    out = B.measure_sweep(widths=(4, 8, 16), n_steps=1, names=("nnx.jit", "floor"), repeats=1, budget=2.0)
    assert out["widths"] == [4, 8] and out["skipped"] == [16]
    assert len(out["seconds"]["floor"]) == 2 and np.allclose(out["overhead"]["nnx.jit"], 0.0)
    with pytest.raises(ValueError, match="widths must increase"):
        B.measure_sweep(widths=(8, 4), n_steps=1, names=("floor",), repeats=1, budget=2.0)
