"""The own GPU-cache tier: the GPU-cache bins of the plan GPUs this rank serves, in one tensor on its device.

Why (Moment (SC'25), section 3.1; Hyperion's static GPU cache): the hottest rows live in the memory of
the GPU that trains on them. Bin j of the layout's GPU bins belongs to local rank j % local_world_size
(moment.runtime.devices); the run plan carves how many of each bin's rows (hottest first) the tier
holds (`moment.runtime.run_plan.carve_gpu`: on CPU runs the tier stands in for device memory and is
capped by the budget's grant). Its rows are written into the batch once it is on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

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

    def holds(self, rows: LayoutRows, ids: np.ndarray) -> np.ndarray:
        """Mask of the ids this tier holds."""
        return rows.slot[ids] < self.limit[rows.bin[ids]]


def load_gpu_rows(rows: LayoutRows, bins: Sequence[GpuRows],
                  read: Callable[[int, int], np.ndarray]) -> tuple[TierMap, np.ndarray]:
    """The tier's map and rows (host memory): each bin's first rows as the plan carved them, read by
    `read(shard, k)` (the layout's first k rows of a shard's file)."""
    nb = rows.nbins  # a split layout's remote bins too: the tier holds none of their rows
    base, limit = np.zeros(nb, np.int64), np.zeros(nb, np.int64)
    table = np.empty((sum(g.rows for g in bins), rows.row_bytes), np.uint8)
    start = 0
    for g in bins:
        base[g.shard], limit[g.shard] = start, g.rows
        if g.rows:
            table[start:start + g.rows] = read(g.shard, g.rows)
        start += g.rows
    return TierMap(base, limit), table


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
        mask = self.held.holds(self.layout_rows, ids)
        if not mask.any():
            return _Part(np.zeros(0, np.int64), np.zeros(0, np.int64), self.next.take(ids, pos, tag))
        on = ids[mask]
        r = self.layout_rows
        rest = np.flatnonzero(~mask)
        return _Part(at(pos, np.flatnonzero(mask)), self.held.base[r.bin[on]] + r.slot[on],
                     self.next.take(ids[rest], at(pos, rest), tag))

    def device_rows(self, part: _Part, out: torch.Tensor) -> None:
        if part.pos.size:
            out[torch.from_numpy(part.pos).to(out.device)] = self.table[torch.from_numpy(part.idx).to(self.table.device)]
            self.served += int(part.pos.size)
        self.next.device_rows(part.inner, out)

    def own_memory(self) -> dict[str, int]:
        return {"gpu_cache": int(self.table.nelement())}

    def release(self) -> None:
        self.table = self.table[:0]
