"""Every rung of the Part II ladder trains the same network the same way, and each is traced once."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from fastjax.resnet import bench as B, ladder as L, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools import timing
from fastjax.tools.timing import Timing

# One stage keeps each rung's compile short (most of this file's time): the rungs differ in how
# they call the step, not in the network (tests/test_resnet.py checks the deeper twins).
CONFIG = ResNetConfig(width=4, stages=1, blocks=1)
N_STEPS, BATCH = 10, 16


@pytest.fixture(scope="module")
def batches():
    return L.training_batches(N_STEPS, BATCH)


@pytest.fixture(scope="module")
def reference(batches):
    rung = L.build("floor", CONFIG)
    losses, gradient32 = L.trajectory_with_gradient(rung, *batches)
    return losses, rung.weights(), L.float64_first_gradient("floor", CONFIG, batches[0][0], batches[1][0]), gradient32


# The NNX paths trace the floor's own step; the eager step and the Equinox twin are other programs, so
# tests/test_isa.py runs those two again under every instruction set.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.isa) if n in ("no-jit", "eqx flatten trick") else n
                                  for n in L.NNX_RUNGS + L.EQX_RUNGS if not n.startswith("scan")])
def test_every_rung_computes_the_floors_first_gradient_and_trajectory(name, batches, reference):
    ref_losses, ref_weights, ref_gradient, _ = reference
    xs, ys = batches
    L.assert_same_gradients(L.float64_first_gradient(name, CONFIG, xs[0], ys[0]), ref_gradient, name)
    rung = L.build(name, CONFIG)
    losses = L.trajectory(rung, xs, ys)
    L.assert_same_losses(losses, ref_losses, name)
    weights = rung.weights()
    assert weights.keys() == ref_weights.keys()
    if name not in L.EQX_RUNGS and name != "no-jit":  # the same traced step: the same float32 weights
        for k in weights:
            np.testing.assert_allclose(weights[k], ref_weights[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert rung.traces.count == (N_STEPS if name == "no-jit" else 1)


@pytest.mark.isa
@pytest.mark.parametrize("name", [n for n in L.NNX_RUNGS if n.startswith("scan")])
def test_scan_rungs_follow_the_floor_and_end_with_its_weights(name, batches, reference):
    ref_losses, ref_weights, _, _ = reference
    rung = L.build(name, CONFIG)
    assert rung.gradient is None  # K steps per call: no state after exactly one step
    L.assert_same_losses(L.trajectory(rung, *batches), ref_losses, name)
    weights = rung.weights()
    for k in weights:  # the floor's step traced inside a loop: measured identical weights at the quick size
        np.testing.assert_allclose(weights[k], ref_weights[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert rung.traces.count == 1


@pytest.fixture(scope="module")
def float64_floor(batches):
    xs, ys = batches
    with jax.enable_x64(True):
        rung = L.build("floor", CONFIG, float64=True)
        L.trajectory(rung, xs.astype(np.float64), ys)
        return rung.weights()


@pytest.mark.isa
@pytest.mark.parametrize("name", ["no-jit", "eqx flatten trick"])
def test_other_programs_end_with_the_floors_weights_in_float64(name, batches, float64_floor):
    xs, ys = batches
    with jax.enable_x64(True):
        rung = L.build(name, CONFIG, float64=True)
        L.trajectory(rung, xs.astype(np.float64), ys)
        weights = rung.weights()
    assert all(w.dtype == np.float64 for w in weights.values())
    assert L.assert_same_weights(weights, float64_floor, name) < L.WEIGHT_ATOL_F64


def _wrong_floor_step(graphdef, treedef, grad_scale=1.0, drop_last=False):
    """The floor step with a deliberate error: the gradient scaled, or the last example's term dropped."""
    def step(leaves, images, labels):
        model, optimizer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

        def loss_fn(m):
            per_example = optax.softmax_cross_entropy_with_integer_labels(m(images), labels)
            return per_example[:-1].mean() if drop_last else per_example.mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, jax.tree.map(lambda g: grad_scale * g, grads))
        return jax.tree.leaves(nnx.state((model, optimizer))), loss

    return step


