"""One run's derived decisions, made once: `resolve_run(config, layout, ...) -> RunPlan`.

Why: what a run's options imply (`--io-shape auto` -> packed or block, whether the layout's pack was
sampled for this run, which plan GPUs' bins each rank holds and how many of their rows, how the
memory budget splits into CPU cache and read buffers, how far reads run ahead) used to be worked out
in several places: the trainer, the store, the launcher's preview, the SSD-read model, each from the
manifests again and some by rewriting the configuration in place. Here it is worked out once, from
the configuration (never changed) and one opened `Layout`; the store, the trainer, the SSD-read model,
`moment data pack` and the benches read the result, and `moment train --dry-run --json` prints it.

Pure: no torch (a test imports it with torch made unimportable). What needs torch or sampling, the
batch extent measured on sampled batches and the sizes torch's objects state (the sampler's node
table, a batch's ids, the pipeline's batches in flight), and what the ranks agree on (their maxima,
through an all-reduce), the caller measures and passes in as `RunInputs`. Each component states its
own memory (the layout index, the cache policies, the reader's staging); the budget asks them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, computed_field

from moment.caching.tiers import lookahead, shared_by_local_ranks
from moment.errors import MomentError
from moment.io.device import DeviceMemory, ring_bytes, upload_chunk
from moment.io.merge import SHAPES, Shape
from moment.placement.opened import Layout, index_dtypes
from moment.placement.pack import pack_path, refuse_unusable, what_it_holds
from moment.runtime.budget import (Item, MemoryBudget, RunShape, Split, fmt_bytes, minimum_budget, process_sizes,
                                   resolve_budget, split_budget)
from moment.runtime.device_budget import DeviceBudget, DeviceShape, device_budget, resolve_device_budget
from moment.runtime.devices import plan_gpus_of
from moment.runtime.gather import staging_bytes
from moment.runtime.store_options import Collectives, Place, StoreOptions, local_world_size
from moment.sizes import parse_size

if TYPE_CHECKING:
    from pathlib import Path

    from moment.runtime.config import TrainConfig


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PackMatch(_Frozen):
    """The layout's pack against this run: looked at only when --io-shape is auto or packed."""

    checked: bool  # --io-shape auto or packed: the pack was looked at
    present: bool | None = None  # the layout has a pack (None: not looked at)
    matches: bool | None = None  # made for this run's ranks, batch size, fan-outs and seed
    why: str | None = None  # why it is not read (none, other batches, or --io-shape rows/block)
    index_bytes: int = 0  # what one rank holds of its index when the run reads it
    cached_rows: int = 0  # the hottest rows the pack leaves out, for caches that hold them (`moment data pack --cached`)
    epochs: int = 0  # the epochs of segments the pack holds, when the run reads it
    run_epochs: int = 0  # the run's --epochs: those past `epochs` are read from the layout, at block's speed
    repack: str | None = None  # the `moment data pack` that packs every epoch of the run, when some are not

    def unpacked(self) -> str | None:
        """The run's epochs the pack does not hold, as its notes and the dry run say them (None: none)."""
        if not self.epochs or self.run_epochs <= self.epochs:
            return None
        which = (f"epoch {self.run_epochs}" if self.run_epochs == self.epochs + 1
                 else f"epochs {self.epochs + 1}..{self.run_epochs}")
        return f"{which} read from the layout"

    def notes(self) -> list[str]:
        """The note a run gives at its start and end, with the command that packs every epoch ([] when none)."""
        short = self.unpacked()
        return [f"note: {short} (the pack holds {self.epochs}); to pack them all: {self.repack}"] if short else []


class GpuRows(_Frozen):
    """Rows of one GPU bin (its hottest first) on a rank's GPU tier."""

    bin: str
    shard: int  # the bin's shard in the layout
    rows: int


class RankPlan(_Frozen):
    rank: int
    local_rank: int
    plan_gpus: tuple[str, ...]  # the plan GPUs whose bins this rank holds (moment.runtime.devices)
    gpu_bins: tuple[GpuRows, ...]
    ssd_shares: dict[str, float]  # per SSD bin, the share of this rank's SSD rows the plan routes to it

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_rows(self) -> int:
        """Rows on this rank's GPU tier, all its bins together."""
        return sum(b.rows for b in self.gpu_bins)


