"""The typed machine model: a PCIe forest under CPU sockets, plus peer links (UPI/QPI, NVLink, xGMI).

A socket is a CPU package. A NUMA domain is not a node: a socket split into several (AMD NPS2/NPS4,
Intel SNC) keeps one root complex per domain, each with the domain's id in `numa` (`numa_domains`).

Every node except a socket has exactly one `parent` and describes its uplink to that parent in
`link`; peer links that do not follow the tree live in `Topology.links`. This flat form is both
what the code walks and what a person writes in a YAML profile.
"""

from __future__ import annotations

from enum import Enum
from functools import cache, cached_property
from typing import Annotated, Literal, NamedTuple

from pydantic import ConfigDict, Field, field_validator, model_validator

from moment.requests import NoTruthValueForANumber
from moment.topology import bandwidth as bw
from moment.topology.readers import _xml_cpu as cpus


class Kind(str, Enum):
    socket = "socket"
    root_complex = "root_complex"
    switch = "switch"
    slot = "slot"
    gpu = "gpu"
    ssd = "ssd"
    nic = "nic"
    nvswitch = "nvswitch"
    other = "other"


#: Kinds that can sit in a slot and be moved by the planner.
PLACEABLE = (Kind.gpu, Kind.ssd, Kind.nic)
#: each of them as a sentence names one ("an SSD")
A_KIND = {Kind.gpu: "a GPU", Kind.ssd: "an SSD", Kind.nic: "a NIC"}
DEVICE_KINDS = (Kind.gpu, Kind.ssd, Kind.nic, Kind.nvswitch, Kind.other)


class _Strict(NoTruthValueForANumber):
    # a rate, size or share of .inf or .nan is never a figure of real hardware
    model_config = ConfigDict(extra="forbid", frozen=False, use_enum_values=False, allow_inf_nan=False)


def _pcie_width(v: int | None) -> int | None:
    if v is not None and v not in bw.PCIE_WIDTHS:
        raise ValueError(f"a PCIe width is one of {', '.join(f'x{w}' for w in bw.PCIE_WIDTHS)}, got x{v}")
    return v


class Link(_Strict):
    """A node's uplink to its parent. PCIe by default; `bandwidth_gbps` overrides the table."""

    kind: Literal["pcie", "internal"] = "pcie"
    gen: int | None = Field(default=None, description="PCIe generation 1-6")
    width: int | None = Field(default=None, description="lanes (x1..x32)")
    bandwidth_gbps: float | None = Field(
        default=None, description="measured or known one-direction bandwidth in GB/s; overrides gen x width"
    )
    label: str | None = Field(default=None, description="e.g. 'Bus 11' as a diagram names it")

    @field_validator("gen")
    @classmethod
    def _gen(cls, v: int | None) -> int | None:
        if v is not None and v not in bw.PCIE_GENERATIONS:
            raise ValueError(f"PCIe generation must be 1-6, got {v}")
        return v

    @field_validator("width")
    @classmethod
    def _width(cls, v: int | None) -> int | None:
        return _pcie_width(v)

    @field_validator("bandwidth_gbps")
    @classmethod
    def _bw(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"bandwidth must be positive, got {v}")
        return v

    @model_validator(mode="after")
    def _complete(self) -> Link:
        if self.kind == "pcie" and self.bandwidth_gbps is None and (self.gen is None or self.width is None):
            raise ValueError("a PCIe link needs gen and width, or bandwidth_gbps")
        return self

    @property
    def running_gen(self) -> int | None:
        """The PCIe generation the link runs at: its `gen`, or the lower one its CPU drives (`CappedLink`)."""
        return self.gen

    @property
    def capped_by(self) -> str | None:
        """The CPU that holds this link below its `gen` (None where it runs at its `gen`)."""
        return None

    def bandwidth(self) -> float:
        """One-direction bytes/s (infinite for an internal link with no figure)."""
        if self.bandwidth_gbps is not None:
            return self.bandwidth_gbps * bw.GB
        if self.kind == "internal":
            return float("inf")
        assert self.gen is not None and self.width is not None
        return bw.pcie_bytes(self.running_gen, self.width)

    def describe(self) -> str:
        if self.kind == "internal" and self.bandwidth_gbps is None:
            return "internal"
        base = f"PCIe {self.running_gen}.0 x{self.width}" if self.gen and self.width else "link"
        if self.capped_by is not None:
            base += f" (capped from {self.gen}.0 by the CPU)"
        if self.bandwidth_gbps is not None:
            base += f" ({self.bandwidth_gbps:g} GB/s measured)"
        return base


