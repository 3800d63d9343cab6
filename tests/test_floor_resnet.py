"""Part VI's faster ResNet floor (chapters/floor/03-resnet-floor.md): the same network and losses as
Part II's floor, convolutions as patches @ kernel where they give the same numbers, bad batches refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fastjax.resnet import bench as bench_resnet, conv_trace, floor as FL, floor_checks, floor_variants
from fastjax.resnet import ladder as resnet_ladder, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig

# Three stages, so that the last two (4×4 and 2×2 images) take the patches path; narrow, one block per
# stage and a small batch keep the compilations short.
CONFIG = ResNetConfig(width=4, stages=3, blocks=1)
N_STEPS, BATCH = 5, 16


def _start():
    model = resnet_nnx.make_model(CONFIG, seed=0)
    return R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))


def _run(step, leaves, xs, ys):
    """Train from ``leaves``: the losses, the final leaves, and the first step's leaves (Adam's state
    then holds the first gradient)."""
    jitted, losses, first = jax.jit(step), [], None
    for x, y in zip(xs, ys):
        leaves, loss = jitted(leaves, x, y)
        losses.append(loss)
        first = leaves if first is None else first
    return np.array(losses), leaves, first


@pytest.fixture(scope="module")
def batches():
    return tuple(jnp.asarray(a) for a in resnet_ladder.training_batches(N_STEPS, BATCH))


@pytest.fixture(scope="module")
def start():
    """One model and its two step functions, shared by the tests below: every ``jax.jit`` of the same
    function reuses its compiled program, so each step compiles once per dtype for the whole module."""
    graphdef, treedef, leaves = _start()
    return graphdef, treedef, leaves, {"floor": R.floor_step(graphdef, treedef),
                                       "faster": FL.faster_floor_step(graphdef, treedef)}


def test_faster_floor_gives_the_floors_gradient_losses_and_weights(start, batches):
    graphdef, treedef, leaves, steps = start
    merged = lambda ls: nnx.merge(graphdef, jax.tree.unflatten(treedef, ls))  # noqa: E731
    ref, _, ref_first = _run(steps["floor"], leaves, *batches)
    ours, our_leaves, our_first = _run(steps["faster"], leaves, *batches)
    resnet_ladder.assert_same_gradients(resnet_ladder.first_gradient(merged(our_first)[1].opt_state),
                                        resnet_ladder.first_gradient(merged(ref_first)[1].opt_state), "faster floor")
    resnet_ladder.assert_same_losses(ours, ref, "faster floor")
    assert len(our_leaves) == len(leaves)
    with jax.enable_x64(True):  # the weights after N steps: float64 runs (resnet_ladder.assert_same_weights)
        leaves64, xs64 = resnet_ladder.to_float64(leaves), batches[0].astype(jnp.float64)
        weights = {name: resnet_nnx.weights(merged(_run(step, leaves64, xs64, batches[1])[1])[0])
                   for name, step in steps.items()}
    resnet_ladder.assert_same_weights(weights["faster"], weights["floor"], "faster floor")


def test_the_faster_floor_has_no_slow_layout_convolutions(start, batches):
    _, _, leaves, steps = start
    xs, ys = batches
    hlo = {name: jax.jit(step).lower(leaves, xs[0], ys[0]).compile().as_text() for name, step in steps.items()}
    assert "01fb_o01i->f01b" in hlo["floor"]  # the slow layout this page removes (as measured with jaxlib 0.10.2)
    assert "dim_labels=01fb" not in hlo["faster"]


@pytest.mark.parametrize("k, stride, pad", [(3, 1, 1), (3, 2, 1), (1, 2, 0)])
def test_conv_as_matmul_is_the_convolution_and_its_gradient(k, stride, pad):
    rng = np.random.default_rng(0)  # NumPy draws and one jitted program: no eager op to compile
    x = rng.standard_normal((8, 4, 4, 6), np.float32)
    w = rng.standard_normal((k, k, 6, 12), np.float32) / np.float32(np.sqrt(k * k * 6))
    side = (4 + 2 * pad - k) // stride + 1
    cot = rng.standard_normal((8, side, side, 12), np.float32)
    args = ((stride, stride), ((pad, pad), (pad, pad)))

    @jax.jit
    def both(x, w, cot):
        lax_conv = lambda x, w: jax.lax.conv_general_dilated(x, w, *args, dimension_numbers=("NHWC", "HWIO", "NHWC"))  # noqa: E731
        ours, our_vjp = jax.vjp(lambda x, w: FL.conv_as_matmul(x, w, *args), x, w)
        ref, ref_vjp = jax.vjp(lax_conv, x, w)
        return (ours, *our_vjp(cot)), (ref, *ref_vjp(cot))

    ours, ref = both(x, w, cot)
    # O(1) outputs, sums of at most 54 float32 products in another order: rounding of ~1e-7
    np.testing.assert_allclose(np.asarray(ours[0]), np.asarray(ref[0]), atol=1e-5)
    # the backward pass (VJP) with an O(1) cotangent: the input's gradient sums at most k·k·12 = 108 products
    # of O(0.1) kernel entries, the kernel's gradient 8·4·4 = 128 products of O(1) terms (|sum| ≲ 10):
    # float32 rounding of ~1e-6 of those sums; 1e-4 relative to each gradient's largest entry is a wide margin
    for name, a, b in zip(("images", "kernel"), ours[1:], ref[1:]):
        scale = float(np.max(np.abs(np.asarray(b))))
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-4 * scale, err_msg=name)


def test_the_gradient_check_fails_a_wrong_convolution_gradient():
    """A patch convolution whose kernel gradient is 1 % off gives another gradient: the check fails."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4, 4, 6), np.float32)
    w = rng.standard_normal((3, 3, 6, 12), np.float32) / np.float32(np.sqrt(54))
    args = ((1, 1), ((1, 1), (1, 1)))
    conv = lambda x, w: FL.conv_as_matmul(x, w, *args)  # noqa: E731

    @jax.custom_vjp
    def wrong(x, w):
        return conv(x, w)

    def fwd(x, w):
        return jax.vjp(conv, x, w)

    def bwd(vjp, g):
        dx, dw = vjp(g)
        return dx, 1.01 * dw

    wrong.defvjp(fwd, bwd)
    grad = lambda f: {"kernel": np.asarray(jax.jit(jax.grad(lambda w: jnp.sum(jnp.tanh(f(x, w)))))(w))}  # noqa: E731
    assert resnet_ladder.assert_same_gradients(grad(conv), grad(conv)) == 0.0
    with pytest.raises(AssertionError, match="gradient of kernel"):
        resnet_ladder.assert_same_gradients(grad(wrong), grad(conv))


