"""NCCL and hwloc XML readers against real files: counts, structure, round trip, errors, profiles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import fixture_file

from moment.errors import MomentError
from moment.topology.devices import populate
from moment.topology.model import Kind, Topology
from moment.topology.profiles import PROFILE_DIR, dump_yaml, load_profile, topology_from_dict
from moment.topology.readers.hwloc_xml import read_hwloc_xml
from moment.topology.readers.nccl_xml import read_nccl_xml, write_nccl_xml

# file: (GPUs, NVMe SSDs, NICs, sockets, switches) -- from PROVENANCE.md and reading each file.
# Sockets are CPU packages, not NUMA domains: the 4-domain AMD files have 2.
EXPECTED = {
    "nccl_aws_g5.48xlarge-topo.xml": (0, 0, 0, 2, 9),  # bare <pci busid>: bridges, as NCCL assumes
    "nccl_aws_p4d.24xlarge-topo.xml": (8, 0, 4, 2, 4),
    "nccl_aws_p5.48xlarge-topo.xml": (0, 0, 0, 2, 40),  # GPUs and EFAs not tagged in the file
    "nccl_azure_ncv4-topo.xml": (4, 0, 1, 2, 0),  # the NIC is a <nic> without a PCI device
    "nccl_azure_ndv2-topo.xml": (8, 0, 1, 2, 0),
    "nccl_azure_ndv4-topo.xml": (8, 0, 8, 2, 4),
    "nccl_azure_ndv5-topo.xml": (8, 0, 8, 2, 8),
    "nccl_oci_bm.gpu.b4.8-topo-flattened.xml": (8, 0, 8, 2, 4),
    "nccl_oci_bm.gpu.h100.8-topology.xml": (8, 0, 8, 2, 24),  # 8 dual-port CX-7 = 16 nets
    "nccl_oci_bm.gpu4.8-topo-flattened.xml": (8, 0, 8, 2, 4),
    "nccl_simai_8xA100-4xCX6_topo.xml": (8, 0, 5, 2, 20),
    "rccl_topo_8p1h_5.xml": (8, 0, 8, 2, 22),  # 4x MI250X = 8 GCDs
    "rccl_topo_8p_940.xml": (8, 0, 8, 2, 24),  # MI300X
    "rccl_topo_8p_pcie.xml": (8, 0, 1, 1, 10),
    "hwloc_24em64t-2n6c2t-pci.xml": (3, 0, 2, 2, 0),  # 82576 (2 functions) + ConnectX-2 (0c06)
    "hwloc_32em64t-2n8c+dax+nvme+mic+dimms.xml": (0, 1, 2, 2, 1),  # I350 + ConnectX-3; ASPEED bridge
    # the OpenCL-only Radeon (1002:6798, VGA) is a GPU by its ids (was `other`); Matrox stays other
    "hwloc_32em64t-2n8c2t-pci-wholeio.xml": (4, 0, 2, 2, 0),
    "hwloc_nvidiaDGX2.xml": (16, 0, 0, 2, 14),
    "hwloc_power8gpudistances.xml": (4, 0, 0, 2, 0),
}
NCCL_FILES = [f for f in EXPECTED if not f.startswith("hwloc_")]
HWLOC_FILES = [f for f in EXPECTED if f.startswith("hwloc_")]


def read(name: str) -> Topology:
    path = fixture_file(name)
    return read_hwloc_xml(path) if name.startswith("hwloc_") else read_nccl_xml(path)


def links(topo: Topology, kind: str) -> list:
    return [lk for lk in topo.links if lk.kind == kind]


def uplink_parent(topo: Topology, node_id: str) -> str | None:
    """Parent with slots skipped: the structure NCCL sees."""
    p = topo.node(node_id).parent
    while p is not None and topo.node(p).kind == Kind.slot:
        p = topo.node(p).parent
    return p


@pytest.mark.parametrize("name", list(EXPECTED))
def test_counts(name):
    topo = read(name)
    gpus, ssds, nics, sockets, switches = EXPECTED[name]
    assert len(topo.of_kind(Kind.gpu)) == gpus
    assert len(topo.of_kind(Kind.ssd)) == ssds
    assert len(topo.of_kind(Kind.nic)) == nics
    assert len(topo.of_kind(Kind.socket)) == sockets
    assert len(topo.of_kind(Kind.switch)) == switches


@pytest.mark.parametrize("name", list(EXPECTED))
def test_deterministic_and_bus_ordered(name):
    a, b = read(name), read(name)
    assert a.model_dump() == b.model_dump()
    for kind in (Kind.gpu, Kind.nic, Kind.switch, Kind.ssd):
        nodes = [n for n in a.of_kind(kind) if n.pci]
        by_id = sorted(nodes, key=lambda n: int(n.id.removeprefix({"switch": "sw"}.get(kind.value, kind.value))))
        assert [n.pci for n in by_id] == sorted(n.pci for n in nodes), kind


@pytest.mark.parametrize("name", NCCL_FILES)
def test_nccl_round_trip(name):
    a = read(name)
    b = read_nccl_xml(write_nccl_xml(a))
    for kind in (Kind.gpu, Kind.nic, Kind.switch, Kind.nvswitch, Kind.socket):
        assert len(a.of_kind(kind)) == len(b.of_kind(kind)), kind
    for kind in ("nvlink", "xgmi", "upi", "qpi"):
        assert len(links(a, kind)) == len(links(b, kind)), kind
    struct = {n.id: (n.pci, uplink_parent(a, n.id)) for n in a.nodes if n.kind not in (Kind.slot,)}
    assert struct == {n.id: (n.pci, uplink_parent(b, n.id)) for n in b.nodes if n.kind not in (Kind.slot,)}


# ---- NCCL specifics ---------------------------------------------------------------------------------
def test_simai_hgx_a100():
    topo = read("nccl_simai_8xA100-4xCX6_topo.xml")
    gpus = topo.of_kind(Kind.gpu)
    assert [g.pci for g in gpus][:2] == ["0000:13:00.0", "0000:19:00.0"]
    assert all(g.model == "A100-SXM4-80GB" and g.memory_gib == 80 for g in gpus)
    # SXM modules sit straight on the switch; NICs are in slots
    assert all(topo.node(g.parent).kind == Kind.switch for g in gpus)
    assert all(topo.node(n.parent).kind == Kind.slot for n in topo.of_kind(Kind.nic))
    nic0 = topo.node("nic0")
    assert nic0.pci == "0000:06:00.0" and uplink_parent(topo, "nic0") == "rc0"
    nvsw = topo.of_kind(Kind.nvswitch)
    assert sorted(n.pci for n in nvsw) == [f"0000:c{i}:00.0" for i in range(6)]
    assert all(n.parent == "cpu0" and n.link is None for n in nvsw)
    nv = links(topo, "nvlink")
    assert len(nv) == 48 and all(lk.count == 2 and lk.gen == 3 for lk in nv)
    (upi,) = links(topo, "upi")
    assert (upi.count, upi.gts) == (3, 11.2) and "assumed" in upi.label
    assert all(n.link.gen == 4 and n.link.width == 16 for n in topo.of_kind(Kind.switch))


def test_link_speed_strings():
    assert read("nccl_azure_ndv5-topo.xml").node("gpu0").link.gen == 5  # "32.0 GT/s PCIe"
    assert read("nccl_aws_p4d.24xlarge-topo.xml").node("gpu0").link.gen == 3  # "8 GT/s"
    p5 = read("nccl_aws_p5.48xlarge-topo.xml")  # "32 GT/s PCIe/s" on children only
    assert p5.node("sw0").link.gen == 5 and "devices below" in p5.node("sw0").link.label
    oci = read("nccl_oci_bm.gpu.h100.8-topology.xml")
    assert oci.node("sw0").link.gen == 2  # upstream "5.0 GT/s PCIe" as the file says
    ncv4 = read("nccl_azure_ncv4-topo.xml")  # link_speed="" link_width="0"
    link = ncv4.node("gpu0").link
    assert (link.gen, link.width) == (4, 16) and "assumed" in link.label
    assert topology_from_dict(ncv4.model_dump(mode="json"), "x")


def test_ncv4_self_nvlink_ignored_and_bare_nic():
    topo = read("nccl_azure_ncv4-topo.xml")
    assert links(topo, "nvlink") == []
    assert "own GPU" in topo.description
    assert all(topo.node(g.parent).kind == Kind.slot for g in topo.of_kind(Kind.gpu))
    nic = topo.node("nic0")
    assert nic.pci is None and nic.link.kind == "internal" and nic.link.bandwidth_gbps == pytest.approx(12.5)


def test_amd_sockets_and_xgmi():
    ndv4 = read("nccl_azure_ndv4-topo.xml")  # 4 NUMA domains of 24 threads: 1 socket (NPS4) or 2 (NPS2)
    assert [ndv4.numa_domains(s.id) for s in ndv4.of_kind(Kind.socket)] == [[0, 1], [2, 3]]
    (x,) = links(ndv4, "xgmi")
    assert "may be one CPU package" in x.label and "not in the file" in ndv4.description
    mi300 = read("rccl_topo_8p_940.xml")
    x = links(mi300, "xgmi")
    assert len(x) == 28 and all(lk.a.startswith("gpu") and lk.b.startswith("gpu") for lk in x)
    assert all(g.model == "MI300X" and topo_parent_kind(mi300, g.id) == Kind.switch for g in mi300.of_kind(Kind.gpu))
    mi250 = read("rccl_topo_8p1h_5.xml")
    counts = sorted({lk.count for lk in links(mi250, "xgmi")})
    assert counts == [1, 2, 4]
    b4 = read("nccl_oci_bm.gpu.b4.8-topo-flattened.xml")
    # numaids 1, 3, 5, 7 of 32 threads each: only 2 sockets x NPS4 fits a 64-core Milan
    assert [b4.numa_domains(s.id) for s in b4.of_kind(Kind.socket)] == [[1, 3], [5, 7]]
    assert [s.numa for s in b4.of_kind(Kind.socket)] == [1, 5] and "not in the file" not in b4.description
    assert "Milan" in b4.node("cpu0").model
    assert "Rome" in read("nccl_oci_bm.gpu4.8-topo-flattened.xml").node("cpu0").model  # familyid 143


def topo_parent_kind(topo: Topology, node_id: str) -> Kind:
    return topo.node(topo.node(node_id).parent).kind


def test_pcie_gpus_in_slots():
    topo = read("rccl_topo_8p_pcie.xml")
    slots = [topo.node(g.parent) for g in topo.of_kind(Kind.gpu)]
    assert all(s.kind == Kind.slot and s.width == 16 and s.link.gen == 4 for s in slots)
    assert topo.node("sw0").link.gen == 3
    assert links(topo, "upi") == []  # one socket


def test_vga_without_gpu_child_is_other():
    xml = """<system version="1"><cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="85">
      <pci busid="0000:03:00.0" class="0x030000" vendor="0x102b" device="0x0532" link_speed="2.5 GT/s" link_width="1"/>
      <pci busid="0000:04:00.0" class="0x030000" vendor="0x10de" device="0x2684" link_speed="16 GT/s" link_width="16">
        <gpu dev="0" sm="89" rank="0" gdr="1"/></pci>
      <pci busid="0000:05:00.0" class="0x010802" link_speed="16 GT/s" link_width="4"/>
    </cpu></system>"""
    topo = read_nccl_xml(xml)
    assert [n.pci for n in topo.of_kind(Kind.other)] == ["0000:03:00.0"]
    assert [n.pci for n in topo.of_kind(Kind.gpu)] == ["0000:04:00.0"]
    ssd = topo.of_kind(Kind.ssd)[0]
    assert topo.node(ssd.parent).width == 4 and topo.name == "nccl-topology"


def test_link_width_that_pcie_has_not_is_the_files_error():
    """x3 is no PCIe width: one line naming the element, not a validation traceback from the model."""
    xml = """<system version="1"><cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="85">
      <pci busid="0000:05:00.0" class="0x010802" link_speed="16 GT/s" link_width="3"/>
    </cpu></system>"""
    with pytest.raises(MomentError, match=r"link_width=3 is not a PCIe width"):
        read_nccl_xml(xml)


CONSTRUCTED = Path(__file__).parent / "data" / "constructed"


def test_rccl_repeated_bus_ids_are_kept_and_named_apart():
    """RCCL's topo_expl models repeat bus ids; NCCL/RCCL keep each <pci>, so do we."""
    path = CONSTRUCTED / "rccl_repeated_busid.xml"
    topo = read_nccl_xml(path)
    by_pci = {n.pci: n for n in topo.nodes if n.pci}
    assert by_pci["0000:a1:00.0"].kind == Kind.switch and uplink_parent(topo, by_pci["0000:a1:00.0"].id) == "rc1"
    nic = by_pci["0000:a1:00.0#2"]
    assert nic.kind == Kind.nic and uplink_parent(topo, nic.id) == by_pci["0000:8f:00.0"].id
    twins = [by_pci["0000:c5:00.0"], by_pci["0000:c5:00.0#2"]]
    assert [t.kind for t in twins] == [Kind.switch, Kind.switch] and twins[0].parent == twins[1].parent
    # each twin keeps its own GPU, and the xGMI pair between them is found
    held = {uplink_parent(topo, g.id): g.pci for g in topo.of_kind(Kind.gpu)}
    assert held[twins[0].id] == "0000:cf:00.0" and held[twins[1].id] == "0000:d0:00.0"
    (x,) = [lk for lk in links(topo, "xgmi") if lk.a.startswith("gpu")]
    assert {topo.node(x.a).pci, topo.node(x.b).pci} == {"0000:cf:00.0", "0000:d0:00.0"}
    assert topo.counts() == {"socket": 2, "root_complex": 2, "switch": 7, "gpu": 4, "slot": 3, "nic": 1}
    assert "Bus id 0000:a1:00.0 appears 2 times" in topo.description
    assert "0000:c5:00.0#2: a switch under 0000:c1:00.0" in topo.description
    assert read_nccl_xml(path) == topo  # the suffixes follow file order, so they are stable
    # written back, the file repeats the ids as RCCL wrote them, and reads the same again
    xml = write_nccl_xml(topo)
    assert "#2" not in xml and xml.count('busid="0000:a1:00.0"') == 2
    again = read_nccl_xml(xml)
    assert sorted(n.pci for n in again.nodes if n.pci) == sorted(by_pci)


