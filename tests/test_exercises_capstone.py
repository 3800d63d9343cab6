"""The workshop capstone's self-check (fastjax.exercises.capstone): a right answer is right and does not
compile again, right answers written other ways are right too, plausible mistakes are named wrong with a
message, and the starting program is named slow by a counted retrace (not by a close timing)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastjax  # noqa: F401
from fastjax import exercises as ex
from fastjax.exercises import capstone, capstone_code as code

# one worker runs this file, so that each program compiles once for all its tests
pytestmark = pytest.mark.xdist_group("exercises-capstone")




def compiles_on_a_second_call(answer) -> int:
    """XLA compilations made by a second call of ``answer`` on fresh arguments (0 for a good answer)."""
    jax.block_until_ready(answer(*capstone.check_problem()))
    return ex.compiles_during(lambda: answer(*capstone.check_problem()))


def eager_fit(e_step, m_step):
    """A fit that calls ``e_step`` and ``m_step`` eagerly in a Python loop (no compile of its own)."""
    def fit(x, weights, means, covs, iterations):
        params, trajectory = (weights, means, covs), []
        for _ in range(iterations):
            resp, log_total = e_step(x, *params)
            trajectory.append(jnp.mean(log_total))
            params = m_step(x, resp)
        return (*params, jnp.stack(trajectory))
    return fit


def e_step_over_the_samples(x, weights, means, covs):
    """The mistake of a first vectorisation: responsibilities normalised over axis 0, the samples."""
    precisions, logdets = jnp.linalg.inv(covs), jnp.linalg.slogdet(covs)[1]
    diff = x[:, None, :] - means[None]
    log_p = jnp.log(weights) - 0.5 * (x.shape[1] * math.log(2 * math.pi) + logdets
                                      + jnp.einsum("nki,kij,nkj->nk", diff, precisions, diff))
    return jax.nn.softmax(log_p, axis=0), jax.scipy.special.logsumexp(log_p, axis=1)


def m_step_without_reg(x, resp):
    """The M step with ε left out of the covariances."""
    weights, means, covs = code.m_step(x, resp)
    return weights, means, covs - code.REG * jnp.eye(x.shape[1])


@functools.partial(jax.jit, static_argnames="iterations")
def fit_another_way(x, weights, means, covs, iterations):
    """A right answer written differently from the reference: Cholesky factors instead of inverses, one
    sample's log-densities vmapped over the samples, a fori_loop filling a trajectory made up front."""
    d, k = x.shape[1], weights.shape[0]

    def step(i, carry):
        w, m, c, trajectory = carry
        chol = jnp.linalg.cholesky(c)
        logdets = 2 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=1, axis2=2)), axis=1)

        def log_p_one(x_i):
            z = jax.scipy.linalg.solve_triangular(chol, (x_i - m)[..., None], lower=True)[..., 0]
            return jnp.log(w) - 0.5 * (d * math.log(2 * math.pi) + logdets + jnp.sum(z * z, axis=1))

        log_p = jax.vmap(log_p_one)(x)
        log_total = jax.scipy.special.logsumexp(log_p, axis=1)
        resp = jnp.exp(log_p - log_total[:, None])
        nk = resp.sum(axis=0)
        m = resp.T @ x / nk[:, None]
        c = jnp.stack([(resp[:, j, None] * (x - m[j])).T @ (x - m[j]) / nk[j] for j in range(k)])
        return nk / x.shape[0], m, c + code.REG * jnp.eye(d), trajectory.at[i].set(jnp.mean(log_total))

    return jax.lax.fori_loop(0, iterations, step, (weights, means, covs, jnp.zeros(iterations, x.dtype)))


def test_the_capstone_is_registered_with_its_page(root):
    exercise = ex.get("capstone")
    assert exercise.page == capstone.PAGE and f"file: {capstone.PAGE}\n" in (root / "_toc.yml").read_text()
    assert exercise.start is code.fit_slow and exercise.reference is code.fit_fast
    assert exercise.part == "Workshop" and exercise.minutes > 0
    x, weights, means, covs, iterations = capstone.check_problem()
    assert x.shape == (capstone.CHECK_ROWS, 13) and covs.shape == (3, 13, 13) and iterations == capstone.CHECK_ITERATIONS


def test_the_reference_is_right_and_compiles_once():
    report = ex.check("capstone", code.fit_fast, time_it=False)
    assert report.right and not report.problem, report.text()
    assert compiles_on_a_second_call(code.fit_fast) == 0


def test_a_right_answer_written_another_way_is_right_and_compiles_once():
    report = ex.check("capstone", fit_another_way, time_it=False)
    assert report.right, report.text()
    assert compiles_on_a_second_call(fit_another_way) == 0
    # its float32 rounding differs from the reference's, and stays far inside the tolerance
    gap = capstone.fit_gap(fit_another_way(*capstone.check_problem()), code.fit_fast(*capstone.check_problem()))
    assert 0 < gap < capstone.TOLERANCE / 10


