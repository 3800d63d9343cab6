"""Unit tests of fastjax.pln_ladder: every rung gives the same ELBO trajectory; the measures run."""

from __future__ import annotations

import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import pln
from fastjax import pln_ladder as L
from fastjax.timing import Timing

N_ITER = 30


@pytest.fixture(scope="module")
def data():
    return pln.to_jax(pln.load_oaks_counts())


@pytest.fixture(scope="module")
def reference(data):
    return L.fit_scan(data, N_ITER)


@pytest.mark.parametrize("fit", [L.fit_jit, L.fit_namedtuple, L.fit_pytree], ids=lambda f: f.__name__)
def test_jitted_rungs_give_the_scan_trajectory(data, reference, fit):
    m, s, elbos = fit(data, N_ITER)
    assert elbos.shape == (N_ITER,)
    np.testing.assert_allclose(elbos, reference[2], rtol=1e-6)
    np.testing.assert_allclose(m, reference[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, reference[1], rtol=1e-5, atol=1e-5)


def test_nnx_paths_give_the_scan_trajectory(data, reference):
    for how in L.nnx_steppers(data):
        _, _, elbos = L.fit_nnx(data, N_ITER, how)
        np.testing.assert_allclose(elbos, reference[2], rtol=1e-6, err_msg=how)


def test_eager_agrees_with_jit_in_float32(data, reference):
    # early iterations: before Rprop's sign test has amplified any rounding difference
    _, _, elbos = L.fit_eager(data, 10)
    np.testing.assert_allclose(elbos, reference[2][:10], rtol=1e-6)


def test_eager_equals_jit_trajectory_in_float64():
    with jax.enable_x64(True):
        d64 = pln.to_jax(pln.load_oaks_counts(), jnp.float64)
        _, _, eager = L.fit_eager(d64, N_ITER)
        _, _, scan = L.fit_scan(d64, N_ITER)
    assert eager.dtype == np.float64
    np.testing.assert_allclose(eager, scan, rtol=1e-10)


def test_optax_rprop_first_update_is_zero(reference):
    elbos = reference[2]
    assert elbos[0] == elbos[1] and elbos[2] > elbos[1]


def test_elbo_increases_overall(reference):
    elbos = reference[2]
    assert elbos[-1] > elbos[0]


def test_pytree_unflatten_does_not_call_init(data, monkeypatch):
    model = L.PlnModel.create(data)
    leaves, treedef = jax.tree.flatten(model)
    calls = []
    monkeypatch.setattr(L.PlnModel, "__init__", lambda self, *a, **k: calls.append(1))
    back = jax.tree.unflatten(treedef, leaves)
    assert calls == [] and back.lr == model.lr
    np.testing.assert_array_equal(back.m, model.m)


def test_pytree_aux_data_is_hashable_and_has_no_arrays(data):
    _, aux = L.PlnModel.create(data).tree_flatten()
    hash(aux)
    assert not any(isinstance(a, (np.ndarray, jax.Array)) for a in jax.tree.leaves(aux))


def test_pytree_fit_traces_once(data):
    model = L.PlnModel.create(data)
    model.fit(data, n_iter=3)
    before = L.PlnModel.fit._cache_size()
    model2 = L.PlnModel.create(data)
    model2.fit(data, n_iter=3)
    assert L.PlnModel.fit._cache_size() == before


def test_first_reaching():
    assert L.first_reaching(np.array([-200.0, -100.2, -100.01]), -100.0) == 2
    assert L.first_reaching(np.array([-200.0]), -100.0) is None


def test_measure_ladder_structure():
    rng = np.random.default_rng(0)
    small = pln.to_jax(pln.check_pln_data(rng.poisson(2.0, size=(16, 3))))
    out = L.measure_ladder(small)
    assert set(out) == {"rungs", "floor", "extra"}
    names = [t.name for t in out["rungs"]]
    assert names[:4] == ["1 no-jit", "2 jit", "3 scan", "3 scan, not jitted"]
    assert any(n.startswith("6 ") for n in names)
    assert all(isinstance(t, Timing) and t.median > 0 for t in out["rungs"] + [out["floor"]])
    assert out["extra"]["n"] == 16 and out["extra"]["compile_seconds"] > 0


def test_race_reaches_pyplnmodels_optimum():
    out = L.race_pyplnmodels()
    assert out["jax_iters_to_target"] is not None
    target = out["target_elbo"]
    assert out["jax_elbo_at_target"] >= target - L.TARGET_GAP * abs(target)
    assert out["jax_elbo_after_same_iterations"] >= target - L.TARGET_GAP * abs(target)
    assert out["jax_compile_seconds"] > 0 and out["jax_seconds_to_target"] > 0