class TierPlan(_Frozen):
    """How every rank's tiers and reads are shaped (the same on every rank)."""

    policy: str
    shape: str
    merge_gap: int  # -1: per job, the gap whose reads cost least (moment.io.merge)
    max_request: int
    superbatch: int
    lookahead: int  # batches submitted before the first is completed
    cpu_rows: int
    shared_cache: bool  # one CPU cache for the machine's ranks
    buffer_bytes: int  # read buffers per rank
    batch_bytes: int  # the most bytes of rows one batch holds (the batch extent): sizes the staging ring's slots
    window: int
    peer_tier: bool
    remote_tier: bool = False  # a split layout: other machines' rows come from their owners
    io_backend: str | None
    queue_depth: int
    direct: bool
    verify: bool
    pack_seed: int | None
    io_trace: str | None = None  # a directory: each rank's SSD reads as an fio iolog (moment.io.trace)

    @property
    def io_shape(self) -> Shape:
        return SHAPES[self.shape].limited(self.merge_gap, self.max_request)


class SplitPlan(_Frozen):
    """This machine's part of a layout split over machines (moment.placement.split): what its remote tier
    fetches from whom."""

    id: str
    machine: int  # this machine's index: its --node-rank
    name: str
    machines: tuple[str, ...]
    replicated_rows: int  # held by every machine
    held_rows: int  # in this machine's layout
    remote_rows: dict[str, int]  # per other machine, the rows it owns


class MemoryItem(_Frozen):
    name: str
    bytes: int
    shared: bool
    machine_bytes: int
    note: str = ""


class DeviceItem(_Frozen):
    name: str
    bytes: int
    note: str = ""


class DevicePlan(_Frozen):
    """A rank's device budget (moment.runtime.device_budget): every item charged, and the GPU tier it allows."""

    budget_bytes: int | None  # None: not known where the plan was resolved (the launcher reads no device)
    source: str
    predicted_peak_bytes: int
    items: tuple[DeviceItem, ...]
    gpu_rows: int  # rows each rank's GPU tier may hold (at most gpu_rows_wanted)
    gpu_rows_wanted: int  # rows of a rank's GPU bins

    @classmethod
    def of(cls, b: DeviceBudget) -> DevicePlan:
        return cls(budget_bytes=b.total, source=b.source, predicted_peak_bytes=b.used,
                   items=tuple(DeviceItem(name=i.name, bytes=i.bytes, note=i.note) for i in b.items),
                   gpu_rows=b.gpu_rows, gpu_rows_wanted=b.wanted_rows)

    def budget(self) -> DeviceBudget:
        return DeviceBudget(self.budget_bytes, self.source, [Item(i.name, i.bytes, False, i.note) for i in self.items],
                            self.gpu_rows, self.gpu_rows_wanted)


class MemoryPlan(_Frozen):
    """The budget's split (moment.runtime.budget): every item charged, and what it granted; on CUDA, beside
    it, each rank's device budget."""

    budget_bytes: int | None
    source: str
    local_ranks: int
    margin: int
    predicted_peak_bytes: int
    items: tuple[MemoryItem, ...]
    gpu_rows: int
    cpu_rows: int
    buffer_bytes: int
    shared_cache: bool
    device: DevicePlan | None = None  # a CUDA run's device budget per rank (None: a CPU run)
    heap_reuse_bytes: int = 0  # freed heap a rank keeps for reuse (moment.runtime.heap)

    @classmethod
    def of(cls, s: Split, device: DeviceBudget | None = None) -> MemoryPlan:
        b = s.budget
        return cls(budget_bytes=b.total, source=b.source, local_ranks=b.local_ranks,
                   margin=b.margin if b.total else 0, predicted_peak_bytes=b.used,
                   items=tuple(MemoryItem(name=i.name, bytes=i.bytes, shared=i.shared, machine_bytes=b._machine(i),
                                          note=i.note) for i in b.items),
                   gpu_rows=s.gpu_rows, cpu_rows=s.cpu_rows, buffer_bytes=s.buffer_bytes, shared_cache=s.shared_cache,
                   device=DevicePlan.of(device) if device is not None else None, heap_reuse_bytes=s.heap_reuse_bytes)

    def budget(self) -> MemoryBudget:
        return MemoryBudget(self.budget_bytes, self.local_ranks, self.source,
                            [Item(i.name, i.bytes, i.shared, i.note) for i in self.items])

    def lines(self) -> list[str]:
        return self.budget().lines() + (self.device.budget().lines() if self.device is not None else [])

    def as_dict(self) -> dict:
        """The metrics JSON's `memory`: the budget, the predicted peak and the items; `device`: a CUDA run's
        device budget per rank, the same keys (None on CPU runs)."""
        return {**self.budget().as_dict(), "device": self.device.budget().as_dict() if self.device is not None else None}


