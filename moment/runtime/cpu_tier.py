"""The CPU-cache tier: rows in memory the runtime owns (`HostCache`), managed by a cache policy.

Why (Hyperion's static cache; Ginex, section 4): the policy objects are those of `moment.caching`, the
ones the cache simulator replays: ``static`` (the hottest rows by the layout's pre-sampled hotness
order; one shared segment for all local ranks), ``lru``, or ``belady-superbatch`` (the next
superbatch's accesses decide what stays; the rows it admits are copied in from the reads that fetched
them, Ginex's changeset). Batches are routed in superbatches of `superbatch` (`TierRouter`: the policy
is told the superbatch's accesses first); a batch's rows are filled in order, so a row admitted by
batch i is in the cache before batch i+1 reads it. A row a GPU tier of the node serves is never a
candidate: the tiers above take it before this one sees it, and `open_cpu_tier` leaves it out.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moment.caching import make_policy
from moment.caching.policies import POLICIES, CachePolicy, SlotMap, rank_dtype
from moment.caching.tiers import FixedSlots, TierRouter, first_ahead, slots_for
from moment.caching.tiers import lookahead as lookahead_of
from moment.io.rows import copy_rows
from moment.placement.opened import Layout
from moment.runtime.disk_tier import DiskTier
from moment.runtime.hostcache import HostCache, shm_room
from moment.runtime.run_plan import TierPlan
from moment.runtime.tier import LayoutRows, Tier, at


@dataclass
class _Part:
    ids: np.ndarray
    pos: np.ndarray | None
    tag: tuple | None
    closed: bool = False  # routed: its superbatch is decided
    hit_pos: np.ndarray | None = None  # positions among `ids`
    hit_slot: np.ndarray | None = None
    admit_pos: np.ndarray | None = None
    admit_slot: np.ndarray | None = None
    inner: Any = None


class CpuTier(Tier):
    """`cache` rows, which `policy` decides (slot lookup `slots`), over `next`."""

    name = "cpu"

    def __init__(self, rows: LayoutRows, next: Tier, device: Any, policy: CachePolicy,
                 slots: SlotMap | FixedSlots, cache: HostCache, superbatch: int):
        super().__init__(rows, next, device)
        self.policy, self.slots, self.cache = policy, slots, cache
        self.superbatch = max(1, int(superbatch))
        self.router = TierRouter(policy, slots)
        self.admitted = 0
        self._open: list[_Part] = []

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    @property
    def shared(self) -> bool:
        return self.cache.shared

    @property
    def ahead(self) -> int:
        return lookahead_of(self.superbatch)

    @property
    def first_ahead(self) -> int:
        return max(first_ahead(self.superbatch, self.policy.changes), self.next.first_ahead)

    def take(self, ids: np.ndarray, pos: np.ndarray | None, tag: tuple | None) -> _Part:
        p = _Part(ids, pos, tag)
        self._open.append(p)
        # a cache that decides batch by batch routes a superbatch closed short as it would the whole one
        if len(self._open) >= self.superbatch or (not self.policy.changes and self.next.reads_idle(tag)):
            self._close()
        return p

    def flush(self) -> None:
        if self._open:
            self._close()
        else:
            self.next.flush()

    def _close(self) -> None:
        """Route the open superbatch, hand each batch's misses to the next tier, and issue them."""
        batches, self._open = self._open, []
        for p, r in zip(batches, self.router.route([p.ids for p in batches]), strict=True):
            p.hit_pos, p.hit_slot, p.admit_pos, p.admit_slot = r.hit_pos, r.hit_slot, r.admit_pos, r.admit_slot
            p.inner = self.next.take(p.ids[r.miss_pos], at(p.pos, r.miss_pos), p.tag)
            p.closed = True
        self.next.flush()

    def host(self, p: _Part, out: np.ndarray, count: bool) -> None:
        if not p.closed:
            self.flush()
        if p.hit_pos.size:
            copy_rows(out, at(p.pos, p.hit_pos), self.cache.rows, p.hit_slot)
        self.next.host(p.inner, out, count)
        if p.admit_pos is not None:  # admitted rows are copied in from the reads that fetched them
            copy_rows(self.cache.rows, p.admit_slot, out, at(p.pos, p.admit_pos))
            self.admitted += int(p.admit_pos.shape[0])
        if count:
            self.served += int(p.hit_pos.size)

    def device_rows(self, part: _Part, out: Any) -> None:
        self.next.device_rows(part.inner, out)

    def add_stats(self, out: dict[str, Any]) -> None:
        out["cpu_admitted_rows"] += self.admitted

    def own_memory(self) -> dict[str, int]:
        return {"cpu_cache": self.cache.nbytes, "slot_map": self.slots.memory_bytes(),
                "policy": self.policy.memory_bytes()}

    def release(self) -> None:
        self.cache.close()


