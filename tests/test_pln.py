"""Unit tests of fastjax.pln: data checks, the ELBO, closed forms, agreement with pyPLNmodels."""

from __future__ import annotations


import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import bench as bench_pln


@pytest.fixture(scope="module")
def oaks() -> pln.PlnData:
    return pln.load_oaks_counts()


def small():
    rng = np.random.default_rng(0)
    y = rng.poisson(3.0, size=(20, 4)).astype(float)
    return y, np.zeros_like(y), np.column_stack([np.ones(20), rng.normal(size=20)])


# ----------------------------------------------------------------------------- data

def test_oaks_shapes_and_log_offsets(oaks):
    n, p, d = oaks.shape
    assert (n, p, d) == (116, 114, 1)
    # offsets are log read totals (a few to about 10), not raw totals in the thousands
    assert 0 < oaks.offsets.min() and oaks.offsets.max() < 15


def test_oaks_matches_pyplnmodels(oaks):
    pytest.importorskip("torch", reason="pyPLNmodels needs torch, which the newest leg does not install")
    from pyPLNmodels import load_oaks

    ref = load_oaks()
    np.testing.assert_array_equal(oaks.counts, ref["endog"].to_numpy())
    np.testing.assert_allclose(oaks.offsets, ref["offsets"].to_numpy(), rtol=1e-12)


def test_repeat_stacks_rows(oaks):
    big = pln.load_oaks_counts(repeat=3)
    assert big.counts.shape == (348, 114)
    np.testing.assert_array_equal(big.counts[116:232], oaks.counts)
    assert big.log_factorial == pytest.approx(3 * oaks.log_factorial)


@pytest.mark.parametrize("repeat", [0, -1, 1.5])
def test_bad_repeat(repeat):
    with pytest.raises((ValueError, TypeError), match="repeat"):
        pln.load_oaks_counts(repeat)


def test_defaults_intercept_and_zero_offsets():
    y, _, _ = small()
    data = pln.check_pln_data(y)
    np.testing.assert_array_equal(data.covariates, np.ones((20, 1)))
    np.testing.assert_array_equal(data.offsets, np.zeros((20, 4)))


def test_one_dimensional_covariate_is_a_column():
    y, o, x = small()
    assert pln.check_pln_data(y, o, x[:, 1]).covariates.shape == (20, 1)


# ----------------------------------------------------------------------------- bad inputs, one each

def test_counts_wrong_shape():
    with pytest.raises(ValueError, match="counts must be 2-dimensional"):
        pln.check_pln_data(np.ones(5))


def test_counts_negative():
    y, o, x = small()
    y[3, 2] = -3
    with pytest.raises(ValueError, match=r"non-negative integers; found -3.0 at row 3, column 2"):
        pln.check_pln_data(y, o, x)


def test_counts_not_integer():
    y, o, x = small()
    y[1, 1] = 2.5
    with pytest.raises(ValueError, match="non-negative integers; found 2.5"):
        pln.check_pln_data(y, o, x)


def test_counts_nan():
    y, o, x = small()
    y[0, 0] = np.nan
    with pytest.raises(ValueError, match="counts must be finite"):
        pln.check_pln_data(y, o, x)


def test_counts_inf():
    y, o, x = small()
    y[0, 1] = np.inf
    with pytest.raises(ValueError, match="counts must be finite"):
        pln.check_pln_data(y, o, x)


def test_counts_not_numbers():
    with pytest.raises(TypeError, match="counts must hold numbers"):
        pln.check_pln_data(np.array([["a", "b"], ["c", "d"]]))


def test_offsets_not_matching_counts():
    y, o, x = small()
    with pytest.raises(ValueError, match="offsets must have the shape of counts"):
        pln.check_pln_data(y, o[:, :3], x)


def test_offsets_nan():
    y, o, x = small()
    o[2, 2] = np.nan
    with pytest.raises(ValueError, match="offsets must be finite"):
        pln.check_pln_data(y, o, x)


def test_covariates_wrong_rows():
    y, o, x = small()
    with pytest.raises(ValueError, match="one row per sample"):
        pln.check_pln_data(y, o, x[:10])


def test_covariates_rank_deficient():
    y, o, x = small()
    with pytest.raises(ValueError, match="full column rank"):
        pln.check_pln_data(y, o, np.column_stack([x, 2 * x[:, 1]]))


