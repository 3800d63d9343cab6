"""``optax.MultiSteps`` is not K steps in one call (chapters/resnet/04-scan.md): on one parameter.

``optax.MultiSteps(tx, every_k_schedule=K)`` adds up the gradients of K calls and applies one update on
the K-th: a bigger effective batch. K real steps of the same optimizer move the parameter K times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def quad_grad(w: jax.Array) -> jax.Array:
    """The gradient of ``sum((w - 3)²)``, whose optimum is 3."""
    return jax.grad(lambda w: jnp.sum((w - 3.0) ** 2))(w)


def against_k_steps(k: int, lr: float = 0.1) -> tuple[int, float, float]:
    """From w = 0, ``k`` calls of ``optax.MultiSteps(optax.sgd(lr), every_k_schedule=k)`` and ``k`` steps of
    ``optax.sgd(lr)``. Returns how many of the MultiSteps calls moved w, and where each left w. Raises
    AssertionError unless MultiSteps moved once and the real steps ended nearer the optimum."""
    sgd = optax.sgd(lr)
    multi = optax.MultiSteps(sgd, every_k_schedule=k)
    w_multi, s_multi = jnp.zeros(1), multi.init(jnp.zeros(1))
    w_k, s_k = jnp.zeros(1), sgd.init(jnp.zeros(1))
    moves = 0
    for _ in range(k):
        u, s_multi = multi.update(quad_grad(w_multi), s_multi, w_multi)
        moves += int(jnp.any(u != 0))
        w_multi = optax.apply_updates(w_multi, u)
        u, s_k = sgd.update(quad_grad(w_k), s_k, w_k)
        w_k = optax.apply_updates(w_k, u)
    w_multi, w_k = float(w_multi[0]), float(w_k[0])
    if not (moves == 1 and abs(w_k - 3) < abs(w_multi - 3)):
        raise AssertionError(f"MultiSteps moved w {moves} times to {w_multi}; {k} steps moved it to {w_k}")
    return moves, w_multi, w_k