def _sockets(topo: Topology) -> list[list[int]]:
    return [topo.numa_domains(s.id) for s in topo.of_kind(Kind.socket)]


def test_numa_domains_grouped_into_sockets_when_the_file_tells():
    """4 NUMA domains of 64 threads on a 64-core Milan can only be 2 sockets x NPS2."""
    topo = read_nccl_xml(CONSTRUCTED / "nccl_amd_4numa_2sockets.xml")
    assert _sockets(topo) == [[0, 1], [2, 3]]
    assert [(rc.id, rc.parent, rc.numa) for rc in topo.of_kind(Kind.root_complex)] == [
        ("rc0", "cpu0", 0), ("rc1", "cpu0", 1), ("rc2", "cpu1", 2), ("rc3", "cpu1", 3)]
    assert [topo.socket_of(g.id) for g in topo.of_kind(Kind.gpu)] == ["cpu0", "cpu0", "cpu1", "cpu1"]
    (x,) = links(topo, "xgmi")
    assert (x.a, x.b) == ("cpu0", "cpu1") and "may be" not in x.label
    assert "fit only 2 domain(s) a socket" in topo.description and "not in the file" not in topo.description
    assert topo.node("cpu0").label == "NUMA domains 0, 1"
    # written back, each NUMA domain is its own <cpu> again
    xml = write_nccl_xml(topo)
    assert [int(n) for n in re.findall(r'<cpu numaid="(\d+)"', xml)] == [0, 1, 2, 3]
    assert _sockets(read_nccl_xml(xml)) == [[0, 1], [2, 3]]  # no affinity: uncertain, grouped the same


