"""The PyTorch twin of the Part II ResNet (fastjax.resnet.torch_twin, written in chapters/resnet/08-pytorch.md) and
its check (fastjax.resnet.twin_check): the same training as the NNX floor in float64 from the same weights (logits, first gradient, weights and running
statistics after CHECK_STEPS steps, within bounds derived from float64 rounding), a check that fails on a wrong
twin or a wrong step, and clear errors on bad input."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import optax
import pytest

import fastjax  # noqa: F401  (before JAX)

torch = pytest.importorskip("torch", reason="the PyTorch twin needs torch, which the newest leg does not install")

import jax.numpy as jnp  # noqa: E402

from fastjax.resnet import ladder, resnet_nnx, rungs as R, torch_twin as T, twin_check as C  # noqa: E402
from fastjax.resnet.resnet_nnx import ResNetConfig  # noqa: E402

pytestmark = pytest.mark.pinned

CONFIG = ResNetConfig(width=4, stages=2, blocks=1)  # two stages: a strided block with its 1×1 shortcut
BATCH = 16


@pytest.fixture(scope="module")
def weights():
    return resnet_nnx.weights(resnet_nnx.make_model(CONFIG, seed=0))


@pytest.fixture(scope="module")
def batches():
    return ladder.training_batches(C.CHECK_STEPS, BATCH)


@pytest.fixture(scope="module")
def reference(batches):
    xs, ys = batches
    return C.jax_float64_run(CONFIG, xs, ys)  # Part II's floor in float64


def twin_run(weights, batches, model=None, **kwargs):
    xs, ys = batches
    return C.torch_float64_run(model or T.from_weights(weights, CONFIG), xs, ys, **kwargs)


def test_weights_round_trip(weights):
    back = C.weights(T.from_weights(weights, CONFIG))
    assert back.keys() == weights.keys()
    for k in weights:
        np.testing.assert_array_equal(back[k], weights[k], err_msg=k)


def test_the_twin_trains_as_the_floor_in_float64(weights, batches, reference):
    run = twin_run(weights, batches)
    assert run.logits.dtype == np.float64 and run.weights["stem.kernel"].dtype == np.float64
    same = C.check_same_training(run, reference, CONFIG, BATCH)
    assert set(same) == {"logits", "first gradient", "weights", "running means", "running variances"}
    # measured on an AVX-512 CPU: every difference 4e3 to 1e7 times below its bound (1e-15 to 4e-15 against 1.8e-11
    # for the logits and the gradient); a difference within 1/100 of its bound would mean the bound is too tight
    assert all(gap <= allowed / 100 for gap, allowed in same.values()), same
    np.testing.assert_allclose(run.losses, reference.losses, rtol=C.twin_rtol(CONFIG, BATCH))  # the losses too


def test_the_float32_forward_pass_is_within_the_same_bound_for_float32(weights, batches):
    # float32, as the race runs: twin_rtol's derivation with float32's unit roundoff 2^-24 in place of 2^-53
    # (loose: 9.4e-3 here, where the logits differ by about 1e-6 of the largest)
    xs, _ = batches
    with torch.no_grad():
        ours = T.from_weights(weights, CONFIG)(T.to_torch(xs[0], np.zeros(BATCH, np.int32))[0]).numpy()
    ref = np.asarray(resnet_nnx.make_model(CONFIG, seed=0)(jnp.asarray(xs[0])))
    assert np.max(np.abs(ours - ref)) <= C.twin_rtol(CONFIG, BATCH) * 2.0**29 * np.max(np.abs(ref))


def scaled_gradient_step(model, optimizer, images, labels):
    """A wrong step: the gradient 1 % too large."""
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    for p in model.parameters():
        p.grad.mul_(1.01)
    optimizer.step()
    return loss.detach()


@pytest.mark.parametrize("mistake, fails_on", [
    ("one BatchNorm in eval mode", "the logits"), ("no ReLU in a block", "the logits"),
    ("Flax's momentum", "the running means"), ("a gradient 1 % too large", "the first gradient"),
    ("Adam's eps twice as large", "the weights"), ("Adam's eps 1e-6", "the weights"),
    ("amsgrad", "the weights"), ("betas (0.9, 0.99)", "the weights")])
def test_a_wrong_twin_fails_the_check(weights, batches, reference, mistake, fails_on):
    model, kwargs = T.from_weights(weights, CONFIG), {}
    if mistake == "one BatchNorm in eval mode":
        model.blocks[0].bn1.eval()
    elif mistake == "no ReLU in a block":
        model.blocks[0].forward = lambda x, b=model.blocks[0]: b.bn2(b.conv2(b.bn1(b.conv1(x)))) + (
            x if b.proj is None else b.proj_bn(b.proj(x)))
    elif mistake == "Flax's momentum":  # 0.9 in PyTorch's convention weighs the new batch by 0.9
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = 0.9
    elif mistake == "a gradient 1 % too large":
        kwargs["step"] = scaled_gradient_step
    else:  # a wrong Adam: each measured 1e5 to 1e8 times above what rounding allows (issue 36's four slips)
        adam = {"Adam's eps twice as large": dict(eps=2 * C.ADAM_EPS), "Adam's eps 1e-6": dict(eps=1e-6),
                "amsgrad": dict(amsgrad=True), "betas (0.9, 0.99)": dict(betas=(0.9, 0.99))}[mistake]
        kwargs["make_optimizer"] = lambda p: torch.optim.Adam(p, lr=R.LEARNING_RATE, **adam)
    with pytest.raises(C.NotTheSameTraining, match=f"{re.escape(mistake)}: {fails_on}.*float64 rounding allows"):
        C.check_same_training(twin_run(weights, batches, model, **kwargs), reference, CONFIG, BATCH, what=mistake)


def test_reduction_length_and_twin_rtol():
    quick = ResNetConfig(width=8, stages=1, blocks=1)
    # stem 9 + 4·2048; conv1, bn1 and conv2, bn2: 72 + 72 + 4·2048 each; pool 64; head 8 + 10; loss 10 + 32;
    # the stem's kernel gradient 2048
    assert C.reduction_length(quick, 32) == 9 + 4 * 2048 + 2 * (144 + 4 * 2048) + 64 + 18 + 42 + 2048 == 27045
    assert C.twin_rtol(quick, 32) == 10 * 2.0**-53 * 27045
    assert math.isclose(C.twin_rtol(quick, 32), 3.0e-11, rel_tol=1e-2)
    full = C.twin_rtol(ResNetConfig(width=16, stages=3, blocks=2), 96)
    assert math.isclose(full, 1.86e-10, rel_tol=1e-2)  # measured at the full size: 1.4e-14 (logits), 4.8e-14 (gradient)


def test_adam_gain_and_weight_atol():
    assert C.adam_gain(1) == 2.0  # |m̂| = √v̂ = |g| at the first step
    assert 2.0 < C.adam_gain(10) < 2.1
    w = {"a.kernel": np.ones(3), "a.mean": np.zeros(3)}
    roots = np.array([0.0, 1e-8, 1.0])
    atol = C.weight_atol([{"a.kernel": 2.0}], [{"a.kernel": roots}], 1e-12, w)
    assert set(atol) == {"a.kernel"}  # running statistics have their own bound
    expected = R.LEARNING_RATE * 2.0 * 1e-12 * 2.0 / (roots + 1e-8) + 10 * 2.0**-53
    np.testing.assert_allclose(atol["a.kernel"], expected, rtol=1e-12)
    defaults = torch.optim.Adam([torch.zeros(1, requires_grad=True)]).defaults
    assert (defaults["eps"], defaults["betas"]) == (C.ADAM_EPS, C.ADAM_BETAS)
    optax_defaults = inspect.signature(optax.adam).parameters
    assert (optax_defaults["eps"].default, (optax_defaults["b1"].default, optax_defaults["b2"].default),
            optax_defaults["eps_root"].default) == (C.ADAM_EPS, C.ADAM_BETAS, 0.0)


def test_running_variances_are_compared_in_flaxs_convention(weights, batches, reference):
    run = twin_run(weights, batches)
    raw = T.from_weights(weights, CONFIG).double()  # PyTorch's own running variance is the unbiased one
    opt = torch.optim.Adam(raw.parameters(), lr=R.LEARNING_RATE)
    for x, y in zip(*batches):
        images, labels = T.to_torch(x, y)
        T.torch_train_step(raw, opt, images.double(), labels)
    ref = reference.weights["blocks.1.bn1.var"]  # 4×4 images, 16 of them: n = 256 values, a bias of 1/255
    assert np.max(np.abs(C.weights(raw)["blocks.1.bn1.var"] - ref)) > 1e-4 * np.max(ref)
    assert np.max(np.abs(run.weights["blocks.1.bn1.var"] - ref)) < 1e-12 * np.max(ref)


def test_the_check_refuses_what_it_cannot_bound(weights, batches, reference):
    xs, ys = batches
    with pytest.raises(ValueError, match=f"need {C.CHECK_STEPS} batches"):
        C.torch_float64_run(T.from_weights(weights, CONFIG), xs[:2], ys[:2])
    with pytest.raises(ValueError, match="must be a PyTorch run"):
        C.check_same_training(reference, reference, CONFIG, BATCH)
    run = twin_run(weights, batches)
    run.weights["head.bias"] = run.weights["head.bias"] * np.nan
    with pytest.raises(C.NotTheSameTraining, match="head.bias"):
        C.check_same_training(run, reference, CONFIG, BATCH)
    run.weights.pop("head.bias")
    with pytest.raises(C.NotTheSameTraining, match="different arrays"):
        C.check_same_training(run, reference, CONFIG, BATCH)


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
