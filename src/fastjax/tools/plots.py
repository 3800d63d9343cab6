"""Charts for the book: the ladder (per-call times with the floor marked), sweeps, and grouped bars.

A chart drawn from timings that were measured on a busy machine (or spread too widely) says so in
red under the chart, naming them (``fastjax.tools.timing.noise_note``), and hatches their bars.
Figures are returned, never saved; ``save_figure`` writes one into the repository's ``images/``
folder (or ``FASTJAX_IMAGES`` when set), which ``python -m fastjax.bench --figures`` does for the README.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from fastjax.tools.timing import Timing, noise_note, ratio

_SCALE = {"s": 1.0, "ms": 1e3, "µs": 1e6}


def images_dir() -> Path:
    """The folder figures are saved to: ``FASTJAX_IMAGES``, else ``images/`` at the repo root."""
    env = os.environ.get("FASTJAX_IMAGES")
    if env:
        return Path(env)
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").exists():
            return folder / "images"
    return here / "images"


def save_figure(fig: plt.Figure, name: str) -> Path:
    """Save ``fig`` as ``images/<name>`` (PNG when no suffix is given); return the path."""
    if not name or "/" in name or "\\" in name:
        raise ValueError(f"figure name must be a plain file name; got {name!r}")
    path = images_dir() / (name if Path(name).suffix else f"{name}.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def _caption(fig: plt.Figure, caption: str | None, note: str) -> None:
    """The stamp under the chart, and the noise warning above it when there is one; both in red when
    something was busy or noisy (the stamp counts the run's flagged timings after a "⚠")."""
    text = "\n".join(part for part in (note, caption) if part)
    if text:
        fig.text(0.01, -0.02, text, fontsize=7, color="#c44e52" if "⚠" in text else "0.35", ha="left",
                 va="top", wrap=True)


def plot_ladder(
    timings: Sequence[Timing],
    floor: Timing | None = None,
    dispatch_floor: Timing | None = None,
    title: str = "",
    unit: str = "µs",
    caption: str | None = None,
    log: bool | None = None,
    others: Sequence[Timing] = (),
    others_floor: Timing | None = None,
    others_label: str = "PyTorch",
) -> plt.Figure:
    """Horizontal bars of median time per call (IQR as whiskers), one per rung, top to bottom,
    with the floor drawn as a dashed line and each bar labelled with its ratio to the floor.
    ``others`` (another program's times, such as PyTorch's) come last, in another colour, each labelled
    with its ratio to ``others_floor``: the floor timed in the same run as they were (required with them),
    or "not measured" where ``timing.ratio``'s witness finds that comparison unsound.
    Busy or noisy timings get hatched bars and a red warning above the caption."""
    if not timings:
        raise ValueError("plot_ladder needs at least one timing")
    if unit not in _SCALE:
        raise ValueError(f"unit must be one of {list(_SCALE)}; got {unit!r}")
    if others and others_floor is None:
        raise ValueError("plot_ladder: others need others_floor, the floor timed in the same run as they were")
    n_own = len(timings)
    timings = [*timings, *others]
    k = _SCALE[unit]
    med = np.array([t.median for t in timings]) * k
    lo = med - np.array([t.q1 for t in timings]) * k
    hi = np.array([t.q3 for t in timings]) * k - med
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(timings) + 1.6))
    y = np.arange(len(timings))[::-1]
    colours = ["#4c72b0"] * n_own + ["#dd8452"] * (len(timings) - n_own)
    bars = ax.barh(y, med, xerr=[np.clip(lo, 0, None), np.clip(hi, 0, None)], color=colours, alpha=0.85,
                   capsize=3)
    if others:
        bars[n_own].set_label(f"{others_label} (× its own run's floor: {others_floor.median * k:.3g} {unit})")
    for bar, t in zip(bars, timings):
        if t.noise:
            bar.set_hatch("//")
    ax.set_yticks(y, [t.name for t in timings])
    if log is None:
        log = med.max() / max(med.min(), 1e-12) > 30
    if log:
        ax.set_xscale("log")
    for ref, style, label in ((floor, "--", "floor"), (dispatch_floor, ":", "dispatch floor")):
        if ref is not None:
            ax.axvline(ref.median * k, color="#c44e52", linestyle=style, label=f"{label}: {ref.median * k:.3g} {unit}")
    if floor is not None:
        for i, (yi, m, t) in enumerate(zip(y, med, timings)):
            if i < n_own:
                label = f"  {t.median / floor.median:.2f}×"
            else:  # another library's bar: its ratio only where the race's witness found it sound
                r = ratio(t, others_floor)
                label = f"  {r.value:.2f}×" if r.measured else "  not measured (busy)"
            ax.text(m, yi, label, va="center", fontsize=9)
        ax.legend(loc="lower right", fontsize=8)
    elif dispatch_floor is not None or others:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel(f"median time per call ({unit}); whiskers: interquartile range")
    ax.set_title(title)
    _caption(fig, caption, noise_note([*timings, floor, dispatch_floor, others_floor]))
    ax.margins(x=0.15)
    fig.tight_layout()
    return fig


