"""What a CPU's identity implies when a file is silent: its name, PCIe generation and socket link.

NCCL writes `vendor`, `familyid`, `modelid` (AMD family as base + (extended << 4), so Zen 2 is 143,
Zen 3 is 175); hwloc writes CPUVendor/CPUFamilyNumber/CPUModelNumber or just a model string. The
socket-link defaults below are the usual two-socket configurations; each link built from them says
"assumed" in its label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moment.topology import bandwidth as bw


@dataclass(frozen=True)
class CpuId:
    vendor: str | None = None  # "GenuineIntel", "AuthenticAMD", "IBM", ...
    family: int | None = None  # real family number (AMD normalised: 23 = Zen/Zen 2, 25 = Zen 3/4)
    model: int | None = None
    raw_family: int | None = None  # as the file wrote it (NCCL's combined form), for export
    name: str | None = None  # a model string when the file has one


@dataclass(frozen=True)
class SocketLinkSpec:
    kind: str  # upi | qpi | xgmi
    count: int
    gts: float | None
    label: str


#: Intel family 6 server models: (name, PCIe gen, socket link kind, links, GT/s).
_INTEL = {
    44: ("Westmere-EP", 2, "qpi", 2, 6.4),
    45: ("Sandy Bridge-EP", 3, "qpi", 2, 8.0),
    62: ("Ivy Bridge-EP", 3, "qpi", 2, 8.0),
    63: ("Haswell-EP", 3, "qpi", 2, 9.6),
    79: ("Broadwell-EP", 3, "qpi", 2, 9.6),
    85: ("Skylake-SP/Cascade Lake", 3, "upi", 2, 10.4),
    106: ("Ice Lake-SP", 4, "upi", 3, 11.2),
    143: ("Sapphire Rapids", 5, "upi", 4, 16.0),
    207: ("Emerald Rapids", 5, "upi", 4, 20.0),
    173: ("Granite Rapids", 5, "upi", 6, 24.0),
}
#: AMD (family, lowest model of the line): name, PCIe gen. Two-socket EPYC uses 4 xGMI links.
_AMD = [
    ((23, 0x00), "EPYC Naples (Zen)", 3),
    ((23, 0x30), "EPYC Rome (Zen 2)", 4),
    ((25, 0x00), "EPYC Milan (Zen 3)", 4),
    ((25, 0x10), "EPYC Genoa (Zen 4)", 5),
    ((26, 0x00), "EPYC Turin (Zen 5)", 5),
]


def normalise_amd_family(raw: int) -> int:
    """NCCL's familyid for AMD is base + (ext << 4); the real family is base + ext."""
    return (raw & 0xF) + (raw >> 4) if raw > 0x1F else raw


def _amd(cpu: CpuId) -> tuple[str, int] | None:
    best = None
    for (fam, lo), name, gen in _AMD:
        if cpu.family == fam and (cpu.model or 0) >= lo:
            best = (name, gen)
    return best


def describe(cpu: CpuId) -> str | None:
    """A readable model name that keeps the raw identity, e.g. 'Intel Ice Lake-SP (GenuineIntel familyid 6
    modelid 106)'; the NCCL writer reads the parenthesis back."""
    ident = ""
    if cpu.vendor and cpu.raw_family is not None and cpu.model is not None:
        ident = f" ({cpu.vendor} familyid {cpu.raw_family} modelid {cpu.model})"
    if cpu.name:
        return cpu.name + ident
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in _INTEL:
        return f"Intel {_INTEL[cpu.model][0]}" + ident
    if cpu.vendor == "AuthenticAMD" and _amd(cpu):
        return f"AMD {_amd(cpu)[0]}" + ident
    return (cpu.vendor or "CPU") + ident if ident or cpu.vendor else None


_IDENT = re.compile(r"\((\w+) familyid (\d+) modelid (\d+)\)")


def identity_from_model(model: str | None) -> tuple[str, int, int] | None:
    """(vendor, familyid, modelid) written by `describe`, for NCCL export."""
    m = _IDENT.search(model or "")
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def _intel_from_name(name: str) -> int | None:
    """A family-6 model number guessed from a Xeon model string (hwloc files without CPUModelNumber)."""
    n = name.upper()
    if re.search(r"E5-\d{4} V4|E7-\d{4} V4", n):
        return 79
    if re.search(r"E5-\d{4} V3|E7-\d{4} V3", n):
        return 63
    if re.search(r"E5-\d{4} V2|E7-\d{4} V2", n):
        return 62
    if re.search(r"E5-\d{4}", n):
        return 45
    if re.search(r"\b[XEWL]56\d\d\b", n):
        return 44
    if re.search(r"(PLATINUM|GOLD|SILVER|BRONZE) \d[1-2]\d\d", n):
        return 85
    if re.search(r"(PLATINUM|GOLD|SILVER) \d3\d\d", n):
        return 106
    if re.search(r"(PLATINUM|GOLD|SILVER) \d4\d\d", n):
        return 143
    if re.search(r"(PLATINUM|GOLD|SILVER) \d5\d\d", n):
        return 207
    return None


def from_model_string(name: str | None) -> CpuId:
    """Best-effort identity from hwloc's CPUModel string."""
    if not name:
        return CpuId()
    if "INTEL" in name.upper() or "XEON" in name.upper():
        model = _intel_from_name(name)
        return CpuId("GenuineIntel", 6 if model else None, model, None, name)  # guessed: not exported
    if "AMD" in name.upper() or "EPYC" in name.upper():
        return CpuId("AuthenticAMD", name=name)
    if "POWER" in name.upper():
        return CpuId("IBM", name=name)
    return CpuId(name=name)


def default_pcie_gen(cpu: CpuId) -> int:
    """The PCIe generation of the CPU's root ports, 3 when unknown (the most common in the fixtures)."""
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in _INTEL:
        return _INTEL[cpu.model][1]
    if cpu.vendor == "AuthenticAMD" and _amd(cpu):
        return _amd(cpu)[1]
    if cpu.vendor == "IBM" and cpu.name and "POWER9" in cpu.name.upper():
        return 4
    return 3


def socket_link(cpu: CpuId) -> SocketLinkSpec:
    """The inter-socket link (kind, count, rate) assumed for this CPU."""
    if cpu.vendor == "AuthenticAMD":
        return SocketLinkSpec("xgmi", 4, None, "xGMI x4 (assumed: two-socket EPYC default)")
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in _INTEL:
        name, _, kind, count, gts = _INTEL[cpu.model]
        if cpu.model == 85 and cpu.name and "PLATINUM" in cpu.name.upper():
            name, count = "Xeon Platinum (Skylake-SP/Cascade Lake)", 3
        return SocketLinkSpec(kind, count, gts, f"{kind.upper()} {count}x {gts:g} GT/s (assumed: {name} default)")
    if cpu.vendor == "GenuineIntel":
        return SocketLinkSpec("upi", 2, bw.DEFAULT_UPI_GTS, "UPI 2x (assumed: Intel model not known)")
    if cpu.vendor == "IBM":
        return SocketLinkSpec("upi", 2, bw.DEFAULT_UPI_GTS, "IBM X-bus, modelled as UPI 2x (assumed)")
    return SocketLinkSpec("upi", 2, bw.DEFAULT_UPI_GTS, "socket link of unknown kind, modelled as UPI 2x (assumed)")
