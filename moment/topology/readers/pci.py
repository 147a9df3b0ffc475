"""PCI functions -> `Topology`: the tree rules behind the lspci, lspci -vvv and sysfs readers.

Each reader only turns its input into `PciFunction` records (address, class, names, bridge bus
numbers, link capability/status, NUMA node); this module decides what the planner sees, so all
sources agree, and hands a draft tree to the one builder every reader shares (`readers.build`),
which names the nodes (`cpuN`, `rcN`, `swN`/`gpuN`/... in bus order, slots `<parent>-slot<k>`) the
same way for hwloc and NCCL XML. The rules, in order:

* **Root complexes.** Every root bus (a bus no bridge leads to) is one `root_complex` (`rc0`, `rc1`,
  ... in socket order, then domain:bus order; `numa` = its NUMA node when one is known); a root bus
  with nothing kept below it is left out.
* **Sockets.** A NUMA node is a socket (`cpu0`, `cpu1`, ... in NUMA node order; `numa` keeps the id),
  unless a socket count (dmidecode) says there are fewer sockets than NUMA nodes: then the nodes are
  grouped as Linux numbers them when every node is known, and a warning says so either way (each
  root complex keeps its own NUMA node in `numa`). A root bus takes the NUMA node most of its
  functions report. Root buses with none: if splitting all root buses evenly, in bus order, over the
  NUMA nodes seen agrees with every root bus whose node is known, that split is used (sockets own
  contiguous bus ranges on x86); otherwise such a bus takes the node of the nearest known root bus
  before it, else after it. Without any NUMA information, `sockets=N` splits the
  root buses, in bus order, into N contiguous groups; with neither, everything hangs under one socket
  and a warning says so. Sockets are joined by an assumed socket link (AMD host bridges: xGMI x4;
  otherwise UPI x2), labelled "assumed".
* **Switches.** A bridge below a port that itself has bridges below it is a PCIe switch upstream
  port: one `switch` node (`swN`), whose downstream ports are walked like root ports. A bridge with
  only endpoints below it (a PCIe-to-PCI bridge such as a BMC's) is transparent.
* **Slots.** A root or downstream port whose bus holds exactly one card (functions sharing a device
  number) that is a GPU, SSD or NIC becomes a `slot` (`pci` = the port) holding that device,
  so the planner can move it. A port with nothing below it becomes an empty slot unless `lspci -vvv`
  says it implements no slot (`Slot-`): lspci cannot tell an empty slot from an unwired port, so
  review empty slots (dmidecode names real ones). Endpoints on a root bus (integrated devices, VM
  pass-through) and several cards on one bus hang directly under their parent, not in slots.
* **Devices.** Ids and class first (`moment.topology.pci_ids`): GPU = display or accelerator class
  from NVIDIA/AMD/an Intel discrete part, not BMC video (ASPEED/Matrox/ES1000 are `other`); SSD =
  class 0108 (NVMe); NIC = 02xx; NVSwitch = NVIDIA 0680; storage controllers and unknown classes are
  `other`; platform infrastructure (bridges, system peripherals, USB, SMBus, audio, signal processing)
  is dropped. Names refine (a GPU vendor's audio/USB function is not a GPU). Without a class
  (`lspci -tv`) the name decides by the same rules (a Mellanox chip name such as MT28841 is a NIC),
  and an endpoint no rule names is `other` unless its name or vendor (AMD CPU, Intel, ASMedia) says
  chipset. A GPU's model comes from its name (the device catalogue), else from its ids (the XML
  readers' table, `_xml_pci.GPU_MODELS`: sysfs gives ids only). Nodes carry `pci_ids`/`pci_class` when the source gave them. Ids `gpuN`/`ssdN`/`nicN`
  follow bus order.
* **Links.** A node's uplink gen is the lowest link-capability speed of the two ends (an idle GPU
  reports 2.5 GT/s in LnkSta, so the status speed would mislead), its width the negotiated width
  (LnkSta) of the device, else the capability width. A slot's link is its port's capability; where
  the port's figures are missing, what the card in it trained at (LnkSta) is a lower bound.
  Missing figures default to PCIe 4.0 and x16 (x4 for NVMe), counted in one warning. The link label
  is `bus DDDD:BB`, the bus the node sits on, which `dmidecode.merge_slots` matches slot addresses to.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from moment.errors import MomentError
from moment.topology import bandwidth as bw
from moment.topology import pci_ids
from moment.topology.devices import CATALOG
from moment.topology.model import PLACEABLE, Kind, Link, Topology
from moment.topology.readers._xml_cpu import SocketLinkSpec
from moment.topology.readers._xml_pci import GPU_MODELS
from moment.topology.readers.build import DraftDev, DraftRc, DraftSlot, DraftSocket, assemble

DEFAULT_GEN = 4
DEFAULT_WIDTH = {Kind.gpu: 16, Kind.nic: 16, Kind.ssd: 4, Kind.switch: 16, Kind.slot: 16}

Key = tuple[int, int, int, int]  # domain, bus, device, function

#: lspci class names -> class code (class << 8 | subclass), for `lspci -vvv` without `-nn`.
CLASS_NAMES: dict[str, int] = {
    "non-volatile memory controller": 0x0108, "raid bus controller": 0x0104, "sata controller": 0x0106,
    "serial attached scsi controller": 0x0107, "vga compatible controller": 0x0300, "3d controller": 0x0302,
    "display controller": 0x0380, "processing accelerators": 0x1200, "ethernet controller": 0x0200,
    "infiniband controller": 0x0207, "network controller": 0x0280, "fabric controller": 0x0208,
    "pci bridge": 0x0604, "host bridge": 0x0600, "bridge": 0x0680, "fibre channel": 0x0c04,
}

_VENDOR_NAMES = {
    "nvidia": 0x10DE, "[amd/ati]": 0x1002, "ati technologies": 0x1002, "advanced micro devices": 0x1022,
    "asmedia": 0x1B21, "aspeed": 0x1A03, "matrox": 0x102B, "mellanox": 0x15B3, "intel corporation": 0x8086,
}
_GPU_VENDORS = (0x10DE, 0x1002)
_NOT_A_GPU = re.compile(r"audio|usb|ucsi|serial|bridge|nvswitch|es1000|rage|hdmi", re.IGNORECASE)


@dataclass
class PciFunction:
    """One PCI function as a reader saw it; fields a source does not give stay None."""

    domain: int
    bus: int
    dev: int
    fn: int
    name: str = ""
    class_code: int | None = None
    class_name: str | None = None
    vendor_id: int | None = None
    device_id: int | None = None
    is_bridge: bool = False
    secondary: int | None = None
    subordinate: int | None = None
    parent: Key | None = None
    parent_known: bool = False  # the source gave the parent (tree, sysfs path), not bus numbers
    cap_gts: float | None = None
    cap_width: int | None = None
    sta_gts: float | None = None
    sta_width: int | None = None
    numa: int | None = None
    physical_slot: str | None = None
    slot_capable: bool | None = None
    port_type: str | None = None
    source_line: int | None = None

    @property
    def key(self) -> Key:
        return (self.domain, self.bus, self.dev, self.fn)

    @property
    def bdf(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.dev:02x}.{self.fn:x}"

    def code(self) -> int | None:
        if self.class_code is not None:
            return self.class_code
        if self.class_name:
            return CLASS_NAMES.get(self.class_name.strip().lower())
        return None

    def vendor(self) -> int | None:
        if self.vendor_id is not None:
            return self.vendor_id
        low = self.name.lower()
        for word, vid in _VENDOR_NAMES.items():
            if word in low:
                return vid
        return None

    def display_name(self) -> str:
        if self.name:
            return self.name
        if self.vendor_id is not None and self.device_id is not None:
            return f"PCI device [{self.vendor_id:04x}:{self.device_id:04x}]"
        return ""

    def merge(self, other: PciFunction) -> None:
        """Fill this record's unknown fields from another source's record of the same function."""
        for f in ("class_code", "class_name", "vendor_id", "device_id", "secondary", "subordinate",
                  "cap_gts", "cap_width", "sta_gts", "sta_width", "numa", "physical_slot", "slot_capable",
                  "port_type"):
            if getattr(self, f) is None and getattr(other, f) is not None:
                setattr(self, f, getattr(other, f))
        if not self.name and other.name:
            self.name = other.name
        self.is_bridge = self.is_bridge or other.is_bridge


def key_str(key: Key) -> str:
    return f"{key[0]:04x}:{key[1]:02x}:{key[2]:02x}.{key[3]:x}"


# ---- classification ----------------------------------------------------------------------------------
def classify(f: PciFunction) -> Kind | None:
    """What the planner should call this endpoint function; None = not worth a node.

    Ids and class first (`pci_ids.kind_from_ids`), refined by the name (a GPU vendor's audio, USB or
    BMC video function is not a GPU). Without a class (`lspci -tv`) the name decides; an endpoint
    the name does not place is `other` unless it is platform infrastructure (see `_classify_by_name`).
    """
    if "virtual function" in f.name.lower():
        return None  # SR-IOV VFs belong to their physical function's card
    code, vendor = f.code(), f.vendor()
    if code is not None:
        kind = pci_ids.kind_from_ids(vendor, f.device_id, code)
        if kind == Kind.switch:
            return None  # a bridge class on a function with no bus below it
        if kind == Kind.gpu and _NOT_A_GPU.search(f.name):
            return Kind.other
        return kind
    return _classify_by_name(f.name, vendor, f.device_id, behind_port=f.parent is not None)


#: Names of platform infrastructure: chipset and CPU-internal functions, a GPU card's audio/USB functions.
_INFRA = re.compile(
    r"audio|\busb\b|usb ?[234]|xhci|ehci|ohci|smbus|\blpc\b|\bisa\b|host bridge|pci bridge|dummy|iommu|"
    r"\bpsp\b|\bccp\b|crypt|\bdma\b|ptdma|\bi2c\b|serial io|\buart\b|serial (port|controller)|thermal|"
    r"watchdog|performance counter|registers|\bsram\b|management engine|\bheci\b|\bmei\b|sdxi|\bras\b|"
    r"power management|\bspi\b|gpio|reserved spp|data fabric|root complex|root port|\bntb\b|"
    r"non-transparent|communication controller|signal processing|system peripheral|\bpmc\b|\bucsi\b|"
    r"memory balloon|\brng\b|virtio (1\.0 )?(socket|console)",
    re.IGNORECASE)
#: CPU and chipset vendors: an endpoint of theirs that no rule names is a platform function.
_PLATFORM_VENDORS = (pci_ids.AMD_CPU, pci_ids.INTEL, pci_ids.ASMEDIA)
#: Mellanox/NVIDIA networking chip names (MT27800 ConnectX-5, MT28841, MT2910 ConnectX-7, ...).
_MELLANOX_CHIP = re.compile(r"\bMT2[5-9]\d{2,3}\b")


def _classify_by_name(name: str, vendor: int | None, device: int | None = None, *,
                      behind_port: bool = True) -> Kind | None:
    low = name.lower()
    if "raid" in low or re.search(r"\bsata\b|\bsas\b|serial attached|fibre channel|\bahci\b", low):
        return Kind.other
    if re.search(r"nvme|non-volatile|\bssd\b", low):
        return Kind.ssd
    if "nvswitch" in low and vendor == pci_ids.NVIDIA:
        return Kind.nvswitch
    if re.search(r"ethernet|connectx|infiniband|network|omni-path|elastic fabric|bluefield|\bnic\b", low):
        return Kind.nic
    if _INFRA.search(low) or (vendor == pci_ids.NVIDIA and _NOT_A_GPU.search(low)):
        return None
    if vendor == pci_ids.MELLANOX or _MELLANOX_CHIP.search(name):
        return Kind.nic
    if vendor in pci_ids.GPU_VENDORS and vendor is not None and not _NOT_A_GPU.search(low):
        if vendor == pci_ids.INTEL:
            if pci_ids.intel_discrete(device) or re.search(r"\barc\b|data center gpu|dg[12]\b", low):
                return Kind.gpu
        elif vendor == pci_ids.NVIDIA or "[amd/ati]" in low or "radeon" in low or "instinct" in low:
            if not pci_ids.bmc_video(vendor, device):
                return Kind.gpu
    if re.search(r"aspeed|matrox|graphics|\bvga\b", low):
        return Kind.other
    if vendor in _PLATFORM_VENDORS or (vendor in pci_ids.GPU_VENDORS and _NOT_A_GPU.search(low)):
        return None
    if not name.strip() and not behind_port:
        return None  # `lspci -t` without names: a root-bus function is the platform's
    return Kind.other  # an endpoint no rule names (an FPGA, a card shown by its chip name): keep it


_PRIORITY = {Kind.gpu: 0, Kind.nvswitch: 1, Kind.ssd: 2, Kind.nic: 3, Kind.other: 4}


def card_kind(funcs: list[PciFunction]) -> Kind | None:
    kinds = [k for k in (classify(f) for f in funcs) if k is not None]
    return min(kinds, key=_PRIORITY.__getitem__) if kinds else None


def model_name(name: str) -> str:
    """'NVIDIA Corporation AD102GL [RTX 6000 Ada Generation]' -> 'RTX 6000 Ada Generation'."""
    brackets = [b for b in re.findall(r"\[([^\]]+)\]", name) if not re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}", b)
                and b.upper() not in ("AMD", "AMD/ATI")]
    return brackets[-1].strip() if brackets else name.strip() or "unknown"


def catalog_match(name: str, kind: Kind):
    """The catalogue model whose name appears in the device name (so an RTX 6000 Ada gets 48 GiB)."""
    squashed = re.sub(r"[^a-z0-9]", "", name.lower())
    best = None
    for m in CATALOG:
        if m.kind != kind:
            continue
        for alias in (m.name, *m.aliases):
            a = re.sub(r"[^a-z0-9]", "", alias.lower())
            if len(a) >= 4 and a in squashed and (best is None or len(a) > best[0]):
                best = (len(a), m)
    return best[1] if best else None


# ---- tree building -----------------------------------------------------------------------------------
@dataclass
class _Ctx:
    funcs: dict[Key, PciFunction]
    children: dict[Key | None, list[Key]]
    order: int = 0
    defaulted: set[int] = field(default_factory=set)  # id() of links built from defaults

    def next(self) -> int:
        self.order += 1
        return self.order


def resolve_parents(funcs: list[PciFunction], warnings: list[str]) -> dict[Key, PciFunction]:
    """Index functions and fill `parent` from bridge bus numbers where the source gave no tree."""
    index: dict[Key, PciFunction] = {}
    for f in funcs:
        if f.key in index:
            index[f.key].merge(f)
        else:
            index[f.key] = f
    by_secondary: dict[tuple[int, int], Key] = {}
    for f in sorted(index.values(), key=lambda x: x.key):
        if f.is_bridge and f.secondary is not None:
            if (f.domain, f.secondary) in by_secondary:
                warnings.append(f"two bridges claim bus {f.domain:04x}:{f.secondary:02x}; "
                                f"kept {key_str(by_secondary[(f.domain, f.secondary)])}")
                continue
            if f.secondary == f.bus:
                raise MomentError(f"bridge {f.bdf} leads to its own bus {f.secondary:02x}")
            by_secondary[(f.domain, f.secondary)] = f.key
    for f in index.values():
        if not f.parent_known:
            f.parent = by_secondary.get((f.domain, f.bus))
        if f.parent is not None and f.parent not in index:
            f.parent = None
    # every chain must end on a root bus
    for f in index.values():
        seen, cur = set(), f
        while cur.parent is not None:
            if cur.key in seen:
                raise MomentError(f"PCI bridges form a loop at {cur.bdf}")
            seen.add(cur.key)
            cur = index[cur.parent]
    return index


def _gen(gts: float | None) -> int | None:
    if gts is None:
        return None
    try:
        return bw.pcie_gen_from_gts(gts)
    except ValueError:
        return None


def _link(ctx: _Ctx, upper: PciFunction | None, lower: PciFunction | None, kind: Kind, bus: str,
          *, capability_only: bool = False, trained: PciFunction | None = None) -> Link:
    """The link between `upper` and `lower`; a slot's (`capability_only`, the port alone) is at least
    what the card in it (`trained`) trained at when the port's own figures are missing."""
    ends = [e for e in (upper, lower) if e is not None]
    gens = [g for g in (_gen(e.cap_gts) for e in ends) if g]
    if not gens:
        gens = [g for g in (_gen(e.sta_gts) for e in ends) if g]
    widths: list[int] = []
    if not capability_only and lower is not None and lower.sta_width:
        widths = [lower.sta_width]
    if not widths:
        widths = [w for w in (e.cap_width for e in ends) if w]
    if trained is not None:  # the port trained the card this fast and this wide, so it is at least that
        if not gens and (g := _gen(trained.sta_gts)) and g > DEFAULT_GEN:
            gens = [g]
        if not widths and trained.sta_width and trained.sta_width > DEFAULT_WIDTH[kind]:
            widths = [trained.sta_width]
    link = Link(gen=min(gens) if gens else DEFAULT_GEN, width=min(widths) if widths else DEFAULT_WIDTH[kind],
                label=f"bus {bus}")
    if not gens or not widths:
        ctx.defaulted.add(id(link))
    return link


