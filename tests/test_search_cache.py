"""What inventories placed on one machine share (`moment advise`): listings of placements per shape,
and a faster inventory's epoch times as bounds for a slower one's. Sharing must change no answer."""

from __future__ import annotations

import numpy as np
import pytest

from moment.planner import search
from moment.planner.equivalence import CapacityCanon
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate
from moment.planner.plan import LIST_LIMIT, SearchCache, best_placement
from moment.topology.devices import DeviceModel, Inventory, find_model, strip
from moment.topology.model import Kind
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec

FAST = ("RTX-6000-Ada", "990-PRO")  # PCIe 4.0 x16 double-width, 960 GB/s HBM; PCIe 4.0 x4, 7.45 GB/s
SLOW = ("L40S", "P5510")  # the same cards' shapes, 864 GB/s HBM; 6.5 GB/s


@pytest.fixture(scope="module")
def machine_a():
    return strip(load_profile("paper-machine-a"))[0]


def test_inventories_of_one_shape_share_one_listing(machine_a):
    shared = search.Listings(machine_a)
    fast = search.enumerate_placements(machine_a, Inventory.simple(3, 5, *FAST), shared=shared)
    slow = search.enumerate_placements(machine_a, Inventory.simple(3, 5, *SLOW), shared=shared)
    alone = search.enumerate_placements(machine_a, Inventory.simple(3, 5, *SLOW))
    assert slow.shape == fast.shape is not None and slow.rows is fast.rows  # listed once
    assert slow.distinct == alone.distinct and slow.raw_count == alone.raw_count
    assert slow.models == ("L40S", "P5510")
    # a T4 is not double-width: another shape, listed on its own
    t4 = search.enumerate_placements(machine_a, Inventory.simple(3, 5, "T4", "P5510"), shared=shared)
    assert t4.shape != fast.shape and t4.distinct == search.enumerate_placements(
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


def test_nowhere_faster_compares_the_capacities_a_model_gives(machine_a):
    tpl = ChassisTemplate(machine_a)

    def slower(a, b):
        return tpl.nowhere_faster([find_model(m) for m in a], [find_model(m) for m in b])

    assert slower(SLOW, FAST) and slower(FAST, FAST) and not slower(FAST, SLOW)
    assert not slower(("L40S", "PM1743"), SLOW)  # PCIe 5.0: other links
    gen5_slow = DeviceModel(name="gen5-slow", kind=Kind.ssd, gen=5, lanes=4, read_gbps=6.0)
    assert not tpl.nowhere_faster([find_model("L40S"), gen5_slow], [find_model(m) for m in SLOW])  # (a PCIe 5.0 slot)
    assert not slower(("L40S", "P5800X"), SLOW)  # 7.2 GB/s reads: faster
    # other GPU memory: the caches' shares are each GPU's 1/n only where one GPU model is placed
    assert slower(("L40S", "P5510"), ("A100-PCIe-40GB", "P5510"))
    assert not slower(("L40S", "A100-PCIe-40GB", "P5510"), ("A100-PCIe-40GB", "A100-PCIe-40GB", "P5510"))


def test_a_faster_inventorys_bounds_never_exceed_a_slower_ones_times(machine_a):
    """The bounds one inventory leaves on a listing hold for every listed placement of a nowhere faster
    inventory: at most its LP time (every class solved here), so no class that could win is skipped."""
    topo, wl = load_profile("paper-machine-a"), WorkloadSpec()
    cache = SearchCache(topo)
    best_placement(topo, Inventory.simple(3, 5, *FAST), wl, cache=cache)
    space = search.enumerate_placements(cache.bare, Inventory.simple(3, 5, *SLOW), limit=LIST_LIMIT,
                                        shared=cache.listings)  # (as best_placement lists it)
    floor = cache.floor(space, wl)
    assert floor is not None and (floor > 0).all()
    labels = CapacityCanon(cache.template).classes(space)
    _, first = np.unique(labels, return_index=True)
    times = np.array([s.epoch_read_s for s in solve_lp_batch(
        [cache.template.network(space.placement(i), wl) for i in first])])[labels]
    assert (floor <= times * (1 + 1e-7)).all()  # (float noise, as the tree bound's own)
    assert cache.floor(space, WorkloadSpec(gpu_cache_share=0.3)) is None  # another workload: no bound


@pytest.mark.slow
def test_a_slower_inventory_solves_fewer_lps_for_the_same_answer():
    """asus-esc8000a-e12 with 5 GPUs and 17 SSDs: the tree bound prunes nothing (562 classes, 562 LPs);
    after the faster inventory, the slower one solves only the classes that tie its best."""
    topo, wl = load_profile("asus-esc8000a-e12"), WorkloadSpec()
    cache = SearchCache(topo)
    best_placement(topo, Inventory.simple(5, 17, *FAST), wl, cache=cache)
    shared = best_placement(topo, Inventory.simple(5, 17, *SLOW), wl, cache=cache)
    alone = best_placement(topo, Inventory.simple(5, 17, *SLOW), wl)
    assert shared.placement == alone.placement
    assert shared.evaluation == alone.evaluation and shared.bottlenecks == alone.bottlenecks
    assert shared.stats.solved < alone.stats.solved / 2
