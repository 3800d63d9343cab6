"""The Results page's gains (fastjax.rules): a ratio where both times exist, words where one is missing."""

from __future__ import annotations

from fastjax import rules


def test_a_gain_is_the_slow_time_over_the_fast_one_or_says_it_was_not_measured():
    assert rules.gain(3.0, 1.5, "per step") == "2.0× per step"
    assert rules.gain(None, 1.0, "per step") == rules.NOT_MEASURED
    assert rules.gain(1.0, None, "per step") == rules.NOT_MEASURED
