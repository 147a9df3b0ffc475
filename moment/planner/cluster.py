"""Plan a cluster: each server's GPUs and SSDs as `moment plan` places them, its NICs beside the GPUs
they serve, and the epoch with the network's part added.

The model, per machine (every input is in the answer, so a reader can redo the arithmetic):

- The epoch's feature bytes are split over all the cluster's GPUs; each machine's GPUs and SSDs are
  placed by the single-server planner for its GPUs' share (`make_plan`, unchanged). The GPU and CPU
  cache shares are the hottest rows, replicated on every machine; the rest (the SSD share) is split
  over the machines, and a machine reads `remote_fraction` of it from the others (default (N-1)/N,
  an even split). A machine's SSDs then serve what they served alone (their own rows to their own
  GPUs and to the others'), exactly so when equal machines split evenly, so the plan's read time
  stands for them.
- Remote feature bytes cross the network: in through the NIC serving each GPU (as NCCL's topology
  search pairs each GPU with its nearest NIC: under the same PCIe switch first, then the same CPU),
  out through the NICs of the machine owning the rows. A NIC moves min(cabled ports x
  min(port rate, switch rate), its PCIe link) per direction; a GPU whose NIC is across the CPU
  receives at most what the links between them carry (GPUDirect RDMA needs them under one switch).
- The gradient all-reduce is a ring over the machines: 2(N-1)/N x model bytes per step over the
  machine's NIC rate, steps = training seeds / (batch x all GPUs).
- The machine's epoch is its read time plus the two network times: no overlap assumed, so it is an
  upper bound where the runtime overlaps them. The cluster's epoch is its slowest machine's.

NICs go in the slots the plan left free: every choice of slots is tried (a few dozen on a usual
server) and the one with the least network time wins, then the most GPUDirect paths, then slot
order (stable). Where the plan took every slot a NIC fits, slots are held for the NICs first and the
GPUs and SSDs planned around them (`reserve_nics`). NICs a profile already holds (a scanned
machine's) keep their slots and are not used: the cluster's NICs are the ones the cluster file names.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, Field

from moment.errors import MomentError
from moment.planner.contracts import Plan
from moment.topology.bandwidth import GB
from moment.topology.cluster import ClusterSpec, ServerSpec, nic_rate
from moment.topology.devices import DeviceModel, builtin_gpus, check_placement, fits, populate, strip
from moment.topology.model import Kind, Topology
from moment.workload.spec import WorkloadSpec

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

#: width of the hidden layers and classes of the model whose gradients the default `model_mb` counts:
#: the training runtime's default GraphSAGE (width 256) on IGB's 19 classes
DEFAULT_HIDDEN = 256
DEFAULT_CLASSES = 19
#: NIC slot choices tried exhaustively up to this many; beyond, NICs go one at a time (greedy)
NIC_CHOICES_LIMIT = 5000
NIC_RESERVE_LIMIT = 64  # choices of slots held for the NICs when a plan leaves them none (each a plan)
#: how a GPU reaches its NIC: under one PCIe switch (GPUDirect RDMA), through one CPU, across CPUs
PATH_SWITCH, PATH_CPU, PATH_SOCKETS = "switch", "cpu", "sockets"


def default_model_bytes(workload: WorkloadSpec) -> float:
    """Gradient bytes of a GraphSAGE with one layer per fan-out (PyG's SAGEConv: two weight matrices
    and a bias per layer), float32."""
    dims = [workload.feature_dim] + [DEFAULT_HIDDEN] * (len(workload.fanouts) - 1) + [DEFAULT_CLASSES]
    params = sum(2 * a * b + b for a, b in zip(dims, dims[1:]))
    return 4.0 * params


class NicUse(BaseModel):
    nic: str = Field(description="device id, e.g. nic0")
    slot: str
    model: str
    rate_gbps: float = Field(description="GB/s per direction: ports x min(port, switch rate), capped by its PCIe link")
    gpus: list[str] = Field(description="GPUs it serves (NCCL-style nearest NIC)")
    gdr_gpus: list[str] = Field(description="those under the same PCIe switch: GPUDirect RDMA paths")
    inbound_gb: float = Field(description="remote feature GB it receives per epoch")
    outbound_gb: float = Field(description="feature GB it sends to the other machines per epoch")


class MachinePlan(BaseModel):
    name: str
    server: int = Field(0, description="its entry in the cluster file's servers (machines of one entry are "
                        "equal: planned once)")
    profile: str
    plan: Plan = Field(description="the single-server plan of its GPUs and SSDs (`moment plan --json`)")
    placement: dict[str, str] = Field(description="slot -> model: the plan's GPUs and SSDs, and the NICs")
    devices: dict[str, str] = Field(description="slot -> device id")
    nics: list[NicUse]
    gpu_paths: dict[str, str] = Field(description="GPU -> how it reaches its NIC: switch (GPUDirect RDMA), cpu, sockets")
    gdr_paths: int = Field(description="GPUs with a NIC under the same PCIe switch")
    read_s: float = Field(description="the plan's epoch read time (local storage to local GPUs)")
    remote_feature_gb: float = Field(description="feature GB its GPUs read from other machines per epoch")
    remote_feature_s: float
    allreduce_s: float
    network_s: float = Field(description="remote_feature_s + allreduce_s")
    epoch_s: float = Field(description="read_s + network_s (no overlap assumed)")
    network_share: float = Field(description="network_s / epoch_s")


class ClusterPlan(BaseModel):
    cluster: str
    machines: list[MachinePlan]
    gpus: int = Field(description="GPUs in the whole cluster")
    network: dict = Field(description="the cluster file's network: nic, ports, switch_gbit")
    remote_fraction: float
    remote_fraction_source: str = Field(description="'even split (N-1)/N', 'cluster file' or the flag")
    bytes_per_gpu_per_epoch: float = Field(description="feature bytes each GPU reads per epoch")
    model_bytes: float
    steps_per_epoch: int
    epoch_s: float = Field(description="the slowest machine's epoch")
    network_s: float = Field(description="the slowest machine's network time")
    network_share: float = Field(description="the slowest machine's network share of its epoch")
    slowest: str


@dataclass
class _Server:
    name: str
    spec: ServerSpec
    topo: Topology
    index: int  # of its entry in the file's servers


def _path(topo: Topology, a: str, b: str) -> tuple[str, float]:
    """How device `a` reaches device `b` (PATH_*), and the least one-direction bytes/s of the links
    between them: their PCIe uplinks to the nearest common node, and the socket links when they sit
    under different CPUs."""
    up_a = [a, *topo.ancestors(a)]
    up_b = [b, *topo.ancestors(b)]
    common = next((n for n in up_a if n in set(up_b)), None)
    rate = float("inf")
    for chain in (up_a, up_b):
        for n in chain:
            if n == common:
                break
            link = topo.node(n).link
            if link is not None:
                rate = min(rate, link.bandwidth())
    if common is None:
        sa, sb = topo.socket_of(a), topo.socket_of(b)
        peer = sum(pl.bandwidth() for pl in topo.links if {pl.a, pl.b} == {sa, sb} and pl.kind in ("upi", "qpi"))
        return PATH_SOCKETS, min(rate, peer) if peer else rate
    kind = topo.node(common).kind
    return (PATH_SWITCH if kind in (Kind.switch, Kind.slot) else PATH_CPU), rate


_PATH_ORDER = {PATH_SWITCH: 0, PATH_CPU: 1, PATH_SOCKETS: 2}


def pair_gpus(topo: Topology, gpus: list[str], nics: list[str]) -> dict[str, str]:
    """GPU -> the NIC it uses: the nearest (same switch, then same CPU, then any), the least loaded
    among equally near ones, then the lower id (NCCL's search pairs GPUs and NICs by path type the
    same way, spreading GPUs over equally close NICs)."""
    load = dict.fromkeys(nics, 0)
    out = {}
    for g in gpus:
        best = min(nics, key=lambda n: (_PATH_ORDER[_path(topo, g, n)[0]], load[n], n))
        out[g] = best
        load[best] += 1
    return out


@dataclass
class _NicChoice:
    slots: tuple[str, ...]
    topo: Topology
    nic_ids: list[str]
    pairing: dict[str, str]
    remote_s: float
    gdr: int


def _network_time(topo: Topology, nic_ids: list[str], pairing: dict[str, str], inbound: dict[str, float],
                  outbound: float, wire: float) -> float:
    """Seconds to move the machine's remote feature bytes: each NIC's inbound and outbound at its rate,
    each GPU's inbound at its path's rate."""
    t = 0.0
    share_out = outbound / max(len(nic_ids), 1)  # the owner's NICs send its rows, spread evenly
    for n in nic_ids:
        link = topo.node(n).link
        rate = min(wire, link.bandwidth() if link is not None else wire)
        into = sum(inbound[g] for g, m in pairing.items() if m == n)
        t = max(t, into / rate, share_out / rate)
    for g, n in pairing.items():
        t = max(t, inbound[g] / _path(topo, g, n)[1])
    return t


def place_nics(topo: Topology, plan: Plan, nic: DeviceModel, count: int, inbound_per_gpu: float,
               outbound: float, wire: float, *, what: str) -> _NicChoice:
    """The best slots for `count` NICs of `nic` beside the planned GPUs and SSDs (module docstring)."""
    bare = strip(topo)[0]
    planned = populate(bare, plan.placement)
    free = [s for s in planned.empty_slots() if fits(s, nic)]
    if len(free) < count:
        raise MomentError(f"{what}: {count} x {nic.name} do not fit: {topo.name!r} has {len(free)} free slot"
                          f"{'s' if len(free) != 1 else ''} for an x{nic.lanes} NIC after the plan's "
                          f"{plan.inventory}", hint="fewer nics, fewer SSDs or GPUs in the inventory, or another profile")
    gpus = [g.id for g in planned.of_kind(Kind.gpu)]
    inbound = dict.fromkeys(gpus, inbound_per_gpu)

    def evaluate(slots: tuple[str, ...]) -> _NicChoice | None:
        placement = {**plan.placement, **{s: nic.name for s in slots}}
        try:
            check_placement(bare, placement)
        except MomentError:
            return None  # e.g. a slot a double-width GPU covers
        t = populate(bare, placement, check=False)
        ids = [n.id for n in t.of_kind(Kind.nic) if n.parent in slots]
        pairing = pair_gpus(t, gpus, ids) if gpus else {}
        gdr = sum(_path(t, g, n)[0] == PATH_SWITCH for g, n in pairing.items())
        return _NicChoice(slots, t, ids, pairing, _network_time(t, ids, pairing, inbound, outbound, wire), gdr)

    order = {s.id: i for i, s in enumerate(free)}

    def key(c: _NicChoice) -> tuple:
        return (round(c.remote_s, 9), -c.gdr, [order[s] for s in c.slots])

    combos = 1
    for i in range(count):
        combos = combos * (len(free) - i) // (i + 1)
    if combos <= NIC_CHOICES_LIMIT:
        found = [c for c in map(evaluate, itertools.combinations([s.id for s in free], count)) if c is not None]
    else:  # greedy: one NIC at a time, each where it helps most
        chosen: tuple[str, ...] = ()
        for _ in range(count):
            step = [c for c in (evaluate(chosen + (s.id,)) for s in free if s.id not in chosen) if c is not None]
            if not step:
                break
            chosen = min(step, key=key).slots
        found = [c for c in [evaluate(tuple(sorted(chosen, key=order.get)))] if c is not None and len(chosen) == count]
    if not found:
        raise MomentError(f"{what}: no valid slots for {count} x {nic.name} on {topo.name!r} beside the plan's "
                          f"{plan.inventory}", hint="fewer nics, or fewer double-width GPUs")
    return min(found, key=key)


def reserve_nics(topo: Topology, inventory, workload: WorkloadSpec, nic: DeviceModel, count: int,
                 inbound_per_gpu: float, outbound: float, wire: float, *, what: str,
                 progress: Callable[[int, int], None] | None = None) -> tuple[Plan, _NicChoice] | None:
    """The plan and NIC slots of a server whose plan alone leaves no slot its NICs take: each choice of
    slots the NICs fit (in slot order, the first NIC_RESERVE_LIMIT) is held for them, the GPUs and SSDs are
    planned around it, and the least read plus network time wins (then the most GPUDirect paths). None:
    the inventory fits beside no such choice."""
    from moment.planner.plan import make_plan

    bare = strip(topo)[0]
    slots = [s.id for s in bare.empty_slots() if fits(s, nic)]
    best: tuple[tuple, Plan, _NicChoice] | None = None
    for held in itertools.islice(itertools.combinations(slots, count), NIC_RESERVE_LIMIT):
        try:
            plan = make_plan(populate(bare, dict.fromkeys(held, nic.name)), inventory, workload, progress=progress)
            choice = place_nics(topo, plan, nic, count, inbound_per_gpu, outbound, wire, what=what)
        except MomentError:
            continue  # the inventory does not fit beside these slots
        key = (round(plan.predicted.epoch_read_s + choice.remote_s, 9), -choice.gdr)
        if best is None or key < best[0]:
            best = (key, plan, choice)
    return None if best is None else (best[1], best[2])


def check_remote_fraction(value: float | None, what: str = "--remote-fraction") -> None:
    """A share of rows: 0 to 1 (None: not given)."""
    if value is not None and not 0 <= value <= 1:
        raise MomentError(f"{what} {value:g}: a share of the rows, from 0 to 1", field="remote_fraction",
                          hint="0: every row a machine reads is its own; leave it out for an even split, (N-1)/N")


def plan_cluster(spec: ClusterSpec, workload: WorkloadSpec | None = None, *,
                 remote_fraction: float | None = None, remote_source: str = "--remote-fraction",
                 load: Callable[[str], Topology] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> ClusterPlan:
    """Plan every machine of `spec` and add the network (module docstring). `remote_fraction` given
    here (as `remote_source` spells it) wins over the file's; `load` reads a profile (default:
    load_profile; the service reads built-in ones only). `progress` is called between machines and
    inside each search: a deadline raises from it to stop the work."""
    from moment.planner.api import parse_inventory
    from moment.planner.plan import make_plan
    from moment.planner.replay import steps_per_epoch
    from moment.topology.profiles import load_profile

    load = load or load_profile
    wl = workload or WorkloadSpec()
    machines = spec.machines()
    n = len(machines)
    servers: list[_Server] = []
    invs = {}
    for i, s in enumerate(spec.servers):
        where = f"servers[{i}]"
        try:
            topo = load(s.profile)
        except MomentError as e:
            raise MomentError(f"{where}.profile: {str(e).splitlines()[0]}", hint=e.hint, field="cluster") from None
        try:
            inv = parse_inventory(s.inventory, 0, 0, flag=lambda name, w=where: f"{w}.{name}")
        except MomentError as e:
            e.field = "cluster"  # one input: the cluster, its field path in the message
            raise
        if inv.count(Kind.nic):
            raise MomentError(f"{where}.inventory {s.inventory!r}: list GPUs and SSDs only; NICs are "
                              f"network.nic, {where}.nics of them", field="cluster")
        invs[id(s)] = inv
        servers += [_Server(name, s, topo, i) for name, sv in machines if sv is s]
    gpus_of = {sv.name: invs[id(sv.spec)].count(Kind.gpu) + _builtin(sv.topo) for sv in servers}
    total_gpus = sum(gpus_of.values())
    if total_gpus == 0:
        raise MomentError("the cluster has no GPU: give each server's inventory its GPUs", field="cluster")

    frac, source = (remote_fraction, remote_source) if remote_fraction is not None else \
        (spec.remote_fraction, "cluster file") if spec.remote_fraction is not None else \
        ((n - 1) / n, "even split (N-1)/N")
    per_gpu = wl.bytes_per_gpu(total_gpus)
    wl_machine = wl.model_copy(update={"bytes_per_gpu_per_epoch": per_gpu})
    model_bytes = spec.model_mb * 1e6 if spec.model_mb is not None else default_model_bytes(wl)
    steps = steps_per_epoch(wl.num_nodes * wl.train_fraction, wl.batch_size, total_gpus)
    nic = spec.nic_model()
    wire = nic_rate(nic, spec.network.ports, spec.network.switch_gbit)
    remote_per_gpu = per_gpu * wl.ssd_share * frac

    plans: dict[tuple, Plan] = {}
    # bytes each machine sends: what the others read remotely, spread evenly over the owners
    sent = {sv.name: (total_gpus - gpus_of[sv.name]) * remote_per_gpu / max(n - 1, 1) for sv in servers}
    out = []
    planned: dict[int, MachinePlan] = {}  # an entry's machines are equal: planned once, copied per name
    for sv in servers:
        if progress is not None:
            progress(len(out), n)  # a deadline stops the work here as well as inside each search
        if sv.index in planned:
            out.append(planned[sv.index].model_copy(update={"name": sv.name}))
            continue
        key = (sv.spec.profile, sv.spec.inventory)
        idx = sv.index
        if key not in plans:
            try:
                plans[key] = make_plan(sv.topo, invs[id(sv.spec)], wl_machine, progress=progress)
            except MomentError as e:
                raise MomentError(f"servers[{idx}] ({sv.topo.name}, {sv.spec.inventory}): {str(e).splitlines()[0]}",
                                  hint=e.hint, field="cluster") from None
        plan = plans[key]
        nic_args = (nic, sv.spec.nics, remote_per_gpu, sent[sv.name], wire)
        try:
            choice = place_nics(sv.topo, plan, *nic_args, what=f"servers[{idx}].nics")
        except MomentError as e:  # the plan took every slot the NICs fit: hold slots for them first
            got = reserve_nics(sv.topo, invs[id(sv.spec)], wl_machine, *nic_args, what=f"servers[{idx}].nics",
                               progress=progress)
            if got is None:
                first = str(e).split("\n  hint: ")[0]
                raise MomentError(f"{first}, nor does the inventory fit beside slots held for them", hint=e.hint,
                                  field="cluster") from None
            plan, choice = got
        rates = {}
        nics = []
        for nid, slot in zip(choice.nic_ids, choice.slots):
            link = choice.topo.node(nid).link
            rates[nid] = min(wire, link.bandwidth() if link is not None else wire)
            served = sorted((g for g, m in choice.pairing.items() if m == nid), key=_num)
            nics.append(NicUse(nic=nid, slot=slot, model=nic.name, rate_gbps=rates[nid] / GB, gpus=served,
                               gdr_gpus=[g for g in served if _path(choice.topo, g, nid)[0] == PATH_SWITCH],
                               inbound_gb=remote_per_gpu * len(served) / GB,
                               outbound_gb=sent[sv.name] / len(choice.nic_ids) / GB))
        machine_rate = sum(rates.values())
        allreduce = steps * 2 * (n - 1) / n * model_bytes / machine_rate if n > 1 else 0.0
        read = plan.predicted.epoch_read_s
        network = choice.remote_s + allreduce
        epoch = read + network
        devices = dict(plan.devices)
        devices.update({slot: nid for nid, slot in zip(choice.nic_ids, choice.slots)})
        out.append(MachinePlan(
            name=sv.name, server=sv.index, profile=sv.spec.profile, plan=plan,
            placement={**plan.placement, **{s: nic.name for s in choice.slots}}, devices=devices, nics=nics,
            gpu_paths={g: _path(choice.topo, g, m)[0] for g, m in sorted(choice.pairing.items(), key=lambda x: _num(x[0]))},
            gdr_paths=choice.gdr, read_s=read, remote_feature_gb=remote_per_gpu * gpus_of[sv.name] / GB,
            remote_feature_s=choice.remote_s, allreduce_s=allreduce, network_s=network, epoch_s=epoch,
            network_share=network / epoch if epoch > 0 else 0.0))
        planned[sv.index] = out[-1]
    slowest = out[max(range(len(out)), key=lambda i: (out[i].epoch_s, -i))]
    return ClusterPlan(
        cluster=spec.name, machines=out, gpus=total_gpus, network=spec.network.model_dump(),
        remote_fraction=frac, remote_fraction_source=source, bytes_per_gpu_per_epoch=per_gpu,
        model_bytes=model_bytes, steps_per_epoch=steps, epoch_s=slowest.epoch_s, network_s=slowest.network_s,
        network_share=slowest.network_share, slowest=slowest.name)


def _builtin(topo: Topology) -> int:
    return len(builtin_gpus(topo))


def _num(dev: str) -> tuple[str, int]:
    head = dev.rstrip("0123456789")
    return head, int(dev[len(head):] or -1)
