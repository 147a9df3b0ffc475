"""`python -m moment.train`: data-parallel GNN training over the tiered store, under torchrun or alone.

Each rank trains on its equal share of the training seeds (`SeedBatches`), reads its features
through its own store and I/O stack, and runs the sample -> gather -> train pipeline; DDP averages
gradients. Exact resumption: batch i of epoch e is sampled from a generator seeded by (seed, e, rank,
i) and dropout is reseeded from the same tuple before each step, so a run restarted from a checkpoint
(`--resume`, or automatically after a torchrun restart) repeats the uninterrupted run's batches and
losses. Rank 0 alone prints (progress bar, summary) and writes checkpoints and the metrics JSON.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from moment import testpoints
from moment.errors import MomentError
from moment.io.device import DeviceLayer, DeviceMemory
from moment.placement.opened import Layout
from moment.runtime.budget import process_bytes, return_freed_memory, under_torchrun
from moment.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from moment.runtime.config import TrainConfig, parse_args
from moment.runtime.dist import AgreedError, DistContext, default_device, setup
from moment.runtime import remote_tier
from moment.runtime.exchange import RowExchange
from moment.runtime.finite import BadStep, StepLog
from moment.runtime.loader import LoaderPipeline
from moment.runtime.memory_use import machine_peak, parent_peak, rank_sample, reset_peak
from moment.runtime.models import LayerExtent, build_model, load_layers, step_bytes
from moment.runtime.pipeline import Pipeline, StageTimes, mix
from moment.runtime.progress import Reporter
from moment.runtime.run_record import RunRecord
from moment.runtime.run_plan import RunInputs, RunPlan, gpu_tier_rows, resolve_run
from moment.runtime.sources import FeatureSource, InMemoryFeatures, MemmapFeatures
from moment.runtime.start_sizes import agent_start_bytes, rank_start_bytes
from moment.runtime.store import StoreInfo, open_store
from moment.workload.graph import GraphDataset
from moment.workload.sampler import CSRGraph, MiniBatch, NeighborSampler, SeedBatches

EVAL_TAG, DROPOUT_TAG = 0xE7A1, 0xD80
AGREED_GRACE_S = 2.0  # a rank that leaves an agreed error to rank 0 exits this much later
BASE_ENV = "MOMENT_RANK_BASE_BYTES"  # set by `moment train`: the per-rank fixed cost its budget check charged
AGENT_ENV = "MOMENT_AGENT_BYTES"  # set by `moment train`: torchrun's agent as its budget check charged it
#: what a checkpoint must share with the run that resumes it: the data (dataset and layout identity), the
#: model's shape, and what decides the batches and updates (an exact resume repeats the uninterrupted run)
RESUME_KEYS = ("dataset_id", "layout_id", "model", "layers", "hidden", "feature_dim", "num_classes", "world_size",
               "batch_size", "seed", "fanouts", "lr")


def dataset_dir(cfg: TrainConfig, layout: Layout | None = None) -> Path:
    """--dataset, else the dataset the layout was placed from."""
    if cfg.dataset is not None:
        return cfg.dataset
    return (layout or Layout.open(cfg.layout)).dataset_dir


@dataclass(frozen=True)
class Extent:
    """The most rows and edges one mini-batch touches, and each layer's block at its largest (input layer
    first): stated from sampled batches (`_batch_extent`)."""

    rows: int
    edges: int
    layers: tuple[LayerExtent, ...]

    def most(self, other: Extent) -> Extent:
        return Extent(max(self.rows, other.rows), max(self.edges, other.edges),
                      tuple(LayerExtent(max(a.src, b.src), max(a.dst, b.dst), max(a.edges, b.edges))
                            for a, b in zip(self.layers, other.layers, strict=True)))


#: batches sampled at start-up to state the extent of a batch (the first of epoch 0)
EXTENT_BATCHES = 8
#: the extent of a batch: the sampled batches' mean plus this many standard deviations of theirs
EXTENT_SPREAD = 5


def _bound(values: Sequence[int]) -> int:
    """The most one batch holds of a quantity, from the sampled batches' values: their mean plus EXTENT_SPREAD
    standard deviations (a batch's rows and edges are sums of many sampled neighbours, near normal: a run
    exceeds it in about one batch of three million), at least the largest seen, plus 64. The spread taken is
    at least a Poisson count's (the square root of the mean), so that a few alike samples do not state none."""
    v = np.asarray(values, np.float64)
    sd = max(float(v.std(ddof=1)) if v.size > 1 else 0.0, float(np.sqrt(v.mean())))
    return int(max(v.max(), np.ceil(v.mean() + EXTENT_SPREAD * sd))) + 64


def _batch_extent(cfg: TrainConfig, graph: CSRGraph, batches: SeedBatches, fanouts: list[int]) -> Extent:
    """The most rows and edges one mini-batch touches, and each layer's block at its largest: the first
    EXTENT_BATCHES batches sampled for real, bounded from their spread (`_bound`)."""
    from moment.workload.sampler import NeighborSampler

    sampler = NeighborSampler(graph, fanouts)
    hops = len(fanouts)
    seen: list[list[int]] = []  # per batch: rows, edges, then each layer's src, dst and edges
    for i, seeds in enumerate(batches.epoch(0)):
        if i == EXTENT_BATCHES:
            break
        sampler.generator.manual_seed(mix(cfg.seed, 0, 0, i))
        mb = sampler.sample(seeds)
        nodes, edges = np.cumsum(mb.num_sampled_nodes).tolist(), np.cumsum([0, *mb.num_sampled_edges]).tolist()
        # layer i of L: the edges of hops 1..L-i, as MiniBatch.blocks() cuts them
        seen.append([mb.num_nodes, int(mb.edge_index.shape[1]),
                     *(v for h in range(hops) for v in (nodes[hops - h], nodes[hops - h - 1], edges[hops - h]))])
    if not seen:
        seen = [[0] * (2 + 3 * hops)]
    b = [_bound(col) for col in zip(*seen, strict=True)]
    return Extent(b[0], b[1], tuple(LayerExtent(*b[2 + 3 * i: 5 + 3 * i]) for i in range(hops)))


