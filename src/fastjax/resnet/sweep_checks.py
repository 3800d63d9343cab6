"""The evidence of Part IV's sweep page (chapters/many/03-resnet-sweep.md): every member of the vmapped
sweep trains as it does alone (float64), and what XLA:CPU makes of the one program's convolutions.

``member_gaps`` runs the vmapped step (Part II's floor, or another ``make_step``) and each member's floor
alone in float64, and raises ``resnet_ladder``'s AssertionError where a member's weights leave the
float64 bound; ``count_convolutions`` counts the convolutions of a compiled program's text and the grouped
ones; ``grouped_against_separate`` checks and times one grouped convolution against K separate ones.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import nnx

from fastjax.resnet import ladder as resnet_ladder, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.resnet.sweep import member, sweep_start, sweep_step
from fastjax.tools import timing

CONVOLUTION = r"= \S+ convolution\("
GROUPED = r"feature_group_count=(?!1\b)\d+"
U32 = 2.0**-24  # float32's unit roundoff


def member_gaps(config: ResNetConfig, seeds, xs, ys, steps: int, make_step=R.floor_step) -> list[float]:
    """Train the members ``seeds`` ``steps`` steps on the batches ``xs, ys`` in float64, as one vmapped
    program of ``make_step`` and each alone with Part II's floor; return each member's largest weight gap
    (``resnet_ladder.assert_same_weights`` raises beyond ``WEIGHT_ATOL_F64``)."""
    with jax.enable_x64(True):
        graphdef, treedef, stacked = sweep_start(config, seeds)
        stacked = resnet_ladder.to_float64(stacked)
        step = jax.jit(sweep_step(graphdef, treedef, make_step))
        alone = jax.jit(R.floor_step(graphdef, treedef))
        singles = [member(stacked, k) for k in range(len(seeds))]
        for x, y in zip(jnp.asarray(xs[:steps], jnp.float64), ys[:steps]):
            stacked, _ = step(stacked, x, y)
            singles = [alone(leaves, x, y)[0] for leaves in singles]

        def weights(leaves):
            return resnet_nnx.weights(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))[0])

        return [resnet_ladder.assert_same_weights(weights(member(stacked, k)), weights(singles[k]), f"member {k}")
                for k in range(len(seeds))]


def count_convolutions(hlo: str) -> tuple[int, int]:
    """``(convolutions, grouped ones)`` in a compiled program's text."""
    return len(re.findall(CONVOLUTION, hlo)), len(re.findall(GROUPED, hlo))


def grouped_against_separate(batch: int, width: int, members: int, repeats: int) -> dict[str, timing.Timing]:
    """One 3×3 convolution of ``members`` groups of ``width`` channels on 8×8 images, as one grouped
    convolution (as the vmapped program runs it) and as K separate ones in one jitted function: checked
    to agree within float32 rounding, then timed in turns. Each output sums n = 9·width products, so each
    side is within (n + 1)·u·Σ|a·k| of the exact value (Higham, §3.1), the two within twice that; raises
    AssertionError beyond it."""
    c = width
    acts = jax.random.normal(jax.random.key(0), (batch, 8, 8, members * c))
    kernels = jax.random.normal(jax.random.key(1), (3, 3, c, members * c))

    def conv(a, k, groups):
        return jax.lax.conv_general_dilated(a, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            feature_group_count=groups)

    grouped = jax.jit(lambda a, k: conv(a, k, members))
    separate = jax.jit(lambda a, k: jnp.concatenate(
        [conv(a[..., i * c:(i + 1) * c], k[..., i * c:(i + 1) * c], 1) for i in range(members)], axis=-1))
    bound = 2 * (9 * c + 1) * U32 * separate(jnp.abs(acts), jnp.abs(kernels))
    if not bool(jnp.all(jnp.abs(grouped(acts, kernels) - separate(acts, kernels)) <= bound)):
        raise AssertionError("the grouped convolution and the K separate ones differ beyond float32 rounding")
    return timing.time_interleaved({"grouped (as vmapped)": lambda: grouped(acts, kernels),
                                    "K separate convolutions": lambda: separate(acts, kernels)}, repeats=repeats)
