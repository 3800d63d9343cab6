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
    assert "computes the same" in report.text() and "Next to the starting program, yours is" in report.text()


def test_a_wrong_answer_is_named_with_the_worst_value(toy):
    report = ex.check("method-toy", jax.jit(lambda x: jnp.sum(jnp.sin(x) ** 2) * 1.01))
    assert not report.right and not report.passed
    assert "differ from the reference's" in report.problem and "compare with the starting program" in report.text()
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

    report = ex.check("method-toy", retracing, repeats=1)
    assert report.right and report.retraces and report.slow and not report.passed
    assert report.compiles == 1 and report.structural_misses == ["compiles"]  # counted on one call, not timed
    assert "your programs compiled 1 time(s) (jit(<lambda>))" in report.text()
    assert "put it under jax.jit" in report.text()


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


# ---------------------------------------------------------------- the structural witnesses (issue 38)

def test_eager_operations_outside_jit_are_not_counted_as_the_answers_compilations():
    f = jax.jit(lambda x: x * 2 + 1)
    x = jnp.arange(50.0)
    f(x)

    def sliced(k):  # a jitted program, then an eager slice of a new length: JAX compiles the slice per shape
        return f(x)[:k]

    ex._Compiles.start()
    before, own = ex._Compiles.count, ex._Compiles.own
    jax.block_until_ready((sliced(7), jnp.stack([x, x[::-1]])[:, :9]))
    assert ex._Compiles.count - before >= 1  # JAX compiled its eager operations...
    assert ex._Compiles.own - own == 0  # ...none of them a program of the answer's own
    g = jax.jit(lambda y, k: y[:k], static_argnums=1)
    before = ex._Compiles.own
    jax.block_until_ready(g(x, 11))
    assert ex._Compiles.own - before == 1 and ex._Compiles.own_names[-1] == "jit(<lambda>)"


def test_host_reads_are_counted_however_python_reads_the_value():
    f = jax.jit(lambda x: x * 2)
    x = jnp.arange(4.0)
    reads = {
        "float": lambda: float(f(x)[1]), "bool": lambda: bool(f(x)[1] > 0), "item": lambda: f(x)[1].item(),
        "asarray": lambda: np.asarray(f(x)), "array": lambda: np.array(f(x)), "tolist": lambda: f(x).tolist(),
        "device_get": lambda: jax.device_get(f(x)),
    }
    for what, read in reads.items():
        with ex._HostReads.counting():
            before = ex._HostReads.count
            read()
            assert ex._HostReads.count - before == 1, what
    with ex._HostReads.counting():
        before = ex._HostReads.count
        jax.block_until_ready(f(f(x)))  # waiting is not a read
        np.asarray(np.ones(3))  # NumPy's own arrays are not counted
        assert ex._HostReads.count == before
    assert float(f(x)[1]) == 2.0  # and the wrapping is undone


def test_a_host_read_is_named_whatever_the_clock_says(toy, monkeypatch):
    exercise = ex.Exercise(**{**toy.__dict__, "name": "method-toy2", "witness": ("host reads",),
                              "slow_hints": {"host reads": "no float() of the sum"}})
    monkeypatch.setitem(ex.REGISTRY, exercise.name, exercise)

    def reads_then_jits(x):
        total = float(reference(x))  # right, and fast, but Python waits for the value
        return jnp.float32(total)

    report = ex.check("method-toy2", reads_then_jits, repeats=1)
    assert report.right and report.slow and not report.passed and report.structural_misses == ["host reads"]
    assert report.host_reads == 1 and report.reference_structure.host_reads == 0
    assert "Python read a device value 1 time(s)" in report.text() and "no float() of the sum" in report.text()


def report_of(seconds, reference, start, witness=()):
    """A Report as check makes it, with the timings given (the verdict by time is a pure function of them)."""
    report = ex.Report("method-toy", right=True, seconds=seconds, reference_seconds=reference, start_seconds=start,
                       structure=ex.Structure(0, 0), reference_structure=ex.Structure(0, 0), witness=witness)
    report.by_time = ex._by_time(report)
    return report


