"""A card runs at the lower generation and the narrower width of card and slot, everywhere a device
link is built (populate, the search's template, cards already in a profile, what-if, the advisor),
and an SSD never serves more than its link carries."""

from __future__ import annotations

import pytest

from moment.cost.advisor import _Bound
from moment.planner.network import ChassisTemplate, build_network
from moment.planner.plan import make_plan
from moment.topology.bandwidth import pcie_bytes
from moment.topology.devices import Inventory, card_link, find_model, populate, strip
from moment.topology.model import Topology
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec


def gen4_machine(ssd: dict | None = None) -> Topology:
    """One socket: an x16 GPU slot, an x16 slot wired x8, two x4 bays, all PCIe 4.0."""
    nodes = [
        {"id": "cpu0", "kind": "socket"},
        {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "x16", "kind": "slot", "parent": "rc0", "width": 16, "link": {"gen": 4, "width": 16}},
        {"id": "x16e8", "kind": "slot", "parent": "rc0", "width": 16, "link": {"gen": 4, "width": 8}},
        {"id": "bay0", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}},
        {"id": "bay1", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}},
    ]
    if ssd is not None:
        nodes.append({"id": "ssd9", "kind": "ssd", "parent": "bay1", **ssd})
    return Topology.model_validate({"name": "gen4", "nodes": nodes})


def test_card_trains_to_the_lower_generation_and_narrower_width():
    topo = gen4_machine()
    pm1743 = card_link(find_model("PM1743"), topo.node("bay0"))  # PCIe 5.0 x4 card, 4.0 x4 bay
    assert (pm1743.gen, pm1743.width) == (4, 4)
    assert pm1743.bandwidth() == pytest.approx(pcie_bytes(4, 4))  # 6.77 GB/s, not 13.55
    h100 = card_link(find_model("H100-PCIe-80GB"), topo.node("x16"))
    assert (h100.gen, h100.width) == (4, 16) and h100.bandwidth() == pytest.approx(pcie_bytes(4, 16))
    a100 = card_link(find_model("A100-PCIe-40GB"), topo.node("x16e8"))  # x16 card in a slot wired x8
    assert (a100.gen, a100.width) == (4, 8)


def test_capacity_graph_uses_the_trained_link_and_caps_the_ssd_read():
    topo = gen4_machine()
    placement = {"x16": "H100-PCIe-80GB", "bay0": "PM1743", "bay1": "990-PRO"}
    wl = WorkloadSpec()
    for net in (build_network(populate(topo, placement), wl), ChassisTemplate(topo).network(placement, wl)):
        cap = {e.id: e.capacity for e in net.edges}
        limit = {s.id: s.limit for s in net.storage}
        assert cap["ssd0->bay0"] == pytest.approx(pcie_bytes(4, 4))
        assert cap["x16->gpu0"] == pytest.approx(pcie_bytes(4, 16))
        # PM1743 reads 13 GB/s and the 990 PRO 7.45 GB/s, but a PCIe 4.0 x4 link carries 6.77
        assert limit["ssd0"] == pytest.approx(pcie_bytes(4, 4))
        assert limit["ssd1"] == pytest.approx(pcie_bytes(4, 4))
    # an SSD slower than its link keeps its own rate
    slow = build_network(populate(topo, {"x16": "A100-PCIe-40GB", "bay0": "P5510"}), wl)
    assert {s.id: s.limit for s in slow.storage}["ssd0"] == pytest.approx(6.5e9)


def test_a_card_already_in_the_profile_and_a_what_if_follow_the_slot(tmp_path):
    # a PCIe 5.0 SSD written into a profile with its own link: it still runs at the bay's 4.0
    topo = gen4_machine({"model": "PM1743", "read_gbps": 13.0, "link": {"gen": 5, "width": 4}})
    net = build_network(populate(topo, {"x16": "A100-PCIe-40GB"}), WorkloadSpec())
    assert {e.id: e.capacity for e in net.edges}["ssd9->bay1"] == pytest.approx(pcie_bytes(4, 4))
    # `--set` lowers a slot's generation: the GPU already in it (asus: an RTX 6000 Ada, PCIe 4.0) drops too
    asus = load_profile("asus-esc8000a-e12", ["nodes.slot-00-x16.link.gen=3"])
    cap = {e.id: e.capacity for e in build_network(asus, WorkloadSpec()).edges}
    assert cap["slot-00-x16->gpu0"] == pytest.approx(pcie_bytes(3, 16))
    assert cap["slot-40-x16->gpu1"] == pytest.approx(pcie_bytes(4, 16))


def test_planner_and_advisor_see_a_gen5_ssd_at_gen4_speed():
    topo = gen4_machine()
    plan = make_plan(topo, Inventory.simple(1, 2, "A100-PCIe-40GB", "PM1743"),
                     WorkloadSpec(gpu_cache_share=0.0, cpu_cache_share=0.0))
    ssd_side = {lu.id: lu.capacity_gbps for lu in plan.links if lu.src.startswith("ssd")}
    assert set(ssd_side) == {"ssd0->bay0", "ssd1->bay1"}  # no ssd:read row above what the link shows
    assert all(v == pytest.approx(pcie_bytes(4, 4) / 1e9) for v in ssd_side.values())
    # two SSDs at 6.77 GB/s feed the GPU: the epoch is the demand over 13.55 GB/s
    assert plan.predicted.aggregate_gbps == pytest.approx(2 * pcie_bytes(4, 4) / 1e9, rel=1e-4)
    rates = _Bound(strip(topo)[0], WorkloadSpec())._slot_rates(find_model("PM1743"))
    assert max(rates) == pytest.approx(pcie_bytes(4, 4))
