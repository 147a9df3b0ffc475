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


def test_a_plan_and_an_advisers_placement_search_with_the_collector_paused_and_give_it_back(monkeypatch):
    """`make_plan` and `best_placement` (each inventory `moment advise` weighs) search with the collector off:
    their searches make tens of thousands of tuples and no cycles (moment.gcpause)."""
    import moment.planner.plan as plan
    from moment.topology.devices import Inventory
    from moment.topology.profiles import load_profile
    from moment.workload.spec import WorkloadSpec

    seen = []
    search = plan._search

    def recorded(*args, **kwargs):
        seen.append(gc.isenabled())
        return search(*args, **kwargs)

    monkeypatch.setattr(plan, "_search", recorded)
    topo = load_profile("paper-machine-b")
    plan.make_plan(topo, Inventory.simple(2, 2), WorkloadSpec())
    plan.best_placement(topo, Inventory.simple(2, 2), WorkloadSpec())
    assert seen == [False, False] and gc.isenabled()
