"""The search's shortcuts are exact: capacity classes, the tree bound, and branch and bound."""

from __future__ import annotations

import random

import numpy as np
import pytest

from moment.planner import search
from moment.planner.equivalence import CapacityCanon, TreeBound
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory, strip
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec


def _sample(profile: str, k: int, seed: int = 0):
    bare = load_profile(profile)
    cands = search.enumerate_placements(bare, Inventory.simple(4, 8)).distinct
    rng = random.Random(seed)
    return bare, rng.sample(cands, min(k, len(cands)))


@pytest.mark.parametrize("profile", ["paper-machine-a", "paper-machine-b"])
def test_bound_never_exceeds_lp_and_classes_share_their_time(profile):
    bare, cands = _sample(profile, 120)
    tpl, wl = ChassisTemplate(bare), WorkloadSpec()
    canon, bound = CapacityCanon(tpl), TreeBound(tpl)
    times = [s.epoch_read_s for s in solve_lp_batch([tpl.network(p, wl) for p in cands])]
    by_class: dict = {}
    for p, t in zip(cands, times):
        assert bound.bound(p, wl)[0] <= t * (1 + 1e-7)
        by_class.setdefault(canon.key(p), []).append(t)
    assert any(len(ts) > 1 for ts in by_class.values()), "sample too small to test class equality"
    for ts in by_class.values():
        assert max(ts) == pytest.approx(min(ts), rel=1e-7)


@pytest.mark.slow
def test_branch_and_bound_finds_the_exhaustive_optimum(monkeypatch):
    """A narrow switch uplink makes most placements link-bound: the pruned search must still find
    the best of all of them."""
    topo = load_profile("paper-machine-a", ["nodes.sw0.link.bandwidth_gbps=12", "nodes.sw1.link.bandwidth_gbps=9"])
    wl = WorkloadSpec()
    cands = search.enumerate_placements(topo, Inventory.simple(4, 8)).distinct
    tpl = ChassisTemplate(topo)
    exhaustive = min(s.epoch_read_s for s in solve_lp_batch([tpl.network(p, wl) for p in cands]))
    plan = make_plan(topo, Inventory.simple(4, 8), wl, maxflow_backend="ortools")
    assert plan.predicted.epoch_read_s == pytest.approx(exhaustive, rel=1e-6)
    assert plan.search.solved < plan.search.capacity_classes < plan.search.distinct_candidates


@pytest.mark.slow
def test_nvlink_bridge_keeps_the_search_exact():
    """An NVLink bridge bypasses tree links: only the SSD bound prunes, and the optimum must still
    be the exhaustive one."""
    bridge = "links+={a: sw0-x16a, b: sw0-x16b, kind: nvlink, count: 4, gen: 3}"
    topo = load_profile("paper-machine-a", [bridge, "nodes.sw0.link.bandwidth_gbps=8"])
    wl, inv = WorkloadSpec(), Inventory.simple(2, 4)
    cands = search.enumerate_placements(topo, inv).distinct
    tpl = ChassisTemplate(topo)
    exhaustive = min(s.epoch_read_s for s in solve_lp_batch([tpl.network(p, wl) for p in cands]))
    plan = make_plan(topo, inv, wl)
    assert plan.predicted.epoch_read_s == pytest.approx(exhaustive, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("profile, inventory", [
    ("paper-machine-b", Inventory.simple(4, 8)),
    ("paper-machine-a", Inventory.simple(3, 5, "H100-PCIe-80GB", "PM1743")),
    ("hgx-a100-8gpu", Inventory.simple(0, 6)),  # built-in GPUs, NVLink: no capacity classes
])
def test_classes_and_bounds_over_a_whole_space_are_those_of_each_placement(profile, inventory):
    """What the planner computes over every placement at once (`classes`, `bounds`) is what `key` and
    `bound` say of each placement: the same partition, and the same floats to the bit."""
    topo = load_profile(profile)
    space = search.enumerate_placements(topo, inventory)
    tpl = ChassisTemplate(topo)
    labels = CapacityCanon(tpl).classes(space)
    canon = CapacityCanon(tpl)
    keys = [canon.key(p) for p in space.distinct]
    assert len(set(zip(labels.tolist(), keys))) == len(set(keys)) == len(set(labels.tolist())) > 1
    for wl in (WorkloadSpec(), WorkloadSpec(gpu_cache_share=0.3, cpu_cache_share=0.2)):
        every = np.arange(len(space.rows))[::3]
        at_once, one = TreeBound(tpl).bounds(space, every, wl), TreeBound(tpl)
        for j, i in enumerate(every):
            lb, links = one.bound(space.distinct[i], wl)
            assert at_once.lb[j] == lb and at_once.links(j) == links
        # the per-link bounds as rows of one matrix sort as the tuples do
        rows = at_once.link_rows()
        tuples = [at_once.links(j) for j in range(len(every))]
        assert [tuple(x for x in r if x != -np.inf) for r in rows.tolist()] == tuples
        assert [tuples[j] for j in np.lexsort(rows.T[::-1])] == sorted(tuples)


@pytest.mark.slow
def test_the_ssd_bound_counts_a_carrier_at_what_its_link_carries():
    """asus-esc8000a-e12 keeps 16 of its NVMe bays on two carriers behind one PCIe 4.0 x16 link each:
    their drives serve the GPUs no faster than those links. Counted so, the SSD bound stays below every
    class's LP time and rules out every class that cannot tie the best (counted at the drives' own
    rates, it ruled out none of the 562 classes of 5 GPUs and 17 SSDs)."""
    topo, wl = strip(load_profile("asus-esc8000a-e12"))[0], WorkloadSpec()  # (its own cards taken out)
    space = search.enumerate_placements(topo, Inventory.simple(5, 17, "RTX-6000-Ada", "990-PRO"))
    tpl = ChassisTemplate(topo)
    labels = CapacityCanon(tpl).classes(space)
    _, reps = np.unique(labels, return_index=True)
    times = np.array([s.epoch_read_s for i in range(0, len(reps), 64)
                      for s in solve_lp_batch([tpl.network(space.placement(j), wl) for j in reps[i:i + 64]])])
    lb = TreeBound(tpl).bounds(space, reps, wl).lb
    assert len(reps) == 562 and (lb <= times * (1 + 1e-7)).all()
    assert not (lb < times.min() * (1 - 1e-6)).any()


def test_a_thousand_slots_under_one_root_complex_plan_without_running_out_of_stack(tmp_path):
    """The listing combines a node's children one call deep each: Python's default 1,000 frames was a
    RecursionError traceback on a profile with 1,000 slots under one root complex (a profile is untrusted input)."""
    lines = ["name: wide", "nodes:", "  - {id: cpu0, kind: socket, memory_gib: 256, memory_bandwidth_gbps: 150}",
             "  - {id: rc0, kind: root_complex, parent: cpu0}",
             *(f"  - {{id: s{i}, kind: slot, parent: rc0, width: 16, link: {{gen: 4, width: 16}}}}" for i in range(1100))]
    (tmp_path / "wide.yaml").write_text("\n".join(lines) + "\n")
    plan = make_plan(load_profile(str(tmp_path / "wide.yaml")), Inventory.simple(gpus=1, ssds=1), WorkloadSpec())
    assert sorted(plan.placement.values()) == ["A100-PCIe-40GB", "P5510"], plan.placement