def hottest_held(gpu: np.ndarray | None, cap: int, n: int) -> int:
    """How many of the hottest rows this rank's caches hold, every one of them: in hotness order a row is held
    when a GPU tier serves it (`gpu`, a mask over that order; None: none the CPU cache leaves out) or it is among
    the first `cap` of the others (`cap` at most their count), which a static CPU cache holds. A pack written with
    this `--cached` leaves out exactly rows these caches serve."""
    if gpu is None:
        return cap
    free = np.flatnonzero(~gpu)
    return int(free[cap]) if cap < free.shape[0] else n


def run_key(layout: Layout, what: str) -> str:
    """Names this run's shared segments: the same on every local rank, new for each (re)start."""
    env = os.environ
    return hashlib.sha256(f"{layout.path.absolute()}|{what}|{env.get('TORCHELASTIC_RUN_ID', '')}|"
                          f"{env.get('TORCHELASTIC_RESTART_COUNT', '')}|"
                          f"{env.get('MASTER_PORT', '')}".encode()).hexdigest()[:16]


def cache_shared(t: TierPlan, row_bytes: int) -> bool:
    """Whether the CPU cache is one shared segment: as planned, unless /dev/shm has no room for it."""
    if t.shared_cache and (why := shm_room(t.cpu_rows * row_bytes)):
        warnings.warn(f"shared CPU cache not possible ({why}); each rank keeps its own", stacklevel=3)
        return False
    return t.shared_cache


def open_cpu_tier(layout: Layout, rows: LayoutRows, disk: DiskTier, device: Any, t: TierPlan, *, shared: bool,
                  held: Callable[[np.ndarray], np.ndarray] | None, creator: bool,
                  barrier: Callable[[], Any] | None) -> CpuTier | None:
    """The CPU cache over `disk` (None when it holds no row), filled with its first contents through the
    disk tier's reader. `shared`: one segment for the local ranks (`cache_shared`), made by the `creator`
    (local rank 0) behind their `barrier` (collective: every local rank calls it at the same point);
    `held`: a mask of the rows a GPU tier above serves (never cached)."""
    n, rb = rows.num_nodes, rows.row_bytes
    cap = t.cpu_rows
    order = layout.hot_order()
    disk.pack_cached(order)
    rank = np.empty(n, rank_dtype(n))
    rank[order] = np.arange(n, dtype=rank.dtype)
    on = None
    if held is not None:
        on = held(order)
        rank[order[on]] = n - 1
        order = order[~on]
    cap = min(cap, order.shape[0])
    disk.pack_fit = None if POLICIES[t.policy].changes else hottest_held(on, cap, n)
    if cap == 0:
        return None
    initial = np.array(order[:cap], dtype=np.int64)
    del order
    policy = make_policy(t.policy, cap, n, rank=rank, initial=initial)
    del rank
    slots = slots_for(policy, initial, n)
    if shared:
        assert barrier is not None
        cache = HostCache.shared_segment(run_key(layout, str(cap)), cap, rb, creator=creator,
                                         fill=lambda dest: disk.fill(dest, initial), barrier=barrier)
    else:
        cache = HostCache(cap, rb)
        disk.fill(cache.rows, initial)
    return CpuTier(rows, disk, device, policy, slots, cache, t.superbatch)