class CappedLink(Link):
    """A root port's link whose `gen` its CPU cannot drive: it trains at the CPU's generation. Made by the
    topology's validation (`_cap_root_ports`) in place of the link written; a topology's data (`model_dump`, a
    profile written out) keep the link as written (the fields below are not the field type's, so they are not
    dumped), and every topology made from them is capped again."""

    cpu_gen: int
    cpu: str  # the CPU and its socket, for notes: "Xeon E5-2680 v4 of socket 'cpu0'"

    @property
    def running_gen(self) -> int | None:
        return min(self.gen, self.cpu_gen) if self.gen is not None else None

    @property
    def capped_by(self) -> str | None:
        return self.cpu


class PeerLink(_Strict):
    """A link outside the PCIe tree: UPI/QPI between sockets, NVLink/xGMI between GPUs or slots (which ends
    each kind may join: `_link_ends_fit`)."""

    a: str
    b: str
    kind: Literal["upi", "qpi", "nvlink", "xgmi", "pcie"]
    count: int = Field(default=1, ge=1, description="parallel links (UPI links, NVLink lanes)")
    gen: int | None = Field(default=None, description="NVLink generation or PCIe generation")
    gts: float | None = Field(default=None, description="UPI/QPI transfer rate in GT/s")
    width: int | None = None
    bandwidth_gbps: float | None = Field(default=None, description="one-direction GB/s; overrides the table")
    label: str | None = None

    @field_validator("bandwidth_gbps", "gts")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        if v is not None and not v > 0:
            raise ValueError(f"must be positive, got {v}")
        return v

    @field_validator("width")
    @classmethod
    def _width(cls, v: int | None) -> int | None:
        return _pcie_width(v)

    @model_validator(mode="after")
    def _generation(self) -> PeerLink:
        table = {"nvlink": bw.NVLINK_PER_LINK, "pcie": bw.PCIE_GENERATIONS}.get(self.kind)
        if self.gen is not None and table is not None and self.gen not in table:
            raise ValueError(f"{self.describe()} generation must be one of {sorted(table)}, got {self.gen}")
        return self

    def bandwidth(self) -> float:
        if self.bandwidth_gbps is not None:
            return self.bandwidth_gbps * bw.GB
        if self.kind == "upi":
            return bw.socket_link_bytes(self.gts or bw.DEFAULT_UPI_GTS, self.count)
        if self.kind == "qpi":
            return bw.socket_link_bytes(self.gts or bw.DEFAULT_QPI_GTS, self.count)
        if self.kind == "nvlink":
            return bw.nvlink_bytes(self.gen or 3, self.count)
        if self.kind == "xgmi":
            return bw.XGMI_PER_LINK * self.count
        return bw.pcie_bytes(*self._pcie())

    def wire_bytes(self) -> float:
        """What the link carries by its kind, count and rate, whatever `bandwidth_gbps` says (PCIe: on the wire,
        before its protocol's overhead): a measured figure above it is a what-if or a mistake (moment.topology.checks)."""
        if self.kind == "pcie":
            return bw.pcie_wire_bytes(*self._pcie())
        return self.model_copy(update={"bandwidth_gbps": None}).bandwidth()

    def _pcie(self) -> tuple[int, int]:
        """A PCIe peer link's generation and width (4.0 x16 where not given)."""
        return self.gen or 4, self.width or 16

    def describe(self) -> str:
        name = {"upi": "UPI", "qpi": "QPI", "nvlink": "NVLink", "xgmi": "xGMI", "pcie": "PCIe"}[self.kind]
        return f"{name} x{self.count}" if self.count > 1 else name


class _NodeBase(_Strict):
    id: str = Field(min_length=1)
    label: str | None = None
    parent: str | None = None
    link: Link | None = None
    pci: str | None = Field(default=None, description="PCI bus address, e.g. 0000:17:00.0")
    numa: int | None = None
    pci_ids: str | None = Field(default=None, description="vendor:device ids as scanned, e.g. 10de:2330")
    pci_class: str | None = Field(default=None, description="PCI class (class, subclass) as scanned, e.g. 0x0302")


