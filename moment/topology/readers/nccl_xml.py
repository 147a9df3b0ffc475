"""NCCL/RCCL topology XML (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`) <-> `Topology`.

NCCL's XML is both what it detects and what it can be told, so a plan's machine written back out can
steer NCCL the same way the input described it. Mapping (reader):
  - `<cpu numaid>` -> a NUMA domain: one root complex (`numa` = the numaid) under its socket. Which
    domains share a socket is inferred from the CPU's identity and `affinity` (`_xml_cpu.group_numa_domains`:
    AMD NPS / Intel SNC splits that fit the numaids and thread counts); where the file cannot tell,
    the description says so and domains that only might share a socket stay apart. Sockets are
    joined by the CPU's default socket link (UPI/QPI by Intel model, xGMI for AMD; see `_xml_cpu`);
  - `<pci>` with `<pci>` children, or a bridge class 0x0604xx -> switch (one per bridge NCCL lists);
  - `<pci>` with a `<gpu>` child, or class 0x0302xx/0x0380xx/0x1200xx -> gpu; plain VGA 0x0300xx
    without `<gpu>` is display-only -> other; 0x0108xx -> ssd; 0x02xxxx or a `<nic>` child -> nic;
    a `<pci>` with no class is a bridge -> switch (NCCL's own fallback; AWS g5/p5 files list only bus
    ids and NCCL completes them from sysfs), any other class -> other;
  - `<nvlink>` -> an NVLink PeerLink: to a GPU (tclass 0x0302..), to the GPU's own CPU (0x068001), or
    to an NVSwitch (0x068000). NVSwitches are only NVLink targets in NCCL files, so each distinct
    target bus id becomes one `nvswitch` node hung on cpu0 without a PCIe link (its management
    endpoint's place in the tree is unknown); links keep their per-switch lane `count`. An NVLink
    that points at the GPU itself (Azure NCv4) is ignored. `<xgmi>` -> xGMI PeerLink between GPUs;
  - a GPU with NVLink/xGMI to another GPU or an NVSwitch is a soldered SXM/OAM module and gets no
    slot; every other GPU, NIC and SSD sits in a slot of its link width (see `readers.build`);
  - a bus id the file repeats (RCCL's topo_expl models list one under two parents, or one switch
    several times): NCCL/RCCL create a node per `<pci>` without checking, so every repeat is kept as
    its own device, named `<busid>#2`, `#3`, ... in file order, and the description says so; a link
    target takes the first device of the right kind with that id, as NCCL's lookup does;
  - missing link_speed: the generation of the devices below (switches), else the parent's, else
    the CPU's; missing or 0 link_width: x16 (x4 for SSDs). Each assumption is in the link's label.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import replace
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
from moment.topology.readers._xml_doc import (
    REPEAT,
    XmlDoc,
    base_busid,
    busid,
    busid_key,
    float_attr,
    int_attr,
    load,
)
from moment.topology.readers._xml_links import resolve_links

KIND = "NCCL topology XML"
TCLASS_NVSWITCH = 0x068000
TCLASS_CPU = 0x068001


class _Reader:
    def __init__(self, doc: XmlDoc):
        self.doc = doc
        self.order = 0
        self.by_bus: dict[str, list[DraftDev]] = {}  # bus id as written -> every device the file gives it
        self.where: dict[int, str] = {}  # id(draft) -> "under <parent>", for the note on repeated bus ids
        self.socket_of: dict[int, DraftSocket] = {}  # id(gpu draft) -> socket
        self.gpu_links: list[tuple[DraftDev, ET.Element, int | None]] = []  # (gpu, <nvlink>/<xgmi>, sm)
        self.notes: list[str] = []
        self.domains: dict[int, tuple[cpus.CpuId, frozenset[int] | None]] = {}  # numaid -> CPU, its threads

    def _next(self) -> int:
        self.order += 1
        return self.order

    # ---- elements ----------------------------------------------------------------------------------
    def cpu(self, el: ET.Element) -> DraftSocket:
        doc = self.doc
        numa = int_attr(doc, el, "numaid", lo=0, hi=65535, required=True)
        vendor = el.get("vendor")
        raw_family = int_attr(doc, el, "familyid", lo=0, hi=4095)
        model = int_attr(doc, el, "modelid", lo=0, hi=4095)
        family = raw_family
        if vendor == "AuthenticAMD" and raw_family is not None:
            family = cpus.normalise_amd_family(raw_family)
        cpu = cpus.CpuId(vendor, family, model, raw_family)
        sock = DraftSocket(numa=numa, model=cpus.describe(cpu), link=cpus.socket_link(cpu),
                           default_gen=cpus.default_pcie_gen(cpu))
        self.domains[numa] = (cpu, cpus.affinity_cpus(el.get("affinity")))
        rc = DraftRc(label=f"NUMA {numa} root ports", numa=numa)
        sock.rcs.append(rc)
        for child in el:
            if child.tag == "pci":
                rc.children.append(self.pci(child, sock, f"<cpu numaid={numa}>"))
            elif child.tag == "nic":
                rc.children.append(self.bare_nic(child))
        return sock

    def bare_nic(self, el: ET.Element) -> DraftDev:
        """A <nic> straight under <cpu>: a NIC with no PCI device (virtual); its rate is the net speed."""
        speeds, names = self.nets(el)
        bw = max(speeds) / 8000 if speeds else None  # Mb/s -> GB/s
        return DraftDev(Kind.nic, self._next(), link_kind="internal", link_bandwidth_gbps=bw, fixed=True,
                        label=f"NIC without a PCI device ({', '.join(names)})" if names else "NIC without a PCI device",
                        notes=["no PCIe link in the file; net speed used"] if bw else ["no PCIe link in the file"])

    def nets(self, nic: ET.Element) -> tuple[list[float], list[str]]:
        speeds, names = [], []
        for net in nic.iter("net"):
            sp = float_attr(self.doc, net, "speed")
            if sp:
                speeds.append(sp)
            if net.get("name"):
                names.append(net.get("name"))
        return speeds, names

    def pci(self, el: ET.Element, sock: DraftSocket, parent: str) -> DraftDev:
        doc = self.doc
        bus = busid(doc, el, "busid")
        cls = int_attr(doc, el, "class", base=16, lo=0, hi=0xFFFFFF)
        vendor = int_attr(doc, el, "vendor", base=16, lo=0, hi=0xFFFF)
        device = int_attr(doc, el, "device", base=16, lo=0, hi=0xFFFF)
        try:
            gen = pcidb.gen_from_speed_text(el.get("link_speed"))
        except ValueError as e:
            raise doc.error(el, str(e)) from None
        width = int_attr(doc, el, "link_width", lo=0, hi=32) or None
        if width is not None and width not in bw.PCIE_WIDTHS:
            raise doc.error(el, f"link_width={width} is not a PCIe width "
                                f"({', '.join(str(w) for w in bw.PCIE_WIDTHS)})")
        sub_pci = [c for c in el if c.tag == "pci"]
        gpu_el = next((c for c in el if c.tag == "gpu"), None)
        nic_el = next((c for c in el if c.tag == "nic"), None)
        if gpu_el is not None:
            kind = Kind.gpu
        elif nic_el is not None:
            kind = Kind.nic
        elif sub_pci:
            kind = Kind.switch
        elif cls is not None:
            kind = pcidb.kind_of_class(cls, vendor, device)
        else:  # NCCL's own fallback for a class it does not know is a PCI bridge
            kind = Kind.switch
        if sub_pci and kind != Kind.switch:
            raise doc.error(el, f"a {kind.value} ({bus}) cannot have <pci> children")
        same = self.by_bus.setdefault(bus, [])
        # NCCL/RCCL make one node per <pci> and never check bus ids for repeats (RCCL's topo_expl models
        # repeat some), so a repeat is kept as another device; its id gets `#n` so ids stay unique.
        d = DraftDev(kind, self._next(), pci=bus if not same else f"{bus}{REPEAT}{len(same) + 1}", gen=gen,
                     width=width)
        same.append(d)
        self.where[id(d)] = f"a {kind.value} under {parent}"
        self.fill_fields(d, el, cls, vendor, device, gpu_el, nic_el)
        if kind == Kind.gpu:
            self.socket_of[id(d)] = sock
        for c in sub_pci:
            d.children.append(self.pci(c, sock, bus))
        return d

    def find(self, bus: str, kind: Kind | None = None) -> DraftDev | None:
        """The device a link target names: the first of that kind with the bus id (NCCL's
        `ncclTopoGetNode` takes the first), else the first with the bus id."""
        same = self.by_bus.get(bus, [])
        return next((d for d in same if d.kind == kind), same[0] if same else None)

    def repeat_notes(self) -> list[str]:
        out = []
        for bus, same in sorted(self.by_bus.items(), key=lambda kv: busid_key(kv[0])):
            if len(same) > 1:
                ways = "; ".join(f"{d.pci}: {self.where[id(d)]}" for d in same)
                out.append(f"Bus id {bus} appears {len(same)} times ({ways}); NCCL/RCCL keep each <pci> as "
                           f"its own device and so does this reading, naming the repeats {REPEAT}2, {REPEAT}3, ...")
        return out

    def fill_fields(self, d: DraftDev, el: ET.Element, cls, vendor, device, gpu_el, nic_el) -> None:
        doc = self.doc
        d.fields.update(pci_ids=pci_ids.ids_text(vendor, device),
                        pci_class=pci_ids.class_text(cls >> 8 if cls is not None else None))
        if d.kind == Kind.switch:
            d.fields["model"] = pcidb.model_name(pcidb.SWITCH_MODELS, vendor, device, "switch")
            if cls is None:
                d.label = "no class in the file; a PCI bridge, as NCCL assumes"
        elif d.kind == Kind.gpu:
            info = pcidb.GPU_MODELS.get((vendor, device)) if vendor is not None and device is not None else None
            name = info.model if info else pcidb.model_name({}, vendor, device, "gpu") or "gpu"
            d.fields.update(model=name)
            if info:
                d.fields.update(memory_gib=info.memory_gib, hbm_gbps=info.hbm_gbps)
            sm = None
            if gpu_el is not None:
                sm = int_attr(doc, gpu_el, "sm", lo=0, hi=100000)
                for k in ("dev", "rank"):
                    int_attr(doc, gpu_el, k, lo=0, hi=1 << 20)
                for link_el in gpu_el:
                    if link_el.tag in ("nvlink", "xgmi"):
                        self.gpu_links.append((d, link_el, sm))
            gen = pcidb.nvlink_gen_from_sm(sm) if vendor != pcidb.AMD else None
            d.nvlink_gen = gen or (info.nvlink_gen if info else None)
        elif d.kind == Kind.nic:
            d.fields["model"] = pcidb.model_name(pcidb.NIC_MODELS, vendor, device, "nic")
            if nic_el is not None:
                _, names = self.nets(nic_el)
                if names:
                    d.label = "ports " + ", ".join(names)
        elif d.kind == Kind.ssd:
            known = pcidb.SSD_MODELS.get((vendor, device)) if vendor is not None else None
            if known:
                d.fields.update(model=known[0], read_gbps=known[1], capacity_gb=known[2])
            elif vendor is not None and device is not None:
                d.fields["model"] = f"nvme {vendor:04x}:{device:04x}"
        elif d.kind == Kind.other:
            ids = f" {vendor:04x}:{device:04x}" if vendor is not None and device is not None else ""
            d.fields["description"] = f"PCI class 0x{cls or 0:06x}{ids}"

    # ---- peer links ----------------------------------------------------------------------------------
    def peers(self, sockets: list[DraftSocket]) -> list[DraftPeer]:
        doc = self.doc
        merged: dict = {}
        nvswitches: dict[str, DraftDev] = {}
        self_links = 0
        for gpu, el, _sm in self.gpu_links:
            target = busid(doc, el, "target")
            count = int_attr(doc, el, "count", lo=1, hi=1024) or 1
            tclass = int_attr(doc, el, "tclass", base=16, lo=0, hi=0xFFFFFF)
            gen = gpu.nvlink_gen
            if el.tag == "nvlink" and tclass == TCLASS_CPU:
                merge_peer(merged, DraftPeer(gpu, self.socket_of[id(gpu)], "nvlink", count, gen))
                gpu.fixed = True
                continue
            if target == base_busid(gpu.pci):
                self_links += 1
                continue
            other = self.find(target, Kind.nvswitch if tclass == TCLASS_NVSWITCH else Kind.gpu)
            if el.tag == "nvlink" and (tclass == TCLASS_NVSWITCH or (tclass is None and other is None)):
                if other is None:
                    other = nvswitches.get(target)
                if other is None:
                    other = DraftDev(Kind.nvswitch, self._next(), pci=target, link_kind="none",
                                     label="NVSwitch (only an NVLink target in the file; PCIe position unknown)")
                    nvswitches[target] = other
                    sockets[0].loose.append(other)
                elif other.kind != Kind.nvswitch:
                    raise doc.error(el, f"NVLink target {target} is a {other.kind.value}, not an NVSwitch")
            elif other is None or other.kind != Kind.gpu:
                what = "not in the file" if other is None else f"a {other.kind.value}"
                raise doc.error(el, f"{el.tag} target {target} is {what}; expected a GPU")
            kind = "nvlink" if el.tag == "nvlink" else "xgmi"
            merge_peer(merged, DraftPeer(gpu, other, kind, count, gen if kind == "nvlink" else None))
            gpu.fixed = True
            if other.kind == Kind.gpu:
                other.fixed = True
        if self_links:
            self.notes.append(f"{self_links} NVLink entries pointing at their own GPU were ignored")
        return list(merged.values())


def read_nccl_xml(path_or_text: str | bytes | Path, name: str | None = None) -> Topology:
    """Read an NCCL/RCCL topology file (system version 1 or 2) into a Topology."""
    doc = load(path_or_text, KIND, "system")
    version = int_attr(doc, doc.root, "version", lo=1, hi=1000)
    r = _Reader(doc)
    sockets: list[DraftSocket] = []
    seen_numa: set[int] = set()
    for el in doc.root:
        if el.tag == "cpu":
            s = r.cpu(el)
            if s.numa in seen_numa:
                raise doc.error(el, f"numaid {s.numa} is used by two <cpu> elements")
            seen_numa.add(s.numa)
            sockets.append(s)
    if not sockets:
        raise MomentError("no <cpu> element: an NCCL topology needs at least one NUMA domain", source=doc.source)
    grouping = cpus.group_numa_domains(r.domains)
    sockets = _group_sockets(sockets, grouping, r)
    peers = r.peers(sockets)
    assumed = 0
    for s in sockets:
        for rc in s.rcs:
            assumed += resolve_links(rc.children, s.default_gen)
    for d in all_devs(sockets):
        if d.kind == Kind.gpu and d.fixed:
            d.fields["double_width"] = False
    notes = [
        f"Read from an NCCL topology file (system version {version or 1}).",
        (f"Each <cpu> NUMA domain is a root complex ({len(r.domains)} in all) under its socket "
         f"({len(sockets)} in all); every PCI bridge NCCL lists is a switch; GPUs with NVLink/xGMI are fixed "
         "modules, other GPUs, NICs and SSDs sit in slots."),
    ]
    if grouping.note:
        notes.append(grouping.note)
    if any(s.loose for s in sockets):
        notes.append("NVSwitches appear only as NVLink targets, so they hang on cpu0 without a PCIe link.")
    if assumed:
        notes.append(f"{assumed} PCIe links had no speed or width in the file; assumptions are in their labels.")
    notes.extend(r.repeat_notes())
    notes.extend(r.notes)
    return assemble(name=name or _default_name(path_or_text, "nccl-topology"), source=doc.source,
                    description=" ".join(notes), sockets=sockets, peers=peers)


def _group_sockets(domains: list[DraftSocket], grouping: cpus.Grouping, r: _Reader) -> list[DraftSocket]:
    """One socket per group of NUMA domains, holding the domains' root complexes in numaid order."""
    by_numa = {d.numa: d for d in domains}
    out: list[DraftSocket] = []
    for numas in grouping.sockets:
        first = by_numa[numas[0]]
        link = first.link
        label = f"NUMA domains {', '.join(map(str, numas))}" if len(numas) > 1 else None
        if not grouping.certain and len(grouping.sockets) > 1:
            label = (f"{label or f'NUMA domain {numas[0]}'}; may share a CPU package with another socket node "
                     "(not in the file)")
            link = replace(link, label=f"{link.label}; the sockets it joins may be one CPU package")
        sock = DraftSocket(numa=numas[0], model=first.model, link=link, default_gen=first.default_gen,
                           label=label)
        for n in numas:
            sock.rcs.extend(by_numa[n].rcs)
            for k, v in r.socket_of.items():
                if v is by_numa[n]:
                    r.socket_of[k] = sock
        out.append(sock)
    return out