def test_time_that_cannot_tell_the_reference_from_the_start_says_so():
    # the start only 1.3x the reference: time alone cannot judge, and says so instead of PASSED
    report = report_of(1.25e-3, 1e-3, 1.3e-3)
    assert report.by_time == "cannot tell" and report.undecided and not report.passed and not report.slow
    assert "CANNOT TELL ON THIS MACHINE" in report.text() and "only 1.30x faster" in report.text()
    # where the lesson is structural, the counts decide, and the line says so
    report = report_of(1.25e-3, 1e-3, 1.3e-3, witness=("host reads",))
    assert report.passed and "the verdict rests on what was counted" in report.text()


def test_the_limit_is_the_geometric_middle_of_the_reference_and_the_start():
    # limit sqrt(4) = 2: fine up to 2 / 1.25, slow above 2 x 1.25, close to the limit in between
    assert report_of(1.55e-3, 1e-3, 4e-3).by_time == "fine" and report_of(2.55e-3, 1e-3, 4e-3).by_time == "slow"
    assert report_of(1.9e-3, 1e-3, 4e-3).by_time == "close" and report_of(2.1e-3, 1e-3, 4e-3).by_time == "close"
    assert report_of(2.3e-3, 1e-3, 100e-3).by_time == "fine" and report_of(3.8e-3, 1e-3, 100e-3).by_time == "slow"
    assert report_of(1e-3, 1e-3, 3.2e-3).limit >= ex.SLOW_FACTOR  # never below SLOW_FACTOR


def test_an_answer_slower_than_the_start_reads_n_times_slower_never_zero():
    report = report_of(20e-3, 1e-3, 1e-3 * 3.5)
    assert "yours is 5.7x slower" in report.text() and "0.0x" not in report.text()
    assert ex.times_slower(1.0, 3.0) == "3.0x faster" and ex.times_slower(3.0, 1.0) == "3.0x slower"


# ---------------------------------------------------------------- same_arrays

def test_same_arrays_rejects_another_dtype_kind_and_any_nan():
    f32 = np.array([1.0, 2.0], np.float32)
    ex.same_arrays(f32.astype(np.float64), f32, rtol=1e-6)  # another precision, the same kind: fine
    with pytest.raises(AssertionError, match="integer values"):
        ex.same_arrays(np.array([1, 2]), f32, rtol=1e-6)
    with pytest.raises(AssertionError, match="bool values"):
        ex.same_arrays(np.array([True, True]), np.ones(2, np.float32), rtol=1e-6)
    nan = np.array([np.nan, 1.0], np.float32)
    with pytest.raises(AssertionError, match="NaN never agrees"):
        ex.same_arrays(nan, nan, rtol=1e-6)
    with pytest.raises(AssertionError, match="NaN"):
        ex.same_arrays(nan, np.array([1.0, 1.0], np.float32), rtol=1e-6)
    inf = np.array([np.inf, 1.0], np.float32)
    ex.same_arrays(inf, inf, rtol=1e-6)  # the same infinity agrees
    with pytest.raises(AssertionError, match="infinity"):
        ex.same_arrays(-inf, inf, rtol=1e-6)


def test_a_timed_check_outside_a_checkout_writes_nothing_into_the_current_folder(toy, tmp_path, monkeypatch):
    monkeypatch.delenv("FASTJAX_MEASUREMENTS", raising=False)
    monkeypatch.chdir(tmp_path)  # no _toc.yml at or above it
    ex.check("method-toy", reference, repeats=1)
    assert list(tmp_path.iterdir()) == [] and ex.recorded() == {}


def raced(yours, reference, start):
    """A Report whose race kept these rounds (seconds per call), its verdict by time made as check makes it."""
    from fastjax.tools.timing import Timing

    timings = {"yours": Timing("yours", yours), "reference": Timing("reference", reference),
               "start": Timing("start", start)}
    report = ex.Report("method-toy", right=True, seconds=float(np.median(yours)),
                       reference_seconds=float(np.median(reference)), start_seconds=float(np.median(start)),
                       structure=ex.Structure(0, 0), reference_structure=ex.Structure(0, 0), timings=timings)
    report.by_time = ex._by_time(report)
    return report


