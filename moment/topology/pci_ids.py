"""What a PCI function is, decided from its vendor/device ids and class code, the way the PCI spec names it.

One table for every reader (lspci, sysfs, NCCL/RCCL XML, hwloc XML), so a device gets the same kind
whatever file it came from. Readers call `kind_from_ids` first and refine its answer with what only
they see (names, hwloc OS devices, NCCL `<gpu>`/`<nic>` children). The rules:

* **GPU**: display class (0x0300 VGA, 0x0302 3D, 0x0380 other display) or processing accelerator
  (0x1200) from a GPU vendor: NVIDIA 0x10de, AMD/ATI 0x1002, Intel 0x8086 only for its discrete
  parts (`INTEL_DISCRETE_GPUS`; Intel's integrated graphics is `other`). Known BMC/baseboard and
  virtual video (`BMC_VIDEO`: ASPEED 0x1a03, Matrox 0x102b G200 family, ATI ES1000/Rage XL, ...)
  is `other`. Display from any other vendor is `other`; an accelerator from another vendor is `other`.
* **SSD**: class 0x0108 (NVM Express). SATA (0x0106) is `other`; a reader may promote it only when
  its data shows an NVMe device under it (hwloc `nvme*` OS device).
* **NIC**: network classes 0x02xx (0x0200 Ethernet, 0x0207 InfiniBand, 0x0208 fabric, ...) and the
  old serial-bus InfiniBand class 0x0c06.
* **NVSwitch**: NVIDIA bridge-other (0x0680). **Switch port**: PCI-to-PCI bridge (0x0604).
* **other**: storage controllers (RAID 0x0104, SATA 0x0106, SAS 0x0107, Fibre Channel 0x0c04), and
  every class not listed as platform infrastructure.
* **dropped** (None): platform infrastructure that is no placement decision: host/ISA/other bridges
  (0x06xx), memory controllers (0x05), system peripherals (0x08: IOMMU, DMA, RAS), multimedia (0x04:
  a GPU's HDMI audio), USB/SMBus (0x0c03, 0x0c05), signal processing (0x11), encryption (0x10),
  non-essential instrumentation (0x13), input/serial/docking.

Class codes here are 16 bits: base class << 8 | subclass (prog-if dropped).
"""

from __future__ import annotations

from moment.topology.model import Kind

NVIDIA, AMD, INTEL, MELLANOX, AMAZON = 0x10DE, 0x1002, 0x8086, 0x15B3, 0x1D0F
AMD_CPU, ASPEED, MATROX, ASMEDIA = 0x1022, 0x1A03, 0x102B, 0x1B21

GPU_VENDORS = (NVIDIA, AMD, INTEL)

#: Baseboard-management, server onboard and hypervisor video: never a GPU. device None = every device.
BMC_VIDEO: dict[tuple[int, int | None], str] = {
    (ASPEED, None): "ASPEED BMC video",
    (MATROX, None): "Matrox (G200 family BMC video)",
    (AMD, 0x515E): "ATI ES1000 server video",
    (AMD, 0x5159): "ATI Radeon 7000/VE (RV100) server video",
    (AMD, 0x4752): "ATI Rage XL server video",
    (0x19A2, None): "Emulex/ServerEngines BMC video",
    (0x1234, 0x1111): "QEMU standard VGA",
    (0x1B36, 0x0100): "QXL virtual video",
    (0x15AD, 0x0405): "VMware SVGA",
    (0x1AF4, 0x1050): "virtio GPU (virtual display)",
    (0x1013, 0x00B8): "Cirrus Logic (emulated) video",
    (0x1414, 0x5353): "Hyper-V video",
}

#: Intel discrete graphics device-id ranges (inclusive): DG1/SG1, Arc/Flex (DG2), Max (Ponte Vecchio),
#: Battlemage. Everything else from Intel with a display class is integrated graphics.
INTEL_DISCRETE_GPUS: tuple[tuple[int, int], ...] = (
    (0x4905, 0x4909), (0x5690, 0x56C2), (0x0BD0, 0x0BDB), (0xE202, 0xE212),
)