def _run_wrong(batches, float64=False, **wrong):
    xs, ys = batches
    model = resnet_nnx.make_model(CONFIG, seed=0)
    if float64:
        nnx.update(model, L.to_float64(nnx.state(model)))
        xs = xs.astype(np.float64)
    graphdef, treedef, leaves = R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))
    step, gradient = jax.jit(_wrong_floor_step(graphdef, treedef, **wrong)), None
    for x, y in zip(xs, ys):
        leaves, _ = step(leaves, x, y)
        if gradient is None:
            gradient = L.first_gradient(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))[1].opt_state)
    return gradient, resnet_nnx.weights(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))[0])


@pytest.mark.parametrize("wrong", [dict(grad_scale=1.01), dict(drop_last=True)], ids=["scaled by 1.01", "term dropped"])
def test_a_wrong_gradient_fails_the_gradient_check(wrong, batches, reference):
    ref_losses, ref_weights, ref_gradient, _ = reference
    with jax.enable_x64(True):
        gradient, _ = _run_wrong(tuple(b[:1] for b in batches), float64=True, **wrong)
    with pytest.raises(AssertionError, match="gradient of"):
        L.assert_same_gradients(gradient, ref_gradient, "wrong step")
    _, weights = _run_wrong(batches, **wrong)
    if "grad_scale" in wrong:  # why the weights could not tell: Adam divides the scale out (up to its eps)
        gap = max(float(np.max(np.abs(weights[k] - ref_weights[k]))) for k in weights)
        assert gap < 1e-4 * R.LEARNING_RATE * N_STEPS, gap


def test_a_dropped_term_fails_the_float64_weight_check(batches, float64_floor):
    with jax.enable_x64(True):
        _, weights = _run_wrong(batches, float64=True, drop_last=True)
    with pytest.raises(AssertionError):
        L.assert_same_weights(weights, float64_floor, "term dropped")


def test_first_gradient_is_read_after_exactly_one_step(batches):
    xs, ys = batches
    rung = L.build("nnx.jit", CONFIG)
    with pytest.raises(ValueError, match="0 steps"):
        rung.gradient()
    L.trajectory(rung, xs[:2], ys[:2])
    with pytest.raises(ValueError, match="exactly one"):
        rung.gradient()


def test_trajectory_with_gradient_needs_one_step_per_call(batches):
    with pytest.raises(ValueError, match="steps per call"):
        L.trajectory_with_gradient(L.build("scan K=10", CONFIG), *batches)


def test_adam_b1_is_the_one_the_optimizer_uses():
    params = {"w": jnp.ones(3)}
    _, state = R.TX.update({"w": jnp.full(3, 2.0)}, R.TX.init(params), params)
    np.testing.assert_allclose(state[0].mu["w"], (1 - L.ADAM_B1) * 2.0, rtol=1e-6)
    assert L.first_gradient(state)["w"] == pytest.approx([2.0] * 3, rel=1e-6)


def test_to_float64_needs_x64():
    with pytest.raises(RuntimeError, match="enable_x64"):
        L.to_float64({"w": jnp.ones(2)})
    with jax.enable_x64(True):
        out = L.to_float64({"w": jnp.ones(2), "count": jnp.zeros((), jnp.int32), "name": "bn"})
    assert out["w"].dtype == jnp.float64 and out["count"].dtype == jnp.int32 and out["name"] == "bn"


def test_trajectory_needs_whole_scan_chunks(batches):
    rung = L.build("scan K=10", CONFIG)
    xs, ys = batches
    with pytest.raises(ValueError, match="not a multiple"):
        L.trajectory(rung, xs[:5], ys[:5])


def test_unknown_rung_is_rejected():
    with pytest.raises(ValueError, match="unknown rung"):
        L.build("jit everything", CONFIG)


def test_interleaved_timing_returns_one_timing_per_callable():
    out = timing.time_interleaved({"a": lambda: 1, "b": B.dispatch_floor()}, repeats=3, per={"a": 2})
    assert set(out) == {"a", "b"} and all(isinstance(t, Timing) for t in out.values())
    assert len(out["a"].seconds) == 3 and out["a"].per == 2


def test_measure_ladder_shape(monkeypatch):
    monkeypatch.setattr(B, "settings", lambda: type("S", (), dict(
        config=CONFIG, batch=BATCH, steps=N_STEPS, repeats=1, size="quick"))())
    out = B.measure_ladder(names=("nnx.jit", "split/merge"), repeats=1)
    assert set(out) == {"rungs", "floor", "floor_fast", "dispatch_floor", "extra"}
    assert out["floor_fast"].name == B.FASTER_FLOOR and out["floor_fast"].median > 0
    assert [t.name for t in out["rungs"]] == ["nnx.jit", "split/merge"]
    assert out["extra"]["traces"] == {"nnx.jit": 1, "split/merge": 1, "floor": 1}