def test_large_images_keep_xla_convolution():
    conv = FL.small_convs_as_matmul(max_side=4)
    x = jnp.ones((2, 8, 8, 3))
    w = jnp.ones((3, 3, 3, 5))
    dims = jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
    lowered = jax.jit(lambda a, b: conv(a, b, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dims)).lower(x, w)
    assert "convolution" in lowered.as_text()
    small = jax.jit(lambda a, b: conv(a, b, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dims)).lower(x[:, :4, :4], w)
    assert "convolution" not in small.as_text() and "dot_general" in small.as_text()


@pytest.fixture(scope="module")
def checked(start):
    _, _, leaves, steps = start
    return FL.checked_step(steps["faster"]), leaves


def test_checked_step_runs_a_good_batch(checked, batches):
    step, leaves = checked
    xs, ys = batches
    _, loss = step(leaves, xs[0], ys[0])
    assert np.isfinite(float(loss))


@pytest.mark.parametrize("images, labels, error, match", [
    (np.zeros((4, 8, 8)), np.zeros(4, np.int32), ValueError, "shape"),
    (np.zeros((4, 28, 28, 1)), np.zeros(4, np.int32), ValueError, "shape"),
    (np.zeros((4, 8, 8, 1), np.int32), np.zeros(4, np.int32), TypeError, "floating"),
    (np.zeros((4, 8, 8, 1), np.float32), np.array([0, 1, 10, 2]), ValueError, r"\[0, 10\)"),
    (np.zeros((4, 8, 8, 1), np.float32), np.array([0, -1, 3, 2]), ValueError, r"\[0, 10\)"),
    (np.zeros((4, 8, 8, 1), np.float32), np.zeros(4, np.float32), TypeError, "integer"),
    (np.zeros((4, 8, 8, 1), np.float32), np.zeros(3, np.int32), ValueError, "same length"),
])
def test_checked_step_refuses_bad_batches(checked, images, labels, error, match):
    step, leaves = checked
    with pytest.raises(error, match=match):
        step(leaves, images, labels)


