import pytest

from fastjax import sizes


def test_env_var_picks_the_size(monkeypatch):
    monkeypatch.setenv("FASTJAX_SIZE", "full")
    assert sizes.current_size() == "full" and sizes.pick(1, 2) == 2
    monkeypatch.setenv("FASTJAX_SIZE", " Quick ")
    assert sizes.current_size() == "quick" and sizes.pick(1, 2) == 1 and sizes.is_quick()


def test_default_is_quick_under_ci_and_full_otherwise(monkeypatch):
    monkeypatch.delenv("FASTJAX_SIZE", raising=False)
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.setenv("CI", "true")
    assert sizes.current_size() == "quick"
    monkeypatch.delenv("CI")
    assert sizes.current_size() == "full"
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "x")
    assert sizes.current_size() == "quick"


def test_unknown_size_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FASTJAX_SIZE", "huge")
    with pytest.raises(ValueError, match="FASTJAX_SIZE must be one of"):
        sizes.current_size()


def test_choose_returns_the_table_in_force(monkeypatch):
    monkeypatch.setenv("FASTJAX_SIZE", "quick")
    s = sizes.choose(quick=dict(n=1, k=2), full=dict(n=10, k=20))
    assert (s.n, s.k, s.size) == (1, 2, "quick")
    monkeypatch.setenv("FASTJAX_SIZE", "full")
    assert sizes.choose(quick=dict(n=1), full=dict(n=10)).n == 10


def test_choose_refuses_tables_with_different_keys():
    with pytest.raises(ValueError, match="same keys"):
        sizes.choose(quick=dict(n=1), full=dict(n=10, extra=3))
