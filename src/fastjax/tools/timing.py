"""The timing harness: warm-up, ``block_until_ready``, repeats, medians and spread.

Times are wall-clock seconds from ``time.perf_counter``. Compile time is measured apart
(``compile_time``), a trace counter tells how often a function was traced (``count_traces``),
and every result carries the device and library versions it was measured with (``stamp``).
The same calls work for eager, jitted and AOT-compiled callables.

A timing taken while other processes use the CPU can be off by an order of magnitude, so the
harness also records how busy the rest of the machine was while it measured (``Timing.load``) and
flags a busy or noisy measurement (``Timing.noise``); tables, charts and the stamp then say so.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
import numpy as np

from fastjax import sizes
from fastjax.setup import cpu, workaround




def _clock() -> float:  # every measurement's clock, looked up at each call (tests put a fake clock in its place)
    return time.perf_counter()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def block(tree: Any) -> Any:
    """Wait until every array in ``tree`` is computed; return ``tree`` unchanged."""
    for leaf in jax.tree.leaves(tree):
        wait = getattr(leaf, "block_until_ready", None)
        if wait is not None:
            wait()
    return tree


@dataclass
class Timing:
    """Repeated measurements of one callable. ``seconds`` holds one value per repeat,
    each the mean over ``number`` calls, divided by ``per`` (units of work per call); ``load``, the
    CPU cores other processes kept busy meanwhile (see ``noise``)."""

    name: str
    seconds: list[float]
    number: int = 1
    per: int = 1
    sync: str = "each"
    compile_seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    load: float | None = None  # CPU cores other processes kept busy meanwhile (None: not measured)

    @property
    def median(self) -> float:
        """Median seconds per unit of work."""
        return float(np.median(self.seconds))

    @property
    def q1(self) -> float:
        """First quartile, seconds per unit."""
        return float(np.percentile(self.seconds, 25))

    @property
    def q3(self) -> float:
        """Third quartile, seconds per unit."""
        return float(np.percentile(self.seconds, 75))

    @property
    def best(self) -> float:
        """Fastest repeat, seconds per unit."""
        return float(np.min(self.seconds))

    @property
    def median_us(self) -> float:
        """Median in µs per unit of work."""
        return self.median * 1e6

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05 means ±2.5 %)."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else float("nan")

    @property
    def busy(self) -> bool:
        """Other processes kept at least ``BUSY_CORES`` CPU cores busy while this was measured."""
        return self.load is not None and self.load >= BUSY_CORES

    @property
    def wide(self) -> bool:
        """Five or more repeats whose interquartile range passes ``NOISY_SPREAD`` of the median."""
        return len(self.seconds) >= 5 and self.spread > NOISY_SPREAD

    @property
    def noise(self) -> str:
        """Why this timing should not be trusted ("" when nothing is wrong with it): ``busy`` or ``wide``."""
        reasons = []
        if self.busy:
            reasons.append(f"busy machine: other processes kept {self.load:.1f} CPU cores busy")
        if self.wide:
            reasons.append(f"noisy: IQR {self.spread:.0%} of the median")
        return "; ".join(reasons)

    def as_dict(self) -> dict[str, Any]:
        """Plain data, with the summary statistics (and the noise verdict) added."""
        out = asdict(self)
        out.update(median=self.median, q1=self.q1, q3=self.q3, best=self.best, noise=self.noise)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Timing":
        """The Timing that ``as_dict`` wrote (the summary statistics are recomputed, not read)."""
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})

    def __repr__(self) -> str:
        noise = f"; {self.noise}" if self.noise else ""
        return (f"Timing({self.name!r}: median {format_seconds(self.median)}, "
                f"IQR {format_seconds(self.q1)}–{format_seconds(self.q3)}, "
                f"{len(self.seconds)} repeats × {self.number} calls{noise})")


# A timing is flagged when other processes kept at least half a CPU core busy, on average, while it
# ran. Measured on the book's 2-core CPU (jax 0.10.2 and 0.12.0.1): the processes that are always
# there (kernel threads, daemons) used 0.015 cores over 20 s, while a competing busy process adds
# about one core: beside one busy loop per core (and other notebooks) the load read 1.2 to 2.0 cores
# and the floor of chapters/measuring.md (a 400×400 jitted log-sum-exp) ran up to 24× slower than
# without the loops. Half a core sits far from both: one process that competes for the CPU is
# flagged, the machine's housekeeping is not.
BUSY_CORES = 0.5
# Repeats whose interquartile range passes half the median are flagged too (where the machine's load
# cannot be read, this is the only evidence). The same floor's IQR was 6 to 51 % of its median (mostly
# under 30 %) with other notebooks running, and up to 176 % beside busy loops: half the median flags
# only the wild ones. Fewer than 5 repeats are not judged (3 values give no spread to speak of).
NOISY_SPREAD = 0.5
# The load is read over at least this long (a shorter measurement waits out the rest, idle): the
# counters move in 10 ms ticks, so over 0.2 s the load read can be off by up to 0.15 cores on 2 cores
# (a tick at each end of the three counters subtracted).
MIN_LOAD_WINDOW = 0.2


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds the whole machine has been busy since boot, CPU seconds this process and the children
    it has waited for have used), from psutil or Linux's /proc/stat; None where neither can be read. A
    contender run as a child process (a whole-process race) thus counts as this process's own work."""
    own = os.times()
    try:
        import psutil

        t = psutil.cpu_times()
        machine = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))
    except ImportError:
        try:
            with open("/proc/stat") as f:  # cpu user nice system idle iowait irq softirq steal ...
                ticks = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        machine = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return machine, own.user + own.system + own.children_user + own.children_system


