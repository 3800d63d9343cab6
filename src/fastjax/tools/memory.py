"""Memory figures, in bytes: what a compiled program needs, what the live arrays hold, what was donated.

``memory_stats`` reads XLA's memory analysis of an ahead-of-time compiled program
(``jax.jit(f).lower(...).compile()``) into a plain dict that is the same on every JAX release the
book runs on; ``live_bytes`` adds up the arrays alive in the process; ``tree_bytes`` and
``deleted_leaves`` look at one pytree (a train state, say) before and after a donating call.
``held_bytes`` and ``memory_table`` add up what a program holds at once while it runs;
``copies_added_by_donation`` lists the copies XLA adds to a program when its inputs are donated;
``bytes_added_by_call`` measures the live bytes one call adds while its caller keeps the old state.
"""

from __future__ import annotations

import collections
import gc
import math
import re
from typing import Any, Callable

import jax

# XLA's names (CompiledMemoryStats.<name>_size_in_bytes) and ours.
_FIELDS = {"argument": "argument_size_in_bytes", "output": "output_size_in_bytes",
           "alias": "alias_size_in_bytes", "temp": "temp_size_in_bytes",
           "code": "generated_code_size_in_bytes"}


def memory_stats(compiled: Any) -> dict[str, int | None]:
    """XLA's memory analysis of a compiled program, in bytes: ``argument`` (inputs), ``output``,
    ``alias`` (outputs written into donated inputs), ``temp`` (scratch), ``code``, and ``peak``
    (None where the installed jaxlib does not report it)."""
    analyse = getattr(compiled, "memory_analysis", None)
    if analyse is None:
        raise TypeError(f"memory_stats needs a compiled program (jax.jit(f).lower(*args).compile()); "
                        f"got {type(compiled).__name__}")
    stats = analyse()
    if stats is None:
        raise ValueError("this backend gives no memory analysis for the compiled program")
    out: dict[str, int | None] = {name: int(getattr(stats, field)) for name, field in _FIELDS.items()}
    peak = getattr(stats, "peak_memory_in_bytes", None)
    out["peak"] = None if peak is None else int(peak)
    return out


def live_bytes() -> int:
    """Bytes held by every JAX array alive in this process (deleted and donated arrays hold none)."""
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


def _arrays(tree: Any) -> list[jax.Array]:
    leaves = [leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)]
    if not leaves:
        raise ValueError("the tree holds no JAX arrays")
    return leaves


def tree_bytes(tree: Any) -> int:
    """Bytes of the JAX arrays in a pytree that still hold memory (deleted ones count zero)."""
    return sum(a.nbytes for a in _arrays(tree) if not a.is_deleted())


def deleted_leaves(tree: Any) -> tuple[int, int]:
    """``(deleted, total)``: how many of the JAX arrays in ``tree`` are deleted (donated), of how many."""
    leaves = _arrays(tree)
    return sum(a.is_deleted() for a in leaves), len(leaves)


def held_bytes(stats: dict[str, int | None]) -> int:
    """What a program holds at once while it runs: inputs, plus outputs that need memory of their
    own (those not written into donated inputs), plus scratch."""
    return stats["argument"] + stats["output"] - stats["alias"] + stats["temp"]


def footprint(compiled: Any) -> int:
    """Inputs + outputs + XLA's scratch (temp) of a compiled program, in bytes: all it holds at most, donation
    aside (XLA:CPU's own ``peak`` figure leaves the scratch of loops out, so it is not used here)."""
    st = memory_stats(compiled)
    return st["argument"] + st["output"] + st["temp"]


def memory_table(programs: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, dict[str, int | None]]]:
    """One row per compiled program (kB: argument, output, alias, temp, held), and each one's ``memory_stats``."""
    stats = {name: memory_stats(c) for name, c in programs.items()}
    rows = [{"program": name, **{f"{f} (kB)": st[f] / 1e3 for f in ("argument", "output", "alias", "temp")},
             "held (kB)": held_bytes(st) / 1e3} for name, st in stats.items()]
    return rows, stats


# An optimized-HLO copy instruction: its result shape, and the name of what it copies.
_COPY = re.compile(r"= (\S+) copy\(%([A-Za-z_]\w*?)(?:\.\d+)?\)")
_ITEMSIZE = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
             "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}


def copies_added_by_donation(plain: Any, donated: Any) -> collections.Counter:
    """``{(shape, operand): count}``: the copy instructions of the donated program's optimized HLO
    that the plain one lacks (both compiled: ``jax.jit(f).lower(...).compile()``)."""
    for program in (plain, donated):
        if not hasattr(program, "as_text"):
            raise TypeError(f"copies_added_by_donation needs compiled programs; got {type(program).__name__}")
    return (collections.Counter(_COPY.findall(donated.as_text()))
            - collections.Counter(_COPY.findall(plain.as_text())))


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO array shape such as ``f32[64,32]{1,0}``."""
    match = re.match(r"(\w+)\[([\d,]*)\]", shape)
    if match is None or match.group(1) not in _ITEMSIZE:
        raise ValueError(f"not an HLO array shape with a known element type: {shape!r}")
    dims = [int(d) for d in match.group(2).split(",") if d]
    return _ITEMSIZE[match.group(1)] * math.prod(dims)


def bytes_added_by_call(make_state: Callable[[], Any], step: Callable[..., Any], *args: Any) -> int:
    """Live bytes after ``new = step(state, *args)`` minus before, with ``state = make_state()`` still
    referenced by the caller (as right after a call, before the name is rebound)."""
    state = jax.block_until_ready(make_state())
    gc.collect()  # free whatever make_state built and dropped, so that it is not counted below
    before = live_bytes()
    new = jax.block_until_ready(step(state, *args))
    added = live_bytes() - before
    del new, state
    return added