class StorePlan(_Frozen):
    """What one rank's store builds: the tiers, and this rank's part; `memory`: how a store opened outside a
    run under a memory budget split it (`plan_store`; None: no budget, or a training run's, which its
    RunPlan holds)."""

    tiers: TierPlan
    rank: RankPlan
    world_size: int
    local_world_size: int
    memory: MemoryPlan | None = None


class RunPlan(_Frozen):
    layout: str
    world_size: int
    local_world_size: int
    device: str  # "cpu" or "cuda": on CUDA the GPU tier is in device memory, as much as memory.device allows
    io_shape: str  # rows, block or packed (never auto)
    io_shape_requested: str
    pack: PackMatch
    cache_policy: str
    batch_size: int
    fanouts: tuple[int, ...]
    seed: int
    tiers: TierPlan
    ranks: tuple[RankPlan, ...]
    memory: MemoryPlan
    split: SplitPlan | None = None  # a split layout: this machine's part (None: every row is here)

    def store_plan(self, rank: int) -> StorePlan:
        return StorePlan(tiers=self.tiers, rank=self.ranks[rank], world_size=self.world_size,
                         local_world_size=self.local_world_size)

    def lines(self) -> list[str]:
        """A short summary for people (`moment train --dry-run`)."""
        t = self.tiers
        short = self.pack.unpacked()
        beyond = (f"; it holds {self.pack.epochs} epoch(s): {short}, at about block's speed (to pack them all: "
                  f"{self.pack.repack})") if short else ""
        how = {"packed": "reads the layout's pack (made for these ranks, batch size, fan-outs and seed, "
                         f"{what_it_holds(self.pack.cached_rows)}){beyond}",
               "block": "a hyperbatch's misses in large merged reads", "rows": "each batch's rows"}[self.io_shape]
        why = f"; not packed: {self.pack.why}" if self.io_shape_requested == "auto" and self.pack.why else ""
        gap = "per job, by cost" if t.merge_gap < 0 else f"{t.merge_gap} B"
        out = [f"run plan: layout {self.layout}, {self.world_size} rank(s), {self.local_world_size} on this "
               f"machine, device {self.device}",
               f"I/O shape {self.io_shape} ({self.io_shape_requested}): {how}{why}",
               f"  superbatch {t.superbatch}, lookahead {t.lookahead} batches, merge gap {gap}, largest read "
               f"{fmt_bytes(t.max_request)}, read buffers {fmt_bytes(t.buffer_bytes)} per rank",
               f"cache policy {t.policy}: {t.cpu_rows:,} CPU-cache rows "
               f"({'one shared segment' if t.shared_cache else 'per rank'}); peer tier "
               f"{'on' if t.peer_tier else 'off'}",
               *self._split_lines(),
               f"batches: {self.batch_size} seeds per rank, fan-outs {','.join(map(str, self.fanouts))}, "
               f"seed {self.seed}"]
        for r in self.ranks:
            gpus = ", ".join(r.plan_gpus) or "no GPU bin"
            shares = ", ".join(f"{k} {v:.0%}" for k, v in r.ssd_shares.items()) or "no SSD bin"
            out.append(f"rank {r.rank} (local {r.local_rank}): {gpus}, {r.gpu_rows:,} GPU-tier rows; "
                       f"SSD shares {shares}")
        return out + self.memory.lines()

    def _split_lines(self) -> list[str]:
        s = self.split
        if s is None:
            return []
        far = ", ".join(f"{v:,} on {k}" for k, v in s.remote_rows.items())
        return [f"remote tier on: machine {s.name} (node rank {s.machine}) of a split over {len(s.machines)} machines "
                f"holds {s.held_rows:,} rows ({s.replicated_rows:,} on every machine); {far}, fetched from their "
                "owners each batch"]


