"""Part VI's practice exercises (fastjax.exercises.floor): for each one, a right answer passes the check and
does not compile again, a plausible wrong answer is named wrong with a message, and a slow answer is named
slow by a margin that load cannot flip (10x and more, or a retrace, which the check counts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastjax  # noqa: F401
from fastjax import exercises as ex
from fastjax.exercises import floor as practice, floor_code as code

pytestmark = pytest.mark.xdist_group("exercises-floor")

NAMES = ("floor-1", "floor-2", "floor-3", "floor-4")
REFERENCES = {"floor-1": code.loss_and_grad_by_hand, "floor-2": code.update_fused, "floor-3": code.block_grad_patches,
              "floor-4": code.predict_batches}
STARTS = {"floor-1": code.loss_and_grad_autodiff, "floor-2": code.update_in_pieces, "floor-3": code.block_grad_lax,
          "floor-4": code.predict_batches_start}





def test_the_four_exercises_are_registered_with_their_page(root):
    found = {e.name: e for e in ex.all_exercises("floor")}
    toc = (root / "_toc.yml").read_text()
    for name in NAMES:
        e = found[name]
        assert e.part == "Part VI" and e.page == practice.PAGE and e.page in toc and e.minutes > 0
        assert e.start is STARTS[name] and e.reference is REFERENCES[name]


@pytest.mark.parametrize("name", NAMES)
def test_the_starting_program_is_right(name):
    assert ex.check(name, STARTS[name], time_it=False).right


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_right_and_does_not_compile_again(name):
    assert ex.check(name, REFERENCES[name], time_it=False).right
    assert ex.compiles_on_a_second_run(name, REFERENCES[name]) == 0


# ---------------------------------------------------------------- second right ways

def test_floor_1_a_custom_vjp_built_on_forward_mode_is_right():
    # the same derivative from jax.jvp (forward mode) inside the custom_vjp's forward pass
    @jax.custom_vjp
    def loss(alpha, y):
        return code.smoothing_loss(alpha, y)

    def forward(alpha, y):
        value, d_alpha = jax.jvp(lambda a: code.smoothing_loss(a, y), (alpha,), (jnp.ones_like(alpha),))
        return value, (d_alpha, y)

    loss.defvjp(forward, lambda saved, ct: (ct * saved[0], jnp.zeros_like(saved[1])))
    assert ex.check("floor-1", jax.jit(jax.value_and_grad(loss)), time_it=False).right


def test_floor_4_the_cholesky_solve_is_right():
    def predict(x, y, batches):
        weights = code.gp_weights_cholesky(x, y)
        return jnp.stack([code.predict_from_weights(x, weights, b) for b in batches])

    assert ex.check("floor-4", predict, time_it=False).right


# ---------------------------------------------------------------- wrong answers

def test_floor_1_a_dropped_term_of_the_derivative_is_wrong():
    def value_and_grad(alpha, y):  # d_t = y_t − s_(t−1), the (1 − alpha)·d_(t−1) term left out
        def step(carry, y_t):
            s, d, total, d_total = carry
            e = y_t - s
            return (alpha * y_t + (1 - alpha) * s, e, total + e * e, d_total - 2 * e * d), None

        zero = jnp.zeros_like(y[0])
        (_, _, total, d_total), _ = jax.lax.scan(step, (y[0], zero, zero, zero), y[1:])
        count = (y.shape[0] - 1) * y.shape[1]
        return jnp.sum(total) / count, jnp.sum(d_total) / count

    answer = jax.jit(value_and_grad)
    report = ex.check("floor-1", answer, time_it=False)
    assert not report.right and "array 1" in report.problem and "float64" in report.text()
    # the size of the mistake that the page's comments quote: 40 %
    want = code.loss_and_grad_by_hand(*practice.smoothing_problem())[1]
    assert 0.3 < abs(float(answer(*practice.smoothing_problem())[1]) / float(want) - 1) < 0.5


def test_floor_2_an_update_without_bias_correction_is_wrong():
    @jax.jit
    def no_correction(p, g, m, v, t):
        g = g * jnp.minimum(1.0, code.MAX_NORM / jnp.sqrt(jnp.sum(g * g)))
        m, v = code.B1 * m + (1 - code.B1) * g, code.B2 * v + (1 - code.B2) * g * g
        return p - code.LR * (m / (jnp.sqrt(v) + code.EPS) + code.WEIGHT_DECAY * p), m, v

    report = ex.check("floor-2", no_correction, time_it=False)
    assert not report.right and "array 0" in report.problem and "1 − B1**t" in report.text()


def test_floor_2_an_answer_that_returns_only_the_parameters_is_named():
    report = ex.check("floor-2", lambda *args: code.update_fused(*args)[0], time_it=False)
    assert not report.right and "wrong structure" in report.problem


def test_floor_3_a_flipped_kernel_is_wrong():
    # a convolution in the mathematical sense (kernel flipped) instead of XLA's correlation
    def flipped(x, w):
        return code.conv3x3_patches(x, w[::-1, ::-1])

    report = ex.check("floor-3", jax.jit(jax.value_and_grad(lambda ws, x: code.block_loss(ws, x, flipped))),
                      time_it=False)
    assert not report.right and "differ from the reference's" in report.problem


def test_floor_4_a_missing_noise_term_is_wrong():
    @jax.jit
    def weights(x, y):
        return jnp.linalg.solve(code.kernel(x, x), y)  # σ² left out

    def predict(x, y, batches):
        w = weights(x, y)
        return jnp.stack([code.predict_from_weights(x, w, b) for b in batches])

    report = ex.check("floor-4", predict, time_it=False)
    assert not report.right and "predicted means" in report.problem and "NOISE" in report.text()


def test_floor_4_the_tolerance_is_far_from_rounding_and_far_from_the_mistakes():
    x, y, batches = practice.gp_problem()
    with jax.enable_x64(True):  # the exact answer, to rounding
        x64, y64, b64 = (jnp.asarray(a, jnp.float64) for a in (x, y, batches))
        exact = np.asarray(code.predict_batches(x64, y64, b64))
    err = float(np.max(np.abs(np.asarray(code.predict_batches(x, y, batches)) - exact)))
    err_start = float(np.max(np.abs(np.asarray(code.predict_batches_start(x, y, batches)) - exact)))
    assert max(err, err_start) < 1e-3 / 10  # the check's atol, 1e-3, is ten times float32's error or more


# ---------------------------------------------------------------- slow answers

RETRACING = {  # the reference with its jit made inside the call: a new function, compiled on every call
    "floor-1": lambda alpha, y: jax.jit(jax.value_and_grad(code.smoothing_loss_by_hand))(alpha, y),
    "floor-2": lambda *args: jax.jit(lambda *a: code.update_fused(*a))(*args),
    "floor-3": lambda weights, x: jax.jit(jax.value_and_grad(
        lambda ws, xs: code.block_loss(ws, xs, code.conv3x3_patches)))(weights, x),
}


@pytest.mark.parametrize("name", sorted(RETRACING))
def test_an_answer_that_compiles_on_every_call_is_slow(name):
    report = ex.check(name, RETRACING[name], repeats=1)
    assert report.right and report.retraces and report.slow and not report.passed, report.text()


def test_floor_4_the_starting_program_is_slow():
    # an inverse of a 500×500 matrix per batch against one solve: 15-20x measured on the busy machine
    report = ex.check("floor-4", code.predict_batches_start, repeats=3)
    assert report.right and report.slow and report.ratio > 5, report.text()
    assert "RIGHT, BUT SLOW" in report.text() and "solve for the weights once" in report.text()


# ---------------------------------------------------------------- floor-2: the host read, counted (issue 38)

@jax.jit
def _update_given_factor(p, g, m, v, t, factor):
    g = g * factor
    m, v = code.B1 * m + (1 - code.B1) * g, code.B2 * v + (1 - code.B2) * g * g
    m_hat, v_hat = m / (1 - code.B1**t), v / (1 - code.B2**t)
    return p - code.LR * (m_hat / (jnp.sqrt(v_hat) + code.EPS) + code.WEIGHT_DECAY * p), m, v


def fused_but_reads_the_norm(p, g, m, v, t):  # one fused program, but float() of the norm still waits
    norm = float(code.gradient_norm(g))
    return _update_given_factor(p, g, m, v, t, min(1.0, code.MAX_NORM / norm))


@jax.jit
def fused_with_where(p, g, m, v, t):  # right, written another way: jnp.where instead of jnp.minimum
    norm = jnp.sqrt(jnp.vdot(g, g))
    return _update_given_factor(p, g, m, v, t, jnp.where(norm > code.MAX_NORM, code.MAX_NORM / norm, 1.0))


def fused_in_pieces_of_one_program(p, g, m, v, t):  # right another way: one jit of a function calling helpers
    return _one_program(p, g, m, v, t)


@jax.jit
def _one_program(p, g, m, v, t):
    factor = jnp.minimum(1.0, code.MAX_NORM / code.gradient_norm(g))  # a jitted helper inlines into the program
    m, v = code.moments(m, v, code.scaled(g, factor))
    return code.adamw_step(p, *code.bias_corrected(m, v, t)), m, v


@pytest.mark.parametrize("answer", [code.update_in_pieces, fused_but_reads_the_norm])
def test_floor_2_an_answer_that_reads_the_norm_is_slow_whatever_the_clock_says(answer):
    report = ex.check("floor-2", answer, repeats=1)
    assert report.right and report.slow and not report.passed, report.text()
    assert report.structural_misses[0] == "host reads" and report.host_reads == 1, report.text()
    assert "Python read a device value 1 time(s)" in report.text() and "no float() of the norm" in report.text()


@pytest.mark.parametrize("answer", [code.update_fused, fused_with_where, fused_in_pieces_of_one_program])
def test_floor_2_one_program_without_a_host_read_passes(answer):
    report = ex.check("floor-2", answer, repeats=1)
    assert report.right and report.host_reads == 0 and not report.structural_misses, report.text()
    assert report.passed or report.by_time == "slow", report.text()  # time, the second witness, alone could say slow
    assert "Python read a device value 0 time(s)" in report.text()


def test_floor_2_one_program_moves_less_than_the_pieces_and_no_less_than_the_least():
    moved = practice.update_passes()
    assert set(moved["pieces"]) == {"gradient_norm", "scaled", "moments", "bias_corrected", "adamw_step"}
    # the least: g read for the norm, then p, g, m and v read once and three results written
    assert 1 + 4 + 3 <= moved["fused"] < sum(moved["pieces"].values()), moved
    assert moved["loops"] >= 1 and moved["loop reads"] >= 4, moved  # the loops read p, g, m and v at least once
    assert moved["array bytes"] == practice.UPDATE_SIZE * 4