def test_numa_domains_the_file_cannot_place_are_said_so():
    """16-thread Rome domains fit 1 socket x NPS4 and 2 sockets x NPS2: not guessed, said."""
    topo = read_nccl_xml(CONSTRUCTED / "nccl_amd_4numa_unknown.xml")
    assert "Which NUMA domains share a CPU socket is not in the file" in topo.description
    assert "fit 2 or 4 or 8 domains a socket" in topo.description
    # 0 and 1 share a socket in every fit (NPS2, NPS4, 8 per socket), 1 and 2 do not: so 2 socket nodes
    assert _sockets(topo) == [[0, 1], [2, 3]]
    assert all("may share a CPU package" in s.label for s in topo.of_kind(Kind.socket))
    # without any CPU identity nothing is grouped, and the description says why
    bare = read_nccl_xml('<system><cpu numaid="0"/><cpu numaid="1"/><cpu numaid="2"/></system>')
    assert _sockets(bare) == [[0], [1], [2]] and "does not identify the CPU" in bare.description


@pytest.mark.parametrize(("domains", "sockets", "certain"), [
    # Ice Lake-SP has at most 80 threads a socket: two 64-thread domains are two sockets
    ({0: ("GenuineIntel", 6, 106, 64), 1: ("GenuineIntel", 6, 106, 64)}, ((0,), (1,)), True),
    # Sapphire Rapids with SNC2: 48 + 48 threads could be one socket (120 max) or two
    ({0: ("GenuineIntel", 6, 143, 48), 1: ("GenuineIntel", 6, 143, 48)}, ((0,), (1,)), False),
    # AMD: at most 2 sockets, so numaids 1, 3, 5, 7 need >= 4 domains a socket; 32 threads each on Milan
    # (128 a socket) allows only NPS4
    ({n: ("AuthenticAMD", 25, 1, 32) for n in (1, 3, 5, 7)}, ((1, 3), (5, 7)), True),
    # mixed CPUs: nothing can be said
    ({0: ("AuthenticAMD", 25, 1, 8), 1: ("GenuineIntel", 6, 106, 8)}, ((0,), (1,)), False),
    ({4: ("AuthenticAMD", 25, 1, None)}, ((4,),), True),
])
def test_group_numa_domains(domains, sockets, certain):
    from moment.topology.readers import _xml_cpu as cpus

    arg = {}
    start = 0
    for n, (vendor, family, model, threads) in domains.items():
        arg[n] = (cpus.CpuId(vendor, family, model), None if threads is None else frozenset(range(start, start + threads)))
        start += threads or 0
    g = cpus.group_numa_domains(arg)
    assert (g.sockets, g.certain) == (sockets, certain)
    assert (g.note is None) == (len(domains) == 1)


