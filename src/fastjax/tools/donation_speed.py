"""Timing a step that replaces its state, donated or not (chapters/tools/03-memory-donation).

``carried(step, state, *args, steps=...)`` makes a ``run()`` that calls ``state, out = step(state, ...)``
``steps`` times and keeps the state between runs (a donated state cannot be passed twice);
``spread_verdict`` says, in words, whether pairs of timings lie within the spread of their repeats.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fastjax.tools.timing import Timing


def carried(step: Callable[..., Any], state: Any, *args: Any, steps: int,
            inputs: tuple[Sequence[Any], Sequence[Any]] | None = None) -> Callable[[], Any]:
    """``run()``: ``steps`` calls of ``state, out = step(state, *args)`` (or, with ``inputs = (xs, ys)``,
    ``step(state, xs[i], ys[i])``), the state kept between runs; returns the last ``out``."""
    box = [state]

    def run() -> Any:
        out = None
        for i in range(steps):
            extra = args if inputs is None else (inputs[0][i], inputs[1][i])
            box[0], out = step(box[0], *extra)
        return out

    return run


def spread_verdict(pairs: Sequence[tuple[Timing, Timing]]) -> str:
    """Whether each pair's quartile ranges overlap: "both within the spread of the repeats", "both outside ...",
    or "one within and one outside ..." (for two pairs)."""
    overlap = [a.q1 <= b.q3 and b.q1 <= a.q3 for a, b in pairs]
    if all(overlap):
        return "both within the spread of the repeats"
    if not any(overlap):
        return "both outside the spread of the repeats"
    return "one within and one outside the spread of the repeats"
