"""The workshop's capstone (chapters/capstone.md): exercise "capstone", EM for a Gaussian mixture.

The starting program (``fit_slow``) and the reference solution (``fit_fast``) are the page's, exported
to ``capstone_code``. An answer is called as ``answer(x, weights, means, covs, iterations)`` on the
check's problem (``CHECK_ROWS`` rows of the wine data, ``CHECK_ITERATIONS`` iterations, whatever the
size in force, so that a check takes seconds) and must return the fitted weights, means, covariances
and the trajectory (the mean log-likelihood of each E step), as the starting program does.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from fastjax.exercises import Exercise, capstone_code as code, register, same_arrays

PAGE = "chapters/capstone"
CHECK_ROWS = 60  # every third wine of 178: the page's quick size
CHECK_ITERATIONS = 8
# Two right fits agree within TOLERANCE · (1 + |value|) in every array. What float32 rounding does to a
# right fit was measured against scikit-learn's float64 fit from the same start, on both legs: the
# starting program, the reference, and a fit through Cholesky factors, vmap and fori_loop
# (tests/test_exercises_capstone.py) land within 4.3e-7 of it (60 rows and 8 iterations; all 178 rows
# and 50 or 100 iterations); chapters/capstone.md asserts it again on every rung, at both sizes. 1e-5 is
# 23x that. The mistakes it must catch move the fit far more: ε left out of the covariances by 1.3e-3
# (8 iterations) to 0.14 (50), responsibilities normalised over the samples by more than 600.
TOLERANCE = 1e-5
NAMES = ("the weights", "the means", "the covariances", "the trajectory (mean log-likelihood per iteration)")


def _four(fit: Any, what: str) -> tuple:
    if not isinstance(fit, (tuple, list)) or len(fit) != 4:
        got = f"a {type(fit).__name__} of {len(fit)}" if isinstance(fit, (tuple, list)) else f"a {type(fit).__name__}"
        raise AssertionError(f"{what} must be four arrays, (weights, means, covariances, trajectory), "
                             f"as fit_slow returns; got {got}")
    return tuple(fit)


def fit_gap(got: Any, want: Any) -> float:
    """The largest gap between two fits, |got - want| / (1 + |want|) over every value of the four arrays."""
    gaps = []
    for g, w in zip(_four(got, "the first fit"), _four(want, "the second fit")):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            raise ValueError(f"the fits' arrays have shapes {g.shape} and {w.shape}")
        gaps.append(float(np.max(np.abs(g - w) / (1 + np.abs(w)))) if g.size else 0.0)
    return max(gaps)


def same_fit(got: Any, want: Any) -> None:
    """Raise AssertionError, in plain words, unless ``got`` is the fit ``want`` within ``TOLERANCE``."""
    got, want = _four(got, "your fit's result"), _four(want, "the reference's result")
    # the trajectory first: it says the most about what went wrong (an E step, or every step)
    for i in (3, 0, 1, 2):
        same_arrays(got[i], want[i], rtol=TOLERANCE, atol=TOLERANCE, what=NAMES[i])


_problem: tuple | None = None


def check_problem() -> tuple:
    """The check's arguments: ``(x, weights, means, covs, iterations)``, fresh arrays for each call."""
    global _problem
    if _problem is None:
        _problem = tuple(np.asarray(a) for a in code.load_problem(CHECK_ROWS))
    return (*(jnp.asarray(a) for a in _problem), CHECK_ITERATIONS)


register(Exercise(
    name="capstone", title="A Gaussian mixture, up the ladder", part="Workshop", page=PAGE,
    skill="all of it: remove a retrace, jit, vectorise, move the loop into scan, remove host syncs",
    minutes=180, arguments=check_problem, reference=code.fit_fast, start=code.fit_slow, same=same_fit,
    wrong_hint="compare your trajectory with fit_slow's, iteration by iteration: it holds each E step's mean "
               "log-likelihood, taken before that iteration's M step. The responsibilities sum to one over the "
               "components (axis 1 of an (n, K) array), not over the samples; N_j divides the means and the "
               "covariances; ε (REG) is added to every covariance's diagonal, after the division",
    slow_hint="open the hints on the page one at a time: a function defined inside the fit compiles again on "
              "every call; one jitted call per sample pays a dispatch per sample; float() waits for the "
              "device; a Python loop of iterations dispatches once per iteration (lax.scan runs it in one call)",
    witness=("compiles", "host reads", "programs"),
    repeats=3,
))

__all__ = ["CHECK_ITERATIONS", "CHECK_ROWS", "NAMES", "PAGE", "TOLERANCE", "check_problem", "fit_gap", "same_fit"]
