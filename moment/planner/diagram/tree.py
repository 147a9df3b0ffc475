"""What the diagram shows, before geometry: one box per thing a person cares about.

A slot and the card in it are one box (the card's name, its slot, and for a GPU the bandwidth it
receives); the empty slots under one parent are one box; NVSwitches are one box where they hang and
one fabric bar beside the GPUs. Each box's link to its parent carries the busiest direction's
utilisation from the LP solution and whether it is a bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moment.planner.contracts import LinkUse
from moment.topology.model import Kind, Topology

#: boxes drawn in the right-hand device column
LEAF_KINDS = ("gpu", "ssd", "nic", "other", "empty", "nvswitch")
_KIND_WORD = {"socket": "CPU socket", "root_complex": "root complex", "switch": "PCIe switch"}
#: a link's own label (e.g. the paper's "Bus 11") is shown only when this short
SHORT_LABEL = 14


@dataclass
class Edge:
    """The link from a box to its parent: utilisation None = carries no reads."""

    util: float | None = None
    capacity_gbps: float | None = None
    bottleneck: bool = False
    label: str = ""

    def text(self, compact: bool = False) -> str:
        """'62% of 27.1 GB/s'; compact: '62%' (a saturated link always shows its capacity)."""
        if self.util is None or self.capacity_gbps is None:
            return ""
        pct = "100%" if self.bottleneck else f"{min(self.util, 0.99):.0%}"
        core = pct if compact and not self.bottleneck else f"{pct} of {self.capacity_gbps:.1f} GB/s"
        prefix = f"{self.label}: " if self.label and len(self.label) <= SHORT_LABEL else ""
        return ("⚠ " if self.bottleneck else "") + prefix + core


@dataclass
class Box:
    id: str
    kind: str  # a Kind value, or "empty" for a group of empty slots
    title: str  # first line, bold: the full name
    detail: str  # second line
    parent: str | None
    edge: Edge = field(default_factory=Edge)
    children: list[str] = field(default_factory=list)
    limit: bool = False  # the box itself limits the epoch (an SSD or memory at its read limit)
    stands_for: tuple[str, ...] = ()  # topology node ids this box draws (slot + card, grouped slots)

    @property
    def leaf(self) -> bool:
        return self.kind in LEAF_KINDS


@dataclass
class PeerEdge:
    a: str  # box ids
    b: str
    kind: str
    name: str  # "UPI x3", "NVLink x2"
    util: float | None
    bottleneck: bool


@dataclass
class Tree:
    boxes: dict[str, Box]
    roots: list[str]  # sockets, in order
    peers: list[PeerEdge]  # links outside the tree, between boxes
    fabric: list[tuple[str, float | None, bool]]  # GPUs on an NVSwitch fabric: (box, util, bottleneck)
    fabric_lines: list[str] = field(default_factory=list)  # what the fabric is, for its label
    box_of: dict[str, str] = field(default_factory=dict)  # topology node id -> box id


class _Loads:
    """The LP's link loads, looked up by the hardware pair they join (either direction)."""

    def __init__(self, links: list[LinkUse]):
        self.pair: dict[frozenset, LinkUse] = {}
        self.reads: dict[str, LinkUse] = {}  # storage owner (ssd3, gpu0, cpu1) -> its read limit row
        for lu in links:
            if lu.id.endswith(":read"):
                self.reads[lu.dst] = lu
                continue
            key = frozenset((lu.src, lu.dst))
            if key not in self.pair or lu.utilisation > self.pair[key].utilisation:
                self.pair[key] = lu

    def busiest(self, *pairs: tuple[str, str]) -> LinkUse | None:
        found = [self.pair[frozenset(p)] for p in pairs if frozenset(p) in self.pair]
        return max(found, key=lambda lu: lu.utilisation) if found else None


def _edge(lu: LinkUse | None, label: str | None) -> Edge:
    if lu is None:
        return Edge()
    return Edge(lu.utilisation, lu.capacity_gbps, lu.bottleneck, label or lu.label or "")