class _LoadMeter:
    """Measures, between ``start()`` and ``stop()``, how many CPU cores other processes kept busy on
    average: the machine's busy CPU time minus this process's (all its threads), over the wall time.
    ``stop()`` first sleeps until ``MIN_LOAD_WINDOW`` has passed, so a short timing is judged too."""

    def start(self) -> _LoadMeter:
        self.cpu, self.t0 = cpu_seconds(), _clock()
        return self

    def stop(self) -> float | None:
        if self.cpu is None:
            return None
        rest = MIN_LOAD_WINDOW - (_clock() - self.t0)
        if rest > 0:
            _sleep(rest)
        wall, end = _clock() - self.t0, cpu_seconds()
        if end is None or wall <= 0:
            return None
        other = (end[0] - self.cpu[0]) - (end[1] - self.cpu[1])
        return round(max(other, 0.0) / wall, 3)


_session = {"timed": 0, "flagged": 0, "max_load": 0.0}  # every timing taken in this process


def _record(timings: Iterable[Timing]) -> None:
    for t in timings:
        _session["timed"] += 1
        _session["flagged"] += bool(t.noise)
        _session["max_load"] = max(_session["max_load"], t.load or 0.0)


def format_seconds(s: float) -> str:
    """Seconds as a short human string in ns, µs, ms or s."""
    if not math.isfinite(s):
        return str(s)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def time_per_call(
    fn: Callable[..., Any],
    *args: Any,
    name: str | None = None,
    repeats: int = 7,
    number: int | None = None,
    warmup: int = 1,
    per: int = 1,
    sync: str = "each",
    min_repeat_seconds: float = 0.05,
    max_number: int = 10_000,
    **kwargs: Any,
) -> Timing:
    """Time ``fn(*args, **kwargs)``: ``warmup`` calls first (compilation happens there), then
    ``repeats`` repeats of ``number`` calls. ``sync="each"`` waits for every result (latency);
    ``sync="last"`` waits only for the last call of a repeat, so async dispatch can overlap
    calls (throughput). ``number=None`` picks it so one repeat lasts ``min_repeat_seconds``.
    Results are seconds per call divided by ``per`` (e.g. iterations run inside one call)."""
    if sync not in ("each", "last"):
        raise ValueError(f"sync must be 'each' or 'last'; got {sync!r}")
    if repeats < 1 or warmup < 0 or per < 1:
        raise ValueError(f"need repeats >= 1, warmup >= 0, per >= 1; got {repeats}, {warmup}, {per}")
    name = name or getattr(fn, "__name__", type(fn).__name__)
    for _ in range(warmup):
        block(fn(*args, **kwargs))
    if number is None:
        t0 = _clock()
        block(fn(*args, **kwargs))
        one = max(_clock() - t0, 1e-7)
        number = int(min(max_number, max(1, math.ceil(min_repeat_seconds / one))))
    results, meter = [], _LoadMeter().start()
    for _ in range(repeats):
        out = None
        t0 = _clock()
        for _ in range(number):
            out = fn(*args, **kwargs)
            if sync == "each":
                block(out)
        block(out)
        results.append((_clock() - t0) / number / per)
    out = Timing(name=name, seconds=results, number=number, per=per, sync=sync, load=meter.stop())
    _record([out])
    return out