@dataclass(frozen=True)
class RunInputs:
    """What `resolve_run` is given rather than derives: facts of the dataset, and what is measured with
    torch or by sampling (under torchrun, the ranks' maxima: every rank resolves the same plan)."""

    train_nodes: int  # the dataset's training seeds (the batch size follows from them)
    graph_bytes: int  # indptr + indices files
    labels_bytes: int
    rows_max: int  # the most rows one batch touches (sampled, with headroom; at most the graph's nodes)
    edges_max: int
    process_bytes: int  # a rank's fixed cost: interpreter, torch, the model's layers (its own pages)
    sampler_map_bytes: int  # NeighborSampler.map_bytes(num_nodes)
    batch_ids_bytes: int  # MiniBatch.id_bytes(rows_max, edges_max)
    held_batches: int  # Pipeline.held_batches(depth)
    training_bytes: int  # one training step of the model at the extent (moment.runtime.model_spec.training_bytes)
    training_note: str | None = None  # how a model of the user's own was sized, when measured at start
    agent_bytes: int = 0  # torchrun's agent beside the ranks (its peak RSS, measured); 0: no agent
    exchange_bytes: int = 0  # one round of the peer exchange at the extent (RowExchange.round_bytes, with
    #                          what a rank's GPU tier holds: gpu_tier_rows)
    remote_exchange_bytes: int = 0  # a split layout: one round of the remote exchange (footprint.remote_round_bytes)
    remote_reader_bytes: int = 0  # a split layout: the remote tier's serving reader (footprint.remote_reader_bytes)
    device_memory: DeviceMemory | None = None  # a CUDA run: the least free and total memory of the ranks' devices
    #                                            (None: not read here; moment.io.device.DeviceLayer.memory)
    process_measured_on: str | None = None  # a preview reused a recorded `process_bytes` measured that day
    shared_start_bytes: int = 0  # pages the ranks and the agent share at start, held once (budget.process_sizes)
    index_shared: bool = False  # every local rank reads the layout index its agent kept (Layout.keep_index)


def resolve_run(config: TrainConfig, layout: Layout, *, world_size: int, local_world_size: int,
                inputs: RunInputs, device: str = "cpu", pack_index_bytes: int | None = None) -> RunPlan:
    """Every derived decision of a tiered run, once. `pack_index_bytes`: charge the index of a pack about
    to be written instead of the layout's, and split as the packed run that will read it (`moment data pack`
    under a budget leaves out what that run's cache holds)."""
    cfg = config
    if cfg.features != "tiered":
        raise MomentError("a run plan describes a tiered run (--layout); the --features-in-memory and "
                          "--features-memmap baselines have no tiers to plan")
    m = layout.manifest
    n, rb = m.dataset.num_nodes, m.row.row_bytes
    lws = max(1, local_world_size)
    fanouts = cfg.resolved_fanouts()
    batch_size = cfg.resolved_batch_size(inputs.train_nodes, world_size)
    shape, pack = _io_shape(cfg, layout, world_size, batch_size, fanouts)
    if pack_index_bytes is not None:  # the pack the run will read is not written yet: split as that run's
        shape, pack = "packed", pack.model_copy(update={"index_bytes": int(pack_index_bytes)})
    superbatch = cfg.resolved_superbatch(shape)
    ahead = lookahead(superbatch)
    gpu_shards = layout.shards_of("gpu")
    own_rows = gpu_tier_rows(layout, lws)
    peer_tier = cfg.peer_tier_on(device) and lws > 1
    remote_tier = layout.split is not None
    total, how = resolve_budget(cfg.memory_budget)
    exchange = inputs.exchange_bytes if peer_tier and gpu_shards else 0
    remote_exchange = inputs.remote_exchange_bytes if remote_tier else 0
    split = split_budget(total, how, lws, _run_shape(
        inputs, n, rb, shape, ahead, policy=cfg.cache_policy, cpu_limit_rows=_cpu_limit_rows(cfg, n, rb),
        index_bytes=layout.index_bytes, own_gpu_rows=own_rows, layout_cpu_rows=layout.cpu_bin_rows, align=m.row.align,
        exchange_bytes=exchange, remote_exchange_bytes=remote_exchange,
        remote_reader_bytes=inputs.remote_reader_bytes if remote_tier else 0,
        pack_index_bytes=pack.index_bytes if shape == "packed" else 0,
        device=device, stride=_gpu_stride(layout), model_step=not cfg.data_only))
    if device == "cpu":
        _no_device_budget(cfg)
        dev, gpu_cap = None, split.gpu_rows  # the GPU tier's stand-in, granted by the host budget
    else:  # --device-memory-budget against the ranks' least free device memory; NCCL communicators: the
        #    world group's (every collective, the exchanges' too: moment.runtime.exchange), and with several
        #    machines of several ranks each the machine's own group (its barrier: DistContext.node_group)
        dev = device_budget(*resolve_device_budget(cfg.device_memory_budget, inputs.device_memory), DeviceShape(
            row_bytes=rb, own_gpu_rows=own_rows, rows_max=inputs.rows_max, batch_ids_bytes=inputs.batch_ids_bytes,
            held_batches=inputs.held_batches, training_bytes=inputs.training_bytes, exchange_bytes=exchange,
            remote_exchange_bytes=remote_exchange, communicators=(1 + (world_size > lws > 1)) if world_size > 1 else 0))
        gpu_cap = dev.gpu_rows if dev.capped else None  # None: every row of the rank's bins
    options = StoreOptions(io_backend=cfg.io_backend, queue_depth=cfg.queue_depth, direct=cfg.direct,
                           verify=cfg.verify, cpu_rows=split.cpu_rows, gpu_rows=gpu_cap, policy=cfg.cache_policy,
                           shape=shape, superbatch=superbatch, buffer_bytes=split.buffer_bytes,
                           merge_gap=cfg.io_merge_gap, max_request=cfg.io_max_request, shared_cache=split.shared_cache,
                           pack_seed=cfg.seed, batch_rows=inputs.rows_max,
                           io_trace=None if cfg.io_trace is None else str(cfg.io_trace))
    tiers = tier_plan(layout, options, shared_cache=split.shared_cache, peer_tier=peer_tier, remote_tier=remote_tier)
    ranks = tuple(rank_plan(layout, r, r % lws, lws, gpu_cap) for r in range(world_size))
    return RunPlan(layout=str(layout.path), world_size=world_size, local_world_size=lws, device=device,
                   io_shape=shape, io_shape_requested=cfg.io_shape, pack=pack, cache_policy=cfg.cache_policy,
                   batch_size=batch_size, fanouts=tuple(fanouts), seed=cfg.seed, tiers=tiers, ranks=ranks,
                   memory=MemoryPlan.of(split, dev), split=split_plan(layout))


