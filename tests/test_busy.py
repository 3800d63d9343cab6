"""fastjax.tools.busy: the busy loops run during the block and are gone after it, even on an error."""

import pytest

from fastjax.tools import busy


def test_busy_loops_run_in_the_block_and_stop_after_it():
    with busy.busy_loops(2) as loops:
        assert len(loops) == 2 and all(p.poll() is None for p in loops)
    assert all(p.poll() is not None for p in loops)


def test_busy_loops_stop_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with busy.busy_loops(1) as loops:
            raise RuntimeError("inside")
    assert loops[0].poll() is not None


def test_thread_names_is_a_list_of_names():
    names = busy.thread_names()
    assert isinstance(names, list) and all(isinstance(n, str) for n in names)