def test_affinity_mask():
    from moment.topology.readers._xml_cpu import affinity_cpus

    assert affinity_cpus("00000000,0000ff00,00000000,0000ff00") == frozenset([*range(8, 16), *range(72, 80)])
    assert affinity_cpus("fff0000,0") == frozenset(range(48, 60))  # OCI's short word is still a word
    assert affinity_cpus("") is None and affinity_cpus("zz") is None and affinity_cpus(None) is None


def test_write_plan_machine_with_placeholders():
    base = load_profile("paper-machine-b")
    topo = populate(base, {"sw0-x16a": "A100-PCIe-40GB", "sw1-x16a": "A100-PCIe-40GB", "rc0-bay0": "P5510"})
    xml = write_nccl_xml(topo)
    assert "placeholder bus ids" in xml and "fffe:" in xml
    back = read_nccl_xml(xml)
    assert len(back.of_kind(Kind.gpu)) == 2 and len(back.of_kind(Kind.switch)) == 2
    assert back.of_kind(Kind.ssd) == []  # NCCL is not told about SSDs
    assert uplink_parent(back, "gpu1") == "sw1"


# ---- hwloc specifics --------------------------------------------------------------------------------
def test_dgx2():
    topo = read("hwloc_nvidiaDGX2.xml")
    nvsw = topo.of_kind(Kind.nvswitch)
    assert len(nvsw) == 12 and all(topo_parent_kind(topo, n.id) == Kind.switch for n in nvsw)
    assert any(n.pci == "0000:66:00.0" for n in nvsw)  # pci_type 0000 but subtype NVSwitch
    assert "Gen1 x4 or" in nvsw[0].link.label or "or Gen1 x4" in nvsw[0].link.label
    nv = links(topo, "nvlink")
    assert len(nv) == 96 and all(lk.bandwidth_gbps == 25 and lk.count == 1 and lk.gen == 2 for lk in nv)
    per_gpu = {g.id: sum(1 for lk in nv if g.id in (lk.a, lk.b)) for g in topo.of_kind(Kind.gpu)}
    assert set(per_gpu.values()) == {6}
    g0 = topo.node("gpu0")
    assert (g0.link.gen, g0.link.width) == (3, 16) and g0.model.startswith("Tesla V100-SXM3")
    assert topo.node("cpu0").memory_gib == pytest.approx(754.6, abs=0.1)


