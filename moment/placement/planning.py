"""From pre-sampled hotness to the planner's workload, and from a plan to the bins DDAK fills.

Why: the planner's default cache shares and epoch bytes are estimates; pre-sampling measures them. A
cache of k rows serves the share of reads that go to the k hottest nodes, so the hotness curve turns
cache sizes into the `gpu_cache_share` / `cpu_cache_share` the planner needs, and the counted reads
give the bytes each GPU reads per epoch. The plan's `storage_shares` then become the bins' targets.

The CPU cache budget (n_sockets x rows per socket) is split over the sockets in proportion to the
plan's shares: the planner treats CPU memory as one pool (any socket may serve the whole CPU share)
and usually puts it all on the socket next to the GPUs, which a fixed per-socket split could not hold.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from moment.errors import Flag, MomentError, cli_flag, validation_error
from moment.inputs import parse_ssd_paths  # noqa: F401 - moment.placement.api takes it from here
from moment.placement.assignment import Assignment, hotness_order
from moment.placement.baselines import degree_placement, hash_placement
from moment.placement.bins import Bin, BinSet
from moment.placement.knapsack import auto_pool, ddak
from moment.planner.contracts import Evaluation, Plan
from moment.sizes import NUMBER, finite, fmt_size, parse_size
from moment.topology.devices import Inventory, populate, strip
from moment.topology.model import Kind, Topology
from moment.workload.graph import GraphDataset
from moment.workload.hotness import Hotness
from moment.workload.spec import WorkloadSpec

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

GiB = 1 << 30
#: default cache budgets: this share of each GPU's / each socket's memory
GPU_CACHE_DEFAULT = 0.25
CPU_CACHE_DEFAULT = 0.10


@dataclass(frozen=True)
class CacheRows:
    """Cache budget in rows (one node embedding each): per GPU and per socket."""

    gpu: int
    cpu: int


def parse_cache(text: str | None, what: str, field: str | None = None) -> tuple[str, float] | None:
    """`--gpu-cache 8` (GiB), `--gpu-cache 512MiB` / `2GB` (any size `moment.sizes` reads) or `--gpu-cache 10%` (of
    the dataset's feature bytes) -> (unit, value). `what`: the input as the caller spells it; `field`: its name
    (for the service)."""
    if text is None:
        return None
    m = re.fullmatch(rf"\s*({NUMBER})\s*(%|gib|GiB|g|G)?\s*", text)  # the number as every size spells it
    if not m:
        try:  # a size with its unit (a plain number is GiB above, a share below)
            nbytes = parse_size(text, 0)
        except MomentError:
            nbytes = None
        if nbytes is None:
            raise MomentError(f"{what} {text!r}: expected GiB (e.g. 8 or 0.5), a size (e.g. 512MiB, 2GB) or a share "
                              "of the dataset (e.g. 10%)", field=field)
        return "gib", nbytes / GiB
    value = finite(float(m.group(1)))
    if m.group(2) == "%":
        if value > 100:
            raise MomentError(f"{what} {text!r}: a share of the dataset must be at most 100%", field=field)
        return "share", value / 100
    return "gib", value


def cache_rows(spec: tuple[str, float] | None, default_gib: float, dataset: GraphDataset) -> int:
    """Rows of one cache: `spec` (GiB or share of the dataset) or `default_gib`, capped by the dataset."""
    n, row = dataset.num_nodes, dataset.row_bytes
    if spec is None:
        rows = int(default_gib * GiB) // row
    elif spec[0] == "share":
        rows = round(spec[1] * n)
    else:
        rows = int(spec[1] * GiB) // row
    return min(max(rows, 0), n)


def smallest_memories(topo: Topology, inventory: Inventory) -> tuple[tuple[float, str] | None,
                                                                       tuple[float, str] | None]:
    """(GiB, name) of the smallest GPU's and the smallest socket's memory (None: there is none): what
    every cache of that tier must fit in, since each tier's caches have one size."""
    gpus = [(m.memory_gib, f"the GPU {m.name}") for m, _ in inventory.models() if m.kind == Kind.gpu]
    gpus += [(g.memory_gib, f"the GPU {g.model} ({g.id})") for g in strip(topo)[0].of_kind(Kind.gpu)]  # on board
    sockets = [(s.memory_gib, f"socket {s.id}") for s in topo.of_kind(Kind.socket)]
    return (min(gpus) if gpus else None), (min(sockets) if sockets else None)


def default_cache_gib(topo: Topology, inventory: Inventory, gpu_fraction: float = GPU_CACHE_DEFAULT,
                      cpu_fraction: float = CPU_CACHE_DEFAULT) -> tuple[float, float]:
    """(per-GPU, per-socket) cache GiB: a fraction of the smallest GPU's / socket's memory, so every
    cache of a tier has the same size."""
    gpu, socket = smallest_memories(topo, inventory)
    return (gpu_fraction * gpu[0] if gpu else 0.0), (cpu_fraction * socket[0] if socket else 0.0)


def check_caches(dataset: GraphDataset, topology: Topology, inventory: Inventory, gpu_cache: str | None,
                 cpu_cache: str | None, *, flag: Flag = cli_flag, machine: str = ""
                 ) -> tuple[tuple[str, float] | None, ...]:
    """The GPU and CPU caches' sizes (`parse_cache`), each refused when larger than the memory it lives in
    (a share of the dataset counts as its bytes), or, on a machine without an SSD, when they do not hold
    every row (`check_caches_hold_all`): checked before any work, by `place` and the service. `machine`:
    its name in a split."""
    specs = []
    gpu_memory, socket_memory = smallest_memories(topology, inventory)
    for key, text, memory, default in (("gpu_cache", gpu_cache, gpu_memory, GPU_CACHE_DEFAULT),
                                       ("cpu_cache", cpu_cache, socket_memory, CPU_CACHE_DEFAULT)):
        spec = parse_cache(text, flag(key), key)
        specs.append(spec)
        if spec is None or memory is None:
            continue
        feature_bytes = dataset.num_nodes * dataset.row_bytes
        want = spec[1] * feature_bytes if spec[0] == "share" else spec[1] * GiB
        gib, name = memory
        if want > gib * GiB:
            of = f" ({want / GiB:.2f} GiB of this dataset's features)" if spec[0] == "share" else ""
            raise MomentError(f"{flag(key)} {text!r}{of} is larger than the {gib:g} GiB of memory of {name}",
                              hint=f"give at most {gib:g} (GiB) or {min(100.0, 100 * gib * GiB / feature_bytes):.3g}%;"
                                   f" the default is {default:.0%} of that memory", field=key)
    if ssd_count(topology, inventory) == 0:
        check_caches_hold_all(dataset, topology, inventory, specs[0], specs[1], flag=flag, machine=machine)
    return tuple(specs)


def check_caches_hold_all(dataset: GraphDataset, topology: Topology, inventory: Inventory,
                          gpu_spec: tuple[str, float] | None, cpu_spec: tuple[str, float] | None, *,
                          flag: Flag = cli_flag, machine: str = "") -> None:
    """A machine without an SSD has nowhere to keep the rows its caches do not: refuse caches (as given, or
    the defaults) that do not hold every row of the dataset, saying what they hold and what to raise."""
    n = dataset.num_nodes
    gpu_gib, cpu_gib = default_cache_gib(topology, inventory)
    gpu, cpu = cache_rows(gpu_spec, gpu_gib, dataset), cache_rows(cpu_spec, cpu_gib, dataset)
    n_gpus, n_sockets = device_counts(topology, inventory)
    held = n_gpus * gpu + n_sockets * cpu
    if held >= n:
        return
    g, c = flag("gpu_cache"), flag("cpu_cache")
    cpu_need = -(-(n - n_gpus * gpu) // max(n_sockets, 1))  # rows per socket with the GPU caches as they are
    share = math.ceil(1000 * cpu_need / n) / 10  # (a share rounded up holds them: `cache_rows` rounds)
    raise MomentError(
        f"{f'machine {machine!r}' if machine else 'the machine'} has no SSD, so its caches must hold all {n:,} rows of the dataset "
        f"({fmt_size(n * dataset.row_bytes)}), but they hold {held:,}: {_count(n_gpus, 'GPU')} x {gpu:,} rows "
        f"({g}) + {_count(n_sockets, 'socket')} x {cpu:,} rows ({c})", source=str(dataset.path), field="ssds",
        hint=f"raise {c} (e.g. {c} {share:g}%) or {g} until they hold every row, or give the machine SSDs",
        remedies={"cpu_cache": f"raise {c}", "gpu_cache": f"raise {g}", "ssds": "add SSDs"})


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def device_counts(topo: Topology, inventory: Inventory) -> tuple[int, int]:
    """(GPUs fed, sockets) once the inventory is placed: devices in slots are replaced by it (as in
    `make_plan`), GPUs fixed on the board stay."""
    bare, _ = strip(topo)
    return inventory.count(Kind.gpu) + len(bare.of_kind(Kind.gpu)), len(bare.of_kind(Kind.socket))


def ssd_count(topo: Topology, inventory: Inventory) -> int:
    """SSDs once the inventory is placed (as `device_counts` counts GPUs): 0 is a machine whose caches must
    hold every row."""
    bare, _ = strip(topo)
    return inventory.count(Kind.ssd) + len(bare.of_kind(Kind.ssd))


def epochs_sampled(hotness: Hotness) -> float:
    """Epochs the pre-sampling covered (a fraction with `--batches`)."""
    per_epoch = hotness.meta.get("batches_per_epoch")
    if per_epoch:
        return hotness.num_batches / float(per_epoch)
    return float(hotness.meta.get("epochs") or 1.0)


def workload_from_hotness(
    dataset: GraphDataset, hotness: Hotness, gpu_cache_rows_per_gpu: int, cpu_cache_rows_per_socket: int,
    n_gpus: int, n_sockets: int, fanouts: list[int], batch_size: int, *, order: np.ndarray | None = None,
    name: str | None = None, heldout: np.ndarray | None = None,
) -> WorkloadSpec:
    """The planner's workload measured by pre-sampling.

    GPU caches hold the n_gpus x rows hottest nodes, CPU caches the next n_sockets x rows; their shares
    are the part of `heldout`'s reads (moment.workload.hotness.heldout_reads: another sample than the one
    that chose the rows; None: the hotness's own, which over-states them) those rows take. Bytes per GPU
    per epoch = feature reads per epoch x row bytes / GPUs. `order` (node ids hottest first) saves a sort
    when the caller has it.
    """
    n = dataset.num_nodes
    if hotness.num_nodes != n:
        raise MomentError(f"the hotness counts {hotness.num_nodes} nodes but the dataset has {n}",
                          source=str(dataset.path), hint="pre-sample this dataset again")
    if n_gpus <= 0:
        raise MomentError("the plan has no GPU: there is nothing to feed")
    h = hotness.feature_reads
    order = hotness_order(h, order)
    csum = np.concatenate(([0], np.cumsum(h[order], dtype=np.int64)))
    total = int(csum[-1])
    if total <= 0:
        raise MomentError("pre-sampling read no feature rows", source=str(dataset.path),
                          hint="check the train split and --batches")
    g = min(n, n_gpus * max(gpu_cache_rows_per_gpu, 0))
    c = min(n, g + n_sockets * max(cpu_cache_rows_per_socket, 0))
    if heldout is not None and float(np.sum(heldout, dtype=np.float64)) > 0:
        judged = np.concatenate(([0], np.cumsum(np.asarray(heldout)[order], dtype=np.int64)))
    else:
        judged = csum
    gpu_share = float(judged[g]) / float(judged[-1])
    cpu_share = min(float(judged[c] - judged[g]) / float(judged[-1]), 1.0 - gpu_share)
    reads_per_epoch = total / epochs_sampled(hotness)
    try:
        return WorkloadSpec(
            name=name or f"{dataset.manifest.name or dataset.path.name} (pre-sampled)",
            num_nodes=n,
            feature_dim=dataset.feature_dim,
            feature_bytes=dataset.feature_dtype.itemsize,
            train_fraction=min(1.0, max(len(dataset.train_idx), 1) / n),
            batch_size=batch_size,
            fanouts=list(fanouts),
            unique_ratio=min(1.0, max(hotness.unique_ratio, 1e-9)),
            gpu_cache_share=gpu_share,
            cpu_cache_share=cpu_share,
            bytes_per_gpu_per_epoch=reads_per_epoch * dataset.row_bytes / n_gpus,
        )
    except ValidationError as e:
        raise validation_error(e, "measured workload is invalid") from None


def suggest_caches(hotness: np.ndarray, order: np.ndarray, n_gpus: int, n_sockets: int,
                   ssd_share: float = 0.5) -> tuple[float, float]:
    """(--gpu-cache %, --cpu-cache %) of the dataset under which the SSDs serve about `ssd_share` of
    the reads: the hottest rows (`order`) serving the rest, split evenly between the GPU and the CPU
    caches. `hotness`: the reads to judge by (a held-out sample's, as `workload_from_hotness` does)."""
    n = hotness.shape[0]
    csum = np.cumsum(hotness[order], dtype=np.int64)
    total = int(csum[-1]) if n else 0
    k = int(np.searchsorted(csum, (1.0 - ssd_share) * total)) + 1 if total else n // 2
    floor = 100.0 / max(n, 1)  # at least one row per cache
    gpu = max(100.0 * k / 2 / max(n_gpus, 1) / n, floor)
    cpu = max(100.0 * k / 2 / max(n_sockets, 1) / n, floor)
    return float(f"{gpu:.2g}"), float(f"{cpu:.2g}")


def cache_notes(workload: WorkloadSpec, cache: CacheRows, hotness: np.ndarray, order: np.ndarray,
                n_gpus: int, n_sockets: int, ssds: bool = True) -> list[str]:
    """Say so when the caches hold every node training reads (training would read nothing from the
    SSDs, which a small experiment then never exercises), with cache sizes that would. `hotness`: the
    reads to judge by, `order`: the rows hottest first (see `suggest_caches`). `ssds`: whether the machine
    has SSDs (without one the caches must hold every row: nothing to say)."""
    if workload.ssd_share > 1e-9 or not ssds:
        return []
    n = hotness.shape[0]
    gpu, cpu = suggest_caches(hotness, order, n_gpus, n_sockets)
    return [f"the caches (GPU {n_gpus} x {cache.gpu:,} rows, CPU {n_sockets} x {cache.cpu:,} rows, of {n:,}) "
            f"hold every node training reads: training will read nothing from the SSDs. To exercise the "
            f"SSD path, place with smaller caches, e.g. --gpu-cache {gpu:g}% --cpu-cache {cpu:g}% (the SSDs "
            f"then serve about half the reads)"]


# ---- plans --------------------------------------------------------------------------------------------


def load_plan(path: str, topo: Topology, inventory: Inventory) -> Plan:
    """A `moment plan --json` file, checked against the machine and inventory it is used with."""
    from moment.planner.api import check_plan_placement, read_plan

    plan = read_plan(path)
    if plan.machine != topo.name:
        raise MomentError(f"the plan is for machine {plan.machine!r}, not {topo.name!r} (--profile)",
                          source=str(path), hint=f"use --profile {plan.machine} or plan this machine again")
    if plan.inventory != inventory.describe():
        raise MomentError(f"the plan places {plan.inventory!r}, but the inventory is {inventory.describe()!r}",
                          source=str(path), hint="pass the --gpus/--ssds (and models) the plan was made with")
    check_plan_placement(plan, topo, str(path))
    return plan


#: how a layout's hardware placement is described when no --plan was given
RECOMMENDED = "recommended by `moment plan` for this machine and inventory"


def recommended_plan(topo: Topology, inventory: Inventory, *, progress=None) -> Plan:
    """The hardware placement `moment plan` recommends for `topo` and `inventory` (same search, same
    default workload, so `moment plan` and `moment place` agree). Not searched with the measured
    workload: a small dataset's caches serve every read, every placement then ties at ~0 s and the
    tie-break would pick the first slots (the packed layout) -- where the cards go is decided for the
    job the machine is built for, then re-evaluated for this dataset by `replan`. A machine without an
    SSD is searched with the CPU caches serving what the GPU caches do not (`check_caches_hold_all` made
    sure they can): the default workload leaves a share to SSDs it does not have."""
    from moment.planner.plan import make_plan

    workload = WorkloadSpec()
    if ssd_count(topo, inventory) == 0:
        workload = WorkloadSpec(cpu_cache_share=1.0 - workload.gpu_cache_share)
    return make_plan(topo, inventory, workload, progress=progress)


def hardware_record(plan: Plan, source: str) -> dict:
    """What a layout records about the hardware it assumed (manifest extra "hardware")."""
    return {"source": source, "machine": plan.machine, "inventory": plan.inventory,
            "placement": dict(plan.placement), "devices": dict(plan.devices)}


def replan(plan: Plan, topo: Topology, workload: WorkloadSpec) -> Plan:
    """`plan`'s hardware placement re-evaluated with the measured workload (no search). Its baselines
    were for another workload, so they are dropped."""
    from moment.planner.evaluate import BOTTLENECK_UTILISATION, evaluate

    bare, _ = strip(topo)
    ev = evaluate(bare, plan.placement, workload, data=plan.data)
    return plan.model_copy(update={
        "workload": workload, "placement": ev.placement, "devices": ev.devices, "predicted": ev.predicted,
        "predicted_even": ev.predicted_even, "predicted_maxflow": ev.predicted_maxflow, "links": ev.links,
        "bottlenecks": [u.id for u in ev.links if u.utilisation >= BOTTLENECK_UTILISATION],
        "baselines": [], "gain_vs_best_baseline": None,
    })


def bins_from_plan(
    plan: Plan | Evaluation, topo: Topology, *, cache: CacheRows, row_bytes: int, ssd_stride: int,
    ssd_paths: dict[str, str] | None = None,
) -> BinSet:
    """One bin per storage node of the plan, in order GPU caches (`hbm:gpuN`), socket memories
    (`mem:cpuN`), SSDs (`ssdN`); target = the plan's storage share; capacity in rows (SSDs at the
    on-disk stride); socket = the socket the storage node hangs under; SSD mount paths from
    `ssd_paths` (SSD id -> directory; others are written inside the layout). `plan` may also be an
    `evaluate()` result (a fixed placement)."""
    bare, _ = strip(topo)
    full = populate(bare, plan.placement)
    shares = plan.predicted.storage_shares
    ssd_paths = dict(ssd_paths or {})
    ssds = [d for d in full.of_kind(Kind.ssd)]
    unknown = sorted(set(ssd_paths) - {d.id for d in ssds})
    if unknown:
        raise MomentError(f"--ssd-path names {unknown}, which the plan does not have",
                          hint=f"the plan's SSDs are {[d.id for d in ssds] or 'none'}")
    sockets = full.of_kind(Kind.socket)
    cpu_total = cache.cpu * len(sockets)
    cpu_share = sum(shares.get(f"mem:{s.id}", 0.0) for s in sockets)

    where = _device_places(topo, full)
    out = [Bin(name=f"hbm:{g.id}", kind="gpu", capacity_rows=cache.gpu, target_share=_share(shares, f"hbm:{g.id}"),
               socket=full.socket_of(g.id), **where[g.id]) for g in full.of_kind(Kind.gpu)]
    for s in sockets:
        share = _share(shares, f"mem:{s.id}")
        # (without an SSD each socket keeps its own: rows the shares' rounding dropped would have no home)
        rows = round(cpu_total * share / cpu_share) if cpu_share > 0 and ssds else cache.cpu
        rows = min(rows, int(s.memory_gib * GiB) // row_bytes)
        out.append(Bin(name=f"mem:{s.id}", kind="cpu", capacity_rows=rows, target_share=share, socket=s.id))
    for d in ssds:
        out.append(Bin(name=d.id, kind="ssd", capacity_rows=int(d.capacity_gb * 1e9) // ssd_stride,
                       target_share=_share(shares, d.id), socket=full.socket_of(d.id), path=ssd_paths.get(d.id),
                       **where[d.id]))
    extra = sorted(set(shares) - {b.name for b in out})
    if extra:
        raise MomentError(f"the plan's storage nodes {extra} are not in machine {topo.name!r}")
    return BinSet(bins=out)  # (without an SSD `check_caches_hold_all` made sure the caches hold every row)


def _device_places(topo: Topology, full: Topology) -> dict[str, dict[str, str | None]]:
    """Plan device id -> its slot and PCI address. A placed device takes the address of the card the
    scanned machine had in that slot (or the slot's own); a built-in one keeps its own."""
    slots = {n.id for n in full.of_kind(Kind.slot)}
    scanned = {n.parent: n.pci for k in (Kind.gpu, Kind.ssd) for n in topo.of_kind(k) if n.pci and n.parent in slots}
    out = {}
    for d in [*full.of_kind(Kind.gpu), *full.of_kind(Kind.ssd)]:
        slot = d.parent if d.parent in slots else None
        pci = d.pci or scanned.get(slot) or (full.node(slot).pci if slot else None)
        out[d.id] = {"device": d.id, "slot": slot, "pci": pci}
    return out


def _share(shares: dict[str, float], key: str) -> float:
    return max(0.0, float(shares.get(key, 0.0)))


POLICIES = ("ddak", "hash", "degree")


def run_policies(
    hotness: np.ndarray, bins: BinSet, *, pool: int | None = 100, order: np.ndarray | None = None,
    required: str = "ddak", only: bool = False,
) -> tuple[dict[str, Assignment], dict[str, str], dict[str, float]]:
    """Run DDAK and the baselines on the same hotness and bins: (assignments, errors, seconds).

    A baseline that cannot place the nodes (hash overfilling an SSD) is reported in `errors`; the
    `required` policy (the one to be written) raises instead. `pool=None`: `auto_pool`. `only`: run the
    required policy alone (no comparison wanted).
    """

    if required not in POLICIES:
        raise MomentError(f"unknown policy {required!r}; choose one of {', '.join(POLICIES)}")
    order = hotness_order(hotness, order)
    if pool is None:
        pool = auto_pool(hotness, bins, order)
    run = {
        "ddak": lambda: ddak(hotness, bins, pool, order=order),
        "hash": lambda: hash_placement(hotness, bins, order=order),
        "degree": lambda: degree_placement(hotness, bins, order=order),
    }
    out: dict[str, Assignment] = {}
    errors: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for name in (required,) if only else POLICIES:
        t = time.perf_counter()
        try:
            out[name] = run[name]()
        except MomentError as e:
            if name == required:
                raise
            errors[name] = str(e)
        seconds[name] = time.perf_counter() - t
    return out, errors, seconds
