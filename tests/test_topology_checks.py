"""What a machine description claims that its hardware cannot do: a link above its CPU's PCIe generation
(planned at the CPU's), more lanes than the CPU has, a `bandwidth_gbps` above the wire (planned as given),
each said in the plan's notes."""

from __future__ import annotations

import json

import pytest
from conftest import fixture_file

from moment.cli import main
from moment.planner.plan import make_plan
from moment.topology import bandwidth as bw
from moment.topology import checks
from moment.topology.devices import Inventory
from moment.topology.model import CappedLink, Topology
from moment.topology.profiles import builtin_names, load_profile, topology_from_dict
from moment.topology.readers.nccl_xml import read_nccl_xml
from moment.workload.spec import WorkloadSpec


def machine(model: str | None, gen: int, *, switch: bool = False) -> dict:
    """One socket of `model`: an x16 GPU slot and three x4 SSD bays at PCIe `gen` (behind a switch, uplink at
    `gen`, with `switch`)."""
    cpu = {"id": "cpu0", "kind": "socket", "memory_gib": 256, "memory_bandwidth_gbps": 150}
    if model:
        cpu["model"] = model
    nodes = [cpu, {"id": "rc0", "kind": "root_complex", "parent": "cpu0"}]
    top = "rc0"
    if switch:
        nodes.append({"id": "sw0", "kind": "switch", "parent": "rc0", "link": {"gen": gen, "width": 16}})
        top = "sw0"
    nodes.append({"id": "slot1", "kind": "slot", "parent": top, "width": 16, "accepts": ["gpu"],
                  "link": {"gen": gen, "width": 16}})
    nodes += [{"id": f"bay{i}", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"],
               "link": {"gen": gen, "width": 4}} for i in range(3)]
    return {"name": "cpugen", "nodes": nodes}


INV = Inventory.simple(1, 3, "H100-PCIe-80GB", "PM1743")  # PCIe 5.0 cards


def epoch(topo: Topology) -> float:
    return make_plan(topo, INV, WorkloadSpec()).predicted.epoch_read_s


def test_a_link_above_its_cpus_pcie_generation_runs_at_the_cpus_and_is_said():
    """PCIe 5.0 slots under a 'Xeon E5-2680 v4' (PCIe 3.0) were planned as 5.0: 14.62 s where the machine takes
    56.11 s. They run at 3.0 now, the plan says why, and the profile's data keep the 5.0 written."""
    topo = Topology.model_validate(machine("Xeon E5-2680 v4", 5))
    link = topo.node("slot1").link
    assert isinstance(link, CappedLink) and link.gen == 5 and link.running_gen == 3
    assert link.bandwidth() == bw.pcie_bytes(3, 16) and link.describe() == "PCIe 3.0 x16 (capped from 5.0 by the CPU)"
    assert topo.model_dump()["nodes"][2]["link"] == {"kind": "pcie", "gen": 5, "width": 16, "bandwidth_gbps": None,
                                                     "label": None}
    assert epoch(topo) == pytest.approx(epoch(Topology.model_validate(machine("Xeon E5-2680 v4", 3))), rel=1e-9)
    assert epoch(topo) == pytest.approx(56.11, abs=0.01)
    plan = make_plan(topo, INV, WorkloadSpec())
    assert "Xeon E5-2680 v4 of socket 'cpu0' drives PCIe 3.0: the PCIe 5.0 links of slot1, bay0, bay1, bay2 are " \
           "planned at PCIe 3.0" in " ".join(plan.notes)
    # a CPU the tables do not know, or one that drives PCIe 5.0, leaves the links as written
    for model in (None, "Some CPU", "AMD EPYC 9374F"):
        free = Topology.model_validate(machine(model, 5))
        assert not isinstance(free.node("slot1").link, CappedLink) and checks.notes(free) == []
        assert epoch(free) == pytest.approx(14.62, abs=0.01)


def test_only_what_the_cpu_drives_is_capped():
    """A switch's uplink is the CPU's root port; the slots behind the switch are the switch's to drive. The
    identity a scan keeps in a model's parenthesis is read too, and a --set of the socket's model re-caps."""
    topo = Topology.model_validate(machine("Intel Ice Lake-SP (GenuineIntel familyid 6 modelid 106)", 5, switch=True))
    assert topo.node("sw0").link.running_gen == 4 and topo.node("bay0").link.running_gen == 4
    assert topo.node("slot1").link.running_gen == 5 and not isinstance(topo.node("slot1").link, CappedLink)
    data = machine("Xeon Gold 5320", 6)
    assert topology_from_dict(data, "x.yaml").node("slot1").link.running_gen == 4
    data["nodes"][0]["model"] = "Xeon Gold 6426Y"  # Sapphire Rapids: PCIe 5.0
    assert topology_from_dict(data, "x.yaml").node("slot1").link.running_gen == 5
    data["nodes"][0]["model"] = "AMD EPYC 7302P"  # Rome: PCIe 4.0 (the letter after the number was not read)
    rome = topology_from_dict(data, "x.yaml")
    assert rome.node("slot1").link.running_gen == 4
    # a node object given to another topology, under another CPU, leaves the first one's link as it was
    genoa = Topology.model_validate({**data, "nodes": [{**data["nodes"][0], "model": "AMD EPYC 9374F"}]})
    mixed = Topology(name="mixed", nodes=[genoa.node("cpu0"), *rome.nodes[1:]])
    assert mixed.node("slot1").link.running_gen == 5 and rome.node("slot1").link.running_gen == 4