def test_time_judges_by_rounds_so_that_one_noisy_round_cannot_give_a_verdict():
    ref = [1.0, 1.0, 1.1]
    assert raced([1.0, 1.1, 1.0], ref, [9.0, 10.0, 11.0]).by_time == "fine"
    assert raced([9.0, 10.0, 9.5], ref, [9.0, 10.0, 11.0]).by_time == "slow"
    # one slow round of the reference (4x) does not stop a far slower answer from being named slow...
    assert raced([8.0, 10.0, 9.5], [1.0, 4.0, 1.1], [9.0, 10.0, 11.0]).by_time == "slow"
    # ...and one slow round of a right answer does not make it slow
    assert raced([1.0, 3.9, 1.1], ref, [9.0, 10.0, 11.0]).by_time == "fine"
    # medians 2.5x apart: time cannot tell the reference from the start
    assert raced([1.0, 1.0, 1.0], ref, [2.4, 2.5, 3.6]).by_time == "cannot tell"
    # the answer's median is above the limit and its band, but one of its rounds is not: neither slow nor fine
    report = raced([1.2, 4.0, 4.1], ref, [9.0, 10.0, 11.0])
    assert report.by_time == "cannot tell" and "fall on both sides" in report.text()


# ---------------------------------------------------------------- no verdict on the line; messages that fit

def test_an_answer_within_a_quarter_of_the_limit_is_close_to_it_neither_passed_nor_slow():
    for seconds in (1.7e-3, 2.0e-3, 2.4e-3):  # limit 2 (start 4x the reference): the band is 1.6 to 2.5
        report = report_of(seconds, 1e-3, 4e-3)
        assert report.close and not report.passed and not report.slow and not report.undecided, seconds
        text = report.text()
        assert "CLOSE TO THE LIMIT" in text and "What to look at" not in text and "time_interleaved" in text


def test_cannot_tell_says_what_was_measured_and_how_to_time_it_by_hand_never_a_fix():
    report = report_of(1.25e-3, 1e-3, 1.3e-3)
    report.hint = "take nnx.split out of the loop"
    text = report.text()
    assert "CANNOT TELL" in text and "only 1.30x faster" in text and "yours 1.25 ms" in text
    assert "What to look at" not in text and "nnx.split" not in text and "quieter machine" not in text
    cell = ex.timing_cell("method-toy").splitlines()
    assert len(cell) == 3 and "time_interleaved" in cell[1] and "my_answer" in cell[1]


def test_time_never_decides_where_a_trace_witness_was_counted():
    same = ex.Structure(0, 0, traced={"programs": 3})
    report = ex.Report("method-toy", right=True, seconds=9e-3, reference_seconds=1e-3, start_seconds=10e-3,
                       structure=same, reference_structure=same, witness=("programs",))
    report.by_time = ex._by_time(report)
    assert report.by_time == "slow" and report.passed and "second opinion" in report.text()
    more = ex.Structure(0, 0, traced={"programs": 6})  # twice the reference's: too many
    report.structure = more
    assert report.slow and report.structural_misses == ["programs"]
    # a few more than the reference's, under TRACE_FACTOR times: a right answer written another way
    report.structure = ex.Structure(0, 0, traced={"programs": 5})
    assert report.passed
    # not counted (no trace could be taken): time decides again
    report.structure = report.reference_structure = ex.Structure(0, 0)
    assert report.counted == () and report.slow


def test_each_hint_fires_on_what_was_counted():
    hints = {"compiles": "the recompile hint", "programs": "the dispatch hint", "time": "the time hint"}
    recompiles = ex.Structure(1, 0, ("jit(f)",), traced={"programs": 3})
    clean = ex.Structure(0, 0, traced={"programs": 3})
    report = ex.Report("method-toy", right=True, structure=recompiles, reference_structure=clean,
                       witness=("compiles", "programs"), hint="slow", hints=hints)
    assert "the recompile hint" in report.text() and "the dispatch hint" not in report.text()
    report.structure = ex.Structure(0, 0, traced={"programs": 30})
    assert "the dispatch hint" in report.text() and "the recompile hint" not in report.text()


