"""The practice pages' races: an exercise's programs timed in turns on its own inputs, and the result in words.

``race`` runs each program on its own fresh copy of the exercise's inputs (``exercises.get(name).arguments()``),
through the exercise's own ``run``, round robin (``timing.time_interleaved``); ``show`` prints the race's table
and the stamp; ``pace`` puts two medians into the words the pages glue ("ran 2.31× as fast as"), and ``pace_of`` a race's
last program against its first (the reference against the starting program); ``takeaway`` tabulates a page's
races, each starting program against its reference solution.
"""

from __future__ import annotations

from typing import Any, Callable

from fastjax.tools import timing


def race(name: str, programs: dict[str, Callable[..., Any]], repeats: int, **kwargs: Any) -> dict[str, timing.Timing]:
    """Each program of ``programs`` on its own fresh copy of exercise ``name``'s inputs, in turns: ``repeats``
    rounds (``kwargs`` go to ``timing.time_interleaved``)."""
    from fastjax import exercises  # here, not at import: the exercises package imports its parts lazily

    if not programs:
        raise ValueError("race needs at least one program to time")
    exercise = exercises.get(name)
    calls = {label: (lambda fn=fn, args=exercise.arguments(): exercise.run(fn, args)) for label, fn in programs.items()}
    return timing.time_interleaved(calls, repeats=repeats, **kwargs)


def show(t: dict[str, timing.Timing]) -> None:
    """Print the race's table, each time as a multiple of the last program's, and the machine."""
    rows = list(t.values())
    print(timing.format_table(timing.table(rows, floor=rows[-1], unit="ms")))
    print(timing.stamp_text())


def factor_and_word(ratio: float, above: str = "faster", below: str = "slower") -> tuple[float, str]:
    """A measured ratio (the starting program's time over the new one's) as the page's prose says it: a
    factor of at least 1, and ``above`` when the ratio is at least 1, else ``below``."""
    return (float(ratio), above) if ratio >= 1 else (float(1 / ratio), below)


def pace(old: float, new: float) -> str:
    """A time ``new`` against a time ``old`` (seconds) in words made from their ratio, whichever way it goes:
    "ran 2.31× as fast as" or "took 1.15× the time of" (one decimal from 10× on)."""
    if not (old > 0 and new > 0):
        raise ValueError(f"pace needs two positive times; got {old!r} and {new!r}")
    ratio = old / new if new < old else new / old
    text = f"{ratio:.2f}×" if ratio < 10 else f"{ratio:.1f}×"
    return f"ran {text} as fast as" if new < old else f"took {text} the time of"


def pace_of(t: dict[str, timing.Timing]) -> str:
    """``pace`` of a race's last program (the reference) against its first (the starting program)."""
    if len(t) < 2:
        raise ValueError(f"pace_of needs a race of two programs or more; got {list(t)}")
    first, *_, last = t.values()
    return pace(first.median, last.median)


def takeaway(races: dict[str, dict[str, timing.Timing]]) -> list[dict[str, Any]]:
    """One row per exercise of ``races`` (``{exercise: race}``, each race timing the starting program first
    and the reference solution last): both medians in ms, and the speed-up."""
    rows = []
    for name, t in races.items():
        if len(t) < 2:
            raise ValueError(f"the race of {name} timed {list(t)}: it needs the starting program and the solution")
        start, *_, solution = t.values()
        rows.append({"exercise": name, "starting program (ms per call)": start.median * 1e3,
                     "solution (ms per call)": solution.median * 1e3, "speed-up": start.median / solution.median})
    return rows
