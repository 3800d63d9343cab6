"""Part VI's PLN floor (fastjax.pln.floor, exported from chapters/floor/01-02): the hand gradient is
jax.grad's, the packed Rprop is torch's rule to the bit, the fast fit is Part I's fit, bad input is named."""

from __future__ import annotations

import math

import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax.tools import timing

from fastjax import pln
from fastjax.pln import bench as bench_pln, floor as F, rungs as R
from test_rprop import jax_path, loss_np


@pytest.fixture(scope="module")
def data():
    return pln.to_jax(pln.load_oaks_counts())


def away_from_start(data, seed=0):
    m, s = pln.start(data)
    k1, k2 = jax.random.split(jax.random.key(seed))
    return (m + 0.3 * jax.random.normal(k1, m.shape, m.dtype), s * jax.random.uniform(k2, s.shape, s.dtype, 0.5, 2.0))


def rel_err(ours, ref):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
               for a, b in zip(ours, ref))


@pytest.mark.parametrize("shape", [(116, 114), (60, 150)])  # more rows than columns, and fewer (n < p: the n×n way)
@pytest.mark.parametrize("by_product, wide", [(None, None), (False, False), (True, False), (None, True)])
def test_hand_gradient_is_jax_grad_in_float64(shape, by_product, wide):
    with jax.enable_x64(True):
        oaks = pln.load_oaks_counts()
        n, p = shape
        if p > 114:  # more columns than oaks has: two copies side by side, columns shifted so none repeats
            counts = np.hstack([oaks.counts[:n], np.roll(oaks.counts[:n], 1, axis=0)])[:, :p]
            with pytest.warns(UserWarning, match="only zeros"):  # one column of the first 60 rows is all 0
                d = pln.to_jax(pln.check_pln_data(counts), jnp.float64)
        else:
            d = pln.to_jax(pln.check_pln_data(oaks.counts[:n, :p], oaks.offsets[:n, :p]), jnp.float64)
        params = away_from_start(d)
        ref_value, ref_grads = jax.value_and_grad(pln.loss)(params, d)
        value, grads = jax.jit(F.value_and_grad_by_hand, static_argnums=(2, 3))(params, d, by_product, wide)
        # float64: a solve with Σ loses up to cond(Σ) × eps; measured ~2e-16 (cond ~1e2)
        assert rel_err(grads, ref_grads) < 1e-12
        assert abs(float(value - ref_value)) < 1e-12 * abs(float(ref_value))


