"""The tie-break between equally fast placements: each criterion decides when the earlier ones tie."""

from __future__ import annotations

import pytest

from moment.planner.equivalence import TreeBound
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate
from moment.planner.plan import TIE_REL, make_plan
from moment.planner.search import enumerate_placements
from moment.planner.tiebreak import Candidate, compare_placements, preference, preference_arrays, sort_key, wasted_lanes
from moment.topology.devices import Inventory
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec

GPU, SSD = "A100-PCIe-40GB", "P5510"


def cand(slots: dict[str, str], lanes: int = 0, links: tuple[float, ...] = ()) -> Candidate:
    return Candidate(placement=slots, wasted_lanes=lanes, link_bounds=links)


def prefers(a: Candidate, b: Candidate) -> bool:
    """a is preferred, and the answer does not depend on the argument order."""
    return compare_placements(a, b) < 0 < compare_placements(b, a)


def test_link_headroom_decides_first():
    # a's tightest link is looser (2.0 < 3.0): a wins though it wastes more lanes and comes later by slot
    a = cand({"z": GPU}, lanes=24, links=(2.0, 1.9, 1.8))
    b = cand({"a": GPU}, lanes=0, links=(3.0, 0.1))
    assert prefers(a, b)
    # tightest links tie: the second tightest decides
    assert prefers(cand({"z": GPU}, 12, (3.0, 1.0)), cand({"a": GPU}, 0, (3.0, 2.0)))
    # equal on the links both load: the one that loads fewer links wins
    assert prefers(cand({"z": GPU}, 12, (3.0,)), cand({"a": GPU}, 0, (3.0, 1.0)))


def test_wasted_lanes_decide_when_links_tie():
    links = (2.5, 1.0)
    assert prefers(cand({"z": SSD}, lanes=0, links=links), cand({"a": SSD}, lanes=12, links=links))
    assert prefers(cand({"z": SSD}, lanes=0), cand({"a": SSD}, lanes=12))  # no bounds yet: same


def test_slot_order_decides_last():
    a = cand({"s0": GPU, "s9": SSD}, lanes=12, links=(1.0,))
    assert prefers(cand({"s8": SSD, "s0": GPU}, 12, (1.0,)), a)  # pairs sorted by slot id: s8 < s9
    assert prefers(cand({"s1": GPU}, 12, (1.0,)), cand({"s2": GPU}, 12, (1.0,)))
    # same slots: the model names decide ("A100..." < "P5510")
    assert prefers(cand({"s0": GPU, "s1": SSD}, 12, (1.0,)), cand({"s0": SSD, "s1": GPU}, 12, (1.0,)))
    assert compare_placements(a, cand(dict(a.placement), 12, (1.0,))) == 0


def test_sort_key_puts_the_preferred_first():
    pool = [
        cand({"c": GPU}, 0, (2.0,)),
        cand({"b": GPU}, 12, (1.0,)),
        cand({"a": GPU}, 12, (1.0,)),
        cand({"d": GPU}, 0, (1.0,)),
    ]
    assert [next(iter(c.placement)) for c in sorted(pool, key=preference)] == ["d", "a", "b", "c"]


def test_wasted_lanes_counts_narrow_cards_in_wide_slots():
    topo = load_profile("paper-machine-b")
    x16 = next(s.id for s in topo.empty_slots() if s.width == 16)
    bay = next(s.id for s in topo.empty_slots() if s.width == 4)
    assert wasted_lanes({x16: GPU, bay: SSD}, topo) == 0
    assert wasted_lanes({x16: SSD}, topo) == 12


def test_plan_takes_the_preferred_of_the_fastest():
    """Against every distinct placement solved: the plan is the preferred one among those within
    TIE_REL of the best time (so class representatives and branch and bound lose nothing)."""
    topo, inventory, wl = load_profile("paper-machine-a"), Inventory.simple(2, 3), WorkloadSpec()
    cands = enumerate_placements(topo, inventory).distinct
    tpl = ChassisTemplate(topo)
    times = [s.epoch_read_s for s in solve_lp_batch([tpl.network(p, wl) for p in cands])]
    best = min(times)
    bound = TreeBound(tpl)
    fastest = [replace_links(Candidate.of(p, topo), bound.bound(p, wl)[1])
               for p, t in zip(cands, times) if t <= best * (1 + TIE_REL)]
    assert len(fastest) > 1, "no tie to break"
    plan = make_plan(topo, inventory, wl)
    assert plan.predicted.epoch_read_s == pytest.approx(best, rel=1e-6)
    assert plan.placement == min(fastest, key=preference).placement


def replace_links(c: Candidate, links: tuple[float, ...]) -> Candidate:
    return Candidate(placement=c.placement, wasted_lanes=c.wasted_lanes, link_bounds=links)


@pytest.mark.parametrize("profile, inventory", [
    ("paper-machine-b", Inventory.simple(4, 8)),
    ("paper-machine-a", Inventory.simple(2, 3, "H100-PCIe-80GB", "PM1743")),
])
def test_preference_arrays_order_placements_as_preference_does(profile, inventory):
    """The planner ranks thousands of placements by `preference_arrays` (wasted lanes, slot order as
    integers) instead of a Candidate each: the same order, the same wasted lanes."""
    topo = load_profile(profile)
    space = enumerate_placements(topo, inventory)
    wasted, order = preference_arrays(space, topo)
    cands = [Candidate.of(p, topo) for p in space.distinct]
    assert wasted.tolist() == [c.wasted_lanes for c in cands]
    by_arrays = sorted(range(len(cands)), key=lambda i: sort_key((), int(wasted[i]), tuple(order[i].tolist())))
    assert by_arrays == sorted(range(len(cands)), key=lambda i: preference(cands[i]))
    assert len(set(wasted.tolist())) > 1  # (the slot order alone does not decide)
