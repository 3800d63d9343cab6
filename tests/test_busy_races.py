"""fastjax.exercises.busy_races: method-4's races on fresh busy machines, with the calls' own times logged."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fastjax.exercises import busy_races


class CountingMachine:
    """A machine that adds nothing to a call, and counts the machines made and the programs wrapped."""

    made = 0

    def __init__(self):
        CountingMachine.made += 1

    def wrap(self, fn):
        return fn


def sleeper(seconds):
    def fn(x):
        time.sleep(seconds)
        return np.asarray(x)
    return fn


def test_each_run_gets_a_fresh_machine_and_every_call_is_logged():
    calls = []

    def race(slow, fast, x):
        for _ in range(3):
            slow(x)
            fast(x)
        calls.append(x)
        return 2.0

    CountingMachine.made = 0
    got = busy_races.on_busy_machines({"a": race, "b": race}, CountingMachine, sleeper(0.004), sleeper(0.001), 1.0,
                                      runs=2)
    assert CountingMachine.made == 4 and len(calls) == 4
    assert got["a"].ratios == [2.0, 2.0] and got["a"].median == 2.0
    assert len(got["a"].own_slow) == len(got["a"].own_fast) == 6  # 3 calls each, in each of 2 runs
    assert got["a"].own_ratio > 1.5  # 4 ms against 1 ms of sleep, measured on the calls themselves


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="at least one race"):
        busy_races.on_busy_machines({}, CountingMachine, sleeper(0), sleeper(0), 1.0, runs=1)
    with pytest.raises(ValueError, match="runs=0"):
        busy_races.on_busy_machines({"a": lambda s, f, x: 1.0}, CountingMachine, sleeper(0), sleeper(0), 1.0, runs=0)
