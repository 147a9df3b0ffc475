"""Devices are recognised by vendor/device/class ids (moment.topology.pci_ids), then refined."""

from __future__ import annotations

import json

import pytest
from conftest import DATA

from moment.errors import MomentError
from moment.topology.model import Kind
from moment.topology.pci_ids import kind_from_ids
from moment.topology.readers import lspci, nvidia_smi
from moment.topology.readers.hwloc_xml import read_hwloc_xml
from moment.topology.readers.nccl_xml import read_nccl_xml
from moment.topology.readers.pci import PciFunction, classify

CONSTRUCTED = DATA / "constructed"


@pytest.mark.parametrize("vendor, device, cls, kind", [
    (0x10DE, 0x2330, 0x0302, Kind.gpu),    # H100 SXM, 3D controller
    (0x10DE, 0x06D1, 0x0300, Kind.gpu),    # Tesla C2050: VGA class, still a GPU
    (0x1002, 0x738C, 0x0380, Kind.gpu),    # MI100
    (0x1002, 0x74A1, 0x1200, Kind.gpu),    # MI300X: processing accelerator
    (0x8086, 0x56A0, 0x0300, Kind.gpu),    # Arc A770: Intel discrete
    (0x8086, 0x3E92, 0x0300, Kind.other),  # Intel UHD 630: integrated
    (0x1A03, 0x2000, 0x0300, Kind.other),  # ASPEED BMC
    (0x102B, 0x0534, 0x0300, Kind.other),  # Matrox G200eR
    (0x1002, 0x515E, 0x0300, Kind.other),  # ATI ES1000 server video
    (0x144D, 0xA808, 0x0108, Kind.ssd),    # NVMe by class, whatever the vendor
    (0x8086, 0x1D02, 0x0106, Kind.other),  # AHCI SATA: not an SSD by class
    (0x15B3, 0x1017, 0x0200, Kind.nic),
    (0x15B3, 0x101B, 0x0207, Kind.nic),    # InfiniBand
    (0x10DE, 0x1AF1, 0x0680, Kind.nvswitch),
    (0x8086, 0x6F02, 0x0604, Kind.switch),
    (0x10DE, 0x22BA, 0x0403, None),        # a GPU's HDMI audio: infrastructure
    (0x8086, 0xA123, 0x0C05, None),        # SMBus
    (0x10EE, 0x9038, 0x1180, None),        # signal processing
    (0x1DA3, 0x1020, 0x1200, Kind.other),  # Habana Gaudi: an accelerator, not a GPU vendor
])
def test_kind_from_ids(vendor, device, cls, kind):
    assert kind_from_ids(vendor, device, cls) == kind


def test_hwloc_gpus_without_cuda_os_device():
    topo = read_hwloc_xml(CONSTRUCTED / "hwloc_mixed_gpus.xml")
    gpus = {n.pci: n for n in topo.of_kind(Kind.gpu)}
    assert sorted(gpus) == ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]
    assert gpus["0000:02:00.0"].model == "Arcturus GL-XL [Instinct MI100]"  # OpenCL only
    assert (gpus["0000:03:00.0"].pci_ids, gpus["0000:03:00.0"].pci_class) == ("10de:06d1", "0x0300")  # no osdev
    others = {n.pci: n.pci_ids for n in topo.of_kind(Kind.other)}
    assert others == {"0000:00:02.0": "8086:3e92", "0000:06:00.0": "1a03:2000", "0000:07:00.0": "102b:0534"}
    assert all(topo.node(g.parent).kind == Kind.slot for g in gpus.values())


def _by_pci(topo):
    return {n.pci: n for n in topo.nodes if n.kind in (Kind.gpu, Kind.nic, Kind.ssd, Kind.other)}


def test_lspci_tree_every_endpoint_is_a_node():
    topo = lspci.read_lspci(CONSTRUCTED / "lspci-tv_unrecognised.txt")
    nodes = _by_pci(topo)
    assert nodes["0000:17:00.0"].kind == Kind.nic  # "Mellanox Technologies MT28841": a chip name, still a NIC
    assert nodes["0000:18:00.0"].kind == Kind.other  # an FPGA no rule names: kept, as `other`
    assert nodes["0000:19:00.0"].kind == Kind.nic and "2 functions" in nodes["0000:19:00.0"].label
    assert nodes["0000:1a:00.0"].kind == Kind.gpu  # Intel Arc: discrete
    assert nodes["0000:00:02.0"].kind == Kind.other  # Intel UHD 630: integrated graphics
    assert "0000:00:00.0" not in nodes and "0000:00:1f.4" not in nodes  # chipset registers, SMBus


