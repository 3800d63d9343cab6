"""Input checks that fail early, in the reader's language, before any JAX code runs.

Every function raises ``TypeError`` (wrong kind of object or dtype) or ``ValueError`` (wrong
shape or values) with a message that names the argument and the first offending entry.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def _where(index: tuple[int, ...]) -> str:
    if len(index) == 1:
        return f"at index {index[0]}"
    if len(index) == 2:
        return f"at row {index[0]}, column {index[1]}"
    return f"at index {tuple(int(i) for i in index)}"


def as_array(x: Any, name: str) -> np.ndarray:
    """Turn ``x`` into a NumPy array (pandas frames and JAX arrays included) or raise TypeError."""
    if x is None:
        raise TypeError(f"{name} is None; expected an array")
    if hasattr(x, "to_numpy"):
        x = x.to_numpy()
    try:
        arr = np.asarray(x)
    except Exception as err:  # ragged lists and the like
        raise TypeError(f"{name} could not be read as an array: {err}") from None
    if arr.dtype == object:
        raise TypeError(f"{name} must hold numbers; got an array of Python objects")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{name} must hold numbers; got dtype {arr.dtype}")
    return arr


def check_ndim(x: np.ndarray, ndim: int, name: str) -> None:
    """Raise ValueError unless ``x`` has ``ndim`` dimensions."""
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional; got shape {x.shape}")


def check_shape(x: np.ndarray, shape: Sequence[int | None], name: str) -> None:
    """Raise ValueError unless ``x.shape`` matches ``shape`` (``None`` matches any length)."""
    ok = x.ndim == len(shape) and all(s is None or s == d for s, d in zip(shape, x.shape))
    if not ok:
        want = "(" + ", ".join("any" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {want}; got {x.shape}")


def check_finite(x: np.ndarray, name: str) -> None:
    """Raise ValueError if ``x`` holds NaN or infinity, naming the first one."""
    if np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.complexfloating):
        bad = ~np.isfinite(x)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} must be finite; found {x[idx]} {_where(idx)}")


def check_counts(y: Any, name: str = "counts") -> np.ndarray:
    """Check a 2-D table of counts (finite, non-negative integers); return it as float64."""
    arr = as_array(y, name)
    check_ndim(arr, 2, name)
    if arr.size == 0:
        raise ValueError(f"{name} is empty; got shape {arr.shape}")
    check_finite(arr, name)
    neg = arr < 0
    if neg.any():
        idx = tuple(int(i) for i in np.argwhere(neg)[0])
        raise ValueError(f"{name} must be non-negative integers; found {arr[idx]} {_where(idx)}")
    frac = arr != np.round(arr)
    if frac.any():
        idx = tuple(int(i) for i in np.argwhere(frac)[0])
        raise ValueError(f"{name} must be non-negative integers; found {arr[idx]} {_where(idx)}")
    return arr.astype(np.float64)


def check_matrix(x: Any, name: str, rows: int | None = None, cols: int | None = None) -> np.ndarray:
    """Check a finite 2-D float matrix with optional row/column counts; return it as float64."""
    arr = as_array(x, name)
    check_shape(arr, (rows, cols), name)
    check_finite(arr, name)
    return arr.astype(np.float64)


def check_full_column_rank(x: np.ndarray, name: str) -> None:
    """Raise ValueError if the columns of ``x`` are linearly dependent (XᵀX not invertible)."""
    rank = np.linalg.matrix_rank(x)
    if rank < x.shape[1]:
        raise ValueError(
            f"{name} must have linearly independent columns (full column rank); "
            f"rank is {rank} for {x.shape[1]} columns"
        )


def check_labels(labels: Any, n_classes: int, name: str = "labels") -> np.ndarray:
    """Check a 1-D vector of integer class labels in ``[0, n_classes)``; return it as int32."""
    arr = as_array(labels, name)
    check_ndim(arr, 1, name)
    if not (np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must have an integer dtype; got {arr.dtype}")
    out = (arr < 0) | (arr >= n_classes)
    if out.any():
        i = int(np.argmax(out))
        raise ValueError(f"{name} must lie in [0, {n_classes}); found {arr[i]} at index {i}")
    return arr.astype(np.int32)


def check_images(images: Any, shape: Sequence[int], name: str = "images") -> np.ndarray:
    """Check a float batch of images of shape ``(batch, *shape)``; return it as float32."""
    arr = as_array(images, name)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"{name} must have a floating dtype (scaled pixels); got {arr.dtype}")
    check_shape(arr, (None, *shape), name)
    check_finite(arr, name)
    return arr.astype(np.float32)


def check_batch_size(n: int, batch_size: int, name: str = "batch_size") -> None:
    """Raise ValueError unless ``batch_size`` is a positive integer that divides ``n``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(batch_size).__name__}")
    if batch_size <= 0:
        raise ValueError(f"{name} must be positive; got {batch_size}")
    if n % batch_size:
        raise ValueError(f"{name} {batch_size} does not divide the {n} examples (remainder {n % batch_size})")


def check_positive_int(value: Any, name: str) -> int:
    """Raise unless ``value`` is a positive integer; return it as ``int``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive; got {value}")
    return int(value)
