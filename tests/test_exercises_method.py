"""The Method practice page's self-checks (fastjax.exercises.method): for each exercise a right answer
passes, plausible mistakes are named, and the starting program is caught (wrong for a timer, slow
for a program). Right answers are checked without a race; slow ones with one round."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import fastjax  # noqa: F401
from fastjax import exercises as ex
from fastjax.exercises import method_code as code
from fastjax.tools import timing

COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: COMPILES.append(event) if event == ex.COMPILE_EVENT else None)


def compiles_during(call) -> int:
    """XLA compilations while ``call()`` runs."""
    before = len(COMPILES)
    jax.block_until_ready(call())
    return len(COMPILES) - before


# ---------------------------------------------------------------- method-1 and method-2: timers

def harness_timer(fn, x):
    """A second right timer: the book's harness, one waited call per repeat (a Timing; the check reads its
    median). With its default, several calls per repeat, each repeat is a mean of those calls."""
    return timing.time_per_call(fn, x, repeats=5, number=1)


def perf_counter_ns_timer(fn, x, repeats=9):
    """A third right timer, written another way: nanoseconds, .block_until_ready(), statistics.median."""
    import statistics
    import time

    fn(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(x).block_until_ready()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    return statistics.median(times)


def mean_waiting_only_after_the_last_call(fn, x, calls=10):  # issue 38: was accepted
    import time

    jax.block_until_ready(fn(x))
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn(x)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls


def mean_of_waited_calls(fn, x, calls=7):
    import time

    jax.block_until_ready(fn(x))
    seconds = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        seconds.append(time.perf_counter() - t0)
    return float(np.mean(seconds))


def milliseconds(fn, x):
    return code.seconds_per_call(fn, x) * 1e3


def total_of_waited_calls(fn, x, calls=10):
    import time

    jax.block_until_ready(fn(x))
    t0 = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(fn(x))
    return time.perf_counter() - t0


def test_method_1_a_waited_timer_is_right_and_one_that_does_not_wait_is_far_too_low():
    for right in (code.seconds_per_call, harness_timer, perf_counter_ns_timer):
        report = ex.check("method-1", right)
        assert report.right and report.passed, (right.__name__, report.text())
        assert report.seconds is None  # a timer is checked, not raced
    report = ex.check("method-1", code.seconds_per_call_no_wait)
    assert not report.right and "waited for 0 of its 11 calls" in report.problem, report.text()
    assert "block_until_ready" in report.text()


def test_method_1_the_fake_program_tells_waiting_per_call_and_a_median_from_the_mistakes():
    # deterministic: the fake program counts the waits, and its outlier (every 4th call, 20x) moves a mean 5.75x
    report = ex.check("method-1", mean_waiting_only_after_the_last_call)
    assert not report.right and "(only the last one)" in report.problem, report.text()
    report = ex.check("method-1", mean_of_waited_calls)
    assert not report.right and "A mean" in report.problem and "median" in report.problem, report.text()
    report = ex.check("method-1", milliseconds)
    assert not report.right and "Units?" in report.problem, report.text()
    report = ex.check("method-1", total_of_waited_calls)
    assert not report.right and "A total, not per call" in report.problem, report.text()


def test_method_2_a_timer_that_includes_the_compile_is_far_too_high():
    assert ex.check("method-2", code.seconds_per_call).right
    report = ex.check("method-2", code.seconds_per_call_first_included)
    assert not report.right and "too high" in report.problem and "compile" in report.problem
    report = ex.check("method-2", code.seconds_per_call_no_wait)  # warm, but does not wait
    assert not report.right and "waited for 0 of its" in report.problem


def test_a_timer_that_returns_no_number_or_raises_gets_one_line():
    report = ex.check("method-1", lambda fn, x: "fast")
    assert not report.right and "must be a number" in report.problem
    report = ex.check("method-1", lambda fn, x: 0.0)
    assert not report.right and "positive" in report.problem
    report = ex.check("method-1", lambda fn, x: fn(x[:3]))  # a plausible typo: raises inside the timer
    assert not report.right and report.problem.startswith("Your answer raised") and "Traceback" not in report.text()


def test_method_2_hands_the_timer_a_function_that_compiles_at_its_first_call():
    fn, x = ex.get("method-2").arguments()
    assert compiles_during(lambda: fn(x)) > 0  # a new function: it compiles, so a timer that times it shows it
    assert compiles_during(lambda: fn(x)) == 0


# ---------------------------------------------------------------- method-3: one shape for every batch

def padded_wrong_divisor(batch):  # a plausible mistake: the mean over all MAX_ROWS rows
    padded, rows = code.pad(batch)
    return jnp.mean(jnp.where(jnp.arange(code.MAX_ROWS) < rows, code.logsumexp_rows(padded), 0.0))


def padded_unmasked(batch):  # another: the padded zero rows counted in the sum (their score is log 64)
    padded, rows = code.pad(batch)
    return jnp.sum(code.logsumexp_rows(padded)) / rows


def test_method_3_padding_to_one_shape_is_right_and_compiles_once():
    assert ex.check("method-3", code.score_padded, time_it=False).right
    exercise = ex.get("method-3")
    compiles_during(lambda: exercise.run(code.score_padded, exercise.arguments()))  # warm
    # each run scores a batch of a size it has not seen: one shape for all, so nothing compiles
    assert compiles_during(lambda: exercise.run(code.score_padded, exercise.arguments())) == 0


def test_method_3_scores_that_count_padded_rows_are_named_and_far_outside_the_tolerance():
    want = np.asarray(ex.get("method-3").run(code.score_padded, ex.get("method-3").arguments()))
    for wrong in (padded_wrong_divisor, padded_unmasked):
        report = ex.check("method-3", wrong, time_it=False)
        assert not report.right and "differ from the reference's" in report.problem, wrong.__name__
        got = np.asarray(ex.get("method-3").run(wrong, ex.get("method-3").arguments()))
        # what the page's tolerance comment says: such a mistake moves some score by 1e-4 or more (relative)
        assert np.max(np.abs(got / want - 1)) >= 1e-4


def test_method_3_the_starting_program_compiles_for_every_new_batch_size():
    report = ex.check("method-3", code.score_each_shape, repeats=1)
    assert report.right and report.retraces and report.slow, report.text()
    assert report.start_seconds == report.seconds  # the starting program as the answer is raced once
    assert "(jit(mean_score))" in report.text() and "pad every batch" in report.text()


def padded_without_jnp_where(batch):  # right, written another way: a 0/1 weight per row, jitted once
    padded, rows = code.pad(batch)
    return _weighted_mean(padded, rows)


@jax.jit
def _weighted_mean(padded, rows):
    weight = (jnp.arange(code.MAX_ROWS) < rows).astype(jnp.float32)
    return jnp.sum(weight * code.logsumexp_rows(padded)) / rows


def test_method_3_right_answers_written_another_way_pass_on_their_structure():
    for right in (code.score_padded, padded_without_jnp_where):
        report = ex.check("method-3", right, repeats=1)
        assert report.right and not report.retraces and report.compiles == 0, report.text()
        assert not report.slow or report.by_time == "slow", report.text()  # only time could say slow


# ---------------------------------------------------------------- method-4: a fair race

def test_method_4_a_race_in_turns_with_medians_is_right():
    assert ex.check("method-4", code.speedup_in_turns).right

    def with_the_harness(slow, fast, x):  # the book's harness, one call per round
        t = timing.time_interleaved({"slow": lambda: slow(x), "fast": lambda: fast(x)}, repeats=9, min_repeat_seconds=0)
        return t["slow"].median / t["fast"].median

    report = ex.check("method-4", with_the_harness)
    assert report.right, report.text()


def means_in_turns(slow, fast, x, rounds=9):  # in turns, but means: the interruptions pull them
    t = timing.time_interleaved({"slow": lambda: slow(x), "fast": lambda: fast(x)}, repeats=rounds, min_repeat_seconds=0)
    return np.mean(t["slow"].seconds) / np.mean(t["fast"].seconds)


def test_method_4_races_with_means_are_wrong():
    for wrong in (code.speedup_one_after_other, means_in_turns):
        report = ex.check("method-4", wrong)
        assert not report.right and "a fair race lands within" in report.problem, (wrong.__name__, report.text())
