"""fastjax.pln.collection: padded PLN-PCA members, their criteria, and bootstrap samples (no torch needed)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import collection as col, rungs


def _toy(n: int = 12, p: int = 5, seed: int = 0) -> pln.PlnData:
    rng = np.random.default_rng(seed)
    return pln.check_pln_data(rng.poisson(3.0, size=(n, p)))


def _member(data: pln.PlnData, rank: int, seed: int) -> col.PcaParams:
    rng = np.random.default_rng(seed)
    n, p, d = data.shape
    return col.PcaParams(0.1 * rng.standard_normal((n, rank)), 0.5 + 0.1 * rng.random((n, rank)),
                         0.3 * rng.standard_normal((p, rank)), np.log(data.counts.mean(0, keepdims=True)))


def _elbo64(params, data, mask):
    with jax.enable_x64(True):
        return float(col.pca_elbo(jax.tree.map(jnp.asarray, params), pln.to_jax(data, jnp.float64), jnp.asarray(mask)))


def test_pca_elbo_matches_a_direct_numpy_formula():
    data, st = _toy(), _member(_toy(), 2, 1)
    m, s, c, b = st
    li = data.offsets + data.covariates @ b + m @ c.T
    direct = (np.sum(data.counts * li - np.exp(li + 0.5 * (s**2) @ (c**2).T)) + 0.5 * np.sum(np.log(s**2))
              - 0.5 * np.sum(m**2 + s**2) - data.log_factorial + 0.5 * data.counts.shape[0] * 2)
    # float64, one formula summed in two orders over 60 terms: u64·60·(condition ≲ 10) ≈ 1e-13
    assert col.pca_elbo(st, data, np.ones(2), np) == pytest.approx(direct, rel=1e-12)


def test_padding_leaves_the_elbo_and_gets_no_gradient():
    data = _toy()
    st = _member(data, 2, 2)
    padded, masks = col.pad([st, _member(data, 4, 3)])
    junk = padded._replace(m=padded.m.copy(), s=padded.s.copy(), components=padded.components.copy())
    junk.m[0, :, 2:], junk.s[0, :, 2:], junk.components[0, :, 2:] = 7.0, 3.0, -2.0  # junk in the padding
    one = jax.tree.map(lambda a: a[0], junk)
    # float64: the padded sums add exact zeros to the same terms, in another order: as above
    assert _elbo64(one, data, masks[0]) == pytest.approx(_elbo64(st, data, np.ones(2)), rel=1e-12)
    with jax.enable_x64(True):
        grads = jax.grad(col.pca_elbo)(jax.tree.map(jnp.asarray, one), pln.to_jax(data, jnp.float64),
                                       jnp.asarray(masks[0]))
    for g in grads[:3]:
        g = np.asarray(g)
        assert np.max(np.abs(g[:, 2:])) == 0.0
        assert np.max(np.abs(g[:, :2])) > 0.0


def test_a_wrong_mask_changes_the_elbo():
    """The check can fail: a mask that lets one padded column in gives another ELBO."""
    data = _toy()
    padded, masks = col.pad([_member(data, 2, 4)], q_max=3)
    padded.components[0, :, 2] = 1.0
    one = jax.tree.map(lambda a: a[0], padded)
    assert _elbo64(one, data, np.array([1.0, 1.0, 1.0])) != pytest.approx(_elbo64(one, data, masks[0]), rel=1e-6)


def test_vmapped_members_match_fits_alone_and_padding_does_not_move():
    data = _toy(n=10, p=4)
    starts = [_member(data, q, 10 + q) for q in (1, 2, 3)]
    padded, masks = col.pad(starts)
    fit_one = functools.partial(rungs.fit_until_converged, maxiter=30, loss=col.pca_loss)
    with jax.enable_x64(True):
        d64 = pln.to_jax(data, jnp.float64)
        tol, inf = jnp.float64(pln.TOL), jnp.float64(jnp.inf)
        params, elbos, crit = jax.jit(jax.vmap(fit_one, in_axes=(0, (None, 0), None, None)))(
            jax.tree.map(jnp.asarray, padded), (d64, jnp.asarray(masks)), tol, inf)
        for i, st in enumerate(starts):
            _, alone, crit1 = jax.jit(fit_one)(jax.tree.map(jnp.asarray, st), (d64, jnp.ones(i + 1)), tol, inf)
            assert int(crit.count[i]) == int(crit1.count)
            # float64, the same formula over ~40 terms in two programs, 30 Rprop steps: u64·40·10 ≈ 1e-13
            np.testing.assert_allclose(np.asarray(elbos[i]), np.asarray(alone), rtol=1e-10)
    got = jax.tree.map(np.asarray, params)
    for name in ("m", "s", "components"):
        np.testing.assert_array_equal(getattr(got, name)[0, :, 1:], getattr(padded, name)[0, :, 1:])


def test_criteria_follow_pyplnmodels_formulas():
    n, p, d = 12, 5, 1
    s = np.full((2, n, 3), 0.5)
    masks = np.stack([col.rank_mask(1, 3, np.float64), col.rank_mask(3, 3, np.float64)])
    out = col.criteria(np.array([-100.0, -90.0]), s, masks, p, d, np)
    k = np.array([p * (d + 1), p * (d + 3) - 3])
    np.testing.assert_array_equal(out["BIC"], np.array([100.0, 90.0]) + k / 2 * np.log(n))
    ent = np.array([col.entropy(s[i], masks[i], np) for i in range(2)])
    # float64, the same few terms added in another order
    np.testing.assert_allclose(out["BIC"] - out["ICL"], ent, rtol=1e-14)


def test_pad_and_mask_check_their_input():
    with pytest.raises(ValueError, match="at most q_max"):
        col.rank_mask(4, 3)
    with pytest.raises(ValueError, match="at least one member"):
        col.pad([])
    st = _member(_toy(), 2, 0)
    assert np.array_equal(col.unpad(col.pad([st], q_max=4)[0]._replace(
        **{f: getattr(col.pad([st], q_max=4)[0], f)[0] for f in ("m", "s", "components", "coef")}), 2).m, st.m)


def test_bootstrap_samples_are_rows_of_the_data():
    data = _toy(n=9)
    samples, rows = col.bootstrap_samples(data, 4, seed=3)
    assert samples.counts.shape == (4, 9, 5) and rows.shape == (4, 9)
    for b in range(4):
        np.testing.assert_array_equal(samples.counts[b], data.counts[rows[b]])
        assert samples.log_factorial[b] == pytest.approx(float(np.sum(pln.log_stirling(data.counts[rows[b]]))), rel=1e-12)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 9\)"):
        col.resample_rows(data, np.array([0, 9]))
    with pytest.raises(TypeError, match="1-D integer"):
        col.resample_rows(data, np.array([0.5]))


def test_percentile_interval():
    values = np.arange(101, dtype=float)[:, None]
    low, high = col.percentile_interval(values, 0.5)
    np.testing.assert_array_equal(np.concatenate([low, high]), [25.0, 75.0])
    with pytest.raises(ValueError, match="level"):
        col.percentile_interval(values, 1.5)
