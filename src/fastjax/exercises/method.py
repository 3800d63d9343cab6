"""The Method practice page's exercises (chapters/practice-method.md): method-1 to method-4.

The programs and the reference solutions are the page's, exported to ``method_code``. Three of the
answers are themselves measurements (a timer, a race): their result is a number of seconds, or a ratio,
compared with what the reference measures on the same kind of program, within a band wide enough for a
busy machine and far narrower than the starting program's error. The third is a program, checked and
timed as in every part.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fastjax.exercises import Exercise, method_code as code, register, same_arrays, unseen

PAGE = "chapters/practice-method"
# A right timer agrees with the reference's within this factor of the range of the reference's timer run
# three times around it (before, and right after each): medians of waited calls of the same program, one
# right after the other, measured within 1.5x of each other on the busy 2-core machine, and once 3.6x apart
# (a spike on a 0.3 ms program), so 4; on a machine loaded beyond its cores they move further apart, and
# the range takes that in. The starting timers are off by 20x or
# more: no wait times the dispatch, 10-20 µs, against milliseconds of work (100-300x); the first call
# included adds a compile of 0.15 s or more to five calls of 1-1.6 ms (20-30x).
TIMER_BAND = 4.0
# A right race agrees within this factor with the ratio of the medians of the calls it made (what the
# stand-ins took, timed by the check: a sleep overshoots on a loaded machine). The check's machine interrupts every
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


# The timers' second test: a fake program (``FakeProgram``) whose calls return at once and whose work, queued as
# on a device, lasts PROBE_SECONDS, and PROBE_OUTLIER_SECONDS on every PROBE_EVERY-th call. The check counts
# which results the timer waited for before its next call, and reads what it reports. A sleep overshoots on a
# busy machine (4 ms took 4-5 ms on a quiet one, more under load), so the fake program keeps what each call's
# work actually took, waits included, and the check judges against those: a median of waited calls lands at
# their median, a mean (or a timer that waits only after its last call) at their mean, about
# 1 + (20 − 1) / 4 = 5.75x the median on a quiet machine; the line between them is their geometric middle
# (PROBE_BAND, 2.4x, on a quiet machine), and a timer must land nearer the median than the mean.
PROBE_SECONDS, PROBE_OUTLIER_SECONDS, PROBE_EVERY = 0.004, 0.08, 4
PROBE_BAND = 2.4
# What a timer's mistakes report on the fake program: milliseconds for seconds, 1000x (a window of 2x either
# side); the total of its calls instead of one call's time (within 1.25x of the work of the calls it timed,
# which the fake program knows exactly; a median or a mean lands 3x or more below it from 3 calls on).
UNITS_WINDOW = (500.0, 2000.0)
TOTAL_BAND = 1.25


class FakeProgram:
    """A program that runs as on a device: a call returns at once, its work queued after the work of the
    calls before it; waiting for a result (``jax.block_until_ready``, ``.block_until_ready()``,
    ``np.asarray``) sleeps until that work is done. It keeps each call's work and which results were
    waited for before the next call."""

    def __init__(self) -> None:
        self.work: list[float] = []
        self.waited_in_time: set[int] = set()
        self.last_waited = False
        self._queue_end = 0.0
        self._started: list[float] = []  # when each call's work started (after the work queued before it)
        self.finished: dict[int, float] = {}  # when a wait for a call's result returned, the first time

    def __call__(self, x: Any) -> "_FakeResult":
        now = time.perf_counter()
        work = PROBE_OUTLIER_SECONDS if len(self.work) % PROBE_EVERY == PROBE_EVERY - 1 else PROBE_SECONDS
        start = max(now, self._queue_end)
        self._queue_end = start + work
        self._started.append(start)
        self.work.append(work)
        self.last_waited = False
        return _FakeResult(self, len(self.work) - 1, self._queue_end)

    def took(self) -> list[float]:
        """What each call's work actually took, for the calls waited for before the next one: from the start of
        its work to the return of the wait (the sleep's overshoot included); the planned work where none was."""
        out = []
        for i, work in enumerate(self.work):
            done = self.finished.get(i)
            out.append(max(work, done - self._started[i]) if i in self.waited_in_time and done else work)
        return out

    def last_waited_only(self) -> bool:
        """Whether the last call's result was waited for, and hardly any before it."""
        return self.last_waited and len(self.waited_in_time) <= 2


class _FakeResult:
    def __init__(self, program: FakeProgram, index: int, done: float) -> None:
        self.program, self.index, self.done = program, index, done

    def block_until_ready(self) -> "_FakeResult":
        if len(self.program.work) == self.index + 1:  # no call made after this one yet
            self.program.waited_in_time.add(self.index)
            self.program.last_waited = True
        left = self.done - time.perf_counter()
        if left > 0:
            time.sleep(left)
        program = self.program
        if self.index not in program.finished:
            program.finished[self.index] = time.perf_counter()
            if len(program.work) == self.index + 1:  # the next call's work starts after this wait's overshoot
                program._queue_end = max(program._queue_end, program.finished[self.index])
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.block_until_ready()
        return np.zeros((), dtype=dtype or np.float32)


def _timer_and_probe(answer: Callable[..., Any], args: tuple) -> tuple:
    """What the timer says of the exercise's program, and of a fresh :class:`FakeProgram` (with the same
    input), and what the reference's timer says of the same program right after it (the machine as it was
    then): ``(seconds, (fake seconds, the fake program), the reference's seconds beside)``."""
    seconds = answer(*args)
    beside = code.seconds_per_call(*args)
    fake = FakeProgram()
    return seconds, (answer(fake, args[1]), fake), beside


def _same_timer(got: Any, want: Any) -> None:
    (got, (probe, fake), beside_got), (want, _, beside_want) = got, want
    got_s, want_s = _seconds(got, "your timer's answer (seconds per call)"), _seconds(want, "the reference's answer")
    # the reference's timer on the same program, three times around yours: a busy machine moves them apart,
    # and the band around them widens by as much (judged against what the machine did, not a fixed figure)
    refs = [want_s, _seconds(beside_want, "the reference's answer"), _seconds(beside_got, "the reference's answer")]
    low, high = min(refs), max(refs)
    probe_s = _seconds(probe, "your timer's answer (seconds per call)")
    calls = len(fake.work)
    not_waited = calls - len(fake.waited_in_time)
    if not_waited > 1:  # one call may go unwaited: an untimed first call that compiles
        raise AssertionError(
            f"your timer waited for {len(fake.waited_in_time)} of its {calls} calls before making the next "
            + ("(only the last one). The calls before it overlap, and their time is a total, split evenly: "
               "wait for every call inside the clock, then take the median." if fake.last_waited_only() else
               "one. JAX returns from a call before its result exists: wait for each (jax.block_until_ready) "
               "before you stop the clock.")
            + f" (The check times it on a program that queues its work as a device does; it counts the waits.)")
    ratio = got_s / want_s
    says = f"your timer says {got_s * 1e3:.3g} ms per call, the reference's timer {want_s * 1e3:.3g} ms"
    took = fake.took()
    typical, mean = float(np.median(took)), float(np.mean(took))  # what the calls took on this machine
    band = math.sqrt(mean / typical) if mean > typical else PROBE_BAND  # the geometric middle of the two
    probe_ratio = probe_s / typical
    if UNITS_WINDOW[0] <= probe_ratio <= UNITS_WINDOW[1] or UNITS_WINDOW[0] <= ratio <= UNITS_WINDOW[1]:
        raise AssertionError(f"{says}: about {ratio:.0f}× too high. Units? The check expects seconds; "
                             "milliseconds are 1000 times more.")
    timed = [sum(took), sum(took[1:])]  # every call, or all but an untimed first
    if calls >= 3 and any(1 / TOTAL_BAND <= probe_s / total <= TOTAL_BAND for total in timed):
        raise AssertionError(f"{says}: {ratio:.1f}× too high. A total, not per call: divide by the number of "
                             "calls (or take the median of the calls' times).")
    if got_s < low / TIMER_BAND:
        raise AssertionError(f"{says}: {low / got_s:.0f}× too low. The clock stopped before the work was done: "
                             "JAX returns from a call before its result exists.")
    if got_s > high * TIMER_BAND:
        raise AssertionError(f"{says}: {got_s / high:.0f}× too high. Something besides the calls was timed, such as "
                             "the first call, which traces and compiles.")
    if probe_ratio > band:
        raise AssertionError(
            f"on a program whose calls took {typical * 1e3:.3g} ms here (median), and {PROBE_OUTLIER_SECONDS * 1e3:g} ms "
            f"every {PROBE_EVERY}th call, your timer says {probe_s * 1e3:.3g} ms per call: {probe_ratio:.1f}× the "
            f"typical call, nearer their mean ({mean * 1e3:.3g} ms). A mean: one slow call (another process, a page "
            "fault) pulls it; take the median of the calls' times.")
    if probe_ratio < 1 / PROBE_BAND:
        raise AssertionError(
            f"on a program whose calls took {typical * 1e3:.3g} ms here (median) your timer says {probe_s * 1e3:.3g} ms "
            "per call: the clock stopped before the work was done.")


def _same_race(got: Any, want: Any) -> None:
    (got, truth), (want, _) = got, want
    got_r, want_r = _seconds(got, "your race's answer (a ratio)"), _seconds(want, "the reference's answer")
    # judged against what the stand-ins' calls took in your race (the ratio of their medians: a sleep overshoots
    # on a loaded machine, and moves it from 6); the reference's race where your function made no call
    against, what = (truth, "the ratio of the medians of the calls your race made") if truth else (
        want_r, "the reference's race")
    ratio = got_r / against
    if not RACE_BAND[0] <= ratio <= RACE_BAND[1]:
        raise AssertionError(f"on the busy machine your race says the fast program is {got_r:.2f}× faster, "
                             f"{what} {against:.2f}× ({ratio:.2f} of it; a fair race lands within "
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
    run=_timer_and_probe,
    wrong_hint="wait for each timed call's result (jax.block_until_ready) before you stop the clock, call "
               "once before timing, so that the compile stays out, and return the median of the calls' seconds",
))

