"""Checks that a changed ResNet floor computes what Part II's floor computes (chapters/floor/03-resnet-floor.md).

- ``compare_with_lax``: a patch convolution (im2col @ kernel) against ``jax.lax.conv_general_dilated`` on the
  network's three convolution shapes, forward and backward, and how large its patch matrix is.
- ``train_like_floor``: compiled steps trained from the floor's start on the same batches; each must give
  the floor's first gradient and losses by Part II's rules (``resnet_ladder.assert_same_gradients`` and
  ``assert_same_losses``).
- ``without_precision``: a compiled program's text without the precision attribute and the metadata;
  ``check_kept_convolutions``: channels first and ``Precision.HIGHEST`` leave XLA:CPU's program as it was.

Each raises an AssertionError naming what differs.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import numpy as np

from fastjax.resnet import ladder as resnet_ladder

# The ResNet's convolutions: 3×3 of stride 1 and 2, and the 1×1 shortcut of stride 2: (k, stride, pad).
SHAPES = {"3×3, stride 1": (3, 1, 1), "3×3, stride 2": (3, 2, 1), "1×1, stride 2": (1, 2, 0)}


def compare_with_lax(conv: Callable[..., Any], batch: int, c_in: int, c_out: int, side: int = 4,
                     seed: int = 1) -> dict[str, dict[str, float]]:
    """``conv(x, kernel, strides, padding)`` (NHWC × HWIO) against XLA's convolution on each of ``SHAPES``,
    on ``batch`` images of ``side``×``side`` pixels: forward, and backward (the VJP of an O(1) cotangent with
    respect to the image and the kernel), each within 1e-4 of the reference's largest entry. Returns, per
    shape, each part's largest gap (a share of that entry) and ``"patch matrix / input"``: the entries an
    im2col patch matrix holds per input entry."""
    rng = np.random.default_rng(seed)  # NumPy draws: no small JAX program to compile per shape
    x = rng.standard_normal((batch, side, side, c_in), np.float32)
    kernels = {name: rng.standard_normal((k, k, c_in, c_out), np.float32) / np.float32(np.sqrt(k * k * c_in))
               for name, (k, _, _) in SHAPES.items()}
    cots = {name: rng.standard_normal((batch, (side + 2 * p - k) // s + 1, (side + 2 * p - k) // s + 1, c_out),
                                      np.float32) for name, (k, s, p) in SHAPES.items()}

    @jax.jit
    def both_ways(x, kernels, cots):
        """Both convolutions forward and backward for each shape: one program, one compilation."""
        out = {}
        for name, (k, stride, pad) in SHAPES.items():
            args = ((stride, stride), ((pad, pad), (pad, pad)))
            lax_conv = lambda x, w: jax.lax.conv_general_dilated(x, w, *args, dimension_numbers=("NHWC", "HWIO", "NHWC"))  # noqa: E731
            ref, ref_vjp = jax.vjp(lax_conv, x, kernels[name])
            ours, our_vjp = jax.vjp(lambda x, w: conv(x, w, *args), x, kernels[name])
            out[name] = {"patches": (ours, *our_vjp(cots[name])), "lax": (ref, *ref_vjp(cots[name]))}
        return out

    report = {}
    for name, out in both_ways(x, kernels, cots).items():
        k = SHAPES[name][0]
        _, ho, wo, _ = out["patches"][0].shape
        report[name] = {}
        for part, ours, ref in zip(("forward", "d image", "d kernel"), out["patches"], out["lax"]):
            # forward: unit-variance outputs, sums of at most 9·c_in float32 products in another order;
            # backward: each entry sums at most 9·c_out (image) or batch·side² (kernel) products. Float32
            # rounding of ~1e-6 of the largest entry; 1e-4 of it is a wide margin at the page's sizes.
            ours, ref = np.asarray(ours), np.asarray(ref)
            scale = float(np.max(np.abs(ref)))
            np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4 * scale, err_msg=f"{name}, {part}")
            report[name][part] = float(np.max(np.abs(ours - ref))) / scale
        # patches (n·ho·wo, k²·c_in) against the image (n·h·w·c_in)
        report[name]["patch matrix / input"] = ho * wo * k * k / (side * side)
    return report


def train_like_floor(executables: dict[str, Callable[..., Any]], leaves0: list, xs: Any, ys: Any,
                     merge: Callable[[list], tuple]) -> dict[str, Any]:
    """Train each of ``executables`` (``step(leaves, x, y) -> (leaves, loss)``; one named ``"floor"``) from
    ``leaves0`` on the batches ``xs``, ``ys``, and assert that each gives the floor's first gradient (read from
    Adam's state after the first step; ``merge(leaves) -> (model, optimizer)``) and the floor's losses.
    Returns ``runs`` (name -> losses, last leaves, leaves after the first step) and the largest gaps of each:
    ``gradient`` (of an array's norm) and ``losses`` (relative)."""
    if "floor" not in executables:
        raise ValueError(f"train_like_floor compares with the step named 'floor'; got {list(executables)}")
    runs = {}
    for name, executable in executables.items():
        leaves, losses, first = leaves0, [], None
        for x, y in zip(xs, ys):
            leaves, loss = executable(leaves, x, y)
            losses.append(loss)
            first = leaves if first is None else first
        runs[name] = (np.array(losses), leaves, first)

    def first_gradient(leaves):
        return resnet_ladder.first_gradient(merge(leaves)[1].opt_state)

    ref = first_gradient(runs["floor"][2])
    gradient = {name: resnet_ladder.assert_same_gradients(first_gradient(run[2]), ref, name) for name, run in runs.items()}
    losses = {name: resnet_ladder.assert_same_losses(run[0], runs["floor"][0], name) for name, run in runs.items()}
    return {"runs": runs, "gradient": gradient, "losses": losses}


def without_precision(hlo: str) -> str:
    """A compiled program's text without the precision attribute, the source metadata and debug tables."""
    hlo = re.sub(r", (operand_precision|metadata)=\{[^}]*\}", "", hlo)
    return hlo.split("\n", 1)[1].split("\nFileNames")[0]  # the first line names the module


def check_kept_convolutions(compiled: dict[str, Any], runs: dict[str, Any], floor: str, nchw: str,
                            highest: str) -> dict[str, Any]:
    """The experiments that keep XLA's convolutions change nothing that runs: the channels-first program
    (``compiled[nchw]``) holds the floor's convolution layouts (XLA assigns layouts itself), and, on XLA:CPU,
    the ``Precision.HIGHEST`` program is the floor's but for the precision attribute and trains to the same
    bits (``runs[name] = (losses, leaves)`` from ``train_like_floor``). Raises AssertionError where not;
    returns the layouts and the two precision findings (on another device they are reported, not asserted)."""
    from fastjax.resnet import conv_trace

    layouts = {name: conv_trace.layouts(compiled[name].compiled.as_text()) for name in (floor, nchw)}
    if layouts[floor] != layouts[nchw]:
        raise AssertionError(f"channels first changed the compiled layouts: {layouts}")
    same_bits = bool(np.array_equal(runs[highest][0], runs[floor][0])
                     and all(np.array_equal(a, b) for a, b in zip(runs[highest][1], runs[floor][1])))
    same_program = (without_precision(compiled[highest].compiled.as_text())
                    == without_precision(compiled[floor].compiled.as_text()))
    if jax.default_backend() == "cpu" and not (same_bits and same_program):  # what XLA:CPU does
        raise AssertionError(f"Precision.HIGHEST changed XLA:CPU's program: bits {same_bits}, program {same_program}")
    return {"layouts": layouts, "same bits": same_bits, "same program": same_program}