class Socket(_NodeBase):
    kind: Literal[Kind.socket] = Kind.socket
    model: str | None = None
    memory_gib: float = Field(default=256.0, ge=0)
    memory_bandwidth_gbps: float = Field(default=150.0, gt=0, description="DRAM read bandwidth, GB/s")


class RootComplex(_NodeBase):
    kind: Literal[Kind.root_complex] = Kind.root_complex


class Switch(_NodeBase):
    kind: Literal[Kind.switch] = Kind.switch
    model: str | None = None


class Slot(_NodeBase):
    kind: Literal[Kind.slot] = Kind.slot
    width: int = Field(default=16, description="physical (mechanical) lanes: 4, 8, 16")

    @field_validator("width")
    @classmethod
    def _width(cls, v: int) -> int:
        return _pcie_width(v)
    accepts: list[Kind] = Field(default_factory=lambda: [Kind.gpu, Kind.ssd, Kind.nic])
    blocks: list[str] = Field(
        default_factory=list, description="slots a double-width card in this slot covers"
    )
    designation: str | None = Field(default=None, description="name printed on the board / by dmidecode")
    board: str | None = Field(default=None, description="e.g. 'front' for a U.2 backplane bay")


class Gpu(_NodeBase):
    kind: Literal[Kind.gpu] = Kind.gpu
    model: str = "gpu"
    memory_gib: float = Field(default=40.0, ge=0)
    hbm_gbps: float = Field(default=1555.0, gt=0)
    double_width: bool = True


class Ssd(_NodeBase):
    kind: Literal[Kind.ssd] = Kind.ssd
    model: str = "nvme"
    read_gbps: float = Field(default=6.5, gt=0, description="sequential/large random read, GB/s")
    capacity_gb: float = Field(default=3840.0, gt=0)


class Nic(_NodeBase):
    kind: Literal[Kind.nic] = Kind.nic
    model: str | None = None


class NvSwitch(_NodeBase):
    kind: Literal[Kind.nvswitch] = Kind.nvswitch


class Other(_NodeBase):
    kind: Literal[Kind.other] = Kind.other
    description: str | None = None


Node = Annotated[
    Socket | RootComplex | Switch | Slot | Gpu | Ssd | Nic | NvSwitch | Other, Field(discriminator="kind")
]

_ALLOWED_PARENTS: dict[Kind, tuple[Kind, ...]] = {
    Kind.root_complex: (Kind.socket,),
    Kind.switch: (Kind.root_complex, Kind.switch),
    Kind.slot: (Kind.root_complex, Kind.switch),
    Kind.gpu: (Kind.slot, Kind.switch, Kind.root_complex),
    Kind.ssd: (Kind.slot, Kind.switch, Kind.root_complex),
    Kind.nic: (Kind.slot, Kind.switch, Kind.root_complex),
    Kind.nvswitch: (Kind.slot, Kind.switch, Kind.root_complex, Kind.socket),
    Kind.other: (Kind.slot, Kind.switch, Kind.root_complex, Kind.socket),
}


class NamedLayout(_Strict):
    """A reference placement ("the usual layout"): slots in order of preference per device kind.

    With fewer devices than listed slots, the first ones are used, so one list serves 2 or 4 GPUs.
    """

    description: str = ""
    gpu: list[str] = Field(default_factory=list)
    ssd: list[str] = Field(default_factory=list)


def _check_sockets_joined(nodes: list, links: list[PeerLink]) -> None:
    """Every socket must reach every other over socket-to-socket links: without one, a socket's memory and
    devices are an island and the placement LP has no solution, which says nothing about the cause."""
    parent = {n.id: n.id for n in nodes if n.kind == Kind.socket}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for lk in links:
        if lk.a in parent and lk.b in parent:
            parent[root(lk.b)] = root(lk.a)
    groups: dict[str, list[str]] = {}
    for s in parent:
        groups.setdefault(root(s), []).append(s)
    if len(groups) > 1:
        first, *rest = groups.values()
        other = [s for g in rest for s in g]
        a, b = first[-1], other[0]
        raise ValueError(
            f"sockets {', '.join(first)} and {', '.join(other)} are not connected "
            f"(no socket link joins them): add a `links:` entry such as {{a: {a}, b: {b}, kind: upi, count: 2}} "
            "(kind: xgmi for AMD EPYC, qpi for older Xeons)")


