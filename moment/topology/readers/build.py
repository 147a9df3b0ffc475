"""The one topology builder: every reader's draft tree becomes a validated `Topology` here.

Readers (NCCL XML, hwloc XML, and lspci/sysfs via `readers.pci`) first build plain draft objects
(no ids): sockets, root complexes, switches, devices, and the slots they found. `assemble` is the one
place that decides:
  - ids: `cpu0..` in socket order and `rc0..` in socket order, then the reader's order (root bus
    order); `sw`, `gpu`, `nic`, `ssd`, `nvsw`, `other` numbered per kind in PCI bus-id order (devices
    without an address last, in file order);
  - slots: a device the reader put in a slot (`in_slot=True`, with the port's facts in `slot`), an
    empty slot the reader found (a `Kind.slot` draft), or, where the reader leaves it open
    (`in_slot=None`), every GPU, NIC or SSD whose parent is a root complex or a switch -- except
    soldered modules (`fixed`: SXM/OAM GPUs that have NVLink/xGMI), which stay where they are.
    A slot is named `<parent>-slot<k>` (`slot_id`), k counting the parent's slots in bus order of
    what they hold (an empty slot: the bus behind its port), so the same machine read from
    different sources gets the same slot ids;
  - socket links: every pair of sockets is joined by the CPU's default socket link (a full mesh,
    `socket_mesh`; the coarse dmidecode and nvidia-smi readers use it too, so no scan leaves a
    socket the planner cannot reach);
  - order: nodes parents-first, children in bus order; peer links sorted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pydantic import ValidationError

from moment.errors import MomentError
from moment.topology.model import PLACEABLE, Kind, Link, Topology
from moment.topology.profiles import format_validation_error
from moment.topology.readers._xml_cpu import SocketLinkSpec
from moment.topology.readers._xml_doc import busid_key


def slot_id(parent: str, k: int) -> str:
    """The id of the k-th slot (from 0) under `parent`: the one rule for every reader."""
    return f"{parent}-slot{k}"


def next_slot_id(parent: str, taken: set[str]) -> str:
    """The first `slot_id(parent, k)` not in `taken` (for slots added after the build, e.g. by dmidecode)."""
    k = 0
    while slot_id(parent, k) in taken:
        k += 1
    return slot_id(parent, k)


def socket_mesh(sockets: list[tuple[str, SocketLinkSpec]]) -> list[dict]:
    """The socket links every reader writes: each pair of sockets joined by the first one's assumed link
    (a full mesh). A scan rarely shows these links, but a plan needs them (without one, a socket's
    memory and devices are an island and the placement LP has no solution)."""
    return _clean([{"a": a, "b": b, "kind": spec.kind, "count": spec.count, "gts": spec.gts, "label": spec.label}
                   for i, (a, spec) in enumerate(sockets) for b, _ in sockets[i + 1:]])


PREFIX = {Kind.switch: "sw", Kind.gpu: "gpu", Kind.nic: "nic", Kind.ssd: "ssd", Kind.nvswitch: "nvsw",
          Kind.other: "other"}


@dataclass(eq=False)
class DraftSlot:
    """What a reader knows about a slot (the port it is wired to); unknown fields come from its occupant."""

    pci: str | None = None  # the root or downstream port
    width: int | None = None  # physical lanes
    link: Link | None = None
    label: str | None = None
    designation: str | None = None


@dataclass(eq=False)
class DraftDev:
    """A PCIe function (or switch, or an empty slot: kind `slot`) before ids are known."""

    kind: Kind
    order: int  # position in the file: the tie-break for devices without a bus id
    pci: str | None = None
    gen: int | None = None
    width: int | None = None
    notes: list[str] = field(default_factory=list)  # assumptions about the uplink, shown in the label
    label: str | None = None
    fixed: bool = False  # soldered module: no slot
    link_kind: str = "pcie"  # "internal": no PCIe link (virtual NIC); "none": no uplink at all
    link_bandwidth_gbps: float | None = None
    port: str | None = None  # bus id of the root/downstream port it hangs from (the slot's label)
    fields: dict = field(default_factory=dict)  # model, memory_gib, description, ...
    nvlink_gen: int | None = None  # GPUs: generation of their NVLinks
    in_slot: bool | None = None  # the reader's decision; None = the builder's default rule
    slot: DraftSlot | None = None  # the slot's facts, when the reader knows them (always for kind `slot`)
    uplink: Link | None = None  # a link the reader computed itself (overrides gen/width/notes)
    at: str | None = None  # bus id it is ordered by when it has no `pci` (an empty slot: the bus behind its port)
    children: list[DraftDev] = field(default_factory=list)
    id: str | None = None

    def link(self) -> Link | None:
        if self.uplink is not None:
            return self.uplink
        if self.link_kind == "none":
            return None
        if self.link_kind == "internal":
            return Link(kind="internal", bandwidth_gbps=self.link_bandwidth_gbps, label=self.link_label())
        if self.gen is None or self.width is None:
            return None
        return Link(gen=self.gen, width=self.width, label=self.link_label())

    def link_label(self) -> str | None:
        return "; ".join(self.notes) if self.notes else None


@dataclass(eq=False)
class DraftRc:
    label: str | None = None
    numa: int | None = None  # the NUMA domain it belongs to, when the file says
    children: list[DraftDev] = field(default_factory=list)
    id: str | None = None


@dataclass(eq=False)
class DraftSocket:
    numa: int | None
    model: str | None
    link: SocketLinkSpec
    memory_gib: float | None = None
    default_gen: int = 3  # PCIe generation assumed for links the file does not describe
    rcs: list[DraftRc] = field(default_factory=list)
    loose: list[DraftDev] = field(default_factory=list)  # hung on the socket itself (no PCIe position)
    label: str | None = None
    id: str | None = None


@dataclass
class DraftPeer:
    a: DraftDev | DraftSocket
    b: DraftDev | DraftSocket
    kind: str
    count: int = 1
    gen: int | None = None
    bandwidth_gbps: float | None = None
    label: str | None = None


def walk(devs: list[DraftDev]):
    for d in devs:
        yield d
        yield from walk(d.children)


def all_devs(sockets: list[DraftSocket]) -> list[DraftDev]:
    out: list[DraftDev] = []
    for s in sockets:
        for rc in s.rcs:
            out.extend(walk(rc.children))
        out.extend(walk(s.loose))
    return out


def _natural(s: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def _sorted(devs: list[DraftDev]) -> list[DraftDev]:
    return sorted(devs, key=lambda d: (busid_key(d.pci or d.at), d.order))


def assign_ids(sockets: list[DraftSocket]) -> None:
    rc_no = 0
    for i, s in enumerate(sockets):
        s.id = f"cpu{i}"
        for rc in s.rcs:
            rc.id = f"rc{rc_no}"
            rc_no += 1
    devs = [d for d in all_devs(sockets) if d.kind != Kind.slot]  # slots are named by `slot_id`
    for kind, prefix in PREFIX.items():
        for n, d in enumerate(_sorted([d for d in devs if d.kind == kind])):
            d.id = f"{prefix}{n}"


def _device_node(d: DraftDev, parent: str, with_link: bool = True) -> dict:
    node = {"id": d.id, "kind": d.kind.value, "parent": parent, "pci": d.pci, **d.fields}
    if d.label:
        node["label"] = d.label
    link = d.link() if with_link else None
    if link is not None:
        node["link"] = link.model_dump()
    return node


def _slot_node(slot: DraftSlot, d: DraftDev | None, parent_id: str, slot_no: dict[str, int]) -> dict:
    k = slot_no.get(parent_id, 0)
    slot_no[parent_id] = k + 1
    pci = slot.pci or (d.port if d is not None else None)
    label = slot.label or (f"port {pci}" if pci else f"found holding {d.pci}" if d is not None and d.pci else None)
    link = slot.link
    if link is None and d is not None and d.gen is not None and d.width is not None:
        link = Link(gen=d.gen, width=d.width, label=d.link_label())
    width = slot.width or (link.width if link is not None else None) or (d.width if d is not None else None)
    return {"id": slot_id(parent_id, k), "kind": "slot", "parent": parent_id, "pci": pci, "width": width,
            "label": label, "designation": slot.designation,
            "link": link.model_dump() if link is not None else None}


def _in_slot(d: DraftDev, parent_is_port_owner: bool) -> bool:
    if d.in_slot is not None:
        return d.in_slot
    return parent_is_port_owner and d.kind in PLACEABLE and not d.fixed and d.link() is not None


def _emit(d: DraftDev, parent_id: str, parent_is_port_owner: bool, slot_no: dict[str, int], out: list[dict]):
    if d.kind == Kind.slot:  # an empty slot the reader found
        out.append(_slot_node(d.slot or DraftSlot(), None, parent_id, slot_no))
        return
    if _in_slot(d, parent_is_port_owner):
        slot = _slot_node(d.slot or DraftSlot(), d, parent_id, slot_no)
        out.append(slot)
        out.append(_device_node(d, slot["id"]))
    else:
        out.append(_device_node(d, parent_id))
    for c in _sorted(d.children):
        _emit(c, d.id, d.kind == Kind.switch, slot_no, out)


def assemble(*, name: str, source: str | None, description: str | None, sockets: list[DraftSocket],
             peers: list[DraftPeer]) -> Topology:
    if not sockets:
        raise MomentError("no CPU/socket found, so there is nothing to hang the PCIe tree on", source=source)
    assign_ids(sockets)
    nodes: list[dict] = []
    for s in sockets:
        sock = {"id": s.id, "kind": "socket", "numa": s.numa, "model": s.model, "label": s.label}
        if s.memory_gib is not None:
            sock["memory_gib"] = s.memory_gib
        nodes.append(sock)
    slot_no: dict[str, int] = {}
    try:  # a reader's figure a Link refuses (width x3) is the file's error, like the Topology's own checks
        for s in sockets:
            for rc in s.rcs:
                nodes.append({"id": rc.id, "kind": "root_complex", "parent": s.id, "label": rc.label,
                              "numa": rc.numa})
                for d in _sorted(rc.children):
                    _emit(d, rc.id, True, slot_no, nodes)
            for d in _sorted(s.loose):
                _emit(d, s.id, False, slot_no, nodes)
    except ValidationError as err:
        raise format_validation_error(err, source) from None
    links = socket_mesh([(s.id, s.link) for s in sockets])
    peer_links = []
    for p in peers:
        a, b = sorted([p.a.id, p.b.id], key=_natural)
        peer_links.append({"a": a, "b": b, "kind": p.kind, "count": p.count, "gen": p.gen,
                           "bandwidth_gbps": p.bandwidth_gbps, "label": p.label})
    peer_links.sort(key=lambda lk: (lk["kind"], _natural(lk["a"]), _natural(lk["b"])))
    data = {"name": name, "description": description, "source": source, "nodes": _clean(nodes),
            "links": _clean(links + peer_links)}
    try:
        return Topology.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err, source) from None


def _clean(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in it.items() if v is not None} for it in items]


def merge_peer(peers: dict[tuple[int, int, str], DraftPeer], p: DraftPeer) -> None:
    """Keep one link per unordered pair and kind; files list both directions (A->B and B->A)."""
    key = (*sorted((id(p.a), id(p.b))), p.kind)
    old = peers.get(key)
    if old is None or p.count > old.count:
        peers[key] = p