def _bus_label(f: PciFunction) -> str:
    return f"{f.domain:04x}:{f.bus:02x}"


def _device(ctx: _Ctx, kind: Kind, card: list[PciFunction], link: Link | None) -> DraftDev:
    primary = next((f for f in card if classify(f) == kind), card[0])
    label = primary.display_name()
    d = DraftDev(kind, ctx.next(), pci=primary.bdf, uplink=link if kind in PLACEABLE else None,
                 link_kind="pcie" if kind in PLACEABLE else "none", in_slot=False,
                 label=(f"{label} ({len(card)} functions)" if len(card) > 1 else label) or None)
    d.fields.update(pci_ids=pci_ids.ids_text(primary.vendor_id, primary.device_id),
                    pci_class=pci_ids.class_text(primary.code()))
    if primary.numa is not None and primary.numa >= 0:
        d.fields["numa"] = primary.numa
    if kind in PLACEABLE:
        cat = catalog_match(label, kind)
        d.fields["model"] = cat.name if cat else (label or "unknown") if kind == Kind.ssd else model_name(label)
        if cat and kind == Kind.gpu:
            d.fields.update(memory_gib=cat.memory_gib, hbm_gbps=cat.hbm_gbps, double_width=cat.double_width)
        elif kind == Kind.gpu and (info := GPU_MODELS.get((primary.vendor_id, primary.device_id))):
            d.fields.update(model=info.model, memory_gib=info.memory_gib, hbm_gbps=info.hbm_gbps)  # ids, no name
        if cat and kind == Kind.ssd:
            d.fields.update(read_gbps=cat.read_gbps, capacity_gb=cat.capacity_gb)
    elif kind == Kind.other:
        d.fields["description"] = primary.class_name or None
    return d


