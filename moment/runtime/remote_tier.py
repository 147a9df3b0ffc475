"""The remote tier: the rows of a split layout that another machine owns come from that machine.

Why (moment.placement.split; DistDGL's KVStore pull): when the features are split over machines, a
row that no tier of this machine holds lives in the layout of the machine that owns it, and that
machine reads it for us. The transport is the peer tier's (moment.runtime.exchange): NCCL on GPUs,
gloo on CPU, one round of collectives per completed batch. Each rank exchanges with the ranks that
have its local rank on the other machines (`DistContext.remote_group`: one group per local rank,
members in machine order, so member j is machine j and a machine's ranks share the serving): it asks
each owner for the node ids it lacks and serves what the others ask of it.

A rank serves from its own layout's files with a reader of its own (`SERVE_WINDOW`, `SERVE_INFLIGHT`):
not the chain's disk tier, whose reader runs ahead of the batches and may be waiting for buffer
memory that the consumer frees only after this round. The memory budget charges one round of the
exchange and that reader (moment.runtime.footprint: `remote_round_bytes`, `remote_reader_bytes`).

A batch's round is one of its `fetches` (moment.runtime.tier.ExchangeFetch), started by the rank's
collective thread before the step of the batch before it and finished after that step (the pipeline's
one-batch-ahead prefetch), as the peer tier's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moment.errors import MomentError
from moment.io.merge import SHAPES
from moment.placement.opened import Layout
from moment.placement.reader import shard_path
from moment.runtime.disk_tier import DiskTier
from moment.runtime.exchange import ExchangeGroup
from moment.runtime.exchange_tier import ExchangeTier
from moment.runtime.footprint import SERVE_INFLIGHT, SERVE_WINDOW
from moment.runtime.gather import BufferPool, Job, Reader
from moment.runtime.run_plan import TierPlan
from moment.runtime.tier import LayoutRows, Tier

@dataclass
class _Reading:
    """Rows another machine asked for, still being read (moment.runtime.exchange.Deferred)."""

    job: Job

    def wait(self) -> torch.Tensor:
        return torch.from_numpy(self.job.wait())


class RemoteTier(ExchangeTier):
    """Rows the machines of `group` own, over `next` (this machine's own tiers): a round of the exchange per
    completed batch fetches them, and serves the rows this machine owns to the others from `layout`."""

    name = "remote"

    def __init__(self, rows: LayoutRows, next: Tier, device: torch.device | str, group: ExchangeGroup,
                 layout: Layout, t: TierPlan, disk: DiskTier | None = None):
        super().__init__(rows, next, device, group)
        split = rows.split
        if split is None:
            raise ValueError("a remote tier needs a split layout")
        if group.size != len(split.machines) or group.index != split.machine:
            raise MomentError(f"this rank is member {group.index} of {group.size} machines' exchange, but its layout is "
                              f"machine {split.name} (index {split.machine}) of {len(split.machines)}",
                              source=str(layout.path),
                              hint="start machine K with `moment train --nnodes N --node-rank K` and its own layout")
        self.disk = disk  # its chunk checks, with --verify
        m = layout.manifest
        self.reader: Reader | None = Reader([shard_path(layout.path, s) for s in m.shards], rows.row_bytes,
                                            m.row.align, pool=BufferPool(0), window=SERVE_WINDOW,
                                            inflight=SERVE_INFLIGHT, queue_depth=t.queue_depth, backend=t.io_backend,
                                            direct=t.direct, device=self.device)
        self.served_bytes = 0

    @property
    def rows(self) -> int:
        """Rows other machines own."""
        return int(self.layout_rows.split.remote_rows)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        r = self.layout_rows
        far = r.remote(ids)
        if not far.any():
            return None
        mine = ids[far]
        return far, r.machine_of[r.bin[mine]], mine

    def serve(self, keys: torch.Tensor) -> torch.Tensor | _Reading:
        """The rows of node ids `keys` (asked by another machine), read from this machine's layout: the reads
        are submitted here and waited for when the exchange sends the rows (for a batch's last chunk, when its
        round is finished: the reads run during the training step before it)."""
        r = self.layout_rows
        ids = keys.detach().cpu().numpy().astype(np.int64, copy=False)
        out = np.empty((ids.shape[0], r.row_bytes), np.uint8)
        if not ids.size:
            return torch.from_numpy(out)
        if ids.min() < 0 or ids.max() >= r.num_nodes or r.remote(ids).any():
            raise MomentError(f"another machine asked machine {r.split.name} for rows it does not own: the "
                              "machines' layouts are not of one split", source=str(r.path))
        f, off = r.locate(ids)
        if self.disk is not None and self.disk.verify:
            self.disk.verify_chunks(f, off)
        assert self.reader is not None
        self.served_bytes += int(out.nbytes)
        return _Reading(self.reader.submit(Job(f, off, SHAPES["rows"], dest=out)))

    def add_stats(self, out: dict[str, Any]) -> None:
        out["remote_served_rows"] += self.exchange.served_rows
        out["remote_served_bytes"] += self.served_bytes

    def own_memory(self) -> dict[str, int]:
        return {"remote_exchange": self.exchange.peak_bytes,
                "remote_reader": self.reader.staging_bytes if self.reader is not None else 0}

    def release(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