def test_the_planning_pages_gen_what_if_on_a_cpu_bound_link_plans_with_a_note(capsys):
    """The page suggests a link's gen + 1 (PCIe 5.0 on paper-machine-a's switch uplinks, Xeon Gold 5320: 4.0): the
    what-if plans, as fast as the machine, and says that its CPU holds the link at 4.0."""
    argv = ["plan", "--profile", "paper-machine-a", "--gpus", "4", "--ssds", "8", "--json"]
    assert main(argv) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*argv, "--set", "nodes.sw0.link.gen=5"]) == 0
    what_if = json.loads(capsys.readouterr().out)
    assert what_if["predicted"]["epoch_read_s"] == pytest.approx(base["predicted"]["epoch_read_s"], rel=1e-9)
    assert "Xeon Gold 5320 of socket 'cpu0' drives PCIe 4.0: the PCIe 5.0 link of sw0 is planned at PCIe 4.0" \
        in " ".join(what_if["notes"])


def test_more_lanes_than_the_cpu_has_are_noted_unless_a_switch_explains_them():
    """A 20-lane Xeon E-2388G with 8 x16 slots and 16 x4 bays at its root complex planned 8 GPUs at a full x16
    without a word; the same slots behind a switch take only its uplink's lanes."""
    nodes = [{"id": "cpu0", "kind": "socket", "model": "Xeon E-2388G"},
             {"id": "rc0", "kind": "root_complex", "parent": "cpu0"}]
    wide = nodes + [{"id": f"s{i}", "kind": "slot", "parent": "rc0", "width": 16, "link": {"gen": 4, "width": 16}}
                    for i in range(8)] + [
        {"id": f"b{i}", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}}
        for i in range(16)]
    said = checks.notes(Topology.model_validate({"name": "wide", "nodes": wide}))
    assert said == ["socket 'cpu0' (Xeon E-2388G) has 20 PCIe lanes, but the links at its root complexes take 192 "
                    "(8 x16, 16 x4): planned as given; a board with more slots than lanes shares them (write the "
                    "widths each slot gets) or puts a PCIe switch in front (a kind: switch node, whose uplink is what "
                    "reaches the CPU)"]
    switched = nodes + [{"id": "sw0", "kind": "switch", "parent": "rc0", "link": {"gen": 4, "width": 16}},
                        {"id": "b0", "kind": "slot", "parent": "rc0", "width": 4, "link": {"gen": 4, "width": 4}}] + [
        {"id": f"s{i}", "kind": "slot", "parent": "sw0", "width": 16, "link": {"gen": 4, "width": 16}} for i in range(8)]
    assert checks.notes(Topology.model_validate({"name": "switched", "nodes": switched})) == []


def test_a_bandwidth_above_the_wire_is_planned_as_given_and_noted(capsys, tmp_path):
    """A 'measured' 100 GB/s on a PCIe 3.0 x4 link (3.94 GB/s on the wire) was used without a word; it is still
    used (the page's what-if suggests twice a link's rate), and the plan's text and --json notes name it."""
    prof = tmp_path / "swbw.yaml"
    data = machine(None, 3)
    data["nodes"][2]["link"] = {"gen": 3, "width": 4}
    data["links"] = []
    prof.write_text(json.dumps(data))
    argv = ["plan", "--profile", str(prof), "--gpus", "1", "--ssds", "3", "--set", "nodes.slot1.link.bandwidth_gbps=100"]
    want = ("the link of slot 'slot1': bandwidth_gbps 100 is above the 3.94 GB/s a PCIe 3.0 x4 link carries on the "
            "wire; planned at bandwidth_gbps as given")
    assert main([*argv, "--json"]) == 0
    assert any(n.startswith(want) for n in json.loads(capsys.readouterr().out)["notes"])
    assert main(argv) == 0
    assert "note: " + want in " ".join(capsys.readouterr().out.split())
    # a peer link too, by its kind, count and rate; a figure under the wire is a measurement, not noted
    topo = Topology.model_validate({**machine(None, 4), "links": []})
    two = topology_from_dict({"name": "two", "nodes": [
        {"id": "cpu0", "kind": "socket"}, {"id": "cpu1", "kind": "socket"},
        {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "s0", "kind": "slot", "parent": "rc0", "link": {"gen": 4, "width": 16, "bandwidth_gbps": 20}}],
        "links": [{"a": "cpu0", "b": "cpu1", "kind": "upi", "count": 3, "gts": 16, "bandwidth_gbps": 1000}]}, "two")
    assert checks.notes(topo) == []
    assert checks.rates_over_wire(two) == ["links[0] (cpu0-cpu1): bandwidth_gbps 1000 is above the 96 GB/s a UPI x3 "
                                           "link carries on the wire; planned at bandwidth_gbps as given (a what-if, "
                                           "or a figure to check)"]


@pytest.mark.parametrize("name", builtin_names())
def test_the_builtin_profiles_claim_nothing_their_cpus_cannot_do(name):
    assert checks.notes(load_profile(name)) == []


def test_a_virtual_machines_pcie_4_report_under_a_pcie_3_cpu_is_planned_at_3(capsys):
    """Azure NDv2 reports its V100s' links at 16 GT/s under Skylake (PCIe 3.0) CPUs: the scan keeps what the
    file says and plans them at 3.0, and says so (refusing would refuse a real machine's scan)."""
    topo = read_nccl_xml(fixture_file("nccl_azure_ndv2-topo.xml"))
    slot = topo.node("rc0-slot0").link
    assert slot.gen == 4 and slot.running_gen == 3
    said = checks.notes(topo)
    assert any("drives PCIe 3.0: the PCIe 4.0 links of rc0-slot0" in n for n in said), said
    assert main(["scan", "--from-nccl-xml", str(fixture_file("nccl_azure_ndv2-topo.xml"))]) == 0
    out = capsys.readouterr()
    assert "PCIe 3.0 x16 (capped from 4.0 by the CPU)" in out.out and f"note: {said[0]}" in " ".join(out.err.split())
