"""An epoch's SSD reads predicted without reading: which rows miss the caches, the reads the store would
issue for them, and a disk model that turns those reads into seconds (`bench/fidelity.py`).

`TierModel` decides tiers as the store's chain (moment.runtime.store) does with a fixed (``static``) cache, from the same
plan (moment.runtime.run_plan: the rank's GPU carve, the CPU cache's rows and whether it is shared,
the I/O shape): a row is served by this rank's GPU stand-in or, with `peers`, by the stand-in of
another local rank (the peer tier), else by the CPU cache (the `cpu_rows` hottest rows of the
layout's order, less the rows a GPU tier serves: this rank's unless the cache is the local ranks'
shared segment, and with peers every local rank's), else it is read from the layout's files. The
misses of one job (one batch: the serial pipeline completes each batch right after submitting it, so
every superbatch holds one batch) become the reads the shape plans (`Shape.plan`, which `Reader`
calls too). Only the index, the hotness order and the file sizes are read; no feature byte is.

`Disk` is the time model, from `moment probe`'s two figures of the same file system: a request costs
1 / IOPS (the IOPS measured at `small`-byte reads) and the bytes of a request beyond its first `small`
bytes stream at the sequential rate:

    t(job) = requests / iops + sum(max(length - small, 0) for each request) / seq_rate

This reproduces both probe measurements (all-small random reads: requests / IOPS; 1 MiB reads: about
bytes / seq_rate), where ``bytes / seq_rate + requests / IOPS`` counts each small read twice.
Ranks share the disk: W ranks whose jobs c_1..c_W start together (DDP steps keep them in lock step)
and share it fairly finish at t_r = sum_j min(c_j, c_r) (processor sharing), which `shared` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moment.io.merge import Plan
from moment.placement.opened import Layout
from moment.runtime.run_plan import RankPlan, StorePlan


@dataclass(frozen=True)
class Disk:
    seq_bps: float  # sequential read rate, bytes/s
    iops: float  # small random reads/s
    small: int = 4096  # the size the IOPS were measured at

    def seconds(self, plan: Plan) -> float:
        over = np.maximum(plan.length - self.small, 0).sum() if len(plan) else 0
        return len(plan) / self.iops + float(over) / self.seq_bps


def shared(costs: Sequence[float]) -> list[float]:
    """Each rank's finish time when jobs of `costs` seconds (alone) start together on one fair disk."""
    c = np.asarray(costs, float)
    return [float(np.minimum(c, x).sum()) for x in c]


class TierModel:
    """One rank's tiers of a layout (static CPU cache) and the read plans of its misses, as the rank's
    store would build them from the same plan (`StorePlan`: its GPU tier, CPU cache and I/O shape)."""

    def __init__(self, layout: str | Path | Layout, plan: StorePlan, peers: Sequence[RankPlan] = ()):
        """`peers`: the plans of the other local ranks whose GPU tiers this rank reads (the peer tier)."""
        lay = layout if isinstance(layout, Layout) else Layout.open(layout)
        self.path, self.manifest = lay.path, lay.manifest
        t = plan.tiers
        m = lay.manifest
        n = self.num_nodes = m.dataset.num_nodes
        self.row_bytes, self.align = m.row.row_bytes, m.row.align
        self.shape, self.window = t.io_shape, t.window
        self._bin, self._slot = lay.load_index()
        self._stride = np.array([s.stride for s in m.shards], np.int64)
        self.sizes = np.array([lay.shard_file(s).stat().st_size for s in m.shards], np.int64)
        limit = np.zeros(len(m.shards), np.int64)
        for r in [plan.rank, *peers]:  # each GPU tier holds its own bins' hottest rows
            for g in r.gpu_bins:
                limit[g.shard] = g.rows
        self.on_gpu = self._slot < limit[self._bin]  # this rank's tier, and with peers theirs
        order = lay.hot_order()
        if self.on_gpu.any() and (peers or not t.shared_cache):
            order = order[~self.on_gpu[order]]
        self.cached = np.zeros(n, bool)
        self.cached[order[:max(0, min(t.cpu_rows, order.shape[0]))]] = True

    def misses(self, ids: np.ndarray) -> np.ndarray:
        """The distinct ids of a batch that neither a GPU stand-in nor the CPU cache holds."""
        ids = np.asarray(ids, np.int64)
        return np.unique(ids[~(self.on_gpu[ids] | self.cached[ids])])

    def plan(self, miss: np.ndarray) -> Plan:
        """The reads `Reader` issues for these rows (one job), by the shape's own rule."""
        f = self._bin[miss].astype(np.int32)
        off = self._slot[miss].astype(np.int64) * self._stride[f]
        return self.shape.plan(f, off, self.row_bytes, self.align, self.window, self.sizes)

    def batch_plan(self, ids: np.ndarray) -> Plan:
        return self.plan(self.misses(ids))