def build_tree(topo: Topology, links: list[LinkUse], inlet: dict[str, float] | None = None) -> Tree:
    loads = _Loads(links)
    inlet = inlet or {}
    boxes: dict[str, Box] = {}
    box_of: dict[str, str] = {}

    def add(box: Box) -> None:
        boxes[box.id] = box
        for nid in box.stands_for or (box.id,):
            box_of[nid] = box.id
        if box.parent is not None:
            boxes[box.parent].children.append(box.id)

    def device_box(dev, parent: str, slot) -> Box:
        pairs = [(dev.id, slot.id), (slot.id, parent)] if slot is not None else [(dev.id, parent)]
        link_label = (slot.link.label if slot is not None and slot.link else None) or (
            dev.link.label if dev.link else None)
        model = getattr(dev, "model", None) or dev.label or ""
        title = f"{dev.id}  {model}".strip()
        where = slot.id if slot is not None else ""
        limit = False
        if dev.kind == Kind.gpu:
            gbps = inlet.get(dev.id)
            detail = f"in {gbps:.2f} GB/s" if gbps is not None else "GPU"
        elif dev.kind == Kind.ssd:
            read = loads.reads.get(dev.id) or loads.busiest((dev.id, slot.id if slot is not None else parent))
            limit = bool(read and read.bottleneck and read.id.endswith(":read"))
            if read is None:
                detail = "no reads"
            else:
                detail = f"⚠ read {read.load_gbps:.2f} GB/s (its limit)" if limit else \
                    f"read {read.load_gbps:.2f} GB/s"
        else:
            detail = dev.kind.value.upper() if dev.kind == Kind.nic else dev.kind.value
        detail = f"{detail} · {where}" if where else detail
        stands = (dev.id, slot.id) if slot is not None else (dev.id,)
        return Box(dev.id, dev.kind.value, title, detail, parent,
                   _edge(loads.busiest(*pairs), link_label), limit=limit, stands_for=stands)

    def visit(nid: str, parent: str | None) -> None:
        n = topo.node(nid)
        detail = _KIND_WORD.get(n.kind.value, n.kind.value)
        limit = False
        if n.kind == Kind.socket:
            mem = loads.reads.get(n.id)
            if mem is not None and mem.load_gbps > 0.005:
                limit = mem.bottleneck
                detail = ("⚠ " if limit else "") + f"DRAM read {mem.load_gbps:.1f} GB/s"
        pairs = [(n.id, parent)] if parent is not None else []
        edge = _edge(loads.busiest(*pairs), n.link.label if n.link else None) if pairs else Edge()
        add(Box(n.id, n.kind.value, n.id, detail, parent, edge, limit=limit))
        kids = topo.children(nid)
        empty = [k for k in kids if topo.node(k).kind == Kind.slot and not topo.children(k)]
        nvsw = [k for k in kids if topo.node(k).kind == Kind.nvswitch]
        # devices and switches first, in topology order; grouped empty slots and NVSwitches last
        for k in sorted(kids, key=lambda k: (k in empty, k in nvsw)):
            kn = topo.node(k)
            if k in empty:
                if k == empty[0]:
                    add(_group_empty(topo, nid, empty))
            elif k in nvsw:
                if k == nvsw[0]:
                    add(_group_nvswitch(nid, nvsw))
            elif kn.kind == Kind.slot:
                add(device_box(topo.node(topo.children(k)[0]), nid, kn))
            elif kn.kind in (Kind.gpu, Kind.ssd, Kind.nic):
                add(device_box(kn, nid, None))
            else:
                visit(k, nid)

    roots = [s.id for s in topo.of_kind(Kind.socket)]
    for r in roots:
        visit(r, None)
    peers, fabric, fabric_lines = _peers(topo, loads, box_of)
    return Tree(boxes, roots, peers, fabric, fabric_lines, box_of)


def _group_empty(topo: Topology, parent: str, slots: list[str]) -> Box:
    widths: dict[int, int] = {}
    for s in slots:
        w = topo.node(s).width
        widths[w] = widths.get(w, 0) + 1
    n = len(slots)
    detail = ", ".join(f"{c} × x{w}" for w, c in sorted(widths.items(), reverse=True))
    return Box(f"empty:{parent}", "empty", f"{n} empty slot{'s' if n > 1 else ''}", detail, parent,
               stands_for=tuple(slots))


def _group_nvswitch(parent: str, ids: list[str]) -> Box:
    n = len(ids)
    detail = ", ".join(ids) if n <= 2 else f"{ids[0]} … {ids[-1]}"
    return Box(f"nvswitches:{parent}", "nvswitch", f"{n} NVSwitch{'es' if n > 1 else ''}", detail, parent,
               stands_for=tuple(ids))


def _peers(topo: Topology, loads: _Loads, box_of: dict[str, str]):
    """Socket links and GPU-to-GPU links as peer edges; NVSwitch links folded into one fabric."""
    nvsw = {n.id for n in topo.of_kind(Kind.nvswitch)}
    peers: list[PeerEdge] = []
    seen: dict[tuple, int] = {}
    fabric: dict[str, tuple[float | None, bool]] = {}
    for lk in topo.links:
        # a link between slots is loaded between the cards in them (the boxes' ids)
        lu = loads.busiest((lk.a, lk.b)) or loads.busiest((box_of.get(lk.a, lk.a), box_of.get(lk.b, lk.b)))
        util = lu.utilisation if lu else None
        neck = bool(lu and lu.bottleneck)
        if lk.a in nvsw or lk.b in nvsw:
            gpu = lk.b if lk.a in nvsw else lk.a
            if gpu in box_of:
                u0, n0 = fabric.get(box_of[gpu], (None, False))
                fabric[box_of[gpu]] = (max((x for x in (u0, util) if x is not None), default=None), n0 or neck)
            continue
        a, b = box_of.get(lk.a), box_of.get(lk.b)
        if a is None or b is None or a == b:
            continue
        key = (min(a, b), max(a, b), lk.kind)
        if key in seen:  # parallel links between the same boxes: one line, the busiest
            prev = peers[seen[key]]
            if util is not None and (prev.util is None or util > prev.util):
                prev.util, prev.bottleneck = util, neck
            continue
        seen[key] = len(peers)
        peers.append(PeerEdge(a, b, lk.kind, lk.describe(), util, neck))
    lines: list[str] = []
    if fabric:
        per_gpu: dict[str, int] = {}
        for lk in topo.links:
            if (lk.a in nvsw) != (lk.b in nvsw):
                g = lk.b if lk.a in nvsw else lk.a
                per_gpu[g] = per_gpu.get(g, 0) + lk.count
        busiest = max((u for u, _ in fabric.values() if u is not None), default=None)
        lines = ["NVLink fabric", f"{len(nvsw)} NVSwitches", f"{max(per_gpu.values())} links per GPU",
                 f"busiest link {busiest:.0%}" if busiest is not None else "no reads"]
    order = list(box_of.values())
    return peers, sorted(((b, u, n) for b, (u, n) in fabric.items()), key=lambda t: order.index(t[0])), lines
