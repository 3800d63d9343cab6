"""The PLN state in five pytree containers, and what one flatten + unflatten of each costs
(chapters/pln/05-pytree-class.md).

A NamedTuple and ``jax.tree_util.register_dataclass`` (which ``flax.struct.dataclass`` uses) are
flattened by JAX's C++ code; ``register_pytree_node_class`` (rung 5, ``PlnModel``) and ``eqx.Module``
call Python flatten functions. Every container holds the same leaves: M, S, the optimizer state; the
learning rate is static data.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import equinox as eqx
import jax
from flax import struct

from fastjax import pln
from fastjax.pln.rungs import PlnModel, PlnState
from fastjax.tools import timing


@functools.partial(jax.tree_util.register_dataclass, data_fields=["m", "s", "opt_state"], meta_fields=["lr"])
@dataclasses.dataclass
class DataclassState:
    """The state as a dataclass registered with ``jax.tree_util.register_dataclass``."""

    m: Any
    s: Any
    opt_state: Any
    lr: float


@struct.dataclass
class FlaxState:
    """The state as a ``flax.struct.dataclass``."""

    m: Any
    s: Any
    opt_state: Any
    lr: float = struct.field(pytree_node=False)


class EqxState(eqx.Module):
    """The state as an ``eqx.Module``."""

    m: Any
    s: Any
    opt_state: Any
    lr: float = eqx.field(static=True)


def states(m: Any, s: Any, opt_state: Any, lr: float = pln.LR) -> dict[str, Any]:
    """The same state in each of the five containers, by the name the page prints. Raises
    AssertionError if any container does not hold the same number of leaves as the NamedTuple."""
    out = {
        "NamedTuple": PlnState(m, s, opt_state),
        "register_dataclass": DataclassState(m, s, opt_state, lr),
        "register_pytree_node_class": PlnModel(m, s, opt_state, lr),
        "flax.struct.dataclass": FlaxState(m, s, opt_state, lr),
        "eqx.Module": EqxState(m, s, opt_state, lr),
    }
    n = len(jax.tree.leaves(out["NamedTuple"]))
    wrong = {name: len(jax.tree.leaves(v)) for name, v in out.items() if len(jax.tree.leaves(v)) != n}
    if wrong:
        raise AssertionError(f"containers with another number of leaves than the NamedTuple's {n}: {wrong}")
    return out


def round_trip(obj: Any) -> Any:
    """One flatten and unflatten, as when the object crosses ``jit``."""
    leaves, treedef = jax.tree.flatten(obj)
    return jax.tree.unflatten(treedef, leaves)


def flatten_timings(containers: dict[str, Any], repeats: int = 7) -> dict[str, timing.Timing]:
    """The time of one ``round_trip`` of each container, by name."""
    return {name: timing.time_per_call(round_trip, obj, name=name, repeats=repeats) for name, obj in containers.items()}
