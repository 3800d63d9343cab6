"""The 8×8 handwritten digits of scikit-learn: load, split, seeded batches, input checks.

The data ships inside scikit-learn (1,797 grey images, 10 classes), so nothing is downloaded.
Images come as float32 arrays of shape ``(n, 8, 8, 1)`` (NHWC, pixels scaled to [0, 1]) and
labels as int32 in ``[0, 10)``. Every public function checks its input with
:mod:`fastjax.checks` and raises ``TypeError``/``ValueError`` before any JAX code runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np

from fastjax import checks

IMAGE_SHAPE = (8, 8, 1)
N_CLASSES = 10
N_TRAIN = 1440  # 1,440 = 2⁵·3²·5: divisible by the batch sizes 16, 32, 48, 96, 160, ...
SPLIT_SEED = 0


class Split(NamedTuple):
    """A fixed train/test split: images ``(n, 8, 8, 1)`` float32, labels ``(n,)`` int32."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray


def check_batch(images: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check images ``(n, 8, 8, 1)`` of floats and labels ``(n,)`` in [0, 10); return them as
    float32 and int32 NumPy arrays."""
    images = checks.check_images(images, IMAGE_SHAPE, "images")
    labels = checks.check_labels(labels, N_CLASSES, "labels")
    if len(images) != len(labels):
        raise ValueError(f"images and labels must have the same length; got {len(images)} images "
                         f"and {len(labels)} labels")
    if len(images) == 0:
        raise ValueError("images is empty; need at least one example")
    return images, labels


def _digits_csv() -> Path | None:
    """scikit-learn's own copy of the data (``sklearn/datasets/data/digits.csv.gz``), found
    without importing scikit-learn (which takes seconds)."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.exists():
            return path
    return None


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits: images ``(1797, 8, 8, 1)`` float32 in [0, 1], labels ``(1797,)`` int32.
    Reads the file that ships with scikit-learn (what ``sklearn.datasets.load_digits`` reads)."""
    path = _digits_csv()
    if path is not None:
        table = np.loadtxt(path, delimiter=",")
        pixels, target = table[:, :-1], table[:, -1]
    else:  # pragma: no cover - a scikit-learn that stores the file elsewhere
        from sklearn.datasets import load_digits as _load

        raw = _load()
        pixels, target = raw.data, raw.target
    images = (pixels.reshape(-1, 8, 8).astype(np.float32) / 16.0)[..., None]
    return check_batch(images, target.astype(np.int32))


def split(n_train: int = N_TRAIN, seed: int = SPLIT_SEED) -> Split:
    """The fixed split used throughout Part II: ``n_train`` shuffled examples to train on, the
    rest to test on (1,440 and 357 by default)."""
    images, labels = load_digits()
    n_train = checks.check_positive_int(n_train, "n_train")
    if n_train >= len(images):
        raise ValueError(f"n_train must leave test examples; got {n_train} of {len(images)}")
    order = np.random.default_rng(seed).permutation(len(images))
    tr, te = order[:n_train], order[n_train:]
    return Split(images[tr], labels[tr], images[te], labels[te])


def batches(images: Any, labels: Any, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """An endless stream of ``(images, labels)`` batches: each epoch is a fresh permutation drawn
    from ``np.random.default_rng(seed)``, cut into ``n / batch_size`` batches (it must divide n)."""
    images, labels = check_batch(images, labels)
    checks.check_batch_size(len(images), batch_size)
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(images))
        for start in range(0, len(images), batch_size):
            idx = order[start:start + batch_size]
            yield images[idx], labels[idx]


def stack_batches(images: Any, labels: Any, batch_size: int, n_steps: int,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n_steps`` batches of :func:`batches`, stacked: images ``(n_steps, batch, 8, 8, 1)``
    and labels ``(n_steps, batch)``. Every variant of the ladder trains on exactly these."""
    n_steps = checks.check_positive_int(n_steps, "n_steps")
    stream = batches(images, labels, batch_size, seed)
    xs, ys = zip(*(next(stream) for _ in range(n_steps)))
    return np.stack(xs), np.stack(ys)
