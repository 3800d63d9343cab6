"""The PyTorch twin of the Part II ResNet (fastjax.resnet.torch_twin, written in chapters/resnet/08-pytorch.md):
the same forward pass and the same training as the NNX network from the same weights, a check that fails on a
wrong twin, and clear errors on bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fastjax  # noqa: F401  (before JAX)

torch = pytest.importorskip("torch", reason="the PyTorch twin needs torch, which the newest leg does not install")

import jax.numpy as jnp  # noqa: E402

from fastjax.resnet import ladder, resnet_nnx, rungs as R, torch_twin as T  # noqa: E402
from fastjax.resnet.resnet_nnx import ResNetConfig  # noqa: E402

pytestmark = pytest.mark.pinned

CONFIG = ResNetConfig(width=4, stages=2, blocks=1)  # two stages: a strided block with its 1×1 shortcut
BATCH = 16


@pytest.fixture(scope="module")
def weights():
    return resnet_nnx.weights(resnet_nnx.make_model(CONFIG, seed=0))


@pytest.fixture(scope="module")
def batches():
    return ladder.training_batches(T.CHECK_STEPS + 2, BATCH)


def torch_losses(model, xs, ys):
    opt = torch.optim.Adam(model.parameters(), lr=R.LEARNING_RATE)
    return np.array([float(T.torch_train_step(model, opt, *T.to_torch(x, y))) for x, y in zip(xs, ys)])


@pytest.fixture(scope="module")
def floor_losses(batches):
    xs, ys = batches
    return ladder.trajectory(ladder.build("floor", CONFIG), xs, ys)


def test_same_forward_pass_from_the_same_weights(weights, batches):
    xs, _ = batches
    model = T.from_weights(weights, CONFIG)
    with torch.no_grad():
        ours = model(T.to_torch(xs[0], np.zeros(BATCH, np.int32))[0]).numpy()
    ref = np.asarray(resnet_nnx.make_model(CONFIG, seed=0)(jnp.asarray(xs[0])))
    # the rounding bound of loss_rtol (D·K_max·u: 5 convolutions deep, at most 72 terms: 2.1e-5), relative to
    # the largest logit; measured 3e-7 to 4e-6 at the book's sizes
    assert np.max(np.abs(ours - ref)) <= T.loss_rtol(CONFIG) * np.max(np.abs(ref))
    assert np.max(np.abs(ours - ref)) <= 1e-5 * np.max(np.abs(ref))  # and ~1e-6, as the issue asks


def test_weights_round_trip(weights):
    back = T.weights(T.from_weights(weights, CONFIG))
    assert back.keys() == weights.keys()
    for k in weights:
        np.testing.assert_array_equal(back[k], weights[k], err_msg=k)


def test_same_losses_as_the_floor(weights, batches, floor_losses):
    xs, ys = batches
    gap = T.check_same_losses(torch_losses(T.from_weights(weights, CONFIG), xs, ys), floor_losses, CONFIG)
    assert gap <= T.loss_rtol(CONFIG)


@pytest.mark.parametrize("mistake", ["one BatchNorm in eval mode", "Flax's momentum", "no ReLU in a block"])
def test_a_wrong_twin_fails_the_check(weights, batches, floor_losses, mistake):
    xs, ys = batches
    model = T.from_weights(weights, CONFIG)
    if mistake == "one BatchNorm in eval mode":
        model.blocks[0].bn1.eval()
    elif mistake == "Flax's momentum":  # 0.9 in PyTorch's convention: running stats, not the loss, change...
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = 0.9
        model.eval()  # ...so read them: a twin evaluated in eval mode is then a different network
        model.blocks[0].bn1.train()
    else:
        model.blocks[0].forward = lambda x, b=model.blocks[0]: b.bn2(b.conv2(b.bn1(b.conv1(x)))) + (
            x if b.proj is None else b.proj_bn(b.proj(x)))
    with pytest.raises(T.NotTheSameTraining, match="float32 rounding allows"):
        T.check_same_losses(torch_losses(model, xs, ys), floor_losses, CONFIG, what=mistake)


def test_loss_rtol_is_the_rounding_bound():
    u = 2.0**-24
    assert T.loss_rtol(ResNetConfig(width=8, stages=1, blocks=1)) == 3 * 72 * u  # quick: 1.3e-5
    assert T.loss_rtol(ResNetConfig(width=16, stages=3, blocks=2)) == 13 * 576 * u  # full: 4.5e-4
    assert math.isclose(T.loss_rtol(ResNetConfig(width=16, stages=3, blocks=2)), 4.46e-4, rel_tol=1e-2)


def test_check_same_losses_refuses_short_or_nan_losses():
    ref = np.ones(T.CHECK_STEPS)
    with pytest.raises(ValueError, match=f"need the losses of {T.CHECK_STEPS} steps"):
        T.check_same_losses(ref[:2], ref, CONFIG)
    with pytest.raises(T.NotTheSameTraining):
        T.check_same_losses(np.array([1.0, np.nan, 1.0, 1.0]), ref, CONFIG)
    assert T.check_same_losses(ref * (1 + 1e-7), ref, CONFIG) == pytest.approx(1e-7, rel=1e-3)


def test_bad_weights_and_batches_get_clear_errors(weights):
    with pytest.raises(ValueError, match="names no layer"):
        T.from_weights({**weights, "nowhere.kernel": np.zeros(3, np.float32)}, CONFIG)
    with pytest.raises(ValueError, match="has no 'gamma'"):
        T.from_weights({**weights, "stem_bn.gamma": np.zeros(4, np.float32)}, CONFIG)
    missing = dict(weights)
    missing.pop("head.bias")
    with pytest.raises(RuntimeError, match="head.bias"):
        T.from_weights(missing, CONFIG)
    with pytest.raises(RuntimeError, match="size mismatch"):
        T.from_weights(weights, ResNetConfig(width=8, stages=2, blocks=1))
    with pytest.raises(ValueError):
        T.to_torch(np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int32))  # three channels
    with pytest.raises(ValueError):
        T.to_torch(np.zeros((2, 8, 8, 1), np.float32), np.array([0, 10]))  # a label out of range


def test_accuracy_reads_eval_mode_and_restores_training(weights):
    model = T.from_weights(weights, CONFIG)
    images, labels = ladder.training_batches(1, 32)
    acc = T.torch_accuracy(model, images[0], labels[0])
    assert 0.0 <= acc <= 1.0
    assert all(m.training for m in model.modules())


def test_to_torch_gives_default_strides():
    # one-channel NHWC viewed as NCHW has strides (64, 1, 8, 1), which PyTorch reads as contiguous and
    # channels-last at once; its single-thread backward pass corrupted memory with them (torch 2.13)
    x, y = T.to_torch(np.zeros((4, 8, 8, 1), np.float32), np.arange(4))
    assert x.shape == (4, 1, 8, 8) and x.stride() == (64, 64, 8, 1) and y.dtype == torch.int64