class Threads:
    """One side's threads: ``get()`` says how many it computes with; ``set(n)`` changes it in this process,
    where that side can (PyTorch: ``torch.set_num_threads``); ``set=None`` where the count is fixed once the
    library has started (XLA:CPU's pool reads ``PJRT_NPROC`` when JAX's backend starts: a whole-process race
    sets it per process instead). ``side`` names the library in tables."""

    def __init__(self, side: str, get: Callable[[], int | None], set: Callable[[int], None] | None = None):  # noqa: A002
        self.side, self.get, self.set = side, get, set

    def label(self, n: int | None = None) -> str:
        """How a table names a setting: "PyTorch 1 thread", "XLA 2 threads (fixed at start)"."""
        n = self.get() if n is None else n
        fixed = "" if self.set is not None else " (fixed at start)"
        return f"{self.side} {n} thread{'s' if n != 1 else ''}{fixed}" if n else f"{self.side} (threads unknown){fixed}"

    def __repr__(self) -> str:
        return f"Threads({self.label()})"


def cores() -> int:
    """The CPU cores this process may run on (its affinity), at least 1."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, n)


def thread_settings() -> tuple[int, ...]:
    """The thread counts a race tries for each side that has a knob: one, and one per core. One thread is
    what a user of a shared machine picks (PyTorch's threads wait for each other at every parallel
    operation, and a core taken by another process makes each of them wait, see chapters/measuring.md);
    one per core is every library's default on a machine of its own. ``FASTJAX_THREADS`` (a comma list of
    counts, such as ``1`` or ``1,4``) replaces them."""
    asked = os.environ.get("FASTJAX_THREADS", "").strip()
    if not asked:
        return tuple(sorted({1, cores()}))
    try:
        counts = {int(part) for part in asked.split(",")}
    except ValueError:
        counts = {0}
    if min(counts) < 1:
        raise ValueError(f"FASTJAX_THREADS must be thread counts of at least 1, separated by commas; got {asked!r}")
    return tuple(sorted(counts))


def torch_threads() -> Threads:
    """PyTorch's intra-op threads, settable in this process (``torch.set_num_threads``)."""
    import torch

    return Threads("PyTorch", torch.get_num_threads, torch.set_num_threads)


def xla_pool_threads() -> int | None:
    """The threads of XLA's CPU pool in this process (``tf_XLAEigen``, counted in /proc on Linux; before the
    first computation the pool may not exist yet), else what ``PJRT_NPROC`` asks for, else the cores."""
    task = "/proc/self/task"
    if os.path.isdir(task):
        names = []
        for t in os.listdir(task):
            try:
                with open(f"{task}/{t}/comm") as f:
                    names.append(f.read().strip())
            except OSError:  # a thread that ended meanwhile
                pass
        n = sum(name == "tf_XLAEigen" for name in names)
        if n:
            return n
    asked = os.environ.get("PJRT_NPROC", "")
    return int(asked) if asked.isdigit() and int(asked) > 0 else cores()


def xla_threads() -> Threads:
    """XLA:CPU's pool in this process: fixed once JAX's backend has started (``PJRT_NPROC``)."""
    return Threads("XLA", xla_pool_threads)


