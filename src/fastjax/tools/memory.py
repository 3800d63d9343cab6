"""Memory figures, in bytes: what a compiled program needs, what the live arrays hold, what was donated.

``memory_stats`` reads XLA's memory analysis of an ahead-of-time compiled program
(``jax.jit(f).lower(...).compile()``) into a plain dict that is the same on every JAX release the
book runs on; ``live_bytes`` adds up the arrays alive in the process; ``tree_bytes`` and
``deleted_leaves`` look at one pytree (a train state, say) before and after a donating call.
"""

from __future__ import annotations

from typing import Any

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