def _no_device_budget(cfg: TrainConfig) -> None:
    """A CPU run has no device memory: --device-memory-budget there is a mistake, said so."""
    if cfg.device_memory_budget is not None:
        raise MomentError(f"--device-memory-budget {cfg.device_memory_budget}: this run is on the CPU (--device cpu, "
                          "or no CUDA device), where the GPU tier is a stand-in in host memory, sized by "
                          "--memory-budget", hint="leave --device-memory-budget out, or train with --device cuda")


def split_plan(layout: Layout) -> SplitPlan | None:
    """A split layout's part of the run plan (None for a layout holding every row)."""
    s = layout.split
    if s is None:
        return None
    return SplitPlan(id=s.id, machine=s.machine, name=s.name, machines=tuple(s.machines),
                     replicated_rows=s.replicated_rows, held_rows=layout.num_nodes - s.remote_rows,
                     remote_rows={r.name: r.rows for r in s.remote})


def _run_shape(inputs: RunInputs, n: int, rb: int, shape: str, ahead: int, *, policy: str,
               cpu_limit_rows: int | None, index_bytes: int, own_gpu_rows: int, layout_cpu_rows: int, align: int,
               exchange_bytes: int, pack_index_bytes: int, remote_exchange_bytes: int = 0,
               remote_reader_bytes: int = 0, device: str = "cpu", stride: int = 0, model_step: bool = True) -> RunShape:
    """The host budget's inputs; on CUDA with the pinned staging ring at the batch extent and, when the rank
    has GPU-tier rows, the upload's pinned chunk and that chunk's rows as read at the GPU bins' `stride`.
    `cpu_limit_rows`: the most CPU-cache rows asked (--cpu-cache-limit; None: as many as fit)."""
    cuda = device == "cuda"
    chunk_rows, chunk = upload_chunk(rb, own_gpu_rows)
    return RunShape(
        num_nodes=n, row_bytes=rb, graph_bytes=inputs.graph_bytes, labels_bytes=inputs.labels_bytes,
        rows_max=inputs.rows_max, training_bytes=inputs.training_bytes, training_note=inputs.training_note,
        held_batches=inputs.held_batches,
        lookahead=ahead, sampler_map_bytes=inputs.sampler_map_bytes, batch_ids_bytes=inputs.batch_ids_bytes,
        index_bytes=index_bytes, own_gpu_rows=own_gpu_rows,
        layout_cpu_rows=layout_cpu_rows, cpu_limit_rows=cpu_limit_rows,
        policy=policy, shape=shape, staging_bytes=staging_bytes(align),
        process_bytes=inputs.process_bytes, process_measured_on=inputs.process_measured_on,
        shared_start_bytes=inputs.shared_start_bytes, index_shared=inputs.index_shared,
        agent_bytes=inputs.agent_bytes, exchange_bytes=exchange_bytes,
        pack_index_bytes=pack_index_bytes, remote_exchange_bytes=remote_exchange_bytes,
        remote_reader_bytes=remote_reader_bytes, device=device, model_step=model_step,
        ring_bytes=ring_bytes(inputs.rows_max * rb) if cuda else 0,
        upload_bytes=chunk + chunk_rows * max(stride, rb) if cuda and own_gpu_rows else 0)