class Witness:
    """The CPU cores other processes kept busy while each named piece of work ran: ``with w.measure(name):``
    around each timed piece adds its wall time and the machine's busy CPU time less this process's (and its
    waited-for children's); ``w.load(name)`` is their ratio, read over at least ``MIN_LOAD_WINDOW`` of wall
    time (else None). The counters are read outside the clock of the work they measure."""

    def __init__(self) -> None:
        self.other: dict[Any, list[float]] = {}

    @contextlib.contextmanager
    def measure(self, name: Any) -> Iterator[None]:
        c0 = cpu_seconds()
        t0 = _clock()
        yield
        wall = _clock() - t0
        c1 = cpu_seconds()
        acc = self.other.setdefault(name, [0.0, 0.0])
        if c0 is not None and c1 is not None:
            acc[0] += max((c1[0] - c0[0]) - (c1[1] - c0[1]), 0.0)
            acc[1] += wall

    def load(self, name: Any) -> float | None:
        cpu, wall = self.other.get(name, (0.0, 0.0))
        return round(cpu / wall, 3) if wall >= MIN_LOAD_WINDOW else None


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, per: dict[str, int] | None = None,
                     sync: str = "last", min_repeat_seconds: float = 0.05,
                     threads: dict[str, Threads] | None = None, settings: Sequence[int] | None = None,
                     warmup: int = 1, prune: float = 3.0) -> dict[str, Timing]:
    """Time several callables side by side: each repeat runs every callable once (round robin),
    so background load hits them all alike. ``warmup`` calls each first (compilation happens there); then
    ``number`` as in ``time_per_call`` (one untimed call measures it; ``min_repeat_seconds=0`` makes one
    call per repeat and skips it); seconds per call divided by ``per[name]``.

    ``threads``: for the callables named there, the knob of their side (``torch_threads()``): each is
    timed at every thread count of ``settings`` (default ``thread_settings()``: 1 and one per core), the
    settings in turns like the callables, and keeps its fastest; a setting whose first repeat took over
    ``prune`` times the fastest of that callable is not run again (a 2-thread PyTorch beside another process
    can take 30 times its 1-thread time). The knob is put back afterwards. Each Timing's ``extra`` holds
    ``threads`` (the label of the setting it ran with, also for callables without a knob) and
    ``threads_tried`` ({label: median seconds}); its ``load`` is the CPU cores other processes kept busy
    during that callable's own timed calls (the witness of ``ratio``)."""
    per, threads = per or {}, threads or {}
    settings = tuple(settings or thread_settings())
    knobs = {name: knob for name, knob in threads.items() if name in fns and knob.set is not None}
    before = {name: knob.get() for name, knob in knobs.items()}
    runs = [(name, n) for name in fns for n in (settings if name in knobs else (None,))]
    numbers: dict[tuple[str, int | None], int] = {}
    try:
        for name, n in runs:  # warm up (compiles) and pick a number of calls per repeat
            if n is not None:
                knobs[name].set(n)
            for _ in range(warmup if n in (None, settings[0]) else min(warmup, 1)):
                block(fns[name]())
            if min_repeat_seconds <= 0:
                numbers[(name, n)] = 1
                continue
            t0 = _clock()
            block(fns[name]())
            numbers[(name, n)] = max(1, int(np.ceil(min_repeat_seconds / max(_clock() - t0, 1e-7))))
        seconds: dict[tuple[str, int | None], list[float]] = {run: [] for run in runs}
        witness = Witness()
        live = list(runs)
        meter = _LoadMeter().start()
        for r in range(repeats):
            for name, n in live:
                if n is not None:
                    knobs[name].set(n)
                calls, out = numbers[(name, n)], None
                with witness.measure((name, n)):
                    t0 = _clock()
                    for _ in range(calls):
                        out = fns[name]()
                        if sync == "each":
                            block(out)
                    block(out)
                    wall = _clock() - t0
                seconds[(name, n)].append(wall / calls / per.get(name, 1))
            if r == 0 and prune and len(live) > len(fns):  # drop the settings far slower than the best
                first = {run: seconds[run][0] for run in live}
                live = [(name, n) for name, n in live
                        if n is None or first[(name, n)] <= prune * min(v for (m, _), v in first.items() if m == name)]
        whole = meter.stop()
    finally:
        for name, n in before.items():
            if n:
                knobs[name].set(n)
    out: dict[str, Timing] = {}
    for name in fns:
        tried = [(n, seconds[(name, n)]) for m, n in runs if m == name and len(seconds[(name, n)]) == repeats]
        n, s = min(tried, key=lambda ns: float(np.median(ns[1])))
        load = witness.load((name, n))
        load = whole if load is None else load
        knob = threads.get(name)
        label = knob.label(n) if knob is not None else None
        t = Timing(name=name, seconds=s, number=numbers[(name, n)], per=per.get(name, 1), sync=sync, load=load)
        if knob is not None:
            t.extra["threads"], t.extra["thread_count"] = label, n if n is not None else knob.get()
            t.extra["threads_tried"] = {knob.label(m): float(np.median(v)) if v else None
                                        for m, v in ((m, seconds[(name, m)]) for nm, m in runs if nm == name)}
        out[name] = t
    _record(out.values())
    return out


