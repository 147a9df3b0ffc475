"""`moment.open_run`: Moment's out-of-core store and pipeline for your own training loop (and `moment train`'s).

A `Run` is one rank's side of a run: it resolves the same run plan `moment train` resolves (the memory
budget's split, the tiers, the I/O shape, the cache policy, the peer and remote tiers, the rank's
device), opens the tiered store, and hands out pipelined, PyG-style mini-batches
(`run.loader("train", epoch)`): batch i+1 is sampled and read while the caller trains on batch i, and
the collective rounds that fetch rows other ranks hold run on the caller's thread, between its batches,
in the same order on every rank. `moment train` (moment.runtime.train) is built on this object, so a
script's loop gets exactly its batches, its dropout and its loss checks.

What the caller owes the other ranks: every rank iterates each loader it opens (its own share of the
split) to the end, or breaks out of it at the same batch, and calls `close()` once before it exits.
A rank whose process is gone is a Moment error on the others that says so (moment.runtime.lost).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import numbers
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from moment.errors import MomentError
from moment.io.device import DeviceLayer
from moment.io.diskstats import DiskWatch
from moment.locking import shared
from moment.placement.opened import Layout
from moment.runtime.budget import under_torchrun
from moment.runtime.config import TrainConfig, effective_fanouts, keyword_error, make_config
from moment.runtime.dist import AgreedError, DistContext, free_group_last, setup
from moment.runtime.finite import DIVERGE_FACTOR, DIVERGE_STEPS, BadStep, Divergence, StepLog, check_due
from moment.runtime.heap import HeapKeeper, keep_freed_memory, return_freed_memory
from moment.runtime.link_task import sampler_for, train_seeds
from moment.runtime.loader import LoaderPipeline, fork_hang_note
from moment.runtime.memory_use import machine_peak, rank_sample, reset_peak
from moment.runtime.model_spec import load_rank_code
from moment.runtime.node_index import distinct_ids, node_ids
from moment.runtime.pipeline import Pipeline, Prepared, StageTimes, Turns
from moment.runtime.predictions import write_embeddings, write_predictions
from moment.runtime.rendezvous import SHARED_SETTINGS, RunFacts, check_agents
from moment.runtime.run_plan import RunPlan, dataset_dir, layout_gpus, resolve_run
from moment.runtime.sampler_pool import SamplerPool
from moment.runtime.sizing import rank_start_sizes, run_inputs
from moment.runtime.sources import FeatureSource, InMemoryFeatures, MemmapFeatures
from moment.runtime.store import StoreInfo, open_store
from moment.workload.graph import CHECKED_ENV, NODE_IDS, GraphDataset
from moment.workload.sampler import Block, CSRGraph, SeedBatches, eval_batches
from moment.workload.seeds import mix, sampling_key

# Imports inside functions: PyG's graph store loads only when a script asks for it.

DROPOUT_TAG = 0xD80
SPLITS = ("train", "val", "test")
SUMMARY_PREFIX = "moment: summary "  # the line `Run.close` prints on rank 0

#: what `Run.ddp` passes on to DistributedDataParallel: its own keywords, less those the run sets
_DDP_RUNS_OWN = frozenset({"module", "device_ids", "output_device", "dim", "process_group", "device_mesh"})
_DDP_OPTIONS = frozenset(inspect.signature(DDP.__init__).parameters) - _DDP_RUNS_OWN - {"self"}


def device_memory(planned: dict[str, Any] | None, peaks: list[int]) -> dict[str, Any]:
    """`Run.memory()`'s `device`: a CUDA run's device budget per rank beside the busiest rank's measured peak
    (torch's caching allocator's most reserved); the same keys, null, on CPU runs."""
    out = dict(planned) if planned is not None else {"budget_bytes": None, "predicted_peak_bytes": None, "items": []}
    out["measured_peak_bytes"] = max(peaks) if peaks else None
    return out


def _pipe_kind(split: str, task: str) -> str:
    """The pipeline a split's loaders share: training's, or one for the evaluation splits (its times are theirs);
    a link run's passes over nodes of one's choosing have their own, which samples nodes, not links."""
    return "train" if split == "train" else "nodes" if split == "nodes" and task == "link" else "eval"


@dataclass
class Batch:
    """One mini-batch, as PyG's `NeighborLoader` yields it: the sampled subgraph in local ids, seeds first.

    `x` holds the rows of `n_id` on the run's device, in the layout's dtype (`x.float()` for a model);
    `edge_index` runs from neighbour (row 0) to target (row 1); `y` holds the seeds' labels (so PyG's
    `y[:batch_size]` idiom works as written): int64 classes, or float 0/1 targets [B, C] on a multi-label
    dataset (`Run.multilabel`); `blocks` are the per-layer views Moment's own models use
    (moment.workload.sampler.MiniBatch.blocks). A link batch (`task="link"`), as PyG's `LinkNeighborLoader`
    yields it: its seeds are the label edges' endpoints, `edge_label_index` and `edge_label` the edges."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    n_id: torch.Tensor
    batch_size: int
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    blocks: list[Block] = field(repr=False)
    index: int = 0  # the batch's position in its loader's sequence
    epoch: int = 0
    edge_label_index: torch.Tensor | None = None  # link batches: [2, L] local ids, positives first
    edge_label: torch.Tensor | None = None  # link batches: 1. for a positive edge, 0. for a negative

    @classmethod
    def of(cls, p: Prepared, epoch: int) -> Batch:
        mb = p.batch
        return cls(x=p.x, edge_index=p.blocks[0].edge_index if p.blocks else mb.edge_index, y=p.y, n_id=mb.n_id,
                   batch_size=mb.batch_size, num_sampled_nodes=mb.num_sampled_nodes,
                   num_sampled_edges=mb.num_sampled_edges, blocks=p.blocks, index=p.index, epoch=epoch,
                   edge_label_index=p.edge_label_index, edge_label=p.edge_label)


