"""The digits data: loading, the fixed split, seeded batches, and a clear error for each bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fastjax.resnet import digits


def test_load_matches_scikit_learn():
    from sklearn.datasets import load_digits

    images, labels = digits.load_digits()
    raw = load_digits()
    assert images.shape == (1797, 8, 8, 1) and images.dtype == np.float32
    assert labels.dtype == np.int32 and set(np.unique(labels)) == set(range(10))
    np.testing.assert_array_equal(images[..., 0] * 16, raw.images)
    np.testing.assert_array_equal(labels, raw.target)
    assert 0.0 <= images.min() and images.max() <= 1.0


def test_split_is_fixed_and_disjoint():
    a, b = digits.split(), digits.split()
    assert len(a.train_images) == digits.N_TRAIN and len(a.test_images) == 1797 - digits.N_TRAIN
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    train = {x.tobytes() for x in a.train_images}
    # the data holds a few duplicate images; nearly all test images are unseen in training
    assert sum(x.tobytes() in train for x in a.test_images) < 10


def test_batches_are_seeded_and_cover_each_epoch():
    sp = digits.split()
    xs, ys = digits.stack_batches(sp.train_images, sp.train_labels, 32, 45, seed=3)
    xs2, ys2 = digits.stack_batches(sp.train_images, sp.train_labels, 32, 45, seed=3)
    np.testing.assert_array_equal(ys, ys2)
    assert xs.shape == (45, 32, 8, 8, 1) and ys.shape == (45, 32)
    # 45 batches of 32 are exactly one epoch of the 1,440 training images
    np.testing.assert_array_equal(np.sort(ys.ravel()), np.sort(sp.train_labels))
    _, ys3 = digits.stack_batches(sp.train_images, sp.train_labels, 32, 45, seed=4)
    assert not np.array_equal(ys, ys3)


def test_wrong_image_shape_is_rejected():
    with pytest.raises(ValueError, match=r"images must have shape \(any, 8, 8, 1\)"):
        digits.check_batch(np.zeros((4, 8, 8), np.float32), np.zeros(4, np.int32))


def test_wrong_image_dtype_is_rejected():
    with pytest.raises(TypeError, match="images must have a floating dtype"):
        digits.check_batch(np.zeros((4, 8, 8, 1), np.uint8), np.zeros(4, np.int32))


def test_labels_out_of_range_are_rejected():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\); found 10 at index 2"):
        digits.check_batch(np.zeros((4, 8, 8, 1), np.float32), np.array([0, 1, 10, 3]))


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="same length"):
        digits.check_batch(np.zeros((4, 8, 8, 1), np.float32), np.zeros(3, np.int32))


def test_batch_size_must_divide_the_data():
    sp = digits.split()
    with pytest.raises(ValueError, match="batch_size 100 does not divide the 1440 examples"):
        next(digits.batches(sp.train_images, sp.train_labels, 100, seed=0))
