"""CPU-cache policies with one small interface, shared by the training runtime and the simulator.

All caches hold whole rows (unit size) and are batch-granular: the accesses of one mini-batch happen
at the same time, so a batch either finds a row cached (hit) or reads it (miss); after the batch the
policy decides which of the misses enter the cache (`admit`) and which cached rows leave (`evict`).
The runtime copies admitted rows out of the reads that fetched them, so admission costs no extra I/O.

* `static`            the `capacity` hottest rows by pre-sampled hotness (Hyperion, Moment); never changes.
* `lru`               batch-granular LRU, every miss admitted; for comparison.
* `belady-superbatch` Ginex's provably optimal cache inside a superbatch: the runtime samples the next K
                      batches first and tells the policy (`plan`); after each batch it keeps the rows of
                      (cache ∪ batch) whose next use in the superbatch is nearest, rows with no known
                      next use last (hotter first). The difference between consecutive contents is
                      Ginex's changeset; its rows are exactly the admitted misses, read anyway.
* `belady`            the same with the whole trace as the future: the offline optimum (MIN with
                      bypass, unit rows), the bound the simulator reports.

Everything is vectorised: per batch O(capacity + batch) work (an argpartition), no per-row Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moment.errors import MomentError


@dataclass
class Decision:
    hit: np.ndarray  # bool, aligned with the ids passed to access()
    admit: np.ndarray  # node ids (a subset of the misses) entering the cache after this batch
    evict: np.ndarray  # node ids leaving it after this batch

    @classmethod
    def none(cls, hit: np.ndarray) -> Decision:
        z = np.zeros(0, np.int64)
        return cls(hit, z, z)


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Each id once, in order of first appearance: a row missed twice in a batch is admitted once."""
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)] if first.shape[0] != ids.shape[0] else ids


def rank_dtype(num_nodes: int) -> np.dtype:
    """The dtype of a policy's hotness rank (node -> position, hottest 0)."""
    return np.dtype(np.int32 if num_nodes < 2**31 else np.int64)


def hotness_rank(hotness: np.ndarray | None, num_nodes: int) -> np.ndarray:
    """rank[v] = position of v in descending hotness (0 = hottest), ties by node id."""
    dt = rank_dtype(num_nodes)
    if hotness is None:
        return np.arange(num_nodes, dtype=dt)
    h = np.asarray(hotness)
    if h.shape != (num_nodes,):
        raise MomentError(f"hotness has shape {h.shape}, expected ({num_nodes},)")
    order = np.argsort(-h.astype(np.float64), kind="stable")
    rank = np.empty(num_nodes, dt)
    rank[order] = np.arange(num_nodes, dtype=dt)
    return rank


class CachePolicy:
    name = "base"
    changes = True
    #: bytes per node of the arrays a policy keeps beside `cached` (1 B) and its hotness rank: LRU's
    #: last use, Belady's next use (`state_bytes` says the whole)
    extra_node_bytes = 0

    @classmethod
    def state_bytes(cls, num_nodes: int, capacity: int) -> int:
        """What `memory_bytes` will be for a cache of `capacity` rows over `num_nodes` (after `reset`,
        before `plan`): the memory budget charges this, no copy of the arrays' sizes elsewhere."""
        per_node = 1 + (rank_dtype(num_nodes).itemsize if cls.changes else 0) + cls.extra_node_bytes
        return num_nodes * per_node + min(capacity, num_nodes) * np.dtype(np.int64).itemsize  # + members

    def __init__(self, capacity: int, num_nodes: int, rank: np.ndarray):
        if capacity < 0:
            raise MomentError(f"cache capacity must be >= 0 rows, got {capacity}")
        self.capacity, self.num_nodes = int(min(capacity, num_nodes)), int(num_nodes)
        self.rank = rank
        self.cached = np.zeros(num_nodes, bool)
        self.members = np.zeros(0, np.int64)

    def initial(self) -> np.ndarray:
        """The `capacity` hottest nodes, hottest first (every policy's warm start)."""
        if not self.capacity:
            return np.zeros(0, np.int64)
        return np.argsort(self.rank, kind="stable")[: self.capacity]

    def reset(self, initial: np.ndarray | None = None) -> None:
        init = self.initial() if initial is None else np.asarray(initial, np.int64)[: self.capacity]
        self.cached[:] = False
        self.cached[init] = True
        self.members = init.copy()

    def plan(self, batches: Sequence[np.ndarray]) -> None:
        """The future known before these batches run (a superbatch); ignored by most policies."""

    def access(self, ids: np.ndarray) -> Decision:
        raise NotImplementedError

    def contents(self) -> np.ndarray:
        return np.sort(self.members)

    def memory_bytes(self) -> int:
        return self.cached.nbytes + self.rank.nbytes + self.members.nbytes

    def _replace(self, keep_mask_members: np.ndarray, admit: np.ndarray) -> np.ndarray:
        evict = self.members[~keep_mask_members]
        self.cached[evict] = False
        self.cached[admit] = True
        self.members = np.concatenate([self.members[keep_mask_members], admit])
        return evict


