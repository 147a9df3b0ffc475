"""The capacity graph of paper section 3.2, built from a populated Topology.

Storage nodes (`hbm:<gpu>`, `mem:<socket>`, each SSD) feed the interconnect; GPUs are the sinks.
Every PCIe tree link becomes two directed edges (full duplex, each at the one-direction rate), so
upstream and downstream traffic on a bus do not compete. A GPU is a pure sink: what leaves a GPU
(peer reads of its HBM) leaves from its `hbm:` node, so no flow can transit *through* a GPU, which
no real read path does. Edges that no storage->GPU path can use (empty slots, NICs, an SSD's
downstream direction) are dropped: reads never load them.

`ChassisTemplate` builds the same network for many placements on one bare chassis without going
through pydantic (`populate`), which is what makes the search cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress

import numpy as np
from typing import NamedTuple

from moment.errors import MomentError
from moment.topology.bandwidth import GB
from moment.topology.devices import bridge_group, card_link, find_model, ssd_read_bytes, trained_link
from moment.topology.model import PLACEABLE, Kind, Link, Topology
from moment.workload.spec import WorkloadSpec

TIER_GPU = "gpu-cache"
TIER_CPU = "cpu-mem"
TIER_SSD = "ssd"
INF = math.inf
#: the relaxed sink and sources standing for the devices a partial placement has not placed (`Rest`)
REST_GPU = "gpu:rest"
REST_SSD = "ssd:rest"


class Edge(NamedTuple):
    """One direction of one physical link. `u`/`v` are graph nodes; `src`/`dst` name the hardware
    (they differ only for a GPU's outbound direction, whose graph tail is its `hbm:` node)."""

    u: str
    v: str
    capacity: float  # bytes/s, one direction; INF = no limit
    kind: str  # pcie, internal, upi, qpi, nvlink, xgmi, memory, hbm
    src: str
    dst: str
    label: str | None = None

    @property
    def id(self) -> str:
        return f"{self.src}->{self.dst}"


class StorageNode(NamedTuple):
    id: str
    tier: str  # TIER_GPU, TIER_CPU or TIER_SSD
    limit: float  # bytes/s it can serve in all
    owner: str  # the GPU, socket or SSD it belongs to
    weight: float = 1.0  # cache size, for the proportional per-cache share


@dataclass
class FlowNetwork:
    nodes: list[str]
    edges: list[Edge]
    storage: list[StorageNode]
    gpus: list[str]
    demand: dict[str, float]  # bytes per epoch, per GPU
    gpu_cache_share: float
    cpu_cache_share: float
    # ({storage id: bytes/s of one device there}, most devices): storage nodes that stand for devices
    # not placed yet (`Rest`) serve at most that many devices' worth between them
    counts: list[tuple[dict[str, float], float]] = field(default_factory=list)
    # ({edge id: bytes/s of one device's link there}, most devices): the same for the edges into and
    # out of the sink that stands for GPUs not placed yet
    edge_counts: list[tuple[dict[str, float], float]] = field(default_factory=list)
    #: where the LP keeps what depends only on this network's shape (`lp._path_form`), shared by the networks of
    #: one chassis of that shape (`_useful_of`); None: kept nowhere
    shape: dict | None = field(default=None, repr=False, compare=False)
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.index = {n: i for i, n in enumerate(self.nodes)}

    @property
    def total_demand(self) -> float:
        return sum(self.demand.values())

    def share_caps(self) -> list[float]:
        """Most of all accesses each storage node may serve, in order: a GPU cache its proportional part of
        the GPU cache share, CPU memory the CPU share, an SSD anything."""
        caches = [x for x in self.storage if x.tier == TIER_GPU]
        total_w = sum(x.weight for x in caches)
        out = []
        for s in self.storage:
            if s.tier == TIER_GPU:
                out.append(self.gpu_cache_share * (s.weight / total_w if total_w > 0 else 1.0 / len(caches)))
            else:
                out.append(self.cpu_cache_share if s.tier == TIER_CPU else 1.0)
        return out

    def check_servable(self) -> None:
        """The tiers must be able to hold every access: without SSDs the caches must cover it all."""
        if not any(s.tier == TIER_SSD for s in self.storage):
            have = (self.gpu_cache_share if any(s.tier == TIER_GPU for s in self.storage) else 0.0) + (
                self.cpu_cache_share if any(s.tier == TIER_CPU for s in self.storage) else 0.0)
            if have < 1.0 - 1e-9:
                raise MomentError(
                    f"no SSD in the machine, and the GPU/CPU caches serve only {have:.0%} of the accesses",
                    hint="add SSDs to the inventory, or raise the workload's cache shares (--gpu-cache-share, "
                         "--cpu-cache-share) until they add up to 1", field="ssds",
                    remedies={"ssds": "add SSDs", "gpu_cache_share": "raise the workload's cache shares"})


# ---- hardware parts, extracted once -------------------------------------------------------------------
@dataclass(frozen=True)
class _Dev:
    id: str
    kind: Kind
    parent: str
    uplink: float
    link_kind: str
    label: str | None
    serve: float = 0.0  # HBM or read bandwidth, bytes/s
    memory: float = 0.0  # GiB (GPU cache weight)
    bridge: str | None = None  # GPU: the model an NVLink bridge joins it to (`devices.bridge_group`)


@dataclass(frozen=True)
class Rest:
    """The devices a partial placement has not placed yet, relaxed so that every completion of the
    placement is a feasible point of the network (its LP time is then a lower bound on theirs).

    GPUs: one sink (`REST_GPU`) demanding `gpus` GPUs' bytes, entering the tree at each parent node
    `gpu_entry` names, through at most (that parent's best `gpus` free slots' inlets together,
    the best one alone) bytes/s, with their caches as one node of `hbm` bytes/s and `memory` GiB,
    read by the others through the same entries. A count limit (`FlowNetwork.edge_counts`) keeps
    one GPU from drawing on two entries at once: each entry's load over its best slot's inlet adds
    up to at most `gpus`.

    SSDs: the free slots they may go in, in groups `ssd_slots` of (parent, how many slots, whether
    they could hold a GPU too), and per SSD model left `ssds` (how many, bytes/s one moves in each
    group or None): one storage node per group and model, with count limits on them
    (`FlowNetwork.counts`) so that a slow slot costs a whole SSD as it does in a real placement: at
    most that many SSDs of a model, at most one SSD per slot, and, since the GPUs left need `gpus`
    of the `gpu_slots` free slots that could hold them, at most `gpu_slots - gpus` SSDs in those.
    """

    gpus: int = 0
    gpu_entry: dict[str, tuple[float, float]] = field(default_factory=dict)
    hbm: float = 0.0
    memory: float = 0.0
    ssd_slots: tuple[tuple[str, int, bool], ...] = ()
    ssds: tuple[tuple[int, tuple[float | None, ...]], ...] = ()
    gpu_slots: int = 0


@dataclass(frozen=True)
class _Peer:
    a: str
    b: str
    kind: str
    capacity: float
    label: str | None


def _link_of(link: Link | None) -> tuple[float, str, str | None]:
    if link is None:
        return INF, "internal", None
    return link.bandwidth(), link.kind, link.label


@dataclass
class _Chassis:
    """Everything but the placeable devices: tree edges between fixed nodes, sockets, peer links."""

    fixed: list[tuple[str, str, float, str, str | None]]  # (child, parent, capacity, kind, label)
    sockets: list[tuple[str, float, float]]  # (id, memory bandwidth bytes/s, memory GiB)
    peers: list[_Peer]
    slots: list[str]  # slot ids in topology order
    devices: list[_Dev]  # GPUs and SSDs already present
    counters: dict[Kind, int]  # existing devices per placeable kind (populate numbers after them)
    ssd_scale: float = 1.0  # effective / rated SSD read rate (a calibration's ssd_read)
    #: `_useful`'s edges kept, the network's nodes and the LP's shape dict, by the network's shape (`_useful_of`)
    useful: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def fixed_edges(self) -> tuple[Edge, ...]:
        """Both directions of every tree link between fixed nodes: the same in every placement's network."""
        return tuple(edge for child, parent, cap, kind, label in self.fixed
                     for edge in (Edge(child, parent, cap, kind, child, parent, label),
                                  Edge(parent, child, cap, kind, parent, child, label)))


def _extract(topo: Topology) -> _Chassis:
    fixed, devices = [], []
    ssd_scale = topo.ssd_read_scale or 1.0
    for n in topo.nodes:
        if n.kind in (Kind.socket, Kind.nvswitch) or n.parent is None:
            continue  # an NVSwitch's PCIe uplink is for management, not data
        link = n.link
        if n.kind in (Kind.gpu, Kind.ssd) and topo.node(n.parent).kind == Kind.slot:
            link = trained_link(link, topo.node(n.parent))
        cap, kind, label = _link_of(link)
        if n.kind in (Kind.gpu, Kind.ssd):
            if n.kind == Kind.gpu:
                devices.append(_Dev(n.id, n.kind, n.parent, cap, kind, label, n.hbm_gbps * GB, n.memory_gib,
                                    bridge_group(n.model)))
            else:
                devices.append(_Dev(n.id, n.kind, n.parent, cap, kind, label,
                                    ssd_read_bytes(n.read_gbps, link, ssd_scale)))
            continue
        fixed.append((n.id, n.parent, cap, kind, label))
    sockets = [(s.id, s.memory_bandwidth_gbps * GB, s.memory_gib) for s in topo.of_kind(Kind.socket)]
    peers = [_Peer(lk.a, lk.b, lk.kind, lk.bandwidth(), lk.label) for lk in topo.links]
    slots = [s.id for s in topo.of_kind(Kind.slot)]
    counters = {k: len(topo.of_kind(k)) for k in PLACEABLE}
    return _Chassis(fixed, sockets, peers, slots, devices, counters, ssd_scale)


def _assemble(ch: _Chassis, devices: list[_Dev], workload: WorkloadSpec, rest: Rest | None = None) -> FlowNetwork:
    gpus = [d.id for d in devices if d.kind == Kind.gpu]
    n_gpus = len(gpus) + (rest.gpus if rest else 0)
    if not n_gpus:
        raise MomentError("the machine has no GPU: there is nothing to feed")
    occupant = {d.parent: d.id for d in devices}
    bridges = {d.id: d.bridge for d in devices}
    is_gpu = set(gpus)

    def tail(x: str) -> str:  # where data leaving x starts in the graph
        return f"hbm:{x}" if x in is_gpu else x

    edges: list[Edge] = list(ch.fixed_edges)
    storage: list[StorageNode] = []
    for d in devices:
        edges.append(Edge(tail(d.id), d.parent, d.uplink, d.link_kind, d.id, d.parent, d.label))
        if d.kind == Kind.gpu:
            edges.append(Edge(d.parent, d.id, d.uplink, d.link_kind, d.parent, d.id, d.label))
            edges.append(Edge(f"hbm:{d.id}", d.id, d.serve, "hbm", f"hbm:{d.id}", d.id, None))
            storage.append(StorageNode(f"hbm:{d.id}", TIER_GPU, d.serve, d.id, d.memory))
        else:
            storage.append(StorageNode(d.id, TIER_SSD, d.serve, d.id))
    for sid, mem_bw, mem_gib in ch.sockets:
        if mem_gib <= 0:  # a socket without memory holds no CPU cache (it served the CPU share all the same)
            continue
        edges.append(Edge(f"mem:{sid}", sid, mem_bw, "memory", f"mem:{sid}", sid, None))
        storage.append(StorageNode(f"mem:{sid}", TIER_CPU, mem_bw, sid, mem_gib))
    for p in ch.peers:
        a, b = occupant.get(p.a, p.a), occupant.get(p.b, p.b)
        if a in ch.slots or b in ch.slots:  # an NVLink bridge on an empty slot joins nothing
            continue
        if p.kind in ("nvlink", "xgmi") and any(end in occupant and occupant[end] not in is_gpu
                                                for end in (p.a, p.b)):
            continue  # a GPU bridge on a slot carries data only when the slot holds a GPU
        if p.kind == "nvlink" and p.a in occupant and p.b in occupant and not (
                bridges[a] is not None and bridges[a] == bridges[b]):
            continue  # and only between two cards of one model that takes a bridge (not two T4s, nor T4 and A100)
        edges.append(Edge(tail(a), b, p.capacity, p.kind, a, b, p.label))
        edges.append(Edge(tail(b), a, p.capacity, p.kind, b, a, p.label))

    D = workload.bytes_per_gpu(n_gpus)
    demand = {g: D for g in gpus}
    edge_counts: list[tuple[dict[str, float], float]] = []
    if rest is not None and rest.gpus:
        hbm = f"hbm:{REST_GPU}"
        gpus.append(REST_GPU)
        is_gpu.add(REST_GPU)
        demand[REST_GPU] = rest.gpus * D
        edges.append(Edge(hbm, REST_GPU, rest.hbm, "hbm", hbm, REST_GPU, None))
        storage.append(StorageNode(hbm, TIER_GPU, rest.hbm, REST_GPU, rest.memory))
        into, out = {}, {}
        for parent, (cap, one) in rest.gpu_entry.items():
            edges.append(Edge(parent, REST_GPU, cap, "pcie", parent, REST_GPU, None))
            edges.append(Edge(hbm, parent, cap, "pcie", REST_GPU, parent, None))
            into[edges[-2].id], out[edges[-1].id] = one, one
        edge_counts = [(into, float(rest.gpus)), (out, float(rest.gpus))]
    counts: list[tuple[dict[str, float], float]] = []
    if rest is not None and rest.ssds and rest.ssd_slots:
        shared: dict[str, float] = {}
        per_slot: list[dict[str, float]] = [{} for _ in rest.ssd_slots]
        for j, (many, rates) in enumerate(rest.ssds):
            of_model = {}
            for g, ((parent, n, gpu_too), rate) in enumerate(zip(rest.ssd_slots, rates)):
                if rate is None:
                    continue
                sid = f"{REST_SSD}{g}.{j}"
                storage.append(StorageNode(sid, TIER_SSD, n * rate, REST_SSD))
                edges.append(Edge(sid, parent, n * rate, "pcie", sid, parent, None))
                of_model[sid] = per_slot[g][sid] = rate
                if gpu_too:
                    shared[sid] = rate
            counts.append((of_model, float(many)))
        if len(rest.ssds) > 1:
            counts += [(rates, float(n)) for rates, (_, n, _) in zip(per_slot, rest.ssd_slots) if len(rates) > 1]
        if shared and rest.gpus:
            counts.append((shared, float(max(0, rest.gpu_slots - rest.gpus))))

    edges, nodes, shape = _useful_of(ch, edges, [s.id for s in storage], gpus)
    return FlowNetwork(nodes=nodes, edges=edges, storage=storage, gpus=gpus, demand=demand,
                       gpu_cache_share=workload.gpu_cache_share, cpu_cache_share=workload.cpu_cache_share,
                       counts=counts, edge_counts=edge_counts, shape=shape)


def distinct(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` of a 1-d array (sorted distinct values) without what np.unique loads on its first
    call: it asks numpy.ma whether the array is masked, and importing numpy.ma costs `moment plan` ~10 ms."""
    a = np.sort(a, kind="stable")
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if len(a) else a


#: shapes `_useful_of` keeps per chassis (then it starts again): a few MB at most
USEFUL_KEPT = 1 << 14


def _useful_of(ch: _Chassis, edges: list[Edge], sources: list[str], sinks: list[str]
               ) -> tuple[list[Edge], list[str], dict]:
    """`_useful` of a network of chassis `ch`, the network's nodes (sorted) and a dict for the LP's use
    (`FlowNetwork.shape`), kept by its shape (the ends of the edges past the fixed ones, the storage and the GPUs):
    the same slots holding the same kinds of device give the same edges to drop whatever the models and the
    workload, and a listing search builds thousands of networks of a few hundred shapes (the pruning was a third
    of building a network). The storage and the GPUs in their order: the LP's columns are numbered by it."""
    key = (tuple([(e.u, e.v) for e in edges[len(ch.fixed_edges):]]), tuple(sources), tuple(sinks))
    got = ch.useful.get(key)
    if got is None:
        if len(ch.useful) >= USEFUL_KEPT:
            ch.useful.clear()
        keep = _useful(edges, set(sources), set(sinks))
        nodes = sorted({x for e in compress(edges, keep) for x in (e.u, e.v)} | set(sources) | set(sinks))
        got = ch.useful[key] = (keep, tuple(nodes), {})
    keep, nodes, shape = got
    return list(compress(edges, keep)), list(nodes), shape


def _useful(edges: list[Edge], sources: set[str], sinks: set[str]) -> list[bool]:
    """Drop edges no simple storage -> GPU path can use: an edge into a node whose only way on is
    straight back (a dead end, e.g. the downlink of an SSD's slot), or out of a node whose only way
    in came from there. Repeated until nothing changes, so whole empty subtrees go.

    Removing an edge only ever makes others removable, so what is left is the same whatever the
    order: every removable edge goes at once, on arrays, each round."""
    index: dict[str, int] = {}
    u = np.array([index.setdefault(e.u, len(index)) for e in edges], dtype=np.int64)
    v = np.array([index.setdefault(e.v, len(index)) for e in edges], dtype=np.int64)
    n = len(index)
    source, sink = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    source[[index[x] for x in sources if x in index]] = True
    sink[[index[x] for x in sinks if x in index]] = True
    live = ~source[v] & ~sink[u]
    while live.any():
        pairs = distinct(u[live] * n + v[live])  # live (tail, head) pairs, parallel edges once
        tail, head = pairs // n, pairs % n
        outs, ins = np.bincount(tail, minlength=n), np.bincount(head, minlength=n)
        only_out, only_in = np.full(n, -1), np.full(n, -1)  # the one neighbour, where there is one
        only_out[tail], only_in[head] = head, tail
        dead_end = ~sink[v] & ((outs[v] == 0) | ((outs[v] == 1) & (only_out[v] == u)))
        no_way_in = ~source[u] & ((ins[u] == 0) | ((ins[u] == 1) & (only_in[u] == v)))
        drop = live & (dead_end | no_way_in)
        if not drop.any():
            break
        live &= ~drop
    return live.tolist()  # (which edges to keep)


def build_network(topo: Topology, workload: WorkloadSpec) -> FlowNetwork:
    """The capacity graph of a topology with its devices in place."""
    ch = _extract(topo)
    return _assemble(ch, ch.devices, workload)


class ChassisTemplate:
    """A bare chassis, parsed once; `network(placement)` equals `build_network(populate(...))`."""

    def __init__(self, bare: Topology):
        self.topo = bare
        self.chassis = _extract(bare)
        self._slot_order = {s: i for i, s in enumerate(self.chassis.slots)}
        self._cards: dict[tuple[str, str], tuple[Kind, float, float, float]] = {}
        #: a peer link (an NVLink bridge) has an end on a slot: the branch and bound's relaxation
        #: (`Rest`) does not bound such a chassis, the listing search plans it
        self.bridged_slots = any(p.a in self._slot_order or p.b in self._slot_order for p in self.chassis.peers)

    def card(self, slot: str, name: str) -> tuple[Kind, float, float, float]:
        """(kind, card link bytes/s, HBM or read bytes/s, memory GiB) of a `name` card in `slot`: its
        link as trained there (`devices.trained_link`), parsed once per slot and model."""
        key = (slot, name)
        if key not in self._cards:
            m = find_model(name)
            link = card_link(m, self.topo.node(slot))
            serve = (m.hbm_gbps * GB if m.kind == Kind.gpu
                     else ssd_read_bytes(m.read_gbps, link, self.chassis.ssd_scale))
            self._cards[key] = (m.kind, link.bandwidth(), serve, m.memory_gib)
        return self._cards[key]

    def device_ids(self, placement: dict[str, str]) -> dict[str, str]:
        """slot -> device id, numbered the way `populate` numbers them."""
        counters = dict(self.chassis.counters)
        out = {}
        for slot in sorted(placement, key=self._slot_order.__getitem__):
            kind = find_model(placement[slot]).kind
            out[slot] = f"{kind.value}{counters[kind]}"
            counters[kind] += 1
        return out

    def network(self, placement: dict[str, str], workload: WorkloadSpec, rest: Rest | None = None) -> FlowNetwork:
        """The capacity graph of `placement`; with `rest`, relaxed for the devices not yet placed."""
        devs = list(self.chassis.devices)
        for slot, dev_id in self.device_ids(placement).items():
            kind, cap, serve, memory = self.card(slot, placement[slot])
            if kind in (Kind.gpu, Kind.ssd):  # NICs carry no training reads
                devs.append(_Dev(dev_id, kind, slot, cap, "pcie", None, serve, memory,
                                 bridge_group(placement[slot]) if kind == Kind.gpu else None))
        return _assemble(self.chassis, devs, workload, rest)
