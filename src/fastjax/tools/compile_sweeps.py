"""Compile time against loop length and depth (chapters/tools/02-compile-time): each way of writing the same
loop compiled ahead of time at each size, and checked to compute the same numbers.

``sweep_steps`` compiles ``n`` PLN steps written several ways (a rolled ``lax.scan``, an unrolled one, a
Python loop in ``jit``) for each ``n``; ``sweep_layers`` compiles the loss and gradient of ``L`` residual
blocks as a Python loop and as a ``lax.scan`` over stacked weights for each ``L``. Both raise
``AssertionError`` where the ways disagree beyond float32 rounding.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from fastjax.tools import timing

# the ELBOs of n steps written each way vs the rolled scan: measured 0 (the same bits) at both sizes; Rprop
# can turn a rounding difference into a different step, so no derivation (notes/TOLERANCES.md)
SAME_ELBOS_TOL = 1e-5
# loss and gradient of L residual blocks, Python loop vs lax.scan: measured 9.1e-7 (3 layers) and 1.4e-6
# (32 layers) of each array's largest entry
LAYERS_RTOL = 1e-4
LAYERS_ATOL = 1e-6


def sweep_steps(ways: dict[str, Callable[[int], Any]], steps: Sequence[int], args: tuple,
                reference: str = "lax.scan", same_at_one: str | None = "lax.scan, unroll=n"
                ) -> tuple[dict[str, list[float]], dict[str, Any], dict[str, float]]:
    """Trace + lower + compile seconds of ``ways[way](n)`` (a jitted function of ``args`` returning
    ``(state, elbos)``) for each ``n`` of ``steps``; the ELBOs of each way's longest program; and their
    largest relative difference to ``reference``'s, which must stay under ``SAME_ELBOS_TOL``. At n = 1 the
    way ``same_at_one`` is the reference's program (``unroll=1`` is the rolled scan) and is not compiled again."""
    compile_s: dict[str, list[float]] = {way: [] for way in ways}
    last: dict[str, Any] = {}
    for n in steps:
        for way, make in ways.items():
            if n == 1 and way == same_at_one:
                compile_s[way].append(compile_s[reference][-1])
                continue
            c = timing.compile_time(make(n), *args)
            compile_s[way].append(c.total_seconds)
            last[way] = c.compiled(*args)[1]
    gaps = {way: float(np.max(np.abs(last[way] / last[reference] - 1))) for way in last}
    if not max(gaps.values()) < SAME_ELBOS_TOL:
        raise AssertionError(f"the ways of writing the loop compute different ELBOs: {gaps}")
    return compile_s, last, gaps


def sweep_layers(losses: dict[str, Callable[[Any, Any], Any]], layers: Sequence[int], x: Any,
                 width: int) -> tuple[dict[str, list[float]], float]:
    """Trace + lower + compile seconds of ``jax.value_and_grad(losses[way])`` on ``L`` stacked blocks of
    weights ``(L, 2, 3, 3, width, width)`` for each ``L`` of ``layers``; and the largest difference between
    the ways' losses and gradients, relative to each array's largest entry. Raises AssertionError where they
    differ beyond ``LAYERS_RTOL`` / ``LAYERS_ATOL``."""
    seconds: dict[str, list[float]] = {way: [] for way in losses}
    gap = 0.0
    for n_layers in layers:
        ws = 0.3 * jax.random.normal(jax.random.key(n_layers), (n_layers, 2, 3, 3, width, width)) / np.sqrt(9 * width)
        results = {}
        for way, loss in losses.items():
            c = timing.compile_time(jax.jit(jax.value_and_grad(loss)), ws, x)
            seconds[way].append(c.total_seconds)
            results[way] = c.compiled(ws, x)
        first, *others = (jax.tree.leaves(r) for r in results.values())
        for other in others:
            for a, b in zip(other, first):
                a, b = np.asarray(a), np.asarray(b)
                gap = max(gap, float(np.max(np.abs(a - b)) / np.max(np.abs(b))))
                if not np.all(np.abs(a - b) <= LAYERS_ATOL + LAYERS_RTOL * np.abs(b)):  # as assert_allclose
                    raise AssertionError(f"{n_layers} layers: the loop and the scan differ by {gap:.1e}")
    return seconds, gap