def _cpu_limit_rows(cfg: TrainConfig, n: int, rb: int) -> int | None:
    """--cpu-cache-limit in rows (None: not given)."""
    return None if cfg.cpu_cache_limit is None else parse_size(cfg.cpu_cache_limit, n * rb) // rb


def _gpu_stride(layout: Layout) -> int:
    """The widest slot of the layout's GPU bins (the upload reads the GPU tier's rows at it)."""
    m = layout.manifest
    return max((m.shards[i].stride for i in layout.shards_of("gpu")), default=m.row.row_bytes)


def planned_minimum(cfg: TrainConfig, inputs: RunInputs, *, num_nodes: int, row_bytes: int, nproc: int,
                    shards: int, gpu_rows: int, align: int, device: str = "cpu") -> MemoryBudget:
    """The fixed needs `resolve_run` charges an `nproc`-rank run on one machine whose layout is not
    written yet (`shards` bins, `gpu_rows` in each rank's GPU tier), by the same rule: `.minimum()` is the
    least --memory-budget it accepts. `inputs` as `run_inputs` measures them (the batch extent sampled
    on the graph, a round of the peer exchange at `row_bytes` with `gpu_rows` held, charged where the ranks' `device`
    takes the peer tier). --io-shape auto/packed plans as block: a pack's index is known only once its batches are
    sampled, and is not charged here."""
    shape = "block" if cfg.io_shape in ("auto", "packed") else cfg.io_shape
    peer = cfg.peer_tier_on(device) and nproc > 1 and gpu_rows > 0
    return minimum_budget(nproc, _run_shape(
        inputs, num_nodes, row_bytes, shape, lookahead(cfg.resolved_superbatch(shape)), policy=cfg.cache_policy,
        cpu_limit_rows=_cpu_limit_rows(cfg, num_nodes, row_bytes),
        index_bytes=num_nodes * sum(d.itemsize for d in index_dtypes(shards, num_nodes)), own_gpu_rows=gpu_rows,
        layout_cpu_rows=0, align=align, exchange_bytes=inputs.exchange_bytes if peer else 0, pack_index_bytes=0))


def _io_shape(cfg: TrainConfig, layout: Layout, world_size: int, batch_size: int,
              fanouts: list[int]) -> tuple[str, PackMatch]:
    """--io-shape resolved (auto: packed when the layout's pack was sampled for this run, else block);
    --io-shape packed without a pack for this run is refused, naming the difference."""
    if cfg.io_shape not in ("auto", "packed"):
        return cfg.io_shape, PackMatch(checked=False, why=f"--io-shape {cfg.io_shape}")
    man = layout.pack
    why = (man.mismatch(world_size=world_size, batch_size=batch_size, fanouts=fanouts, seed=cfg.seed)
           if man is not None else "the layout has no pack")
    shape = "packed" if cfg.io_shape == "packed" or why is None else "block"
    match = PackMatch(checked=True, present=man is not None, matches=man is not None and why is None, why=why)
    if shape != "packed":
        return shape, match
    if man is not None and why:
        raise MomentError(f"the pack was sampled for other batches: {why}", source=str(pack_path(layout.path)),
                          hint="rewrite it with `moment data pack --overwrite` and this run's parameters")
    refuse_unusable(layout.path, man, layout.manifest, world_size)  # none at all, or another layout's
    repack = man.command(layout.path, cfg.dataset, epochs=cfg.epochs) if cfg.epochs > man.epochs else None
    return shape, match.model_copy(update={"index_bytes": layout.pack_index_bytes, "cached_rows": man.cached_rows,
                                           "epochs": man.epochs, "run_epochs": cfg.epochs, "repack": repack})


def carve_gpu(layout: Layout, local_rank: int, local_world_size: int, gpu_rows: int | None) -> tuple[GpuRows, ...]:
    """A rank's GPU tier: the bins of the plan GPUs it serves, in layout order, hottest rows first, at
    most `gpu_rows` rows in all (None: every row of its bins)."""
    m = layout.manifest
    gpu = layout.shards_of("gpu")
    mine = plan_gpus_of(local_rank, local_world_size, [m.shards[i].bin for i in gpu])
    own = [i for i in gpu if m.shards[i].bin in mine]
    left = sum(m.shards[i].rows for i in own) if gpu_rows is None else int(gpu_rows)
    out = []
    for i in own:
        k = min(m.shards[i].rows, max(left, 0))
        left -= k
        out.append(GpuRows(bin=m.shards[i].bin, shard=i, rows=k))
    return tuple(out)