def test_lspci_tree_ids_only():
    topo = lspci.read_lspci(CONSTRUCTED / "lspci-tvnn_unrecognised.txt")
    nodes = _by_pci(topo)
    assert {p: (n.kind, n.pci_ids) for p, n in nodes.items()} == {
        "0000:17:00.0": (Kind.nic, "15b3:101d"), "0000:18:00.0": (Kind.other, "10ee:903f"),
        "0000:1a:00.0": (Kind.gpu, "8086:56a0")}
    assert nodes["0000:18:00.0"].label == "PCI device [10ee:903f]"


@pytest.mark.parametrize("code, vendor, name, kind", [
    (0x0B40, 0x8086, "Xeon Phi coprocessor", Kind.other),  # co-processor: kept
    (0x1200, 0x1DA3, "Gaudi2 AI Training Accelerator", Kind.other),
    (0x1180, 0x8086, "Sunrise Point-LP Serial IO I2C Controller", None),
    (0x0300, 0x1002, "ES1000", Kind.other),
    (0x0403, 0x10DE, "AD102 High Definition Audio Controller", None),
    (0x0108, 0x144D, "", Kind.ssd),
])
def test_classify_with_class_code(code, vendor, name, kind):
    f = PciFunction(0, 0x17, 0, 0, name=name, class_code=code, vendor_id=vendor, parent=(0, 0, 3, 0))
    assert classify(f) == kind


def test_lspci_tree_pasted_indented_with_repeated_closing_line():
    pasted = lspci.read_lspci(CONSTRUCTED / "lspci-tv_pasted.txt")
    plain = lspci.read_lspci(CONSTRUCTED / "lspci-tv_unrecognised.txt")
    assert pasted.nodes == plain.nodes


def test_lspci_tree_pasted_ambiguous_is_refused_with_line_number():
    text = (CONSTRUCTED / "lspci-tv_pasted.txt").read_text().replace(
        "               +-1c.4", "                 +-1c.4")  # one line shifted by two columns
    with pytest.raises(MomentError, match=r"line 9: column 18: '\+-' continues no open list"):
        lspci.parse_tree(text, "pasted.txt")


def test_nvme_by_class_and_ids_in_scan_json(capsys):
    from moment.cli import main

    assert main(["scan", "--from-lspci-vvv", str(CONSTRUCTED / "lspci-vvvnn_nvme_by_class.txt"), "--json"]) == 0
    nodes = {n["pci"]: n for n in json.loads(capsys.readouterr().out)["nodes"] if n.get("pci_ids")}
    assert {p: (n["kind"], n["pci_ids"], n["pci_class"]) for p, n in nodes.items()} == {
        "0000:17:00.0": ("ssd", "144d:a80a", "0x0108"),  # NVMe by class; the name says only "Device"
        "0000:18:00.0": ("other", "1b4b:1120", "0x0106"),  # SATA class, though its name says NVMe
        "0000:00:17.0": ("other", "8086:a182", "0x0106"),
    }


def test_xml_nodes_carry_ids_and_class():
    xml = """<system version="1"><cpu numaid="0" vendor="GenuineIntel" familyid="6" modelid="85">
      <pci busid="0000:04:00.0" class="0x030000" vendor="0x10de" device="0x2684" link_speed="16 GT/s" link_width="16"/>
      <pci busid="0000:05:00.0" class="0x010802" vendor="0x144d" device="0xa80a" link_speed="16 GT/s" link_width="4"/>
    </cpu></system>"""
    topo = read_nccl_xml(xml)
    (gpu,) = topo.of_kind(Kind.gpu)  # NVIDIA VGA class with no <gpu> child: a GPU by its ids
    (ssd,) = topo.of_kind(Kind.ssd)
    assert (gpu.pci_ids, gpu.pci_class, ssd.pci_ids, ssd.pci_class) == ("10de:2684", "0x0300", "144d:a80a", "0x0108")


def test_nvidia_smi_pix_nics_stay_separate_nodes():
    warnings: list[str] = []
    m = nvidia_smi.read_nvidia_smi(CONSTRUCTED / "nvidia-smi-topo_pix_nics.txt")
    topo = nvidia_smi.topology_from_matrix(m, warnings=warnings)
    nics = topo.of_kind(Kind.nic)
    assert [n.label.split(";")[0] for n in nics] == ["NIC0 (mlx5_0)", "NIC1 (mlx5_1)", "NIC2 (mlx5_2)"]
    assert "PIX to NIC1" in nics[0].label and "PIX to NIC0" in nics[1].label and "PIX" not in nics[2].label
    assert any("NIC0, NIC1 are PIX to each other" in w for w in warnings)