register(Exercise(
    name="method-2", title="Leave the compile out", part="Method", page=PAGE,
    skill="keep the compile out of a timing; measure it apart", minutes=15,
    arguments=_fresh_deep_chain, reference=code.seconds_per_call, same=_same_timer, start=None, timed=False,
    run=_timer_and_probe,
    wrong_hint="the check hands your timer a function that has not been compiled yet: call it once before "
               "you start the clock, and wait for every timed call",
))


# ---------------------------------------------------------------- method-3: one shape for every batch

FIXED_ROWS = (512, 300, 37, 129)  # the batches compared with the reference's scores
# Sizes of the batch the structural count gives an answer, one new to it per check (``unseen``), so that a
# program that compiles per shape compiles on it: 200 to 511 rows, then the smaller ones.
NEW_ROWS = tuple(r for r in (*range(200, code.MAX_ROWS), *range(1, 200)) if r not in FIXED_ROWS)


def _batches() -> tuple:
    return (code.stream_batches(FIXED_ROWS, seed=0),)


def _score_stream(answer: Callable[..., Any], args: tuple) -> Any:
    (batches,) = args
    scores = [answer(b) for b in batches]
    return jnp.stack([jnp.asarray(s, dtype=jnp.float32).reshape(()) for s in scores])


def _score_new_size(answer: Callable[..., Any], args: tuple) -> Any:
    return answer(code.stream_batches([unseen(answer, NEW_ROWS)], seed=1)[0])  # a batch of a new size


