"""Text readers (lspci, dmidecode, nvidia-smi), sysfs/udev and scan, on real captures of real servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import DATA, fixture_file

from moment.errors import MomentError
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory
from moment.topology.model import Kind
from moment.topology.profiles import load_profile
from moment.topology.readers import console, dmidecode, lspci, numa, nvidia_smi, sysfs, udev
from moment.topology.readers.pci import PciFunction, build_topology
from moment.topology.scan import scan_files, scan_local
from moment.workload.spec import WorkloadSpec

ESC_TV = "lspci-tv_stelline_asus-esc8000a-e12.txt"
WRX_TV = "lspci-tv_stelline_puget-wrx90.txt"
ESC_DOC = "stelline_asus-esc8000a-e12.md"
WRX_DOC = "stelline_puget-wrx90.md"
HERE = DATA / "this-machine"


def _pcis(topo, kind):
    return [n.pci for n in topo.of_kind(kind)]


# ---- lspci -tv -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, gpus, ssds, roots", [(ESC_TV, 4, 17, 8), (WRX_TV, 2, 9, 4),
                                                      (ESC_DOC, 4, 17, 8), (WRX_DOC, 2, 9, 4)])
def test_lspci_tree_counts(name, gpus, ssds, roots):
    warnings: list[str] = []
    topo = lspci.read_lspci(fixture_file(name), warnings=warnings)
    assert len(topo.of_kind(Kind.gpu)) == gpus
    assert len(topo.of_kind(Kind.ssd)) == ssds
    assert len(topo.of_kind(Kind.root_complex)) == roots
    assert any("assumed PCIe 4.0" in w for w in warnings)
    # every GPU/SSD/NIC behind a port sits in a slot, so the planner can move it
    for kind in (Kind.gpu, Kind.ssd):
        assert all(topo.node(n.parent).kind == Kind.slot for n in topo.of_kind(kind))


def test_esc8000a_tree_details():
    topo = lspci.read_lspci(fixture_file(ESC_TV))
    assert _pcis(topo, Kind.gpu) == ["0000:01:00.0", "0000:41:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    assert [g.id for g in topo.of_kind(Kind.gpu)] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert topo.node("gpu0").model == "RTX-6000-Ada" and topo.node("gpu0").memory_gib == 48
    # ASPEED BMC VGA is `other`, the HighPoint RAID functions are not SSDs, the audio functions vanish
    others = [n.label for n in topo.of_kind(Kind.other)]
    assert any("ASPEED" in o for o in others)
    assert sum("HighPoint" in o for o in others) == 3
    assert not any("Audio" in (n.label or "") for n in topo.nodes)
    # two HighPoint carriers, each a switch with three lower switches (8 SSDs + the RAID function)
    assert len(topo.of_kind(Kind.switch)) == 8
    ssd_parents = {topo.node(topo.node(s.id).parent).parent for s in topo.of_kind(Kind.ssd)[1:]}
    assert len(ssd_parents) == 4  # 4 lower switches hold 4 M.2 sites each
    # 2 ConnectX-7 cards (2 functions each) + X710 = 3 NIC cards
    assert len(topo.of_kind(Kind.nic)) == 3
    assert topo.socket_of("gpu3") == "cpu0"  # no NUMA in -tv alone: one socket
    assert topo.node("rc0-slot0").label.startswith("port 0000:00:01.1")  # the builder's one slot id rule


def test_tree_with_verbose_doc_gives_numa_links_and_slots():
    doc = fixture_file(ESC_DOC)
    topo = lspci.read_lspci(doc, doc)
    assert [s.id for s in topo.of_kind(Kind.socket)] == ["cpu0", "cpu1"]
    assert [topo.socket_of(g.id) for g in topo.of_kind(Kind.gpu)] == ["cpu0", "cpu0", "cpu1", "cpu1"]
    gpu = topo.node("gpu0")
    assert (gpu.link.gen, gpu.link.width) == (4, 16)  # LnkCap 16GT/s, not LnkSta 2.5GT/s (idle)
    nic = next(n for n in topo.of_kind(Kind.nic) if n.pci == "0000:21:00.0")
    assert (nic.link.gen, nic.link.width) == (5, 16)
    assert topo.node(gpu.parent).designation == "Slot 3"
    assert {lk.kind for lk in topo.links} == {"xgmi"}  # AMD host bridges: assumed xGMI


def test_verbose_sections_of_doc():
    funcs = lspci.parse_verbose(fixture_file(ESC_DOC).read_text())
    assert [f.bdf for f in funcs][:2] == ["0000:01:00.0", "0000:41:00.0"]
    assert len(funcs) == 8
    f = funcs[0]
    assert (f.class_name, f.cap_gts, f.cap_width, f.sta_gts, f.sta_width, f.numa, f.physical_slot) == (
        "VGA compatible controller", 16.0, 16, 2.5, 16, 0, "3")
    raid = next(f for f in funcs if f.bdf == "0000:71:00.0")
    assert raid.class_name == "RAID bus controller" and (raid.cap_width, raid.sta_width) == (2, 1)


def test_verbose_alone_rebuilds_the_tree_and_skips_slotless_ports():
    text = """\
