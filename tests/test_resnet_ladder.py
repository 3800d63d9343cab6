"""Every rung of the Part II ladder trains the same network the same way, and each is traced once."""

from __future__ import annotations

import numpy as np
import pytest

from fastjax import resnet_ladder as L
from fastjax import timing
from fastjax.resnet_nnx import ResNetConfig
from fastjax.timing import Timing

CONFIG = ResNetConfig(width=4, stages=2, blocks=1)
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
    out = timing.time_interleaved({"a": lambda: 1, "b": L.dispatch_floor()}, repeats=3, per={"a": 2})
    assert set(out) == {"a", "b"} and all(isinstance(t, Timing) for t in out.values())
    assert len(out["a"].seconds) == 3 and out["a"].per == 2


def test_measure_ladder_shape(monkeypatch):
    monkeypatch.setattr(L, "settings", lambda: type("S", (), dict(
        config=CONFIG, batch=BATCH, steps=N_STEPS, repeats=1, size="quick"))())
    out = L.measure_ladder(names=("nnx.jit", "split/merge"), repeats=1)
    assert set(out) == {"rungs", "floor", "dispatch_floor", "extra"}
    assert [t.name for t in out["rungs"]] == ["nnx.jit", "split/merge"]
    assert out["extra"]["traces"] == {"nnx.jit": 1, "split/merge": 1, "floor": 1}