def run_inputs(cfg: TrainConfig, ds: GraphDataset, graph: CSRGraph, batches: Sequence[SeedBatches],
               fanouts: list[int], process_bytes: int, agent_bytes: int, local_ranks: int, layout: Layout | None, *,
               ctx: DistContext | None = None, feature_dim: int | None = None,
               device_memory: DeviceMemory | None = None) -> RunInputs:
    """What `resolve_run` is given: the largest extent of `batches` (each rank's, or a preview's of every
    rank), the sizes torch's objects state for it (a round of the peer exchange among `local_ranks`, whose
    GPU tiers hold what `layout` gives them, and a training step of the model, included), a rank's and
    torchrun's agent's measured sizes, and the dataset's sizes. With `ctx`, the ranks agree on their maxima
    first: every rank must resolve the same plan (the shared cache is one segment). `feature_dim`: the
    run's features are that wide (float32), not `ds`'s (a run planned on its graph alone). `device_memory`:
    this rank's device's free and total bytes (a CUDA rank), agreed as the least of the ranks'."""
    ext = functools.reduce(Extent.most, [_batch_extent(cfg, graph, b, fanouts) for b in batches])
    if ctx is not None:
        least = [-v for v in device_memory] if device_memory is not None else []  # the max of the negated: the least
        flat = [ext.rows, ext.edges, *(v for x in ext.layers for v in (x.src, x.dst, x.edges)), process_bytes,
                agent_bytes, *least]
        agreed = [int(x) for x in ctx.all_reduce(torch.tensor(flat, dtype=torch.float64), op="max").tolist()]
        if device_memory is not None:
            device_memory = DeviceMemory(*(-v for v in agreed[-2:]))
            agreed = agreed[:-2]
        *sizes, process_bytes, agent_bytes = agreed
        ext = Extent(sizes[0], sizes[1], tuple(LayerExtent(*sizes[2 + 3 * i: 5 + 3 * i])
                                               for i in range(len(ext.layers))))
    rows = min(ext.rows, ds.num_nodes)
    dim = ds.feature_dim if feature_dim is None else int(feature_dim)
    row_bytes = ds.row_bytes if feature_dim is None else dim * np.dtype(np.float32).itemsize
    training = step_bytes(cfg.model, dim, ds.num_classes, cfg.hidden,
                          [LayerExtent(min(x.src, rows), min(x.dst, rows), x.edges) for x in ext.layers], rows=rows,
                          float_copy=feature_dim is None and ds.feature_dtype != np.float32)
    split = layout.split if layout is not None else None
    return RunInputs(train_nodes=int(np.asarray(ds.train_idx).size),
                     graph_bytes=ds.file("indptr").stat().st_size + ds.file("indices").stat().st_size,
                     labels_bytes=ds.file("labels").stat().st_size, rows_max=rows, edges_max=ext.edges,
                     process_bytes=process_bytes, sampler_map_bytes=NeighborSampler.map_bytes(ds.num_nodes),
                     batch_ids_bytes=MiniBatch.id_bytes(rows, ext.edges), held_batches=Pipeline.held_batches(cfg.depth),
                     training_bytes=training, agent_bytes=agent_bytes, exchange_bytes=RowExchange.round_bytes(
                         rows, row_bytes, local_ranks, gpu_tier_rows(layout, local_ranks) if layout else 0),
                     remote_exchange_bytes=remote_tier.round_bytes(rows, row_bytes, len(split.machines)) if split else 0,
                     remote_reader_bytes=remote_tier.reader_bytes(layout.manifest.row.align) if split else 0,
                     device_memory=device_memory)


def preview_inputs(cfg: TrainConfig, ds: GraphDataset, nproc: int, *, agent: bool = True,
                   layout: Layout | None = None, nnodes: int = 1,
                   feature_dim: int | None = None) -> RunInputs:
    """What rank 0 of an `nproc`-rank run (on each of `nnodes` machines) will measure, measured before any rank
    starts: the largest extent of every rank's batches (the ranks agree on it), a fresh rank's fixed cost
    and, with `agent` (the run is started by torchrun, as `moment train` does), a fresh torchrun agent's."""
    train_idx = np.asarray(ds.train_idx)
    graph, fanouts = CSRGraph.from_dataset(ds, in_memory=False), cfg.resolved_fanouts()
    world = nproc * max(nnodes, 1)
    per_rank = [SeedBatches(train_idx, cfg.resolved_batch_size(train_idx.size, world), seed=cfg.seed, rank=r,
                            world_size=world) for r in range(world)]
    if layout is None and cfg.layout is not None:
        layout = Layout.open(cfg.layout)
    return run_inputs(cfg, ds, graph, per_rank, fanouts, rank_start_bytes(), agent_start_bytes() if agent else 0,
                      nproc, layout, feature_dim=feature_dim)


