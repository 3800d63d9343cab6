"""The self-check harness of the exercises (fastjax.exercises): right, wrong, raising, retracing and
slow answers to a small exercise get the verdict and the plain-words message they should."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastjax  # noqa: F401
from fastjax import exercises as ex

X = np.linspace(0.0, 1.0, 20_000, dtype=np.float32)


@jax.jit
def reference(x):
    return jnp.sum(jnp.sin(x) ** 2)


def start(x):  # the slow way: one eager operation per chunk
    return sum(jnp.sum(jnp.sin(x[i:i + 2000]) ** 2) for i in range(0, len(x), 2000))


@pytest.fixture
def toy(monkeypatch):
    exercise = ex.Exercise(
        name="method-toy", title="a toy", part="Method", page="chapters/measuring", skill="jit a function",
        minutes=1, arguments=lambda: (jnp.asarray(X),), reference=reference, start=start,
        same=lambda got, want: ex.same_arrays(got, want, rtol=1e-5, what="the sum"),
        wrong_hint="compare with the starting program", slow_hint="put it under jax.jit", repeats=3)
    monkeypatch.setitem(ex.REGISTRY, exercise.name, exercise)
    return exercise


def test_a_right_answer_passes_and_is_timed_against_the_reference_and_the_start(toy):
    report = ex.check("method-toy", jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2)))
    # right and not retracing; its speed next to the reference is not asserted (a timing in a test)
    assert report.right and not report.retraces, report.text()
    assert report.seconds > 0 and report.reference_seconds > 0 and report.start_seconds > 0
    assert "computes the same" in report.text() and "speed-up over the starting program" in report.text()


def test_a_wrong_answer_is_named_with_the_worst_value(toy):
    report = ex.check("method-toy", jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2) * 1.01))
    assert not report.right and not report.passed
    assert "differs from the reference" in report.problem and "compare with the starting program" in report.text()
    assert report.seconds is None  # a wrong answer is not timed


def test_a_wrong_shape_is_named(toy):
    report = ex.check("method-toy", jax.jit(lambda x: jnp.sin(x) ** 2))
    assert not report.right and "shape (20000,)" in report.problem and "shape ()" in report.problem


def test_an_answer_that_raises_gets_one_line_not_a_traceback(toy):
    def broken(x):
        return jnp.sum(x.reshape(3, -1))  # 20,000 is not a multiple of 3

    report = ex.check("method-toy", broken)
    assert not report.right and report.problem.startswith("Your answer raised TypeError")
    assert "broken" not in report.problem or "line" in report.problem
    assert "Traceback" not in report.text() and len(report.text().splitlines()) <= 3


def test_a_retracing_answer_is_caught_by_its_compilations(toy):
    def retracing(x):  # a new jitted closure on every call: JAX compiles every time
        return jax.jit(lambda y: jnp.sum(jnp.sin(y) ** 2))(x)

    report = ex.check("method-toy", retracing)
    assert report.right and report.retraces and report.slow and not report.passed
    assert report.compiles >= 3 and "compiled" in report.text() and "put it under jax.jit" in report.text()


def test_a_slow_answer_is_named_slow(toy):
    # right, not retracing, and far slower than the reference: ten eager chunks, each several dispatches,
    # against one compiled call (about 15x here; a verdict needs only 1.5x, so load cannot flip it)
    report = ex.check("method-toy", start)
    assert report.right and not report.retraces and report.slow, report.text()
    assert report.ratio > ex.SLOW_FACTOR and "RIGHT, BUT SLOW" in report.text()


def test_bad_names_and_answers_get_clear_errors(toy):
    with pytest.raises(ValueError, match="no exercise is called 'pln-999'"):
        ex.check("pln-999", reference)
    with pytest.raises(TypeError, match="must be a function"):
        ex.check("method-toy", 3.0)
    with pytest.raises(ValueError, match="must start with one of"):
        ex.register(ex.Exercise(name="x-1", title="", part="", page="", skill="", minutes=1,
                                arguments=tuple, reference=reference, same=lambda g, w: None))


def test_checks_and_solutions_record_their_run_time_for_the_workshop_page(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTJAX_MEASUREMENTS", str(tmp_path))
    ex.check("method-toy", reference, time_it=False)
    assert "method-toy" not in ex.recorded()  # an untimed check would understate what a check costs
    ex.check("method-toy", reference, repeats=1)
    ex.record("method-toy", "solution", 1.5)
    kept = ex.recorded()["method-toy"]
    assert kept["solution"] == 1.5 and 0 < kept["check"] < 60


def test_compiles_during_counts_a_new_shape_and_nothing_on_a_second_call():
    f = jax.jit(lambda x: x * 2 + 1)
    seven, eight = jnp.asarray(np.ones(7, np.float32)), jnp.asarray(np.ones(8, np.float32))  # made outside
    assert ex.compiles_during(lambda: f(seven)) == 1
    assert ex.compiles_during(lambda: f(seven)) == 0
    assert ex.compiles_during(lambda: f(eight)) == 1