def _gpu_end(n) -> bool:
    """A GPU, or a slot that takes one (a bridge sits on the cards, so an SSD-only bay is never an end)."""
    return n.kind == Kind.gpu or (n.kind == Kind.slot and Kind.gpu in n.accepts)


def _link_ends_fit(kind: str, a, b) -> bool:
    """Whether a peer link of this kind can join these two nodes (what each kind is, not what a file says):
    UPI/QPI join sockets; xGMI joins sockets, or GPUs (and GPU slots) with each other or with a socket;
    NVLink joins GPUs, GPU slots and NVSwitches, or a GPU with an NVLink CPU socket (POWER9, Grace);
    a PCIe peer link (a cable or a non-transparent bridge) joins switches and root complexes."""
    ends = (a, b)
    sockets = sum(n.kind == Kind.socket for n in ends)
    if kind in ("upi", "qpi"):
        return sockets == 2
    if kind == "xgmi":
        return sockets == 2 or all(n.kind == Kind.socket or _gpu_end(n) for n in ends)
    if kind == "nvlink":
        if sockets:
            return sockets == 1 and any(n.kind == Kind.gpu for n in ends)
        return all(_gpu_end(n) or n.kind == Kind.nvswitch for n in ends)
    return all(n.kind in (Kind.switch, Kind.root_complex) for n in ends)


_LINK_ENDS = {
    "upi": "a UPI link joins two CPU sockets",
    "qpi": "a QPI link joins two CPU sockets",
    "xgmi": "an xGMI link joins two CPU sockets, or GPUs (or slots that take GPUs) with each other or a socket",
    "nvlink": "an NVLink joins GPUs, slots that take GPUs (a bridge) and NVSwitches, or a GPU with its socket",
    "pcie": "a PCIe peer link joins PCIe switches and root complexes (the tree's own links are each node's link:)",
}


def _check_link_ends(i: int, link: PeerLink, a, b) -> None:
    if _link_ends_fit(link.kind, a, b):
        return

    def what(n) -> str:
        if n.kind == Kind.slot:
            takes = ", ".join(k.value for k in n.accepts) or "nothing"
            return f"slot {n.id!r} (accepts {takes})"
        return f"{n.kind.value} {n.id!r}"

    raise ValueError(f"links[{i}] ({link.kind}) joins {what(a)} to {what(b)}: {_LINK_ENDS[link.kind]}")


def socket_cpu(socket) -> cpus.CpuId:
    """The CPU a socket's `model` names (an empty identity where it names none)."""
    return _cpu(socket.model)


@cache
def _cpu(model: str | None) -> cpus.CpuId:
    """(asked once a model string: every topology is validated, and the names are matched by pattern)"""
    return cpus.from_socket_model(model)


class GenCap(NamedTuple):
    """The highest PCIe generation a link at a root port runs at: its CPU's (`_cap_root_ports`)."""

    gen: int
    model: str  # the socket's CPU, as its `model` names it
    socket: str

    def describe(self) -> str:
        return f"{self.model} of socket {self.socket!r}"


def _root_port_caps(nodes: list) -> dict[str, GenCap]:
    """Root complex id -> the generation of the CPU above it, where the socket's model names one."""
    driven = {}  # socket -> its CPU's PCIe generation, where its model names one
    for n in nodes:
        if n.kind == Kind.socket and (gen := cpus.pcie_gen(socket_cpu(n))) is not None:
            driven[n.id] = GenCap(gen, n.model, n.id)
    return {n.id: driven[n.parent] for n in nodes if n.kind == Kind.root_complex and n.parent in driven}


def gen_caps(topo: Topology) -> dict[str, GenCap]:
    """Node id -> the highest PCIe generation its uplink runs at, for every node at a root port whose CPU is known:
    a `gen` above it is planned at it (a what-if asking for more changes nothing)."""
    ports = _root_port_caps(topo.nodes)
    return {n.id: ports[n.parent] for n in topo.nodes if n.parent in ports and n.link is not None
            and n.link.kind == "pcie"}


