"""Part III's practice self-checks (fastjax.exercises.tools): for each exercise a right answer passes and
does not compile again, a plausible mistake is named, and a slow answer (the starting program when it
is 10x slower or more, else one that compiles at every call) is called slow."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import fastjax  # noqa: F401
from fastjax import exercises as ex, pln
from fastjax.exercises import tools_code as code

COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: COMPILES.append(event) if event == ex.COMPILE_EVENT else None)


def assert_right_and_compiled_once(name, answer):
    exercise = ex.get(name)
    report = ex.check(name, answer, time_it=False)
    assert report.right, report.text()
    before = len(COMPILES)
    jax.block_until_ready(exercise.run(answer, exercise.arguments()))
    assert len(COMPILES) == before, f"{name}: the right answer compiled again on its second run"


def assert_wrong(name, answer, words):
    report = ex.check(name, answer, time_it=False)
    assert not report.right and words in report.problem, report.text()
    assert "Traceback" not in report.text() and report.hint


def assert_slow(name, answer, retraces):
    report = ex.check(name, answer, repeats=1)
    assert report.right and report.slow and not report.passed, report.text()
    assert report.retraces == retraces, report.text()
    return report


# ---------------------------------------------------------------- tools-1

def loss_fitted_values(params, data):  # a plausible mistake: R = H M (the fitted values), not (I - H) M
    m, s = params
    x = data.covariates
    n = m.shape[0]
    r = x @ jnp.linalg.solve(x.T @ x, x.T @ m)
    sigma = (r.T @ r + jnp.diag(jnp.sum(s * s, axis=0))) / n
    _, logdet = jnp.linalg.slogdet(sigma)
    return -(-0.5 * n * logdet + pln.poisson_part(m, s, data))


def test_tools_1():
    assert_right_and_compiled_once("tools-1", code.loss_with_coefficients)
    assert_wrong("tools-1", loss_fitted_values, "differ from the reference's")
    report = assert_slow("tools-1", code.loss_with_hat_matrix, retraces=False)  # 25-30x slower in our runs
    assert "n × n" in report.text()


def test_tools_1_an_answer_that_is_not_a_loss_is_named():
    report = ex.check("tools-1", lambda params, data: params, time_it=False)  # returns (M, S), not a number
    assert not report.right and report.problem.startswith("Your answer raised TypeError")


# ---------------------------------------------------------------- tools-2

def criterion_derivative_path(elbos, count):  # a plausible mistake: the smoothed derivative, not the criterion
    def body(crit, elbo):
        crit = pln.criterion_update(crit, elbo)
        return crit, crit.derivative
    return np.asarray(jax.lax.scan(body, pln.criterion_start(elbos.dtype), elbos)[1])[:count]


def test_tools_2():
    assert_right_and_compiled_once("tools-2", code.criterion_path_scan)
    assert_wrong("tools-2", criterion_derivative_path, "criterion values")
    report = assert_slow("tools-2", code.criterion_path_unrolled, retraces=True)  # a new count, a new program
    assert report.structural_misses == ["compiles"] and "(jit(criterion_path_unrolled))" in report.text()


def eager_slice_on_the_jax_array(elbos, count):  # issue 38: right, was called slow (the eager slice compiles)
    return code.criterion_path_all(elbos)[:count]


@jax.jit
def _criterion_fori(elbos):  # right, written another way: fori_loop writing into a buffer, not scan
    def body(i, state):
        crit, out = state
        crit = pln.criterion_update(crit, elbos[i])
        return crit, out.at[i].set(crit.value)
    start = pln.criterion_start(elbos.dtype)
    return jax.lax.fori_loop(0, elbos.shape[0], body, (start, jnp.zeros(elbos.shape, start.value.dtype)))[1]


def fori_then_slice(elbos, count):
    return _criterion_fori(elbos)[:count]


def test_tools_2_right_answers_written_other_ways_pass_on_their_compilations():
    for right in (code.criterion_path_scan, eager_slice_on_the_jax_array, fori_then_slice):
        report = ex.check("tools-2", right, repeats=1)
        assert report.right and report.compiles == 0 and not report.structural_misses, (right.__name__, report.text())
        assert report.passed or report.by_time == "slow", report.text()


def test_tools_2_a_process_that_used_every_new_count_still_counts_the_compiles(monkeypatch):
    # 20 checks of the start and 20 of the reference in one process used up the 46 new counts (the reference
    # was then called WRONG 7 times in 20); now the caches are cleared and the counts start over
    from fastjax.exercises import tools as practice

    monkeypatch.setattr(practice, "NEW_COUNTS", (49, 50))  # counts no other test asks for
    compiles = [ex.structure("tools-2", code.criterion_path_unrolled).compiles for _ in range(3)]
    assert all(c >= 1 for c in compiles), compiles  # the third call is past the two counts: it starts over
    assert ex.structure("tools-2", code.criterion_path_scan).compiles == 0


def test_tools_4_the_callback_reads_every_elbo_in_python():
    report = ex.check("tools-4", code.fit_logged, repeats=1)
    assert report.right and report.slow and "host reads" in report.structural_misses, report.text()
    assert report.host_reads >= code.N_ELBOS and "Python read a device value" in report.text()


# ---------------------------------------------------------------- tools-3

record_off_by_one = jax.jit(lambda history, t, row: history.at[t - 1].set(row), donate_argnums=0)


def test_tools_3():
    assert_right_and_compiled_once("tools-3", code.record_row_in_place)
    assert_wrong("tools-3", record_off_by_one, "the filled history")
    # the starting program copies the 10 MiB history at every row: 18-39x slower than donating in our runs
    assert_slow("tools-3", code.record_row, retraces=False)


# ---------------------------------------------------------------- tools-4

def fit_params_of_the_start(data, n_iter):  # a plausible mistake: the start's (M, S) returned, not the fit's
    _, elbos = code.fit_elbos_on_device(data, n_iter)
    return pln.start(data), elbos


def test_tools_4():
    assert_right_and_compiled_once("tools-4", code.fit_elbos_on_device)
    assert_wrong("tools-4", fit_params_of_the_start, "the final (M, S)")
    report = ex.check("tools-4", code.fit_logged, time_it=False)  # the starting program is right
    assert report.right, report.text()

    def logged_and_retracing(data, n_iter):  # the logged fit, with a helper jitted anew at every call
        params, elbos = code.fit_logged(data, n_iter)
        return params, np.asarray(jax.jit(lambda e: e * 1.0)(elbos))

    assert_slow("tools-4", logged_and_retracing, retraces=True)
