"""Rprop exactly as ``torch.optim.Rprop`` does it, as an optax ``GradientTransformation``.

torch's rule (``torch/optim/rprop.py``, single-tensor path), for each entry, with ``prev`` the
previous (possibly zeroed) gradient, starting at 0, and ``step`` the step size, starting at ``lr``:

1. ``f = sign(grad * prev)`` mapped to ``eta_plus`` (> 0), ``eta_minus`` (< 0) or 1 (== 0);
2. ``step = clip(step * f, min_step, max_step)``;
3. where ``f == eta_minus`` the gradient is set to 0 (no move, and no sign to compare next time);
4. ``param -= sign(grad) * step`` and ``prev = grad``.

So the first update already moves every entry by ``lr`` (``prev`` is 0, ``f`` is 1). optax's own
``optax.rprop`` (0.2.8) returns the *previous* step's update instead (optax pull request #1725).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class RpropState(NamedTuple):
    """Per-entry step sizes and the previous gradient (zeroed where its sign flipped)."""

    step_sizes: Any
    prev_grads: Any


def rprop(learning_rate: float = 0.01, etas: tuple[float, float] = (0.5, 1.2),
          step_sizes: tuple[float, float] = (1e-6, 50.0)) -> optax.GradientTransformation:
    """torch's Rprop with torch's defaults; updates are to be *added* to the parameters (optax's sign)."""
    eta_minus, eta_plus = etas
    step_min, step_max = step_sizes
    if not 0.0 < eta_minus < 1.0 < eta_plus:
        raise ValueError(f"etas must satisfy 0 < eta_minus < 1 < eta_plus; got {etas}")
    if not 0.0 <= learning_rate:
        raise ValueError(f"learning_rate must be non-negative; got {learning_rate}")
    if not 0.0 <= step_min <= step_max:
        raise ValueError(f"step_sizes must satisfy 0 <= min <= max; got {step_sizes}")

    def init_fn(params: Any) -> RpropState:
        return RpropState(jax.tree.map(lambda p: jnp.full_like(p, learning_rate), params),
                          jax.tree.map(jnp.zeros_like, params))

    def one(g: Any, prev: Any, step: Any) -> tuple[Any, Any, Any]:
        s = jnp.sign(g * prev)  # the product, as torch forms it (it can underflow to 0)
        factor = jnp.where(s > 0, eta_plus, jnp.where(s < 0, eta_minus, 1.0)).astype(step.dtype)
        step = jnp.clip(step * factor, step_min, step_max)
        g = jnp.where(s < 0, jnp.zeros_like(g), g)
        return -jnp.sign(g) * step, g, step

    def update_fn(grads: Any, state: RpropState, params: Any = None) -> tuple[Any, RpropState]:
        del params
        treedef = jax.tree.structure(grads)
        rows = [one(g, p, s) for g, p, s in zip(jax.tree.leaves(grads), treedef.flatten_up_to(state.prev_grads),
                                                treedef.flatten_up_to(state.step_sizes))]
        updates, prev, steps = (treedef.unflatten(col) for col in zip(*rows))
        return updates, RpropState(steps, prev)

    return optax.GradientTransformation(init_fn, update_fn)
