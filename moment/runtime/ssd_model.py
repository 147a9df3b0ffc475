"""An epoch's SSD reads predicted without reading: which rows miss the caches, the reads the store would
issue for them, and a disk model that turns those reads into seconds (`bench/fidelity.py`).

`TierModel` decides tiers as `TieredFeatureStore` does with a fixed (``static``) cache: a row is served
by this rank's GPU stand-in (its GPU bins, hottest rows first, `gpu_rows` of them) or, with `peers`, by
the stand-in of another local rank (the peer tier), else by the CPU cache (the `cpu_rows` hottest rows
of the layout's order, less the rows a GPU tier serves: this rank's unless the cache is the local ranks'
shared segment, and with peers every local rank's), else it is read from the layout's files. The misses
of one job (one batch: the serial pipeline completes each batch right after submitting it, so every
superbatch holds one batch) become aligned runs with `plan_runs` for the I/O shape (``rows``: gap 0;
``block``: the gap whose plan `Shape.cost` rates cheapest), exactly as `Reader` plans them. Only the
index, the hotness order and the file sizes are read; no feature byte is.

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

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moment.placement.reader import damaged, index_problem, load_manifest, shard_path
from moment.io.merge import GAPS, SHAPES, Plan, plan_runs
from moment.runtime.devices import plan_gpus_of
from moment.runtime.store import hot_order


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
    """One rank's tiers of a layout (static CPU cache) and the read plans of its misses."""

    def __init__(self, layout: str | Path, *, local_rank: int = 0, local_world_size: int = 1,
                 cpu_rows: int, gpu_rows: int | None = None, shared_cache: bool = False, shape: str = "rows",
                 window: int = 8 << 20, merge_gap: int | None = None, max_request: int | None = None,
                 peers: bool = False):
        self.path = Path(layout)
        m = self.manifest = load_manifest(self.path)
        n = self.num_nodes = m.dataset.num_nodes
        self.row_bytes, self.align = m.row.row_bytes, m.row.align
        sh = SHAPES[shape]
        self.shape = dataclasses.replace(sh, merge_gap=sh.merge_gap if merge_gap is None else int(merge_gap),
                                         max_request=sh.max_request if max_request is None else int(max_request))
        self.window = max(int(window), self.align)
        idx = np.load(self.path / m.index.path, mmap_mode="r")
        if why := index_problem(m, idx):
            raise damaged("index", why, self.path / m.index.path)
        self._bin = np.asarray(idx[:, 0]).astype(np.int32)
        self._slot = np.asarray(idx[:, 1]).astype(np.int64)
        self._stride = np.array([s.stride for s in m.shards], np.int64)
        self.sizes = np.array([shard_path(self.path, s).stat().st_size for s in m.shards], np.int64)
        gpu_bins = [i for i, s in enumerate(m.shards) if s.kind == "gpu"]
        limit = np.zeros(len(m.shards), np.int64)
        peers = peers and local_world_size > 1
        for r in range(local_world_size) if peers else [local_rank]:  # each GPU tier holds its own bins
            mine = plan_gpus_of(r, local_world_size, [m.shards[b].bin for b in gpu_bins])
            own = [b for b in gpu_bins if m.shards[b].bin in mine]
            left = sum(m.shards[b].rows for b in own) if gpu_rows is None else int(gpu_rows)
            for b in own:
                limit[b] = min(m.shards[b].rows, left)
                left -= limit[b]
        self.on_gpu = self._slot < limit[self._bin]  # this rank's tier, and with peers theirs
        order = hot_order(self.path, m)
        if self.on_gpu.any() and (peers or not shared_cache):
            order = order[~self.on_gpu[order]]
        self.cached = np.zeros(n, bool)
        self.cached[order[:max(0, min(int(cpu_rows), order.shape[0]))]] = True

    def misses(self, ids: np.ndarray) -> np.ndarray:
        """The distinct ids of a batch that neither a GPU stand-in nor the CPU cache holds."""
        ids = np.asarray(ids, np.int64)
        return np.unique(ids[~(self.on_gpu[ids] | self.cached[ids])])

    def plan(self, miss: np.ndarray) -> Plan:
        """The reads `Reader` issues for these rows (one job)."""
        f = self._bin[miss]
        off = self._slot[miss] * self._stride[f]
        sh = self.shape
        gaps = [g for g in GAPS if g <= sh.max_request] if sh.merge_gap < 0 else [sh.merge_gap]
        plans = [plan_runs(f, off, self.row_bytes, self.align, g, min(sh.max_request, self.window), self.sizes)
                 for g in gaps]
        return min(plans, key=sh.cost)

    def batch_plan(self, ids: np.ndarray) -> Plan:
        return self.plan(self.misses(ids))