def test_wide_products_are_the_p_by_p_ones():
    """R Σ⁻¹, diag(Σ⁻¹) and log|Σ| through the n×n matrix K equal those through Σ itself (float64)."""
    with jax.enable_x64(True):
        r = jax.random.normal(jax.random.key(0), (30, 70), jnp.float64)
        col_sq = jax.random.uniform(jax.random.key(1), (70,), jnp.float64, 0.5, 3.0)
        sigma = (r.T @ r + jnp.diag(col_sq)) / 30
        r_prec, prec_diag, logdet, _ = F.wide_products(r, col_sq)
        precision = jnp.linalg.inv(sigma)
        np.testing.assert_allclose(r_prec, r @ precision, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(prec_diag, jnp.diag(precision), rtol=1e-9)
        np.testing.assert_allclose(logdet, jnp.linalg.slogdet(sigma)[1], rtol=1e-12)


def test_custom_vjp_gives_the_hand_gradient(data):
    params = away_from_start(data)
    via_grad = jax.grad(F.loss_by_hand)(params, data)
    value, grads = F.value_and_grad_by_hand(params, data)
    assert rel_err(via_grad, grads) == 0.0
    np.testing.assert_allclose(float(F.loss_by_hand(params, data)), float(value), rtol=0)
    # and float32 agrees with jax.grad's float32 gradient to float32 rounding
    assert rel_err(grads, jax.grad(pln.loss)(params, data)) < 1e-5


def test_packed_rprop_follows_torch_bit_for_bit():
    x0 = np.linspace(-1.0, 2.0, 7)
    np.testing.assert_array_equal(jax_path(F.rprop_packed(0.01), x0, 60),
                                  jax_path(fastjax_rprop(0.01), x0, 60))  # both torch's rule: same float64 numbers
    kw = dict(etas=(0.3, 1.5), step_sizes=(1e-10, 0.2))
    np.testing.assert_array_equal(jax_path(F.rprop_packed(0.05, **kw), x0, 60), jax_path(fastjax_rprop(0.05, **kw), x0, 60))
    assert float(loss_np(jnp.asarray(x0))) > 0  # the toy loss of test_rprop: its gradient flips sign along the path


def fastjax_rprop(lr, **kw):
    from fastjax.pln.rprop import rprop
    return rprop(lr, **kw)


@pytest.mark.parametrize("repeat", [1, 10])  # 13,224 entries of M (torch's state) and 132,240 (packed)
def test_fast_fit_is_part1_fit_with_the_hand_gradient(repeat):
    data = pln.to_jax(pln.load_oaks_counts(repeat))
    assert (data.counts.size >= F.PACKED_FROM) == (repeat == 10)
    args = (pln.start(data), data, jnp.float32(0), jnp.float32(math.inf))
    _, part1, _ = R.fit_until_converged(*args, maxiter=40, loss=F.loss_by_hand)
    _, packed, _ = R.fit_until_converged(*args, maxiter=40, loss=F.loss_by_hand, optimizer=F.fast_optimizer)
    np.testing.assert_array_equal(np.asarray(part1), np.asarray(packed))  # torch's rule, packed: the same numbers
    (m, s), fast, crit = F.fit_fast(*args, maxiter=40)
    np.testing.assert_array_equal(np.asarray(part1), np.asarray(fast))  # same operations on the same numbers
    assert int(crit.count) == 40 and m.shape == s.shape == data.counts.shape
    pln.check_fit(fast, crit)  # finite: no error


def test_fast_fit_stops_by_pyplnmodels_rule(data):
    args = (pln.start(data), data, jnp.float32(pln.TOL), jnp.float32(math.inf))
    _, old, crit_old = R.fit_until_converged(*args)
    _, new, crit_new = F.fit_fast(*args)
    # Two float32 roundings of one gradient: Rprop follows their signs, and an entry within rounding of 0 can
    # take the other branch, so the trajectories part for a while (measured up to 0.66 % from iteration 28)
    # and meet again: the final ELBOs end 6.3e-6 apart here (float64 agrees to 3e-14: chapters/floor/01, and
    # test_fast_fit_is_part1_fit_with_the_hand_gradient checks the same loss bit for bit). No rounding
    # argument bounds where a sign flip leads, so the check is the book's "same fit": pln.TARGET_GAP.
    assert abs(int(crit_old.count) - int(crit_new.count)) <= 1
    final_old = np.asarray(old)[int(crit_old.count) - 1]
    final_new = np.asarray(new)[int(crit_new.count) - 1]
    assert abs(pln.relative_gap(float(final_new), float(final_old))) < pln.TARGET_GAP


@pytest.mark.parametrize("params, error, match", [
    (lambda m, s: (m[:5], s), ValueError, "shape of the counts"),
    (lambda m, s: (m.at[0, 0].set(jnp.nan), s), ValueError, "NaN or infinite"),
    (lambda m, s: (m, s.at[2, 3].set(0.0)), ValueError, "zero entries"),
    (lambda m, s: (m.astype(jnp.int32), s), TypeError, "floats"),
    (lambda m, s: m, TypeError, "pair"),
])
def test_bad_parameters_are_named(data, params, error, match):
    with pytest.raises(error, match=match):
        F.value_and_grad_by_hand(params(*pln.start(data)), data)


@pytest.mark.parametrize("change, error, match", [
    # a column of M the same in every row (R's column is 0) and its S at 1e-30 (S² underflows in float32)
    (lambda m, s: (m.at[:, 3].set(1.0), s.at[:, 3].set(1e-30)), ValueError, "not positive definite"),
    (lambda m, s: (m.at[5, 3].set(100.0), s), FloatingPointError, "overflows"),  # exp(100) > float32's max
    (lambda m, s: (m, s.at[5, 3].set(1e-40)), FloatingPointError, "gradient in S"),  # 1/S overflows
])
def test_each_check_of_the_hand_gradient_is_reached_with_parameters_that_pass_the_input_checks(data, change, error,
                                                                                              match):
    params = change(*pln.start(data))
    pln.check_params(params, data)  # finite, no zero in S, right shapes: only the result can be wrong
    with pytest.raises(error, match=match):
        F.value_and_grad_by_hand(params, data)
    value, _ = jax.jit(F.value_and_grad_by_hand)(params, data)  # inside jit: no error, a non-finite value
    assert not np.isfinite(float(value))


def test_check_fit_names_the_first_bad_iteration():
    elbos = jnp.array([-3.0, -2.0, jnp.nan, jnp.nan, jnp.nan])
    with pytest.raises(FloatingPointError, match="iteration 2 "):
        pln.check_fit(elbos, pln.criterion_start()._replace(count=jnp.int32(4)))
    pln.check_fit(elbos, pln.criterion_start()._replace(count=jnp.int32(2)))  # NaNs past the end are not iterations


@pytest.mark.parametrize("kw, error, match", [(dict(step_sizes=(1e-30, 50.0)), ValueError, "packed"),
                                              (dict(step_sizes=(1e-6, 1e12)), ValueError, "packed"),
                                              (dict(etas=(1.5, 1.2)), ValueError, "etas")])
def test_packed_rprop_bad_settings(kw, error, match):
    with pytest.raises(error, match=match):
        F.rprop_packed(0.01, **kw)


def test_packed_rprop_refuses_parameters_it_cannot_pack():
    with pytest.raises(TypeError, match="float32 or float64"):
        F.rprop_packed().init(jnp.ones(3, jnp.float16))


@pytest.mark.pinned  # pyPLNmodels needs torch
def test_race_takes_the_data(tmp_path):
    oaks = pln.load_oaks_counts()
    small = pln.check_pln_data(oaks.counts[:40, :30], oaks.offsets[:40, :30])
    out = bench_pln.race(small, repeats=2, fresh_process=False)
    assert (out["n"], out["p"], out["fit"], out["repeats"]) == (40, 30, "fast", 2)
    assert len(out["runs"]["jax_seconds"]) == 2 and all(v > 0 for v in out["runs"]["pyplnmodels_seconds"])
    q1, q3 = out["spread"]["speedup_converge_compile_excluded"]
    assert q1 <= q3
    assert set(out["threads_tried"]) == {f"PyTorch {n} thread{'s' if n > 1 else ''}" for n in timing.thread_settings()}
    assert out["threads"]["pyPLNmodels"] in out["threads_tried"] and out["threads"]["JAX"].startswith("XLA")
    r = out["ratios"]["converge_compile_excluded"]  # a number, or "not measured" with the witness's reason
    assert (r.value is None) == bool(r.why) and r.slow == "pyPLNmodels"
    # the same rule stops both fits after the same number of iterations, up to a criterion at rounding of tol
    assert abs(out["jax_iterations"] - out["pyplnmodels_iterations"]) <= 1
    with pytest.raises(TypeError, match="NumPy"):
        bench_pln.race(pln.to_jax(small), repeats=1, fresh_process=False)
    with pytest.raises(ValueError, match="fit must be one of"):
        bench_pln.race(small, fit="slow", repeats=1, fresh_process=False)


FIRST_FIT_IMPORTS = """
import sys, fastjax
from fastjax import pln
from fastjax.pln import bench
bench.fit_pyplnmodels(pln.load_oaks_counts(), maxiter=1)  # imports pyPLNmodels and torch first
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.pinned  # pyPLNmodels needs torch
def test_first_fit_imports_torch_dynamo_which_preimport_times_apart():
    """The first fit's one-time cost is torch's lazy import of torch._dynamo (its optimizer's constructor):
    a fresh process has not imported it before its first fit and has after; --preimport times it apart."""
    import subprocess
    import sys

    before = subprocess.run([sys.executable, "-c", "import sys, fastjax, torch, pyPLNmodels; print('torch._dynamo' in sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.split()[-1]
    after = subprocess.run([sys.executable, "-c", FIRST_FIT_IMPORTS], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert (before, after) == ("False", "True")
    out = bench_pln.first_fit_here(1, preimport=True)  # what first_fits runs in each fresh process
    assert set(out) == {"import_torch_dynamo_seconds", "first_fit_seconds", "second_fit_seconds"}
