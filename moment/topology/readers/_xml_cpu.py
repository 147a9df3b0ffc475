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
#: Intel family 6 single-socket Xeons (E-2100/E-2200, E-2300): name, PCIe gen of the CPU's own lanes.
_INTEL_ONE_SOCKET = {158: ("Coffee Lake (Xeon E-2100/E-2200)", 3), 167: ("Rocket Lake (Xeon E-2300)", 4)}
#: PCIe lanes of one Intel CPU package, by family 6 model (Westmere-EP has none: its PCIe is on the IOH chip).
_INTEL_LANES = {45: 40, 62: 40, 63: 40, 79: 40, 85: 48, 106: 64, 143: 80, 207: 80, 173: 96, 158: 16, 167: 20}
#: PCIe lanes of one EPYC package (a two-socket board gives 48-64 of them to the socket links: the most a socket has)
_EPYC_LANES = 128
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
    if re.search(r"\bE-23\d\d", n):
        return 167
    if re.search(r"\bE-2[12]\d\d", n):
        return 158
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


# ---- NUMA domains -> sockets --------------------------------------------------------------------------
#: Intel family 6 models: most hardware threads one socket can have (Cascade Lake-AP 9200: 56 cores).
_INTEL_MAX_THREADS = {44: 12, 45: 16, 62: 30, 63: 36, 79: 48, 85: 112, 106: 80, 143: 120, 207: 128, 173: 256}
#: Intel models sold for two sockets at most (the others scale to 4 or 8).
_INTEL_TWO_SOCKET = (44, 106, 207)


def _amd_max_threads(cpu: CpuId) -> int | None:
    if cpu.family == 23:
        return 64 if (cpu.model or 0) < 0x30 else 128  # Naples 32 cores, Rome 64
    if cpu.family == 25:
        return 128 if (cpu.model or 0) < 0x10 else 256  # Milan 64 cores; Genoa 96, Bergamo 128
    if cpu.family == 26:
        return 384  # Turin dense: 192 cores
    return None


@dataclass(frozen=True)
class SocketLimits:
    """What one CPU line allows: sockets per machine, NUMA domains per socket, threads per socket."""

    what: str
    max_sockets: int
    domains_per_socket: tuple[int, ...]
    max_threads: int | None


def socket_limits(cpu: CpuId) -> SocketLimits | None:
    """Limits of the CPU line, or None when the file does not identify it well enough.

    AMD EPYC: 1 or 2 sockets; NPS1/2/4, or one domain per L3 cache (8-16). Intel Xeon: SNC/COD split a
    socket in 2, 3 or 4 (Cascade Lake-AP is two dies in one package).
    """
    if cpu.vendor == "AuthenticAMD" and cpu.family in (23, 25, 26):
        return SocketLimits(describe(CpuId(cpu.vendor, cpu.family, cpu.model)) or "AMD EPYC", 2,
                            (1, 2, 4, 8, 12, 16), _amd_max_threads(cpu))
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model is not None:
        return SocketLimits(describe(CpuId(cpu.vendor, cpu.family, cpu.model)) or f"Intel model {cpu.model}",
                            2 if cpu.model in _INTEL_TWO_SOCKET else 8, (1, 2, 3, 4),
                            _INTEL_MAX_THREADS.get(cpu.model))
    return None


