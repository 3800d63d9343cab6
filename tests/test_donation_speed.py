"""fastjax.tools.donation_speed: the carried runner keeps its state; the verdict reads the quartiles."""

from fastjax.tools.donation_speed import carried, spread_verdict
from fastjax.tools.timing import Timing


def test_carried_keeps_the_state_between_runs():
    run = carried(lambda s, k: (s + k, s), 0, 2, steps=3)
    assert run() == 4 and run() == 10  # states 0, 2, 4 then 6, 8, 10: the last out is the state before


def test_carried_reads_the_inputs_per_step():
    run = carried(lambda s, x, y: (s + x * y, s), 0, steps=2, inputs=([1, 2], [3, 4]))
    assert run() == 3


def test_spread_verdict_reads_overlapping_quartiles():
    a, b, far = Timing("a", [1.0, 1.1, 1.2]), Timing("b", [1.05, 1.1, 1.15]), Timing("far", [5.0, 5.1, 5.2])
    assert spread_verdict([(a, b), (b, a)]) == "both within the spread of the repeats"
    assert spread_verdict([(a, far), (b, far)]) == "both outside the spread of the repeats"
    assert spread_verdict([(a, b), (a, far)]) == "one within and one outside the spread of the repeats"
