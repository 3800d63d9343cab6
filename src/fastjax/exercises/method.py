"""The Method practice page's exercises (chapters/practice-method.md): method-1 to method-4.

The programs and the reference solutions are the page's, exported to ``method_code``. Three of the
answers are themselves measurements (a timer, a race): their result is a number of seconds, or a ratio,
compared with what the reference measures on the same kind of program, within a band wide enough for a
busy machine and far narrower than the starting program's error. The third is a program, checked and
timed as in every part.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fastjax.exercises import Exercise, method_code as code, register, same_arrays

PAGE = "chapters/practice-method"
# A right timer agrees with the reference's within this factor. The two measure the same program one
# right after the other (medians of waited calls): measured within 1.5x of each other on the busy 2-core
# machine, and once 3.6x apart (a spike on a 0.3 ms program), so 4. The starting timers are off by 20x or
# more: no wait times the dispatch, 10-20 µs, against milliseconds of work (100-300x); the first call
# included adds a compile of 0.15 s or more to five calls of 1-1.6 ms (20-30x).
TIMER_BAND = 4.0
# A right race agrees with the reference's ratio within this factor. The check's machine interrupts every
# fifth call for 0.1 s and does not drift (the page's drift makes a race in turns land 0.8-1.1 of the true
# ratio, too close to the mistakes to judge them apart): races with medians landed within 0.95-1.08 of the
# stand-ins' true ratio in our runs, in turns or not, with 5 to 15 rounds; races with means at 0.24-0.30.
RACE_BAND = (0.6, 1.6)


def _seconds(value: Any, what: str) -> float:
    """A timer's answer as a float: a number, a 0-d array, or a ``timing.Timing`` (its median)."""
    if hasattr(value, "median") and not isinstance(value, np.ndarray):
        value = value.median
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise AssertionError(f"{what} must be a number; got {type(value).__name__}") from None
    if not math.isfinite(out) or out <= 0:
        raise AssertionError(f"{what} must be a positive finite number; got {out!r}")
    return out


def _same_timer(got: Any, want: Any) -> None:
    got_s, want_s = _seconds(got, "your timer's answer (seconds per call)"), _seconds(want, "the reference's answer")
    ratio = got_s / want_s
    says = f"your timer says {got_s * 1e3:.3g} ms per call, the reference's timer {want_s * 1e3:.3g} ms"
    if ratio < 1 / TIMER_BAND:
        raise AssertionError(f"{says}: {1 / ratio:.0f}× too low. The clock stopped before the work was done: "
                             "JAX returns from a call before its result exists.")
    if ratio > TIMER_BAND:
        raise AssertionError(f"{says}: {ratio:.0f}× too high. Something besides the calls was timed, such as "
                             "the first call, which traces and compiles.")


def _same_race(got: Any, want: Any) -> None:
    got_r, want_r = _seconds(got, "your race's answer (a ratio)"), _seconds(want, "the reference's answer")
    ratio = got_r / want_r
    if not RACE_BAND[0] <= ratio <= RACE_BAND[1]:
        raise AssertionError(f"on the busy machine your race says the fast program is {got_r:.2f}× faster, the "
                             f"reference's {want_r:.2f}× ({ratio:.2f} of it; a fair race lands within "
                             f"{RACE_BAND[0]}-{RACE_BAND[1]} of it)")


# ---------------------------------------------------------------- method-1 and method-2: timers

_x_big = None


def _chain_arguments() -> tuple:
    global _x_big
    if _x_big is None:
        _x_big = jax.random.normal(jax.random.key(0), (256, 256))
    return (_CHAIN, _x_big)


_CHAIN = jax.jit(code.matmul_chain)  # compiled once, at its first call: method-1's timers call it warm


def _fresh_deep_chain() -> tuple:
    """A new jitted function (a new lambda: nothing compiled yet) and a 128×128 matrix."""
    return (jax.jit(lambda a: code.deep_chain(a)), jax.random.normal(jax.random.key(1), (128, 128)))