def _cap_root_ports(nodes: list) -> None:
    """A link at a root port runs at most at the PCIe generation its CPU drives (link training settles on the
    lower end's): a hand-written 'PCIe 5.0' slot under a 'Xeon E5-2680 v4' (PCIe 3.0) was planned 3.8x too
    fast. Such a link becomes a `CappedLink`: it keeps the `gen` written (a what-if asks for it, a virtual
    machine reports it) and runs at the CPU's; the plan notes it (`moment.topology.checks`). A switch's
    downstream links are the switch's to drive, not the CPU's."""
    ports = _root_port_caps(nodes)
    if not ports:
        return
    for i, n in enumerate(nodes):
        link = n.link
        if n.parent not in ports or link is None or link.kind != "pcie" or link.gen is None:
            continue
        cap = ports[n.parent]
        if link.gen > cap.gen:
            if isinstance(link, CappedLink) and (link.cpu_gen, link.cpu) == (cap.gen, cap.describe()):
                continue  # (validated again: capped already)
            link = CappedLink(**_as_written(link), cpu_gen=cap.gen, cpu=cap.describe())
        elif isinstance(link, CappedLink):  # (a node object met again, under another CPU)
            link = Link(**_as_written(link))
        else:
            continue
        nodes[i] = n.model_copy(update={"link": link})  # a copy: one given to another topology keeps its own link


def _as_written(link: Link) -> dict:
    """A link's own fields (a `CappedLink`'s cap left out)."""
    return {k: getattr(link, k) for k in Link.model_fields}


def widest_uplink(node, parent) -> tuple[int, str | None]:
    """The most lanes `node`'s uplink to `parent` may have, and the slot that holds it to that (None: none does,
    the widest PCIe link): a slot's own link, and the card's in it, fit the slot's lanes (a wider one is refused)."""
    for s in (node, parent):
        if s is not None and s.kind == Kind.slot:
            return s.width, s.id
    return max(bw.PCIE_WIDTHS), None


