"""Part I's practice self-checks (fastjax.exercises.pln): for each exercise a right fit passes and does
not compile again, a plausible mistake is named, and a slow fit (the starting program when it is 10x
slower or more, else one that compiles at every call) is called slow. Wrong answers reuse compiled
pieces where they can, so that the file stays short."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fastjax  # noqa: F401
from fastjax import exercises as ex, pln
from fastjax.exercises import pln_code as code
from fastjax.exercises.pln import N_ITER, small_data, same_fit
from fastjax.pln import rungs as R

COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: COMPILES.append(event) if event == ex.COMPILE_EVENT else None)


def assert_right_and_compiled_once(name, fit):
    """``fit`` passes the check (result only), and a second run of it compiles nothing."""
    exercise = ex.get(name)
    report = ex.check(name, fit, time_it=False)
    assert report.right, report.text()
    before = len(COMPILES)
    jax.block_until_ready(exercise.run(fit, exercise.arguments()))
    assert len(COMPILES) == before, f"{fit.__name__} compiled again on its second run"


def assert_wrong(name, fit, words):
    report = ex.check(name, fit, time_it=False)
    assert not report.right and words in report.problem, report.text()
    assert "Traceback" not in report.text() and report.hint


def assert_slow(name, fit, retraces):
    report = ex.check(name, fit, repeats=1)
    assert report.right and report.slow and not report.passed, report.text()
    assert report.retraces == retraces, report.text()
    return report


def retracing(fit):
    """``fit`` followed by a small helper jitted anew at every call (a lambda made in the fit): right, and
    it compiles at every call, which the check counts. Cheaper to compile than a retracing PLN step."""
    def fit_with_a_helper_jitted_inside(*args):
        params, elbos = fit(*args)
        return params, jax.jit(lambda e: e * 1.0)(elbos)
    return fit_with_a_helper_jitted_inside


# ---------------------------------------------------------------- pln-1

def fit_state_not_carried(data, n_iter):  # a plausible mistake: the optimizer state of the start, every step
    params = pln.start(data)
    opt_state = code.tx_once.init(params)
    elbos = []
    for _ in range(n_iter):
        value, grads = R.grad_fn(params, data)
        updates, _ = code.update_once(grads, opt_state, params)
        params = R.apply_fn(params, updates)
        elbos.append(-value)
    return params, jnp.stack(elbos)


def test_pln_1():
    assert_right_and_compiled_once("pln-1", code.fit_update_jitted_once)
    assert_wrong("pln-1", fit_state_not_carried, "differ from the reference's")
    report = assert_slow("pln-1", code.fit_new_optimizer_each_time, retraces=True)  # compiles the update every fit
    assert "jax.jit caches by function" in report.text()


# ---------------------------------------------------------------- pln-2

def fit_scan_wrong_start(data, n_iter):  # S started at 1 instead of pyPLNmodels' 1/2 (the same compiled scan)
    m, s = pln.start(data)
    return R.scan_fit_jit((m, jnp.ones_like(s)), data, n_iter=n_iter)


def test_pln_2():
    assert_right_and_compiled_once("pln-2", code.fit_scan)
    assert_wrong("pln-2", fit_scan_wrong_start, "differ from the reference's")
    # the starting program is 2-7x slower here, too close to judge under load; a retracing fit is slow for sure
    assert_slow("pln-2", retracing(code.fit_scan), retraces=True)


# ---------------------------------------------------------------- pln-3

def fit_namedtuple_first_state_kept(data, n_iter):  # rebuilds the state by hand and keeps the first optimizer state
    m, s = pln.start(data)
    first = R.PlnState(m, s, pln.optimizer().init((m, s)))
    state, elbos = first, []
    for _ in range(n_iter):
        new, elbo = code.namedtuple_step(state, data)
        state = R.PlnState(new.m, new.s, first.opt_state)
        elbos.append(elbo)
    return (state.m, state.s), jnp.stack(elbos)


@jax.tree_util.register_pytree_node_class
class LeanState(code.FitState):
    """A right answer written another way (chapters/pln/05's): the class kept, rebuilt without ``__init__``."""

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        state = object.__new__(cls)
        state.m, state.s, state.opt_state = leaves
        return state


@jax.jit
def lean_step(state, data):
    value, grads = jax.value_and_grad(pln.loss)((state.m, state.s), data)
    updates, opt_state = pln.optimizer().update(grads, state.opt_state, (state.m, state.s))
    m, s = optax.apply_updates((state.m, state.s), updates)
    return LeanState.tree_unflatten(None, (m, s, opt_state)), -value


def fit_with_lean_class(data, n_iter):
    m, s = pln.start(data)
    state, elbos = LeanState(m, s, pln.optimizer().init((m, s))), []
    for _ in range(n_iter):
        state, elbo = lean_step(state, data)
        elbos.append(elbo)
    return (state.m, state.s), jnp.stack(elbos)


def test_pln_3():
    assert_right_and_compiled_once("pln-3", code.fit_with_namedtuple)
    assert_wrong("pln-3", fit_namedtuple_first_state_kept, "differ from the reference's")
    assert_slow("pln-3", retracing(code.fit_with_namedtuple), retraces=True)
    # the starting program: __init__ runs after every step, its operations dispatched inside the step's call
    report = assert_slow("pln-3", code.fit_with_class, retraces=False)
    assert report.structural_misses == ["programs"], report.text()
    lean = ex.check("pln-3", fit_with_lean_class, repeats=1)
    assert lean.passed and not lean.structural_misses, lean.text()


# ---------------------------------------------------------------- pln-4

def fit_until_last_elbo_lost(data):  # appends each ELBO after the test: the last one is lost
    params = pln.start(data)
    opt_state = R.tx.init(params)
    crit = pln.criterion_start(params[0].dtype)
    elbos = []
    for _ in range(pln.MAXITER):
        value, grads = R.grad_fn(params, data)
        updates, opt_state = R.update_fn(grads, opt_state, params)
        params = R.apply_fn(params, updates)
        crit = pln.criterion_update(crit, -value)
        if abs(float(crit.value)) < code.TOL_PRACTICE:
            break
        elbos.append(-value)
    return params, jnp.stack(elbos)


def test_pln_4():
    assert_right_and_compiled_once("pln-4", code.fit_until_in_program)
    assert_wrong("pln-4", fit_until_last_elbo_lost, "ELBOs, the reference")
    report = assert_slow("pln-4", code.fit_until_host_check, retraces=False)  # 10x slower or more: 12-30x in our runs
    # and whatever the clock says: the criterion read by Python at every iteration, counted
    assert "host reads" in report.structural_misses and report.host_reads > 100, report.text()


def test_answers_of_the_wrong_form_get_one_line():
    report = ex.check("pln-1", lambda data, n_iter: np.zeros(n_iter), time_it=False)
    assert not report.right and "must return ((M, S), ELBOs)" in report.problem
    report = ex.check("pln-2", lambda data: None, time_it=False)  # forgot n_iter
    assert not report.right and report.problem.startswith("Your answer raised TypeError")


def test_same_fit_tolerances_catch_a_shift_of_one_iteration():
    (params, elbos) = code.fit_update_jitted_once(small_data(), N_ITER)
    same_fit((params, elbos), (params, elbos))
    with pytest.raises(AssertionError, match="ELBO trajectory"):  # the ELBO after each update, not before
        same_fit((params, jnp.concatenate([elbos[1:], elbos[-1:]])), (params, elbos))


def test_a_copy_of_the_starting_program_is_raced_once(tmp_path, monkeypatch):
    # what a page's check cell hands the check: the page's own copy of the starting program (the same
    # name and source as the exported one, another object)
    import importlib
    import inspect

    (tmp_path / "page_copy.py").write_text("from fastjax.exercises.pln_code import *  # noqa: F403\n\n\n"
                                           + inspect.getsource(code.fit_update_jitted_once))
    monkeypatch.syspath_prepend(str(tmp_path))
    copy = importlib.import_module("page_copy").fit_update_jitted_once
    assert copy is not code.fit_update_jitted_once
    report = ex.check("pln-2", copy, repeats=1)  # pln-2 starts from fit_update_jitted_once
    assert report.right and report.start_seconds == report.seconds, report.text()
    assert "start" not in report.timings  # raced once, as the answer


# ---------------------------------------------------------------- right answers written other ways (issue 38)

TX = pln.optimizer()  # made once


@jax.jit
def _whole_step(params, opt_state, data):  # gradient and update in one jitted step, the optimizer made once
    value, grads = jax.value_and_grad(pln.loss)(params, data)
    updates, opt_state = TX.update(grads, opt_state, params)
    return R.apply_fn(params, updates), opt_state, -value


def fit_whole_step_jitted(data, n_iter):
    params = pln.start(data)
    opt_state = TX.init(params)
    elbos = []
    for _ in range(n_iter):
        params, opt_state, elbo = _whole_step(params, opt_state, data)
        elbos.append(elbo)
    return params, jnp.stack(elbos)


def fit_update_not_jitted(data, n_iter):  # the optimizer made once, but tx.update runs op by op
    params = pln.start(data)
    opt_state = TX.init(params)
    elbos = []
    for _ in range(n_iter):
        value, grads = R.grad_fn(params, data)
        updates, opt_state = TX.update(grads, opt_state, params)
        params = R.apply_fn(params, updates)
        elbos.append(-value)
    return params, jnp.stack(elbos)


def test_pln_1_a_whole_jitted_step_passes_on_its_compilations():
    report = ex.check("pln-1", fit_whole_step_jitted, repeats=1)
    assert report.right and report.compiles == 0 and not report.structural_misses, report.text()


def test_pln_1_the_hint_tells_an_optimizer_made_per_call_from_an_update_left_unjitted():
    report = ex.check("pln-1", code.fit_new_optimizer_each_time, repeats=1)
    assert report.structural_misses == ["compiles"] and "(jit(update_fn))" in report.text()
    assert "makes its optimizer" in report.text() and "runs op by op" not in report.text()
    report = ex.check("pln-1", fit_update_not_jitted, repeats=1)
    assert report.right and report.compiles == 0, report.text()  # made once: nothing compiles again
    # its update runs op by op: one program per operation, counted; the hint names what is left
    assert report.slow and report.structural_misses == ["programs"], report.text()
    assert "runs op by op" in report.text() and "makes its optimizer" not in report.text()


@jax.jit
def _fori_fit(params, data):  # pln-2 written another way: fori_loop writing the ELBOs into a buffer
    def body(i, state):
        params, opt_state, elbos = state
        value, grads = jax.value_and_grad(pln.loss)(params, data)
        updates, opt_state = TX.update(grads, opt_state, params)
        return R.apply_fn(params, updates), opt_state, elbos.at[i].set(-value)
    buffer = jnp.zeros(N_ITER, params[0].dtype)
    params, _, elbos = jax.lax.fori_loop(0, N_ITER, body, (params, TX.init(params), buffer))
    return params, elbos


def test_pln_2_a_fori_loop_is_right_and_compiles_once():
    assert_right_and_compiled_once("pln-2", lambda data, n_iter: _fori_fit(pln.start(data), data))