def test_the_busy_machine_note_is_shown_once_per_session(monkeypatch):
    from fastjax.tools.timing import Timing

    monkeypatch.setattr(ex, "_NOISE_SHOWN", False)
    monkeypatch.setattr(Timing, "noise", property(lambda self: "2 other processes kept the CPU busy"))
    report = raced([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [9.0, 10.0, 11.0])
    assert "The timings may be off" in report.text()
    assert "The timings may be off" not in report.text() and "The timings may be off" not in report.text()


# ---------------------------------------------------------------- counting what one call runs

_step = jax.jit(lambda x: jnp.tanh(x @ x.T) @ x)


def _loop_of_jitted_calls(x):
    for _ in range(6):
        x = _step(x)
    return x


@jax.jit
def _scanned(x):
    return jax.lax.scan(lambda c, _: (_step(c), None), x, None, length=6)[0]


@jax.jit
def _unrolled(x):
    return jax.lax.scan(lambda c, _: (_step(c), None), x, None, length=6, unroll=True)[0]


def test_a_trace_counts_the_programs_a_call_dispatches_and_the_loops_they_run():
    x = jnp.ones((8, 8)) / 8
    for fn in (_loop_of_jitted_calls, _scanned, _unrolled):
        fn(x).block_until_ready()
    loop, scan, unrolled = (ex._trace_counts(lambda fn=fn: fn(x)) for fn in (_loop_of_jitted_calls, _scanned, _unrolled))
    assert loop["programs"] == 6 and loop["loops"] == 0  # one program per step, no loop in any
    assert scan["programs"] == 1 and scan["loops"] == 1  # one program, one rolled loop
    assert unrolled["programs"] == 1 and unrolled["loops"] == 0  # one program, the loop unrolled
    eager = ex._trace_counts(lambda: x + 1)  # an operation outside jit is a program too
    assert eager["programs"] == 1
    assert loop["python calls"] > 0  # the Python tracer saw the loop


def test_the_private_jax_access_lives_in_one_module_and_works_on_this_jax():
    from fastjax.exercises import _jax_private

    assert isinstance(_jax_private.array_class().__dict__["_value"], property)
    seen = []
    ex._Compiles.start()

    def listener(event, duration, **kwargs):
        if event == ex.COMPILE_EVENT:
            seen.append(_jax_private.outermost_jitted_function())

    jax.monitoring.register_event_duration_secs_listener(listener)

    def my_function(x):
        return x * 3

    jax.jit(my_function)(jnp.arange(3.0))
    assert any(getattr(f, "__name__", "") == "my_function" for f in seen if f is not None)
    # nothing else in the package reaches into JAX's private modules
    import pathlib

    package = pathlib.Path(ex.__file__).parent
    reaching = [p.name for p in package.glob("*.py") if "jax._src" in p.read_text() and p.name != "_jax_private.py"]
    assert reaching == []


def test_a_count_the_trace_cannot_show_is_left_out_and_time_decides(monkeypatch):
    from fastjax.tools import profiling

    real = profiling.read_trace  # as on a device whose runtime does not name the instruction of each event
    monkeypatch.setattr(profiling, "read_trace", lambda path: [{**e, "args": {}} for e in real(path)])
    x = jnp.ones((8, 8)) / 8
    _scanned(x).block_until_ready()
    counts = ex._trace_counts(lambda: _scanned(x))
    assert counts["programs"] == 1 and "loops" not in counts and "convolutions" not in counts
    report = ex.Report("method-toy", right=True, structure=ex.Structure(0, 0, traced=counts),
                       reference_structure=ex.Structure(0, 0, traced=counts), witness=("loops",))
    assert report.counted == () and "Not counted here: loops" in report.text()
