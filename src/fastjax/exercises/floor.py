"""Part VI's practice page's exercises (chapters/floor/05-practice.md): floor-1 to floor-4.

The programs and the reference solutions are the page's, exported to ``floor_code``. Each exercise's
inputs are made from a fixed seed, small enough that a check runs in seconds, the same in both sizes.
``update_passes`` is the page's evidence for floor-2: what each version of the update moves through memory.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from fastjax.exercises import Exercise, floor_code as code, register, same_arrays
from fastjax.tools import profiling

PAGE = "chapters/floor/05-practice"
PART = "Part VI"
SERIES_LENGTH, SERIES = 1000, 256  # floor-1: 256 random walks of 1,000 steps
ALPHA = 0.3
UPDATE_SIZE = 2**20  # floor-2: a million float32 parameters, 4 MiB per array
CONV_SHAPE = (96, 2, 2, 64)  # floor-3: the last stage of Part II's full network (batch, 2×2 pixels, channels)
GP_POINTS, GP_BATCHES, GP_BATCH = 500, 8, 64  # floor-4: observed points; batches of new points


def smoothing_problem(seed: int = 0) -> tuple:
    """``(alpha, y)``: the smoothing constant and ``y (SERIES_LENGTH, SERIES)`` random walks (float32)."""
    rng = np.random.default_rng(seed)
    y = np.cumsum(0.1 * rng.standard_normal((SERIES_LENGTH, SERIES)), axis=0).astype(np.float32)
    return jnp.float32(ALPHA), jnp.asarray(y)


def update_problem(seed: int = 0) -> tuple:
    """``(p, g, m, v, t)`` of one AdamW step at step ``t = 3``: parameters, a gradient whose norm (about 10)
    is clipped, and moments as a few steps leave them."""
    rng = np.random.default_rng(seed)
    p, g, m = (rng.standard_normal(UPDATE_SIZE).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(UPDATE_SIZE)).astype(np.float32) * np.float32(1e-4)
    return jnp.asarray(p), jnp.asarray(g * np.float32(0.01)), jnp.asarray(m * np.float32(0.01)), jnp.asarray(v), jnp.float32(3)


def conv_problem(seed: int = 0) -> tuple:
    """``((w1, w2), x)``: two 3×3 HWIO kernels (He-scaled) and NHWC images of ``CONV_SHAPE``."""
    rng = np.random.default_rng(seed)
    c = CONV_SHAPE[-1]
    w1, w2 = (jnp.asarray(rng.standard_normal((3, 3, c, c)).astype(np.float32) * np.float32(np.sqrt(2 / (9 * c))))
              for _ in range(2))
    return (w1, w2), jnp.asarray(rng.standard_normal(CONV_SHAPE).astype(np.float32))


def gp_problem(seed: int = 0) -> tuple:
    """``(x, y, batches)``: ``GP_POINTS`` observed points in [0, 10]², noisy values of sin(x₀)·cos(x₁/2), and
    ``GP_BATCHES`` batches of ``GP_BATCH`` new points, stacked ``(GP_BATCHES, GP_BATCH, 2)``."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, (GP_POINTS, 2))
    y = np.sin(x[:, 0]) * np.cos(x[:, 1] / 2) + 0.1 * rng.standard_normal(GP_POINTS)
    batches = rng.uniform(0, 10, (GP_BATCHES, GP_BATCH, 2))
    return tuple(jnp.asarray(a, jnp.float32) for a in (x, y, batches))


def _value_and_gradient(got: Any, want: Any) -> None:
    # The loss and d loss / d alpha, float32: the hand gradient and reverse mode sum the same terms in
    # another order, 1e-6 apart relative at most (4e-7 measured); a dropped term of the derivative moves it
    # by 40 % (measured; tests/test_exercises_floor.py). 1e-4 leaves room for another order of the sums.
    same_arrays(got, want, rtol=1e-4, what="(loss, d loss / d alpha)")


def _update(got: Any, want: Any) -> None:
    # The same float32 operations in another order: a few ulps, the norm a sum of 2^20 squares (~1e-6
    # relative); atol for entries near zero. Bias correction left out scales the step by
    # √(1 − B2³)/(1 − B1³) ≈ 0.2 at t = 3.
    same_arrays(got, want, rtol=1e-5, atol=1e-7, what="(new parameters, m, v)")


def _relative_to_largest(got: Any, want: Any, fraction: float, what: str) -> None:
    import jax

    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    if len(got_leaves) != len(want_leaves):  # same_arrays names the structure
        same_arrays(got, want, rtol=0, what=what)
    for g, w in zip(got_leaves, want_leaves):
        same_arrays(g, w, rtol=0, atol=fraction * float(np.max(np.abs(np.asarray(w)))), what=what)


def _block_gradients(got: Any, want: Any) -> None:
    # float32 sums of at most 9·64 = 576 products in another order: ~1e-6 of the largest entry of each
    # array; 1e-4 of it, as chapter floor/03 checks the same product against XLA's convolution.
    _relative_to_largest(got, want, 1e-4, "(loss, (d w1, d w2))")


