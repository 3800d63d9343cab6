import pytest

from fastjax.exercises import racing


def test_pace_says_which_way_the_ratio_goes():
    assert racing.pace(2.31, 1.0) == "ran 2.31× as fast as"
    assert racing.pace(1.0, 1.15) == "took 1.15× the time of"
    assert racing.pace(12.34, 1.0) == "ran 12.3× as fast as"  # one decimal from 10× on
    with pytest.raises(ValueError, match="positive"):
        racing.pace(0.0, 1.0)


def test_race_refuses_nothing_to_time():
    with pytest.raises(ValueError, match="at least one program"):
        racing.race("many-1", {}, repeats=1)


def test_pace_of_a_race_is_its_last_program_against_its_first():
    from types import SimpleNamespace

    t = {"start": SimpleNamespace(median=3.0), "middle": SimpleNamespace(median=9.0), "reference": SimpleNamespace(median=1.0)}
    assert racing.pace_of(t) == "ran 3.00× as fast as"
    with pytest.raises(ValueError, match="two programs"):
        racing.pace_of({"alone": SimpleNamespace(median=1.0)})


def test_takeaway_sets_each_starting_program_against_its_solution():
    from types import SimpleNamespace

    rows = racing.takeaway({"x-1": {"start": SimpleNamespace(median=0.004), "reference": SimpleNamespace(median=0.001)}})
    assert rows == [{"exercise": "x-1", "starting program (ms per call)": 4.0, "solution (ms per call)": 1.0,
                     "speed-up": 4.0}]
    with pytest.raises(ValueError, match="starting program and the solution"):
        racing.takeaway({"x-1": {"start": SimpleNamespace(median=1.0)}})