def _cards(funcs: list[PciFunction]) -> list[list[PciFunction]]:
    groups: dict[tuple[int, int, int], list[PciFunction]] = {}
    for f in funcs:
        groups.setdefault((f.domain, f.bus, f.dev), []).append(f)
    return [groups[k] for k in sorted(groups)]


def _endpoints(ctx: _Ctx, ends: list[PciFunction], port: PciFunction | None) -> list[DraftDev]:
    """The cards on one bus; a port holding one placeable card puts it in a slot (the port's facts)."""
    kept = [(c, card_kind(c)) for c in _cards(ends)]
    kept = [(c, k) for c, k in kept if k is not None]
    if port is not None and len(kept) == 1 and kept[0][1] in PLACEABLE:
        card, kind = kept[0]
        phys = port.physical_slot or card[0].physical_slot
        d = _device(ctx, kind, card, _link(ctx, port, card[0], kind, _bus_label(card[0])))
        d.in_slot = True
        d.slot = DraftSlot(pci=port.bdf, width=port.cap_width or DEFAULT_WIDTH[kind],
                           link=_link(ctx, port, None, kind, _bus_label(card[0]), capability_only=True,
                                      trained=card[0]),
                           label=f"port {port.bdf}" + (f", physical slot {phys}" if phys else ""),
                           designation=f"Slot {card[0].physical_slot or port.physical_slot}" if phys else None)
        return [d]
    return [_device(ctx, kind, card, _link(ctx, port, card[0], kind, _bus_label(card[0]))
                    if kind in DEFAULT_WIDTH else None) for card, kind in kept]