def test_measure_floor_times_both_floors():
    floor, faster = bench_resnet.measure_floor(CONFIG, BATCH, repeats=2)
    assert floor.name == "floor" and faster.name == "faster floor"
    assert floor.median > 0 and faster.median > 0


def test_conv_trace_times_the_floors_convolutions_by_direction_and_stage(start, batches):
    graphdef, treedef, leaves, steps = start
    xs, ys = batches
    compiled = {name: jax.jit(step).lower(leaves, xs[0], ys[0]).compile() for name, step in steps.items()}
    rows = conv_trace.traced_ops(compiled["floor"], (leaves, xs[0], ys[0]), calls=2)
    groups, each = conv_trace.conv_breakdown(rows, compiled["floor"].as_text(), CONFIG)
    assert {d for d, _ in groups} == {"forward", "backward"}  # the step's gradient convolutions are traced too
    assert {c["stage"] for c in each} == set(range(CONFIG.stages))
    assert sum(groups.values()) == pytest.approx(sum(c["ms"] for c in each))
    assert sum(groups.values()) <= sum(r["total ms"] for r in rows)
    kinds = conv_trace.by_kind(rows)
    assert set(kinds) <= set(conv_trace.KINDS) and kinds["convolution"] == pytest.approx(sum(groups.values()))
    assert conv_trace.matrix_products(compiled["faster"].as_text()) > conv_trace.matrix_products(compiled["floor"].as_text())
    with pytest.raises(ValueError, match="at least one call"):
        conv_trace.traced_ops(compiled["floor"], (leaves, xs[0], ys[0]), calls=0)


def test_kind_of_names_convolutions_products_concatenations_and_the_rest():
    assert conv_trace.kind_of({"op": "convolution", "op name": "ynn_fusion.2"}) == "convolution"
    assert conv_trace.kind_of({"op": "dot", "op name": "dot.1"}) == "matrix products"
    assert conv_trace.kind_of({"op": "fusion", "op name": "ynn_fusion.3"}) == "matrix products"
    assert conv_trace.kind_of({"op": "concatenate", "op name": "concatenate.4"}) == "concatenate"
    assert conv_trace.kind_of({"op": "fusion", "op name": "fusion.5"}) == "fusions and the rest"
    assert conv_trace.layouts("a dim_labels=b01f_01io->b01f, b dim_labels=01fb_o01i->f01b, c dim_labels=b01f_01io->b01f") \
        == ["01fb_o01i->f01b", "b01f_01io->b01f"]


def test_compare_with_lax_passes_the_patch_product_and_fails_a_wrong_one():
    report = floor_checks.compare_with_lax(FL.conv_as_matmul, batch=4, c_in=6, c_out=12)
    assert set(report) == set(floor_checks.SHAPES)
    assert report["3×3, stride 1"]["patch matrix / input"] == 9.0 and report["1×1, stride 2"]["patch matrix / input"] == 0.25
    off = lambda x, w, strides, padding: 1.001 * FL.conv_as_matmul(x, w, strides, padding)  # noqa: E731
    with pytest.raises(AssertionError, match="forward"):
        floor_checks.compare_with_lax(off, batch=4, c_in=6, c_out=12)


def test_without_precision_drops_the_attribute_and_the_metadata_only():
    hlo = "HloModule m\n%d = f32[2,2] dot(%a, %b), operand_precision={highest,highest}, metadata={op_name=\"x\"}\nFileNames\n1 a.py"
    assert floor_checks.without_precision(hlo) == "%d = f32[2,2] dot(%a, %b)"


def test_conv_nchw_is_the_same_convolution_and_refuses_what_it_does_not_compute():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 4, 4, 3), np.float32), rng.standard_normal((3, 3, 3, 5), np.float32) / np.float32(np.sqrt(27))
    args = ((1, 1), ((1, 1), (1, 1)))
    ref = jax.lax.conv_general_dilated(x, w, *args, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    # O(1) outputs, the same sums of 27 float32 products in another layout (the forward row of TOLERANCES.md)
    np.testing.assert_allclose(np.asarray(floor_variants.conv_nchw(x, w, *args)), np.asarray(ref), atol=1e-5)
    with pytest.raises(ValueError, match="no dilation"):
        floor_variants.conv_nchw(x, w, *args, rhs_dilation=(2, 2))