class OneRank(torch.nn.Module):
    """`Run.ddp`'s module on a run of one rank (no process group, nothing to average): DistributedDataParallel's
    interface, so a loop written for several ranks runs as written on one. `module` is your module, `no_sync()`
    does nothing, and `state_dict()` has DDP's keys (`module.` first): a checkpoint of either loads into the other.
    Why: on one rank `ddp` returned the bare module, whose `no_sync()` (gradient accumulation) and `.module`
    (checkpoints) failed, and which could not load a checkpoint a run of several ranks saved. It costs one Python
    call per forward."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """DistributedDataParallel's: its gradients are not averaged in it, and one rank has none to average."""
        return contextlib.nullcontext()


def _scalar_loss(loss: Any, device: torch.device) -> torch.Tensor:
    """The step's loss as `track` keeps it: a one-element tensor, or a number (`loss.item()`, already on the host),
    as a 0-d floating tensor on the batch's device; anything else is refused here, not as a mismatch of the
    tensors stacked at the next check, steps later."""
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise MomentError(f"run.track(loss) takes the step's loss, one number: got a tensor of shape "
                              f"{tuple(loss.shape)}", hint="reduce it first, e.g. run.track(loss.mean())")
        loss = loss.detach().reshape(())
        return loss if loss.is_floating_point() else loss.double()
    if isinstance(loss, numbers.Real) and not isinstance(loss, (bool, np.bool_)):
        return torch.tensor(float(loss), dtype=torch.float64, device=device)
    raise MomentError(f"run.track(loss) takes the step's loss, a tensor of one element or a number, not "
                      f"{type(loss).__name__}")


def _count(v: Any) -> bool:
    """Whether `v` is an integer >= 0: a Python or NumPy one (a step kept in an array), not a bool or a float."""
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= 0


class Loader:
    """One split's batches of one epoch for this rank (`Run.loader`): iterate it once, to the end or out of
    it at the same batch on every rank."""

    def __init__(self, run: Run, split: str, epoch: int, start: int, seeds: list[torch.Tensor] | None = None,
                 shard: bool = True):
        self.run, self.split, self.epoch, self.start, self.shard = run, split, epoch, start, shard
        self.seeds = run._split_batches(split, epoch, shard) if seeds is None else seeds

    def __len__(self) -> int:
        return max(0, len(self.seeds) - self.start)

    def __iter__(self) -> Iterator[Batch]:
        return self.run._batches(self)


