"""The own GPU-cache tier: the GPU-cache bins of the plan GPUs this rank serves, in one tensor on its device.

Why (Moment (SC'25), section 3.1; Hyperion's static GPU cache): the hottest rows live in the memory of
the GPU that trains on them. Bin j of the layout's GPU bins belongs to local rank j % local_world_size
(moment.runtime.devices); the run plan carves how many of each bin's rows (hottest first) the tier
holds (`moment.runtime.run_plan.carve_gpu`: on CUDA as many as the rank's device budget leaves,
moment.runtime.device_budget; on CPU runs the tier stands in for device memory and is capped by the host
budget's grant). Its rows are written into the batch once it is on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moment.io.device import index_rows, layer, upload_chunk
from moment.io.splits import split_held
from moment.runtime.run_plan import GpuRows
from moment.runtime.tier import LayoutRows, Tier, at


@dataclass
class TierMap:
    """What one rank's GPU tier holds: bin b's first `limit[b]` slots, from row `base[b]` of the tier."""

    base: np.ndarray
    limit: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.limit.sum())

    def split(self, rows: LayoutRows, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the positions among `ids` of those this tier holds, their rows in it, the other positions): one pass
        over the bins and slots (moment.io.splits; with NumPy, the bins first, 1 B per node, the slots, 4 B per
        node, only of ids in a bin the tier takes rows of: bench/routing_lookups.py)."""
        return split_held(ids, rows.bin, rows.slot, self.limit, self.base)

    def holds(self, rows: LayoutRows, ids: np.ndarray) -> np.ndarray:
        """Mask of the ids this tier holds (`split`)."""
        out = np.zeros(ids.shape[0], bool)
        out[self.split(rows, ids)[0]] = True
        return out


def tier_map(rows: LayoutRows, bins: Sequence[GpuRows]) -> TierMap:
    """Where each bin's carved rows sit in the tier's table: the bins in order, each from its first slot."""
    nb = rows.nbins  # a split layout's remote bins too: the tier holds none of their rows
    base, limit = np.zeros(nb, np.int64), np.zeros(nb, np.int64)
    start = 0
    for g in bins:
        base[g.shard], limit[g.shard] = start, g.rows
        start += g.rows
    return TierMap(base, limit)


def table_chunks(bins: Sequence[GpuRows], chunk_rows: int) -> Iterator[tuple[int, int, int, int]]:
    """(shard, first row in its file, rows, first row in the table) of each chunk the table is loaded in: each
    bin's carved rows in order, at most `chunk_rows` at a time."""
    at = 0
    for g in bins:
        for first in range(0, g.rows, chunk_rows):
            yield g.shard, first, min(chunk_rows, g.rows - first), at + first
        at += g.rows


def load_gpu_table(rows: LayoutRows, bins: Sequence[GpuRows], read: Callable[[int, int, int, np.ndarray], Any],
                   device: Any) -> tuple[TierMap, torch.Tensor]:
    """The tier's map and its table on `device`, the rows read chunk by chunk by `read(shard, k, start, out)`
    (rows start..start+k of a shard's file into `out`: moment.runtime.disk_tier.DiskTier.file_rows).

    Why chunks: the table can be most of a GPU's memory, and built whole in host memory it was that much
    again on every local rank at once (and a second copy on its way to the device). On CUDA each chunk is read
    into one reused pinned buffer (moment.io.device.upload_chunk, charged by the host budget) and copied to
    its slice of the table, the copy waited for before the buffer is refilled; on CPU the table is the tier's
    host stand-in and the rows are read straight into it."""
    held = tier_map(rows, bins)
    rb = rows.row_bytes
    dev = layer(device)
    table = dev.empty(held.rows * rb).view(held.rows, rb)
    chunk_rows, chunk_bytes = upload_chunk(rb, held.rows)
    host = dev.host_buffer(chunk_bytes) if dev.copies and held.rows else None
    for shard, first, k, row in table_chunks(bins, chunk_rows):
        if host is None:
            read(shard, k, first, table[row:row + k].numpy())
        else:
            stage = host[: k * rb]
            read(shard, k, first, stage.numpy().reshape(k, rb))
            table[row:row + k].copy_(stage.view(k, rb))  # a blocking copy: the buffer is refilled next
    return held, table


@dataclass
class _Part:
    pos: np.ndarray  # positions in the batch this tier serves
    idx: np.ndarray  # their rows in the tier
    inner: Any


class GpuTier(Tier):
    """Rows on this rank's GPU tier (`table`, on the device, laid out as `held`); the rest from `next`."""

    name = "gpu"

    def __init__(self, rows: LayoutRows, next: Tier, device: torch.device | str, held: TierMap,
                 table: torch.Tensor):
        super().__init__(rows, next, device)
        self.held, self.table = held, table

    @property
    def rows(self) -> int:
        return int(self.table.shape[0])

    def take(self, ids: np.ndarray, pos: np.ndarray | None, tag: tuple | None) -> _Part:
        on, idx, rest = self.held.split(self.layout_rows, ids)
        if not on.size:
            return _Part(on, idx, self.next.take(ids, pos, tag))
        return _Part(at(pos, on), idx, self.next.take(ids[rest], at(pos, rest), tag))

    def device_rows(self, part: _Part, out: torch.Tensor) -> None:
        if part.pos.size:
            index_rows(out, part.pos, self.table, part.idx)
            self.served += int(part.pos.size)
        self.next.device_rows(part.inner, out)

    def own_memory(self) -> dict[str, int]:
        return {"gpu_cache": int(self.table.nelement())}

    def release(self) -> None:
        """Drop the table: an empty tensor of its own, not a view that would keep the table's memory alive."""
        self.table = self.table.new_empty((0, self.layout_rows.row_bytes))
