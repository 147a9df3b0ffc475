"""Issue 10: devices are recognised by vendor/device/class ids (moment.topology.pci_ids), then refined."""

from __future__ import annotations

import pytest
from conftest import DATA

from moment.topology.model import Kind
from moment.topology.pci_ids import kind_from_ids
from moment.topology.readers.hwloc_xml import read_hwloc_xml

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