register(Exercise(
    name="method-1", title="Wait for the result", part="Method", page=PAGE,
    skill="time the work, not the dispatch (block_until_ready)", minutes=10,
    arguments=_chain_arguments, reference=code.seconds_per_call, same=_same_timer, start=None, timed=False,
    wrong_hint="wait for each timed call's result (jax.block_until_ready) before you stop the clock, and call "
               "once before timing, so that the compile stays out",
))

register(Exercise(
    name="method-2", title="Leave the compile out", part="Method", page=PAGE,
    skill="keep the compile out of a timing; measure it apart", minutes=15,
    arguments=_fresh_deep_chain, reference=code.seconds_per_call, same=_same_timer, start=None, timed=False,
    wrong_hint="the check hands your timer a function that has not been compiled yet: call it once before "
               "you start the clock, and wait for every timed call",
))


# ---------------------------------------------------------------- method-3: one shape for every batch

FIXED_ROWS = (512, 300, 37, 129)  # the batches compared with the reference's scores
# Sizes of the one batch per run that is new to the program (its score is not compared, only timed):
# 200 to 511 rows, round robin, so that a program that compiles per shape compiles at every run.
_new_rows = itertools.cycle([r for r in range(200, code.MAX_ROWS) if r not in FIXED_ROWS])


def _batches() -> tuple:
    return (code.stream_batches(FIXED_ROWS, seed=0),)


def _score_stream(answer: Callable[..., Any], args: tuple) -> Any:
    (batches,) = args
    scores = [answer(b) for b in batches]
    jax.block_until_ready(answer(code.stream_batches([next(_new_rows)], seed=1)[0]))  # a batch of a new size
    return jnp.stack([jnp.asarray(s, dtype=jnp.float32).reshape(()) for s in scores])


register(Exercise(
    name="method-3", title="One shape for every batch", part="Method", page=PAGE,
    skill="pad to one shape, so that jit compiles once", minutes=20,
    arguments=_batches, reference=code.score_padded, start=code.score_each_shape, run=_score_stream,
    # float32 sums of a few hundred log-sum-exps, in other orders: a few ulps (3e-7 measured); a row
    # left out or a padded row counted moves a score by 1e-4 or more (tests/test_exercises_method.py)
    same=lambda got, want: same_arrays(got, want, rtol=1e-5, what="the scores of the batches"),
    wrong_hint="the padded rows must count for nothing: leave them out of the sum (jnp.where with a mask of the "
               "first `rows` rows) and divide by the true number of rows, not by MAX_ROWS",
    slow_hint="a batch with a new number of rows is a new shape, and jit traces and compiles again; pad every "
              "batch to MAX_ROWS rows on the host and pass the number of rows as an argument",
    repeats=3,
))


# ---------------------------------------------------------------- method-4: a fair race

STAND_INS = (0.012, 0.002)  # seconds that the slow and the fast stand-in program wait per call: ratio 6


def _waiting(seconds: float) -> Callable[[Any], Any]:
    def program(x: Any) -> Any:
        time.sleep(seconds)
        return x
    return program


def _busy_stand_ins() -> tuple:
    """The two stand-in programs on a fresh machine of the page's kind that only interrupts (every fifth
    call, 0.1 s) and does not drift, and no input: it tells a race with medians from one with means."""
    machine = code.BusyMachine(slowdown=0.0, every=5, interruption=0.1)
    return (machine.wrap(_waiting(STAND_INS[0])), machine.wrap(_waiting(STAND_INS[1])), None)


register(Exercise(
    name="method-4", title="A fair race on a busy machine", part="Method", page=PAGE,
    skill="compare two programs in turns, with medians", minutes=20,
    arguments=_busy_stand_ins, reference=code.speedup_in_turns, same=_same_race, start=None, timed=False,
    wrong_hint="time one call of each program per round, the two in turns, for at least five rounds, and divide "
               "the medians, not the means: an interruption pulls a mean (the check's machine interrupts every "
               "fifth call; it checks the medians, and the page shows why the turns matter)",
))
