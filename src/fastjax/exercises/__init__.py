"""Self-checks for the book's exercises: ``check(name, answer)`` says, in plain words, whether an
answer computes the right thing and how fast it runs next to the reference solution, on this machine.

Each part registers its exercises in a module of this package (``method``, ``pln``, ``resnet``,
``tools``, ``scale``, ``floor``, ``many``, ``capstone``), loaded when one of its exercises is first asked for.
An :class:`Exercise` says how to build fresh arguments for one call (``arguments``), how to run an
answer on them (``run``; by default ``answer(*arguments)``), the reference solution and the program
the participant starts from (both written in the exercise's page), and how to compare a result with
the reference's (``same``, which raises ``AssertionError`` with a message in plain words).

``check`` runs the answer once and compares its result with the reference's; a function that raises,
returns the wrong shape or the wrong numbers gets a short message, never a stack trace.

Then it judges the speed with two witnesses. The first is structural and does not depend on time: on one
more call of the answer, and of the reference, it counts what the exercise's lesson removes (the
exercise's ``witness``). Two counts come from hooks: the compilations of programs of the answer's own
(JAX's eager operations, such as a slice of an array outside jit, compile once per shape and are not
counted), and the reads of a device value by Python (``float()``, ``np.asarray``, an ``if`` on an array:
counted where JAX's array hands its value to Python, see ``_HostReads``; ``jax.transfer_guard`` does not
fire on a CPU, whose arrays already live in host memory). The others are read off a profiler trace of one
more call (``jax.profiler.trace``, see ``_trace_counts``): the programs it dispatched, the XLA loops they
ran, the Python function calls made, and the convolutions, all-gathers or copies run. Two more: the scratch
memory of the answer's one program (XLA's memory analysis), and the most data ``jax.device_put`` placed on
one device during the call (``_Placed``). An answer that counts
more compiles or host reads than the reference, or ``TRACE_FACTOR`` times a traced count, is slow, whatever
the clock says, and the verdict names what was counted and gives the hint written for it.

The second witness is time: the answer, the reference and the starting program timed in turns (medians of
``repeats`` rounds). Where a witness the exercise names was counted (compiles too, where it names them),
the verdict rests on the counts, and time is printed as a second opinion. Where none was (an exercise whose lesson no
count shows, a trace that cannot show it on this machine), time decides: it can tell only when the
reference beats the starting program by ``TIME_MARGIN`` in that race; then an answer is slow when every
round of it lands above ``CLOSE_BAND`` times its limit (the geometric middle of the two medians, kept between
``SLOW_FACTOR`` and ``SLOW_LIMIT_CAP`` times the reference), fine below the limit divided by ``CLOSE_BAND``,
and "close to the limit" in between; where it cannot tell, the check says so, with what it measured and
three lines to time the answer by hand, never a fix for a mistake it did not see.

    from fastjax import exercises
    exercises.check("pln-1", my_fit)          # a Report: right or not, how fast, what to look at

Each check, and each solution that calls ``record``, leaves the seconds it took in the build's
measurements folder (``$FASTJAX_MEASUREMENTS``, else ``_build/measurements`` of the checkout), so that the
workshop page can show how long every exercise keeps the machine busy (``recorded``); outside a checkout
(and with no ``$FASTJAX_MEASUREMENTS``) nothing is written.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from fastjax.exercises import _jax_private
from fastjax.tools import timing

# A part's prefix in an exercise's name -> the module of this package that registers its exercises.
PARTS = {"method": "method", "pln": "pln", "resnet": "resnet", "tools": "tools", "many": "many",
         "scale": "scale", "floor": "floor", "capstone": "capstone"}  # in the book's order
# An answer counts as slow when its median passes the reference's by this factor. Two timings of the
# same program taken in turns on a quiet 2-core CPU differ by up to about 20 % (medians of 5 rounds,
# chapters/measuring.md); 1.5 leaves room for that and for a busy machine's noise, and still names an
# answer that misses the step the exercise is about (those are 2x or more slower).
SLOW_FACTOR = 1.5
# Time tells the reference from the starting program only when the reference's median beats the starting
# program's by this factor in the same race: the reference timed against itself on the busy 2-core machine
# lands up to 1.5x off (issue 38: floor-2's starting program raced at 1.17-1.46x the reference and passed
# half the time under SLOW_FACTOR alone); at 3x, the answer's limit (the geometric middle, 1.73x) sits 1.73x
# from both. Below it the verdict by time is "cannot tell on this machine".
TIME_MARGIN = 3.0
# The limit of an answer's time over the reference's: the geometric middle of the reference and the starting
# program, kept between SLOW_FACTOR and this cap, so that a 30x gap does not let a 5x slower answer pass.
SLOW_LIMIT_CAP = 3.0
# Each round of the race calls a program enough times to last this long (a single call of a fast program
# lasts microseconds, below the clock's and the scheduler's noise); a slow program is called once.
MIN_ROUND_SECONDS = 0.02
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # recorded by JAX once per XLA compilation
# The structural witnesses an exercise's lesson can be about, counted on one call (see ``structure``): the
# first two by hooks (JAX's compile events, the reads of an array's value), the others read off a profiler
# trace of one call (``jax.profiler.trace``; see ``_trace_counts``).
TRACE_WITNESSES = ("programs", "loops", "python calls", "convolutions", "all-gathers", "copies", "triangular solves")
# ...and one read off XLA's memory analysis of the exercise's one program compiled whole (``Exercise.program``)
# ...and one counted where ``jax.device_put`` places arrays during the call: the most bytes one device receives
WITNESSES = ("compiles", "host reads", *TRACE_WITNESSES, "scratch", "data per device")
# A count read off the trace is too high when it is at least this many times the reference's (and above it):
# the answers that miss a lesson count 2x to 500x the reference's (a loop of one program per step, a walk over
# the objects per step, a second pass), while a right answer written another way may add a few programs of its
# own (a jnp.stack of the losses, a slice), or a few Python calls.
TRACE_FACTOR = 2.0
# ...and at least this many more than the reference's: a right answer may dispatch two programs of JAX's own
# beside the reference's one (a transpose of its inputs, a stack of its results), where a loop of one program
# per step or per member dispatches tens (the pieces of floor-2's update, jitted apart, four against one).
TRACE_SLACK = {"programs": 2}
# Within this factor of a limit, time says "close to the limit", neither fine nor slow: the medians of two
# races of the same program on a busy 2-core machine differ by up to 1.5x (TIME_MARGIN), so a verdict at the
# line would flip from one check to the next.
CLOSE_BAND = 1.25


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
    # How the structural count calls an answer: on inputs new to its programs where the lesson is a program
    # per input (a new count, a new batch size: see ``unseen``); None: as ``run``
    probe: Callable[[Callable[..., Any], tuple], Any] | None = None
    wrong_hint: str = ""  # what to look at when the result is wrong
    slow_hint: str = ""  # what to look at when it is right but slow
    slow_factor: float = SLOW_FACTOR
    repeats: int = 5  # rounds of the timing race
    # What the lesson removes, counted on one call (WITNESSES): () where the lesson is time alone.
    # Compilations are counted for every exercise (a retrace is always a mistake); "host reads" only where
    # listed, since an answer's run may read its result at the end, as the references do.
    witness: tuple[str, ...] = ()
    # A hint per witness found ("compiles", "host reads", "time"), where it says more than slow_hint
    slow_hints: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    # False where the answer is itself a measurement (a timer, as on the Method page): its result is
    # checked against the reference's, and it is not raced (a timer's own speed is not the point)
    timed: bool = True
    # Where the trace witnesses (and the data per device) cannot show the lesson on some machines: "" where they
    # can, else why not, in words (Part IV's all-gather needs more than one device); then they are not counted,
    # and time decides
    trace_applies: Callable[[], str] | None = None
    # The function whose one program holds the lesson, given the answer (tools-1: the answer's jitted
    # value_and_grad): compiled whole for the run's arguments, its scratch memory is the witness "scratch"
    program: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None


REGISTRY: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    """Add ``exercise`` to the registry (a part's module calls this); return it."""
    if exercise.name in REGISTRY and REGISTRY[exercise.name] is not exercise:
        raise ValueError(f"two exercises are called {exercise.name!r}")
    prefix = exercise.name.split("-")[0]
    if prefix not in PARTS:
        raise ValueError(f"exercise {exercise.name!r}: its name must start with one of {sorted(PARTS)} and a '-'")
    unknown = set(exercise.witness) - set(WITNESSES)
    if unknown:
        raise ValueError(f"exercise {exercise.name!r}: witness must be among {WITNESSES}; got {sorted(unknown)}")
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
    structure, shapes and dtype kinds (bool, integer, floating, complex: an integer result for a float one is
    a different result), and values within ``rtol``/``atol``. NaN never agrees, not even with NaN; an
    infinity agrees only with the same infinity."""
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
        if _kind(g.dtype) != _kind(w.dtype):
            raise AssertionError(f"{where} holds {_kind(g.dtype)} values ({g.dtype}); the reference's holds "
                                 f"{_kind(w.dtype)} values ({w.dtype})")
        if _kind(w.dtype) in ("floating", "complex"):
            if np.any(np.isnan(g)) or np.any(np.isnan(w)):
                side = "yours" if np.any(np.isnan(g)) else "the reference's"
                raise AssertionError(f"{where} holds NaN ({side}): a NaN never agrees with anything")
            g_inf, w_inf = np.isinf(g), np.isinf(w)
            if np.any(g_inf != w_inf) or np.any(g[w_inf] != w[w_inf]):
                raise AssertionError(f"{where} holds an infinity where the reference's does not, or the other "
                                     "way round")
            g, w = np.where(w_inf, 0, g), np.where(w_inf, 0, w)
        gap = np.abs(g.astype(np.complex128 if np.iscomplexobj(g) else np.float64) - w.astype(
            np.complex128 if np.iscomplexobj(w) else np.float64))
        allowed = atol + rtol * np.abs(w.astype(np.complex128 if np.iscomplexobj(w) else np.float64))
        bad = gap > allowed
        if np.any(bad):
            idx = tuple(int(k) for k in np.unravel_index(int(np.argmax(gap - allowed)), gap.shape)) if gap.ndim else ()
            raise AssertionError(f"{where}: {np.count_nonzero(bad)} of {gap.size} values differ from the "
                                 f"reference's (worst at {idx}: {g[idx]!r} against {w[idx]!r}; "
                                 f"allowed rtol {rtol:g}, atol {atol:g})")


def _kind(dtype: np.dtype) -> str:
    """A dtype's kind in words: bool, integer (signed or not), floating (bfloat16 included), complex."""
    if dtype == bool:
        return "bool"
    if np.issubdtype(dtype, np.integer):
        return "integer"
    if np.issubdtype(dtype, np.complexfloating):
        return "complex"
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V" or "float" in dtype.name:  # ml_dtypes' floats
        return "floating"
    return dtype.name


def _shape_of(tree: Any) -> str:
    return ", ".join(str(getattr(leaf, "shape", type(leaf).__name__)) for leaf in jax.tree.leaves(tree)) or "nothing"


# ---------------------------------------------------------------- counting compilations

class _Compiles:
    """How many XLA compilations JAX has recorded in this process since the listener was added: all of
    them (``count``), and those of programs other than JAX's own eager operations (``own``, with their
    names in ``own_names``)."""

    count = 0
    own = 0
    own_names: list[str] = []
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
            if not _compiling_jax_own_operation():
                cls.own += 1
                cls.own_names.append(str(kwargs.get("fun_name", "a program")))


_JAX_PACKAGES = ("jax", "jaxlib")


def _compiling_jax_own_operation() -> bool:
    """Whether the compilation under way is of one of JAX's own eager operations: a primitive applied
    outside jit (``x[:k]`` on an array is a ``dynamic_slice``, compiled once per shape) or a function of
    ``jax.numpy`` called eagerly (``jnp.stack``, jitted by JAX itself). Read from the outermost jitted
    call on the stack (see ``_jax_private``); where none is found, the compilation counts as the answer's own."""
    fun = _jax_private.outermost_jitted_function(sys._getframe(1))
    if fun is None:
        return False
    if _jax_private.is_primitive_application(fun):
        return True
    try:
        fun = inspect.unwrap(fun)
    except ValueError:
        pass
    module = getattr(fun, "__module__", None) or ""
    return module.split(".")[0] in _JAX_PACKAGES


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


# ---------------------------------------------------------------- counting host reads

class _HostReads:
    """Counts the reads of a device array's value by Python while ``counting()`` is open: ``float()``,
    ``int()``, ``bool()`` (an ``if`` on an array), ``.tolist()``, ``jax.device_get``, printing (each goes
    through the ``_value`` property of JAX's array class), and ``np.asarray``, ``np.array``,
    ``np.asanyarray`` of a JAX array (NumPy reads those through the buffer protocol, below Python: the
    three functions are wrapped for the duration). ``.item()`` goes through ``np.asarray`` too, from
    inside JAX, and is counted as well."""

    count = 0
    _NUMPY = ("asarray", "array", "asanyarray")

    @classmethod
    @contextlib.contextmanager
    def counting(cls) -> Any:
        ArrayImpl = _jax_private.array_class()
        original = ArrayImpl.__dict__["_value"]
        numpy_originals = {name: getattr(np, name) for name in cls._NUMPY}

        def read(self: Any) -> Any:
            cls.count += 1
            return original.__get__(self, type(self))

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def reading(a: Any, *args: Any, **kwargs: Any) -> Any:
                if isinstance(a, ArrayImpl):
                    cls.count += 1
                return fn(a, *args, **kwargs)
            return reading

        ArrayImpl._value = property(read)
        for name, fn in numpy_originals.items():
            setattr(np, name, wrap(fn))
        try:
            yield
        finally:
            ArrayImpl._value = original
            for name, fn in numpy_originals.items():
                setattr(np, name, fn)


class _Placed:
    """The bytes ``jax.device_put`` places on each device while ``counting()`` is open (``jax.device_put`` is
    wrapped for the duration): for an array put with a sharding, its shard's bytes on each device of the
    sharding; put on a device (or the default one), its whole bytes there. It is how this book places data
    (``sharding.shard_rows``, ``sharding.replicate``); data placed another way is not counted."""

    per_device: dict[Any, int] = {}

    @classmethod
    def _add(cls, target: Any, tree: Any) -> None:
        for leaf in jax.tree.leaves(tree):
            shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
            if shape is None or dtype is None:
                continue
            itemsize = np.dtype(dtype).itemsize
            if isinstance(target, jax.sharding.Sharding):
                shard = math.prod(target.shard_shape(tuple(shape))) * itemsize
                for device in target.device_set:
                    cls.per_device[device] = cls.per_device.get(device, 0) + shard
            else:  # a device, or None (the default device)
                device = target if target is not None else jax.devices()[0]
                cls.per_device[device] = cls.per_device.get(device, 0) + math.prod(shape) * itemsize

    @classmethod
    @contextlib.contextmanager
    def counting(cls) -> Any:
        original = jax.device_put
        cls.per_device = {}

        def placing(x: Any, device: Any = None, *args: Any, **kwargs: Any) -> Any:
            try:  # a target per subtree of x (one target for all of it, most often)
                jax.tree.map(cls._add, device, x,
                             is_leaf=lambda t: t is None or isinstance(t, (jax.sharding.Sharding, jax.Device)))
            except (ValueError, TypeError):  # targets of a structure we do not read: not counted
                pass
            return original(x, device, *args, **kwargs)

        jax.device_put = placing
        try:
            yield
        finally:
            jax.device_put = original

    @classmethod
    def most(cls) -> int:
        """The bytes placed on the device that received the most."""
        return max(cls.per_device.values(), default=0)


@dataclass(frozen=True)
class Structure:
    """What one call of a program did, counted (not timed): compilations of its own programs (their
    names in ``compiled``), reads of device values by Python, and what a profiler trace of one call shows
    (``traced``: a count per name of ``TRACE_WITNESSES``; empty where no trace was taken or none could be)."""

    compiles: int
    host_reads: int
    compiled: tuple[str, ...] = ()
    traced: dict[str, int] = field(default_factory=dict, hash=False, compare=False)

    def get(self, witness: str) -> int | None:
        """The count of ``witness``; None for a trace witness (or the scratch memory) that was not counted."""
        if witness in ("compiles", "host reads"):
            return {"compiles": self.compiles, "host reads": self.host_reads}[witness]
        return self.traced.get(witness)


# ---------------------------------------------------------------- one program compiled whole

_COMPILED: dict[tuple, tuple] = {}  # (id of the function, input shapes) -> (function, compiled program, scratch bytes)


def compiled_for(fn: Callable[..., Any], *args: Any) -> Any:
    """``jax.jit(fn).lower(*args).compile()``, made once per function and input shapes and kept."""
    return _compiled(fn, args)[1]


def scratch_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """XLA's scratch memory (temp) of ``jax.jit(fn)`` compiled for ``args``, in bytes."""
    return _compiled(fn, args)[2]


def _compiled(fn: Callable[..., Any], args: tuple) -> tuple:
    from fastjax.tools import memory

    key = (id(fn), tuple((getattr(a, "shape", None), str(getattr(a, "dtype", type(a).__name__)))
                         for a in jax.tree.leaves(args)))
    if key not in _COMPILED:  # the function is kept with it, so that its id is not reused
        compiled = jax.jit(fn).lower(*args).compile()
        _COMPILED[key] = (fn, compiled, int(memory.memory_stats(compiled)["temp"]))
    return _COMPILED[key]


# ---------------------------------------------------------------- counting what one call runs (a trace)

# XLA's names of the instructions counted (an instruction's event names it: "while.6", "convolution.3",
# "wrapped_convolution", "all-gather.1", "copy.5"; a fusion named after a JAX convolution: "conv_general_dilated")
_OPS = {"loops": re.compile(r"^while(\.|$)"),
        "convolutions": re.compile(r"^(wrapped_)?(convolution|conv_general_dilated)(\.|$)"),
        "all-gathers": re.compile(r"^(wrapped_)?all-gather(-start)?(\.|$)"),
        "copies": re.compile(r"^copy(\.|$)"),
        "triangular solves": re.compile(r"^(wrapped_)?triangular[-_]solve(\.|$)")}


def _trace_counts(call: Callable[[], Any]) -> dict[str, int]:
    """Run ``call()`` (and wait for its result) inside ``jax.profiler.trace``, and count in the trace:

    - ``programs``: the compiled programs dispatched, one ``PjitFunction(...)`` event per jitted call (JAX's
      C++ dispatcher records one, or two nested of the same name, per call: those count once), eager
      operations (``x + 1`` outside jit) included, since each is a program too, and so are the programs a
      call dispatches inside its own event (the eager operations of a pytree's ``tree_unflatten`` run when
      the call rebuilds its outputs);
    - ``loops``, ``convolutions``, ``all-gathers``, ``copies``: the events of those HLO instructions as they
      ran (XLA:CPU records one per instruction run: a ``while`` loop once each time it starts, not per
      iteration; a loop nested in another once per iteration of the outer one);
    - ``python calls``: the Python function calls the profiler's Python tracer recorded.

    A count whose kind of event the trace holds none of is left out (not counted): on a device whose runtime
    does not name the HLO instruction of each event (XLA:CPU does), the loops, convolutions, all-gathers and
    copies; the Python calls where the Python tracer is off. Empty where the profiler cannot run (a trace
    already under way: JAX runs one at a time). A trace of one
    call costs milliseconds, and about a second per 100,000 events recorded (an answer that dispatches
    thousands of small programs)."""
    import tempfile

    from fastjax.tools import profiling

    with tempfile.TemporaryDirectory(prefix="fastjax-check-") as folder:
        try:
            with jax.profiler.trace(folder):
                timing.block(call())
        except RuntimeError as err:  # "Only one profile may be run at a time", a profiler unavailable
            if "profil" not in str(err).lower():
                raise
            return {}
        try:
            events = profiling.read_trace(profiling.find_trace(folder))
        except (FileNotFoundError, ValueError):
            return {}
    counts = dict.fromkeys(TRACE_WITNESSES, 0)
    seen = set()  # the kinds of event the trace holds: "programs", "python calls", "ops"
    open_calls: dict[str, list] = {}  # per thread: the jitted calls under way, (name, end), innermost last
    for e in events:  # ordered by start
        name = e["name"]
        if name.startswith("PjitFunction("):
            seen.add("programs")
            stack = open_calls.setdefault(e["thread"], [])
            while stack and stack[-1][1] <= e["ts"]:
                stack.pop()
            if not (stack and stack[-1][0] == name):  # not the dispatcher's second record of the same call
                counts["programs"] += 1
            stack.append((name, e["ts"] + e["dur"]))
        elif name.startswith("$"):
            seen.add("python calls")
            counts["python calls"] += 1
        op = e["args"].get("hlo_op")
        if op:
            seen.add("ops")
            for witness, pattern in _OPS.items():
                if pattern.match(op):
                    counts[witness] += 1
    return {w: n for w, n in counts.items() if (w if w in ("programs", "python calls") else "ops") in seen}


_GIVEN: dict[int, set] = {}


class _Exhausted(RuntimeError):
    """``unseen`` has handed out every value it was given for an answer (see ``structure``)."""


def unseen(answer: Callable[..., Any], values: Any) -> Any:
    """The first of ``values`` that ``unseen`` has not handed out for ``answer`` in this process: an input
    that is new to the answer's programs, whatever ran before (a race calls a program many times), so that
    a program compiled per value compiles on it. When all have been handed out (a process that checks the
    same function dozens of times), ``structure`` clears JAX's caches and starts the values over."""
    seen = _GIVEN.setdefault(id(answer), set())
    for value in values:
        if value not in seen:
            seen.add(value)
            return value
    raise _Exhausted("every value has been handed out for this answer")


def structure(name: str, answer: Callable[..., Any], warm: bool = True) -> Structure:
    """Count what one call of ``answer`` on fresh arguments of exercise ``name`` does (see
    :class:`Structure`), through the exercise's ``probe`` (else ``run``), after one run that compiles
    (``warm=True``; skip it where the answer has just run). Where the exercise has a witness read off a trace
    (``TRACE_WITNESSES``), one more call through ``run`` is traced, its arguments made ready first (so that
    no work of theirs runs inside the trace)."""
    exercise = get(name)
    call = exercise.probe or exercise.run
    _Compiles.start()
    for attempt in range(2):
        if warm or attempt:
            timing.block(exercise.run(answer, exercise.arguments()))
        args = exercise.arguments()
        own, names = _Compiles.own, len(_Compiles.own_names)
        placed = "data per device" in exercise.witness and not (exercise.trace_applies and exercise.trace_applies())
        try:
            with _HostReads.counting(), (_Placed.counting() if placed else contextlib.nullcontext()):
                reads = _HostReads.count
                out = call(answer, args)
                reads = _HostReads.count - reads
        except _Exhausted:
            if attempt:
                raise
            # the probe has no input left that is new to the answer's programs: make every input new by
            # clearing JAX's caches (the warm-up run above compiles again, uncounted), and start over
            import jax

            jax.clear_caches()
            _GIVEN.clear()
            continue
        timing.block(out)
        compiles, compiled = _Compiles.own - own, tuple(_Compiles.own_names[names:])  # before any other call
        traced: dict[str, int] = {"data per device": _Placed.most()} if placed else {}
        if set(exercise.witness) & set(TRACE_WITNESSES) and not (exercise.trace_applies and exercise.trace_applies()):
            args = timing.block(exercise.arguments())
            traced = _trace_counts(lambda: exercise.run(answer, args))
        if "scratch" in exercise.witness and exercise.program is not None:
            try:  # an answer that cannot be compiled whole (a float() inside) gets no count: time decides
                traced["scratch"] = scratch_bytes(exercise.program(answer), *exercise.arguments())
            except Exception:  # noqa: BLE001 - JAX raises many kinds of errors for an untraceable function
                pass
        return Structure(compiles, reads, compiled, traced)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- the check

def times_slower(seconds: float, than: float) -> str:
    """``seconds`` next to ``than`` in words: "3.2x faster" or "4.0x slower" (never "0.0x")."""
    if seconds <= 0 or than <= 0:
        return "not measurable"
    r = than / seconds
    return f"{r:.1f}x faster" if r >= 1 else f"{1 / r:.1f}x slower"


WITNESS_WORDS = {  # witness -> (what was counted, given the count; why it matters)
    "compiles": (lambda n: f"your programs compiled {n} time(s)",
                 "something makes JAX trace it again (a new function or closure each call, a Python value that "
                 "changes, a static argument or a shape that changes inside jit). tools/02-compile-time shows "
                 "how to find it"),
    "host reads": (lambda n: f"Python read a device value {n} time(s) (float(), int(), bool() or an `if` on an "
                             "array, .item(), np.asarray, print)",
                   "each read makes Python wait until the device has computed that value, and splits the work "
                   "into programs around it"),
    "programs": (lambda n: f"{n} compiled program(s) dispatched (each jitted call, and each JAX operation outside "
                           "jit, is one)",
                 "each dispatch costs Python and the runtime some microseconds, and nothing fuses across "
                 "programs: a loop that calls a program per step, per member or per operation pays it every time"),
    "loops": (lambda n: f"{n} XLA while loop(s) run (a lax.scan, fori_loop, while_loop or lax.map; a loop inside "
                        "another counts once per outer iteration)",
              "a rolled loop runs its iterations one after another, each a trip through the loop's machinery"),
    "python calls": (lambda n: f"{n} Python function calls (the profiler's Python tracer)",
                     "Python that runs on every call or step (a walk over the model's objects, a pytree flattened "
                     "and rebuilt) costs time that the device waits through"),
    "convolutions": (lambda n: f"{n} convolution instruction(s) run",
                     "on small images XLA:CPU's convolutions are slow next to one matrix product"),
    "all-gathers": (lambda n: f"{n} all-gather(s) run",
                    "an all-gather copies every device's share to every device"),
    "copies": (lambda n: f"{n} copy instruction(s) run",
               "a copy of a whole buffer on every call is memory traffic the lesson removes"),
    "triangular solves": (lambda n: f"{n} triangular solve(s) run (a solve, or an inverse, with a factorization "
                                    "runs two)",
                          "each factorization of the same matrix, and each inverse, costs as much as the first: "
                          "factor once, and solve with the factors"),
    "scratch": (lambda n: f"{n / 2**20:.1f} MiB of scratch memory in the compiled program (XLA's memory analysis)",
                "an intermediate far larger than the inputs and the result is the hot operation's footprint: "
                "computing it costs as much as it weighs"),
    "data per device": (lambda n: f"{n / 2**20:.2f} MiB of data placed on one device (jax.device_put: "
                                  "sharding.shard_rows, sharding.replicate)",
                        "a device that holds every row computes the whole fit on its own, so each device repeats "
                        "the same arithmetic; rows split over k devices give each a k-th of it"),
}
_NOISE_SHOWN = False  # the note that the machine is busy is shown once per session
_NO_TRACE = "a profiler trace of a call shows none on this device, or none could be taken"


def _short(witness: str, n: int) -> str:
    """A count of ``witness`` as the reference's side of a line: a number, or MiB for the scratch memory."""
    if witness in ("scratch", "data per device"):
        return f"{n / 2**20:.{1 if witness == 'scratch' else 2}f} MiB"
    return str(n)


def timing_cell(name: str) -> str:
    """Three lines to paste into a cell that time ``my_answer`` against exercise ``name``'s reference by hand,
    in turns, 15 rounds (``timing.time_interleaved``), each program on arguments of its own."""
    return (f'    from fastjax.tools import timing; ex = exercises.get("{name}"); a, b = ex.arguments(), ex.arguments()\n'
            '    t = timing.time_interleaved({"yours": lambda: ex.run(my_answer, a), '
            '"reference": lambda: ex.run(ex.reference, b)}, repeats=15, sync="each")\n'
            '    print({k: timing.format_seconds(v.median) for k, v in t.items()})')


@dataclass
class Report:
    """What ``check`` found: ``right`` (the result agrees with the reference); the structural counts of one
    call of the answer and of the reference (``structure``, ``reference_structure``) and the witnesses the
    exercise judges by them (``witness``); the medians (seconds per call) of the answer, the reference and
    the starting program; and the verdict by time (``by_time``: "fine", "slow", "close" or "cannot tell").

    Where a witness the exercise names was counted, the verdict rests on the counts alone, and time is printed
    as a second opinion; where none was, time decides, and an answer within ``CLOSE_BAND`` of its limit is
    "close to the limit", neither passed nor slow."""

    name: str
    right: bool
    problem: str = ""  # why the answer is wrong, in plain words ("" when right)
    seconds: float | None = None
    reference_seconds: float | None = None
    start_seconds: float | None = None
    structure: Structure | None = None
    reference_structure: Structure | None = None
    witness: tuple[str, ...] = ()  # the exercise's structural witnesses (compiles are always judged)
    slow_factor: float = SLOW_FACTOR
    by_time: str | None = None  # "fine", "slow", "close", "cannot tell"; None when not timed
    hint: str = ""
    hints: dict[str, str] = field(default_factory=dict, repr=False)
    timings: dict[str, timing.Timing] = field(default_factory=dict, repr=False)
    not_counted: str = ""  # why the trace witnesses were not counted on this machine ("" where they were)

    @property
    def compiles(self) -> int:
        """Compilations of programs of the answer's own on one call after the first (0 for a good answer)."""
        return self.structure.compiles if self.structure else 0

    @property
    def host_reads(self) -> int:
        return self.structure.host_reads if self.structure else 0

    def _counts(self, witness: str) -> tuple[int, int] | None:
        """(the answer's count, the reference's) of ``witness``; None where it was not counted on both."""
        if self.structure is None or self.reference_structure is None:
            return None
        mine, theirs = self.structure.get(witness), self.reference_structure.get(witness)
        if mine is None or theirs is None:
            return None
        return mine, theirs

    def excess(self, witness: str) -> int:
        """How many more ``witness`` (a name of WITNESSES) one call of the answer counted than the reference's."""
        counts = self._counts(witness)
        return 0 if counts is None else counts[0] - counts[1]

    def too_many(self, witness: str) -> bool:
        """Whether the answer counts too many ``witness``: more than the reference's for compiles and host reads
        (each is a mistake); for a trace count, at least ``TRACE_FACTOR`` times the reference's and more than
        ``TRACE_SLACK`` above it."""
        counts = self._counts(witness)
        if counts is None:
            return False
        mine, theirs = counts
        if witness not in ("compiles", "host reads"):  # read off a trace, or XLA's memory analysis
            return mine > theirs + TRACE_SLACK.get(witness, 0) and mine >= TRACE_FACTOR * theirs
        return mine > theirs

    @property
    def judged(self) -> tuple[str, ...]:
        return ("compiles", *[w for w in self.witness if w != "compiles"])

    @property
    def counted(self) -> tuple[str, ...]:
        """The exercise's witnesses that were counted on both programs (compiles where the exercise names
        them: its lesson is a retrace): where there is one, the counts decide and time is a second opinion."""
        return tuple(w for w in self.witness if self._counts(w) is not None)

    @property
    def structural_misses(self) -> list[str]:
        """The witnesses the answer counts too many of (deterministic: not timed)."""
        return [w for w in self.judged if self.too_many(w)]

    @property
    def retraces(self) -> bool:
        """The answer compiled a program of its own again on a call after its first."""
        return self.excess("compiles") > 0

    @property
    def ratio(self) -> float | None:
        """The answer's median over the reference's (below 1: faster than the reference)."""
        if self.seconds is None or not self.reference_seconds:
            return None
        return self.seconds / self.reference_seconds

    @property
    def gap(self) -> float | None:
        """The starting program's median over the reference's in the same race."""
        if self.start_seconds is None or not self.reference_seconds:
            return None
        return self.start_seconds / self.reference_seconds

    def _rounds(self, key: str) -> list[float]:
        """The seconds per call of each round of ``key`` ("yours", "reference", "start") in the race; the
        median alone where the race kept no rounds; the answer's where the answer is the starting program."""
        if key in self.timings:
            return list(self.timings[key].seconds)
        value = {"yours": self.seconds, "reference": self.reference_seconds, "start": self.start_seconds}[key]
        if key == "start" and value is not None and value == self.seconds and "yours" in self.timings:
            return list(self.timings["yours"].seconds)  # the starting program as the answer, raced once
        return [value] if value is not None else []

    @property
    def limit(self) -> float:
        """The answer's time over the reference's above which it is slow: the geometric middle of the
        reference and the starting program, between ``slow_factor`` and ``SLOW_LIMIT_CAP``."""
        if self.gap is None:
            return self.slow_factor
        return min(max(math.sqrt(self.gap), self.slow_factor), max(SLOW_LIMIT_CAP, self.slow_factor))

    @property
    def _time_decides(self) -> bool:
        return self.right and not self.structural_misses and not self.counted

    @property
    def slow(self) -> bool:
        """Right, but with too many of a structural witness, or (where no witness the exercise names was counted)
        slow by time."""
        return self.right and (bool(self.structural_misses) or (self._time_decides and self.by_time == "slow"))

    @property
    def close(self) -> bool:
        """Right, nothing counted against it, time decides, and the answer's time is within ``CLOSE_BAND``
        of its limit: neither passed nor slow."""
        return self._time_decides and self.by_time == "close"

    @property
    def undecided(self) -> bool:
        """Right, nothing counted against it, time decides, and this machine cannot tell the reference from
        the starting program (or the answer's rounds fall on both sides of the line): neither passed nor slow."""
        return self._time_decides and self.by_time == "cannot tell"

    @property
    def passed(self) -> bool:
        """Right, no structural witness too high, and (where time decides) fine by time."""
        return self.right and not self.slow and not self.undecided and not self.close

    def _headline(self) -> str:
        if not self.right:
            return "NOT RIGHT YET"
        if self.slow:
            return "RIGHT, BUT SLOW"
        if self.close:
            return "RIGHT; CLOSE TO THE LIMIT"
        if self.undecided:
            return "RIGHT; CANNOT TELL ON THIS MACHINE"
        return "PASSED"

    def text(self) -> str:
        """The report in plain words."""
        global _NOISE_SHOWN
        lines = [f"Exercise {self.name}: {self._headline()}"]
        if not self.right:
            lines.append(f"  {self.problem}")
        else:
            lines.append("  Your answer computes the same as the reference solution.")
        for w in self.judged:
            counts = self._counts(w)
            if counts is None:
                if w in self.witness and w not in ("compiles", "host reads") and self.structure is not None:
                    lines.append(f"  Not counted here: {w} ({self.not_counted or _NO_TRACE}).")
                continue
            (counted, why), (mine, theirs) = WITNESS_WORDS[w], counts
            if self.too_many(w):
                named = (f" ({', '.join(sorted(set(self.structure.compiled)))})"
                         if w == "compiles" and self.structure.compiled else "")
                lines.append(f"  Counted on one call after the first: {counted(mine)}{named}; the reference's: "
                             f"{_short(w, theirs)}. {why[0].upper()}{why[1:]}.")
            elif w in self.witness:
                lines.append(f"  Counted on one call after the first: {counted(mine)}; the reference's: "
                             f"{_short(w, theirs)}.")
        if self.seconds is not None:
            lines.append(f"  Median per call, timed in turns on this machine: yours {timing.format_seconds(self.seconds)}, "
                         f"the reference {timing.format_seconds(self.reference_seconds)}"
                         + (f", the starting program {timing.format_seconds(self.start_seconds)}"
                            if self.start_seconds is not None else "")
                         + f" (yours / reference: {self.ratio:.2f}).")
            if self.start_seconds is not None and self.seconds > 0:
                lines.append(f"  Next to the starting program, yours is {times_slower(self.seconds, self.start_seconds)}.")
            lines += self._time_lines()
        noisy = [t.noise for t in self.timings.values() if t.noise]
        if noisy and not _NOISE_SHOWN:
            _NOISE_SHOWN = True
            lines.append(f"  The timings may be off: {noisy[0]} (said once per session: it holds for every "
                         "check while the machine stays busy).")
        if self.hint and not self.passed and not self.undecided and not self.close:
            lines.append(f"  What to look at: {self._hint()}")
        return "\n".join(lines)

    def _time_lines(self) -> list[str]:
        """What the race says, and what it weighs in the verdict."""
        if self.right and (self.counted or self.structural_misses):
            second = {"fine": "it agrees", "slow": "it would call yours slow",
                      "close": "it puts yours close to its limit", "cannot tell": "it cannot tell"}.get(self.by_time, "")
            return [f"  Time is a second opinion here, the verdict rests on what was counted; {second} "
                    f"(limit {self.limit:.2f}x the reference's time)."] if second else []
        if self.by_time == "slow":
            return [f"  By time it is slow: every round above {self.limit * CLOSE_BAND:.2f}x the reference's time "
                    f"({self.limit:.2f}x, the middle of the reference and the starting program, and "
                    f"{CLOSE_BAND:g}x for the noise)."]
        if self.by_time == "close":
            return [f"  Close to the limit: yours is {self.ratio:.2f}x the reference's time, within {CLOSE_BAND:g}x of "
                    f"the limit ({self.limit:.2f}x, the middle of the reference and the starting program), where "
                    "two races of the same program can land on either side. To see it by hand, time it in turns "
                    "in a cell:", timing_cell(self.name)]
        if self.by_time == "cannot tell":
            why = (f"the reference was only {self.gap:.2f}x faster than the starting program in this race (time "
                   f"tells from {TIME_MARGIN:g}x)" if self.gap is not None and self.gap < TIME_MARGIN else
                   f"your rounds fall on both sides of {self.limit:.2f}x the reference's time")
            return [f"  Time cannot tell on this machine: {why}. To see it by hand, time it in turns in a cell:",
                    timing_cell(self.name)]
        return []

    def _hint(self) -> str:
        if self.right and self.slow:
            for w in self.structural_misses or ["time"]:
                if w in self.hints:
                    return self.hints[w]
        return self.hint

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


def _records_folder() -> Path | None:
    """Where ``record`` keeps its seconds: ``$FASTJAX_MEASUREMENTS/exercises``, else the checkout's
    ``_build/measurements/exercises``; None outside a checkout (nothing is written into the current folder)."""
    env = os.environ.get("FASTJAX_MEASUREMENTS")
    if env:
        return Path(env) / "exercises"
    from fastjax.setup.colab import find_root

    try:
        return find_root() / "_build" / "measurements" / "exercises"
    except FileNotFoundError:
        return None


def record(name: str, what: str, seconds: float) -> None:
    """Keep the seconds that ``what`` ("check" or "solution") of exercise ``name`` took on this machine,
    for the workshop page. Outside a checkout, or where the folder cannot be written, nothing is kept:
    the record is a convenience."""
    folder = _records_folder()
    if folder is None:
        return
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
    folder = _records_folder()
    out: dict[str, dict[str, float]] = {}
    if folder is None:
        return out
    for path in sorted(folder.glob("*.json")):
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
    report = Report(name, right=False, slow_factor=exercise.slow_factor, hint=hint, witness=exercise.witness)
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
    report.right, report.hint, report.hints = True, exercise.slow_hint, dict(exercise.slow_hints)
    if not time_it or not exercise.timed:
        return report
    # the first witness: counted on one more call of each (both ran once above, so they are warm)
    try:
        report.structure = structure(name, answer, warm=False)
    except Exception as err:  # noqa: BLE001 - e.g. an answer that fails on its second call
        report.right, report.hint = False, hint
        report.problem = f"Your answer ran once, then raised {_failure(err)} when it was called again"
        return report
    report.reference_structure = structure(name, exercise.reference, warm=False)
    report.not_counted = exercise.trace_applies() if exercise.trace_applies else ""
    # the second witness: time, in turns
    contenders = {"yours": answer, "reference": exercise.reference}
    is_start = exercise.start is not None and _same_program(answer, exercise.start)
    if exercise.start is not None and not is_start:  # the starting program as the answer is raced once
        contenders["start"] = exercise.start
    calls = {}
    for key, fn in contenders.items():
        args = exercise.arguments()
        calls[key] = lambda fn=fn, args=args: exercise.run(fn, args)
    try:
        timings = timing.time_interleaved(calls, repeats=repeats or exercise.repeats, sync="each",
                                          min_repeat_seconds=MIN_ROUND_SECONDS)
    except Exception as err:  # noqa: BLE001 - e.g. an answer that fails on a later call
        report.right, report.hint = False, hint
        report.problem = f"Your answer ran twice, then raised {_failure(err)} when it was called again"
        return report
    report.timings = timings
    report.seconds = timings["yours"].median
    report.reference_seconds = timings["reference"].median
    report.start_seconds = timings["start"].median if "start" in timings else report.seconds if is_start else None
    if not math.isfinite(report.seconds):
        report.right, report.problem = False, "Your answer's timing is not finite"
        return report
    report.by_time = _by_time(report)
    return report


def _by_time(report: Report) -> str:
    """The verdict of the race: "cannot tell" unless the reference's median beats the starting program's
    by ``TIME_MARGIN`` (``report.gap``); else "slow" when every round of the answer is above ``CLOSE_BAND``
    times ``report.limit`` times the reference's median (one slow round of either cannot make it slow),
    "fine" when the answer's median is below ``report.limit / CLOSE_BAND`` times the reference's, "close"
    when it is within ``CLOSE_BAND`` of the limit, and "cannot tell" when its rounds straddle that band."""
    if report.gap is not None and report.gap < TIME_MARGIN:
        return "cannot tell"
    if min(report._rounds("yours")) / report.reference_seconds > report.limit * CLOSE_BAND:
        return "slow"
    if report.ratio is not None and report.ratio <= report.limit / CLOSE_BAND:
        return "fine"
    if report.ratio is not None and report.ratio <= report.limit * CLOSE_BAND:
        return "close"
    return "cannot tell"


__all__ = ["CLOSE_BAND", "Exercise", "Report", "REGISTRY", "SLOW_FACTOR", "SLOW_LIMIT_CAP", "Structure", "TIME_MARGIN",
           "TRACE_FACTOR", "TRACE_WITNESSES", "WITNESSES", "timing_cell",
           "all_exercises", "check", "compiled_for", "scratch_bytes", "compiles_during", "compiles_on_a_second_run", "get", "record", "recorded",
           "register", "same_arrays", "structure", "times_slower", "unseen"]