def test_covariates_inf():
    y, o, x = small()
    x[4, 1] = np.inf
    with pytest.raises(ValueError, match="covariates must be finite"):
        pln.check_pln_data(y, o, x)


# ----------------------------------------------------------------------------- maths

def test_log_stirling_close_to_lgamma():
    from scipy.special import gammaln

    y = np.arange(1, 200, dtype=float)
    np.testing.assert_allclose(pln.log_stirling(y), gammaln(y + 1), rtol=2e-2, atol=0.1)
    assert pln.log_stirling(np.array([0.0])) == pytest.approx(pln.log_stirling(np.array([1.0])))


def test_full_elbo_equals_profiled_at_closed_forms():
    y, o, x = small()
    data = pln.check_pln_data(y, o, x)
    rng = np.random.default_rng(1)
    m, s = rng.normal(size=y.shape), rng.uniform(0.3, 1.0, size=y.shape)
    b = pln.closed_form_coef(data.covariates, m, np)
    sig = pln.closed_form_covariance(data.covariates, m, s, np)
    assert pln.elbo(m, s, b, sig, data, np) == pytest.approx(pln.profiled_elbo(m, s, data, np), rel=1e-12)
    # any other B or Σ gives a lower ELBO (closed forms maximise it)
    assert pln.elbo(m, s, b + 0.1, sig, data, np) < pln.profiled_elbo(m, s, data, np)
    assert pln.elbo(m, s, b, 1.2 * sig, data, np) < pln.profiled_elbo(m, s, data, np)


def test_poisson_part_is_the_elbo_less_its_log_determinant():
    y, o, x = small()
    data = pln.check_pln_data(y, o, x)
    rng = np.random.default_rng(2)
    m, s = rng.normal(size=y.shape), rng.uniform(0.3, 1.0, size=y.shape)
    om = data.offsets + m
    by_hand = np.sum(data.counts * om - np.exp(om + 0.5 * s * s) + np.log(s)) - data.log_factorial
    assert pln.poisson_part(m, s, data, np) == pytest.approx(by_hand, rel=1e-12)
    logdet = np.linalg.slogdet(pln.closed_form_covariance(data.covariates, m, s, np))[1]
    assert pln.profiled_elbo(m, s, data, np) == pytest.approx(-0.5 * len(m) * logdet + by_hand, rel=1e-12)
    # JAX (the default namespace) gives the same sum; over a split of the samples the parts add up
    with jax.enable_x64(True):
        d64 = pln.to_jax(data, jnp.float64)
        assert float(pln.poisson_part(jnp.asarray(m), jnp.asarray(s), d64)) == pytest.approx(by_hand, rel=1e-12)
    half = [pln.PlnData(data.counts[i], data.offsets[i], data.covariates[i], pln.log_stirling(data.counts[i]).sum())
            for i in (slice(0, 10), slice(10, None))]
    parts = sum(pln.poisson_part(m[i], s[i], h, np) for i, h in zip((slice(0, 10), slice(10, None)), half))
    assert parts == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.isa
def test_jax_float32_jit_and_float64_agree(oaks):
    m, s = pln.init_latent(oaks.counts, np)
    m = m + 0.1
    ref = pln.profiled_elbo(m, s, oaks, np)
    d32 = pln.to_jax(oaks)
    args = (jnp.asarray(m, jnp.float32), jnp.asarray(s, jnp.float32), d32)
    eager = float(pln.profiled_elbo(*args))
    jitted = float(jax.jit(pln.profiled_elbo)(*args))
    assert eager == pytest.approx(ref, rel=1e-5)
    assert jitted == pytest.approx(ref, rel=1e-5)
    with jax.enable_x64(True):
        d64 = pln.to_jax(oaks, jnp.float64)
        v = jax.jit(pln.profiled_elbo)(jnp.asarray(m), jnp.asarray(s), d64)
        assert float(v) == pytest.approx(ref, rel=1e-12)


def test_jax_gradient_matches_finite_difference():
    y, o, x = small()
    data = pln.check_pln_data(y, o, x)
    m, s = pln.init_latent(data.counts, np)
    with jax.enable_x64(True):
        d64 = pln.to_jax(data, jnp.float64)
        g = jax.grad(pln.profiled_elbo)(jnp.asarray(m), jnp.asarray(s), d64)
    h = 1e-6
    mp = m.copy(); mp[2, 1] += h
    mm = m.copy(); mm[2, 1] -= h
    fd = (pln.profiled_elbo(mp, s, data, np) - pln.profiled_elbo(mm, s, data, np)) / (2 * h)
    assert float(g[2, 1]) == pytest.approx(fd, rel=1e-6)


