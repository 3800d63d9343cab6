"""fastjax.bench_pln: the JAX fit follows pyPLNmodels; the ladder and the race run and report what they say."""

from __future__ import annotations

import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import bench_pln, pln
from fastjax.timing import Timing

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def oaks():
    return pln.load_oaks_counts()


def test_trajectory_matches_pyplnmodels_in_float64(oaks):
    from fastjax.rungs import pln as R

    _, _, ref, _ = bench_pln.fit_pyplnmodels(oaks, dtype="float64")
    with jax.enable_x64(True):
        d64 = pln.to_jax(oaks, jnp.float64)
        _, elbos = R.scan_fit_jit(pln.start(d64), d64, n_iter=len(ref))
    assert len(ref) == pln.MAXITER
    # float64 rounding (eps 1.1e-16) over 13,224 terms: ~1e-12 per ELBO, 100× margin; measured 3e-14
    np.testing.assert_allclose(np.asarray(elbos), ref, rtol=1e-10)


def test_criterion_matches_pyplnmodels(oaks):
    from pyPLNmodels.utils._criterion import _ElboCriterionMonitor

    _, _, elbos, _ = bench_pln.fit_pyplnmodels(oaks, dtype="float64", maxiter=60)
    monitor, ours = _ElboCriterionMonitor(), pln.criterion_start(np.float64, np)
    for e in elbos:
        monitor.update_criterion(e)
        ours = pln.criterion_update(ours, e, np)
        assert float(ours.value) == pytest.approx(monitor.criterion, rel=1e-12)


def test_pyplnmodels_float32_is_its_default(oaks):
    model, seconds, elbos, times = bench_pln.fit_pyplnmodels(oaks, maxiter=3)
    assert model._latent_mean.dtype == torch.float32 and torch.get_default_dtype() == torch.float32
    assert elbos.shape == (3,) and times.shape == (3,) and seconds > 0


def test_first_reaching():
    assert bench_pln.first_reaching(np.array([-200.0, -100.2, -100.01]), -100.0) == 2
    assert bench_pln.first_reaching(np.array([-200.0]), -100.0) is None


def test_measure_ladder_structure():
    rng = np.random.default_rng(0)
    small = pln.to_jax(pln.check_pln_data(rng.poisson(2.0, size=(16, 3))))
    out = bench_pln.measure_ladder(small)
    assert set(out) == {"rungs", "floor", "extra"}
    names = [t.name for t in out["rungs"]]
    assert names[:3] == ["1 no-jit", "2 jit", "3 scan"] and any(n.startswith("6 ") for n in names)
    assert all(isinstance(t, Timing) and t.median > 0 for t in out["rungs"] + [out["floor"]])
    assert out["extra"]["n"] == 16 and out["extra"]["compile_seconds"] > 0


def test_race_stops_both_fits_by_the_same_rule():
    out = bench_pln.race(torch_threads=1)
    assert abs(out["jax_iterations"] - out["pyplnmodels_iterations"]) <= 1
    target = out["target_elbo"]
    assert out["jax_final_elbo"] >= target - bench_pln.TARGET_GAP * abs(target)
    assert 0 < out["jax_iters_to_target"] <= out["jax_iterations"]
    assert out["jax_fresh_process_cached_seconds"] > 0 and out["jax_compile_seconds"] > 0
    assert all(out[k] > 0 for k in out if k.startswith("speedup_"))


def test_profile_iteration_names_each_piece():
    rng = np.random.default_rng(1)
    small = pln.to_jax(pln.check_pln_data(rng.poisson(2.0, size=(12, 3))))
    parts = bench_pln.profile_iteration(small)
    assert [t.name for t in parts] == ["ELBO", "log|Σ| term + its gradient", "ELBO + gradient",
                                       "whole Rprop step (scan)", "whole step + criterion (while_loop)"]
    assert all(t.median > 0 for t in parts)