def planned_inputs(cfg: TrainConfig, ds: GraphDataset, nproc: int, *, feature_dim: int, gpu_rows: int) -> RunInputs:
    """`preview_inputs` of a run whose features and layout are not written yet (`run_plan.planned_minimum`):
    the batch extent sampled on `ds`'s graph (any dataset with the run's graph: bench/epoch.py synthesizes
    the graph with one-wide features first), the model's step and a round of the peer exchange for
    `feature_dim`-wide float32 rows, `gpu_rows` held by each rank."""
    got = preview_inputs(cfg, ds, nproc, feature_dim=feature_dim)
    rb = feature_dim * np.dtype(np.float32).itemsize
    return dataclasses.replace(got, exchange_bytes=RowExchange.round_bytes(got.rows_max, rb, nproc, gpu_rows))


def preview_plan(cfg: TrainConfig, ds: GraphDataset, nproc: int, *, layout: Layout | None = None,
                 agent: bool = True, pack_index_bytes: int | None = None, inputs: RunInputs | None = None,
                 nnodes: int = 1) -> RunPlan:
    """The run plan the ranks of an `nproc`-rank run on this machine (one of `nnodes`) will resolve, before any
    starts.

    `pack_index_bytes`: charge the index of a pack not written yet (`moment data pack`); `inputs`: reuse a
    measurement (`preview_inputs`) when previewing several budgets or packs of one run."""
    layout = layout or Layout.open(cfg.layout)
    inputs = inputs or preview_inputs(cfg, ds, nproc, agent=agent, layout=layout, nnodes=nnodes)
    return resolve_run(cfg, layout, world_size=nproc * max(nnodes, 1), local_world_size=nproc, inputs=inputs,
                       device=default_device(cfg.device), pack_index_bytes=pack_index_bytes)


def rank_base_bytes() -> int:
    """A rank's fixed cost as the budget charges it: the launcher's preview figure when `moment train`
    started this rank (so that the launcher's check and the ranks' are the same numbers, and the minimum
    it names is accepted), else what this rank holds now."""
    given = os.environ.get(BASE_ENV, "")
    return int(given) if given.isdigit() else process_bytes()


def agent_bytes() -> int:
    """torchrun's agent as the budget charges it (0 without torchrun): the launcher's figure when `moment
    train` started the run (as `rank_base_bytes`), else the agent's peak so far (it is this rank's parent)."""
    if not under_torchrun():
        return 0
    given = os.environ.get(AGENT_ENV, "")
    return int(given) if given.isdigit() else parent_peak()


def make_source(cfg: TrainConfig, ds: GraphDataset, ctx: DistContext, layout: Layout | None = None,
                plan: RunPlan | None = None) -> tuple[FeatureSource, StoreInfo | None]:
    """The run's feature source, and for the tiered store what its chain holds."""
    if cfg.features == "memory":
        return InMemoryFeatures(ds.file("features"), ctx.device), None
    if cfg.features == "memmap":
        return MemmapFeatures(ds.file("features"), ctx.device, drop_cache=cfg.drop_page_cache,
                              random=cfg.memmap_random), None
    assert layout is not None and plan is not None
    if layout.num_nodes != ds.num_nodes or layout.row_bytes != ds.row_bytes:
        raise MomentError(f"layout has {layout.num_nodes} nodes of {layout.row_bytes} B, the dataset "
                          f"{ds.num_nodes} of {ds.row_bytes} B: they do not belong together", source=str(cfg.layout))
    return open_store(plan, ctx, layout)