def _default_name(path_or_text, fallback: str) -> str:
    if isinstance(path_or_text, Path) or (isinstance(path_or_text, str) and "<" not in path_or_text):
        stem = Path(path_or_text).stem
        return stem or fallback
    return fallback


# ---- export ----------------------------------------------------------------------------------------
_CLASS = {Kind.switch: "0x060400", Kind.gpu: "0x030200", Kind.nic: "0x020000"}
_TCLASS = {Kind.nvswitch: "0x068000", Kind.gpu: "0x030200", Kind.socket: "0x068001"}


class _Writer:
    """Walks the Topology's PCIe forest; slots are transparent, SSDs and other devices are left out
    (NCCL would take an unknown class for a bridge)."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.gpu_index = {g.id: i for i, g in enumerate(topo.of_kind(Kind.gpu))}
        used = {base_busid(n.pci) for n in topo.nodes if n.pci}
        self.placeholders: dict[str, str] = {}
        self._free = (f"fffe:{i // 32:02x}:{i % 32:02x}.0" for i in range(1 << 13))
        self._used = used

    def bus(self, node) -> str:
        """The node's bus id as NCCL wrote it (a repeat's `#n` dropped: NCCL takes repeats), or a
        placeholder in domain fffe (replace with the real one before use)."""
        if node.pci:
            return base_busid(node.pci)
        if node.id not in self.placeholders:
            b = next(self._free)
            while b in self._used:
                b = next(self._free)
            self.placeholders[node.id] = b
        return self.placeholders[node.id]

    def link_attrs(self, node) -> dict[str, str]:
        link = node.link
        if (link is None or link.gen is None) and node.parent and self.topo.node(node.parent).kind == Kind.slot:
            link = self.topo.node(node.parent).link
        if link is None or link.gen is None or link.width is None:
            return {"link_speed": "", "link_width": "0"}
        return {"link_speed": pcidb.gts_text(link.gen), "link_width": str(link.width)}

    def write(self, parent_el: ET.Element, node_id: str) -> None:
        node = self.topo.node(node_id)
        if node.kind == Kind.slot:
            for c in self.topo.children(node_id):
                self.write(parent_el, c)
            return
        if node.kind == Kind.nic and node.pci is None and node.link is not None and node.link.kind == "internal":
            nic = ET.SubElement(parent_el, "nic")
            net = {"name": node.id, "dev": str(self.topo.of_kind(Kind.nic).index(node))}
            if node.link.bandwidth_gbps:
                net["speed"] = f"{node.link.bandwidth_gbps * 8000:g}"
            ET.SubElement(nic, "net", net)
            return
        if node.kind not in _CLASS:
            return
        el = ET.SubElement(parent_el, "pci", {"busid": self.bus(node), "class": _CLASS[node.kind],
                                              **self.link_attrs(node)})
        if node.kind == Kind.gpu:
            self.gpu(el, node)
        for c in self.topo.children(node_id):
            self.write(el, c)

    def gpu(self, pci_el: ET.Element, node) -> None:
        i = self.gpu_index[node.id]
        attrs = {"dev": str(i), "rank": str(i), "gdr": "1"}
        gens = [lk.gen for lk in self.topo.links if lk.kind == "nvlink" and node.id in (lk.a, lk.b) and lk.gen]
        sm = next((sm for sm, g in sorted(pcidb.NVLINK_GEN_BY_SM.items()) if gens and g == max(gens)), None)
        if sm is not None:
            attrs["sm"] = str(sm * 10)
        gpu = ET.SubElement(pci_el, "gpu", attrs)
        for lk in self.topo.links:
            if lk.kind not in ("nvlink", "xgmi") or node.id not in (lk.a, lk.b):
                continue
            other = self.topo.node(lk.b if lk.a == node.id else lk.a)
            if other.kind not in _TCLASS or (lk.kind == "xgmi" and other.kind != Kind.gpu):
                continue
            target = self.bus(node) if other.kind == Kind.socket else self.bus(other)
            ET.SubElement(gpu, lk.kind, {"target": target, "count": str(lk.count), "tclass": _TCLASS[other.kind]})


def write_nccl_xml(topo: Topology) -> str:
    """The machine as an NCCL topology file (for `NCCL_TOPO_FILE`): CPUs, switches, GPUs, NICs, NVLinks.

    Devices without a bus id (planned, not scanned) get placeholders `fffe:bb:dd.0`, listed in the
    leading comment; NCCL matches GPUs and NICs by bus id, so replace them with the real ones.
    """
    w = _Writer(topo)
    root = ET.Element("system", {"version": "1"})
    domains: list[tuple[int | None, object, list[str]]] = []  # (numaid, socket, root complexes): one <cpu> each
    for s in topo.of_kind(Kind.socket):
        rcs = [c for c in topo.children(s.id) if topo.node(c).kind == Kind.root_complex]
        rc_numa = [topo.node(c).numa for c in rcs]
        if rcs and None not in rc_numa and len(set(rc_numa)) > 1:  # a socket of several NUMA domains
            domains.extend((n, s, [c for c, m in zip(rcs, rc_numa) if m == n]) for n in sorted(set(rc_numa)))
        else:
            domains.append((s.numa, s, rcs))
    numas = [n for n, _, _ in domains]
    unique = len(set(numas)) == len(numas) and None not in numas
    for i, (numa, s, rcs) in enumerate(domains):
        attrs = {"numaid": str(numa if unique else i)}
        ident = cpus.identity_from_model(s.model)
        if ident:
            attrs.update(arch="x86_64", vendor=ident[0], familyid=str(ident[1]), modelid=str(ident[2]))
        cpu = ET.SubElement(root, "cpu", attrs)
        for rc in rcs:
            for c in topo.children(rc):
                w.write(cpu, c)
    ET.indent(root, "  ")
    body = ET.tostring(root, encoding="unicode")
    name = topo.name.replace("--", "-")
    head = f"<!-- NCCL topology of {name}, written by moment"
    if w.placeholders:
        ids = ", ".join(f"{k}={v}" for k, v in w.placeholders.items()).replace("--", "-")
        head += f"; placeholder bus ids (replace with the real ones): {ids}"
    return head + " -->\n" + body + "\n"