class Run:
    """One rank's run: its plan, store and loaders (see the module's docstring; made by `open_run`)."""

    def __init__(self, cfg: TrainConfig, ctx: DistContext, layout: Layout | None = None, *, own_ctx: bool = False):
        """`layout`: the run's layout opened once (None: opened here when `cfg.layout` is given); `own_ctx`:
        close `ctx` (and the process group it made) with the run."""
        self.cfg, self.ctx, self._own_ctx = cfg, ctx, own_ctx
        self.source: FeatureSource | None = None
        self.heap: HeapKeeper | None = None  # what the allocator keeps of freed memory (a tiered run's)
        self._pipes: dict[str, Pipeline | LoaderPipeline] = {}
        self._samplers: dict[str, SamplerPool] = {}
        self._turns = Turns()  # the store's: its loaders and lookups take turns (moment.runtime.pipeline)
        # the last train epoch's batches shuffled: the work ahead's, which that epoch's loader takes as they are
        self._train_seeds: tuple[int, list[torch.Tensor]] = (-1, [])
        self._final_stats: dict[str, Any] = {"rows": {}, "bytes": {}, "ssd_bytes_read": 0}
        self._memory: dict[str, Any] | None = None  # the last `memory()`'s answer
        self._pack_said = False  # a train loader asked for an epoch past the pack, and it was said (`_past_pack`)
        self._threads = torch.get_num_threads()  # restored at close
        # the layout held shared while the run reads it: `moment layout rm` is refused meanwhile (moment.locking)
        self._reading = contextlib.ExitStack()
        if cfg.layout is not None and cfg.features == "tiered":
            self._reading.enter_context(shared(cfg.layout, "layout"))
        self._released = False  # `_release` done (close or abandon)
        if not DeviceLayer(ctx.device).cuda:  # the machine's cores shared among its ranks, not each rank taking all
            torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // max(ctx.local_world_size, 1)))
        try:
            self._open(layout)
        except BaseException:
            self.abandon()
            raise

    def _open(self, layout: Layout | None) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.peak_from = "run start" if reset_peak() else "process start"  # the measured peak is this run's
        self.dev = DeviceLayer(ctx.device)
        self.dev.reset_peak()  # the device's too
        load_rank_code(cfg.model)  # what the step's optimizer and the user's model load: a fixed cost too
        self.layout = layout if layout is not None or cfg.layout is None else Layout.open(cfg.layout)
        kept = self.layout.index_bytes if self.layout is not None and self.layout.index_kept else 0
        # interpreter, torch, the runtime, before any data is touched (the graph's pages are charged apart)
        start = rank_start_sizes(kept) if cfg.features == "tiered" else None
        self.dataset = GraphDataset.open(dataset_dir(cfg, self.layout))
        ds = self.dataset
        # before any rank samples: sampled blocks against the manifest, the graph's structure (not again when the
        # launcher checked this dataset, unchanged)
        self.notes: list[str] = [f"note: {n}" for n in ds.check(os.environ.get(CHECKED_ENV, ""))]
        if self.layout is not None:  # the layout must hold this dataset's features, not another's
            from moment.placement.reader import check_dataset

            note = check_dataset(cfg.layout, self.layout.manifest, ds)
            self.notes += [f"note: {note}"] if note else []
        if cfg.loader_workers and (note := fork_hang_note()):
            self.notes.append(f"note: {note}")
        self.fanouts = cfg.resolved_fanouts()
        # the graph stays memory-mapped (its size is charged to the budget); labels in their own small dtype
        self.graph = CSRGraph.from_dataset(ds, in_memory=cfg.features == "memory")
        if cfg.fanouts:  # the sampler takes every neighbour past the largest degree: say which fan-outs it used
            _, note = effective_fanouts(self.fanouts, self.graph.max_degree())
            self.notes += [f"note: {note}"] if note else []
        train_idx = train_seeds(cfg.task, self.graph, np.asarray(ds.train_idx))
        self.batch_size = cfg.resolved_batch_size(train_idx.size, ctx.world_size)
        self.batches = SeedBatches(train_idx, self.batch_size, seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size)
        if len(self.batches) == 0:
            raise MomentError(f"{train_idx.size} training nodes are too few for {ctx.world_size} ranks",
                              source=str(ds.path))
        if ctx.nnodes > 1:  # every machine gave its own options and layout: they must train the same thing
            self._check_machines()
        # torchrun counts restarts per machine, and a machine restarted by another's failure does not count it
        self.restarts = int(ctx.all_reduce(torch.tensor([float(ctx.restart_count)], dtype=torch.float64), "max")[0])
        self.plan: RunPlan | None = None  # every derived decision of a tiered run (moment.runtime.run_plan)
        if cfg.features == "tiered":
            return_freed_memory()
            own, agent, shared = start
            inputs = run_inputs(cfg, ds, self.graph, [self.batches], self.fanouts, own, agent,
                                max(ctx.local_world_size, 1), self.layout, shared_start_bytes=shared, ctx=ctx,
                                device_memory=self.dev.memory(), device=ctx.device)
            self.notes += [f"note: {inputs.training_note}"] if inputs.training_note else []
            self.plan = resolve_run(cfg, self.layout, world_size=ctx.world_size,
                                    local_world_size=max(ctx.local_world_size, 1), inputs=inputs,
                                    device=ctx.device.type)
            self.notes += self.plan.pack.notes()  # the epochs its pack does not hold, and how to pack them
        self.source, self.store_info = make_source(cfg, ds, ctx, self.layout, self.plan)
        self.disks = DiskWatch(self.source.ssd_files())  # the SSDs' own busy time over the train epochs
        # from here the batches' arrays: freed ones kept for the next batches, up to what the budget granted
        self.heap = keep_freed_memory(self.plan.memory.heap_reuse_bytes, device=ctx.device) if self.plan is not None else None
        if self.plan is not None:  # collective: every rank (a machine's layout may have no GPU bin)
            lines = ctx.all_gather_object(ctx.serves.line(str(ctx.device)) if ctx.serves and ctx.serves.plan_gpus
                                          else None)
            self.notes += [x for x in lines if x]
        self.labels = torch.from_numpy(np.array(ds.labels))
        self.loss_curve: list[float] = []  # mean loss over ranks, per step (`track`), synced
        self._steps = StepLog(ctx.rank, ctx.world_size)  # losses and their finiteness since the last check
        # a module in DDP over several ranks: the ranks step together, so the losses are checked at the loader's
        # batches, each check first agreeing on every rank's count (`ddp`, `_batches`); else at tracked steps
        self._lockstep = False
        self.step = 0  # steps tracked (a resumed run starts from its checkpoint's)
        self.saved_step: int | None = None  # the last checkpoint's step (its caller's: named when a loss is bad)
        self.optimizer: torch.optim.Optimizer | None = None  # the loop's, when it says (a stop names its rate)
        self.lr_option: str | None = None  # the option that sets that rate, named in a stop's hint
        self._current: Batch | None = None
        self.epoch_seconds: list[float] = []  # each train loader's, from its first batch asked to its end
        self.epoch_cpu_seconds: list[float] = []  # this process's CPU (every thread) over the same span
        # this rank's SSD bytes read in each train loader's span: an epoch's feed rate, without the validation
        # passes' reads (which `ssd_bytes_read` counts too) or the caches' fill at start
        self.epoch_ssd_bytes: list[int] = []
        self.train_tier_bytes: dict[str, int] = {}  # what each tier served in those spans, summed
        self._closed = False
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank, for a model built next

    # ------------------------------------------------------------------ what a loop asks

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def rank(self) -> int:
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        return self.ctx.world_size

    @property
    def local_rank(self) -> int:
        return self.ctx.local_rank

    @property
    def feature_dim(self) -> int:
        return self.dataset.feature_dim

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def multilabel(self) -> bool:
        """Whether `batch.y` holds float 0/1 targets [B, num_classes] (a multi-label dataset: train with
        `binary_cross_entropy_with_logits`) rather than int64 classes [B]."""
        return self.dataset.multilabel

    @property
    def num_nodes(self) -> int:
        return self.dataset.num_nodes

    def loader(self, split: str = "train", epoch: int = 0, *, start: int = 0, nodes: Any = None,
               shard: bool = True) -> Loader:
        """This rank's batches of `split` ("train", the default, "val" or "test") for `epoch`, pipelined.
        Train: the rank's equal share of the training nodes, reshuffled per epoch, dropout reseeded before each
        batch from (seed, epoch, rank, batch) so a resumed or re-run loop repeats it; `start`: the first batch
        (a resumed epoch; at most the epoch's number of batches, which reads none). Val and test: every rank's
        slice of the split, in order. `nodes`, in place of a split: node ids of your choosing (a tensor, array,
        list, range, boolean mask, or `slice(None)` for every node), every rank's slice of them in order, as
        the val and test loaders hold theirs: an inference pass (predictions or embeddings of those nodes).
        `shard=False` (val, test or nodes): every node of them on this rank, in order, batched and sampled as a
        one-rank run's loader (the other ranks need not take part: their rows come from this rank's own tiers).
        Why: by default each rank's loader holds its 1/world_size share, so PyG's `if rank == 0: test()` scored
        a share of the split and said nothing."""
        self._still_open("read more batches")
        if not isinstance(shard, bool):
            raise MomentError(f"shard must be True (this rank's share) or False (every node), got {shard!r}")
        rank, world = self._share(shard)
        seeds = None
        if nodes is not None:
            if split != "train":
                raise MomentError(f"run.loader takes a split or nodes, not both (split={split!r})",
                                  hint="loader(nodes=ids) batches those nodes; loader(split) a split's")
            own = NODE_IDS in self.dataset.manifest.files  # the graph's own ids given for node numbers, likely
            ids, _ = node_ids(nodes, self.num_nodes, "run.loader(nodes=...)",
                              past_end="the graph has ids of its own: run.dataset.nodes_of(ids) gives their node "
                                       "numbers" if own else None)
            distinct_ids(ids, nodes, "run.loader(nodes=...)")  # at once, on every rank alike
            split, seeds = "nodes", eval_batches(ids, self.batch_size, rank=rank, world_size=world)
        else:
            split = "val" if split == "valid" else split
            if split not in SPLITS:  # None too (a config's missing key): it read the train split
                raise MomentError(f"no split {split!r}: a loader reads one of {', '.join(SPLITS)}",
                                  hint="loader(nodes=ids) batches nodes of your choosing")
        if not _count(epoch):
            raise MomentError(f"epoch must be an integer >= 0, got {epoch!r}")
        if not _count(start):
            raise MomentError(f"start must be an integer >= 0 (the first batch to read), got {start!r}")
        epoch, start = int(epoch), int(start)
        if split == "train":
            if not shard:  # its ranks step together (DDP, the loss checks): each holds its equal share
                raise MomentError("shard=False reads val, test or nodes on one rank: the train loader is each "
                                  "rank's equal share", hint="evaluate with loader('val', epoch, shard=False)")
            self._past_pack(epoch)
        loader = Loader(self, split, epoch, start, seeds, shard)
        if start > len(loader.seeds):  # a resumed epoch past its end would read nothing, silently
            raise MomentError(f"start={start}: this rank's {split} loader of epoch {epoch} has "
                              f"{len(loader.seeds)} batches", hint=f"give a start from 0 to {len(loader.seeds)}")
        return loader

    def _still_open(self, doing: str) -> None:
        """One error for anything asked of a closed run (a loader, the PyG stores, `track`, `ddp`): its store and
        group are gone (the stores were an AttributeError from inside; `track` dropped the loss silently)."""
        if self._closed:
            raise MomentError(f"the run is closed: open a new one (moment.open_run) to {doing}")

    def write_predictions(self, path: str | Path, scores: Callable[[Batch], torch.Tensor],
                          nodes: Any = slice(None), epoch: int = 0) -> dict[str, Any]:
        """Each of `nodes`' predicted class (ids, or a split's name: sampled as its loader of `epoch` samples),
        written by rank 0 to `path` (CSV, or Parquet for a path ending in .parquet, under the graph's own ids and
        class names: moment.runtime.predictions); `scores(batch)` gives the seeds' logits. Every rank calls it."""
        return write_predictions(self, scores, path, nodes, epoch)

    def write_embeddings(self, path: str | Path, embed: Callable[[Batch], torch.Tensor],
                         nodes: Any = slice(None), epoch: int = 0) -> dict[str, Any]:
        """`embed(batch)`'s rows for each of `nodes`, written by rank 0 to `path` as a float32 .npy in `nodes`'
        order, or as Parquet for a path ending in .parquet (moment.runtime.predictions). Every rank calls it."""
        return write_embeddings(self, embed, path, nodes, epoch)

    def _past_pack(self, epoch: int) -> None:
        """Say it (once, on the first rank) when a loop of its own asks for an epoch its pack does not hold and the
        start did not name: its batches are read from the layout, many times slower."""
        p = self.plan
        if self._pack_said or p is None or not p.pack.epochs or epoch < max(p.pack.epochs, self.cfg.epochs):
            return
        self._pack_said = True
        if self.ctx.is_main and not self.cfg.quiet:
            cmd = self.layout.pack.command(self.layout.path, self.cfg.dataset, epochs=epoch + 1)
            print(f"moment: note: epoch {epoch} (run.loader counts from 0) is past the layout's pack, which holds "
                  f"epochs 0..{p.pack.epochs - 1}: its batches are read from the layout, at about block's speed; to pack "
                  f"as many epochs as the loop trains, give their number to: {cmd}", file=sys.stderr)

    def ddp(self, module: torch.nn.Module, **options: Any) -> torch.nn.Module:
        """`module` on the rank's device, wrapped in DistributedDataParallel when the run has several ranks (on
        CUDA given the rank's device): gradients averaged over the ranks, rank 0's weights broadcast first; on one
        rank in `OneRank`, which answers as DDP does (`.module`, `no_sync()`, `module.` keys in its state_dict).
        `options`: DistributedDataParallel's own (`find_unused_parameters=True` for a model with a parameter its
        loss does not use, `static_graph`, `bucket_cap_mb`, ...); the devices and the group are the run's."""
        if not isinstance(module, torch.nn.Module):
            raise MomentError(f"run.ddp(module) takes a torch.nn.Module, not {type(module).__name__}")
        refused = sorted(set(options) - _DDP_OPTIONS)
        if refused:
            own = [k for k in refused if k in _DDP_RUNS_OWN]
            raise MomentError(f"run.ddp(module, {', '.join(f'{k}=' for k in refused)}): "
                              + ("the run sets the device and the process group" if own else
                                 "not an option of DistributedDataParallel"),
                              hint="it takes " + ", ".join(f"{k}=" for k in sorted(_DDP_OPTIONS)))
        self._still_open("wrap a model for its ranks")
        module = module.to(self.device)
        if not self.ctx.backend:
            return OneRank(module)
        self._lockstep = True
        return free_group_last(DDP(module, device_ids=self.dev.ddp_device_ids(), **options))

    def track(self, loss: torch.Tensor | float) -> None:
        """Record the loss of the step just taken on the last batch handed out: it joins `loss_curve` (the
        mean over ranks) and every rank stops at the first step whose loss is not finite on any rank,
        saying whether that batch's features were (a corrupt layout) or only the loss (a diverging model),
        or where the finite mean loss diverged (moment.runtime.finite.divergence_at; set `run.optimizer` and
        the message names its learning rate). No host sync per step: checked every few steps, collectively
        (every rank tracks every step; once the model is in `ddp` over several ranks, a rank that tracked fewer
        steps than another is one error on every rank at the next check, where it otherwise leaves the others in
        a collective it never joins)."""
        if self.cfg.data_only:
            raise MomentError("run.track(loss): this run was opened with data_only=True, which trains no model",
                              hint="open it without data_only to train")
        self._still_open("track more losses")
        b = self._current
        if b is None:
            raise MomentError("run.track(loss) follows a batch of a train loader: no batch was handed out yet")
        loss = _scalar_loss(loss, b.x.device)
        self.step += 1
        self._steps.record(loss, b.x, self.step, b.epoch, b.index)
        if not self._lockstep and self._steps.due:
            self.sync_losses()

    def sync_losses(self, *, agree: bool | None = None) -> None:
        """Check the steps tracked since the last check (collective); the train loader does at its end, and
        `close()`. `agree`: the ranks' counts compared first, one error if they differ (default: in lockstep).
        Where every rank that tracked reaches alike (a train loader's end, close) they are: with a DDP of the
        script's own, a rank that skipped a `track` otherwise met the others in an all-reduce of another length,
        which gloo filled with garbage read as a loss that was not finite."""
        losses, bad = self._steps.check(self.ctx.all_reduce, self.loss_curve,
                                        agree=self._lockstep if agree is None else agree)
        if bad is not None:
            self._stop_at(bad)
        self.loss_curve += losses

    def stage_times(self, split: str = "train") -> StageTimes:
        """The `split` pipeline's StageTimes (moment.runtime.pipeline), summed over its loaders so far (zeros
        before its first)."""
        pipe = self._pipes.get(_pipe_kind(split, self.cfg.task))
        return pipe.times if pipe is not None else StageTimes()

    @property
    def feature_store(self) -> Any:
        """The features as PyG's `FeatureStore` (group "node", attribute "x"), read through the tiers."""
        from moment.runtime.pyg import PygFeatureStore

        self._still_open("read features")
        return PygFeatureStore(self.source, turns=self._turns)

    @property
    def graph_store(self) -> Any:
        """The graph as PyG's `GraphStore` (edge type ("node", "to", "node"), CSC without a copy)."""
        from moment.runtime.pyg import PygGraphStore

        self._still_open("read the graph")
        return PygGraphStore(self.graph)

    def summary(self) -> dict[str, Any]:
        """What this rank's run did so far: steps, the loss curve (the mean over ranks), each train loader's
        seconds and this process's CPU seconds and SSD bytes read in it, the rows and bytes each tier served (and
        their bytes in the train loaders' spans: `train_tier_bytes`, the feed rate's), the SSD reads and the pipelines' busy seconds, the rows read apart from a pack's segments
        (`pack_left_out_rows`, with `pack_fit`: moment.runtime.train.left_out_note), the SSD devices' busy share
        and read rate while busy over the train epochs (`disks`: moment.io.diskstats), and what the allocator
        kept of freed memory (`heap_use`)."""
        st = self.source.tier_stats() if self.source is not None else self._final_stats
        return {"rank": self.rank, "world_size": self.world_size, "steps": self.step, "loss_curve": self.loss_curve,
                "epoch_seconds": self.epoch_seconds, "epoch_cpu_seconds": self.epoch_cpu_seconds,
                "epoch_ssd_bytes": self.epoch_ssd_bytes, "train_tier_bytes": dict(self.train_tier_bytes),
                "tier_rows": dict(st["rows"]), "tier_bytes": dict(st["bytes"]),
                "ssd_bytes_read": int(st["ssd_bytes_read"]),
                # the rows a pack left out for larger caches than this rank's, and the --cached that fits it
                "pack_left_out_rows": int(st.get("pack_left_out_rows", 0)), "pack_fit": st.get("pack_fit"),
                "disks": self.disks.report(),
                "stage_seconds": {s: p.times.as_dict() for s, p in self._pipes.items()}, "heap": self.heap_use(),
                "memory": self._memory}

    def memory(self) -> dict[str, Any]:
        """The budget split's prediction beside the run's measured peak so far (collective: every rank calls it,
        in the same place of its loop; `close()` does). The busiest machine's processes, measured as
        moment.runtime.memory_use says (`measured_peak_bytes`, and its parts under `measured`), and the busiest
        rank's device peak under `device` (CUDA; null on CPU). `budget_bytes` and `predicted_peak_bytes` are
        null for a run without a budget (`features="memory"` or `"memmap"`). After `close()`: what close measured."""
        if self._closed:
            if self._memory is None:  # abandoned: this rank failed, and no collective follows
                raise MomentError("the run ended before its memory was measured (a rank failed, or close() did)",
                                  hint="call run.memory() on every rank before the run ends")
            return self._memory
        return self._measure_memory()

    def _measure_memory(self) -> dict[str, Any]:
        ctx = self.ctx
        # the libraries, the graph's files and the shared segments every rank maps are held once, as the
        # budget charges them
        sample = rank_sample(with_agent=ctx.local_rank == 0 and ctx.backend is not None and under_torchrun())
        # how many of the batches the split charges the pipeline kept alive at once (scheduling decides)
        sample["batches"] = self.source.memory().get("batch_buffers_most", 0) if self.store_info is not None else 0
        # each rank's device peak rides with its host sample (one collective); the busiest rank's is the measure
        samples = ctx.all_gather_object([sample, self.dev.peak_reserved()])
        measured = machine_peak([s for s, _ in samples], ctx.local_world_size)
        out: dict[str, Any] = ({"budget_bytes": None, "predicted_peak_bytes": None, "device": None} if self.plan is None
                               else self.plan.memory.as_dict())
        out["measured_peak_bytes"] = measured.pop("bytes")
        out["measured"] = {**measured, "since": self.peak_from}
        out["device"] = device_memory(out["device"], [p for _, p in samples if p is not None])
        self._memory = out
        return out

    def heap_use(self) -> dict[str, Any] | None:
        """A tiered run's freed memory kept for reuse (moment.runtime.heap: its limit, the most kept, the trims)
        or handed back at once ({"mode": "release"}); None for the other runs, which leave the allocator alone."""
        if self.plan is None:
            return None
        return self.heap.summary() if self.heap is not None else {"mode": "release"}

    def close(self, *, say: bool = True) -> dict[str, Any]:
        """Leave the run: serve the other ranks' remaining batches until every rank has closed (collective:
        every rank calls it once), then release the store, and the process group when the run joined it.
        Returns `summary()`, which rank 0 also prints as one line (`moment: summary {JSON}`) unless quiet or
        not `say` (`moment train`, which has printed its own summary and writes its metrics with --metrics-json)."""
        if self._closed:
            return self.summary()
        self._closed = True
        try:
            self._turns.close()  # a loader left part-way: its rounds finished, its threads ended
            if self.source is not None:
                self.source.leave()
            # every rank is here, done with the exchange: a loop that broke out of its train loader (a step
            # budget) left its last steps unchecked, so a NaN among them closed without a word
            self.sync_losses(agree=True)
            self._measure_memory()  # the run's peak, measured before the store lets go of it
        finally:
            self._release()
        out = self.summary()
        if self.ctx.is_main and not self.cfg.quiet and say:
            print(f"{SUMMARY_PREFIX}{json.dumps(out)}", flush=True)
        return out

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
        else:  # this rank failed: no more collectives (its peers learn it from its exit)
            self.abandon()

    def abandon(self) -> None:
        """Release what this rank holds without a collective (it failed): the others learn it in their next
        collective, once its group's connections close (`moment.runtime.dist.RETIRE_S` later, or at its exit)."""
        self._closed = True
        self._release()

    # ------------------------------------------------------------------ inside

    def _release(self) -> None:
        """Let go of the store, the heap keeper and the group, once: `abandon()` after a `close()` that failed (a
        rank that left: the documented `except MomentError: run.abandon()`) must not close them again (the heap
        keeper's descriptor closed twice was an OSError, or another file's descriptor closed)."""
        if self._released:
            return
        self._released = True
        self._turns.abandon()  # a loader part-way: its threads end before the store closes under them
        source, self.source = self.source, None
        if self.heap is not None:
            self.heap.stop()
        try:
            if source is not None:
                self._final_stats = source.tier_stats()
                source.close()
        finally:
            torch.set_num_threads(self._threads)
            self._reading.close()
            if self._own_ctx:
                self._own_ctx = False
                self.ctx.close()

    def _split_batches(self, split: str, epoch: int, shard: bool = True) -> list[torch.Tensor]:
        if split == "train":
            if self._train_seeds[0] != epoch:
                self._train_seeds = (epoch, list(self.batches.epoch(epoch)))
            return self._train_seeds[1]
        rank, world = self._share(shard)
        return eval_batches(getattr(self.dataset, f"{split}_idx"), self.batch_size, rank=rank, world_size=world)

    def _share(self, shard: bool) -> tuple[int, int]:
        """The (rank, world size) an evaluation loader's nodes are dealt by: this rank's share, or (`shard=False`)
        a one-rank run's, every node (its sampling keyed as that run's too)."""
        return (self.rank, self.world_size) if shard else (0, 1)

    def _pipe(self, split: str) -> Pipeline | LoaderPipeline:
        kind = _pipe_kind(split, self.cfg.task)
        if kind not in self._pipes:
            cfg, dev = self.cfg, self.ctx.device
            task = "node" if kind == "nodes" else cfg.task  # an inference pass embeds nodes, even of a link run
            sampler = functools.partial(sampler_for, task, negatives=cfg.negatives)
            if cfg.loader_workers:
                self._pipes[kind] = LoaderPipeline(self.graph, self.fanouts, self.source, self.labels, dev,
                                                   workers=cfg.loader_workers, depth=cfg.depth, sampler=sampler)
            else:
                if task not in self._samplers:  # one a task for the run's pipelines: their sequences reuse it
                    self._samplers[task] = SamplerPool(sampler)
                self._pipes[kind] = Pipeline(self.graph, self.fanouts, self.source, self.labels, dev,
                                             depth=cfg.depth, pipelined=cfg.pipeline, sampler=self._samplers[task],
                                             turns=self._turns)
        return self._pipes[kind]

    def _batches(self, loader: Loader) -> Iterator[Batch]:
        self._still_open("read more batches")
        cfg, rank, e = self.cfg, self.rank, loader.epoch
        train = loader.split == "train"
        key = sampling_key(cfg.seed, e, self._share(loader.shard)[0], loader.split)
        t0, c0 = time.perf_counter(), time.process_time()
        if train:
            s0 = self.source.tier_stats()
            self.source.epoch_start(e)
            self.disks.begin()
        for item in self._pipe(loader.split).run(loader.seeds, key, start=loader.start):
            item.wait()
            batch = Batch.of(item, e)
            if train:
                torch.manual_seed(mix(cfg.seed, e, rank, item.index, DROPOUT_TAG))
                self._current = batch
                self._steps.batches += 1  # compared at the checks: a rank that left its loader early is named so
            yield batch
            self._still_open("read more batches")  # an iterator kept past close(): its store is gone
            if train and self._lockstep and check_due(item.index):  # the same batch on every rank, tracked or not
                self.sync_losses()
        if train:  # counts compared where this rank tracked (a rank that tracks nothing may have left the loop)
            self.sync_losses(agree=self._lockstep or len(self._steps) > 0)
            if self.cfg.data_only:  # no losses to sum: the ranks wait for each other where training's sum holds
                self.ctx.barrier()  # them, so none starts its validation reads beside another's last train reads
            self.disks.end()
            self.epoch_seconds.append(time.perf_counter() - t0)
            self.epoch_cpu_seconds.append(time.process_time() - c0)
            s1 = self.source.tier_stats()
            self.epoch_ssd_bytes.append(int(s1["ssd_bytes_read"] - s0["ssd_bytes_read"]))
            for name, b in s1["bytes"].items():
                self.train_tier_bytes[name] = self.train_tier_bytes.get(name, 0) + int(b - s0["bytes"][name])
            # the next epoch's first batches, sampled as the validation pass ends (a loop of its own that gave no
            # `epochs` trains as many as it likes)
            if e + 1 < cfg.epochs or "epochs" not in cfg.model_fields_set:
                self._pipe("train").prepare(self._split_batches("train", e + 1), sampling_key(cfg.seed, e + 1, rank))

    def _check_machines(self) -> None:
        """Refuse, on every rank alike, machines that would not train one run (moment.runtime.rendezvous)."""

        cfg, split = self.cfg, self.layout.split if self.layout is not None else None
        values = {"model": cfg.model, "epochs": cfg.epochs, "fanouts": self.fanouts, "layers": len(self.fanouts),
                  "batch_size": self.batch_size, "hidden": cfg.resolved_hidden(), "lr": cfg.lr, "seed": cfg.seed,
                  "features": cfg.features, "checkpoints": cfg.checkpoint_dir is not None,
                  "checkpoint_every": cfg.resolved_checkpoint_every(len(self.batches)), "resume": cfg.resume,
                  "peer_tier": cfg.peer_tier, "task": cfg.task, "negatives": cfg.negatives, "loss": cfg.loss, "optimizer": cfg.optimizer,
                  "weight_decay": cfg.weight_decay,
                  # whether the ranks end in a prediction or embedding pass (its gathers); each machine its own path
                  "predict": cfg.predict is not None, "predict_nodes": cfg.predict_nodes, "embed": cfg.embed is not None}
        facts = RunFacts(node_rank=self.ctx.node_rank, host=socket.gethostname(), dataset_id=self.dataset.dataset_id,
                         dataset=str(self.dataset.path), layout=str(cfg.layout) if cfg.layout is not None else None,
                         split_id=split.id if split else None, split_machine=split.machine if split else None,
                         split_machines=tuple(split.machines) if split else (),
                         settings=tuple((k, repr(values[k])) for k in SHARED_SETTINGS))
        try:
            check_agents(self.ctx.all_gather_object(facts))
        except MomentError as e:
            raise AgreedError.of(e) from None

    def _stop_at(self, bad: BadStep | Divergence) -> None:
        """Stop every rank at the first step whose loss was not finite (training on would only print NaN
        losses and end 'successfully'), saying whether its features were already not finite (corrupt data)
        or only the loss (the model diverged), or at the step where the finite loss diverged. Every rank
        raises it alike; rank 0 prints it."""
        cfg = self.cfg
        lower = "lower the learning rate" + (f" ({self.lr_option})" if self.lr_option else "")
        if isinstance(bad, Divergence):
            kept = ("" if self.saved_step is None else
                    f"; the last checkpoint (step {self.saved_step}) is from before the loss grew"
                    if self.saved_step < bad.since else
                    f"; the last checkpoint (step {self.saved_step}) is from after the loss grew: do not resume it")
            raise AgreedError(
                f"training stopped at step {bad.step} (epoch {bad.epoch + 1}, batch {bad.batch + 1} of "
                f"{len(self.batches)}): the loss diverged{self._learning_rate()}: {bad.loss:.3g} at this step, "
                f"more than {DIVERGE_FACTOR:g} times the smallest of the run's first losses ({bad.reference:.3g}) "
                f"for {DIVERGE_STEPS} steps in a row, since step {bad.since}", hint=f"{lower} and start again{kept}")
        where = (f"at step {bad.step} (epoch {bad.epoch + 1}, batch {bad.batch + 1} of {len(self.batches)})"
                 f" on rank{'s' if len(bad.ranks) > 1 else ''} {', '.join(map(str, bad.ranks))}")
        src = (f"layout {cfg.layout}" if cfg.features == "tiered"
               else f"dataset {self.dataset.path} (features.npy)")
        kept = ("" if self.saved_step is None else
                f"; the last checkpoint (step {self.saved_step}) is from before it")
        if bad.bad_features:
            raise AgreedError(
                f"training stopped {where}: the loss is not finite because the feature rows read for the batch "
                f"hold NaN or infinite values; the {src} is probably corrupt",
                hint=(f"check it with `moment layout verify {cfg.layout}`" if cfg.features == "tiered"
                      else "compare its files with their checksums (`moment place` does, before placing)")
                + f"; nothing trained on these values was saved{kept}")
        raise AgreedError(
            f"training stopped {where}: the loss is not finite though the batch's features are: the model "
            f"diverged{self._learning_rate()}, or the features hold garbage values",
            hint=f"{lower}, or check the {src}"
            + (f" with `moment layout verify {cfg.layout}`" if cfg.features == "tiered" else "") + kept)

    def _learning_rate(self) -> str:
        """' (learning rate X)' of the loop's optimizer (its groups' distinct rates); '' when it gave none."""
        if self.optimizer is None:
            return ""
        rates = sorted({float(g["lr"]) for g in self.optimizer.param_groups})
        return f" (learning rate{'s' if len(rates) > 1 else ''} {', '.join(f'{r:g}' for r in rates)})"


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