# A race's ratio is published only when the measurement is sound; else it is "not measured" and the page
# says why in words. Three witnesses, any of which decides:
# - other processes kept at least BUSY_CORES CPU cores busy during either side's timed calls (above);
# - a side's median is over SLOW_MEDIAN times its own fastest repeat: on a quiet machine the repeats of
#   one program lie within a few per cent of each other (median / fastest 1.00-1.15 in the book's races,
#   2-core CPU), while beside a busy process PyTorch's median step ran 15-80 times its fastest (128-257 ms
#   against ~3 ms at 2 threads);
# - the per-round ratios disagree: their interquartile range is over ROUNDS_SPREAD of their median.
SLOW_MEDIAN = 2.0
ROUNDS_SPREAD = 0.5


def unsound(*timings: Timing | None) -> str:
    """Why a ratio between ``timings`` cannot be trusted, in words ("" when it can): another process
    took CPU while one of them ran, a median far above its own fastest repeat, or (for two timings taken
    in turns, with one value per round each) per-round ratios that disagree."""
    ts = [t for t in timings if t is not None]
    why = []
    busy = [t for t in ts if t.busy]
    if busy:
        why.append("other processes kept " + ", ".join(f"{t.load:.1f} CPU cores busy while {t.name} ran" for t in busy))
    slow = [t for t in ts if t.best > 0 and t.median > SLOW_MEDIAN * t.best]
    if slow:
        why.append(", ".join(f"{t.name}'s median was {t.median / t.best:.1f}× its fastest run" for t in slow))
    if len(ts) == 2 and len(ts[0].seconds) == len(ts[1].seconds) >= 2:
        rounds = [a / b for a, b in zip(ts[0].seconds, ts[1].seconds) if b > 0]
        q1, med, q3 = np.percentile(rounds, [25, 50, 75])
        if med > 0 and (q3 - q1) / med > ROUNDS_SPREAD:
            why.append(f"the rounds disagreed (ratios {min(rounds):.2g} to {max(rounds):.2g})")
    return "; ".join(why)


@dataclass
class Ratio:
    """How many times faster ``fast`` ran than ``slow`` (medians), or ``None`` where the measurement was not
    sound (``why`` says what the witness saw). ``threads``: the setting each side ran with."""

    slow: str
    fast: str
    value: float | None
    why: str = ""
    threads: dict[str, str | None] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.value is not None

    def text(self, fmt: str = "{:.2f}×") -> str:
        """The ratio formatted (``fmt``), or "not measured (the machine was busy)": short enough for a table
        cell or a clause; ``why`` (and ``says``) give what the witness saw."""
        return fmt.format(self.value) if self.value is not None else "not measured (the machine was busy)"

    def says(self, sentence: str, otherwise: str | None = None) -> str:
        """``sentence`` with ``{x}`` (or ``{x:.1f}`` ...) filled in when measured; else ``otherwise`` (default:
        "The race of FAST against SLOW was not measured: the machine was busy (...)"), so that a page's
        glued sentence reads right either way."""
        if self.value is not None:
            return sentence.format(x=self.value)
        lead = otherwise or f"The race of {self.fast} against {self.slow} was not measured"
        return f"{lead}: the machine was busy ({self.why}), so no ratio is given. Run it again on a quiet machine."

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Ratio":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def ratio(slow: Timing, fast: Timing, why: str | None = None) -> Ratio:
    """``slow.median / fast.median`` (above 1: ``fast`` is faster), published only where ``unsound`` finds
    nothing wrong with the two timings (or ``why`` is "" when the caller judged them itself)."""
    why = unsound(slow, fast) if why is None else why
    value = slow.median / fast.median if not why and fast.median > 0 else None
    threads = {t.name: t.extra.get("threads") for t in (slow, fast)}
    return Ratio(slow.name, fast.name, value, why, threads)


