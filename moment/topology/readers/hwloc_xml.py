"""hwloc XML (`lstopo --of xml`, formats v1 and v2/v3) -> `Topology`.

hwloc shows every bridge, so the PCIe tree is read faithfully. Mapping:
  - Package (v1: Socket) -> socket, with the local memory of its NUMA nodes; no Package -> one socket
    per NUMANode, else one for the whole machine;
  - host bridge (bridge_type 0-x) -> root complex; an I/O tree with none gets its own root complex;
  - bridges alternate port / switch, as PCIe does: a bridge under a root complex or a switch is a root
    or downstream port (no node: it *is* the link), a bridge under a port is a switch's upstream
    port -> switch;
  - PCIDev: kind from vendor/device ids and class first (`moment.topology.pci_ids`): display
    (0300/0302/0380) or accelerator (1200) from NVIDIA, AMD or an Intel discrete part -> gpu, with or
    without an OS device (an OpenCL-only Radeon, an old board with none); BMC/baseboard video (ASPEED,
    Matrox G200, ATI ES1000) -> `other`; then refined: a CUDA/NVML/RSMI osdev makes a display function
    a gpu; class 0108, or an nvme* osdev -> ssd; 02xx and InfiniBand 0c06 -> nic; subtype NVSwitch or
    0680 from NVIDIA -> nvswitch. Storage controllers, other display, co-processors and accelerators
    are kept as `other`; chipset functions (host/ISA bridges, system peripherals, USB, SMBus,
    counters) are left out. Each node carries `pci_ids` (vendor:device) and `pci_class`;
  - functions of one device (bb:dd.0, bb:dd.3 of a dual-port NIC; same kind and vendor) are one node;
  - `pci_link_speed` (GB/s, lanes x GT/s x encoding / 8) -> gen and width; 0 means hwloc did not
    know and the gen/width defaults of `_xml_links` apply; ambiguous figures are noted;
  - NVLinkBandwidth distances (MB/s) -> nvlink PeerLinks between GPUs, NVSwitches and CPUs, with the
    measured bandwidth and count = bandwidth / per-link rate of the GPU's NVLink generation.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from moment.errors import MomentError
from moment.topology import bandwidth as bw
from moment.topology import pci_ids
from moment.topology.model import Kind, Topology
from moment.topology.readers import _xml_cpu as cpus
from moment.topology.readers import _xml_pci as pcidb
from moment.topology.readers.build import (
    DraftDev,
    DraftPeer,
    DraftRc,
    DraftSocket,
    all_devs,
    assemble,
    merge_peer,
)
from moment.topology.readers._xml_doc import XmlDoc, busid, float_attr, int_attr, load
from moment.topology.readers._xml_links import resolve_links

KIND = "hwloc XML"
_PCI_TYPE = re.compile(r"^\s*([0-9a-fA-F]{4})\s+\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")
_VERSION = re.compile(r"^\d+(\.\d+)*$")
_GPU_BACKENDS = ("CUDA", "NVML", "RSMI")


@dataclass
class _Obj:
    """An hwloc object with its parent, so the tree can be walked both ways."""

    el: ET.Element
    parent: _Obj | None
    children: list[_Obj] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.el.get("type", "")

    def ancestors(self):
        cur = self.parent
        while cur is not None:
            yield cur
            cur = cur.parent

    def descendants(self):
        for c in self.children:
            yield c
            yield from c.descendants()

    def info(self, name: str) -> str | None:
        for i in self.el.findall("info"):
            if i.get("name") == name:
                return i.get("value")
        return None


def _tree(el: ET.Element, parent: _Obj | None) -> _Obj:
    obj = _Obj(el, parent)
    for c in el.findall("object"):
        obj.children.append(_tree(c, obj))
    return obj


_PACKAGE_TYPES = ("Package", "Socket")
_PCI_TYPES = ("Bridge", "PCIDev")


class _Reader:
    def __init__(self, doc: XmlDoc):
        self.doc = doc
        self.order = 0
        self.draft_of: dict[int, DraftDev | DraftSocket] = {}  # id(element) -> draft
        self.gp: dict[tuple[str, int], _Obj] = {}
        self.dropped = 0
        self.notes: list[str] = []
        self.one_numa: set[int] = set()  # id() of sockets with one NUMA node: their I/O is in that node

    def _next(self) -> int:
        self.order += 1
        return self.order

    # ---- sockets -------------------------------------------------------------------------------------
    def sockets(self, machine: _Obj) -> tuple[list[DraftSocket], dict[int, DraftSocket]]:
        everything = [machine, *machine.descendants()]
        for o in everything:
            gp = int_attr(self.doc, o.el, "gp_index", lo=0)
            if gp is not None:
                self.gp[(o.type, gp)] = o
        pkgs = [o for o in everything if o.type in _PACKAGE_TYPES]
        if not pkgs:
            pkgs = [o for o in everything if o.type == "NUMANode"] or [machine]
            self.notes.append(f"no Package objects; {len(pkgs)} socket(s) taken from "
                              f"{'NUMA nodes' if pkgs[0] is not machine else 'the machine'}")
        keyed = sorted(enumerate(pkgs), key=lambda ip: (int_attr(self.doc, ip[1].el, "os_index", lo=0) or 0, ip[0]))
        out, by_el = [], {}
        for _, p in keyed:
            cpu = self.cpu_id(p)
            numas = [o for o in [p, *p.descendants()] if o.type == "NUMANode"]
            mem = sum(int_attr(self.doc, n.el, "local_memory", lo=0) or 0 for n in numas)
            if not numas:  # v1: the NUMA node holds the package
                up = next((a for a in p.ancestors() if a.type == "NUMANode"), None)
                if up is not None:
                    n_pkgs = sum(1 for d in up.descendants() if d.type in _PACKAGE_TYPES) or 1
                    mem = (int_attr(self.doc, up.el, "local_memory", lo=0) or 0) / n_pkgs
                    numas = [up]
            numa = int_attr(self.doc, numas[0].el, "os_index", lo=0) if numas else None
            s = DraftSocket(numa=numa, model=cpus.describe(cpu), link=cpus.socket_link(cpu),
                            memory_gib=round(mem / bw.GIB, 1) if mem else None,
                            default_gen=cpus.default_pcie_gen(cpu))
            out.append(s)
            if len(numas) == 1:
                self.one_numa.add(id(s))
            by_el[id(p.el)] = s
            self.draft_of[id(p.el)] = s
        return out, by_el

    def cpu_id(self, p: _Obj) -> cpus.CpuId:
        vendor, name = p.info("CPUVendor"), p.info("CPUModel")
        fam, model = p.info("CPUFamilyNumber"), p.info("CPUModelNumber")
        if vendor and fam and model and fam.isdigit() and model.isdigit():
            return cpus.CpuId(vendor, int(fam), int(model), int(fam), name)
        return cpus.from_model_string(name)

    def socket_for(self, io_root: _Obj, by_el: dict[int, DraftSocket], sockets: list[DraftSocket]) -> DraftSocket:
        for a in io_root.ancestors():
            if id(a.el) in by_el:
                return by_el[id(a.el)]
            if a.type == "NUMANode" or a.type == "Group":
                inner = next((d for d in a.descendants() if id(d.el) in by_el), None)
                if inner is not None:
                    return by_el[id(inner.el)]
        return sockets[0]

    # ---- PCI tree ------------------------------------------------------------------------------------
    def io_roots(self, machine: _Obj) -> list[_Obj]:
        return [o for o in machine.descendants()
                if o.type in _PCI_TYPES and (o.parent is None or o.parent.type not in _PCI_TYPES)]

    def root_complex(self, root: _Obj) -> DraftRc:
        if root.type == "Bridge" and (root.el.get("bridge_type") or "").startswith("0"):
            rc = DraftRc(label=f"host bridge {root.el.get('bridge_pci') or ''}".strip())
            rc.children = self.owner_children(root.children, None)
        else:
            rc = DraftRc(label="PCI root (no host bridge in the file)")
            rc.children = self.owner_children([root], None)
        return rc

    def owner_children(self, objs: list[_Obj], parent_gen: int | None) -> list[DraftDev]:
        """Children of a root complex or switch: ports (bridges) and devices straight on it."""
        out: list[DraftDev] = []
        for o in objs:
            if o.type == "Bridge":
                port_bus = busid(self.doc, o.el, "pci_busid") if o.el.get("pci_busid") else None
                port_gbs = float_attr(self.doc, o.el, "pci_link_speed")
                devs = []
                for c in o.children:
                    if c.type == "Bridge":
                        sw = self.switch(c, port_gbs, parent_gen)
                        if sw is not None:
                            sw.port = port_bus
                            out.append(sw)
                    elif c.type == "PCIDev":
                        d = self.device(c, port_gbs, parent_gen)
                        if d is not None:
                            d.port = port_bus
                            devs.append(d)
                out.extend(self.merge_functions(devs))
            elif o.type == "PCIDev":
                d = self.device(o, None, parent_gen)
                if d is not None:
                    out.append(d)
        return self.merge_functions(out)

    def link_of(self, o: _Obj, fallback_gbs: float | None, parent_gen: int | None, kind: Kind,
                d: DraftDev) -> None:
        gbs = float_attr(self.doc, o.el, "pci_link_speed")
        if not gbs and fallback_gbs:
            gbs = fallback_gbs
        if not gbs:
            return
        gw = pcidb.gen_width_from_gbs(gbs, prefer_gen=parent_gen, prefer_width=pcidb.DEFAULT_WIDTH.get(kind, 16))
        if gw is None:
            d.notes.append(f"hwloc link speed {gbs:g} GB/s matches no PCIe gen/width")
            return
        d.gen, d.width, others = gw
        if others:
            alt = " or ".join(f"Gen{g} x{w}" for g, w in others)
            d.notes.append(f"hwloc {gbs:g} GB/s is Gen{d.gen} x{d.width} or {alt}; Gen{d.gen} x{d.width} chosen")

    def switch(self, o: _Obj, port_gbs: float | None, parent_gen: int | None) -> DraftDev | None:
        vendor, device, cls = self.pci_type(o, required=False)
        d = DraftDev(Kind.switch, self._next(), pci=busid(self.doc, o.el, "pci_busid") if o.el.get("pci_busid") else None)
        d.fields["model"] = pcidb.model_name(pcidb.SWITCH_MODELS, vendor, device, "switch")
        d.fields.update(pci_ids=pci_ids.ids_text(vendor, device),
                        pci_class=pci_ids.class_text(cls >> 8 if cls is not None else None))
        self.link_of(o, port_gbs, parent_gen, Kind.switch, d)
        d.children = self.owner_children(o.children, d.gen or parent_gen)
        if not d.children:
            return None  # nothing of interest below: an empty bridge is not worth a node
        self.draft_of[id(o.el)] = d
        return d

    def pci_type(self, o: _Obj, required: bool = True) -> tuple[int | None, int | None, int | None]:
        raw = o.el.get("pci_type")
        if raw is None:
            if required:
                raise self.doc.error(o.el, "PCIDev without a pci_type attribute")
            return None, None, None
        m = _PCI_TYPE.match(raw)
        if not m:
            raise self.doc.error(o.el, f"pci_type={raw!r} is not 'CCSS [vvvv:dddd] ...'")
        return int(m.group(2), 16), int(m.group(3), 16), int(m.group(1), 16) << 8

    def device(self, o: _Obj, port_gbs: float | None, parent_gen: int | None) -> DraftDev | None:
        vendor, device, cls = self.pci_type(o)
        bus = busid(self.doc, o.el, "pci_busid")
        osdevs = [c for c in o.children if c.type == "OSDev"]
        backends = {(c.el.get("subtype") or c.info("Backend") or "").upper() for c in osdevs}
        backends |= {re.sub(r"\d.*$", "", (c.el.get("name") or "")).upper() for c in osdevs}
        kind = pci_ids.kind_from_ids(vendor, device, cls >> 8)  # ids and class first
        if o.el.get("subtype") == "NVSwitch":
            kind = Kind.nvswitch
        elif kind == Kind.other and cls >> 8 in pci_ids.DISPLAY and backends & set(_GPU_BACKENDS):
            kind = Kind.gpu  # a compute OS device (CUDA/NVML/RSMI) on a display function the ids did not know
        elif kind == Kind.other and cls >> 16 == 0x01 and any((c.el.get("name") or "").startswith("nvme")
                                                               for c in osdevs):
            kind = Kind.ssd  # e.g. a SATA-class (0106) controller whose OS device says NVMe
        if kind is None:
            self.dropped += 1
            return None
        if kind == Kind.switch:  # a bridge class on a PCIDev: an endpoint hwloc did not expand
            kind = Kind.other
        d = DraftDev(kind, self._next(), pci=bus)
        self.link_of(o, port_gbs, parent_gen, kind, d)
        self.fields(d, o, vendor, device, cls, osdevs)
        self.draft_of[id(o.el)] = d
        for c in osdevs:
            self.draft_of[id(c.el)] = d
        return d

    def fields(self, d: DraftDev, o: _Obj, vendor, device, cls, osdevs: list[_Obj]) -> None:
        names = [c.el.get("name") for c in osdevs if c.el.get("name")]
        gpu_model = next((c.info("GPUModel") for c in osdevs if c.info("GPUModel")), None)
        pci_name = o.info("PCIDevice")
        d.fields.update(pci_ids=pci_ids.ids_text(vendor, device), pci_class=pci_ids.class_text(cls >> 8))
        if d.kind == Kind.gpu:
            info = pcidb.GPU_MODELS.get((vendor, device))
            d.fields["model"] = gpu_model or (info.model if info else pci_name or f"gpu {vendor:04x}:{device:04x}")
            if info:
                d.fields.update(memory_gib=info.memory_gib, hbm_gbps=info.hbm_gbps)
            d.nvlink_gen = pcidb.nvlink_gen_from_name(gpu_model) or (info.nvlink_gen if info else None)
        elif d.kind == Kind.nic:
            d.fields["model"] = pcidb.NIC_MODELS.get((vendor, device)) or pci_name or f"{vendor:04x}:{device:04x}"
        elif d.kind == Kind.ssd:
            known = pcidb.SSD_MODELS.get((vendor, device))
            if known:
                d.fields.update(model=known[0], read_gbps=known[1], capacity_gb=known[2])
            else:
                d.fields["model"] = pci_name or f"nvme {vendor:04x}:{device:04x}"
        elif d.kind == Kind.other:
            what = f"{o.info('PCIVendor') or ''} {pci_name or ''}".strip()
            d.fields["description"] = f"PCI class 0x{cls:06x} {vendor:04x}:{device:04x}" + (f" ({what})" if what else "")
        if names:
            d.label = "os devices " + ", ".join(names)

    @staticmethod
    def merge_functions(devs: list[DraftDev]) -> list[DraftDev]:
        """Functions of one device (same bus:dev, kind and vendor) become one node: a dual-port NIC is one card."""
        out: list[DraftDev] = []
        seen: dict[tuple, DraftDev] = {}
        for d in devs:
            if d.pci is None or d.kind == Kind.switch:
                out.append(d)
                continue
            # one device's functions come from one vendor: a second vendor at the same bus:dev is another card
            key = (d.pci.rsplit(".", 1)[0], d.kind, (d.fields.get("pci_ids") or "")[:4])
            first = seen.get(key)
            if first is None:
                seen[key] = d
                out.append(d)
            else:
                fn = d.pci.rsplit(".", 1)[1]
                first.label = f"{first.label + '; ' if first.label else ''}function .{fn} merged"
                d.fields["_merged_into"] = first  # NVLink distances may name the merged function
        return out

    # ---- NVLink --------------------------------------------------------------------------------------
    def nvlinks(self, root: ET.Element) -> list[DraftPeer]:
        merged: dict = {}
        for el in root:
            if el.tag not in ("distances2", "distances2hetero") or el.get("name") != "NVLinkBandwidth":
                continue
            n = int_attr(self.doc, el, "nbobjs", lo=1, hi=4096, required=True)
            tokens = " ".join((i.text or "") for i in el.findall("indexes")).split()
            if el.tag == "distances2":  # homogeneous: plain indexes of objects of one type
                if el.get("indexing") != "gp":
                    self.notes.append("an NVLinkBandwidth matrix indexed by OS index was skipped")
                    continue
                tokens = [f"{el.get('type')}:{t}" for t in tokens]
            values_txt = " ".join((v.text or "") for v in el.findall("u64values")).split()
            if len(tokens) != n or len(values_txt) != n * n:
                raise self.doc.error(el, f"NVLinkBandwidth lists {len(tokens)} objects and {len(values_txt)} "
                                     f"values; nbobjs={n} needs {n} and {n * n}")
            try:
                values = [int(v) for v in values_txt]
            except ValueError:
                raise self.doc.error(el, "NVLinkBandwidth values must be integers (MB/s)") from None
            ends = [self.endpoint(el, t) for t in tokens]
            gpu_gens = [e.nvlink_gen for e in ends if isinstance(e, DraftDev) and e.nvlink_gen]
            for i in range(n):
                for j in range(i + 1, n):
                    mbs = max(values[i * n + j], values[j * n + i])
                    a, b = ends[i], ends[j]
                    if mbs <= 0 or a is b:
                        continue
                    gen = next((e.nvlink_gen for e in (a, b) if isinstance(e, DraftDev) and e.nvlink_gen),
                               max(gpu_gens, default=None))
                    per_link = bw.NVLINK_PER_LINK.get(gen or 2) / 1e6
                    count = max(1, round(mbs / per_link))
                    merge_peer(merged, DraftPeer(a, b, "nvlink", count, gen, mbs / 1000, "hwloc NVLinkBandwidth"))
                    for e in (a, b):
                        if isinstance(e, DraftDev) and e.kind == Kind.gpu:
                            e.fixed = True
        return list(merged.values())

    def endpoint(self, el: ET.Element, token: str) -> DraftDev | DraftSocket:
        typ, _, num = token.partition(":")
        if not num.isdigit():
            raise self.doc.error(el, f"distance index {token!r} is not 'Type:gp_index'")
        obj = self.gp.get((typ, int(num)))
        if obj is None:
            raise self.doc.error(el, f"distance index {token} names no object in the file")
        draft = self.draft_of.get(id(obj.el))
        if isinstance(draft, DraftDev) and "_merged_into" in draft.fields:
            draft = draft.fields["_merged_into"]
        if draft is None or (isinstance(draft, DraftDev) and draft.kind not in (Kind.gpu, Kind.nvswitch)):
            raise self.doc.error(el, f"NVLinkBandwidth names {token}, which is not a GPU, NVSwitch or package")
        return draft


def read_hwloc_xml(path_or_text: str | bytes | Path, name: str | None = None) -> Topology:
    """Read an hwloc XML export (v1 or v2/v3 format) into a Topology."""
    doc = load(path_or_text, KIND, "topology")
    version = doc.root.get("version")
    if version is not None and not _VERSION.match(version.strip()):
        raise doc.error(doc.root, f"version={version!r} is not an hwloc XML version")
    top = doc.root.findall("object")
    if not top:
        raise MomentError("no <object> under <topology>: the file describes no machine", source=doc.source)
    r = _Reader(doc)
    machine = _tree(top[0], None)
    sockets, by_el = r.sockets(machine)
    outside = 0
    for root in r.io_roots(machine):
        rc = r.root_complex(root)
        if not rc.children:
            continue
        sock = r.socket_for(root, by_el, sockets)
        if sock is sockets[0] and not any(a.type in _PACKAGE_TYPES for a in root.ancestors()) and len(sockets) > 1:
            outside += 1
        if id(sock) in r.one_numa:
            rc.numa = sock.numa
        sock.rcs.append(rc)
    peers = r.nvlinks(doc.root)
    assumed = 0
    for s in sockets:
        for rc in s.rcs:
            assumed += resolve_links(rc.children, s.default_gen)
    for d in all_devs(sockets):
        d.fields.pop("_merged_into", None)
        if d.kind == Kind.gpu and d.fixed:
            d.fields["double_width"] = False
    fmt = "v1" if version is None or version.startswith("1") else f"v{version.split('.')[0]}"
    notes = [(f"Read from an hwloc XML export (format {fmt}); PCIe bridges alternate port/switch, GPUs with "
             "NVLink are fixed modules, other GPUs, NICs and SSDs sit in slots.")]
    if r.dropped:
        notes.append(f"{r.dropped} chipset PCI functions were left out.")
    if outside:
        notes.append(f"{outside} I/O trees attached to the whole machine were hung on cpu0.")
    if assumed:
        notes.append(f"{assumed} PCIe links had no speed in the file; assumptions are in their labels.")
    notes.extend(r.notes)
    stem = Path(path_or_text).stem if isinstance(path_or_text, Path) or (
        isinstance(path_or_text, str) and "<" not in path_or_text) else ""
    return assemble(name=name or stem or "hwloc-topology", source=doc.source, description=" ".join(notes),
                    sockets=sockets, peers=peers)