00:01.1 PCI bridge [0604]: Intel Corporation Root Port [8086:2030]
\tBus: primary=00, secondary=01, subordinate=01, sec-latency=0
\tCapabilities: [40] Express (v2) Root Port (Slot+), MSI 00
\t\tLnkCap:\tPort #1, Speed 8GT/s, Width x16, ASPM L1, Exit Latency L1 <16us
\t\tSltCap:\tAttnBtn- PwrCtrl- MRL- AttnInd- PwrInd- HotPlug- Surprise- Slot #6, PowerLimit 75W
00:02.0 PCI bridge [0604]: Intel Corporation Root Port [8086:2032]
\tBus: primary=00, secondary=02, subordinate=02, sec-latency=0
\tCapabilities: [40] Express (v2) Root Port (Slot-), MSI 00
00:03.0 PCI bridge [0604]: Intel Corporation Root Port [8086:2033]
\tBus: primary=00, secondary=03, subordinate=03, sec-latency=0
\tCapabilities: [40] Express (v2) Root Port (Slot+), MSI 00
\t\tLnkCap:\tPort #3, Speed 8GT/s, Width x8
01:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 PCIe 32GB] [10de:1db6] (rev a1)
\tNUMA node: 1
\t\tLnkCap:\tPort #0, Speed 8GT/s, Width x16, ASPM not supported
\t\tLnkSta:\tSpeed 8GT/s (ok), Width x8 (downgraded)
"""
    topo = lspci.read_lspci(verbose=text)
    gpu = topo.of_kind(Kind.gpu)[0]
    assert gpu.model == "V100-PCIe-32GB" and (gpu.link.gen, gpu.link.width) == (3, 8)
    slot = topo.node(gpu.parent)
    assert slot.designation == "Slot 6" and slot.width == 16
    empty = topo.empty_slots()
    assert [s.pci for s in empty] == ["0000:00:03.0"] and empty[0].width == 8  # 00:02.0 says Slot-
    assert topo.socket_of(gpu.id) == "cpu0" and topo.node("cpu0").numa == 1


@pytest.mark.parametrize("text, where", [
    ("-[0000:00]-+-00.0  Host\n           +-zz.0  Bad\n", "line 2"),
    ("-[0000:00]-+-00.0  Host\n                  +-01.0  orphan\n", "continues no open list"),
    ("-[0000:00]-+-01.0-[01]----00.0  X\n           \\-02.0-[01]----00.0  Y\n", "reached twice"),
    ("hello\nworld\n", "no `lspci -tv` tree"),
])
def test_lspci_tree_errors(text, where):
    with pytest.raises(MomentError, match=where):
        lspci.parse_tree(text, "t.txt")


def test_lspci_missing_file(tmp_path):
    with pytest.raises(MomentError, match="file not found"):
        lspci.read_lspci(tmp_path / "nope.txt")


# ---- this machine ----------------------------------------------------------------------------------------
def test_this_machine_captures():
    tree = lspci.parse_tree((HERE / "lspci-tv.txt").read_text())
    verbose = lspci.parse_verbose((HERE / "lspci-vvv.txt").read_text())
    assert {f.bdf for f in tree} == {f.bdf for f in verbose}
    topo = lspci.read_lspci(HERE / "lspci-tv.txt", HERE / "lspci-vvv.txt", name="this-machine")
    assert topo.counts().get("gpu", 0) == 0 and topo.counts().get("ssd", 0) == 0
    assert dmidecode.parse_slots((HERE / "dmidecode-t-slot.txt").read_text()) == []


# ---- nvidia-smi topo -m --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, gpus, nics, nv, numa", [
    ("nvidia-smi-topo_mlengineering_a100-8gpu.txt", 8, 0, 12, [0, 0, 0, 0, 1, 1, 1, 1]),
    ("nvidia-smi-topo_mlengineering_h100-8gpu.txt", 8, 0, 18, [0, 0, 0, 0, 1, 1, 1, 1]),
    ("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt", 4, 4, 0, [0, 0, 1, 1]),
    ("nvidia-smi-topo_stelline_puget-wrx90.txt", 2, 2, 0, [0, 0]),
    (ESC_DOC, 4, 4, 0, [0, 0, 1, 1]),
    (WRX_DOC, 2, 2, 0, [0, 0]),
])
def test_nvidia_smi_matrices(name, gpus, nics, nv, numa):
    m = nvidia_smi.read_nvidia_smi(fixture_file(name))
    assert (len(m.gpus), len(m.nics)) == (gpus, nics)
    assert {m.nvlink_count(a, b) for a in m.gpus for b in m.gpus if a != b} == {nv}
    assert [m.numa_affinity[g] for g in m.gpus] == numa
    topo = nvidia_smi.topology_from_matrix(m, nvswitch="never")
    assert len(topo.of_kind(Kind.gpu)) == gpus
    assert len(topo.of_kind(Kind.socket)) == len(set(numa))
    nvlinks = [lk for lk in topo.links if lk.kind == "nvlink"]
    assert len(nvlinks) == (gpus * (gpus - 1) // 2 if nv else 0)
    assert all(lk.count == nv for lk in nvlinks)
    sockets = len(set(numa))  # joined by the builder's assumed socket link, so a plan can cross them
    assert [(lk.a, lk.b, lk.kind) for lk in topo.links if lk.kind != "nvlink"] == (
        [("cpu0", "cpu1", "upi")] if sockets == 2 else [])


def test_nvidia_smi_legend_nic_names_and_affinity():
    m = nvidia_smi.read_nvidia_smi(fixture_file("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt"))
    assert m.legend and m.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(4)}
    assert m.relation("NIC0", "NIC1") == "PIX" and m.relation("GPU0", "GPU2") == "SYS"
    assert m.cpu_affinity["GPU2"] == "32-63"
    h = nvidia_smi.read_nvidia_smi(fixture_file("nvidia-smi-topo_mlengineering_h100-8gpu.txt"))
    assert not h.legend and h.cpu_affinity["GPU7"] == "52-103,156-207"
    topo = nvidia_smi.topology_from_matrix(m)
    # one node per listed NIC (was 2: PIX ports merged); the dual-port card is a stated inference
    assert len(topo.of_kind(Kind.nic)) == 4
    assert [topo.socket_of(n.id) for n in topo.of_kind(Kind.nic)] == ["cpu0", "cpu0", "cpu1", "cpu1"]
    assert "PIX to NIC1: probably ports of one card" in topo.node("nic0").label


def test_nvswitch_fabric_and_apply_to_a_tree():
    m = nvidia_smi.read_nvidia_smi(fixture_file("nvidia-smi-topo_mlengineering_a100-8gpu.txt"))
    warnings: list[str] = []
    topo = nvidia_smi.topology_from_matrix(m, warnings=warnings)
    nvlinks = [lk for lk in topo.links if lk.kind == "nvlink"]
    assert len(topo.of_kind(Kind.nvswitch)) == 1 and len(nvlinks) == 8
    assert all(lk.count == 12 and lk.b == "nvswitch0" for lk in nvlinks)
    assert any("NVSwitch" in w for w in warnings)
    tree = lspci.read_lspci(fixture_file(ESC_TV))
    with pytest.raises(MomentError, match="8 GPUs but the topology has 4"):
        nvidia_smi.apply_nvlinks(tree, m)
    esc = nvidia_smi.read_nvidia_smi(fixture_file("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt"))
    assert nvidia_smi.apply_nvlinks(tree, esc).links == tree.links  # no NVLink on that box


def test_nvidia_smi_compressed_and_escaped_text():
    text = "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\x1b[0m\nGPU0\t X \tNV4\t0-7\t0\nGPU1\tNV4\t X \t0-7\t0\n"
    m = nvidia_smi.parse_topo(text)
    assert m.nvlink_count("GPU0", "GPU1") == 4
    assert nvidia_smi.nvlink_gen("NVIDIA H100 80GB HBM3") == 4


@pytest.mark.parametrize("text, msg", [
    ("GPU0 GPU1\nGPU0 X NV2\n", "rows missing"),
    ("GPU0 GPU1\nGPU0 X FOO\nGPU1 NV2 X\n", "unknown relation"),
    ("GPU0 GPU1\nGPU0 NV2 NV2\nGPU1 NV2 X\n", "diagonal"),
    ("nothing here\n", "no `nvidia-smi topo -m` matrix"),
])
def test_nvidia_smi_errors(text, msg):
    with pytest.raises(MomentError, match=msg):
        nvidia_smi.parse_topo(text)


# ---- dmidecode ------------------------------------------------------------------------------------------
DMI = {  # file: (records, in use, widths in record order)
    "dmidecode_linuxhw_asus-esc8000-g4.txt": (14, 9, [16] * 9 + [8, 4, 4, 4, 4]),
    "dmidecode_linuxhw_dell-poweredge-c4140.txt": (7, 4, [16] * 7),
    "dmidecode_linuxhw_gigabyte-g482-z54.txt": (40, 40, None),
    "dmidecode_linuxhw_supermicro-as-4124gs-tnr.txt": (9, 9, [16] * 9),
    "dmidecode_linuxhw_supermicro-sys-2029u-tn24r4t.txt": (4, 2, [16, 8, 4, 16]),
    "dmidecode_linuxhw_supermicro-sys-4029gp-trt.txt": (11, 9, [16, 16, 16, 16, 8, 8, 8, 16, 16, 16, 16]),
    "dmidecode_linuxhw_supermicro-sys-4029gp-trt2.txt": (12, 8, [16] * 12),
}


@pytest.mark.parametrize("name", sorted(DMI))
def test_dmidecode_slot_records(name):
    n, in_use, widths = DMI[name]
    text = fixture_file(name).read_text()
    recs = dmidecode.parse_slots(text)
    assert len(recs) == n
    assert sum(r.in_use is True for r in recs) == in_use
    if widths is not None:
        assert [r.width for r in recs] == widths
    assert dmidecode.count_sockets(text) == 2
    topo = dmidecode.topology_from_slots(recs, sockets=2)
    assert len(topo.empty_slots()) == sum(r.pcie for r in recs)


def test_dmidecode_quirks():
    g4 = dmidecode.parse_slots(fixture_file("dmidecode_linuxhw_asus-esc8000-g4.txt").read_text())
    assert g4[0].bus_address == "0000:21:00.0" and (g4[0].gen, g4[0].data_width) == (3, 16)
    assert g4[9].designation == "PCIE11" and g4[9].bus_address is None  # 0000:ff:00.0 = no device
    assert g4[10].m2 and g4[10].width == 4
    dell = dmidecode.parse_slots(fixture_file("dmidecode_linuxhw_dell-poweredge-c4140.txt").read_text())
    assert [r.bus_address for r in dell[:3]] == [None, None, None]
    smc = dmidecode.parse_slots(fixture_file("dmidecode_linuxhw_supermicro-as-4124gs-tnr.txt").read_text())
    assert smc[0].type == "x16 <OUT OF SPEC>" and smc[0].gen == 4  # generation from "PCI-E 4.0" in the name
    giga = dmidecode.parse_slots(fixture_file("dmidecode_linuxhw_gigabyte-g482-z54.txt").read_text())
    assert giga[0].bus_address == "0060:03:00.1"
    assert sum(not r.pcie for r in giga) == 17  # "32-bit PCI" records
    rec = dmidecode.parse_slots("System Slot Information\n\tDesignation: S1\n\tType: x8 PCI Express 3 x16\n"
                                "\tCurrent Usage: Available\n")[0]
    assert (rec.data_width, rec.physical_width, rec.gen, rec.in_use) == (8, 16, 3, False)


def test_merge_slots_annotates_wraps_and_adds():
    doc = fixture_file(ESC_DOC)
    topo = lspci.read_lspci(doc, doc)
    recs = [dmidecode.SlotRecord(designation="PCIE3", pcie=True, data_width=16, physical_width=16, in_use=True,
                                 bus_address="0000:01:00.0"),
            dmidecode.SlotRecord(designation="CPU2 SLOT9", pcie=True, data_width=8, gen=5, in_use=False)]
    warnings: list[str] = []
    merged = dmidecode.merge_slots(topo, recs, warnings=warnings)
    assert merged.node(merged.node("gpu0").parent).designation == "PCIE3"
    new = next(s for s in merged.of_kind(Kind.slot) if s.designation == "CPU2 SLOT9")
    assert merged.socket_of(new.id) == "cpu1" and (new.link.gen, new.link.width) == (5, 8)
    # named by the builder's rule: the next free slot number under the root complex it joins
    rc = merged.node(new.id).parent
    assert new.id == f"{rc}-slot{sum(topo.node(s.id).parent == rc for s in topo.of_kind(Kind.slot))}"
    vm = lspci.read_lspci(HERE / "lspci-tv.txt")  # the virtio NIC sits on the root bus, in no slot
    wrapped = dmidecode.merge_slots(vm, [dmidecode.SlotRecord(designation="X", pcie=True, in_use=True,
                                                              bus_address="0000:00:03.0")])
    assert wrapped.node(wrapped.node("nic0").parent).designation == "X"
    assert wrapped.node("nic0").parent == f"{vm.node('nic0').parent}-slot0"


def test_dmidecode_bad_address():
    with pytest.raises(MomentError, match="line 5: Bus Address"):
        dmidecode.parse_slots("System Slot Information\n\tDesignation: S1\n\tType: x16 PCI Express\n"
                              "\tCurrent Usage: In Use\n\tBus Address: 0000:zz:00.0\n")


# ---- console / numactl ----------------------------------------------------------------------------------
def test_console_sections_and_numactl():
    text = fixture_file(ESC_DOC).read_text()
    cmds = [s.command for s in console.sections(text) if s.command]
    assert "lspci -tv" in cmds and "nvidia-smi topo -m" in cmds
    assert console.is_lspci_verbose("sudo lspci -vvv -s 01:00.0")
    assert not console.is_lspci_verbose("sudo lspci -vvv | grep ACSCtl")
    mem = numa.parse_numactl(text)
    assert sorted(mem) == [0, 1] and round(mem[0], 1) == 188.6


# ---- sysfs / udev -----------------------------------------------------------------------------------------
def _fake_sysfs(tmp_path: Path) -> Path:
    """A small /sys: a root port with a GPU (physical slot 3), a root port with an NVMe, an empty port."""
    devices = tmp_path / "sys/devices/pci0000:00"
    bus = tmp_path / "sys/bus/pci"
    (bus / "devices").mkdir(parents=True)
    spec = {
        "0000:00:01.0": ("", {"class_": "0x060400", "vendor": "0x8086", "secondary_bus_number": "1",
                                  "max_link_speed": "16.0 GT/s PCIe", "max_link_width": "16", "numa_node": "1"}),
        "0000:01:00.0": ("0000:00:01.0", {"class_": "0x030200", "vendor": "0x10de", "device": "0x20b5",
                                              "max_link_speed": "16.0 GT/s PCIe", "max_link_width": "16",
                                              "current_link_speed": "2.5 GT/s PCIe", "current_link_width": "16",
                                              "numa_node": "1"}),
        "0000:00:02.0": ("", {"class_": "0x060400", "vendor": "0x8086", "secondary_bus_number": "2"}),
        "0000:02:00.0": ("0000:00:02.0", {"class_": "0x010802", "vendor": "0x8086", "device": "0x0b60",
                                              "max_link_speed": "16.0 GT/s PCIe", "max_link_width": "4"}),
        "0000:00:03.0": ("", {"class_": "0x060400", "vendor": "0x8086", "secondary_bus_number": "3",
                                  "max_link_width": "8"}),
    }
    for bdf, (parent, attrs) in spec.items():
        d = (devices / parent / bdf) if parent else devices / bdf
        d.mkdir(parents=True, exist_ok=True)
        for k, v in attrs.items():
            (d / k.rstrip("_")).write_text(v + "\n")
        (bus / "devices" / bdf).symlink_to(d)
    (bus / "slots/3").mkdir(parents=True)
    (bus / "slots/3/address").write_text("0000:01:00\n")
    return bus / "devices"


def test_sysfs_fake_tree(tmp_path):
    root = _fake_sysfs(tmp_path)
    warnings: list[str] = []
    topo = sysfs.read_sysfs(root, warnings=warnings)
    gpu, ssd = topo.of_kind(Kind.gpu)[0], topo.of_kind(Kind.ssd)[0]
    assert gpu.label == "PCI device [10de:20b5]"  # sysfs has ids, not names (lspci adds those)
    assert (gpu.model, gpu.memory_gib) == ("A100-PCIe-80GB", 80)  # the ids' model (the XML readers' table)
    assert (gpu.link.gen, gpu.link.width) == (4, 16)  # max_link_*, not the idle current_link_speed
    assert topo.node(gpu.parent).designation == "Slot 3"
    assert (ssd.link.gen, ssd.link.width) == (4, 4)
    assert [s.pci for s in topo.empty_slots()] == ["0000:00:03.0"]
    assert topo.node("cpu0").numa == 1 and not any("assumed" in w for w in warnings[:1] if "NUMA" in w)


def test_scan_local_on_a_fake_machine(tmp_path):
    root = _fake_sysfs(tmp_path)
    topo, report = scan_local("fake", sysfs_root=root, node_root=tmp_path / "nodes", which=lambda _: None,
                              use_udev=False)
    assert topo.name == "fake" and len(topo.of_kind(Kind.gpu)) == 1
    missing = {m.source: m.reason for m in report.sources_missing}
    assert "not installed" in missing["lspci -tv"] and "not installed" in missing["nvidia-smi topo -m"]
    assert "dmidecode -t slot" in missing
    assert any(line.startswith("used: sysfs") for line in report.lines())


def test_scan_local_with_fake_tools(tmp_path):
    root = _fake_sysfs(tmp_path)
    outputs = {
        "lspci": (0, ("-[0000:00]-+-01.0-[01]----00.0  NVIDIA Corporation GA100 [A100 PCIe 80GB]\n"
                      "           +-02.0-[02]----00.0  Intel Corporation NVMe DC SSD\n"
                      "           \\-03.0-[03]--\n"), ""),
        "nvidia-smi": (9, "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
        "dmidecode": (0, ("# dmidecode 3.4\n\nHandle 0x0900, DMI type 9, 17 bytes\nSystem Slot Information\n"
                          "\tDesignation: PCIE3\n\tType: x16 PCI Express 4 x16\n\tCurrent Usage: In Use\n"
                          "\tBus Address: 0000:01:00.0\n"), ""),
    }

    def run(cmd):
        if cmd[:2] == ["lspci", "-vvv"]:
            return 0, "", ""
        return outputs[cmd[0]]

    topo, report = scan_local("fake", sysfs_root=root, node_root=tmp_path, run=run, which=lambda c: c,
                              use_udev=False)
    assert topo.of_kind(Kind.gpu)[0].label.startswith("NVIDIA Corporation GA100")
    missing = {m.source: m.reason for m in report.sources_missing}
    assert "failed (exit 9)" in missing["nvidia-smi topo -m"]
    if os.geteuid() == 0:
        assert topo.node(topo.of_kind(Kind.gpu)[0].parent).designation == "PCIE3"
    else:
        assert "needs root" in missing["dmidecode -t slot"]


def test_scan_local_this_machine_does_not_crash():
    topo, report = scan_local()
    assert report.sources_used and report.sources_used[0].startswith("sysfs")
    assert topo.of_kind(Kind.socket)


def test_udev_annotate_and_availability():
    ok, why = udev.available()
    assert ok or "pyudev" in why
    topo = build_topology([PciFunction(0, 0, 2, 0, name="Samsung NVMe SSD", class_code=0x0108)], name="t")
    devs = [udev.UdevDevice(kind="nvme", name="nvme0n1", pci="0000:00:02.0", model="990 PRO", size_bytes=2 * 10**12)]
    out = udev.annotate(topo, devs)
    ssd = out.of_kind(Kind.ssd)[0]
    assert ssd.label.startswith("nvme0n1") and ssd.capacity_gb == 2000.0


# ---- scan_files -------------------------------------------------------------------------------------------
def test_scan_files_tree_plus_nvidia_smi_places_sockets():
    topo, report = scan_files(lspci=fixture_file(ESC_TV),
                              nvidia_smi=fixture_file("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt"))
    assert [topo.socket_of(rc.id) for rc in topo.of_kind(Kind.root_complex)] == ["cpu0"] * 4 + ["cpu1"] * 4
    assert "lspci -vvv" in {m.source for m in report.sources_missing}


def test_scan_files_whole_doc():
    doc = fixture_file(WRX_DOC)
    topo, report = scan_files(lspci=doc, nvidia_smi=doc)
    assert len(topo.of_kind(Kind.gpu)) == 2 and len(topo.of_kind(Kind.ssd)) == 9
    assert any(u.startswith("lspci -vvv") for u in report.sources_used)
    assert topo.node("cpu0").memory_gib == pytest.approx(128295 / 1024, abs=0.05)  # numactl: "node 0 size: 128295 MB"


def test_scan_files_single_sources():
    topo, _ = scan_files(dmidecode=fixture_file("dmidecode_linuxhw_dell-poweredge-c4140.txt"))
    assert len(topo.of_kind(Kind.slot)) == 7 and len(topo.of_kind(Kind.socket)) == 2
    topo, _ = scan_files(nvidia_smi=fixture_file("nvidia-smi-topo_mlengineering_h100-8gpu.txt"))
    assert len(topo.of_kind(Kind.gpu)) == 8
    with pytest.raises(MomentError):
        scan_files()


# ---- built-in profile ---------------------------------------------------------------------------------------
def test_asus_esc8000a_e12_profile():
    topo = load_profile("asus-esc8000a-e12")
    assert len(topo.of_kind(Kind.gpu)) == 4 and len(topo.of_kind(Kind.ssd)) == 17
    assert len(topo.of_kind(Kind.nic)) == 3 and len(topo.of_kind(Kind.socket)) == 2
    for kind in (Kind.gpu, Kind.ssd, Kind.nic):
        assert all(topo.node(n.parent).kind == Kind.slot for n in topo.of_kind(kind))
    empty_x16 = [s for s in topo.empty_slots() if s.width == 16]
    assert len(empty_x16) == 4  # 8 GPU positions, 4 populated
    assert len(topo.layouts["as-captured"].gpu) == 4


def test_profile_agrees_with_the_capture():
    doc = fixture_file(ESC_DOC)
    scanned, _ = scan_files(lspci=doc, nvidia_smi=doc)
    profile = load_profile("asus-esc8000a-e12")
    for kind in (Kind.gpu, Kind.ssd):
        assert _pcis(profile, kind) == _pcis(scanned, kind)
    assert [profile.socket_of(g.id) for g in profile.of_kind(Kind.gpu)] == [
        scanned.socket_of(g.id) for g in scanned.of_kind(Kind.gpu)]


def _four_numa_machine() -> list[PciFunction]:
    """4 root buses, one per NUMA node, each a root port holding an A100 (as lspci -vvv -nn would give)."""
    funcs = []
    for n in range(4):
        bus = 0x40 * n
        funcs.append(PciFunction(0, bus, 1, 0, name="Root Port", class_code=0x0604, vendor_id=0x1022, device_id=0x1483,
                                 is_bridge=True, secondary=bus + 1, subordinate=bus + 1, numa=n))
        funcs.append(PciFunction(0, bus + 1, 0, 0, name="NVIDIA A100 PCIe 40GB", class_code=0x0302,
                                 vendor_id=0x10DE, device_id=0x20F1, cap_gts=16.0, cap_width=16, numa=n))
    return funcs


def test_numa_nodes_grouped_into_dmidecode_sockets():
    """Text sources: 4 NUMA nodes (AMD NPS2) on 2 sockets are 2 sockets, not 4."""
    warnings: list[str] = []
    topo = build_topology(_four_numa_machine(), name="nps2", sockets=2, warnings=warnings,
                          memory_gib={n: 128.0 for n in range(4)})
    assert [topo.numa_domains(s.id) for s in topo.of_kind(Kind.socket)] == [[0, 1], [2, 3]]
    assert topo.node("cpu0").memory_gib == 256 and topo.node("cpu0").label == "NUMA nodes 0, 1"
    assert [topo.socket_of(g.id) for g in topo.of_kind(Kind.gpu)] == ["cpu0", "cpu0", "cpu1", "cpu1"]
    assert any("2 nodes a socket" in w for w in warnings)
    # without the full list of NUMA nodes the grouping is not known: said, not guessed
    warnings = []
    topo = build_topology(_four_numa_machine(), name="nps?", sockets=2, warnings=warnings)
    assert len(topo.of_kind(Kind.socket)) == 4 and any("is not known" in w for w in warnings)
    # no socket count: each NUMA node is a socket, as before
    assert len(build_topology(_four_numa_machine(), name="x").of_kind(Kind.socket)) == 4


# ---- socket links of the coarse readers ----------------------------------------------------------------
@pytest.mark.parametrize("kwargs, link", [
    ({"dmidecode": "dmidecode_linuxhw_supermicro-sys-4029gp-trt.txt"}, "UPI 2x 10.4 GT/s (assumed"),
    ({"nvidia_smi": "nvidia-smi-topo_stelline_asus-esc8000a-e12.txt"}, "modelled as UPI 2x (assumed)"),
    ({"nvidia_smi": "nvidia-smi-topo_stelline_asus-esc8000a-e12.txt",
      "dmidecode": "dmidecode_linuxhw_asus-esc8000-g4.txt"}, "modelled as UPI 2x (assumed)"),
])
def test_coarse_scans_join_their_sockets_and_plan(kwargs, link):
    """dmidecode or nvidia-smi alone on a two-socket board joins the sockets with the assumed socket link
    every reader writes (it wrote none, and every plan failed: the placement LP had no solution)."""
    topo, _ = scan_files(**{k: fixture_file(v) for k, v in kwargs.items()})
    socket_links = [lk for lk in topo.links if lk.kind != "nvlink"]
    assert [(lk.a, lk.b, lk.kind) for lk in socket_links] == [("cpu0", "cpu1", "upi")]
    assert link in (socket_links[0].label or "")
    ssds = 1 if "dmidecode" in kwargs else 0  # nvidia-smi alone finds no SSD slot: data from memory
    wl = WorkloadSpec(gpu_cache_share=0.5, cpu_cache_share=0.5 if not ssds else 0.1)
    assert make_plan(topo, Inventory.simple(2, ssds), wl).devices


def test_nvidia_smi_nvlinked_gpus_are_fixed_modules_a_plan_keeps():
    """GPUs the matrix shows on NVLink are SXM modules, as the NCCL reader keeps them: not in a slot,
    so planning SSDs around them keeps them and their NVLinks (they were stripped with their links)."""
    a100 = fixture_file("nvidia-smi-topo_mlengineering_a100-8gpu.txt")
    topo = nvidia_smi.topology_from_matrix(nvidia_smi.read_nvidia_smi(a100))
    assert [topo.node(g.parent).kind for g in topo.of_kind(Kind.gpu)] == [Kind.root_complex] * 8
    esc = nvidia_smi.read_nvidia_smi(fixture_file("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt"))
    plain = nvidia_smi.topology_from_matrix(esc)  # no NVLink: every GPU in its slot
    assert [plain.node(g.parent).kind for g in plain.of_kind(Kind.gpu)] == [Kind.slot] * 4
    topo, _ = scan_files(nvidia_smi=a100, dmidecode=fixture_file("dmidecode_linuxhw_supermicro-sys-4029gp-trt.txt"))
    plan = make_plan(topo, Inventory.simple(0, 2), WorkloadSpec())
    assert sorted(plan.devices.values()) == ["ssd0", "ssd1"]
    assert {lu.kind for lu in plan.links} >= {"nvlink"}
