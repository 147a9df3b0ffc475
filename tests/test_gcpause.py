"""The collector paused around bounded work and around a process's loading (moment.gcpause)."""

from __future__ import annotations

import gc

import pytest

from moment.gcpause import loading, paused


def test_loading_pauses_the_collector_then_freezes_what_was_made_and_turns_it_back_on():
    assert gc.isenabled()
    before = gc.get_freeze_count()
    with loading():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]  # containers the collector tracks
    assert gc.isenabled()
    assert gc.get_freeze_count() >= before + len(made)


def test_loading_that_fails_freezes_nothing_and_gives_the_collector_back():
    before = gc.get_freeze_count()
    with pytest.raises(ImportError):
        with loading():
            made = [[i] for i in range(1000)]  # noqa: F841 - containers that would be frozen
            import no_such_module_here  # noqa: F401
    # (a frozen object freed meanwhile lowers the count; only a freeze raises it)
    assert gc.isenabled() and gc.get_freeze_count() <= before


def test_loading_inside_a_pause_leaves_the_collector_to_the_outer_pause():
    with paused():
        with loading():
            pass
        assert not gc.isenabled()  # the outer pause is still under way
    assert gc.isenabled()
