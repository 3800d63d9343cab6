"""Part IV's sweep of ResNets as one program (fastjax.resnet.sweep, written in chapters/many/03-resnet-sweep.md):
each member of the vmapped floor step trains as the floor alone (float64), and each member of the torch.func
ensemble as its twin alone (float64), at a small size."""

from __future__ import annotations

import numpy as np
import pytest

import fastjax  # noqa: F401  (before JAX)
import jax
import jax.numpy as jnp
from flax import nnx

from fastjax.resnet import ladder, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig

torch = pytest.importorskip("torch", reason="fastjax.resnet.sweep holds the torch.func ensemble too")

from fastjax.resnet import sweep as SW, twin_check as C  # noqa: E402

pytestmark = pytest.mark.pinned
CONFIG, BATCH, SEEDS = ResNetConfig(width=2, stages=1, blocks=1), 8, (0, 1, 2)


def test_sweep_start_stacks_each_members_arrays():
    graphdef, treedef, stacked = SW.sweep_start(CONFIG, SEEDS)
    model = resnet_nnx.make_model(CONFIG, 1)
    _, _, alone = R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))
    assert all(a.shape[0] == len(SEEDS) for a in stacked)
    for a, b in zip(SW.member(stacked, 1), alone):
        np.testing.assert_array_equal(a, b)


def test_each_vmapped_member_trains_as_the_floor_alone_in_float64():
    xs, ys = ladder.training_batches(2, BATCH)
    with jax.enable_x64(True):
        graphdef, treedef, stacked = SW.sweep_start(CONFIG, SEEDS)
        stacked = ladder.to_float64(stacked)
        step, alone = jax.jit(SW.sweep_step(graphdef, treedef)), jax.jit(R.floor_step(graphdef, treedef))
        singles = [SW.member(stacked, k) for k in range(len(SEEDS))]
        for x, y in zip(jnp.asarray(xs, jnp.float64), ys):
            stacked, losses = step(stacked, x, y)
            singles = [alone(s, x, y)[0] for s in singles]
        assert losses.shape == (len(SEEDS),)
        weights = lambda leaves: resnet_nnx.weights(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))[0])  # noqa: E731
        for k in range(len(SEEDS)):
            ladder.assert_same_weights(weights(SW.member(stacked, k)), weights(singles[k]), f"member {k}")


def test_the_ensemble_trains_each_member_as_its_twin_alone_and_a_wrong_one_fails(monkeypatch):
    xs, ys = ladder.training_batches(C.CHECK_STEPS, BATCH)
    w0 = [resnet_nnx.weights(resnet_nnx.make_model(CONFIG, s)) for s in SEEDS]
    assert 0 <= SW.check_ensemble(w0, CONFIG, BATCH, xs, ys, R.LEARNING_RATE) <= 1
    original = SW.TorchEnsemble.__init__
    monkeypatch.setattr(SW.TorchEnsemble, "__init__", lambda self, models, lr: original(self, models, 1.01 * lr))
    with pytest.raises(C.NotTheSameTraining, match="member 0"):  # the ensemble at a learning rate 1 % off
        SW.check_ensemble(w0, CONFIG, BATCH, xs, ys, R.LEARNING_RATE)


def test_the_races_four_ways_train_every_member_and_carry_their_state():
    xs, ys = ladder.training_batches(1, BATCH)
    ways = SW.sweep_ways(CONFIG, SEEDS, xs[0], ys[0])
    assert set(ways) == {SW.ONE_PROGRAM, SW.JAX_LOOP, SW.TORCH_FUNC, SW.TORCH_LOOP}
    first = {name: np.asarray(way()) for name, way in ways.items()}
    second = {name: np.asarray(way()) for name, way in ways.items()}
    # every member's loss from the one-program ways, the last member's from the loops (each checked to train
    # as the floor alone, in float64, by the tests above)
    assert first[SW.ONE_PROGRAM].shape == first[SW.TORCH_FUNC].shape == (len(SEEDS),)
    assert first[SW.JAX_LOOP].shape == first[SW.TORCH_LOOP].shape == ()
    assert all(np.all(np.isfinite(v)) for v in first.values())
    assert all(not np.allclose(first[n], second[n]) for n in ways)  # the second call trained on from the first