def affinity_cpus(mask: str | None) -> frozenset[int] | None:
    """Logical CPUs of an NCCL `affinity` mask (comma-separated 32-bit hex words, most significant
    first); None when absent or not hex (NCCL does not check it either)."""
    if not mask or not mask.strip():
        return None
    value = 0
    for word in mask.strip().split(","):
        w = word.strip()
        if not w or len(w) > 8 or any(c not in "0123456789abcdefABCDEF" for c in w):
            return None
        value = (value << 32) | int(w, 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


@dataclass(frozen=True)
class Grouping:
    """NUMA domains grouped into socket nodes, whether the grouping is certain, and the note saying why."""

    sockets: tuple[tuple[int, ...], ...]
    certain: bool
    note: str | None


def _ids(xs) -> str:
    return ", ".join(str(x) for x in xs)


def _fits(numas: list[int], cpus: dict[int, frozenset[int] | None], lim: SocketLimits) -> list[int]:
    """Domains-per-socket counts P the file allows. Linux numbers NUMA nodes socket by socket, so node n
    is on socket n // P; NPS and SNC split a socket into equal domains, so no listed domain may hold more
    than 1/P of a socket's threads, and the machine needs enough sockets for every node and thread."""
    sizes = [len(c) for c in cpus.values() if c is not None]
    total = len(frozenset().union(*[c for c in cpus.values() if c is not None])) if sizes else 0
    out = []
    for p in lim.domains_per_socket:
        if max(numas) // p + 1 > lim.max_sockets:
            continue
        if lim.max_threads is not None and sizes and (
                max(sizes) * p > lim.max_threads or total > lim.max_sockets * lim.max_threads):
            continue
        out.append(p)
    return out


def group_numa_domains(domains: dict[int, tuple[CpuId, frozenset[int] | None]]) -> Grouping:
    """Which NUMA domains (numaid -> CPU identity, logical CPUs) share a socket, as far as the file tells.

    Every split of sockets into NUMA domains the CPU line allows (`socket_limits`) and the domains' CPU
    counts fit is tried; domains that share a socket in every fitting split become one socket node.
    The grouping is certain when all fits group the domains alike; otherwise the note says so, and
    domains that only might share a socket stay apart (never merged on a guess).
    """
    numas = sorted(domains)
    if len(numas) == 1:
        return Grouping(((numas[0],),), True, None)
    idents = {(c.vendor, c.family, c.model) for c, _ in domains.values()}
    lim = socket_limits(next(iter(domains.values()))[0]) if len(idents) == 1 else None
    alone = tuple((n,) for n in numas)
    if lim is None:
        why = "does not identify the CPU" if len(idents) == 1 else "names different CPUs for them"
        return Grouping(alone, False, f"The file {why}, so which of NUMA domains {_ids(numas)} share a CPU "
                        "socket is not known; each is modelled as its own socket.")
    cpus = {n: domains[n][1] for n in numas}
    fits = _fits(numas, cpus, lim)
    splits = ", ".join(str(p) for p in lim.domains_per_socket)
    limits = (f"{lim.what}: up to {lim.max_sockets} sockets of {splits} equal NUMA domains"
              + (f" and {lim.max_threads} threads" if lim.max_threads else ""))
    if not fits:
        return Grouping(alone, False, f"NUMA domains {_ids(numas)} fit no split of sockets the CPU allows "
                        f"({limits}), so which share a socket is not known; each is modelled as its own socket.")
    parts = {tuple(tuple(n for n in numas if n // p == k) for k in sorted({n // p for n in numas})) for p in fits}
    sockets = []  # domains that share a socket in every fit; parts refine each other in order of p
    for n in numas:
        home = next((g for g in sockets if all(any(n in grp and g[0] in grp for grp in part) for part in parts)),
                    None)
        if home is None:
            sockets.append([n])
        else:
            home.append(n)
    shown = "; ".join(f"cpu{i}: {_ids(g)}" for i, g in enumerate(sockets))
    fit_text = " or ".join(str(p) for p in fits)
    if len(parts) == 1:
        return Grouping(tuple(map(tuple, sockets)), True,
                        f"NUMA domains {_ids(numas)} fit only {fit_text} domain(s) a socket ({limits}; checked "
                        f"against the CPUs of each domain), so the sockets are {shown}.")
    return Grouping(tuple(map(tuple, sockets)), False,
                    f"Which NUMA domains share a CPU socket is not in the file: domains {_ids(numas)} fit "
                    f"{fit_text} domains a socket ({limits}), which group them differently (the BIOS's "
                    f"NUMA-per-socket setting decides). Only domains that share a socket in every fit are put "
                    f"together ({shown}); the others are kept apart as separate socket nodes.")


#: "AMD EPYC 7302 16-Core Processor", "AMD EPYC 9374F": the model number's last digit is the generation (7xx1
#: Naples ... 9xx5 Turin), a letter may follow (F: frequency-optimised, P: one socket, X: 3D V-Cache)
_EPYC_NAME = re.compile(r"\bEPYC\s+\d{3}([1-5])[A-Z]{0,2}\b", re.IGNORECASE)


def from_socket_model(model: str | None) -> CpuId:
    """The identity a socket's `model` names: the raw identity `describe` keeps in its parenthesis, else what
    the model string tells (a profile's 'Xeon Gold 5320', a scan's CPUModel)."""
    ident = identity_from_model(model)
    if ident is None:
        return from_model_string(model)
    vendor, family, number = ident
    real = normalise_amd_family(family) if vendor == "AuthenticAMD" else family
    return CpuId(vendor, real, number, family, model)


def pcie_gen(cpu: CpuId) -> int | None:
    """The PCIe generation of the CPU's root ports, None when the identity does not tell."""
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in _INTEL:
        return _INTEL[cpu.model][1]
    if cpu.vendor == "GenuineIntel" and cpu.family == 6 and cpu.model in _INTEL_ONE_SOCKET:
        return _INTEL_ONE_SOCKET[cpu.model][1]
    if cpu.vendor == "AuthenticAMD" and _amd(cpu):
        return _amd(cpu)[1]
    if cpu.vendor == "AuthenticAMD" and cpu.family is None and (m := _EPYC_NAME.search(cpu.name or "")):
        return _AMD[int(m.group(1)) - 1][2]
    if cpu.vendor == "IBM" and cpu.name and "POWER9" in cpu.name.upper():
        return 4
    return None


def pcie_lanes(cpu: CpuId) -> int | None:
    """The PCIe lanes one package of this CPU has, None when the identity does not tell."""
    if cpu.vendor == "GenuineIntel" and cpu.family == 6:
        return _INTEL_LANES.get(cpu.model)
    if cpu.vendor == "AuthenticAMD" and (_amd(cpu) or (cpu.family is None and _EPYC_NAME.search(cpu.name or ""))):
        return _EPYC_LANES
    return None


def default_pcie_gen(cpu: CpuId) -> int:
    """The PCIe generation of the CPU's root ports, 3 when unknown (the most common in the fixtures)."""
    return pcie_gen(cpu) or 3


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