def _scan_of_conv(dims):
    x = jnp.ones((2, 4, 4, 3)) if dims[0] == "NHWC" else jnp.ones((2, 3, 4, 4))
    w = jnp.ones((3, 3, 3, 3))

    def body(c, _):
        return jax.lax.conv_general_dilated(c, w, (1, 1), "SAME", dimension_numbers=dims), None

    return jax.jit(lambda c: jax.lax.scan(body, c, None, length=3)[0]).lower(x).compile().as_text()


def test_convolutions_are_counted_by_place_and_layout():
    assert B.convolutions(_scan_of_conv(("NHWC", "HWIO", "NHWC"))) == {"in a loop, NHWC/HWIO": 1}
    assert B.convolutions(_scan_of_conv(("NCHW", "OIHW", "NCHW"))) == {"in a loop, other layout": 1}
    top = jax.jit(lambda c: c * 2).lower(jnp.ones(3)).compile().as_text()
    assert B.convolutions(top) == {}


def test_trace_ops_sums_the_ops_of_one_program(tmp_path):
    f = jax.jit(lambda c: jax.lax.scan(lambda c, _: (jnp.sin(c) @ c, None), c, None, length=4)[0])
    x = jnp.ones((32, 32))
    compiled = f.lower(x).compile()
    compiled(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        compiled(x).block_until_ready()
    trace = next(tmp_path.rglob("*.trace.json.gz"))
    rows = B.trace_ops(trace, compiled.as_text())
    assert rows and all(r["calls"] >= 1 and r["total ms"] >= 0 for r in rows)
    assert any(r["in_loop"] for r in rows)
    assert [r["total ms"] for r in rows] == sorted((r["total ms"] for r in rows), reverse=True)


class _Counted:
    unflattens = 0

    def __init__(self, x):
        self.x = x


jax.tree_util.register_pytree_node(
    _Counted, lambda c: ((c.x,), None),
    lambda _, children: (setattr(_Counted, "unflattens", _Counted.unflattens + 1), _Counted(*children))[1])


def test_round_trips_returns_nothing_and_runs_n_times():
    _Counted.unflattens = 0
    assert B.round_trips(_Counted(jnp.ones(2)), 5)() is None
    assert _Counted.unflattens == 5


def test_assert_same_losses_checks_the_first_loss_tightly_and_the_rest_loosely():
    ref = np.array([2.0, 1.5, 1.0])
    assert L.assert_same_losses(ref * [1, 1.01, 0.99], ref) == pytest.approx(0.01)
    with pytest.raises(AssertionError, match="first loss"):
        L.assert_same_losses(ref * [1 + 2e-4, 1, 1], ref)
    with pytest.raises(AssertionError):
        L.assert_same_losses(ref * [1, 1.05, 1], ref)
    with pytest.raises(AssertionError, match="losses against"):
        L.assert_same_losses(ref[:2], ref)


def test_assert_same_gradients_is_relative_to_each_arrays_norm():
    ref = {"w": np.array([1.0, -2.0, 1e-9]), "b": np.array([3.0])}
    near = {"w": ref["w"] * (1 + 5e-11), "b": ref["b"]}
    assert L.assert_same_gradients(near, ref) == pytest.approx(5e-11, rel=1e-3)
    tiny = {"w": np.array([1.0, -2.0, 1e-9 + 1e-11]), "b": ref["b"]}  # an entry near zero 1 % off: fine in the norm
    assert L.assert_same_gradients(tiny, ref) < L.GRAD_RTOL_F64
    for wrong in ({"w": ref["w"] * 1.01, "b": ref["b"]}, {"w": ref["w"], "b": np.array([0.0])},
                  {"w": ref["w"], "b": np.array([np.nan])}):
        with pytest.raises(AssertionError, match="gradient of"):
            L.assert_same_gradients(wrong, ref)
    with pytest.raises(AssertionError, match="different arrays"):
        L.assert_same_gradients({"w": ref["w"]}, ref)
    with pytest.raises(AssertionError, match="shape"):
        L.assert_same_gradients({"w": ref["w"][:2], "b": ref["b"]}, ref)


def test_assert_same_weights_compares_float64_weights_tightly():
    ref = {"w": np.zeros(3), "bn.mean": np.array([0.0, 10.0])}
    step = L.WEIGHT_ATOL_F64
    ours = {"w": np.array([0.0, 0.5 * step, 0.0]), "bn.mean": np.array([0.0, 10.0 + 5 * step])}
    assert L.assert_same_weights(ours, ref) == pytest.approx(0.5 * step)
    with pytest.raises(AssertionError, match="w"):
        L.assert_same_weights({**ours, "w": np.array([0.0, 2 * step, 0.0])}, ref)
    with pytest.raises(AssertionError, match="bn.mean"):  # statistics: relative to their largest entry (10)
        L.assert_same_weights({**ours, "bn.mean": np.array([0.0, 10.0 + 20 * step])}, ref)
    with pytest.raises(AssertionError, match="different arrays"):
        L.assert_same_weights({"v": np.zeros(3)}, {"w": np.zeros(3)})
    with pytest.raises(ValueError, match="float64"):
        L.assert_same_weights({"w": np.zeros(3, np.float32)}, {"w": np.zeros(3)})


def test_the_sweep_stops_before_a_width_its_budget_cannot_pay(monkeypatch):
    """A fake clock: each step of width w costs (w/4)³ hundredths of a second, as the budget predicts."""
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def fake_build(name, config):
        def run(x, y):
            clock[0] += 0.01 * (config.width / 4) ** 3
        return B.Rung(name, run, weights=dict)

    monkeypatch.setattr(B, "build", fake_build)
    out = B.measure_sweep(widths=(4, 8, 16), n_steps=1, names=("nnx.jit", "floor"), repeats=1, budget=2.0)
    assert out["widths"] == [4, 8] and out["skipped"] == [16]
    assert len(out["seconds"]["floor"]) == 2 and np.allclose(out["overhead"]["nnx.jit"], 0.0)
    with pytest.raises(ValueError, match="widths must increase"):
        B.measure_sweep(widths=(8, 4), n_steps=1, names=("floor",), repeats=1, budget=2.0)


def test_assert_same_gradients_allows_float32_its_own_bound():
    ref = {"w": np.array([1.0, 2.0])}
    near = {"w": np.array([1.0, 2.0 * (1 + 5e-5)], np.float32)}
    assert L.assert_same_gradients(near, ref) < L.GRAD_RTOL_F32
    with pytest.raises(AssertionError, match="in float64"):
        L.assert_same_gradients({"w": np.array([1.0, 2.0 * (1 + 5e-5)])}, ref)
    with pytest.raises(AssertionError, match="in float32"):
        L.assert_same_gradients({"w": np.array([1.0, 2.0 * 1.001], np.float32)}, ref)


def test_the_float64_bounds_follow_from_their_derivation():
    # ladder.py's comment above GRAD_RTOL_F64: two float64 programs differ by at most 2·κ·u64; the
    # bound leaves a factor of at least 100 over that; the first float32 loss is allowed 2·κ·u32
    assert L.GRAD_RTOL_F64 >= 100 * 2 * L.ROUNDING_GROWTH * L.U64
    assert L.GRAD_RTOL_F32 == pytest.approx(2 * L.ROUNDING_GROWTH * L.U32)
    assert L.FIRST_LOSS_RTOL == pytest.approx(2 * L.ROUNDING_GROWTH * L.U32)


@pytest.mark.isa
@pytest.mark.parametrize("name", ["no-jit", "eqx.filter_jit", "floor"])
def test_float32_rounding_of_the_first_gradient_is_within_the_assumed_growth(name, batches, reference):
    """The premise of GRAD_RTOL_F64 and FIRST_LOSS_RTOL (ladder.py): each rung's float32 first gradient is
    within ROUNDING_GROWTH float32 roundings of the float64 one, in the 2-norm of every array. Run under
    every --xla_cpu_max_isa by tests/test_isa.py."""
    xs, ys = batches
    rung = L.build(name, CONFIG)
    L.trajectory(rung, xs[:1], ys[:1])
    gap = L.gradient_gap(rung.gradient(), reference[2])
    assert gap <= L.ROUNDING_GROWTH * L.U32, (name, gap, gap / L.U32)