def test_power8_nvlink_to_cpu():
    topo = read("hwloc_power8gpudistances.xml")
    nv = links(topo, "nvlink")
    pairs = sorted((lk.a, lk.b) for lk in nv)
    assert pairs == [("cpu0", "gpu0"), ("cpu0", "gpu1"), ("cpu1", "gpu2"), ("cpu1", "gpu3"),
                     ("gpu0", "gpu1"), ("gpu2", "gpu3")]
    assert all(lk.count == 2 and lk.gen == 1 and lk.bandwidth_gbps == 40 for lk in nv)
    assert len(topo.of_kind(Kind.root_complex)) == 4


def test_hwloc_classification():
    es1000 = read("hwloc_24em64t-2n6c2t-pci.xml")
    assert "0000:01:03.0" in [n.pci for n in es1000.of_kind(Kind.other)]  # ATI ES1000 VGA
    assert es1000.node("gpu0").link.width == 16
    whole = read("hwloc_32em64t-2n8c2t-pci-wholeio.xml")
    others = {n.pci for n in whole.of_kind(Kind.other)}
    assert "0000:05:03.0" in others  # Matrox G200eW: BMC video by its vendor id
    radeon = next(n for n in whole.of_kind(Kind.gpu) if n.pci == "0000:84:00.1")  # OpenCL only: a GPU by ids
    assert (radeon.pci_ids, radeon.pci_class) == ("1002:6798", "0x0300")
    assert whole.node(radeon.parent).kind == Kind.slot  # its own card, not merged into the Tesla at 84:00.0
    nvme = read("hwloc_32em64t-2n8c+dax+nvme+mic+dimms.xml")
    (ssd,) = nvme.of_kind(Kind.ssd)
    assert ssd.pci == "0000:00:02.0" and topo_parent_kind(nvme, ssd.id) == Kind.slot
    i350 = next(n for n in nvme.of_kind(Kind.nic) if n.pci == "0000:02:00.0")
    assert "function .3 merged" in i350.label
    assert "0000:83:00.0" in [n.pci for n in nvme.of_kind(Kind.other)]  # Xeon Phi
    assert "chipset PCI functions were left out" in nvme.description
    (qpi,) = links(nvme, "qpi")
    assert qpi.gts == 8.0  # E5-2680: Sandy Bridge-EP


