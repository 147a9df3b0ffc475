"""Which tier serves each row of a batch: the GPU tier, a peer's GPU tier, the CPU cache, or a read.

Separate from the feature store so the decision can be tested (and simulated) without files, threads
or torch. A superbatch is routed at once: rows on this rank's GPU tier first, then rows on the GPU
tier of another rank of the node (copied device to device); only the rest go through the CPU cache
policy (a row a GPU of the node holds is never a CPU-cache candidate), which for a dynamic policy
(Belady per superbatch) first sees every batch of the superbatch (`plan`), then decides batch by
batch what hits, what is admitted and what is evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass

import numpy as np

from moment.caching.policies import POLICIES, CachePolicy, SlotMap

#: ids -> (mask of ids on the GPU tier, their rows in the GPU tier)
GpuLookup = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
#: ids -> (mask of ids on a peer's GPU tier, the owner of each, its row in the owner's tier)
PeerLookup = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class Route:
    """Positions in one batch and where they are served from (positions index the batch's ids)."""

    gpu_pos: np.ndarray
    gpu_idx: np.ndarray  # row in the GPU tier of each gpu_pos
    hit_pos: np.ndarray
    hit_slot: np.ndarray  # CPU cache slot of each hit_pos
    miss_pos: np.ndarray  # read from the layout
    admit_pos: np.ndarray | None = None  # misses copied into the CPU cache once read
    admit_slot: np.ndarray | None = None
    peer_pos: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    peer_owner: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))  # whose tier
    peer_idx: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))  # row in it


class FixedSlots:
    """Slot lookup for a cache whose contents never change: binary search over the sorted ids (8 B per
    cached row instead of a node-sized map)."""

    def __init__(self, ids: np.ndarray):
        order = np.argsort(ids, kind="stable")
        self.ids, self.slot = ids[order], order.astype(np.int64)

    @staticmethod
    def state_bytes(num_nodes: int, capacity: int) -> int:
        """`memory_bytes` for `capacity` cached rows (an int64 id and slot each; nothing per node)."""
        return capacity * 2 * np.dtype(np.int64).itemsize

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The slots of cached `ids`, searched for in sorted order: each search narrows from the last one's
        result over memory it just read (in the batch's own order every step of every search misses the
        CPU's caches: 4x slower)."""
        order = np.argsort(ids)
        at = np.empty(ids.shape[0], np.int64)
        at[order] = np.searchsorted(self.ids, ids[order])
        return self.slot[at]

    def memory_bytes(self) -> int:
        return self.ids.nbytes + self.slot.nbytes


def slots_for(policy: CachePolicy, initial: np.ndarray, num_nodes: int) -> SlotMap | FixedSlots:
    """The slot lookup of a cache filled with `initial` (slot i holds initial[i]): a node-sized map when
    the policy changes the contents, else a binary search over the fixed ids."""
    if policy.changes:
        slots = SlotMap(policy.capacity, num_nodes)
        slots.fill(initial)
        return slots
    return FixedSlots(initial)


def cache_state_bytes(policy: str, num_nodes: int, capacity: int) -> int:
    """Bytes a rank holds for a CPU cache's bookkeeping (the policy and its slot lookup), rows apart."""
    cls = POLICIES[policy]
    slots = SlotMap if cls.changes else FixedSlots
    cap = min(capacity, num_nodes)
    return cls.state_bytes(num_nodes, cap) + slots.state_bytes(num_nodes, cap)


def lookahead(superbatch: int) -> int:
    """Batches a caller submits before it completes the first: a superbatch's reads go out only when it
    closes, so with superbatches of K > 1 two of them (2K batches) keep the reads ahead of training."""
    return 2 * superbatch if superbatch > 1 else 2


def shared_by_local_ranks(policy: str, local_ranks: int) -> bool:
    """One CPU cache for all ranks of a machine: when its contents never change (each rank's policy
    would otherwise move rows the others read) and there is more than one rank to share it."""
    return not POLICIES[policy].changes and local_ranks > 1


def no_gpu(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(ids.shape[0], bool), np.zeros(0, np.int64)


def no_peers(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(ids.shape[0], bool), np.zeros(0, np.int64), np.zeros(0, np.int64)


class TierRouter:
    """Routes batches through the GPU tier, the peers' GPU tiers and the CPU cache policy; keeps the slot
    map in step. `gpu` and `peers` must hold disjoint rows (each GPU bin has one owner)."""

    def __init__(self, policy: CachePolicy, slots: SlotMap | FixedSlots, gpu: GpuLookup = no_gpu,
                 peers: PeerLookup = no_peers):
        self.policy, self.slots, self.gpu, self.peers = policy, slots, gpu, peers

    def route(self, batches: Sequence[np.ndarray]) -> list[Route]:
        """One Route per batch of a superbatch, in order (the policy's state advances batch by batch)."""
        gpu, peer, looks = [], [], []
        for ids in batches:
            mask, idx = self.gpu(ids)
            rest = np.flatnonzero(~mask)
            pmask, owner, pidx = self.peers(ids[rest])
            gpu.append((np.flatnonzero(mask), idx))
            peer.append((rest[pmask], owner, pidx))
            looks.append(rest[~pmask])
        if self.policy.changes:
            self.policy.plan([ids[lk] for ids, lk in zip(batches, looks, strict=True)])
        out = []
        for ids_all, (gpos, gidx), (ppos, powner, pidx), lk in zip(batches, gpu, peer, looks, strict=True):
            ids = ids_all[lk]
            d = self.policy.access(ids)
            r = Route(gpos, gidx, lk[d.hit], self.slots.lookup(ids[d.hit]), lk[~d.hit],
                      peer_pos=ppos, peer_owner=powner, peer_idx=pidx)
            if d.admit.size:
                admit_slot = self.slots.apply(d)
                miss_ids = ids[~d.hit]  # each admitted id's first position among the misses
                srt = np.argsort(miss_ids, kind="stable")
                at = srt[np.searchsorted(miss_ids[srt], d.admit)]
                r.admit_pos, r.admit_slot = r.miss_pos[at], admit_slot
            elif d.evict.size:
                self.slots.apply(d)
            out.append(r)
        return out
