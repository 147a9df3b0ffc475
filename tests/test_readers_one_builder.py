"""One topology builder. The same machine read from hwloc XML and from `lspci -vvv`
gets the same ids (slots included), structure, addresses and links."""

from __future__ import annotations

from pathlib import Path

import pytest

from moment.topology.model import Kind, Topology
from moment.topology.readers import dmidecode, lspci, nvidia_smi
from moment.topology.readers.build import next_slot_id, slot_id
from moment.topology.readers.hwloc_xml import read_hwloc_xml

DATA = Path(__file__).parent / "data" / "constructed"


def _shape(topo: Topology) -> dict[str, tuple]:
    """What the planner sees of each node: kind, parent, address, uplink gen/width, slot width."""
    return {n.id: (n.kind.value, n.parent, n.pci, (n.link.gen, n.link.width) if n.link else None,
                   getattr(n, "width", None) if n.kind == Kind.slot else None) for n in topo.nodes}


@pytest.fixture(scope="module")
def pair() -> tuple[Topology, Topology]:
    return (read_hwloc_xml(DATA / "two-sources_hwloc.xml"),
            lspci.read_lspci(verbose=DATA / "two-sources_lspci-vvvnn.txt"))


def test_same_machine_two_sources_same_ids_and_structure(pair):
    hw, ls = pair
    assert _shape(hw) == _shape(ls)
    slots = [s.id for s in ls.of_kind(Kind.slot)]
    assert slots == ["rc0-slot0", "sw0-slot0", "sw0-slot1", "rc1-slot0", "rc1-slot1"]
    assert [ls.occupant(s).id for s in slots] == ["gpu0", "ssd0", "gpu1", "nic0", "ssd1"]
    # slots carry the port they are wired to, from either source
    assert [ls.node(s).pci for s in slots] == ["0000:00:01.0", "0000:03:08.0", "0000:03:10.0", "0000:80:01.0",
                                               "0000:80:02.0"]
    # root complexes know their NUMA node from either source
    assert [(rc.parent, rc.numa) for rc in hw.of_kind(Kind.root_complex)] == [("cpu0", 0), ("cpu1", 1)]
    assert [(rc.parent, rc.numa) for rc in ls.of_kind(Kind.root_complex)] == [("cpu0", 0), ("cpu1", 1)]


def test_slot_id_rule_is_shared():
    assert slot_id("sw3", 2) == "sw3-slot2"
    assert next_slot_id("rc0", {"rc0-slot0", "rc0-slot1", "rc1-slot2"}) == "rc0-slot2"
    # dmidecode names the slot it wraps around a bare device by the same rule
    vm = lspci.read_lspci(Path(__file__).parent / "data" / "this-machine" / "lspci-tv.txt")
    rec = dmidecode.SlotRecord(designation="X", pcie=True, in_use=True, bus_address="0000:00:03.0")
    wrapped = dmidecode.merge_slots(vm, [rec])
    assert wrapped.node("nic0").parent == slot_id(vm.node("nic0").parent, 0)
    # and so does the nvidia-smi-only reader
    matrix = nvidia_smi.parse_topo((DATA / "nvidia-smi-topo_pix_nics.txt").read_text())
    smi = nvidia_smi.topology_from_matrix(matrix, name="smi")
    assert [(s.id, smi.occupant(s.id).id) for s in smi.of_kind(Kind.slot)] == [
        ("sw0-slot0", "gpu0"), ("sw0-slot1", "nic0"), ("sw0-slot2", "nic1"), ("sw1-slot0", "gpu1"),
        ("sw1-slot1", "nic2")]