HWLOC_V1 = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc.dtd">
<topology>
  <object type="Machine" os_index="0">
    <object type="NUMANode" os_index="0" local_memory="68719476736">
      <object type="Socket" os_index="0"><info name="CPUModel" value="Intel(R) Xeon(R) CPU E5-2680 v4"/>
        <object type="Core" os_index="0"><object type="PU" os_index="0"/></object>
      </object>
      <object type="Bridge" os_index="0" bridge_type="0-1" depth="0" bridge_pci="0000:[00-08]">
        <object type="Bridge" os_index="16" bridge_type="1-1" depth="1" bridge_pci="0000:[02-08]"
                pci_busid="0000:00:02.0" pci_type="0604 [8086:6f04] [0000:0000] 01" pci_link_speed="15.753846">
          <object type="Bridge" os_index="48" bridge_type="1-1" depth="2" bridge_pci="0000:[03-08]"
                  pci_busid="0000:02:00.0" pci_type="0604 [10b5:8747] [0000:0000] ca" pci_link_speed="15.753846">
            <object type="Bridge" os_index="64" bridge_type="1-1" depth="3" bridge_pci="0000:[04-04]"
                    pci_busid="0000:03:08.0" pci_type="0604 [10b5:8747] [0000:0000] ca" pci_link_speed="15.753846">
              <object type="PCIDev" os_index="80" pci_busid="0000:04:00.0" pci_type="0302 [10de:1db4] [10de:1214] a1"
                      pci_link_speed="15.753846">
                <object type="OSDev" name="cuda0" osdev_type="5"/>
              </object>
            </object>
            <object type="Bridge" os_index="65" bridge_type="1-1" depth="3" bridge_pci="0000:[05-05]"
                    pci_busid="0000:03:10.0" pci_type="0604 [10b5:8747] [0000:0000] ca" pci_link_speed="3.938462">
              <object type="PCIDev" os_index="96" pci_busid="0000:05:00.0" pci_type="0108 [144d:a808] [144d:a801] 00"
                      pci_link_speed="3.938462"><object type="OSDev" name="nvme0n1" osdev_type="0"/></object>
            </object>
          </object>
        </object>
      </object>
    </object>
  </object>