def gpu_tier_rows(layout: Layout, local_world_size: int) -> int:
    """The most rows one rank's GPU tier holds (all of its bins; a CPU run's budget may grant fewer)."""
    if not layout.shards_of("gpu"):
        return 0
    lws = max(1, local_world_size)
    return max(sum(b.rows for b in carve_gpu(layout, lr, lws, None)) for lr in range(lws))


def planned_ssd_shares(layout: Layout) -> dict[str, float]:
    """Per SSD bin, its share of the SSD rows a rank reads: its storage share among the SSDs, since
    every GPU samples the same distribution (Moment, section 3.2)."""
    m = layout.manifest
    ssd = layout.shards_of("ssd")
    target = {b.name: b.target_share for b in m.bins}
    planned = np.array([target.get(m.shards[i].bin, 0.0) for i in ssd], np.float64)
    planned = planned / planned.sum() if planned.sum() > 0 else planned
    return {m.shards[i].bin: float(p) for i, p in zip(ssd, planned, strict=True)}


def rank_plan(layout: Layout, rank: int, local_rank: int, local_world_size: int, gpu_rows: int | None) -> RankPlan:
    """One rank's part: its plan GPUs (named as the device match names them), GPU carve and SSD shares."""
    gpus = plan_gpus_of(local_rank, local_world_size, [g for g, _ in layout.gpu_devices()])
    return RankPlan(rank=rank, local_rank=local_rank, plan_gpus=gpus,
                    gpu_bins=carve_gpu(layout, local_rank, local_world_size, gpu_rows),
                    ssd_shares=planned_ssd_shares(layout))


def default_batch_rows(num_nodes: int) -> int:
    """The most rows a batch of a store outside a run asks (no batch extent was sampled): up to 2^18."""
    return min(num_nodes, 1 << 18)


def default_buffer_bytes(num_nodes: int, row_bytes: int) -> int:
    """Read buffers of a store given no budget: four batches of `default_batch_rows`, at least 256 MiB."""
    return max(256 << 20, 4 * default_batch_rows(num_nodes) * row_bytes)


def tier_plan(layout: Layout, o: StoreOptions, *, shared_cache: bool, peer_tier: bool,
              remote_tier: bool = False) -> TierPlan:
    """`StoreOptions` resolved against the layout: the shape's merge limits, the cache capped at the
    graph (not given: the layout's CPU bins, as a run without a budget holds), the read buffers' default,
    the lookahead of the superbatch."""
    n, rb = layout.num_nodes, layout.row_bytes
    shape = SHAPES[o.shape].limited(o.merge_gap, o.max_request)
    superbatch = max(1, int(o.superbatch))
    cpu_rows = layout.cpu_bin_rows if o.cpu_rows is None else int(o.cpu_rows)
    return TierPlan(policy=o.policy, shape=o.shape, merge_gap=shape.merge_gap, max_request=shape.max_request,
                    superbatch=superbatch, lookahead=lookahead(superbatch),
                    cpu_rows=max(0, min(cpu_rows, n)), shared_cache=shared_cache,
                    buffer_bytes=default_buffer_bytes(n, rb) if o.buffer_bytes is None else int(o.buffer_bytes),
                    batch_bytes=_batch_rows(n, o) * rb,
                    window=int(o.window), peer_tier=peer_tier, remote_tier=remote_tier, io_backend=o.io_backend,
                    queue_depth=o.queue_depth,
                    direct=o.direct, verify=o.verify, pack_seed=o.pack_seed, io_trace=o.io_trace)


def _batch_rows(n: int, o: StoreOptions) -> int:
    return default_batch_rows(n) if o.batch_rows is None else int(o.batch_rows)