def start(cfg: TrainConfig, ctx: DistContext | None = None) -> Run:
    """A run of `cfg` (checked): on `ctx`, else on the process group torchrun's environment describes (joined
    here when the script has not, the one it made when it has)."""
    cfg.check()
    layout = Layout.open(cfg.layout) if cfg.layout is not None else None  # its manifests are read once
    own = ctx is None
    if ctx is None:
        import torch.distributed as dist

        joined = dist.is_available() and dist.is_initialized()
        split = layout.split if layout is not None and cfg.features == "tiered" else None
        ctx = setup(cfg.device, layout_gpus(cfg, layout), split.machine if split is not None else None)
        ctx.owns_group = not joined
    try:
        return Run(cfg, ctx, layout, own_ctx=own)
    except BaseException:
        if own:
            ctx.close()
        raise


def open_run(layout: str | Path | None = None, *, dataset: str | Path | None = None, **options: Any) -> Run:
    """Open this rank's side of a run for your own loop: `run.loader("train", epoch)` yields its batches.

    `layout`: a directory `moment place` wrote (the tiered, out-of-core store); or `dataset` with
    `features="memory"` / `"memmap"` for the baselines. `options`: any of `moment train`'s options as
    keywords (`memory_budget="auto"`, `fanouts=[15, 10]`, `batch_size=1024`, `seed`, `device`, `depth`,
    `cpu_cache_limit`, `cache_policy`, `io_shape`, ...; `python -m moment.train --help` lists them), checked
    as the command line checks them. Under torchrun it joins the process group (or uses the script's).
    Close it (or use `with`) on every rank."""
    values = {k: v for k, v in dict(layout=layout, dataset=dataset).items() if v is not None}
    cfg = make_config(keywords=True, **values, **options)
    try:
        run = start(cfg)
    except MomentError as e:  # the layout, the device, the budget: said as the script gave them
        raise keyword_error(e) from None
    if run.ctx.is_main and not cfg.quiet:  # what `moment train` says at start too (quiet=True: nothing)
        for line in run.notes:
            print(f"moment: {line}", file=sys.stderr)
    return run