class StaticCache(CachePolicy):
    name = "static"
    changes = False

    def reset(self, initial: np.ndarray | None = None) -> None:
        super().reset(initial)
        self.rank = np.zeros(0, np.int32)  # only the start needs it: free 4 B per node

    def access(self, ids: np.ndarray) -> Decision:
        return Decision.none(self.cached[ids])


class LRUCache(CachePolicy):
    name = "lru"
    extra_node_bytes = np.dtype(np.int32).itemsize  # last

    def __init__(self, capacity: int, num_nodes: int, rank: np.ndarray):
        super().__init__(capacity, num_nodes, rank)
        self.last = np.full(num_nodes, -1, np.int32)  # extra_node_bytes
        self.t = 0

    def reset(self, initial: np.ndarray | None = None) -> None:
        super().reset(initial)
        self.last[:] = -1
        # warm start: hotter rows count as used more recently
        self.last[self.members] = -2 - np.arange(self.members.shape[0])
        self.t = 0

    def memory_bytes(self) -> int:
        return super().memory_bytes() + self.last.nbytes

    def access(self, ids: np.ndarray) -> Decision:
        ids = np.asarray(ids, np.int64)
        hit = self.cached[ids]
        miss = _distinct(ids[~hit])
        self.t += 1
        self.last[ids[hit]] = self.t
        admit = miss[: self.capacity]
        over = self.members.shape[0] + admit.shape[0] - self.capacity
        keep = np.ones(self.members.shape[0], bool)
        if over > 0:
            key = self.last[self.members].astype(np.int64) * (self.num_nodes + 1) + self.members  # oldest, then smaller id
            keep[np.argpartition(key, over - 1)[:over]] = False
        self.last[admit] = self.t
        evict = self._replace(keep, admit)
        return Decision(hit, admit, evict)


class BeladyCache(CachePolicy):
    """MIN with bypass inside the known future (`plan`); see the module docstring."""

    name = "belady-superbatch"
    extra_node_bytes = np.dtype(np.int32).itemsize  # nxt

    def __init__(self, capacity: int, num_nodes: int, rank: np.ndarray):
        super().__init__(capacity, num_nodes, rank)
        self.t = 0  # batches seen
        self.inf = np.iinfo(np.int32).max
        self.nxt = np.full(num_nodes, self.inf, np.int32)  # next known use of each cached node (extra_node_bytes)
        self._next: list[np.ndarray] = []  # per planned batch: next use of each of its ids
        self._first = 0  # absolute time of self._next[0]

    def memory_bytes(self) -> int:
        return super().memory_bytes() + self.nxt.nbytes + sum(x.nbytes for x in self._next)

    def reset(self, initial: np.ndarray | None = None) -> None:
        super().reset(initial)
        self.t, self._next, self._first = 0, [], 0
        self.nxt[:] = self.inf

    def plan(self, batches: Sequence[np.ndarray]) -> None:
        lens = np.array([len(b) for b in batches], np.int64)
        ids = np.concatenate([np.asarray(b, np.int64) for b in batches]) if len(batches) else np.zeros(0, np.int64)
        t = np.repeat(np.arange(len(batches), dtype=np.int64) + self.t, lens)
        order = np.lexsort((t, ids))
        si, st = ids[order], t[order]
        nxt = np.full(ids.shape[0], self.inf, np.int64)
        same = si[1:] == si[:-1]
        nxt_sorted = np.full(ids.shape[0], self.inf, np.int64)
        nxt_sorted[:-1][same] = st[1:][same]
        nxt[order] = nxt_sorted
        self._next = list(np.split(nxt, np.cumsum(lens)[:-1])) if len(batches) else []
        self._first = self.t
        # cached nodes: their first use in the new window (or none known)
        first = np.ones(ids.shape[0], bool)
        first[1:] = ~same
        self.nxt[self.members] = self.inf
        fm = self.cached[si[first]]
        self.nxt[si[first][fm]] = st[first][fm]

    def access(self, ids: np.ndarray) -> Decision:
        ids = np.asarray(ids, np.int64)
        k = self.t - self._first
        if 0 <= k < len(self._next) and self._next[k].shape[0] == ids.shape[0]:
            nxt = self._next[k]
        else:  # not planned: no knowledge of the future
            nxt = np.full(ids.shape[0], self.inf, np.int64)
        self.t += 1
        hit = self.cached[ids]
        miss = _distinct(ids[~hit])
        self.nxt[ids] = nxt
        cand = np.concatenate([self.members, miss])
        keep = np.ones(cand.shape[0], bool)
        over = cand.shape[0] - self.capacity
        if over > 0:
            key = self.nxt[cand].astype(np.int64) * (self.num_nodes + 1) + self.rank[cand]  # nearest, then hotter
            drop = np.argpartition(-key, over - 1)[:over]
            keep[drop] = False
        m = self.members.shape[0]
        admit = miss[keep[m:]]
        evict = self._replace(keep[:m], admit)
        self.nxt[evict] = self.inf
        return Decision(hit, admit, evict)


