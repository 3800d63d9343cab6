"""fastjax.pln.bench: the JAX fit follows pyPLNmodels; the ladder and the race run and report what they say."""

from __future__ import annotations

import fastjax  # noqa: F401
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import bench as bench_pln
from fastjax.tools.timing import Timing

torch = pytest.importorskip("torch")


@pytest.mark.xdist_group("pyplnmodels")
def test_criterion_matches_pyplnmodels(pyplnmodels_fit):
    from pyPLNmodels.utils._criterion import _ElboCriterionMonitor

    elbos = pyplnmodels_fit[2].astype(np.float64)  # the fit's own ELBOs, fed to both criteria
    assert len(elbos) > 60
    monitor, ours = _ElboCriterionMonitor(), pln.criterion_start(np.float64, np)
    for e in elbos:
        monitor.update_criterion(e)
        ours = pln.criterion_update(ours, e, np)
        assert float(ours.value) == pytest.approx(monitor.criterion, rel=1e-12)


@pytest.mark.xdist_group("pyplnmodels")
def test_pyplnmodels_float32_is_its_default(pyplnmodels_fit):
    model, seconds, elbos, times = pyplnmodels_fit
    assert model._latent_mean.dtype == torch.float32 and torch.get_default_dtype() == torch.float32
    assert elbos.shape == times.shape and 1 < len(elbos) <= pln.MAXITER and seconds > 0


def test_first_reaching():
    assert bench_pln.first_reaching(np.array([-200.0, -100.2, -100.01]), -100.0) == 2
    assert bench_pln.first_reaching(np.array([-200.0]), -100.0) is None


def test_measure_ladder_structure():
    rng = np.random.default_rng(0)
    small = pln.to_jax(pln.check_pln_data(rng.poisson(2.0, size=(16, 3))))
    out = bench_pln.measure_ladder(small)
    assert set(out) == {"rungs", "floor", "floor_fast", "extra"}
    names = [t.name for t in out["rungs"]]
    assert names[:3] == ["1 no-jit", "2 jit", "3 scan"] and any(n.startswith("6 ") for n in names)
    assert all(isinstance(t, Timing) and t.median > 0 for t in out["rungs"] + [out["floor"], out["floor_fast"]])
    assert out["floor_fast"].name.startswith("Part VI floor") and out["floor_fast"].compile_seconds > 0
    assert out["extra"]["n"] == 16 and out["extra"]["compile_seconds"] > 0


def test_profile_iteration_names_each_piece():
    rng = np.random.default_rng(1)
    small = pln.to_jax(pln.check_pln_data(rng.poisson(2.0, size=(12, 3))))
    parts = bench_pln.profile_iteration(small)
    assert [t.name for t in parts] == ["ELBO", "log|Σ| term + its gradient", "ELBO + gradient",
                                       "whole Rprop step (scan)", "whole step + criterion (while_loop)"]
    assert all(t.median > 0 for t in parts)


def test_whole_process_races_each_size_and_keys_it_by_n(monkeypatch):
    from fastjax.pln import first_result

    calls = []
    monkeypatch.setattr(first_result, "race", lambda **kw: calls.append(kw) or {"n": 116 * kw["repeat"]})
    out = bench_pln.whole_process(repeats=(1, 3), rounds=2)
    assert list(out) == ["n=116", "n=348"] and [c["repeat"] for c in calls] == [1, 3]
    assert all(c["rounds"] == 2 for c in calls)