def plan_store(layout: Layout, where: Place, options: StoreOptions, collectives: Collectives | None) -> StorePlan:
    """A store's plan outside a training run (tests, benchmarks, notebooks): its options as given, the rest
    by the rules a run plan uses. A shared cache by default when the policy allows and there is a barrier.
    Sizes not given: the layout's CPU bins and every row of the rank's GPU bins, or with
    `options.memory_budget` what that budget grants (`store_budget`)."""
    lws = local_world_size(where)
    shared = bool(options.shared_cache if options.shared_cache is not None else (
        shared_by_local_ranks(options.policy, lws) and collectives is not None))
    peers = collectives is not None and collectives.peers is not None
    remote = collectives is not None and collectives.remote is not None
    memory = None
    if options.memory_budget is not None:
        device = _device_kind(where.device)
        split = store_budget(layout, options, local_ranks=lws, shared=shared, device=device)
        memory = MemoryPlan.of(split)
        # on CUDA the GPU tier is in device memory, which this budget does not cover
        options = replace(options, cpu_rows=split.cpu_rows, gpu_rows=split.gpu_rows if device == "cpu" else
                          options.gpu_rows, buffer_bytes=split.buffer_bytes if options.buffer_bytes is None
                          else options.buffer_bytes)
    return StorePlan(tiers=tier_plan(layout, options, shared_cache=shared, peer_tier=peers, remote_tier=remote),
                     rank=rank_plan(layout, where.rank, where.local_rank, lws, options.gpu_rows),
                     world_size=where.world_size, local_world_size=lws, memory=memory)


def _device_kind(device: object) -> str:
    """"cuda" or "cpu" of a torch device or its name, without importing torch."""
    return "cuda" if str(device).startswith("cuda") else "cpu"


def store_budget(layout: Layout, options: StoreOptions, *, local_ranks: int, shared: bool,
                 device: str = "cpu") -> Split:
    """`options.memory_budget` split for a store outside a run, by the rule `moment train` splits its budget
    (moment.runtime.budget.split_budget): this process as measured now, the layout index, the reader's
    staging and at least two batches' read buffers are charged first (refused when they do not fit); on
    CPU the GPU tier's stand-in gets at most a tenth of the rest, then the CPU cache takes what is left, up
    to every row (at most `options.cpu_rows`). Nothing of a training step, sampler or graph is charged:
    none is open. `options.batch_rows` (default: `default_batch_rows`) is the largest batch asked."""
    total, how = resolve_budget(options.memory_budget)
    n, rb = layout.num_nodes, layout.row_bytes
    own = gpu_tier_rows(layout, local_ranks)
    if options.gpu_rows is not None:
        own = min(own, max(0, int(options.gpu_rows)))
    alone, with_others = process_sizes()
    inputs = RunInputs(train_nodes=0, graph_bytes=0, labels_bytes=0, rows_max=_batch_rows(n, options), edges_max=0,
                       process_bytes=alone, shared_start_bytes=with_others, sampler_map_bytes=0,
                       batch_ids_bytes=0, held_batches=0, training_bytes=0)
    shape = _run_shape(inputs, n, rb, options.shape, lookahead(max(1, int(options.superbatch))),
                       policy=options.policy, cpu_limit_rows=options.cpu_rows, index_bytes=layout.index_bytes,
                       own_gpu_rows=own, layout_cpu_rows=layout.cpu_bin_rows, align=layout.manifest.row.align,
                       exchange_bytes=0, pack_index_bytes=layout.pack_index_bytes if options.shape == "packed" else 0,
                       device=device, stride=_gpu_stride(layout), model_step=False)
    return split_budget(total, how, local_ranks, shape, shared=shared, what="this store", heap=False)


def node_ranks(plan: RunPlan, rank: int) -> list[RankPlan]:
    """The ranks on `rank`'s machine (torchrun numbers a machine's ranks consecutively)."""
    first = rank - rank % plan.local_world_size
    return list(plan.ranks[first:first + plan.local_world_size])



def dataset_dir(cfg: TrainConfig, layout: Layout | None = None) -> Path:
    """--dataset, else the dataset the layout was placed from."""
    if cfg.dataset is not None:
        return cfg.dataset
    return (layout or Layout.open(cfg.layout)).dataset_dir


def layout_gpus(cfg: TrainConfig, layout: Layout | None = None) -> list[tuple[str, str | None]]:
    """The layout's GPU bins as (plan GPU, PCI address), in shard order: what ranks are matched to."""
    if cfg.features != "tiered" or cfg.layout is None:
        return []
    return (layout or Layout.open(cfg.layout)).gpu_devices()


__all__ = ["DevicePlan", "GpuRows", "MemoryPlan", "PackMatch", "RankPlan", "RunInputs", "RunPlan", "SplitPlan", "StorePlan",
           "TierPlan", "split_plan",
           "carve_gpu", "dataset_dir", "default_batch_rows", "default_buffer_bytes", "gpu_tier_rows", "layout_gpus", "node_ranks", "plan_store", "planned_ssd_shares", "rank_plan",
           "resolve_run", "store_budget", "tier_plan"]
