"""fastjax.setup.workaround_evidence.check_margins: the tolerance's margins, and a raise when the flag's
error passes the tolerance."""

import pytest

from fastjax.setup import workaround, workaround_evidence as E


def test_check_margins_returns_the_four_figures_in_order():
    m = E.check_margins(0.0)
    assert m["ascending_error"] <= m["rounding_bound"] < m["tolerance"] < m["smallest_wrong"]


def test_check_margins_raises_when_the_flag_no_longer_fixes_the_sum():
    with pytest.raises(AssertionError, match="no longer fixes"):
        E.check_margins(2 * workaround.TOLERANCE)