def _port(ctx: _Ctx, port: PciFunction) -> list[DraftDev]:
    kids = [ctx.funcs[k] for k in ctx.children.get(port.key, [])]
    if not kids:
        if port.slot_capable is False:
            return []
        behind = f"{port.domain:04x}:{port.secondary or 0:02x}"
        return [DraftDev(Kind.slot, ctx.next(), at=f"{behind}:00.0", slot=DraftSlot(
            pci=port.bdf, width=port.cap_width or DEFAULT_WIDTH[Kind.slot], label=f"empty port {port.bdf}",
            link=_link(ctx, port, None, Kind.slot, behind, capability_only=True)))]
    out: list[DraftDev] = []
    for b in (k for k in kids if k.is_bridge):
        grand = [ctx.funcs[k] for k in ctx.children.get(b.key, [])]
        if any(g.is_bridge for g in grand):
            sw = _switch(ctx, port, b)
            out.extend([sw] if sw is not None else [])
        else:
            out.extend(_port(ctx, b))
    return out + _endpoints(ctx, [k for k in kids if not k.is_bridge], port)


def _switch(ctx: _Ctx, port: PciFunction | None, up: PciFunction) -> DraftDev | None:
    """A switch (its upstream port `up`) with what hangs below its downstream ports; None if nothing does."""
    kids = [ctx.funcs[k] for k in ctx.children.get(up.key, [])]
    below = [d for k in kids if k.is_bridge for d in _port(ctx, k)]
    below += _endpoints(ctx, [k for k in kids if not k.is_bridge], None)
    if not below:
        return None
    return DraftDev(Kind.switch, ctx.next(), pci=up.bdf, uplink=_link(ctx, port, up, Kind.switch, _bus_label(up)),
                    label=f"{up.name or 'PCIe switch'} (upstream port {up.bdf})", children=below)


