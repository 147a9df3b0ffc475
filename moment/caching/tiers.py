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

from moment.caching.policies import POLICIES, CachePolicy, SlotMap, slot_dtype

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


class NodeBits:
    """A set of nodes as a bit per node, in 64-bit words (1/8 B per node): a membership test is a load and a
    shift per id. FixedSlots counts its cached ids in these words; a pack's cached rows are such a set
    (moment.runtime.disk_tier)."""

    def __init__(self, member: np.ndarray):
        """`member`: a mask over the nodes."""
        packed = np.packbits(member, bitorder="little")
        self.bits = np.zeros(NodeBits.words(member.shape[0]), np.uint64)
        self.bits.view(np.uint8)[: packed.shape[0]] = packed

    @classmethod
    def of(cls, ids: np.ndarray, num_nodes: int) -> NodeBits:
        member = np.zeros(num_nodes, bool)
        member[np.asarray(ids, np.int64)] = True
        return cls(member)

    @staticmethod
    def words(num_nodes: int) -> int:
        return (int(num_nodes) + 63) // 64

    @staticmethod
    def state_bytes(num_nodes: int) -> int:
        return NodeBits.words(num_nodes) * 8

    def has(self, ids: np.ndarray) -> np.ndarray:
        """Mask: which of `ids` are in the set."""
        return ((self.bits[ids >> 6] >> (ids & 63).astype(np.uint64)) & np.uint64(1)).astype(bool)

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes


class FixedSlots:
    """Slot lookup for a cache whose contents never change: a bit per node (cached or not) and each 64-node
    word's count of cached nodes before it, so a cached id's rank among the cached ids is that count plus the
    set bits below it in its word, and its slot is the rank's entry in a table of the cached ids' slots.

    Why not a binary search over the sorted cached ids (as before): each search reads memory the last one did
    not, and the queries had to be sorted first: 200k lookups over 8M nodes took 13-28 ms that way, 2.3-4.4 ms
    this way (bench/routing_lookups.py, caches of 8-100% of the nodes), in 3.9 MiB instead of 9.8 for the 8M bench's
    cache. A node-sized map would hold 4 B per node; this holds 3/16 B per node and 4 B per cached row."""

    def __init__(self, ids: np.ndarray, num_nodes: int):
        ids = np.asarray(ids, np.int64)
        self.bits = NodeBits.of(ids, num_nodes).bits
        self.before = np.zeros(self.bits.shape[0], slot_dtype(ids.shape[0]))  # counts of cached ids: at most a slot
        np.cumsum(np.bitwise_count(self.bits[:-1]), out=self.before[1:])
        # the slot of the cached id of each rank (ids in ascending order)
        self.slot = np.argsort(ids, kind="stable").astype(slot_dtype(ids.shape[0]))

    @staticmethod
    def state_bytes(num_nodes: int, capacity: int) -> int:
        """`memory_bytes` for `capacity` cached rows of `num_nodes`: a bit and, per 64 nodes, a count; a slot per
        cached row."""
        return NodeBits.state_bytes(num_nodes) + (NodeBits.words(num_nodes) + capacity) * slot_dtype(capacity).itemsize

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """The slots of `ids`, every one of them cached (an id that is not gets another id's slot)."""
        word = ids >> 6
        below = (np.uint64(1) << (ids & 63).astype(np.uint64)) - np.uint64(1)
        rank = self.before[word] + np.bitwise_count(self.bits[word] & below)
        return self.slot[rank].astype(np.int64)

    def memory_bytes(self) -> int:
        return self.bits.nbytes + self.before.nbytes + self.slot.nbytes


def slots_for(policy: CachePolicy, initial: np.ndarray, num_nodes: int) -> SlotMap | FixedSlots:
    """The slot lookup of a cache filled with `initial` (slot i holds initial[i]): a node-sized map when
    the policy changes the contents, else a binary search over the fixed ids."""
    if policy.changes:
        slots = SlotMap(policy.capacity, num_nodes)
        slots.fill(initial)
        return slots
    return FixedSlots(initial, num_nodes)


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


def first_ahead(superbatch: int, routed_whole: bool) -> int:
    """Batches a caller submits at the start of a sequence (an epoch, an evaluation) before it completes the
    first; after that one more per batch completed, up to the lookahead (`ahead_after`). Why not the whole
    lookahead at once: every epoch starts a sequence, and its first step then waited for 2K samplings, the
    first superbatch's routing and its reads (0.4-0.9 s of a 2 s epoch on the bench's 8M run, against 0.15 s
    in memory). Completing a batch closes its superbatch short, which only merges fewer reads where the cache
    decides batch by batch (static); a policy whose contents change is told a superbatch's accesses at once
    (`TierRouter.route`), so it needs the first whole: K - 1 more."""
    return max(0, superbatch - 1) if routed_whole else 0


#: the most batches of a sequence sampled ahead, as the one before it ends (`Pipeline.prepare`: a train epoch's
#: first, during the validation pass), and held meanwhile beside that sequence's own: the budget charges them
SAMPLED_AHEAD = 3


def ahead_after(lookahead: int, first: int, completed: int) -> int:
    """Batches kept submitted beyond the next one to complete, once `completed` of a sequence are."""
    return min(lookahead, first + completed)


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
        none = np.zeros(0, np.int64)
        gpu, peer, looks = [(none, none)] * len(batches), [(none, none, none)] * len(batches), [None] * len(batches)
        # the runtime's CPU tier asks neither lookup (its GPU and peer tiers are tiers of their own): every id is
        # then the policy's, without the masks and copies that pick those left (1 ms a batch of 75k ids)
        if self.gpu is not no_gpu or self.peers is not no_peers:
            for k, ids in enumerate(batches):
                mask, idx = self.gpu(ids)
                rest = np.flatnonzero(~mask)
                pmask, owner, pidx = self.peers(ids[rest])
                gpu[k], peer[k], looks[k] = (np.flatnonzero(mask), idx), (rest[pmask], owner, pidx), rest[~pmask]
        if self.policy.changes:
            self.policy.plan([ids if lk is None else ids[lk] for ids, lk in zip(batches, looks, strict=True)])
        out = []
        for ids_all, (gpos, gidx), (ppos, powner, pidx), lk in zip(batches, gpu, peer, looks, strict=True):
            ids = ids_all if lk is None else ids_all[lk]
            d = self.policy.access(ids)
            hit, miss = np.flatnonzero(d.hit), np.flatnonzero(~d.hit)
            r = Route(gpos, gidx, hit if lk is None else lk[hit], self.slots.lookup(ids[hit]),
                      miss if lk is None else lk[miss], peer_pos=ppos, peer_owner=powner, peer_idx=pidx)
            if d.admit.size:
                admit_slot = self.slots.apply(d)
                miss_ids = ids[miss]  # each admitted id's first position among the misses
                srt = np.argsort(miss_ids, kind="stable")
                at = srt[np.searchsorted(miss_ids[srt], d.admit)]
                r.admit_pos, r.admit_slot = r.miss_pos[at], admit_slot
            elif d.evict.size:
                self.slots.apply(d)
            out.append(r)
        return out
