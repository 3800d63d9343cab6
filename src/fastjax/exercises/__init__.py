"""Self-checks for the book's exercises: ``check(name, answer)`` says, in plain words, whether an
answer computes the right thing and how fast it runs next to the reference solution, on this machine.

Each part registers its exercises in a module of this package (``method``, ``pln``, ``resnet``,
``tools``, ``scale``, ``floor``, ``capstone``), loaded when one of its exercises is first asked for.
An :class:`Exercise` says how to build fresh arguments for one call (``arguments``), how to run an
answer on them (``run``; by default ``answer(*arguments)``), the reference solution and the program
the participant starts from (both written in the exercise's page), and how to compare a result with
the reference's (``same``, which raises ``AssertionError`` with a message in plain words).

``check`` runs the answer once and compares its result with the reference's; a function that raises,
returns the wrong shape or the wrong numbers gets a short message, never a stack trace. Then it times
the answer, the reference and the starting program in turns (medians of ``repeats`` rounds) and counts
the XLA compilations that happen during that race (its warm-up calls included): after the first call a
fast answer compiles nothing, so a count above zero means the answer retraces on every call.

    from fastjax import exercises
    exercises.check("pln-1", my_fit)          # a Report: right or not, how fast, what to look at

Each check, and each solution that calls ``record``, leaves the seconds it took in the build's
measurements folder (``fastjax.bench.measurements_dir()``), so that the workshop page can show how long
every exercise keeps the machine busy (``recorded``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from fastjax.tools import timing

# A part's prefix in an exercise's name -> the module of this package that registers its exercises.
PARTS = {"method": "method", "pln": "pln", "resnet": "resnet", "tools": "tools", "scale": "scale",
         "floor": "floor", "capstone": "capstone"}
# An answer counts as slow when its median passes the reference's by this factor. Two timings of the
# same program taken in turns on a quiet 2-core CPU differ by up to about 20 % (medians of 5 rounds,
# chapters/measuring.md); 1.5 leaves room for that and for a busy machine's noise, and still names an
# answer that misses the step the exercise is about (those are 2x or more slower).
SLOW_FACTOR = 1.5
# Each round of the race calls a program enough times to last this long (a single call of a fast program
# lasts microseconds, below the clock's and the scheduler's noise); a slow program is called once.
MIN_ROUND_SECONDS = 0.02
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # recorded by JAX once per XLA compilation


def _default_run(answer: Callable[..., Any], args: tuple) -> Any:
    return answer(*args)


@dataclass(frozen=True)
class Exercise:
    """One exercise: what it trains, how to call an answer, the reference, and how to compare."""

    name: str  # "pln-1": part prefix, number
    title: str  # a few words: "Remove the retrace"
    part: str  # "Part I"
    page: str  # the page that poses it, as _toc.yml names it: "chapters/pln/08-practice"
    skill: str  # what it trains: "remove a retrace"
    minutes: int  # the time a participant needs: an estimate, labelled as one wherever it is shown
    arguments: Callable[[], tuple]  # fresh arguments for one call, the same for every program
    reference: Callable[..., Any]  # the reference solution
    same: Callable[[Any, Any], None]  # raises AssertionError (plain words) when got differs from want
    start: Callable[..., Any] | None = None  # the program the participant starts from
    run: Callable[[Callable[..., Any], tuple], Any] = _default_run  # how an answer is called
    wrong_hint: str = ""  # what to look at when the result is wrong
    slow_hint: str = ""  # what to look at when it is right but slow
    slow_factor: float = SLOW_FACTOR
    repeats: int = 5  # rounds of the timing race
    # False where the answer is itself a measurement (a timer, as on the Method page): its result is
    # checked against the reference's, and it is not raced (a timer's own speed is not the point)
    timed: bool = True


REGISTRY: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    """Add ``exercise`` to the registry (a part's module calls this); return it."""
    if exercise.name in REGISTRY and REGISTRY[exercise.name] is not exercise:
        raise ValueError(f"two exercises are called {exercise.name!r}")
    prefix = exercise.name.split("-")[0]
    if prefix not in PARTS:
        raise ValueError(f"exercise {exercise.name!r}: its name must start with one of {sorted(PARTS)} and a '-'")
    REGISTRY[exercise.name] = exercise
    return exercise


def _load(prefix: str) -> None:
    module = f"fastjax.exercises.{PARTS[prefix]}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:  # a missing library inside the part's module is a real error
            raise


def get(name: str) -> Exercise:
    """The exercise called ``name`` (e.g. ``"pln-1"``); a ValueError listing the names when none is."""
    if not isinstance(name, str):
        raise TypeError(f"an exercise's name is a string such as 'pln-1'; got {type(name).__name__}")
    prefix = name.split("-")[0]
    if prefix in PARTS:
        _load(prefix)
    if name not in REGISTRY:
        known = ", ".join(e.name for e in all_exercises()) or "none"
        raise ValueError(f"no exercise is called {name!r}; the exercises are: {known}")
    return REGISTRY[name]


def all_exercises(part_prefix: str | None = None) -> list[Exercise]:
    """Every registered exercise (of one part prefix, e.g. ``"pln"``), each part's module loaded."""
    prefixes = [part_prefix] if part_prefix else list(PARTS)
    for prefix in prefixes:
        if prefix not in PARTS:
            raise ValueError(f"part must be one of {sorted(PARTS)}; got {prefix!r}")
        _load(prefix)
    return [e for e in REGISTRY.values() if part_prefix is None or e.name.split("-")[0] == part_prefix]


# ---------------------------------------------------------------- comparing results

def same_arrays(got: Any, want: Any, rtol: float, atol: float = 0.0, what: str = "the result") -> None:
    """Raise AssertionError, in plain words, unless the pytrees ``got`` and ``want`` have the same
    structure, shapes and dtypes kinds, and values within ``rtol``/``atol`` (NaN never agrees)."""
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    if got_def != want_def:
        raise AssertionError(f"{what} has the wrong structure: {len(got_leaves)} arrays "
                             f"({_shape_of(got)}) where the reference returns {len(want_leaves)} ({_shape_of(want)})")
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        where = what if len(want_leaves) == 1 else f"{what}, array {i}"
        if g.shape != w.shape:
            raise AssertionError(f"{where} has shape {g.shape}; the reference's has shape {w.shape}")
        if not np.all(np.isfinite(g[np.isfinite(w)])):
            raise AssertionError(f"{where} holds NaN or infinity where the reference's is finite")
        gap = np.abs(g.astype(np.float64) - w.astype(np.float64))
        allowed = atol + rtol * np.abs(w.astype(np.float64))
        bad = gap > allowed
        if np.any(bad):
            idx = tuple(int(k) for k in np.unravel_index(int(np.argmax(gap - allowed)), gap.shape)) if gap.ndim else ()
            raise AssertionError(f"{where} differs from the reference: {np.count_nonzero(bad)} of {gap.size} "
                                 f"values off (worst at {idx}: {g[idx]!r} against {w[idx]!r}; "
                                 f"allowed rtol {rtol:g}, atol {atol:g})")


def _shape_of(tree: Any) -> str:
    return ", ".join(str(getattr(leaf, "shape", type(leaf).__name__)) for leaf in jax.tree.leaves(tree)) or "nothing"


# ---------------------------------------------------------------- counting compilations

class _Compiles:
    """How many XLA compilations JAX has recorded in this process since the listener was added."""

    count = 0
    listening = False

    @classmethod
    def start(cls) -> None:
        if not cls.listening:
            jax.monitoring.register_event_duration_secs_listener(cls._heard)
            cls.listening = True

    @classmethod
    def _heard(cls, event: str, duration: float, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            cls.count += 1


def compiles_during(fn: Callable[[], Any]) -> int:
    """How many XLA compilations happen while ``fn()`` runs and its result is made ready (0 for a
    program that was compiled before and does not retrace)."""
    _Compiles.start()
    before = _Compiles.count
    timing.block(fn())
    return _Compiles.count - before


def compiles_on_a_second_run(name: str, answer: Callable[..., Any]) -> int:
    """XLA compilations of a second run of ``answer`` on fresh arguments of exercise ``name`` (the first
    run compiles; a good answer compiles nothing more)."""
    exercise = get(name)
    _Compiles.start()
    timing.block(exercise.run(answer, exercise.arguments()))
    return compiles_during(lambda: exercise.run(answer, exercise.arguments()))


def _counting(fn: Callable[[], Any], tally: dict[str, int], key: str) -> Callable[[], Any]:
    def call() -> Any:
        before = _Compiles.count
        out = fn()
        timing.block(out)
        tally[key] += _Compiles.count - before
        return out

    return call


# ---------------------------------------------------------------- the check

@dataclass
class Report:
    """What ``check`` found: ``right`` (the result agrees with the reference), the medians (seconds
    per call) of the answer, the reference and the starting program, and compilations while timed."""

    name: str
    right: bool
    problem: str = ""  # why the answer is wrong, in plain words ("" when right)
    seconds: float | None = None
    reference_seconds: float | None = None
    start_seconds: float | None = None
    compiles: int = 0  # XLA compilations during the answer's timed calls (0 for a good answer)
    slow_factor: float = SLOW_FACTOR
    hint: str = ""
    timings: dict[str, timing.Timing] = field(default_factory=dict, repr=False)

    @property
    def ratio(self) -> float | None:
        """The answer's median over the reference's (below 1: faster than the reference)."""
        if self.seconds is None or not self.reference_seconds:
            return None
        return self.seconds / self.reference_seconds

    @property
    def retraces(self) -> bool:
        """The answer compiled again while it was timed."""
        return self.compiles > 0

    @property
    def slow(self) -> bool:
        """Right, but slower than ``slow_factor`` times the reference, or retracing."""
        return self.right and (self.retraces or (self.ratio is not None and self.ratio > self.slow_factor))

    @property
    def passed(self) -> bool:
        """Right, not retracing, and within ``slow_factor`` of the reference's time."""
        return self.right and not self.slow

    def text(self) -> str:
        """The report in plain words."""
        lines = [f"Exercise {self.name}: " + ("PASSED" if self.passed else "RIGHT, BUT SLOW" if self.right else "NOT RIGHT YET")]
        if not self.right:
            lines.append(f"  {self.problem}")
        else:
            lines.append("  Your answer computes the same as the reference solution.")
        if self.seconds is not None:
            lines.append(f"  Median per call, timed in turns on this machine: yours {timing.format_seconds(self.seconds)}, "
                         f"the reference {timing.format_seconds(self.reference_seconds)}"
                         + (f", the starting program {timing.format_seconds(self.start_seconds)}"
                            if self.start_seconds is not None else "")
                         + f" (yours / reference: {self.ratio:.2f}).")
            if self.start_seconds is not None and self.seconds > 0:
                lines.append(f"  Your speed-up over the starting program: {self.start_seconds / self.seconds:.1f}x.")
        if self.retraces:
            lines.append(f"  Your answer compiled {self.compiles} more time(s) in the race (its warm-up calls "
                         "included): something makes JAX "
                         "trace it again on every call (a new function or closure each call, a Python value that "
                         "changes, an argument whose shape or dtype changes). tools/02-compile-time shows how to find it.")
        elif self.right and self.ratio is not None and self.ratio > self.slow_factor:
            lines.append(f"  It is more than {self.slow_factor:g}x the reference's time.")
        noisy = [t.noise for t in self.timings.values() if t.noise]
        if noisy:
            lines.append(f"  The timings may be off: {noisy[0]}. Run the check again on a quiet machine.")
        if self.hint and not self.passed:
            lines.append(f"  What to look at: {self.hint}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()


def _failure(err: BaseException) -> str:
    """One line for an exception raised by the participant's code: its class, message, and the last
    line of the participant's own code that it passed through (not JAX's internals)."""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    own = [f for f in traceback.extract_tb(err.__traceback__)
           if "site-packages" not in f.filename and "fastjax/exercises" not in f.filename.replace("\\", "/")]
    where = f" (at {own[-1].filename.split('/')[-1]}, line {own[-1].lineno}: {own[-1].line})" if own else ""
    return f"{type(err).__name__}: {message[:300]}{where}"


def record(name: str, what: str, seconds: float) -> None:
    """Keep the seconds that ``what`` ("check" or "solution") of exercise ``name`` took on this machine,
    for the workshop page. A folder that cannot be written is skipped: the record is a convenience."""
    from fastjax.bench import measurements_dir

    folder = measurements_dir() / "exercises"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.json"
        data = json.loads(path.read_text()) if path.is_file() else {}
        data[what] = float(seconds)
        path.write_text(json.dumps(data))
    except (OSError, ValueError):
        pass


def recorded() -> dict[str, dict[str, float]]:
    """The seconds kept by ``record``: ``{exercise name: {"check": s, "solution": s}}``."""
    from fastjax.bench import measurements_dir

    out = {}
    for path in sorted((measurements_dir() / "exercises").glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


def _same_program(answer: Callable[..., Any], start: Callable[..., Any]) -> bool:
    """Whether ``answer`` is the starting program: the same object, or a function of the same name and
    source (a page's own copy of it, which the page's generated module holds too)."""
    if answer is start:
        return True
    if not (inspect.isfunction(answer) and inspect.isfunction(start)):  # a jax.jit of the same function with
        return False                                                       # other options has its source too
    try:
        return answer.__qualname__ == start.__qualname__ and inspect.getsource(answer) == inspect.getsource(start)
    except (OSError, TypeError):  # no source to read (a lambda typed in a console)
        return False


def check(name: str, answer: Callable[..., Any], repeats: int | None = None, time_it: bool = True) -> Report:
    """Check ``answer`` against exercise ``name``'s reference: is its result the same, and how fast is it?

    Returns a :class:`Report` (shown as plain text in a notebook). ``repeats`` overrides the exercise's
    rounds of the timing race; ``time_it=False`` only checks the result."""
    t0 = time.perf_counter()
    report = _check(name, answer, repeats, time_it)
    if time_it:  # what a participant's check costs: the timed one (an untimed check would understate it)
        record(name, "check", time.perf_counter() - t0)
    return report


def _check(name: str, answer: Callable[..., Any], repeats: int | None, time_it: bool) -> Report:
    exercise = get(name)
    if not callable(answer):
        raise TypeError(f"check({name!r}, answer): the answer must be a function; got {type(answer).__name__}")
    hint = exercise.wrong_hint
    report = Report(name, right=False, slow_factor=exercise.slow_factor, hint=hint)
    _Compiles.start()
    try:
        want = timing.block(exercise.run(exercise.reference, exercise.arguments()))
    except Exception as err:  # noqa: BLE001 - the reference must not fail: that is the book's bug
        raise RuntimeError(f"exercise {name}: the reference solution failed ({_failure(err)}); "
                           "this is a bug in the book, please report it") from err
    try:
        got = timing.block(exercise.run(answer, exercise.arguments()))
    except Exception as err:  # noqa: BLE001 - any error of the answer is reported, not raised
        report.problem = f"Your answer raised {_failure(err)}"
        return report
    try:
        exercise.same(got, want)
    except AssertionError as err:
        report.problem = f"Your answer's result is not the reference's: {str(err).strip() or 'they differ'}"
        return report
    report.right, report.hint = True, exercise.slow_hint
    if not time_it or not exercise.timed:
        return report
    tally = {"yours": 0, "reference": 0, "start": 0}
    contenders = {"yours": answer, "reference": exercise.reference}
    is_start = exercise.start is not None and _same_program(answer, exercise.start)
    if exercise.start is not None and not is_start:  # the starting program as the answer is raced once
        contenders["start"] = exercise.start
    calls = {}
    for key, fn in contenders.items():
        args = exercise.arguments()
        calls[key] = _counting(lambda fn=fn, args=args: exercise.run(fn, args), tally, key)
    try:
        timings = timing.time_interleaved(calls, repeats=repeats or exercise.repeats, sync="each",
                                          min_repeat_seconds=MIN_ROUND_SECONDS)
    except Exception as err:  # noqa: BLE001 - e.g. an answer that fails on its second call
        report.right, report.hint = False, hint
        report.problem = f"Your answer ran once, then raised {_failure(err)} when it was called again"
        return report
    report.timings = timings
    report.seconds = timings["yours"].median
    report.reference_seconds = timings["reference"].median
    report.start_seconds = timings["start"].median if "start" in timings else report.seconds if is_start else None
    report.compiles = tally["yours"]
    if not math.isfinite(report.seconds):
        report.right, report.problem = False, "Your answer's timing is not finite"
    return report


__all__ = ["Exercise", "Report", "REGISTRY", "SLOW_FACTOR", "all_exercises", "check", "compiles_during",
           "compiles_on_a_second_run", "get", "record", "recorded",
           "register", "same_arrays"]