# ----------------------------------------------------------------------------- pyPLNmodels

@pytest.mark.xdist_group("pyplnmodels")
def test_elbo_matches_pyplnmodels(oaks, pyplnmodels_fit):
    pyplnmodels_fit = pyplnmodels_fit[0]
    m = pyplnmodels_fit._latent_mean.detach().numpy().astype(np.float64)
    s = pyplnmodels_fit._latent_sqrt_variance.detach().numpy().astype(np.float64)
    ours = pln.profiled_elbo(m, s, oaks, np)
    # pyPLNmodels' formula in float64 against ours: any order of the n·p terms is within n·p·u64 of their
    # magnitudes (elbo_condition times the ELBO), both sides rounded, times 10
    rtol = 10 * 2 * oaks.counts.size * np.finfo(np.float64).eps / 2 * pln.elbo_condition(m, s, oaks)
    assert rtol < 1e-6  # far below what a formula with a term wrong or left out gives (measured 3.7e-15)
    assert ours == pytest.approx(bench_pln.pyplnmodels_elbo64(pyplnmodels_fit, oaks), rel=rtol)
    # its float32 ELBO (what .elbo reports) is the same number to float32 rounding in a sum whose terms
    # cancel elbo_condition-fold: log2(n·p) levels of a cascade sum (torch's CPU sum, aten/src/ATen/native/cpu/
    # SumKernel.cpp) each off by u32, and a few
    # roundings per term (exp, log, products): (log2(n·p) + 8)·u32·elbo_condition (measured 3.1e-6)
    rtol32 = (np.log2(oaks.counts.size) + 8) * np.finfo(np.float32).eps / 2 * pln.elbo_condition(m, s, oaks)
    assert ours == pytest.approx(pyplnmodels_fit.elbo, rel=rtol32)
    assert ours == pytest.approx(pyplnmodels_fit.compute_elbo().item(), rel=rtol32)


@pytest.mark.xdist_group("pyplnmodels")
def test_closed_forms_match_pyplnmodels(oaks, pyplnmodels_fit):
    pyplnmodels_fit = pyplnmodels_fit[0]
    m = pyplnmodels_fit._latent_mean.detach().numpy().astype(np.float64)
    s = pyplnmodels_fit._latent_sqrt_variance.detach().numpy().astype(np.float64)
    np.testing.assert_allclose(pln.closed_form_coef(oaks.covariates, m, np), pyplnmodels_fit.coef.numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pln.closed_form_covariance(oaks.covariates, m, s, np),
                               pyplnmodels_fit.covariance.numpy(), rtol=1e-4, atol=1e-5)


def test_init_matches_pyplnmodels(oaks):
    m, s = pln.init_latent(oaks.counts, np)
    np.testing.assert_array_equal(m[oaks.counts == 0], 0.0)
    np.testing.assert_allclose(m, np.log(np.maximum(oaks.counts, 1)))
    np.testing.assert_array_equal(s, 0.5)


def test_relative_gap():
    assert pln.relative_gap(-101.0, -100.0) == pytest.approx(0.01)
    assert pln.relative_gap(-99.0, -100.0) == pytest.approx(-0.01)


def test_zero_count_column_is_removed_with_a_warning():
    y, o, x = small()
    y[:, 2] = 0
    with pytest.warns(UserWarning, match=r"removed 1 column\(s\) holding only zeros: \[2\]"):
        data = pln.check_pln_data(y, o, x)
    assert data.counts.shape == (20, 3) and data.offsets.shape == (20, 3)
    np.testing.assert_array_equal(data.counts, np.delete(y, 2, axis=1))


def test_all_counts_zero():
    with pytest.raises(ValueError, match="all are zero"):
        pln.check_pln_data(np.zeros((5, 3)))


def test_optimizer_is_pyplnmodels_rprop():
    import jax.numpy as jnp

    tx = pln.optimizer()
    state = tx.init(jnp.zeros(2))
    np.testing.assert_allclose(state.step_sizes, pln.LR)
    updates, _ = tx.update(jnp.array([3.0, -1.0]), state)
    np.testing.assert_allclose(updates, [-pln.LR, pln.LR])