def plot_sweep(
    x: Sequence[float],
    series: Mapping[str, Sequence[float | Timing]],
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = True,
    logy: bool = True,
    caption: str | None = None,
) -> plt.Figure:
    """Lines of ``series[name][i]`` against ``x[i]``, one per name, with markers. Values may be
    Timings: their medians are drawn and busy or noisy ones are named in a red warning."""
    if not series:
        raise ValueError("plot_sweep needs at least one series")
    for name, ys in series.items():
        if len(ys) != len(x):
            raise ValueError(f"series {name!r} has {len(ys)} points for {len(x)} x values")
    named = [Timing(f"{name} at {xi}", y.seconds, load=y.load)
               for name, ys in series.items() for xi, y in zip(x, ys) if isinstance(y, Timing)]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, ys in series.items():
        ax.plot(x, [y.median if isinstance(y, Timing) else y for y in ys], marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _caption(fig, caption, noise_note(named))
    fig.tight_layout()
    return fig


def plot_bars(groups: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str, title: str = "",
              above: Sequence[str] | None = None, colors: Sequence[str] | None = None, logy: bool = False,
              caption: str | None = None) -> plt.Figure:
    """Grouped bars: for each group ``groups[i]``, one bar per series (``series[name][i]``), side by side;
    ``above[i]``, if given, written over group i's tallest bar."""
    if not series:
        raise ValueError("plot_bars needs at least one series")
    for name, ys in series.items():
        if len(ys) != len(groups):
            raise ValueError(f"series {name!r} has {len(ys)} values for {len(groups)} groups")
    if above is not None and len(above) != len(groups):
        raise ValueError(f"above has {len(above)} labels for {len(groups)} groups")
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    x, width = np.arange(len(groups)), 0.8 / len(series)
    for k, (name, ys) in enumerate(series.items()):
        ax.bar(x + (k - (len(series) - 1) / 2) * width, ys, width, label=name,
               **({"color": colors[k]} if colors else {}))
    for i, text in enumerate(above or []):
        ax.text(i, max(ys[i] for ys in series.values()) * (1.05 if logy else 1.0), text, ha="center",
                va="bottom", fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set_xticks(x, groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    _caption(fig, caption, "")
    fig.tight_layout()
    return fig


def draw_timeline(events: Sequence[dict], program_hlo: str, steps_shown: int, ax: plt.Axes) -> None:
    """The first ``steps_shown`` steps of a trace (``profiling.read_trace``'s events) on ``ax``: the Python
    thread's dispatch events on top, then one lane per XLA thread with that program's operations, coloured
    by kind."""
    from fastjax.tools import profiling  # the HLO parser: only this chart needs it

    known = profiling.instructions(program_hlo)
    ops_ev = [e for e in events if e["name"] in known]
    first = ops_ev[0]["name"]  # the program's first instruction: it starts every step
    starts = [e["ts"] for e in ops_ev if e["name"] == first]
    t0 = starts[0]
    t1 = starts[steps_shown] if len(starts) > steps_shown else max(e["ts"] + e["dur"] for e in ops_ev)
    dispatch = [e for e in events if e["thread"] == "python" and ("PjitFunction" in e["name"] or "Execute" in e["name"])]
    shown = [e for e in dispatch + ops_ev if t0 - 1e3 <= e["ts"] < t1]
    threads = sorted({e["thread"] for e in shown if e["thread"] != "python"})
    lanes = ["python"] + threads
    labels = ["Python: dispatch"] + [f"XLA thread {k + 1}" for k in range(len(threads))]
    colours = {"convolution": "#c44e52", "fusion": "#4c72b0", "dot": "#dd8452", "custom-call": "#8172b3"}
    for e in shown:
        op = known[e["name"]]["op"] if e["name"] in known else "host"
        colour = colours.get(op, "0.6" if op == "host" else "#55a868")
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"], 1.0) / 1e3)], (lanes.index(e["thread"]) - 0.4, 0.8),
                       color=colour)
    ax.set_yticks(range(len(lanes)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first operation of the first step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (*colours.values(), "#55a868", "0.6")]
    ax.legend(handles, [*colours, "other op", "dispatch"], fontsize=7, loc="upper right", ncols=2)


def plot_roofline(flops_per_s: float, bytes_per_s: float, points: Mapping[str, tuple[float, float]],
                  title: str = "", caption: str | None = None) -> plt.Figure:
    """The roofline ``min(peak flops, intensity × peak bandwidth)`` with one marker per ``points[name] =
    (arithmetic intensity in flops per byte, attained flop/s)``."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    intensity = np.logspace(-2, 3, 200)
    ax.loglog(intensity, np.minimum(flops_per_s, intensity * bytes_per_s) / 1e9, color="0.3",
              label="roofline (measured peaks)")
    for (name, (at, attained)), marker in zip(points.items(), "os^vD"):
        ax.loglog(at, attained / 1e9, marker, markersize=9, label=name)
    ax.set_xlabel("arithmetic intensity (flops per byte accessed)")
    ax.set_ylabel("Gflop/s")
    ax.legend(fontsize=8)
    ax.set_title(title)
    _caption(fig, caption, "")
    fig.tight_layout()
    return fig


def plot_histogram(values: Sequence[float], marks: Mapping[str, float], xlabel: str, ylabel: str = "count",
                   bins: int = 20) -> plt.Figure:
    """A histogram of ``values`` with a vertical line at each ``marks[label]`` (solid, then dashed, ...)."""
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.hist(values, bins=bins, color="#4c72b0")
    for (label, value), style in zip(marks.items(), ("-", "--", ":", "-.")):
        ax.axvline(value, color="#c44e52", linestyle=style, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_ladders_over_floor(ladders: Mapping[str, Mapping], caption: str | None = None) -> plt.Figure:
    """Several ladders side by side, each rung as its median over its ladder's floor (log scale), so that
    ladders of different units share one scale (the Results page: Part I and Part II)."""
    fig, axes = plt.subplots(1, len(ladders), figsize=(5.5 * len(ladders), 3.8), squeeze=False)
    for ax, (title, res) in zip(axes[0], ladders.items()):
        names = [t.name for t in res["rungs"]]
        ratios = np.array([t.median / res["floor"].median for t in res["rungs"]])
        y = np.arange(len(names))[::-1]
        ax.barh(y, ratios, color="#4c72b0")
        ax.axvline(1.0, color="#c44e52", linestyle="--", label="floor")
        ax.set_yticks(y, names)
        ax.set_xscale("log")
        ax.set_xlabel("× floor (log scale)")
        ax.set_title(title)
        ax.legend(loc="lower right", fontsize=8)
    if caption:
        fig.text(0.01, -0.02, caption, fontsize=7, color="0.35", ha="left", va="top")
    fig.tight_layout()
    return fig
