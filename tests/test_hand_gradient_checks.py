"""The checks of the hand gradient that chapters/floor/01-pln-gradient.md calls (fastjax.pln.hand_gradient_checks,
hand_gradient_timing): they pass on small data, and they fail where the gradient or a kernel is wrong."""

from __future__ import annotations

import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import floor as F, hand_gradient_checks as C, hand_gradient_timing as T


@pytest.fixture(scope="module")
def small():
    """A small oaks shape (more rows than columns) and a stacked one: NumPy data, and JAX float32 data."""
    oaks = pln.load_oaks_counts()
    data_np = {"oaks 40 × 30": pln.check_pln_data(oaks.counts[:40, :30], oaks.offsets[:40, :30]),
               "oaks × 2": pln.load_oaks_counts(2)}
    return data_np, {name: pln.to_jax(d) for name, d in data_np.items()}


def test_rel_err_is_relative_to_each_gradients_largest_entry():
    ref = (np.array([1.0, -4.0]), np.array([10.0]))
    assert C.rel_err(ref, ref) == 0.0
    assert C.rel_err((np.array([1.0, -3.0]), np.array([10.0])), ref) == pytest.approx(0.25)
    assert C.rel_err((np.array([1.0, -4.0]), np.array([9.0])), ref) == pytest.approx(0.1)


def test_the_checks_pass_on_small_data(small):
    data_np, datasets = small
    rows, errors, ref64 = C.check_float64(datasets, data_np)
    assert len(rows) == len(datasets) * len(C.WAYS) == len(errors)
    rows32 = C.check_float32(datasets, ref64, list(datasets))
    assert [r["data"] for r in rows32] == list(datasets)
    # where a fit ends: any point of the oaks data, stacked for the stacked shape
    fitted = tuple(np.asarray(a) for a in C.away_from_start(pln.load_oaks_counts(), seed=3))
    late_rows, late = C.check_late({"oaks × 2": datasets["oaks × 2"]}, {"oaks × 2": data_np["oaks × 2"]},
                                   {"oaks × 2": 2}, fitted, ref64)
    assert late["oaks × 2"]["margin"] > 0 and len(late_rows) == 1


def test_the_float64_check_fails_on_a_wrong_gradient(small, monkeypatch):
    data_np, datasets = small
    right = F.value_and_grad_by_hand

    def wrong(params, data, by_product=None, wide=None):  # the S term off by 1 %
        value, (gm, gs) = right(params, data, by_product, wide)
        return value, (gm, 1.01 * gs)

    monkeypatch.setattr(F, "value_and_grad_by_hand", wrong)
    jax.clear_caches()  # all_gradients traces again, with the wrong gradient
    try:
        with pytest.raises(AssertionError, match="oaks 40 × 30"):
            C.check_float64({"oaks 40 × 30": datasets["oaks 40 × 30"]}, data_np)
    finally:
        monkeypatch.undo()
        jax.clear_caches()


def test_the_kernel_timings_check_what_they_time(small):
    data_np, _ = small
    rows, rates, kernel_ms = T.time_sigma_kernels({"oaks × 2": data_np["oaks × 2"]}, repeats=1)
    assert rows[0]["n > 2p picks"] in ("two solves", "Σ⁻¹, then one product") and all(v > 0 for v in rates["oaks × 2"])
    wide_rows, t = T.time_wide(pln.load_scrna_counts(30, 60), repeats=1)  # fewer cells than genes
    assert [r["way"] for r in wide_rows] == list(t) and wide_rows[1]["Gflop"] < wide_rows[0]["Gflop"]
    cost = T.iteration_cost(F.loss_by_hand, pln.to_jax(data_np["oaks × 2"]))
    assert cost["flops"] > 0 and cost["library flops"] > 0


def test_openblas_table_gives_medians_and_ratios_to_the_reference():
    settings = {"a": {"X": "1"}, "b": {"X": "2"}}
    runs = [{"round": 1, "setting": "a", "s1": 1.0}, {"round": 1, "setting": "b", "s1": 3.0},
            {"round": 2, "setting": "a", "s1": 2.0}, {"round": 2, "setting": "b", "s1": 5.0}]
    blas, table = T.openblas_table(runs, settings, "a")
    assert blas == {"a": {"s1": 1.5}, "b": {"s1": 4.0}}
    assert [r["setting"] for r in table] == ["a (X=1)", "b (X=2)"] * 2
    assert [r["s1, × a"] for r in table] == [1.0 / 1.5, 3.0 / 1.5, 2.0 / 1.5, 5.0 / 1.5]


def test_against_roofline_times_both_fits_and_checks_they_end_together(small):
    import math

    from fastjax.pln import rungs as R

    _, datasets = small
    d = datasets["oaks 40 × 30"]
    args = (pln.start(d), d, jnp.float32(0), jnp.float32(math.inf))
    fits = {"small": {how: (R.fit_until_converged.lower(*args, maxiter=3, loss=loss).compile(), loss)
                      for how, loss in (("jax.grad", pln.loss), ("by hand", F.loss_by_hand))}}
    rows, speedups, fractions = T.against_roofline(fits, {"small": args}, 3, 1, 1e10, 1e10)
    assert [r["gradient"] for r in rows] == ["jax.grad", "by hand"] and speedups["small"] > 0
    assert all(f > 0 for f in fractions.values())
