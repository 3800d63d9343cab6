"""The twin networks: NNX weights loaded into Equinox give the same logits; bad inputs; trace once."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fastjax.resnet import digits, ladder, resnet_eqx, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools.timing import count_traces

CONFIGS = [ResNetConfig(width=8, stages=2, blocks=1), ResNetConfig(width=4, stages=3, blocks=2)]


@pytest.fixture(scope="module")
def images():
    return jnp.asarray(digits.split().train_images[:32])


@pytest.mark.isa
@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_twins_give_the_same_logits_in_training_mode(config, images):
    model = resnet_nnx.make_model(config, seed=1)
    twin, state = resnet_eqx.from_nnx(model)
    before = resnet_nnx.weights(model)
    ours, _ = resnet_eqx.forward(twin, state, images)
    ladder.assert_same_forward(ours, model(images), "logits")  # the bound derived from float32 rounding
    # both updated their running statistics the same way (and left the parameters alone)
    after_nnx, after_eqx = resnet_nnx.weights(model), resnet_eqx.weights(twin, _)
    assert after_nnx.keys() == after_eqx.keys() == before.keys()
    ladder.assert_same_forward(after_eqx, after_nnx, "after one forward pass:")


@pytest.mark.isa
def test_twins_give_the_same_logits_in_inference_mode(images):
    model = resnet_nnx.make_model(CONFIGS[0], seed=2)
    model(images)  # move the running statistics away from 0 and 1
    twin, state = resnet_eqx.from_nnx(model)
    model.eval()
    expected = np.asarray(model(images))
    model.train()
    ours, _ = resnet_eqx.forward(eqx.nn.inference_mode(twin), state, images)
    ladder.assert_same_forward(ours, expected, "logits in inference mode")
    labels = np.asarray(jnp.argmax(model(images), -1), dtype=np.int32)
    assert resnet_nnx.accuracy(model, images, labels) == resnet_eqx.accuracy(twin, state, images, labels)


def test_weights_round_trip():
    model = resnet_nnx.make_model(CONFIGS[1], seed=3)
    twin, state = resnet_eqx.from_nnx(model)
    w1, w2 = resnet_nnx.weights(model), resnet_eqx.weights(twin, state)
    for k in w1:
        np.testing.assert_array_equal(w1[k], w2[k], err_msg=k)


def test_make_model_is_seeded():
    a, b, c = (resnet_nnx.weights(resnet_nnx.make_model(CONFIGS[0], seed=s)) for s in (0, 0, 1))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["stem.kernel"], c["stem.kernel"])


def test_weights_of_the_wrong_network_are_rejected():
    w = resnet_nnx.weights(resnet_nnx.make_model(CONFIGS[0]))
    with pytest.raises(ValueError, match="expected .* weight arrays"):
        resnet_eqx.from_weights(w, CONFIGS[1])


@pytest.mark.parametrize("field,value,err", [("width", 0, ValueError), ("stages", 1.5, TypeError)])
def test_bad_config_is_rejected(field, value, err):
    kwargs = dict(width=8, stages=2, blocks=1)
    kwargs[field] = value
    with pytest.raises(err, match=field):
        ResNetConfig(**kwargs)


def test_accuracy_rejects_bad_images_and_labels():
    model = resnet_nnx.make_model(CONFIGS[0])
    good = np.zeros((4, 8, 8, 1), np.float32)
    with pytest.raises(ValueError, match="images must have shape"):
        resnet_nnx.accuracy(model, np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="floating dtype"):
        resnet_nnx.accuracy(model, good.astype(np.int64), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\)"):
        resnet_nnx.accuracy(model, good, np.array([0, 1, 2, -1]))


def test_jitted_loss_is_traced_once():
    model = resnet_nnx.make_model(CONFIGS[0])
    counter = count_traces(R.loss_fn)
    loss = nnx.jit(counter)
    sp = digits.split()
    xs, ys = digits.stack_batches(sp.train_images, sp.train_labels, 16, 3, seed=0)
    for x, y in zip(xs, ys):
        loss(model, jnp.asarray(x), jnp.asarray(y))
    assert counter.count == 1
    loss(model, jnp.asarray(xs[0][:8]), jnp.asarray(ys[0][:8]))  # a new batch size re-traces
    assert counter.count == 2