</topology>
"""


def test_hwloc_v1_format():
    topo = read_hwloc_xml(HWLOC_V1, name="v1")
    assert topo.counts() == {"socket": 1, "root_complex": 1, "switch": 1, "slot": 2, "gpu": 1, "ssd": 1}
    assert topo.node("cpu0").memory_gib == 64 and "v1" in topo.description
    ssd_slot = topo.node(topo.node("ssd0").parent)
    assert ssd_slot.parent == "sw0" and ssd_slot.width == 4 and ssd_slot.label == "port 0000:03:10.0"
    assert (topo.node("sw0").link.gen, topo.node("sw0").link.width) == (3, 16)
    assert topo.node("sw0").model == "PLX PEX8747"


# ---- errors -----------------------------------------------------------------------------------------
SIMAI = "nccl_simai_8xA100-4xCX6_topo.xml"


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda t: t[: len(t) // 2], "not well-formed XML at line"),
    (lambda t: "hello, not xml", "file not found"),  # a str without '<' is a path
    (lambda t: "<<<>>>", "not well-formed"),
    (lambda t: t.replace("<system", "<sistema").replace("</system>", "</sistema>"), "root element is <sistema>"),
    (lambda t: t.replace('class="0x030200"', 'class="0xZZ"', 1), "line 11: <pci>: class='0xZZ'"),
    (lambda t: t.replace('link_speed="16 GT/s"', 'link_speed="fast"', 1), "link_speed 'fast'"),
    (lambda t: t.replace('link_speed="16 GT/s"', 'link_speed="12 GT/s"', 1), "not a PCIe lane rate"),
    (lambda t: t.replace('link_width="16"', 'link_width="x16"', 1), "link_width='x16'"),
    (lambda t: t.replace('numaid="1"', 'numaid="0"'), "numaid 0 is used by two"),
    (lambda t: t.replace('numaid="1" ', ""), "missing attribute 'numaid'"),
    (lambda t: t.replace('busid="0000:13:00.0"', 'busid="13:00"'), "not a PCI bus id"),
    (lambda t: t.replace('tclass="0x068000"', 'tclass="0x030200"', 1), "expected a GPU"),
    (lambda t: t.replace('count="2"', 'count="0"', 1), "out of range"),
    (lambda t: '<system version="1"></system>', "no <cpu> element"),
])
def test_nccl_malformed(mutate, needle):
    text = fixture_file(SIMAI).read_text()
    with pytest.raises(MomentError, match=None) as exc:
        read_nccl_xml(mutate(text))
    assert needle in str(exc.value)


def test_errors_name_the_file(tmp_path: Path):
    bad = tmp_path / "broken.xml"
    bad.write_text(fixture_file(SIMAI).read_text()[:500])
    with pytest.raises(MomentError, match=r"broken\.xml: not well-formed XML at line \d+"):
        read_nccl_xml(bad)
    with pytest.raises(MomentError, match="is a directory"):
        read_hwloc_xml(tmp_path)
    with pytest.raises(MomentError, match="root element is <system>.*not a hwloc XML"):
        read_hwloc_xml(fixture_file(SIMAI))
    with pytest.raises(MomentError, match="cannot decode|not well-formed"):
        read_nccl_xml(b"\xff\xfe<\x00s\x00")


#: the "billion laughs": 776 bytes whose entities expand to 3 GB (expat's own guard took minutes of CPU to stop it)
ENTITY_BOMB = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
               + "".join(f'<!ENTITY lol{i} "' + f"&lol{i - 1 if i > 1 else ''};" * 10 + '">' for i in range(1, 10))
               + ']><system version="1">&lol9;</system>')


@pytest.mark.parametrize("read", [read_nccl_xml, read_hwloc_xml])
def test_a_dtd_of_its_own_is_refused_before_its_entities_expand(read, tmp_path):
    """NCCL and hwloc dumps declare no DTD (hwloc names an external one, never fetched): a DOCTYPE with one is
    refused at once, in the reader every caller (scan, plan, the service's uploads) goes through."""
    import time

    for text, line in ((ENTITY_BOMB, 1), ('<?xml version="1.0"?>\n<!DOCTYPE t [<!ELEMENT t ANY>]>\n<t/>', 2)):
        start = time.monotonic()
        with pytest.raises(MomentError, match=rf"line {line}: the DOCTYPE declares a DTD of its own") as exc:
            read(text)
        assert time.monotonic() - start < 1 and exc.value.hint.startswith("remove the [ ... ] part")
    (tmp_path / "bomb.xml").write_text(ENTITY_BOMB)
    with pytest.raises(MomentError, match=r"bomb\.xml: line 1: the DOCTYPE declares"):
        read(tmp_path / "bomb.xml")
    assert read(fixture_file(DGX2) if read is read_hwloc_xml else fixture_file(SIMAI)).nodes  # an external DTD: read


DGX2 = "hwloc_nvidiaDGX2.xml"


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda t: t.replace('pci_type="0302 [10de:1db8]', 'pci_type="zz', 1), "is not 'CCSS [vvvv:dddd]"),
    (lambda t: t.replace("OSDev:802 ", "OSDev:99999 ", 1), "names no object"),
    (lambda t: t.replace('nbobjs="28"', 'nbobjs="27"'), "nbobjs=27 needs"),
    (lambda t: t.replace('version="3.0"', 'version="three"'), "not an hwloc XML version"),
    (lambda t: t.replace("OSDev:802 ", "Package:3 OSDev:802 ", 1).replace('nbobjs="28"', 'nbobjs="29"'),
     "nbobjs=29 needs"),
])
def test_hwloc_malformed(mutate, needle):
    text = fixture_file(DGX2).read_text()
    with pytest.raises(MomentError) as exc:
        read_hwloc_xml(mutate(text))
    assert needle in str(exc.value)