class Trainer:
    """One rank's training run; `run()` returns the metrics (identical on every rank)."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext, layout: Layout | None = None):
        """`layout`: the run's layout opened once (None: opened here when --layout is given)."""
        self.cfg, self.ctx = cfg, ctx
        self.peak_from = "run start" if reset_peak() else "process start"  # the measured peak is this run's
        self.dev = DeviceLayer(ctx.device)
        self.dev.reset_peak()  # the device's too
        load_layers()  # the model's layers are a fixed cost too: measured with the rest
        base_rss = rank_base_bytes()  # interpreter, torch, the layers, before any data is touched
        self.layout = layout if layout is not None or cfg.layout is None else Layout.open(cfg.layout)
        self.ds = GraphDataset.open(dataset_dir(cfg, self.layout))
        # before any rank samples: sampled blocks against the manifest, the graph's structure
        self.notes: list[str] = [f"note: {n}" for n in self.ds.check()]
        if self.layout is not None:  # the layout must hold this dataset's features, not another's
            from moment.placement.reader import check_dataset

            note = check_dataset(cfg.layout, self.layout.manifest, self.ds)
            self.notes += [f"note: {note}"] if note else []
        self.fanouts = cfg.resolved_fanouts()
        train_idx = np.asarray(self.ds.train_idx)
        self.batch_size = cfg.resolved_batch_size(train_idx.size, ctx.world_size)
        self.batches = SeedBatches(train_idx, self.batch_size, seed=cfg.seed, rank=ctx.rank,
                                   world_size=ctx.world_size)
        if len(self.batches) == 0:
            raise MomentError(f"{train_idx.size} training nodes are too few for {ctx.world_size} ranks",
                              source=str(self.ds.path))
        self.ck_every = cfg.resolved_checkpoint_every(len(self.batches))
        if ctx.nnodes > 1:  # every machine gave its own options and layout: they must train the same thing
            self._check_machines()
        # torchrun counts restarts per machine, and a machine restarted by another's failure does not count it
        self.restarts = int(ctx.all_reduce(torch.tensor([float(ctx.restart_count)], dtype=torch.float64), "max")[0])
        self.val = torch.from_numpy(np.array(self.ds.val_idx, dtype=np.int64))[ctx.rank :: ctx.world_size]
        # the graph stays memory-mapped (its size is charged to the budget); labels in their own small dtype
        self.graph = CSRGraph.from_dataset(self.ds, in_memory=cfg.features == "memory")
        self.plan: RunPlan | None = None  # every derived decision of a tiered run (moment.runtime.run_plan)
        if cfg.features == "tiered":
            return_freed_memory()
            inputs = run_inputs(cfg, self.ds, self.graph, [self.batches], self.fanouts, base_rss, agent_bytes(),
                                max(ctx.local_world_size, 1), self.layout, ctx=ctx, device_memory=self.dev.memory())
            self.plan = resolve_run(cfg, self.layout, world_size=ctx.world_size,
                                    local_world_size=max(ctx.local_world_size, 1), inputs=inputs,
                                    device=ctx.device.type)
        self.source, self.store_info = make_source(cfg, self.ds, ctx, self.layout, self.plan)
        if self.plan is not None:  # collective: every rank (a machine's layout may have no GPU bin)
            lines = ctx.all_gather_object(ctx.serves.line(str(ctx.device)) if ctx.serves and ctx.serves.plan_gpus
                                          else None)
            self.notes += [x for x in lines if x]
        labels = torch.from_numpy(np.array(self.ds.labels))
        self.pipe, self.eval_pipe = (self._pipeline(labels) for _ in range(2))
        torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
        model = build_model(cfg.model, self.ds.feature_dim, self.ds.num_classes, len(self.fanouts), cfg.hidden)
        self.module = model.to(ctx.device)
        self.opt = torch.optim.Adam(self.module.parameters(), lr=cfg.lr)
        self.curve: list[float] = []  # mean loss over ranks, per step, synced
        self.steps = StepLog(ctx.rank, ctx.world_size)  # losses and their finiteness since the last check
        self.record = RunRecord.of_env()  # `moment doctor --gpu`'s record of the batches (off in real runs)
        self.val_curve: list[float] = []
        self.epoch_seconds: list[float] = []
        self.epoch, self.next_batch, self.step = 0, 0, 0
        self.resumed_from: int | None = None
        self.saved_step: int | None = None  # the step of the last checkpoint written (or resumed from)
        self.restart_note = self._maybe_resume()
        if ctx.backend:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.model = DDP(self.module, device_ids=ids)
        else:
            self.model = self.module
        self.seeds_trained = 0

    def _pipeline(self, labels: torch.Tensor) -> Pipeline | LoaderPipeline:
        cfg = self.cfg
        if cfg.loader_workers:
            return LoaderPipeline(self.graph, self.fanouts, self.source, labels, self.ctx.device,
                                  workers=cfg.loader_workers, depth=cfg.depth)
        return Pipeline(self.graph, self.fanouts, self.source, labels, self.ctx.device, depth=cfg.depth,
                        pipelined=cfg.pipeline)

    def _check_machines(self) -> None:
        """Refuse, on every rank alike, machines that would not train one run (moment.runtime.rendezvous)."""
        import socket

        from moment.runtime.rendezvous import SHARED_SETTINGS, RunFacts, check_agents

        cfg, split = self.cfg, self.layout.split if self.layout is not None else None
        values = {"model": cfg.model, "epochs": cfg.epochs, "fanouts": self.fanouts, "layers": len(self.fanouts),
                  "batch_size": self.batch_size, "hidden": cfg.resolved_hidden(), "lr": cfg.lr, "seed": cfg.seed,
                  "features": cfg.features, "checkpoints": cfg.checkpoint_dir is not None,
                  "checkpoint_every": self.ck_every, "resume": cfg.resume, "peer_tier": cfg.peer_tier}
        facts = RunFacts(node_rank=self.ctx.node_rank, host=socket.gethostname(), dataset_id=self.ds.dataset_id,
                         dataset=str(self.ds.path), layout=str(cfg.layout) if cfg.layout is not None else None,
                         split_id=split.id if split else None, split_machine=split.machine if split else None,
                         split_machines=tuple(split.machines) if split else (),
                         settings=tuple((k, repr(values[k])) for k in SHARED_SETTINGS))
        try:
            check_agents(self.ctx.all_gather_object(facts))
        except MomentError as e:
            raise AgreedError.of(e) from None

    # ------------------------------------------------------------------ checkpoints

    def _resume_fields(self) -> dict[str, Any]:
        """What this run's checkpoints record about it (RESUME_KEYS, and where the data was, for messages)."""
        layout = None
        if self.layout is not None and self.cfg.features == "tiered":
            layout = self.layout.manifest.layout_id()
        return {"dataset_id": self.ds.dataset_id, "dataset": str(self.ds.path), "layout_id": layout,
                "layout": str(self.cfg.layout) if layout else None, "model": self.cfg.model,
                "layers": len(self.fanouts), "hidden": self.cfg.resolved_hidden(),
                "feature_dim": self.ds.feature_dim, "num_classes": self.ds.num_classes,
                "world_size": self.ctx.world_size, "batch_size": self.batch_size, "seed": self.cfg.seed,
                "fanouts": self.fanouts, "lr": self.cfg.lr}

    def _check_resume(self, ck: dict[str, Any]) -> None:
        """Refuse a checkpoint of another run, naming every difference: resuming another dataset's weights
        would report that run's accuracy as this one's, and another shape cannot load at all."""
        theirs, mine = ck.get("run") or {}, self._resume_fields()

        def show(k: str, run: dict[str, Any]) -> str:
            v = run.get(k)
            if v is None:
                return "not recorded" if k in ("dataset_id", "layout_id") and run is theirs else "none"
            if k in ("dataset_id", "layout_id"):
                where = run.get(k.removesuffix("_id"))
                return f"{v[:12]}" + (f" ({where})" if where else "")
            return repr(v)

        # the layout only decides where rows are read from: compared when both runs read one
        keys = [k for k in RESUME_KEYS if k != "layout_id" or (mine[k] and theirs.get(k))]
        diff = [f"{k.removesuffix('_id')} {show(k, theirs)} vs {show(k, mine)}" for k in keys if theirs.get(k) != mine[k]]
        if diff:
            raise AgreedError(
                f"the checkpoint is from another run (checkpoint vs this run): {'; '.join(diff)}",
                source=str(self.cfg.checkpoint_dir),
                hint="resume with the data and settings the checkpoint was made with, or start a new run "
                     "(another --checkpoint-dir, without --resume)")

    def _maybe_resume(self) -> str | None:
        """Load the checkpoint on --resume or after a torchrun restart; returns what to tell the user."""
        cfg = self.cfg
        restart = self.restarts
        if cfg.checkpoint_dir is None:
            if restart > 0:
                return (f"restart {restart}: a rank failed; there is no --checkpoint-dir, so training starts again "
                        "from epoch 1 (the progress before the failure is lost)")
            if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
                return "no --checkpoint-dir: a torchrun restart would start again from epoch 1"
            return None
        if not (cfg.resume or restart > 0):
            return None
        ck = self._shared_checkpoint()
        if ck is None:
            if cfg.resume and restart == 0:
                raise MomentError("--resume: no checkpoint here yet", source=str(cfg.checkpoint_dir))
            return f"restart {restart}: a rank failed before the first checkpoint; training starts again from epoch 1"
        try:
            self.module.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:  # the recorded settings matched, the weights did not
            raise AgreedError(f"the checkpoint's model does not fit this run's: {str(e).strip().splitlines()[-1]}",
                              source=str(cfg.checkpoint_dir), hint="start a new run (without --resume)") from None
        self.epoch, self.next_batch, self.step = ck["epoch"], ck["next_batch"], ck["step"]
        self.curve, self.val_curve = list(ck["loss_curve"]), list(ck["val_curve"])
        self.epoch_seconds = list(ck.get("epoch_seconds", []))
        states = ck.get("rng_states") or []
        if self.ctx.rank < len(states):
            set_rng_state(states[self.ctx.rank], self.ctx.device)
        self.resumed_from = self.saved_step = self.step
        why = f"restart {restart}: a rank failed; " if restart > 0 else ""
        where = (f"all {cfg.epochs} epochs were done" if self.epoch >= cfg.epochs
                 else f"epoch {self.epoch + 1}, batch {self.next_batch}")
        return f"{why}resumed from step {self.step} ({where}) from {cfg.checkpoint_dir}"

    def _shared_checkpoint(self) -> dict[str, Any] | None:
        """Rank 0's last checkpoint (None: none yet), checked against this run there, on every rank: under
        `moment train --nnodes` only machine 0 has it (its run directory), and every rank must resume alike."""
        got: tuple[str, Any] | None = None
        if self.ctx.is_main:
            try:
                ck = load_checkpoint(self.cfg.checkpoint_dir)
                if ck is not None:
                    self._check_resume(ck)
                got = ("ok", ck)
            except MomentError as e:
                got = ("error", str(e))
        got = self.ctx.broadcast_object(got)
        if got[0] == "error":
            raise AgreedError(got[1])
        return got[1]

    def _sync_losses(self) -> None:
        """Check the steps since the last check (moment.runtime.finite): their mean losses join the curve, and
        every rank stops at the first step whose loss was not finite on any rank."""
        losses, bad = self.steps.check(self.ctx.all_reduce)
        if bad is not None:
            self._stop_at(bad)
        self.curve += losses

    def _checkpoint(self) -> None:
        self._sync_losses()
        states = self.ctx.all_gather_object(rng_state(self.ctx.device))
        payload = {
            "model": self.module.state_dict(), "optimizer": self.opt.state_dict(),
            "epoch": self.epoch, "next_batch": self.next_batch, "step": self.step,
            "loss_curve": self.curve, "val_curve": self.val_curve, "epoch_seconds": self.epoch_seconds,
            "rng_states": states, "run": self._resume_fields(), "config": self.cfg.to_dict(),
        }
        self.ctx.on_main(lambda: self._save(payload))
        self.saved_step = self.step

    def _save(self, payload: dict[str, Any]) -> None:
        """Write the checkpoint (rank 0); a failure (a full disk) names the file and keeps the last good one."""
        from moment.outputs import reason

        ck = self.cfg.checkpoint_dir
        try:
            save_checkpoint(ck, payload)
        except OSError as e:
            kept = (f"the last good checkpoint (step {self.saved_step}) is kept" if self.saved_step is not None
                    else "no checkpoint was written before")
            raise MomentError(f"cannot write the checkpoint at step {self.step}: {reason(e)}; {kept}",
                              source=str(Path(ck) / CHECKPOINT_NAME),
                              hint="free some space (or give another --checkpoint-dir), then continue with "
                                   f"--resume --checkpoint-dir {ck}" if self.saved_step is not None else
                                   "free some space or give another --checkpoint-dir") from None

    # ------------------------------------------------------------------ loops

    def _train_epoch(self, rep: Reporter) -> None:
        cfg, ctx, e = self.cfg, self.ctx, self.epoch
        batches = list(self.batches.epoch(e))
        self.source.epoch_start(e)
        self.model.train()
        t0 = time.perf_counter()
        last = ctx.rank == ctx.world_size - 1 and self.restarts == 0  # the rank a test may kill
        rep.start_epoch(e, len(batches), self.next_batch)
        for item in self.pipe.run(batches, (cfg.seed, e, ctx.rank), start=self.next_batch):
            item.wait()
            if self.record is not None:
                self.record.add(e, item)
            torch.manual_seed(mix(cfg.seed, e, ctx.rank, item.index, DROPOUT_TAG))
            self.opt.zero_grad(set_to_none=True)
            out = self.model(item.x.float(), item.blocks)
            loss = F.cross_entropy(out, item.y)
            self.steps.record(loss, item.x, self.step + 1, e, item.index)  # on the device: no host sync
            loss.backward()
            self.opt.step()
            self.step += 1
            self.next_batch = item.index + 1
            self.seeds_trained += int(item.y.numel())
            rep.step(self.seeds_trained, self.source.tier_stats())
            if last:
                testpoints.reach("train-step", self.step)
            if self.ck_every and self.step % self.ck_every == 0:
                self._checkpoint()
            elif self.steps.due:
                self._sync_losses()
        self._sync_losses()
        self.epoch_seconds.append(time.perf_counter() - t0)

    def _stop_at(self, bad: BadStep) -> None:
        """Stop every rank at the first step whose loss was not finite (training on would only print NaN
        losses and end 'successfully'), saying whether its features were already not finite (corrupt data)
        or only the loss (the model diverged). Every rank raises it alike; rank 0 prints it."""
        where = (f"at step {bad.step} (epoch {bad.epoch + 1}, batch {bad.batch + 1} of {len(self.batches)})"
                 f" on rank{'s' if len(bad.ranks) > 1 else ''} {', '.join(map(str, bad.ranks))}")
        src = (f"layout {self.cfg.layout}" if self.cfg.features == "tiered"
               else f"dataset {self.ds.path} (features.npy)")
        kept = ("" if self.saved_step is None else
                f"; the last checkpoint (step {self.saved_step}) is from before it")
        if bad.bad_features:
            raise AgreedError(
                f"training stopped {where}: the loss is not finite because the feature rows read for the batch "
                f"hold NaN or infinite values; the {src} is probably corrupt",
                hint=(f"check it with `moment layout verify {self.cfg.layout}`" if self.cfg.features == "tiered"
                      else "compare its files with their checksums (`moment place` does, before placing)")
                + f"; nothing trained on these values was saved{kept}")
        raise AgreedError(
            f"training stopped {where}: the loss is not finite though the batch's features are: the model "
            f"diverged (learning rate {self.cfg.lr}), or the features hold garbage values",
            hint=f"lower --lr, or check the {src}"
            + (f" with `moment layout verify {self.cfg.layout}`" if self.cfg.features == "tiered" else "") + kept)

    @torch.no_grad()
    def _evaluate(self) -> float:
        self.module.eval()
        cfg, ctx = self.cfg, self.ctx
        batches = list(torch.split(self.val, self.batch_size))
        correct, total = torch.zeros((), dtype=torch.int64, device=ctx.device), 0  # on the device: no sync a batch
        for item in self.eval_pipe.run(batches, (cfg.seed, self.epoch, ctx.rank, EVAL_TAG)):
            item.wait()
            pred = self.module(item.x.float(), item.blocks).argmax(-1)
            correct += (pred == item.y).sum()
            total += int(item.y.numel())
        t = self.ctx.all_reduce(torch.tensor([float(correct), float(total)], dtype=torch.float64))
        return float(t[0] / t[1]) if t[1] > 0 else 0.0

    def run(self, rep: Reporter) -> dict[str, Any]:
        t0 = time.perf_counter()
        while self.epoch < self.cfg.epochs:
            if self.next_batch < len(self.batches):
                self._train_epoch(rep)
            acc = self._evaluate()
            self.val_curve.append(acc)
            rep.end_epoch(self.epoch, acc, self.curve[-1] if self.curve else float("nan"))
            self.epoch, self.next_batch = self.epoch + 1, 0
            if self.ck_every:
                self._checkpoint()
        if self.record is not None:
            sv = self.ctx.serves
            self.record.write(self.ctx.rank, self.ctx.device, sv.pci if sv is not None else None)
        return self._metrics(time.perf_counter() - t0)

    def _metrics(self, wall: float) -> dict[str, Any]:
        ctx = self.ctx
        tiers = self.source.tier_stats()
        names = sorted(tiers["bytes"])
        t = self.pipe.times.as_dict()
        k = len(names)
        vec = torch.tensor([self.seeds_trained, tiers["ssd_bytes_read"], tiers["ssd_requests"],
                            tiers.get("packed_rows", 0)] + [tiers["bytes"][n] for n in names]
                           + [tiers["rows"][n] for n in names] + list(t.values()), dtype=torch.float64)
        s = ctx.all_reduce(vec).tolist()
        seeds, ssd_bytes, ssd_requests, packed = s[:4]
        tier_bytes = {n: int(b) for n, b in zip(names, s[4:4 + k], strict=True)}
        rows = {n: int(r) for n, r in zip(names, s[4 + k:4 + 2 * k], strict=True)}
        w = ctx.world_size
        stage = StageTimes(*(x / w for x in s[4 + 2 * k:]))
        wall_max = float(ctx.all_reduce(torch.tensor([t["wall"]], dtype=torch.float64), op="max")[0])
        train_wall = max(wall_max, 1e-9)
        return {
            "epochs": self.cfg.epochs,
            "steps": self.step,
            "val_accuracy": self.val_curve[-1] if self.val_curve else None,
            "val_accuracy_curve": self.val_curve,
            "num_classes": self.ds.num_classes,
            "seeds_per_s": seeds / train_wall,
            "stage_seconds": {n: v for n, v in stage.as_dict().items() if n != "wall"},
            "pipeline_wall_s": stage.wall,
            "limiting_stage": stage.limiting(),
            "epoch_seconds": self.epoch_seconds,
            "wall_s": wall,
            "loss_curve": self.curve,
            "tier_bytes": tier_bytes,
            "tier_rows": rows,
            "tier_mb_per_s": {n: b / 1e6 / train_wall for n, b in tier_bytes.items()},
            "ssd_bytes_read": int(ssd_bytes),
            "cpu_hit_rate": (rows["cpu"] / max(1, rows["cpu"] + rows["ssd"]) if "cpu" in rows and "ssd" in rows
                             else None),
            "memory_hit_rate": 1 - rows["ssd"] / max(1, sum(rows.values())) if "ssd" in rows else None,
            "peak_rss_bytes": int(ctx.all_reduce(torch.tensor([_peak_rss()], dtype=torch.float64), op="max")[0]),
            "memory": self._memory(),
            "cache_policy": self.plan.cache_policy if self.plan is not None else None,
            "io_shape": self.plan.io_shape if self.plan is not None else None,
            "superbatch": self.plan.tiers.superbatch if self.plan is not None else None,
            "ssd_requests": int(ssd_requests),
            "packed_rows": int(packed),
            "world_size": w,
            "backend": self.source.backend,
            "dist_backend": ctx.backend,
            "device": str(ctx.device),
            "features": self.cfg.features,
            "pipelined": self.cfg.pipeline,
            "loader_workers": self.cfg.loader_workers,
            "model": self.cfg.model,
            "fanouts": self.fanouts,
            "batch_size": self.batch_size,
            "seed": self.cfg.seed,
            "resumed_from_step": self.resumed_from,
            "restarts": self.restarts,
            "checkpoint_dir": str(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir is not None else None,
            "per_rank": (per_rank := ctx.all_gather_object(self._rank_report())),
            "nnodes": ctx.nnodes,
            "machines": machines_of(per_rank),
        }

    def _memory(self) -> dict[str, Any]:
        """The budget split's prediction beside the measured peak of the run (moment.runtime.memory_use)."""
        ctx = self.ctx
        # the graph's files are mapped by every rank and held once, as the budget charges them
        sample = rank_sample(with_agent=ctx.local_rank == 0 and ctx.backend is not None and under_torchrun(),
                             shared_files=[self.ds.file("indptr"), self.ds.file("indices")])
        # each rank's device peak rides with its host sample (one collective); the busiest rank's is the measure
        samples = ctx.all_gather_object([sample, self.dev.peak_reserved()])
        measured = machine_peak([s for s, _ in samples], ctx.local_world_size)
        out: dict[str, Any] = ({"budget_bytes": None, "predicted_peak_bytes": None, "device": None} if self.plan is None
                               else self.plan.memory.as_dict())
        out["measured_peak_bytes"] = measured.pop("bytes")
        out["measured"] = {**measured, "since": self.peak_from}
        out["device"] = _device_memory(out["device"], [p for _, p in samples if p is not None])
        return out

    def _rank_report(self) -> dict[str, Any]:
        """This rank's plan GPUs, its device and how it was matched, and its planned vs achieved SSD shares."""
        import socket

        sv = self.ctx.serves
        out: dict[str, Any] = {"rank": self.ctx.rank, "node_rank": self.ctx.node_rank, "host": socket.gethostname(),
                               "device": str(self.ctx.device),
                               "plan_gpus": list(sv.plan_gpus) if sv else [], "matched_by": sv.how if sv else None}
        st = self.source.tier_stats()
        split = self.layout.split if self.layout is not None and self.cfg.features == "tiered" else None
        out |= {"machine": split.name if split else None, "rows": int(sum(st["rows"].values())),
                "remote_rows": int(st["rows"].get("remote", 0)), "remote_bytes": int(st["bytes"].get("remote", 0)),
                "remote_served_rows": int(st.get("remote_served_rows", 0)),
                "remote_served_bytes": int(st.get("remote_served_bytes", 0))}
        if self.plan is not None:
            out["ssd_shares"] = st.get("ssd_shares", {})
        return out

    def store_line(self) -> str:
        t, info = self.plan.tiers, self.store_info
        return (f"cache policy {t.policy}: {info.summary()}; "
                f"I/O shape {t.shape} (superbatch {t.superbatch}, merge gap "
                f"{'per job, by cost' if t.merge_gap < 0 else f'{t.merge_gap} B'}), "
                f"reader {info.backend}" + self._pack_note())

    def _pack_note(self) -> str:
        pk = self.layout.pack if self.plan.io_shape == "packed" else None
        if pk is None:
            return ""
        note = f"; pack: {pk.epochs} epoch(s) of segments, {pk.bytes / 2**20:,.0f} MiB on disk"
        if self.cfg.epochs > pk.epochs:
            note += f" (epochs {pk.epochs + 1}..{self.cfg.epochs} read from the layout)"
        return note

    def memory_notes(self) -> list[str]:
        """Say so when this rank's memory tiers hold every row: the run would never read an SSD."""
        st, n = self.store_info, self.source.num_nodes
        if self.plan is None:
            return []
        # the CPU cache leaves out the rows a GPU tier serves: this rank's, and with peers the node's
        gpu = st.gpu_rows + st.peer_rows if st.peers else 0 if st.shared_cache else st.gpu_rows
        if st.cpu_rows + gpu < n:
            return []
        held = f"the CPU cache ({st.cpu_rows:,} rows)" + (f" and the GPU tiers ({gpu:,} rows)" if gpu else "")
        return [f"note: {held} hold all {n:,} rows of the layout: nothing will be read from the SSDs. "
                f"To exercise them, cap the cache (e.g. --cpu-cache-limit 10%) or place with smaller "
                f"--gpu-cache/--cpu-cache"]

    def close(self) -> None:
        """Free the store, and DDP: its reducer holds the process group, which must die at close."""
        self.source.close()
        self.model = self.module


def machines_of(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks' reports (`Trainer._rank_report`) summed per machine: the rows each machine's ranks read, how
    many of them (and bytes) came from other machines, and what it served to the others."""
    out: dict[int, dict[str, Any]] = {}
    for r in per_rank:
        m = out.setdefault(r["node_rank"], {"node_rank": r["node_rank"], "machine": r.get("machine"), "host": r["host"],
                                            "ranks": [], "rows": 0, "remote_rows": 0, "remote_bytes": 0,
                                            "remote_served_rows": 0, "remote_served_bytes": 0})
        m["ranks"].append(r["rank"])
        for k in ("rows", "remote_rows", "remote_bytes", "remote_served_rows", "remote_served_bytes"):
            m[k] += r[k]
    for m in out.values():
        m["remote_share"] = m["remote_rows"] / m["rows"] if m["rows"] else 0.0
    return [out[k] for k in sorted(out)]


def _device_memory(planned: dict[str, Any] | None, peaks: list[int]) -> dict[str, Any]:
    """The metrics' `memory.device`: a CUDA run's device budget per rank beside the busiest rank's measured peak
    (torch's caching allocator's most reserved); the same keys, null, on CPU runs."""
    out = dict(planned) if planned is not None else {"budget_bytes": None, "predicted_peak_bytes": None, "items": []}
    out["measured_peak_bytes"] = max(peaks) if peaks else None
    return out


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    from moment.outputs import atomic_write

    atomic_write(path, json.dumps(doc, indent=2), "--metrics-json")


def layout_gpus(cfg: TrainConfig, layout: Layout | None = None) -> list[tuple[str, str | None]]:
    """The layout's GPU bins as (plan GPU, PCI address), in shard order: what ranks are matched to."""
    if cfg.features != "tiered" or cfg.layout is None:
        return []
    return (layout or Layout.open(cfg.layout)).gpu_devices()


def train(cfg: TrainConfig, ctx: DistContext | None = None) -> dict[str, Any]:
    """Run training with `cfg`; returns the metrics (and writes them when `cfg.metrics_json` is set)."""
    cfg.check()
    own = ctx is None
    layout = Layout.open(cfg.layout) if cfg.layout is not None else None  # its manifests are read once
    ctx = ctx or setup(cfg.device, layout_gpus(cfg, layout))
    old_threads = torch.get_num_threads()
    if ctx.device.type == "cpu":
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // max(ctx.local_world_size, 1)))
    trainer = None
    try:
        trainer = Trainer(cfg, ctx, layout)
        with Reporter(enabled=ctx.is_main and not cfg.quiet, world_size=ctx.world_size,
                      total_epochs=cfg.epochs) as rep:
            rep.lines(trainer.notes)
            notes = trainer.memory_notes()
            if trainer.restart_note and ctx.is_main:
                rep.notice(trainer.restart_note)
            if trainer.plan is not None:
                rep.lines(trainer.plan.memory.lines() + [trainer.store_line()] + notes)
            metrics = trainer.run(rep)
            if trainer.plan is not None and metrics["ssd_bytes_read"] == 0 and not notes:
                notes.append("note: no feature row was read from the SSDs in this run (the caches served every "
                             "read); cap the cache (e.g. --cpu-cache-limit 10%) to exercise them")
            metrics["notes"] = notes
            metrics["config"] = cfg.to_dict()
            # rank 0 writes (as its options say: on several machines each gave its own); a failure stops every
            # rank, none waits on it
            ctx.on_main(lambda: cfg.metrics_json is not None and write_json_atomic(cfg.metrics_json, metrics))
            rep.summary(metrics)
            rep.lines(notes[-1:] if metrics["ssd_bytes_read"] == 0 else [])
        ctx.barrier()
        return metrics
    finally:
        if trainer is not None:
            trainer.close()
        torch.set_num_threads(old_threads)
        if own:
            ctx.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m moment.train` / torchrun; user errors exit 2 without a traceback."""
    from rich.console import Console

    from moment.runtime.console import attach_console, log_stream

    attach_console()  # under `moment train`: the user's screen, not torchrun's log
    if under_torchrun():
        from moment.runtime.lifetime import die_with_parent

        die_with_parent(os.getppid())  # torchrun killed outright: no rank trains on as an orphan
    try:
        try:
            cfg = parse_args(argv)
        except MomentError as e:  # every rank has the same options
            raise AgreedError.of(e) from None
        train(cfg)
    except MomentError as e:
        from rich.markup import escape

        rank = os.environ.get("RANK", "0")  # as set-up renumbered it (moment.runtime.dist: by machine)
        if rank == "0" or not isinstance(e, AgreedError):
            Console(stderr=True).print(f"[bold red]error[/] (rank {rank}): " + escape(str(e)), highlight=False,
                                      soft_wrap=True)
        else:  # rank 0 says it: torchrun stops every rank once one exits, so give rank 0 time to
            time.sleep(AGREED_GRACE_S)
        return 2
    except Exception as e:  # noqa: BLE001 - only a lost peer is turned into a message; the rest re-raised
        if not _peer_lost(e):
            raise
        import traceback

        with log_stream() as log:  # the traceback is torchrun's business: its log
            traceback.print_exc(file=log)
        rank = os.environ.get("RANK", "0")
        Console(stderr=True).print(f"error (rank {rank}): lost the connection to another rank, which has "
                                   "probably failed (its own message says why)", highlight=False, soft_wrap=True)
        return 1
    return 0


#: what gloo/NCCL say when a peer process is gone
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted")


def _peer_lost(e: BaseException) -> bool:
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", None)
    text = str(e)
    return (dist_error is not None and isinstance(e, dist_error)) or any(s in text for s in _PEER_GONE)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