def _socket_of_roots(roots: list[tuple[int, int]], numa: dict[tuple[int, int], int], sockets: int | None,
                     warnings: list[str]) -> dict[tuple[int, int], int]:
    if numa:
        nodes = sorted(set(numa.values()))
        even = {r: nodes[i * len(nodes) // len(roots)] for i, r in enumerate(roots)}
        if len(nodes) > 1 and all(even[r] == n for r, n in numa.items()):
            return even  # an even split in bus order agrees with every root bus we know
        out: dict[tuple[int, int], int] = {}
        for i, r in enumerate(roots):
            if r in numa:
                out[r] = numa[r]
                continue
            before = [numa[x] for x in roots[:i] if x in numa]
            after = [numa[x] for x in roots[i + 1:] if x in numa]
            out[r] = before[-1] if before else after[0]
        return out
    if sockets and sockets > 1 and roots:
        n = min(sockets, len(roots))
        warnings.append(f"no NUMA information: split {len(roots)} root buses in bus order into {n} sockets")
        return {r: i * n // len(roots) for i, r in enumerate(roots)}
    if roots and sockets is None:
        warnings.append("no NUMA information: all root complexes are put under one socket (cpu0)")
    return {r: 0 for r in roots}


def _count_defaulted(ctx: _Ctx, drafts: list[DraftDev]) -> int:
    n = 0
    for d in drafts:
        n += id(d.uplink) in ctx.defaulted if d.uplink is not None else 0
        n += id(d.slot.link) in ctx.defaulted if d.slot is not None and d.slot.link is not None else 0
        n += _count_defaulted(ctx, d.children)
    return n


def build_topology(funcs: list[PciFunction], *, name: str, source: str | None = None,
                   description: str | None = None, sockets: int | None = None,
                   memory_gib: dict[int, float] | None = None, warnings: list[str] | None = None) -> Topology:
    """Draft the planner's tree from PCI functions by the rules in this module's docstring; the shared
    builder (`readers.build.assemble`) names and validates it, as it does for the XML readers."""
    warns: list[str] = [] if warnings is None else warnings
    index = resolve_parents(funcs, warns)
    children: dict[Key | None, list[Key]] = {}
    for k in sorted(index):
        children.setdefault(index[k].parent, []).append(k)
    ctx = _Ctx(funcs=index, children=children)

    def root_of(f: PciFunction) -> tuple[int, int]:
        while f.parent is not None:
            f = index[f.parent]
        return (f.domain, f.bus)

    roots = sorted({root_of(f) for f in index.values()})
    votes: dict[tuple[int, int], Counter] = {}
    for f in index.values():
        if f.numa is not None and f.numa >= 0:
            votes.setdefault(root_of(f), Counter())[f.numa] += 1
    numa = {r: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for r, c in votes.items()}
    root_socket = _socket_of_roots(roots, numa, sockets, warns)

    rcs: list[DraftRc] = []
    for dom, bus in roots:
        on_root = [index[k] for k in children.get(None, []) if index[k].domain == dom and index[k].bus == bus]
        below = [d for f in on_root if f.is_bridge for d in _port(ctx, f)]
        below += _endpoints(ctx, [f for f in on_root if not f.is_bridge], None)
        if below:
            rcs.append(DraftRc(label=f"root bus {dom:04x}:{bus:02x}", numa=root_socket[(dom, bus)], children=below))
    if not rcs and index:
        warns.append("no GPU, SSD, NIC or slot found below any root bus")

    numa_ids = sorted({rc.numa for rc in rcs} | set(memory_gib or {})) or [0]
    if sockets and not numa and sockets > len(numa_ids):
        numa_ids = list(range(sockets))
    amd = any(f.vendor() == pci_ids.AMD_CPU for f in index.values() if f.parent is None)
    link = (SocketLinkSpec("xgmi", 4, None, "assumed (not in the scan)") if amd
            else SocketLinkSpec("upi", 2, None, "assumed (not in the scan)"))
    drafts: dict[int, DraftSocket] = {}  # NUMA node -> its socket
    for group in _numa_sockets(numa_ids, sockets if numa else None, memory_gib, warns):
        mem = [memory_gib[n] for n in group if memory_gib and n in memory_gib]
        sock = DraftSocket(numa=group[0], model=None, link=link, memory_gib=round(sum(mem), 1) if mem else None,
                           label=f"NUMA nodes {', '.join(map(str, group))}" if len(group) > 1 else None)
        drafts.update({n: sock for n in group})
    for rc in rcs:
        drafts[rc.numa].rcs.append(rc)
        if not numa:
            rc.numa = None  # a split by socket count, not a NUMA node anyone reported
    defaulted = sum(_count_defaulted(ctx, rc.children) for rc in rcs)
    if defaulted:
        warns.append(f"{defaulted} PCIe links had no speed/width in the input: assumed PCIe "
                     f"{DEFAULT_GEN}.0, x16 (x4 for NVMe)")
    socks = list({id(d): d for d in drafts.values()}.values())
    return assemble(name=name, source=source, description=description, sockets=socks, peers=[])


def _numa_sockets(numa_ids: list[int], sockets: int | None, memory_gib: dict[int, float] | None,
                  warns: list[str]) -> list[list[int]]:
    """NUMA nodes grouped into sockets. Each node is its own socket unless a socket count (dmidecode)
    is smaller than the number of nodes: then, when every NUMA node is known (numactl/sysfs memory)
    and they split evenly, node n is on socket n // (nodes / sockets), as Linux numbers them (AMD NPS,
    Intel SNC); otherwise the warning says the grouping is not known and each node stays apart."""
    alone = [[n] for n in numa_ids]
    if not sockets or len(numa_ids) <= sockets:
        return alone
    total = len(memory_gib or {})
    if total and total % sockets == 0 and all(n < total for n in numa_ids):
        per = total // sockets
        groups: dict[int, list[int]] = {}
        for n in numa_ids:
            groups.setdefault(n // per, []).append(n)
        warns.append(f"{total} NUMA nodes on {sockets} sockets: {per} nodes a socket, node n on socket n // {per}")
        return list(groups.values())
    warns.append(f"{len(numa_ids)} NUMA nodes but {sockets} sockets, and which nodes share a socket is not "
                 "known (give numactl --hardware output); each NUMA node is modelled as its own socket")
    return alone
