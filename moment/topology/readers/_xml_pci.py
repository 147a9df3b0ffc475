"""PCI facts shared by the XML readers: what a class code means, known device models, link rates.

Kept in one table so NCCL and hwloc files classify a device the same way, and so the choices
(which classes are GPUs, what width to assume when a file does not say) are written down once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moment.topology import bandwidth as bw
from moment.topology import pci_ids
from moment.topology.model import Kind
from moment.topology.pci_ids import AMAZON, AMD, INTEL, MELLANOX, NVIDIA  # noqa: F401

#: Lanes assumed when a file gives no usable width (noted in the node's label).
DEFAULT_WIDTH = {Kind.gpu: 16, Kind.nic: 16, Kind.ssd: 4, Kind.switch: 16, Kind.nvswitch: 4, Kind.other: 4}


def kind_of_class(cls: int, vendor: int | None, device: int | None = None) -> Kind:
    """Kind of a PCI function from its 24-bit class code (class, subclass, prog-if) and ids.

    The decision is `pci_ids.kind_from_ids` (GPU = display/accelerator class from a GPU vendor that
    is not BMC video, NVMe = 0108, NIC = 02xx/0c06, ...). Files that give a class without a vendor
    (NCCL writes class for GPUs) keep 3D/other-display/accelerator as GPUs. Infrastructure classes,
    which a file lists only on purpose, are `other`; hwloc drops them itself.
    """
    cls16 = cls >> 8
    if vendor is None and cls16 in (0x0302, 0x0380, pci_ids.ACCELERATOR):
        return Kind.gpu
    return pci_ids.kind_from_ids(vendor, device, cls16) or Kind.other


@dataclass(frozen=True)
class GpuInfo:
    model: str
    memory_gib: float
    hbm_gbps: float
    nvlink_gen: int | None = None


#: (vendor, device) -> model facts for accelerators seen in the fixtures and their siblings.
GPU_MODELS: dict[tuple[int, int], GpuInfo] = {
    (NVIDIA, 0x20B0): GpuInfo("A100-SXM4-40GB", 40, 1555, 3),
    (NVIDIA, 0x20B2): GpuInfo("A100-SXM4-80GB", 80, 2039, 3),
    (NVIDIA, 0x20B5): GpuInfo("A100-PCIe-80GB", 80, 1935, 3),
    (NVIDIA, 0x20F1): GpuInfo("A100-PCIe-40GB", 40, 1555, 3),
    (NVIDIA, 0x2330): GpuInfo("H100-SXM5-80GB", 80, 3350, 4),
    (NVIDIA, 0x2331): GpuInfo("H100-PCIe-80GB", 80, 2000, 4),
    (NVIDIA, 0x1DB1): GpuInfo("V100-SXM2-16GB", 16, 900, 2),
    (NVIDIA, 0x1DB5): GpuInfo("V100-SXM2-32GB", 32, 900, 2),
    (NVIDIA, 0x1DB8): GpuInfo("V100-SXM3-32GB", 32, 900, 2),
    (NVIDIA, 0x1DB4): GpuInfo("V100-PCIe-16GB", 16, 900, 2),
    (NVIDIA, 0x15F9): GpuInfo("P100-SXM2-16GB", 16, 732, 1),
    (NVIDIA, 0x06D2): GpuInfo("Tesla M2070", 6, 150),
    (NVIDIA, 0x1094): GpuInfo("Tesla M2075", 6, 150),
    (AMD, 0x74A1): GpuInfo("MI300X", 192, 5300),
    (AMD, 0x740C): GpuInfo("MI250X-GCD", 64, 1638),
    (AMD, 0x66A1): GpuInfo("MI50/MI60", 32, 1024),
}

NIC_MODELS: dict[tuple[int, int], str] = {
    (MELLANOX, 0x101B): "ConnectX-6",
    (MELLANOX, 0x101D): "ConnectX-6 Dx",
    (MELLANOX, 0x1021): "ConnectX-7",
    (MELLANOX, 0x1013): "ConnectX-4",
    (MELLANOX, 0x1003): "ConnectX-3",
    (MELLANOX, 0x6746): "ConnectX-2",
    (AMAZON, 0xEFA0): "EFA",
}

SWITCH_MODELS: dict[tuple[int, int], str] = {
    (0x1000, 0xC010): "Broadcom PEX88096",
    (0x1000, 0xC030): "Broadcom PEX89xxx",
    (0x10B5, 0x9781): "PLX PEX9781",
    (0x10B5, 0x9797): "PLX PEX9797",
    (0x10B5, 0x8725): "PLX PEX8725",
    (0x10B5, 0x8747): "PLX PEX8747",
    (0x10B5, 0x8796): "PLX PEX8796",
    (0x1022, 0x1500): "AMD bridge 1022:1500",
    (0x1022, 0x14C7): "AMD bridge 1022:14c7",
    (MELLANOX, 0x1979): "Mellanox bridge 15b3:1979",
}

#: Vendor ids that mark a bridge invented by a hypervisor or written by hand.
VIRTUAL_VENDORS = (0x0000, 0xFFFF)


def model_name(table: dict, vendor: int | None, device: int | None, kind: str) -> str | None:
    """A known model name, else 'vvvv:dddd' when the ids are given, else None."""
    if vendor is None or device is None:
        return None
    if vendor in VIRTUAL_VENDORS and kind == "switch":
        return "virtual switch"
    known = table.get((vendor, device))
    if known is None:
        return f"{vendor:04x}:{device:04x}"
    return known if isinstance(known, str) else known[0] if isinstance(known, tuple) else known.model


#: (vendor, device) -> (model, sequential read GB/s, capacity GB).
SSD_MODELS: dict[tuple[int, int], tuple[str, float, float]] = {
    (INTEL, 0x0953): ("Intel 750/P3700 NVMe", 2.5, 1200),
}

#: CUDA compute capability major -> NVLink generation (P100 1, V100 2, A100 3, H100 4, B200 5).
NVLINK_GEN_BY_SM = {6: 1, 7: 2, 8: 3, 9: 4, 10: 5}


def nvlink_gen_from_sm(sm: int | None) -> int | None:
    if sm is None:
        return None
    return NVLINK_GEN_BY_SM.get(sm // 10)


def nvlink_gen_from_name(name: str | None) -> int | None:
    """P100 -> 1, V100 -> 2, A100 -> 3, H100/H200 -> 4, B100/B200 -> 5 (from a GPU model string)."""
    if not name:
        return None
    m = re.search(r"\b([PVAHB])1\d0", name.upper())
    return {"P": 1, "V": 2, "A": 3, "H": 4, "B": 5}[m.group(1)] if m else None


# ---- link rates ------------------------------------------------------------------------------------
_GTS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", re.IGNORECASE)


def gen_from_speed_text(text: str | None) -> int | None:
    """PCIe gen from NCCL's link_speed ('16 GT/s', '16.0 GT/s PCIe', '32 GT/s PCIe/s').

    Empty or 'Unknown' means the file does not know (virtual machines); anything else that is not
    a PCIe lane rate raises ValueError for the caller to report with its line.
    """
    if text is None or text.strip() == "" or text.strip().lower().startswith("unknown"):
        return None
    m = _GTS.match(text)
    if not m:
        raise ValueError(f"link_speed {text!r} is not a rate in GT/s")
    return bw.pcie_gen_from_gts(float(m.group(1)))


def gts_text(gen: int) -> str:
    """The link_speed string NCCL's own table knows for a generation ('16 GT/s'; Gen6 only has the
    newer kernel form)."""
    if gen >= 6:
        return f"{bw.PCIE_GENERATIONS[gen][0]:.1f} GT/s PCIe"
    return f"{bw.PCIE_GENERATIONS[gen][0]:g} GT/s"


def gen_width_from_gbs(gbs: float, *, prefer_gen: int | None,
                       prefer_width: int) -> tuple[int, int, list[tuple[int, int]]] | None:
    """(gen, width) whose raw rate (lanes x GT/s x encoding / 8) is hwloc's `pci_link_speed` GB/s.

    Several pairs can give the same figure (1.0 GB/s is Gen1 x4 or Gen2 x2); ties go to the
    parent's generation, then to the usual width for the device, then to the newest generation.
    Returns (gen, width, the other matching pairs); None when the figure is 0 (hwloc did not know)
    or matches no pair.
    """
    if not gbs > 0:
        return None
    matches = []
    for gen, (gts, enc) in bw.PCIE_GENERATIONS.items():
        for width in bw.PCIE_WIDTHS:
            if abs(width * gts * enc / 8 - gbs) <= 0.01 * gbs:
                matches.append((gen, width))
    if not matches:
        return None
    best = min(matches, key=lambda gw: (gw[0] != prefer_gen, gw[1] != prefer_width, -gw[0]))
    return best[0], best[1], [m for m in matches if m != best]
