import numpy as np
import pytest

from fastjax import checks


def test_counts_accepts_integer_valued_tables():
    y = checks.check_counts([[0, 1], [2, 3]])
    assert y.dtype == np.float64 and y.shape == (2, 2)


@pytest.mark.parametrize(
    "counts, error, message",
    [
        ([[0, -3], [1, 2]], ValueError, r"non-negative integers; found -3 at row 0, column 1"),
        ([[0, 1.5], [1, 2]], ValueError, r"non-negative integers; found 1.5 at row 0, column 1"),
        ([[0, np.nan], [1, 2]], ValueError, r"finite; found nan at row 0, column 1"),
        ([[0, np.inf], [1, 2]], ValueError, r"finite; found inf"),
        ([0, 1, 2], ValueError, r"2-dimensional; got shape \(3,\)"),
        (np.zeros((0, 3)), ValueError, r"empty"),
        ([["a", "b"]], TypeError, r"must hold numbers"),
        (None, TypeError, r"is None"),
    ],
)
def test_counts_errors_name_the_problem(counts, error, message):
    with pytest.raises(error, match=message):
        checks.check_counts(counts)


def test_matrix_checks_shape_and_finiteness():
    assert checks.check_matrix(np.ones((3, 2)), "X", rows=3).shape == (3, 2)
    with pytest.raises(ValueError, match=r"X must have shape \(4, any\); got \(3, 2\)"):
        checks.check_matrix(np.ones((3, 2)), "X", rows=4)
    with pytest.raises(ValueError, match="X must be finite"):
        checks.check_matrix(np.array([[1.0, np.nan]]), "X")


def test_full_column_rank():
    checks.check_full_column_rank(np.array([[1.0, 0], [1, 1], [1, 2]]), "X")
    with pytest.raises(ValueError, match="rank is 1 for 2 columns"):
        checks.check_full_column_rank(np.array([[1.0, 2], [1, 2], [1, 2]]), "X")


def test_labels():
    assert checks.check_labels(np.array([0, 9, 3]), 10).dtype == np.int32
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\); found 10 at index 1"):
        checks.check_labels(np.array([0, 10]), 10)
    with pytest.raises(ValueError, match="found -1"):
        checks.check_labels(np.array([-1]), 10)
    with pytest.raises(TypeError, match="integer dtype"):
        checks.check_labels(np.array([0.0, 1.0]), 10)


def test_images():
    assert checks.check_images(np.zeros((5, 8, 8, 1)), (8, 8, 1)).dtype == np.float32
    with pytest.raises(ValueError, match=r"shape \(any, 8, 8, 1\); got \(5, 8, 8\)"):
        checks.check_images(np.zeros((5, 8, 8)), (8, 8, 1))
    with pytest.raises(TypeError, match="floating dtype"):
        checks.check_images(np.zeros((5, 8, 8, 1), dtype=np.uint8), (8, 8, 1))
    with pytest.raises(ValueError, match="finite"):
        checks.check_images(np.full((1, 8, 8, 1), np.nan), (8, 8, 1))


def test_batch_size_and_positive_int():
    checks.check_batch_size(100, 20)
    with pytest.raises(ValueError, match="does not divide the 100 examples"):
        checks.check_batch_size(100, 30)
    with pytest.raises(ValueError, match="positive"):
        checks.check_batch_size(100, 0)
    with pytest.raises(TypeError, match="integer"):
        checks.check_batch_size(100, 2.0)
    assert checks.check_positive_int(np.int64(3), "k") == 3
    with pytest.raises(TypeError):
        checks.check_positive_int(True, "k")
    with pytest.raises(ValueError, match="k must be positive; got -1"):
        checks.check_positive_int(-1, "k")
