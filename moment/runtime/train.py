"""`python -m moment.train`: data-parallel GNN training over the tiered store, under torchrun or alone.

The trainer is a loop over the public loader (moment.runtime.run: what a user's own script gets from
`moment.open_run`) with the model, the optimizer, checkpoints and metrics around it. Each rank trains on
its equal share of the training seeds, reads its features through its own store and I/O stack, and
the loader pipelines sampling and reading with the step; DDP averages gradients. Exact resumption:
batch i of epoch e is sampled from a generator seeded by (seed, e, rank, i) and dropout is reseeded
from the same tuple before each step, so a run restarted from a checkpoint (`--resume`, or
automatically after a torchrun restart) repeats the uninterrupted run's batches and losses. Rank 0
alone prints (progress bar, summary) and writes checkpoints and the metrics JSON.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from moment import testpoints
from moment.errors import MomentError
from moment.outputs import atomic_write
from moment.runtime.budget import under_torchrun
from moment.runtime.config import TrainConfig, parse_args
from moment.runtime.dist import AgreedError, DistContext
from moment.runtime.footprint import multilabel_targets
from moment.runtime.link_task import link_logits, link_loss, out_dim, roc_auc
from moment.runtime.lost import PeerLeft, peer_lost
from moment.runtime.model_spec import forward, load_loss, make_model, make_optimizer, unused_parameters
from moment.runtime.progress import Reporter
from moment.runtime.rendezvous import NNODES_ENV, NODE_RANK_ENV, others_gone
from moment.runtime.resume import Checkpoints, Position
from moment.runtime.run import Batch, Run, start
from moment.runtime.run_record import RunRecord
from moment.runtime.totals import Totals
from moment.topology.model import Kind

# Imports inside functions: the console and parent-watch set-up load only in a rank's entry point.

AGREED_GRACE_S = 2.0  # a rank that leaves an agreed error to rank 0 exits this much later
#: a rank that lost its connection to another exits this much later: torchrun names the first rank it sees exit
#: (the lowest of those gone at one look), and the rank that failed is gone already
LOST_GRACE_S = 1.0


class Trainer:
    """One rank's training run on `run` (its loader, store and plan); `run()` returns the metrics (identical on
    every rank)."""

    def __init__(self, run: Run):
        self.run_, self.cfg, self.ctx = run, run.cfg, run.ctx
        cfg, ctx = self.cfg, self.ctx
        self.ds, self.layout, self.plan = run.dataset, run.layout, run.plan
        self.source, self.store_info, self.notes = run.source, run.store_info, run.notes
        self.fanouts, self.batch_size, self.batches = run.fanouts, run.batch_size, run.batches
        self.restarts = run.restarts
        self.ck_every = cfg.resolved_checkpoint_every(len(self.batches))
        torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
        self.multilabel = multilabel_targets(cfg.task, self.ds.multilabel)
        # what validation reports: a link's ROC AUC, multi-label targets' micro-averaged F1, else accuracy
        self.metric = "auc" if cfg.task == "link" else "micro_f1" if self.multilabel else "accuracy"
        self.data_only = cfg.data_only  # the data path alone: no model, optimizer, DDP or loss (on every rank)
        self.module: torch.nn.Module | None = None
        self.opt: torch.optim.Optimizer | None = None
        if not self.data_only:
            width = out_dim(cfg.task, cfg.model, cfg.hidden, self.ds.num_classes)
            self.module = make_model(cfg, self.ds.feature_dim, width, len(self.fanouts)).to(ctx.device)
            self.opt = make_optimizer(self.module.parameters(), cfg)
            run.optimizer, run.lr_option = self.opt, "--lr"  # a diverging loss's message names its rate
            self.loss_fn = load_loss(cfg.loss, width, self.multilabel)
        self.record = RunRecord.of_env()  # `moment doctor --gpu`'s record of the batches (off in real runs)
        self.at = Position()
        self.checkpoints = Checkpoints(run, self.module, self.opt)
        self.restart_note = self.checkpoints.resume(self.at)
        self.model = None
        if self.module is not None:
            unused = (unused_parameters(self.module, cfg.model, self.ds.feature_dim, len(self.fanouts))
                      if ctx.world_size > 1 else [])
            if unused and ctx.is_main:
                self.notes.append(f"note: --model {cfg.model}: {', '.join(unused[:4])}"
                                  f"{f' and {len(unused) - 4} more' if len(unused) > 4 else ''} take no part in the "
                                  "loss on a tiny batch: DistributedDataParallel looks for unused parameters at "
                                  "every step (find_unused_parameters)")
            self.model = run.ddp(self.module, find_unused_parameters=bool(unused))
        self.seeds_trained = 0
        self.batches_fed = 0  # a data-only run's batches (its steps: it takes none)

    @property
    def step(self) -> int:
        return self.run_.step

    @property
    def curve(self) -> list[float]:
        return self.run_.loss_curve

    # ------------------------------------------------------------------ loops

    def _train_epoch(self, rep: Reporter) -> None:
        at = self.at
        e = at.epoch
        loader = self.run_.loader("train", e, start=at.next_batch)
        if self.model is not None:
            self.model.train()
        t0 = time.perf_counter()
        rep.start_epoch(e, len(loader.seeds), at.next_batch)
        for batch in loader:
            if self.record is not None:
                self.record.add(e, batch)
            if self.data_only:  # the batch is on the device, as the step would get it; no step
                at.next_batch = batch.index + 1
                self.batches_fed += 1
                self.seeds_trained += int(batch.y.shape[0])
                rep.step(self.seeds_trained, self.source.tier_stats())
                continue
            self.opt.zero_grad(set_to_none=True)
            loss = self._loss(forward(self.model, self.cfg.model, batch.x.float(), batch.blocks), batch)
            loss.backward()
            self.opt.step()
            self.run_.track(loss)  # on the device: no host sync (checked every few steps, and at the end)
            at.next_batch = batch.index + 1
            self.seeds_trained += int(batch.y.shape[0])
            rep.step(self.seeds_trained, self.source.tier_stats())
            testpoints.reach_rank("train-step", self.step)
            if self.ck_every and self.step % self.ck_every == 0:
                self.checkpoints.save(at)
        at.epoch_seconds.append(time.perf_counter() - t0)

    def _loss(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        if self.cfg.task == "link":
            return link_loss(link_logits(out, batch.edge_label_index), batch.edge_label)
        return self.loss_fn(out, batch.y)

    @torch.no_grad()
    def _evaluate(self) -> float | None:
        if self.data_only:  # the validation batches are read as a run reads them; no model scores them
            for _ in self.run_.loader("val", self.at.epoch):
                pass
            # and every rank waits for the others where training's score is summed: the next train epochs start
            # together, as a training run's do (apart, one rank's validation reads shared the disk with the
            # other's epoch, and an epoch's rate counted neither its start nor its end right)
            self.ctx.barrier()
            return None
        self.module.eval()
        if self.cfg.task == "link":
            return self._evaluate_links()
        if self.multilabel:
            return self._evaluate_multilabel()
        ctx = self.ctx
        correct, total = torch.zeros((), dtype=torch.int64, device=ctx.device), 0  # on the device: no sync a batch
        for batch in self.run_.loader("val", self.at.epoch):
            pred = forward(self.module, self.cfg.model, batch.x.float(), batch.blocks).argmax(-1)
            correct += (pred == batch.y).sum()
            total += int(batch.y.numel())
        t = self.ctx.all_reduce(torch.tensor([float(correct), float(total)], dtype=torch.float64))
        return float(t[0] / t[1]) if t[1] > 0 else 0.0

    def _evaluate_multilabel(self) -> float:
        """Micro-averaged F1 of the validation targets (a logit above 0 predicts a class), as GraphSAINT and
        PyG's PPI examples report it: 2 TP / (predicted + actual positives), summed over every rank first."""
        counts = torch.zeros(3, dtype=torch.int64, device=self.ctx.device)  # on the device: no sync a batch
        for batch in self.run_.loader("val", self.at.epoch):
            pred = forward(self.module, self.cfg.model, batch.x.float(), batch.blocks) > 0
            y = batch.y > 0.5
            counts += torch.stack([(pred & y).sum(), pred.sum(), y.sum()])
        tp, predicted, actual = self.ctx.all_reduce(counts.cpu().to(torch.float64)).tolist()
        return 2 * tp / (predicted + actual) if predicted + actual > 0 else 0.0

    def _evaluate_links(self) -> float:
        """ROC AUC of the validation nodes' link batches (positives and as many negatives), every rank's
        scores gathered first: an AUC does not add up over the ranks' shares."""
        scores, labels = [], []
        for batch in self.run_.loader("val", self.at.epoch):
            out = forward(self.module, self.cfg.model, batch.x.float(), batch.blocks)
            scores.append(link_logits(out, batch.edge_label_index).cpu())
            labels.append(batch.edge_label.cpu())
        got = self.ctx.all_gather_object((torch.cat(scores) if scores else torch.zeros(0),
                                          torch.cat(labels) if labels else torch.zeros(0)))
        s, y = torch.cat([g[0] for g in got]), torch.cat([g[1] for g in got])
        return roc_auc(s, y) if 0 < int(y.sum()) < y.numel() else float("nan")

    def run(self, rep: Reporter) -> dict[str, Any]:
        t0, at = time.perf_counter(), self.at
        while at.epoch < self.cfg.epochs:
            if at.next_batch < len(self.batches):
                self._train_epoch(rep)
            acc = self._evaluate()
            if acc is not None:
                at.val_curve.append(acc)
            rep.end_epoch(at.epoch, acc, self.curve[-1] if self.curve else float("nan"), self.metric)
            at.epoch, at.next_batch = at.epoch + 1, 0
            if self.ck_every:
                self.checkpoints.save(at)
        if self.record is not None:
            sv = self.ctx.serves
            self.record.write(self.ctx.rank, self.ctx.device, sv.pci if sv is not None else None)
        metrics = self._metrics(time.perf_counter() - t0)
        out = lambda b: forward(self.module, self.cfg.model, b.x.float(), b.blocks)  # noqa: E731
        if self.cfg.predict is not None or self.cfg.embed is not None:
            self.module.eval()
        if self.cfg.predict is not None:
            nodes = slice(None) if self.cfg.predict_nodes == "all" else self.cfg.predict_nodes
            metrics["predictions"] = self.run_.write_predictions(self.cfg.predict, out, nodes, epoch=self.cfg.epochs - 1)
        if self.cfg.embed is not None:
            metrics["embeddings"] = self.run_.write_embeddings(self.cfg.embed, out)
        return metrics

    def _metrics(self, wall: float) -> dict[str, Any]:
        ctx, at = self.ctx, self.at
        mine = self.run_.stage_times("train")
        total = Totals.of(self.seeds_trained, self.source.tier_stats(), mine,
                          self.run_.train_tier_bytes).summed(ctx.all_reduce)
        tier_bytes = {n: int(b) for n, b in total.tier_bytes.items()}
        rows = {n: int(r) for n, r in total.tier_rows.items()}
        w = ctx.world_size
        stage = total.mean_stages(w)
        walls = ctx.all_reduce(torch.tensor([mine.wall, self.run_.stage_times("val").wall], dtype=torch.float64),
                               op="max")
        train_wall = max(float(walls[0]), 1e-9)
        data_only = self.data_only
        return {
            "epochs": self.cfg.epochs,
            "steps": self.batches_fed if data_only else self.step,
            "data_only": data_only,
            "task": self.cfg.task,
            "val_metric": None if data_only else self.metric,
            f"val_{self.metric}": at.val_curve[-1] if at.val_curve else None,
            f"val_{self.metric}_curve": None if data_only else at.val_curve,
            "num_classes": self.ds.num_classes,
            "seeds_per_s": total.seeds / train_wall,
            "stage_seconds": {n: v for n, v in stage.as_dict().items() if n != "wall"},
            "pipeline_wall_s": stage.wall,
            "eval_wall_s": float(walls[1]),  # every validation pass's seconds, summed (the slowest rank's)
            "limiting_stage": stage.limiting(),
            # the slowest rank's: an epoch is done when every rank's is (the ranks' SSD bytes are summed over it)
            "epoch_seconds": ctx.all_reduce(torch.tensor(at.epoch_seconds, dtype=torch.float64), op="max").tolist(),
            # every rank's process, summed: what an epoch costs the machine's cores (since this start)
            "epoch_cpu_seconds": ctx.all_reduce(torch.tensor(self.run_.epoch_cpu_seconds, dtype=torch.float64)).tolist(),
            # every rank's SSD reads in each train epoch, summed (validation's and the caches' fill not counted)
            "epoch_ssd_bytes": [int(x) for x in ctx.all_reduce(torch.tensor(self.run_.epoch_ssd_bytes,
                                                                            dtype=torch.float64)).tolist()],
            "wall_s": wall,
            "loss_curve": None if data_only else self.curve,
            "tier_bytes": tier_bytes,
            "tier_rows": rows,
            # the feed rate: what the tiers served in the train epochs over their seconds (validation's reads apart)
            "train_tier_bytes": {n: int(b) for n, b in total.train_tier_bytes.items()},
            "tier_mb_per_s": {n: b / 1e6 / train_wall for n, b in total.train_tier_bytes.items()},
            "ssd_bytes_read": int(total.ssd_bytes),
            "cpu_hit_rate": (rows["cpu"] / max(1, rows["cpu"] + rows["ssd"]) if "cpu" in rows and "ssd" in rows
                             else None),
            "memory_hit_rate": 1 - rows["ssd"] / max(1, sum(rows.values())) if "ssd" in rows else None,
            "peak_rss_bytes": int(ctx.all_reduce(torch.tensor([_peak_rss()], dtype=torch.float64), op="max")[0]),
            "memory": self.run_.memory(),
            "cache_policy": self.plan.cache_policy if self.plan is not None else None,
            "io_shape": self.plan.io_shape if self.plan is not None else None,
            "superbatch": self.plan.tiers.superbatch if self.plan is not None else None,
            "ssd_requests": int(total.ssd_requests),
            "ssd_request_sizes": total.ssd_request_sizes(),
            "packed_rows": int(total.packed_rows),
            "segment_batches": int(total.segment_batches),
            "whole_batches": int(total.whole_batches),
            "pack_left_out_rows": int(total.pack_left_out_rows),
            "direct_rows": int(total.direct_rows),
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
            "resumed_from_step": self.checkpoints.resumed_from,
            "restarts": self.restarts,
            "checkpoint_dir": str(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir is not None else None,
            "per_rank": (per_rank := ctx.all_gather_object(self._rank_report())),
            "nnodes": ctx.nnodes,
            "machines": machines_of(per_rank),
        }

    def _rank_report(self) -> dict[str, Any]:
        """This rank's plan GPUs, its device and how it was matched, and its planned vs achieved SSD shares."""
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
            out["heap"] = self.run_.heap_use()
            out["pack_fit"] = st.get("pack_fit")
        out["disks"] = self.run_.disks.report()
        return out

    def store_line(self) -> str:
        t, info = self.plan.tiers, self.store_info
        return (f"cache policy {t.policy}: {info.summary()}; "
                f"I/O shape {t.shape} (superbatch {t.superbatch}, merge gap "
                f"{'per job, by cost' if t.merge_gap < 0 else f'{t.merge_gap} B'}), "
                f"reader {info.backend}" + self._pack_note())

    def _pack(self):
        """The layout's pack, when this run reads it."""
        return self.layout.pack if self.plan is not None and self.plan.io_shape == "packed" else None

    def _pack_note(self) -> str:
        pk = self._pack()
        if pk is None:
            return ""
        note = f"; pack: {pk.epochs} epoch(s) of segments, {pk.bytes / 2**20:,.0f} MiB on disk"
        fit = self.source.tier_stats().get("pack_fit")
        if fit is not None and fit < pk.cached_rows:
            note += (f", written for caches of the {pk.cached_rows:,} hottest rows (this rank's hold the hottest "
                     f"{fit:,}: the others are read apart from the segments)")
        return note

    def pack_notes(self, m: dict[str, Any]) -> list[str]:
        """The end-of-run notes for this run's pack, when it reads one: the epochs it does not hold (each read
        from the layout, many times slower: the 8M bench's data-only epochs 0.3-0.4 s packed, 4.6-5.3 s past
        it) with the command that packs them, and `left_out_note`."""
        pk = self._pack()
        if pk is None:
            return []
        return (self.plan.pack.notes() + left_out_note(pk, self.cfg.layout, self.cfg.dataset, m)
                + pack_kind_note(pk, self.cfg.layout, self.cfg.dataset, m))

    @property
    def has_ssds(self) -> bool:
        """Whether the layout keeps rows on SSDs: one placed for a machine without any holds every row in its caches,
        and reading none from an SSD is then what it was placed for, not a note."""
        return self.layout is None or bool(self.layout.manifest.bins.of_kind(Kind.ssd))

    def memory_notes(self) -> list[str]:
        """Say so when this rank's memory tiers hold every row: the run would never read an SSD."""
        if self.plan is None or not self.has_ssds:
            return []
        st, n = self.store_info, self.source.num_nodes
        # the CPU cache leaves out the rows a GPU tier serves: this rank's, and with peers the node's
        gpu = st.gpu_rows + st.peer_rows if st.peers else 0 if st.shared_cache else st.gpu_rows
        if st.cpu_rows + gpu < n:
            return []
        held = f"the CPU cache ({st.cpu_rows:,} rows)" + (f" and the GPU tiers ({gpu:,} rows)" if gpu else "")
        return [f"note: {held} hold all {n:,} rows of the layout: nothing will be read from the SSDs. "
                f"To exercise them, cap the cache (e.g. --cpu-cache-limit 10%) or place with smaller "
                f"--gpu-cache/--cpu-cache"]

    def close(self) -> None:
        """Drop DDP: its reducer holds the process group, which must die at close (the run frees the store)."""
        self.model = self.module


def left_out_note(pk: Any, layout: Path | None, dataset: Path | None, m: dict[str, Any]) -> list[str]:
    """Say so when the rows pack `pk` leaves out for larger caches than this run's (`m`: its metrics) were a large
    part of its reads, with the `moment data pack` that fits this run's caches: each such row is read from the
    layout on its own, beside its batch's segment (a pack for another --memory-budget on the bench's 8M layout:
    284,654 SSD reads against 2,358, and 1.25-1.46x the epoch)."""
    fits = [r["pack_fit"] for r in m["per_rank"] if r.get("pack_fit") is not None]
    left = m["pack_left_out_rows"]
    if not fits or 2 * left <= m["ssd_requests"]:
        return []
    fit = min(fits)
    return [f"note: the run read {left:,} rows that the pack leaves out for caches of the {pk.cached_rows:,} hottest "
            f"rows, which this run's caches do not hold (they hold the hottest {fit:,}): each was read from "
            f"the layout apart from its batch's segment ({m['ssd_requests']:,} SSD reads in all). A pack for this "
            f"run's caches: {pk.command(layout, dataset, cached=fit)}"]


# A fitted pack's run on CPU whose cores bound it and whose SSDs were busy less than this share of its train epochs
# is pointed to a whole pack (about twice the bytes read: the SSDs stay under ~90% busy); a whole pack's run whose
# SSDs were busy more than WHOLE_BUSY_MAX, to the fitted one. The bench's 8M / 16M training on 2 cores: a whole
# pack's SSDs busy 33-37% / 59-62% at 0.98-1.04x / 0.88-0.97x the in-memory epoch; its data-only runs 90-93%.
FIT_BUSY_MAX, WHOLE_BUSY_MAX = 0.45, 0.85


def pack_kind_note(pk: Any, layout: Path | None, dataset: Path | None, m: dict[str, Any]) -> list[str]:
    """Say which pack suits the resource that bound this run (`m`: its metrics), with the command that writes it:
    a whole pack (no row copied, twice the reads) where the cores bound a CPU run and its SSDs sat mostly idle,
    the pack fitted to the caches where a whole pack's SSDs were busy throughout, or where the batches are copies
    of staging slots (CUDA) and a whole pack's are not read straight into them."""
    fits = [r["pack_fit"] for r in m["per_rank"] if r.get("pack_fit")]
    if not pk.cached_rows and m.get("device") != "cpu" and fits:
        return [f"note: on {m.get('device')} a whole pack's batches go through the caches (a batch is a copy of a "
                "staging slot, not read straight into it), reading every row of each segment for the misses: a pack "
                "that leaves out what the caches hold reads about half the bytes: "
                f"{pk.command(layout, dataset, cached=min(fits))}"]
    busy = [d["busy_share"] for r in m["per_rank"] for d in r.get("disks") or [] if d.get("busy_share") is not None]
    if not busy or m.get("device") != "cpu":
        return []
    most = max(busy)
    if pk.cached_rows and most < FIT_BUSY_MAX and m.get("limiting_stage") == "train" and not m.get("data_only"):
        return [f"note: this run's SSDs were busy {most:.0%} of its train epochs while the model and the data path "
                "shared the cores: a whole pack reads each batch straight into its buffer, no row copied, for about "
                f"twice the SSD reads (docs/placement.md#packs): {pk.command(layout, dataset, cached=0)}"]
    if not pk.cached_rows and most > WHOLE_BUSY_MAX and fits:
        return [f"note: this run's SSDs were busy {most:.0%} of its train epochs reading a whole pack (every row of "
                "each batch): a pack that leaves out what the caches hold reads about half the bytes: "
                f"{pk.command(layout, dataset, cached=min(fits))}"]
    return []


def machines_of(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks' reports (`Trainer._rank_report`) summed per machine: the rows each machine's ranks read, how
    many of them (and bytes) came from other machines, and what it served to the others; its SSD devices' use
    (`disks`: device-wide counters, every rank's reads in them, so its first rank's)."""
    out: dict[int, dict[str, Any]] = {}
    for r in per_rank:
        m = out.setdefault(r["node_rank"], {"node_rank": r["node_rank"], "machine": r.get("machine"), "host": r["host"],
                                            "ranks": [], "rows": 0, "remote_rows": 0, "remote_bytes": 0,
                                            "remote_served_rows": 0, "remote_served_bytes": 0,
                                            "disks": r.get("disks", [])})
        m["ranks"].append(r["rank"])
        for k in ("rows", "remote_rows", "remote_bytes", "remote_served_rows", "remote_served_bytes"):
            m[k] += r[k]
    for m in out.values():
        m["remote_share"] = m["remote_rows"] / m["rows"] if m["rows"] else 0.0
    return [out[k] for k in sorted(out)]


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(doc, indent=2), "--metrics-json")



def train(cfg: TrainConfig, ctx: DistContext | None = None) -> dict[str, Any]:
    """Run training with `cfg`; returns the metrics (and writes them when `cfg.metrics_json` is set)."""
    run = start(cfg, ctx)
    trainer, done = None, False
    try:
        trainer = Trainer(run)
        with Reporter(enabled=run.ctx.is_main and not cfg.quiet, world_size=run.world_size,
                      total_epochs=cfg.epochs) as rep:
            rep.lines(trainer.notes)
            notes = trainer.memory_notes()
            if trainer.restart_note and run.ctx.is_main:
                rep.notice(trainer.restart_note)
            if trainer.plan is not None:
                rep.lines(trainer.plan.memory.lines() + [trainer.store_line()] + notes)
            metrics = trainer.run(rep)
            if trainer.plan is not None and metrics["ssd_bytes_read"] == 0 and not notes and trainer.has_ssds:
                notes.append("note: no feature row was read from the SSDs in this run (the caches served every "
                             "read); cap the cache (e.g. --cpu-cache-limit 10%) to exercise them")
            ends = trainer.pack_notes(metrics)
            metrics["notes"] = notes + ends
            metrics["config"] = cfg.to_dict()
            # rank 0 writes (as its options say: on several machines each gave its own); a failure stops every
            # rank, none waits on it
            run.ctx.on_main(lambda: cfg.metrics_json is not None and write_json_atomic(cfg.metrics_json, metrics))
            rep.summary(metrics)
            rep.lines((notes[-1:] if metrics["ssd_bytes_read"] == 0 else []) + ends)
        run.ctx.barrier()
        done = True
        return metrics
    finally:
        if trainer is not None:
            trainer.close()
        if done:
            run.close(say=False)  # its summary is the Reporter's, its metrics --metrics-json's
        else:  # this rank failed: no more collectives (its peers learn it from its exit)
            run.abandon()


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m moment.train` / torchrun; user errors exit 2 without a traceback."""
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
    except PeerLeft:  # a collective met a peer's absence: which peer, as a lost connection says it
        return _say_lost()
    except MomentError as e:
        from rich.markup import escape

        rank = os.environ.get("RANK", "0")  # as set-up renumbered it (moment.runtime.dist: by machine)
        # an agreed error is said once per machine: by rank 0, and by each other machine's first rank, whose user
        # reads that machine's screen (the error is computed from facts every rank shares, so it is the same one)
        first_here = os.environ.get("LOCAL_RANK") == "0" and int(os.environ.get(NNODES_ENV, "1") or 1) > 1
        if rank == "0" or first_here or not isinstance(e, AgreedError):
            Console(stderr=True, emoji=False).print(f"[bold red]error[/] (rank {rank}): " + escape(str(e)), highlight=False,
                                      soft_wrap=True)
        else:  # rank 0 says it: torchrun stops every rank once one exits, so give rank 0 time to
            time.sleep(AGREED_GRACE_S)
        return 2
    except Exception as e:  # noqa: BLE001 - only a lost peer is turned into a message; the rest re-raised
        if not peer_lost(e):
            raise
        import traceback

        with log_stream() as log:  # the traceback is torchrun's business: its log
            traceback.print_exc(file=log)
        return _say_lost()
    return 0


def _say_lost() -> int:
    rank = os.environ.get("RANK", "0")
    Console(stderr=True, emoji=False).print(f"error (rank {rank}): lost the connection to another rank, " + _who_lost(),
                                            highlight=False, soft_wrap=True)
    time.sleep(LOST_GRACE_S)  # rank 1 failing made rank 0 lose it: "rank 0 died" named the wrong rank
    return 1


def _who_lost() -> str:
    """Which peer a lost connection points at: on a run across machines with one rank per machine, another
    machine (named: never this one); else a rank that has probably failed."""
    env = os.environ
    if int(env.get(NNODES_ENV, "1") or 1) > 1 and env.get("LOCAL_WORLD_SIZE") == "1":
        return f"{others_gone(int(env.get(NODE_RANK_ENV, '0')), int(env[NNODES_ENV]))} (its own messages say why)"
    return "which has probably failed (its own message says why)"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