register(Exercise(
    name="method-3", title="One shape for every batch", part="Method", page=PAGE,
    skill="pad to one shape, so that jit compiles once", minutes=20,
    arguments=_batches, reference=code.score_padded, start=code.score_each_shape, run=_score_stream,
    probe=_score_new_size,
    # float32 sums of a few hundred log-sum-exps, in other orders: a few ulps (3e-7 measured); a row
    # left out or a padded row counted moves a score by 1e-4 or more (tests/test_exercises_method.py)
    same=lambda got, want: same_arrays(got, want, rtol=1e-5, what="the scores of the batches"),
    wrong_hint="the padded rows must count for nothing: leave them out of the sum (jnp.where with a mask of the "
               "first `rows` rows) and divide by the true number of rows, not by MAX_ROWS",
    slow_hint="a batch with a new number of rows is a new shape, and jit traces and compiles again; pad every "
              "batch to MAX_ROWS rows on the host and pass the number of rows as an argument",
    witness=("compiles",),
    repeats=3,
))


# ---------------------------------------------------------------- method-4: a fair race

STAND_INS = (0.012, 0.002)  # seconds that the slow and the fast stand-in program wait per call: ratio 6


def _waiting(seconds: float) -> Callable[[Any], Any]:
    def program(x: Any) -> Any:
        time.sleep(seconds)
        return x
    return program


class _Kept:
    """A stand-in that keeps how long each of its calls took, the busy machine's interruptions included."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.took = fn, []

    def __call__(self, x: Any) -> Any:
        t0 = time.perf_counter()
        out = self.fn(x)
        self.took.append(time.perf_counter() - t0)
        return out


def _busy_stand_ins() -> tuple:
    """The two stand-in programs on a fresh machine of the page's kind that only interrupts (every fifth
    call, 0.1 s) and does not drift, and no input: it tells a race with medians from one with means."""
    machine = code.BusyMachine(slowdown=0.0, every=5, interruption=0.1)
    return (_Kept(machine.wrap(_waiting(STAND_INS[0]))), _Kept(machine.wrap(_waiting(STAND_INS[1]))), None)


def _race_and_truth(answer: Callable[..., Any], args: tuple) -> tuple:
    """What the race says, and the ratio of the medians of what the stand-ins' calls took meanwhile (None
    where it made none)."""
    ratio = answer(*args)
    slow, fast = args[0].took, args[1].took
    return ratio, (float(np.median(slow) / np.median(fast)) if slow and fast else None)


register(Exercise(
    name="method-4", title="A fair race on a busy machine", part="Method", page=PAGE,
    skill="compare two programs in turns, with medians", minutes=20,
    arguments=_busy_stand_ins, reference=code.speedup_in_turns, same=_same_race, start=None, timed=False,
    run=_race_and_truth,
    wrong_hint="time one call of each program per round, the two in turns, for at least five rounds, and divide "
               "the medians, not the means: an interruption pulls a mean (the check's machine interrupts every "
               "fifth call; it checks the medians, and the page shows why the turns matter)",
))