@dataclass
class Compiled:
    """An AOT-compiled callable and the seconds spent lowering (tracing) and compiling it."""

    compiled: Callable[..., Any]
    lower_seconds: float
    compile_seconds: float

    @property
    def total_seconds(self) -> float:
        """Trace + lower + compile, in seconds."""
        return self.lower_seconds + self.compile_seconds


def compile_time(jitted: Any, *args: Any, **kwargs: Any) -> Compiled:
    """Compile ahead of time with ``jitted.lower(*args).compile()``, timing both steps apart."""
    if not hasattr(jitted, "lower"):
        raise TypeError(
            f"compile_time needs a jitted function with a .lower method (jax.jit, eqx.filter_jit); "
            f"got {type(jitted).__name__}"
        )
    t0 = time.perf_counter()
    lowered = jitted.lower(*args, **kwargs)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return Compiled(compiled=compiled, lower_seconds=t1 - t0, compile_seconds=t2 - t1)


def first_call_seconds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Seconds taken by one call including any tracing and compiling (use on a fresh function)."""
    t0 = time.perf_counter()
    block(fn(*args, **kwargs))
    return time.perf_counter() - t0


class count_traces:  # noqa: N801 - used as a decorator, like functools.wraps
    """Wrap a Python function and count how often its body runs.

    Put it *inside* a transform: in ``jax.jit(count_traces(f))`` the body runs only when JAX
    traces, so ``.count`` is the number of traces (eagerly, it is the number of calls).
    """

    def __init__(self, fn: Callable[..., Any]):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        return self.fn(*args, **kwargs)

    def reset(self) -> None:
        """Set the count back to zero."""
        self.count = 0

    def __repr__(self) -> str:
        return f"count_traces({getattr(self.fn, '__name__', self.fn)!r}, count={self.count})"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def stamp() -> dict[str, Any]:
    """The device, library versions and settings a measurement was made with."""
    dev = jax.devices()[0]
    return {
        "device": f"{dev.platform.upper()}: {getattr(dev, 'device_kind', dev.platform)}",
        "device_count": jax.device_count(),
        "cpu_cores": os.cpu_count(),
        "cpu_model": cpu.model(),
        "xla_isa": cpu.xla_isa(),
        "onednn_isa": cpu.onednn_isa(),
        "python": platform.python_version(),
        **{pkg: _version(pkg) for pkg in ("jax", "jaxlib", "flax", "equinox", "optax", "numpy")},
        "cpu_workaround": workaround.workaround_active(),
        "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
        "size": sizes.current_size(),
        "utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "timings": _session["timed"],  # taken in this process so far, and how many were busy or noisy
        "noisy_timings": _session["flagged"],
        "max_other_cores": _session["max_load"],
    }


BUILT_WITH = ("jax", "jaxlib", "flax", "equinox", "optax", "numpy", "pyPLNmodels", "torch", "scikit-learn",
              "jupyter-book")


def built_with() -> str:
    """A Markdown table of what this page runs with: the device, Python, each package of ``BUILT_WITH``
    ('| jax | 0.x |', or 'not installed'), the CPU workaround, the size and the time (the landing page)."""
    s = stamp()
    rows = ["| | |", "|---|---|", f"| device | {s['device']} ({s['device_count']}) |", f"| Python | {s['python']} |"]
    rows += [f"| {package} | {_version(package) or 'not installed'} |" for package in BUILT_WITH]
    rows += [f"| CPU miscompile workaround | {'on' if s['cpu_workaround'] else 'off'} |",
             f"| size | {s['size']} |", f"| executed | {s['utc']} UTC |"]
    return "\n".join(rows)


def stamp_text(s: dict[str, Any] | None = None) -> str:
    """The stamp as one line, for captions and table footers."""
    s = stamp() if s is None else s
    libs = ", ".join(f"{k} {s[k]}" for k in ("jax", "jaxlib", "flax", "equinox", "optax") if s.get(k))
    fix = "on" if s["cpu_workaround"] else "off"
    host = f"{s['cpu_model']}, " if s.get("cpu_model") else ""  # stamps saved before had no CPU model
    isa = f" · XLA:CPU code {s['xla_isa']}" if s.get("xla_isa") else ""
    isa += f" · PyTorch {s['onednn_isa']}" if s.get("onednn_isa") else ""
    text = (f"{s['device']} ×{s['device_count']} ({host}{s['cpu_cores']} CPU cores){isa} · Python {s['python']} · "
            f"{libs} · CPU fix {fix}"
            + (f" · OPENBLAS_THREAD_TIMEOUT={s['openblas_thread_timeout']}" if s.get("openblas_thread_timeout") else "")
            + f" · size {s['size']} · {s['utc']} UTC")
    if s.get("noisy_timings"):  # stamps saved before the detector existed have none
        text += (f" · ⚠ {s['noisy_timings']} of {s['timings']} timings in this run were busy or noisy "
                 f"(other processes used up to {s['max_other_cores']:.1f} CPU cores)")
    return text


def noise_note(timings: Iterable[Timing | None]) -> str:
    """A warning naming the timings measured on a busy machine (or spread too widely to trust), and
    why; "" when there are none. Tables (``format_table``) and charts (``fastjax.tools.plots``) show it."""
    unique = {id(t): t for t in timings if t is not None}.values()  # the floor is often a row too
    busy = [f"{t.name}: {t.load:.1f}" for t in unique if t.busy]
    wide = [f"{t.name}: {t.spread:.0%}" for t in unique if t.wide]
    if not busy and not wide:
        return ""
    parts = ["⚠ Not a quiet measurement."]
    if busy:
        parts.append("Measured on a busy machine (CPU cores other processes kept busy): " + "; ".join(busy) + ".")
    if wide:
        parts.append("Repeats spread widely (IQR / median): " + "; ".join(wide) + ".")
    return " ".join(parts + ["Ratios may mislead: re-run with nothing else using the CPU."])


class Rows(list):
    """The rows of ``table``, with ``note``: the noise warning about the timings they came from."""

    note: str = ""


def table(timings: Iterable[Timing], floor: Timing | None = None, unit: str = "µs") -> list[dict[str, Any]]:
    """One row per timing: median and quartiles in ``unit`` (``"s"``, ``"ms"`` or ``"µs"``), and
    the ratio of each median to ``floor``'s median when a floor is given. The rows carry
    ``noise_note`` of those timings, which ``format_table`` prints under the table."""
    scale = {"s": 1.0, "ms": 1e3, "µs": 1e6, "us": 1e6}[unit]
    timings, rows = list(timings), Rows()
    rows.note = noise_note([*timings, floor])
    for t in timings:
        row = {"variant": t.name, f"median ({unit})": t.median * scale,
               f"q1 ({unit})": t.q1 * scale, f"q3 ({unit})": t.q3 * scale}
        if floor is not None:
            row["× floor"] = t.median / floor.median
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], digits: int = 3) -> str:
    """Rows of plain data as a Markdown table (numbers to ``digits`` significant digits), followed by
    the rows' noise warning when they came from ``table`` and some timing was busy or noisy."""
    if not rows:
        return ""
    cols = list(rows[0])
    fmt = lambda v: f"{v:.{digits}g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    note = getattr(rows, "note", "")
    return "\n".join(lines + (["", note] if note else []))


def to_plain(results: dict[str, Any]) -> dict[str, Any]:
    """Results (of ``fastjax.bench.run``, a race, ...) as JSON-ready data: Timings become dicts with their
    medians, Ratios dicts with their verdict."""

    def plain(value: Any) -> Any:
        if isinstance(value, (Timing, Ratio)):
            return value.as_dict()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(results)


def from_plain(value: Any) -> Any:
    """Undo ``to_plain``: dicts written by ``Timing.as_dict`` (``Ratio.as_dict``) become Timings (Ratios) again."""
    if isinstance(value, dict):
        if {"name", "seconds", "median"} <= value.keys():
            return Timing.from_dict(value)
        if {"slow", "fast", "value", "why"} <= value.keys():
            return Ratio.from_dict(value)
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value
