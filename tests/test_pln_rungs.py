"""The PLN rungs exported from the chapters (fastjax.pln.rungs, rung 6 in fastjax.pln.rungs_nnx) all run pyPLNmodels' fit, iteration by iteration."""

from __future__ import annotations

import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import rungs as R
from fastjax.tools import timing

N_ITER = 30


@pytest.fixture(scope="module")
def data():
    return pln.to_jax(pln.load_oaks_counts())


@pytest.fixture(scope="module")
def reference(data):
    (m, s), elbos = R.scan_fit_jit(pln.start(data), data, n_iter=N_ITER)
    return m, s, np.asarray(elbos)


def _namedtuple(data):
    p0 = pln.start(data)
    state, elbos = R.namedtuple_fit(R.PlnState(*p0, pln.optimizer().init(p0)), data, n_iter=N_ITER)
    return state.m, state.s, elbos


def _pytree(data):
    model, elbos = R.PlnModel.create(data).fit(data, n_iter=N_ITER)
    return model.m, model.s, elbos


def _jit(data):
    model = R.JitPln(data)
    elbos = model.fit(N_ITER)
    return (*model.params, elbos)


def _while(data):
    (m, s), elbos, crit = R.fit_until_converged(pln.start(data), data, jnp.float32(pln.TOL), jnp.float32(jnp.inf),
                                                maxiter=N_ITER)
    assert int(crit.count) == N_ITER
    return m, s, np.asarray(elbos)


# 1e-6 on the ELBO (1e-5 on M, S): the same compiled step in each rung; measured 0 difference
@pytest.mark.isa
@pytest.mark.parametrize("fit", [_jit, _namedtuple, _pytree, _while], ids=lambda f: f.__name__.strip("_"))
def test_compiled_rungs_give_the_scan_trajectory(data, reference, fit):
    m, s, elbos = fit(data)
    np.testing.assert_allclose(np.asarray(elbos), reference[2], rtol=1e-6)
    np.testing.assert_allclose(m, reference[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s, reference[1], rtol=1e-5, atol=1e-5)


def test_nnx_paths_give_the_scan_trajectory(data, reference):
    from fastjax.pln import rungs_nnx

    steppers = rungs_nnx.nnx_steppers(data)
    assert {"nnx.jit", "jax.jit + split/merge"} <= set(steppers)
    for how, (step, params) in steppers.items():
        elbos = np.asarray(jnp.stack([step() for _ in range(N_ITER)]))
        np.testing.assert_allclose(elbos, reference[2], rtol=1e-6, err_msg=how)
        np.testing.assert_allclose(params()[0], reference[0], rtol=1e-5, atol=1e-5, err_msg=how)


@pytest.mark.isa
def test_eager_equals_scan_in_float64():
    with jax.enable_x64(True):
        d64 = pln.to_jax(pln.load_oaks_counts(), jnp.float64)
        eager = R.EagerPln(d64).fit(N_ITER)
        _, scan = R.scan_fit_jit(pln.start(d64), d64, n_iter=N_ITER)
    assert eager.dtype == np.float64
    np.testing.assert_allclose(eager, np.asarray(scan), rtol=1e-10)  # float64 rounding over 13,224 terms: ~1e-12


def test_first_update_moves(reference):
    elbos = reference[2]
    assert elbos[1] > elbos[0]  # torch's Rprop moves at once (optax.rprop 0.2.8 would not)


def test_while_loop_stops_by_the_criterion(data):
    _, elbos, crit = R.fit_until_converged(pln.start(data), data, jnp.float32(1e-4), jnp.float32(jnp.inf))
    k = int(crit.count)
    assert 1 < k < pln.MAXITER and abs(float(crit.value)) < 1e-4
    assert np.isnan(np.asarray(elbos)[k:]).all() and np.isfinite(np.asarray(elbos)[:k]).all()
    replay = pln.criterion_start(np.float32, np)
    values = []
    for e in np.asarray(elbos)[:k]:
        replay = pln.criterion_update(replay, e, np)
        values.append(abs(float(replay.value)))
    assert int(np.argmax(np.array(values) < 1e-4)) == k - 1  # the first update where the rule holds


def test_while_loop_stops_at_target(data, reference):
    target = jnp.float32(reference[2][9])
    _, elbos, crit = R.fit_until_converged(pln.start(data), data, jnp.float32(pln.TOL), target)
    assert int(crit.count) == 10


def test_pytree_unflatten_does_not_call_init(data, monkeypatch):
    model = R.PlnModel.create(data)
    leaves, treedef = jax.tree.flatten(model)
    calls = []
    monkeypatch.setattr(R.PlnModel, "__init__", lambda self, *a, **k: calls.append(1))
    back = jax.tree.unflatten(treedef, leaves)
    assert calls == [] and back.lr == model.lr
    np.testing.assert_array_equal(back.m, model.m)


def test_pytree_aux_data_is_hashable_and_has_no_arrays(data):
    _, aux = R.PlnModel.create(data).tree_flatten()
    hash(aux)
    assert not any(isinstance(a, (np.ndarray, jax.Array)) for a in jax.tree.leaves(aux))


def test_pytree_fit_traces_once(data, monkeypatch):
    # fit's body calls model.step once per trace (inside its scan), and never when jit reuses a trace
    counted = timing.count_traces(R.PlnModel.step)
    monkeypatch.setattr(R.PlnModel, "step", lambda self, d: counted(self, d))
    R.PlnModel.create(data).fit(data, n_iter=3)  # n_iter=3 with these shapes: nowhere else in the tests
    assert counted.count == 1
    R.PlnModel.create(data).fit(data, n_iter=3)  # a new model, the same shapes and static argument
    assert counted.count == 1


def test_only_a_new_update_closure_retraces_rung_2s_update():
    from fastjax.pln import bench as bench_pln

    assert bench_pln.closure_retraces(pln.to_jax(pln.load_oaks_counts()), n_objects=2) == {True: 2, False: 1}
