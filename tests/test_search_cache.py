"""What inventories placed on one machine share (`moment advise`): one listing of placements per shape
(models that take the same slots alike, in the same numbers). Sharing must change no answer."""

from __future__ import annotations

import pytest

from moment.planner import search
from moment.planner.plan import SearchCache, best_placement
from moment.topology.devices import Inventory, strip
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec

FAST = ("RTX-6000-Ada", "990-PRO")  # PCIe 4.0 x16 double-width; PCIe 4.0 x4
SLOW = ("L40S", "P5510")  # the same shapes, slower


@pytest.fixture(scope="module")
def machine_a():
    return strip(load_profile("paper-machine-a"))[0]


def test_inventories_of_one_shape_share_one_listing(machine_a):
    shared = search.Listings(machine_a)
    fast = search.enumerate_placements(machine_a, Inventory.simple(3, 5, *FAST), shared=shared)
    slow = search.enumerate_placements(machine_a, Inventory.simple(3, 5, *SLOW), shared=shared)
    alone = search.enumerate_placements(machine_a, Inventory.simple(3, 5, *SLOW))
    assert slow.rows is fast.rows  # listed once
    assert slow.distinct == alone.distinct and slow.raw_count == alone.raw_count
    assert slow.models == ("L40S", "P5510")
    # a T4 is not double-width: another shape, listed on its own
    t4 = search.enumerate_placements(machine_a, Inventory.simple(3, 5, "T4", "P5510"), shared=shared)
    assert t4.rows is not fast.rows and t4.distinct == search.enumerate_placements(
        machine_a, Inventory.simple(3, 5, "T4", "P5510")).distinct


def test_too_many_to_list_is_remembered_per_shape(machine_a, monkeypatch):
    shared = search.Listings(machine_a)
    with pytest.raises(search.TooMany) as first:
        search.enumerate_placements(machine_a, Inventory.simple(3, 5, *FAST), limit=10, shared=shared)

    def no_listing(self):
        raise AssertionError("listed again")

    monkeypatch.setattr(search.Enumeration, "representatives", no_listing)
    with pytest.raises(search.TooMany) as again:
        search.enumerate_placements(machine_a, Inventory.simple(3, 5, *SLOW), limit=10, shared=shared)
    assert again.value.raw_count == first.value.raw_count > 10


def test_a_shared_search_recommends_what_a_search_alone_does():
    topo, wl = load_profile("paper-machine-a"), WorkloadSpec()
    cache = SearchCache(topo)
    for inventory in (Inventory.simple(3, 5, *FAST), Inventory.simple(3, 5, *SLOW), Inventory.simple(2, 4, *SLOW)):
        shared, alone = best_placement(topo, inventory, wl, cache=cache), best_placement(topo, inventory, wl)
        assert shared.placement == alone.placement and shared.evaluation == alone.evaluation
        assert shared.stats.model_dump(exclude={"seconds_total", "seconds_per_solve"}) == \
            alone.stats.model_dump(exclude={"seconds_total", "seconds_per_solve"})
    assert len(cache.listings._found) == 2