class Topology(_Strict):
    """A machine: nodes in a PCIe forest under sockets, and peer links."""

    name: str = Field(min_length=1)
    description: str | None = None
    source: str | None = Field(default=None, description="where this description came from")
    nodes: list[Node]
    links: list[PeerLink] = Field(default_factory=list)
    layouts: dict[str, NamedLayout] = Field(
        default_factory=dict, description="reference placements shown as baselines (e.g. the paper's a-d)"
    )
    ssd_read_scale: float | None = Field(
        default=None, gt=0, le=1,
        description="effective / rated read rate of every SSD (set by a calibration); None = rated")

    @model_validator(mode="after")
    def _check_structure(self) -> Topology:
        seen: dict[str, _NodeBase] = {}
        for n in self.nodes:
            if n.id in seen:
                raise ValueError(f"node id {n.id!r} is used twice")
            seen[n.id] = n
        if not any(n.kind == Kind.socket for n in self.nodes):
            raise ValueError("a topology needs at least one socket")
        for n in self.nodes:
            if n.kind == Kind.socket:
                if n.parent is not None:
                    raise ValueError(f"socket {n.id!r} cannot have a parent")
                continue
            if n.parent is None:
                raise ValueError(f"{n.kind.value} {n.id!r} has no parent (every non-socket node needs one)")
            if n.parent not in seen:
                raise ValueError(f"{n.kind.value} {n.id!r}: parent {n.parent!r} does not exist")
            pk = seen[n.parent].kind
            if pk not in _ALLOWED_PARENTS[n.kind]:
                raise ValueError(f"{n.kind.value} {n.id!r} cannot hang under {pk.value} {n.parent!r}")
            if n.kind == Kind.slot:
                occupants = [m for m in self.nodes if m.parent == n.id]
                if len(occupants) > 1:
                    raise ValueError(f"slot {n.id!r} holds {len(occupants)} devices; a slot holds one")
                for m in (n, *occupants):
                    most, _ = widest_uplink(m, seen[m.parent])
                    if m.link is not None and m.link.width is not None and m.link.width > most:
                        slot = "the slot" if m is n else f"its slot {n.id!r}"
                        raise ValueError(f"{m.kind.value} {m.id!r}: link.width x{m.link.width} is wider than "
                                         f"{slot} (width x{most})")
                for b in n.blocks:
                    if b not in seen or seen[b].kind != Kind.slot:
                        raise ValueError(f"slot {n.id!r} blocks {b!r}, which is not a slot")
                    if b == n.id:  # (the slot then counted as taken by itself: the plan blamed widths)
                        raise ValueError(f"slot {n.id!r} blocks itself: blocks names the other slots a wide card covers")
            if n.kind in (Kind.switch, Kind.slot, *PLACEABLE) and n.link is None and seen[n.parent].kind != Kind.slot:
                raise ValueError(f"{n.kind.value} {n.id!r} needs a link (gen/width) to its parent {n.parent!r}")
        # cycles: every chain of parents must end at a socket
        for n in self.nodes:
            steps, cur = 0, n
            while cur.parent is not None:
                cur = seen[cur.parent]
                steps += 1
                if steps > len(self.nodes):
                    raise ValueError(f"node {n.id!r} is part of a parent cycle")
        for i, link in enumerate(self.links):
            for end in (link.a, link.b):
                if end not in seen:
                    raise ValueError(f"links[{i}] ({link.kind}) names {end!r}, which is not a node")
            if link.a == link.b:
                raise ValueError(f"links[{i}] ({link.kind}) connects {link.a!r} to itself")
            _check_link_ends(i, link, seen[link.a], seen[link.b])
        _check_sockets_joined(self.nodes, self.links)
        _cap_root_ports(self.nodes)
        for name, lay in self.layouts.items():
            for kind, slots in ((Kind.gpu, lay.gpu), (Kind.ssd, lay.ssd)):
                for i, slot_id in enumerate(slots):
                    if slot_id not in seen or seen[slot_id].kind != Kind.slot:
                        raise ValueError(f"layout {name!r} names {slot_id!r}, which is not a slot")
                    if slot_id in slots[:i]:
                        raise ValueError(f"layout {name!r} names slot {slot_id!r} twice in its {kind.value} list "
                                         "(a slot holds one device)")
                    if kind not in seen[slot_id].accepts:
                        takes = ", ".join(k.value for k in seen[slot_id].accepts) or "nothing"
                        raise ValueError(f"layout {name!r} puts a {kind.value} in slot {slot_id!r}, which accepts "
                                         f"only {takes}")
        return self

    # ---- navigation -------------------------------------------------------------------------------
    @cached_property
    def _index(self) -> dict[str, _NodeBase]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def _children(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            if n.parent is not None:
                out[n.parent].append(n.id)
        return out

    def node(self, node_id: str):
        try:
            return self._index[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in topology {self.name!r}") from None

    def has(self, node_id: str) -> bool:
        return node_id in self._index

    def children(self, node_id: str) -> list[str]:
        return self._children[node_id]

    def of_kind(self, kind: Kind | str) -> list:
        k = Kind(kind)
        return [n for n in self.nodes if n.kind == k]

    def ancestors(self, node_id: str) -> list[str]:
        """Parents from the node's own parent up to its socket."""
        out, cur = [], self.node(node_id)
        while cur.parent is not None:
            out.append(cur.parent)
            cur = self.node(cur.parent)
        return out

    def socket_of(self, node_id: str) -> str:
        n = self.node(node_id)
        return n.id if n.kind == Kind.socket else self.ancestors(node_id)[-1]

    def numa_domains(self, socket_id: str) -> list[int]:
        """The NUMA domains of a socket: its root complexes' `numa`, else the socket's own (empty if unknown)."""
        rcs = {self.node(c).numa for c in self.children(socket_id) if self.node(c).kind == Kind.root_complex}
        own = self.node(socket_id).numa
        return sorted(rcs - {None}) or ([own] if own is not None else [])

    def root_complex_of(self, node_id: str) -> str | None:
        for a in [node_id, *self.ancestors(node_id)]:
            if self.node(a).kind == Kind.root_complex:
                return a
        return None

    def occupant(self, slot_id: str):
        kids = self.children(slot_id)
        return self.node(kids[0]) if kids else None

    def empty_slots(self) -> list[Slot]:
        return [s for s in self.of_kind(Kind.slot) if not self.children(s.id)]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.kind.value] = out.get(n.kind.value, 0) + 1
        return out