# ---- built-in profiles ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hgx-a100-8gpu", "dgx2"])
def test_builtin_profile_round_trip(name, tmp_path):
    topo = load_profile(name)
    again = tmp_path / f"{name}.yaml"
    again.write_text(dump_yaml(topo, header="copy"))
    assert load_profile(str(again)) == topo
    bays = [s for s in topo.empty_slots() if s.accepts == [Kind.ssd] and s.width == 4]
    assert len(bays) == 8
    assert all(topo_parent_kind(topo, g.id) != Kind.slot for g in topo.of_kind(Kind.gpu))
    assert "commit" in (PROFILE_DIR / f"{name}.yaml").read_text().split("\nname:")[0]


def test_hgx_profile_contents():
    topo = load_profile("hgx-a100-8gpu")
    assert len(topo.of_kind(Kind.gpu)) == 8 and len(topo.of_kind(Kind.nvswitch)) == 6
    assert sorted({s.parent for s in topo.empty_slots()}) == ["sw0", "sw10", "sw15", "sw5"]
    assert len(topo.layouts["bays-spread"].ssd) == 8


@pytest.mark.parametrize("name", ["hgx-a100-8gpu", "dgx2"])
def test_builtin_profile_matches_its_source(name, fixtures_dir):
    from moment.topology.builtin_profiles import build

    assert build(name, fixtures_dir) == load_profile(name)