@pytest.mark.parametrize("mistake, what", [
    (eager_fit(e_step_over_the_samples, code.m_step), "the trajectory"),
    (eager_fit(code.e_step, m_step_without_reg), "the trajectory"),
])
def test_plausible_mistakes_are_named_wrong(mistake, what):
    report = ex.check("capstone", mistake, time_it=False)
    assert not report.right and not report.passed and report.seconds is None
    assert what in report.problem and "differ from the reference's" in report.problem
    assert "responsibilities sum to one over the components" in report.text()  # the hint for a wrong fit


def test_the_mistakes_move_the_fit_far_past_the_tolerance():
    # what the tolerance must catch: ε left out moves the fit by about 1e-3 / (1 + |Σ_ii|); the wrong axis
    # by far more (the margins the comment of capstone.TOLERANCE states)
    want = code.fit_fast(*capstone.check_problem())
    no_reg = capstone.fit_gap(eager_fit(code.e_step, m_step_without_reg)(*capstone.check_problem()), want)
    wrong_axis = capstone.fit_gap(eager_fit(e_step_over_the_samples, code.m_step)(*capstone.check_problem()), want)
    assert no_reg > 10 * capstone.TOLERANCE and wrong_axis > 1


def test_answers_of_the_wrong_form_get_a_message_not_a_traceback():
    three = ex.check("capstone", lambda *args: code.fit_fast(*args)[:3], time_it=False)
    assert not three.right and "must be four arrays" in three.problem

    def broken(x, weights, means, covs, iterations):
        return x @ means  # (n, 13) @ (3, 13): the shapes do not fit

    raised = ex.check("capstone", broken, time_it=False)
    assert not raised.right and raised.problem.startswith("Your answer raised TypeError")
    assert "Traceback" not in raised.text()


def test_the_starting_program_is_right_and_named_slow_by_its_retrace():
    # one round: the verdict rests on the compilations counted while it is timed, not on the timing
    report = ex.check("capstone", code.fit_slow, repeats=1)
    assert report.right and report.retraces and report.slow and not report.passed, report.text()
    assert report.compiles >= 1 and "compiled" in report.text() and "lax.scan" in report.text()
    # both counted on one call, whatever the clock says: the retrace and the float() per sample
    assert report.structural_misses == ["compiles", "host reads", "programs"] and report.host_reads > 100, report.text()


def test_the_reference_is_the_float64_fit_up_to_float32_rounding():
    # scikit-learn is the float64 truth on the page; here the reference's own program in float64 is
    x, weights, means, covs, iterations = capstone.check_problem()
    with jax.enable_x64(True):
        exact = code.fit_fast.__wrapped__(*(jnp.asarray(np.asarray(a), jnp.float64) for a in (x, weights, means, covs)),
                                          iterations)
        exact = tuple(np.asarray(a) for a in exact)
    assert capstone.fit_gap(code.fit_fast(x, weights, means, covs, iterations), exact) < capstone.TOLERANCE / 10


def test_fit_gap_and_same_fit_say_what_is_wrong():
    fit = tuple(np.asarray(a) for a in code.fit_fast(*capstone.check_problem()))
    assert capstone.fit_gap(fit, fit) == 0
    with pytest.raises(AssertionError, match="four arrays"):
        capstone.same_fit(fit[0], fit)
    with pytest.raises(ValueError, match="shapes"):
        capstone.fit_gap((*fit[:3], fit[3][:-1]), fit)
    moved = (*fit[:2], fit[2] + 1e-3, fit[3])
    with pytest.raises(AssertionError, match="the covariances: .* values differ from the reference's"):
        capstone.same_fit(moved, fit)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(rows=0), ValueError, "rows must be positive"),
    (dict(rows=500), ValueError, "at most 178"),
    (dict(rows=3), ValueError, "more than components"),
    (dict(rows=2.5), TypeError, "rows must be an integer"),
    (dict(components=0), ValueError, "components must be positive"),
])
def test_load_problem_names_bad_input(kwargs, error, message):
    with pytest.raises(error, match=message):
        code.load_problem(**kwargs)


def test_load_problem_gives_the_standardised_wine_data_and_a_start():
    x, weights, means, covs = code.load_problem()
    assert x.shape == (178, 13) and x.dtype == jnp.float32
    np.testing.assert_allclose(np.mean(np.asarray(x), axis=0), 0, atol=1e-5)  # standardised (float32 means)
    np.testing.assert_allclose(np.std(np.asarray(x), axis=0), 1, rtol=1e-5)
    assert weights.shape == (3,) and means.shape == (3, 13) and covs.shape == (3, 13, 13)
    assert all(any(np.array_equal(m, row) for row in np.asarray(x)) for m in np.asarray(means))  # rows of x