DISPLAY = (0x0300, 0x0302, 0x0380)
ACCELERATOR = 0x1200
NVME = 0x0108
SATA = 0x0106
BRIDGE_PCI = 0x0604
BRIDGE_OTHER = 0x0680
STORAGE_OTHER = (0x0104, 0x0106, 0x0107, 0x0C04)
INFINIBAND_OLD = 0x0C06
#: Base classes (and exact 16-bit classes) that are platform infrastructure, dropped from the topology.
INFRA_BASES = (0x04, 0x05, 0x06, 0x08, 0x09, 0x0A, 0x10, 0x11, 0x13)
INFRA_CLASSES = (0x0C03, 0x0C05, 0x0C07, 0x0C08, 0x0C09, 0x0700, 0x0701, 0x0780)

CLASS_NAMES = {
    0x0100: "SCSI storage controller", 0x0104: "RAID controller", 0x0106: "SATA controller",
    0x0107: "SAS controller", 0x0108: "NVMe controller", 0x0200: "Ethernet controller",
    0x0207: "InfiniBand controller", 0x0208: "fabric controller", 0x0280: "network controller",
    0x0300: "VGA compatible controller", 0x0302: "3D controller", 0x0380: "display controller",
    0x0604: "PCI bridge", 0x0680: "bridge", 0x0C04: "Fibre Channel", 0x0C06: "InfiniBand (serial bus)",
    0x1200: "processing accelerator",
}


def bmc_video(vendor: int | None, device: int | None) -> str | None:
    """The name of a known BMC/baseboard/virtual video device, else None."""
    if vendor is None:
        return None
    return BMC_VIDEO.get((vendor, None)) or (BMC_VIDEO.get((vendor, device)) if device is not None else None)


def intel_discrete(device: int | None) -> bool:
    return device is not None and any(lo <= device <= hi for lo, hi in INTEL_DISCRETE_GPUS)


def gpu_by_ids(vendor: int | None, device: int | None) -> bool:
    """A display/accelerator function with these ids is a GPU (vendor unknown: not decided here)."""
    if vendor not in GPU_VENDORS or bmc_video(vendor, device):
        return False
    return vendor != INTEL or intel_discrete(device)


def kind_from_ids(vendor: int | None, device: int | None, cls: int | None) -> Kind | None:
    """Kind from ids and the 16-bit class; None = platform infrastructure (not a node).

    Bridges: 0x0604 is `Kind.switch` (the caller decides whether it is a switch or a port).
    `cls` None: only the ids can speak (a GPU vendor's known BMC video is `other`); returns
    `Kind.other` when nothing is known, so the caller falls back to names.
    """
    if cls is None:
        return Kind.other
    base = cls >> 8
    if cls == NVME:
        return Kind.ssd
    if cls in DISPLAY or cls == ACCELERATOR:
        return Kind.gpu if gpu_by_ids(vendor, device) else Kind.other
    if base == 0x02 or cls == INFINIBAND_OLD:
        return Kind.nic
    if cls == BRIDGE_PCI:
        return Kind.switch
    if cls == BRIDGE_OTHER and vendor == NVIDIA:
        return Kind.nvswitch
    if cls in STORAGE_OTHER:
        return Kind.other
    if base in INFRA_BASES or cls in INFRA_CLASSES or base == 0xFF:
        return None
    return Kind.other


def ids_text(vendor: int | None, device: int | None) -> str | None:
    """'10de:2330' for `scan --json`; None when the source gave no ids."""
    if vendor is None or device is None:
        return None
    return f"{vendor:04x}:{device:04x}"


def class_text(cls: int | None) -> str | None:
    """'0x0302' (16-bit class) for `scan --json`."""
    return None if cls is None else f"0x{cls:04x}"

