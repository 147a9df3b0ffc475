"""The peer tier: rows on the GPU tier of another rank of this node are copied from its memory, not read.

Why: every local rank holds the GPU-cache bins of the plan GPUs it serves (moment.runtime.devices); a
row in a bin of another GPU of the same node is one device-to-device copy away (P2P over PCIe or
NVLink where the driver enables it), far closer than the layout's file that a rank would otherwise
read it from. Once every rank has decided what its GPU tier holds, the ranks exchange, with one
`all_gather_object` over the world (keeping the ranks of their own node: node = rank //
local_world_size, as torchrun numbers them), where each bin's rows start in the owner's tier and how
many of them it holds (`TierMap`), and a way to map the tier:

* CUDA: the owner's tensor goes through `torch.multiprocessing.reductions.reduce_tensor`, whose
  arguments are plain values (CUDA IPC memory handle, ref-counter and event handles); a peer rebuilds
  it as a tensor in the owner's device memory. `tier[idx]` runs on the owner's device and `.to()`
  copies device to device (torch enables peer access where the driver allows it, else the copy is
  staged by the driver). The owner keeps its tensor alive as long as its store lives; a peer holds a
  CUDA context on the owner's device (the mapping needs one). The handle names the device by index,
  so the local ranks must see the same CUDA devices (torchrun's default).
* CPU (the stand-in for device memory on CPU runs): each rank's tier is a POSIX shared-memory segment
  (`HostCache.shared_segment`, one per owner: the owner fills it, the node's other ranks map it
  read-only, and the name is unlinked once all have mapped it, so nothing outlives the ranks).

A peer's tier is mapped, not copied: it costs this rank no memory (the owner counts it). Without a
process group, with one local rank, or when /dev/shm has no room (every rank then agrees to go
without), there are no peers and the store reads those rows from the layout as before.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moment.runtime.hostcache import HostCache, shm_room


@dataclass
class TierMap:
    """What one rank's GPU tier holds: bin b's first `limit[b]` slots, from row `base[b]` of the tier."""

    base: np.ndarray
    limit: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.limit.sum())


@dataclass
class Group:
    """How this rank reaches the other ranks (torch.distributed through moment.runtime.dist)."""

    rank: int
    local_rank: int
    local_world_size: int
    all_gather: Callable[[Any], list[Any]]
    barrier: Callable[[], None]
    key: str  # names the shared segments of this run (CPU)


class PeerTiers:
    """The GPU tiers of the node's other ranks, mapped: which rows they hold and one gather per owner."""

    def __init__(self, nbins: int, owners: list[int], tiers: list[torch.Tensor | np.ndarray],
                 maps: list[TierMap], keep: list[HostCache] | None = None):
        self.owners = owners  # local rank of each peer
        self.tiers = tiers
        self.owner = np.full(nbins, -1, np.int64)  # bin -> index into self.tiers
        self.base, self.limit = np.zeros(nbins, np.int64), np.zeros(nbins, np.int64)
        for i, m in enumerate(maps):
            held = m.limit > 0
            self.owner[held], self.base[held], self.limit[held] = i, m.base[held], m.limit[held]
        self._keep = keep or []

    @property
    def rows(self) -> int:
        return int(self.limit.sum())

    def lookup(self, bins: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mask of rows a peer holds, the peer of each, its row in that peer's tier)."""
        mask = slots < self.limit[bins]
        b = bins[mask]
        return mask, self.owner[b], self.base[b] + slots[mask]

    def gather(self, owner: np.ndarray, idx: np.ndarray, out: torch.Tensor | np.ndarray,
               pos: np.ndarray) -> None:
        """out[pos] = the rows idx of the peers' tiers: one indexed gather per peer (device to device on CUDA)."""
        for i in np.unique(owner).tolist():
            sel = owner == i
            t = self.tiers[i]
            if isinstance(t, np.ndarray):
                out[pos[sel]] = t[idx[sel]]
            else:
                rows = t[torch.from_numpy(idx[sel]).to(t.device)].to(out.device, non_blocking=True)
                out[torch.from_numpy(pos[sel]).to(out.device)] = rows

    def close(self) -> None:
        self.tiers = []
        for seg in self._keep:
            seg.close()
        self._keep = []


def share(own: TierMap, row_bytes: int, device: torch.device, fill: Callable[[np.ndarray], None],
          group: Group | None) -> tuple[torch.Tensor, PeerTiers | None, HostCache | None]:
    """Build this rank's GPU tier (`fill` writes its rows) and map the tiers of its node's other ranks.

    Returns (own tier on `device`, the peers or None, the shared segment backing the own tier on CPU).
    Every rank of the world must call it (it is collective when `group` is given).
    """
    if (group is None or group.local_world_size < 2 or device.type not in ("cpu", "cuda")):
        return _alone(own, row_bytes, device, fill), None, None
    why = shm_room(own.rows * row_bytes * group.local_world_size) if device.type == "cpu" else ""
    own_t = _alone(own, row_bytes, device, fill) if device.type == "cuda" else None
    handle = None
    if own_t is not None:
        from torch.multiprocessing.reductions import reduce_tensor

        handle = reduce_tensor(own_t)[1] if own_t.numel() else None
    metas = group.all_gather((group.rank, own.base, own.limit, why, handle))
    lws = group.local_world_size
    node = group.rank // lws
    local = [m for m in metas if m[0] // lws == node]
    whys = sorted({m[3] for m in metas if m[3]})
    if whys:  # every rank sees the same list, so all go without peers together
        warnings.warn(f"peer tier not possible ({whys[0]}); other GPUs' bins are read from the layout",
                      stacklevel=3)
        return (own_t if own_t is not None else _alone(own, row_bytes, device, fill)), None, None
    if own_t is not None:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        peers = [(m[0] % lws, m[4], TierMap(m[1], m[2])) for m in local if m[0] != group.rank]
        tiers = [rebuild_cuda_tensor(*h) if h is not None else torch.zeros((0, row_bytes), dtype=torch.uint8)
                 for _, h, _ in peers]
        return own_t, PeerTiers(own.limit.shape[0], [p[0] for p in peers], tiers, [p[2] for p in peers]), None
    # CPU: one segment per local rank, in local-rank order (the same barriers on every node)
    mine: HostCache | None = None
    owners, tiers, maps, keep = [], [], [], []
    by_local = {m[0] % lws: m for m in local}
    for o in range(lws):
        m = by_local[o]
        tm = TierMap(m[1], m[2])
        seg = HostCache.shared_segment(f"{group.key}-n{node}-gpu{o}", tm.rows, row_bytes,
                                       creator=o == group.local_rank, fill=fill, barrier=group.barrier)
        if o == group.local_rank:
            mine = seg
        else:
            owners.append(o)
            tiers.append(seg.rows)
            maps.append(tm)
            keep.append(seg)
    assert mine is not None
    return torch.from_numpy(mine.rows), PeerTiers(own.limit.shape[0], owners, tiers, maps, keep), mine


def _alone(own: TierMap, row_bytes: int, device: torch.device, fill: Callable[[np.ndarray], None]) -> torch.Tensor:
    rows = np.empty((own.rows, row_bytes), np.uint8)
    fill(rows)
    return torch.from_numpy(rows).to(device)
