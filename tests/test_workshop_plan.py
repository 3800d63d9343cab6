"""The workshop page's plans (fastjax.workshop): both fit their days, and a plan that does not is refused."""

from __future__ import annotations

import pytest

from fastjax import exercises, workshop


def test_both_plans_fit_and_leave_only_the_capstone_for_home():
    catalogue = exercises.all_exercises()
    for label in workshop.PLANS:
        plan = workshop.plan(label, catalogue, {})
        assert plan["capstone_slot"] >= workshop.CAPSTONE_AT_LEAST
        assert all(r["exercises"] == "capstone" for r in plan["rows"] if r["goes home, min"] > 0)
        assert plan["rows"][0]["solutions run, s (measured)"] == "—"


def test_a_plan_that_names_a_missing_exercise_or_runs_late_is_refused(monkeypatch):
    catalogue = exercises.all_exercises()
    monkeypatch.setitem(workshop.PLANS, "bad", [[("x", "", 10, ["no-such-exercise"])]])
    with pytest.raises(AssertionError, match="do not exist"):
        workshop.plan("bad", catalogue, {})
    monkeypatch.setitem(workshop.PLANS, "late", [[("x", "", 600, ["method-1"]), ("c", "", None, ["capstone"])]])
    with pytest.raises(AssertionError, match="leaves"):
        workshop.plan("late", catalogue, {})
