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

import functools
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np

from fastjax import sizes
from fastjax.setup import cpu, workaround


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
    """(CPU seconds the whole machine has been busy since boot, CPU seconds this process has used),
    from psutil or Linux's /proc/stat; None where neither can be read."""
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
    return machine, own.user + own.system


class _LoadMeter:
    """Measures, between ``start()`` and ``stop()``, how many CPU cores other processes kept busy on
    average: the machine's busy CPU time minus this process's (all its threads), over the wall time.
    ``stop()`` first sleeps until ``MIN_LOAD_WINDOW`` has passed, so a short timing is judged too."""

    def start(self) -> _LoadMeter:
        self.cpu, self.t0 = cpu_seconds(), time.perf_counter()
        return self

    def stop(self) -> float | None:
        if self.cpu is None:
            return None
        rest = MIN_LOAD_WINDOW - (time.perf_counter() - self.t0)
        if rest > 0:
            time.sleep(rest)
        wall, end = time.perf_counter() - self.t0, cpu_seconds()
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
        t0 = time.perf_counter()
        block(fn(*args, **kwargs))
        one = max(time.perf_counter() - t0, 1e-7)
        number = int(min(max_number, max(1, math.ceil(min_repeat_seconds / one))))
    results, meter = [], _LoadMeter().start()
    for _ in range(repeats):
        out = None
        t0 = time.perf_counter()
        for _ in range(number):
            out = fn(*args, **kwargs)
            if sync == "each":
                block(out)
        block(out)
        results.append((time.perf_counter() - t0) / number / per)
    out = Timing(name=name, seconds=results, number=number, per=per, sync=sync, load=meter.stop())
    _record([out])
    return out


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, per: dict[str, int] | None = None,
                sync: str = "last", min_repeat_seconds: float = 0.05) -> dict[str, Timing]:
    """Time several callables side by side: each repeat runs every callable once (round robin),
    so background load hits them all alike (and each gets the load measured over the whole run).
    Warm-up and ``number`` as in ``time_per_call`` (``min_repeat_seconds=0`` makes one call per
    repeat); seconds per call divided by ``per[name]``."""
    per = per or {}
    numbers = {}
    for name, fn in fns.items():  # warm up (compiles) and pick a number of calls per repeat
        block(fn())
        t0 = time.perf_counter()
        block(fn())
        numbers[name] = max(1, int(np.ceil(min_repeat_seconds / max(time.perf_counter() - t0, 1e-7))))
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    meter = _LoadMeter().start()
    for _ in range(repeats):
        for name, fn in fns.items():
            n, out = numbers[name], None
            t0 = time.perf_counter()
            for _ in range(n):
                out = fn()
                if sync == "each":
                    block(out)
            block(out)
            seconds[name].append((time.perf_counter() - t0) / n / per.get(name, 1))
    load = meter.stop()
    out = {name: Timing(name=name, seconds=s, number=numbers[name], per=per.get(name, 1), sync=sync, load=load)
           for name, s in seconds.items()}
    _record(out.values())
    return out


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
    """Results (of ``fastjax.bench.run``, a race, ...) as JSON-ready data: Timings become dicts with their medians."""

    def plain(value: Any) -> Any:
        if isinstance(value, Timing):
            return value.as_dict()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(results)


def from_plain(value: Any) -> Any:
    """Undo ``to_plain``: dicts written by ``Timing.as_dict`` become Timings again."""
    if isinstance(value, dict):
        if {"name", "seconds", "median"} <= value.keys():
            return Timing.from_dict(value)
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value