def _predictions(got: Any, want: Any) -> None:
    # float32 solves with a matrix of condition number ~1e4 (σ² = 0.1 on the diagonal): ~1e-5 on predictions
    # of size 1 (1.5e-5 measured between the inverse and the solve); a missing σ² or another kernel moves
    # them by 1e-1 or more (tests/test_exercises_floor.py).
    same_arrays(got, want, rtol=0, atol=1e-3, what="the predicted means")


register(Exercise(
    name="floor-1", title="A gradient by hand", part=PART, page=PAGE,
    skill="write a gradient by hand and give it to JAX with jax.custom_vjp", minutes=30,
    arguments=smoothing_problem, reference=code.loss_and_grad_by_hand, start=code.loss_and_grad_autodiff,
    same=_value_and_gradient,
    wrong_hint="check your derivative against jax.grad(smoothing_loss) in float64 first (jax.enable_x64): "
               "d_t = y_t − s_(t−1) + (1 − alpha)·d_(t−1), and the forecast of y_t is s_(t−1)",
    slow_hint="carry the derivative forwards in the same lax.scan as the loss (one pass, no stored levels), and "
              "jit the function once",
    # reverse mode stores every level for its backward loop (3.9 MiB of scratch against 1.0, XLA's memory
    # analysis, jax 0.10.2 and 0.12; the loops themselves do not show in a trace on every XLA release)
    witness=("scratch",), program=lambda answer: answer,
))

register(Exercise(
    name="floor-2", title="One program for the update", part=PART, page=PAGE,
    skill="cut the passes over memory: one fused program, no host read", minutes=20,
    arguments=update_problem, reference=code.update_fused, start=code.update_in_pieces, same=_update,
    wrong_hint="clip by min(1, MAX_NORM / norm), update both moments from the clipped gradient, and divide "
               "them by 1 − B1**t and 1 − B2**t before the step",
    slow_hint="one jax.jit around the whole update, the clipping factor computed as an array inside it "
              "(a float() of the norm makes Python wait for it)",
    # the starting program reads the norm (float()); so does a fused answer that keeps it. Its pieces are
    # jitted apart: one program each
    witness=("host reads", "programs"),
    slow_hints={"host reads": "the clipping factor as an array inside the one jitted update: min(1, MAX_NORM / "
                              "norm) with jnp.minimum, no float() of the norm and no Python `if` on it",
                "programs": "one jax.jit around the whole update: the pieces as separate jitted functions make one "
                        "pass over memory each"},
))

register(Exercise(
    name="floor-3", title="A convolution as one matrix product", part=PART, page=PAGE,
    skill="a convolution on small images as im2col @ kernel", minutes=30,
    arguments=conv_problem, reference=code.block_grad_patches, start=code.block_grad_lax,
    run=lambda answer, args: answer(*args), same=_block_gradients,
    wrong_hint="pad by one pixel on each side, take the nine shifted copies in the kernel's order (row i, then "
               "column j, as w[i, j]), and reshape the kernel to (9·c_in, c_out)",
    slow_hint="on 2×2 images the whole convolution should be one matrix product: no lax.conv left, jitted once",
    witness=("convolutions",),
))

register(Exercise(
    name="floor-4", title="Solve, and factor once", part=PART, page=PAGE,
    skill="a solve with a factorization made once, not an inverse per call", minutes=20,
    arguments=gp_problem, reference=code.predict_batches, start=code.predict_batches_start,
    same=_predictions,
    wrong_hint="the weights are (K + NOISE·I)⁻¹ y with K = kernel(x, x): keep NOISE on the diagonal",
    slow_hint="solve for the weights once per call (jnp.linalg.solve), outside the loop over batches; each batch "
              "then needs one kernel product",
    witness=("triangular solves",),  # an inverse per batch: two per batch (16); factored once: two in all
))


def update_passes() -> dict[str, Any]:
    """floor-2's passes over memory, on the check's inputs, counted in arrays of the parameters' size:
    ``pieces``, XLA's bytes accessed by each program of the starting update; ``fused``, by the one program;
    ``loops``, how many loops of the one program's compiled text write an array of that size, and
    ``loop reads``, the arrays they read between them; ``array bytes``, the size of one array."""
    p, g, m, v, step_t = update_problem()
    array_bytes = p.size * p.dtype.itemsize

    def passes(fn, *args):
        return profiling.cost(fn.lower(*args).compile())["bytes accessed"] / array_bytes

    g_clipped = code.scaled(g, 0.5)
    m1, v1 = code.moments(m, v, g_clipped)
    pieces = {"gradient_norm": passes(code.gradient_norm, g), "scaled": passes(code.scaled, g, 0.5),
              "moments": passes(code.moments, m, v, g_clipped),
              "bias_corrected": passes(code.bias_corrected, m1, v1, step_t),
              "adamw_step": passes(code.adamw_step, p, m1, v1)}
    hlo = code.update_fused.lower(p, g, m, v, step_t).compile().as_text()
    array_loops = [f for f in profiling.fusion_bytes(hlo) if f["written bytes"] == array_bytes]
    return {"pieces": pieces, "fused": passes(code.update_fused, p, g, m, v, step_t), "loops": len(array_loops),
            "loop reads": sum(f["read bytes"] for f in array_loops) / array_bytes, "array bytes": array_bytes}