class WholeTraceBelady(BeladyCache):
    name = "belady"


POLICIES = {c.name: c for c in (StaticCache, LRUCache, BeladyCache, WholeTraceBelady)}


def make_policy(name: str, capacity: int, num_nodes: int, hotness: np.ndarray | None = None, *,
                rank: np.ndarray | None = None, initial: np.ndarray | None = None) -> CachePolicy:
    """A policy warm-started with the `capacity` hottest rows (by `hotness` counts, or a given `rank`:
    rank[v] = 0 for the hottest node), or with `initial` when the caller knows them already (a full sort of
    the ranks otherwise: 16M nodes, 2.3-2.7 CPU-s a rank at start)."""
    if name not in POLICIES:
        raise MomentError(f"unknown cache policy {name!r}: choose one of {', '.join(POLICIES)}")
    p = POLICIES[name](capacity, num_nodes, hotness_rank(hotness, num_nodes) if rank is None else rank)
    p.reset(initial)
    return p


def slot_dtype(capacity: int) -> np.dtype:
    """The narrowest integer that numbers `capacity` cache slots (a slot map's entries)."""
    return np.dtype(np.int32 if capacity < 2**31 else np.int64)


class SlotMap:
    """node -> cache slot (-1: not cached); slots freed by evictions go to the next admissions."""

    @classmethod
    def state_bytes(cls, num_nodes: int, capacity: int) -> int:
        """`memory_bytes` of a map of `capacity` slots over `num_nodes`, at its largest (every slot free)."""
        return num_nodes * slot_dtype(capacity).itemsize + capacity * np.dtype(np.int64).itemsize

    def __init__(self, capacity: int, num_nodes: int):
        self.capacity = int(capacity)
        self.slot = np.full(num_nodes, -1, slot_dtype(capacity))
        self.free = np.arange(self.capacity, dtype=np.int64)

    def fill(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, np.int64)
        if ids.shape[0] > self.capacity:
            raise MomentError(f"{ids.shape[0]} rows do not fit a cache of {self.capacity}")
        self.slot[:] = -1
        self.slot[ids] = np.arange(ids.shape[0])
        self.free = np.arange(ids.shape[0], self.capacity, dtype=np.int64)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        return self.slot[ids].astype(np.int64)

    def apply(self, d: Decision) -> np.ndarray:
        """Free the evicted nodes' slots, give slots to the admitted ones (in order); their slots."""
        if d.evict.size:
            self.free = np.concatenate([self.slot[d.evict].astype(np.int64), self.free])
            self.slot[d.evict] = -1
        k = d.admit.shape[0]
        if k > self.free.shape[0]:
            raise MomentError("cache policy admitted more rows than there are free slots")
        got, self.free = self.free[:k], self.free[k:]
        self.slot[d.admit] = got
        return got

    def memory_bytes(self) -> int:
        return self.slot.nbytes + self.free.nbytes
