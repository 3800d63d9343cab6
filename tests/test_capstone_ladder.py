"""fastjax.exercises.capstone_ladder: every rung between the capstone's starting program and its reference
computes the same fit as the reference, on the check's problem."""

from __future__ import annotations

import jax

from fastjax.exercises import capstone, capstone_ladder
from fastjax.exercises import capstone_code as code


def test_every_rung_is_the_reference_fit():
    problem = code.load_problem(capstone.CHECK_ROWS)
    want = code.fit_fast(*problem, capstone.CHECK_ITERATIONS)
    assert list(capstone_ladder.RUNGS) == ["1. compiled once", "2. E step vectorised", "3. one jitted EM step"]
    for fit in capstone_ladder.RUNGS.values():
        capstone.same_fit(jax.block_until_ready(fit(*problem, capstone.CHECK_ITERATIONS)), want)  # raises if not
