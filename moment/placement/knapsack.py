"""DDAK: the data-distribution-aware knapsack of Moment (paper section 3.3).

Nodes are taken hottest first (ties by node id) in pools of `pool` nodes. Bins are the storage nodes
of the plan: each GPU's cache, each socket's CPU cache, each SSD. A bin's filling priority is

    priority = (access / traffic) * (used / capacity)

with access = hotness already placed in it, traffic = its planner share x total hotness, used/capacity
in rows; it is recomputed after every step and the lowest priority takes the next pool.

How the hierarchy GPU > CPU > SSD interacts with the priority (the paper leaves this open; we fix it):
the tiers are filled in order. While any GPU bin is *open*, the next pool goes to the open GPU bin of
lowest priority; then CPU bins, then SSD bins. A bin is open while it has room; a cache bin (GPU, CPU)
also closes once its access reaches its target traffic (the paper's "traffic limit per bin"), so a
cache serves the share the planner gave it rather than whatever its size allows (`cache_fill=
"capacity"` turns that off). SSD bins close only when full: they must take every remaining node (a bin
set without an SSD, a machine whose caches hold every row, fills its caches to capacity for that).
A bin whose target is 0 has priority +inf (it takes nodes only when no other bin of its tier can); a
cache bin with target 0 takes none. Ties are broken by bin order (lowest index first).

A step gives the chosen bin min(pool, its free rows, nodes left) nodes, so pools shift after a bin
fills up. Access sums use prefix sums of the sorted hotness (S[end] - S[start]) in every engine.

Engines, all bit-identical to `ddak_reference` (the per-pool Python loop, which is the spec):
- "native": native/ddak.c compiled on first use (the per-pool loop in C; ~0.1 s per 1M pools);
- "numpy": a block method. Other bins' priorities do not change while the chosen bin takes pools and
  its own priority only grows, so it keeps taking pools until it first loses to the runner-up (or
  closes); that point is found with vectorised galloping search. Python work is proportional to the
  number of priority crossings, not pools. Exact like the loop (accumulation is sequential too), but in
  the SSD tier with equal targets bins alternate nearly every pool, so it is the slower fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from moment.errors import MomentError
from moment.placement._native import ddak_kernel
from moment.placement.assignment import Assignment, hotness_order, rank_to_nodes, validate_hotness
from moment.placement.bins import BinSet

Engine = Literal["auto", "native", "numpy", "reference"]
CacheFill = Literal["target", "capacity"]


@dataclass
class _Problem:
    order: np.ndarray
    S: np.ndarray  # prefix sums of sorted hotness, len n + 1, float64
    n: int
    pool: int
    traffic: np.ndarray  # float64 per bin
    cap: np.ndarray  # int64 per bin
    tier: np.ndarray  # int32 per bin
    closes: np.ndarray  # uint8 per bin


def _prepare(hotness, bins: BinSet, pool: int, order, cache_fill: CacheFill) -> _Problem:
    if pool < 1:
        raise MomentError(f"pool must be >= 1, got {pool}")
    if cache_fill not in ("target", "capacity"):
        raise MomentError(f"cache_fill must be 'target' or 'capacity', got {cache_fill!r}")
    h = validate_hotness(hotness)
    n = int(h.shape[0])
    cap = np.array([b.capacity_rows for b in bins], dtype=np.int64)
    if int(cap.sum()) < n:
        raise MomentError(
            f"{n} nodes do not fit: the bins hold {int(cap.sum())} rows in all",
            hint="add SSD capacity or check the row size used to compute capacities",
        )
    order = hotness_order(h, order)
    S = np.zeros(n + 1, dtype=np.float64)
    np.cumsum(h[order], dtype=np.float64, out=S[1:])
    total = float(S[-1])
    traffic = np.array(bins.target_shares(), dtype=np.float64) * total
    tier = np.array([b.tier for b in bins], dtype=np.int32)
    fill = cache_fill if bins.of_kind("ssd") else "capacity"  # (without an SSD the caches take every node)
    closes = np.array([b.is_cache and fill == "target" for b in bins], dtype=np.uint8)
    return _Problem(order, S, n, int(pool), traffic, cap, tier, closes)


def _finish(pr: _Problem, bins: BinSet, seg_bin, seg_len, access, used, placed: int, engine: str) -> Assignment:
    if placed < pr.n:
        raise MomentError(
            f"DDAK placed {placed} of {pr.n} nodes: every bin is full or at its traffic limit",
            hint="SSD capacity is too small for the nodes the caches do not take",
        )
    rank_bin = np.repeat(np.asarray(seg_bin, dtype=np.int16), np.asarray(seg_len, dtype=np.int64))
    return Assignment(
        policy="ddak",
        bins=bins,
        bin_of=rank_to_nodes(pr.order, rank_bin),
        order=pr.order,
        rows=np.asarray(used, dtype=np.int64),
        access=np.asarray(access, dtype=np.float64),
        pool=pr.pool,
        engine=engine,
    )


def _priority(access: float, used: int, traffic: float, cap: int) -> float:
    return (access / traffic) * (used / cap) if traffic > 0 else math.inf


def _tiers(pr: _Problem) -> list[list[int]]:
    return [[b for b in range(len(pr.cap)) if pr.tier[b] == t] for t in sorted(set(pr.tier.tolist()))]


def ddak_reference(
    hotness: np.ndarray, bins: BinSet, pool: int = 100, *, order: np.ndarray | None = None,
    cache_fill: CacheFill = "target",
) -> Assignment:
    """The straightforward per-pool loop: the specification the fast engines are tested against."""
    pr = _prepare(hotness, bins, pool, order, cache_fill)
    S, cap, traffic, closes = pr.S, pr.cap.tolist(), pr.traffic.tolist(), pr.closes.tolist()
    access, used = [0.0] * len(cap), [0] * len(cap)
    seg_bin: list[int] = []
    seg_len: list[int] = []
    p = 0
    for members in _tiers(pr):
        while p < pr.n:
            best, bp = -1, 0.0
            for b in members:
                if used[b] >= cap[b] or (closes[b] and access[b] >= traffic[b]):
                    continue
                prio = _priority(access[b], used[b], traffic[b], cap[b])
                if best < 0 or prio < bp:
                    best, bp = b, prio
            if best < 0:
                break
            k = min(pr.pool, cap[best] - used[best], pr.n - p)
            access[best] += float(S[p + k] - S[p])
            used[best] += k
            p += k
            seg_bin.append(best)
            seg_len.append(k)
    return _finish(pr, bins, seg_bin, seg_len, access, used, p, "reference")


def _run_native(pr: _Problem, kernel):
    nb = len(pr.cap)
    max_seg = pr.n // pr.pool + 2 * nb + 2
    seg_bin = np.empty(max_seg, dtype=np.int32)
    seg_len = np.empty(max_seg, dtype=np.int64)
    access = np.zeros(nb, dtype=np.float64)
    used = np.zeros(nb, dtype=np.int64)
    pos = np.zeros(1, dtype=np.int64)
    ns = kernel(pr.S, pr.n, pr.pool, nb, np.ascontiguousarray(pr.traffic), pr.cap, pr.tier, pr.closes,
                access, used, seg_bin, seg_len, max_seg, pos)
    if ns < 0:  # cannot happen: steps <= n/pool + bins
        raise RuntimeError("DDAK kernel ran out of segment space")
    return seg_bin[:ns], seg_len[:ns], access, used, int(pos[0])


def _run_blocks(pr: _Problem):
    """Exact block method; see the module docstring."""
    S, n, pool = pr.S, pr.n, pr.pool
    cap, traffic, closes = pr.cap.tolist(), pr.traffic.tolist(), pr.closes.tolist()
    access, used = [0.0] * len(cap), [0] * len(cap)
    seg_bin: list[int] = []
    seg_len: list[int] = []
    p = 0
    for members in _tiers(pr):
        while p < n:
            best, bp, second, sp = -1, 0.0, -1, 0.0
            for b in members:
                if used[b] >= cap[b] or (closes[b] and access[b] >= traffic[b]):
                    continue
                prio = _priority(access[b], used[b], traffic[b], cap[b])
                if best < 0 or prio < bp:
                    second, sp, best, bp = best, bp, b, prio
                elif second < 0 or prio < sp:
                    second, sp = b, prio
            if best < 0:
                break
            b = best
            room = min(cap[b] - used[b], n - p)
            npc = -(-room // pool)  # pools until full / out of nodes; pools 1..npc-1 are full
            A, U, T, C, cl = access[b], used[b], traffic[b], cap[b], closes[b]

            # take pool 0; then pool j (j >= 1) while the state after j pools still wins
            A += float(S[p + min(pool, room)] - S[p])
            m = 1
            if m < npc and not _loses(A, U + pool, T, C, cl, b, second, sp):  # scalar fast path
                A += float(S[p + min(2 * pool, room)] - S[p + pool])
                m, A = _gallop(S, p, pool, room, npc, A, U, T, C, cl, second, sp, b)
            step = min(m * pool, room)
            access[b] = A
            used[b] = U + step
            seg_bin.append(b)
            seg_len.append(step)
            p += step
    return seg_bin, seg_len, access, used, p


def _loses(a: float, u: int, T: float, C: int, cl: int, b: int, second: int, sp: float) -> bool:
    """Does bin b, with access a and u rows used, no longer take the next pool?"""
    if cl and a >= T:
        return True
    if second < 0:
        return False
    f = _priority(a, u, T, C)
    return f > sp or (f == sp and b > second)


def _gallop(S, p, pool, room, npc, A, U, T, C, cl, second, sp, b):
    """Bin b has taken 2 pools (A includes both). Find m = pools it takes in all, A after them."""
    m = 2
    w = 64
    while m < npc:
        hi = min(npc, m + w)
        j = np.arange(m, hi, dtype=np.int64)  # states after j pools; need pool j (index j) sums too
        ends = np.minimum((j + 1) * pool, room) + p
        starts = j * pool + p
        # accumulation sequential like the loop: A_j for j in [m, hi) is A (after m pools) then + d
        d = S[ends] - S[starts]
        acc = np.cumsum(np.concatenate(([A], d[:-1])))  # acc[i] = access after m + i pools
        used = U + j * pool
        bad = np.zeros(j.shape[0], dtype=bool)
        if cl:
            bad |= acc >= T
        if second >= 0:
            f = (acc / T) * (used / C) if T > 0 else np.full(j.shape[0], math.inf)
            bad |= (f > sp) | ((f == sp) & (b > second))
        hit = np.flatnonzero(bad)
        if hit.size:
            i = int(hit[0])
            return m + i, float(acc[i])
        A = float(acc[-1] + d[-1])
        m = hi
        w *= 4
    return m, A


#: the paper's pool, the largest auto_pool picks
PAPER_POOL = 100
#: auto_pool: the hottest pool may carry at most this part of the smallest positive bin target
POOL_QUANTUM = 0.01


def auto_pool(hotness: np.ndarray, bins: BinSet, order: np.ndarray | None = None) -> int:
    """The largest pool (<= the paper's 100) whose hottest nodes carry at most 1% of the smallest
    positive bin target. A step moves a whole pool, so a bin's achieved share is off by up to one
    pool's accesses: 100 nodes are fine on a 100M-node graph, but on a small one the hottest 100 can
    carry more than a bin's whole error budget (then one-node-at-a-time round-robin does better)."""
    h = validate_hotness(hotness)
    total = float(h.sum(dtype=np.float64))
    shares = [t for t in bins.target_shares() if t > 0]
    if total <= 0 or not shares or h.shape[0] == 0:
        return PAPER_POOL
    order = hotness_order(h, order)
    top = np.cumsum(h[order[:PAPER_POOL]], dtype=np.float64) / total  # top[k-1]: share of the hottest k
    budget = POOL_QUANTUM * min(shares)
    fits = np.flatnonzero(top <= budget)
    return int(fits[-1]) + 1 if fits.size else 1


def pool_access(hotness: np.ndarray, pool: int, order: np.ndarray | None = None) -> float:
    """Share of all accesses the hottest pool carries (what one DDAK step can be off by, at worst)."""
    h = validate_hotness(hotness)
    total = float(h.sum(dtype=np.float64))
    order = hotness_order(h, order)
    return float(h[order[:pool]].sum(dtype=np.float64)) / total if total > 0 else 0.0


def ddak(
    hotness: np.ndarray, bins: BinSet, pool: int = 100, *, order: np.ndarray | None = None,
    cache_fill: CacheFill = "target", engine: Engine = "auto",
) -> Assignment:
    """Place every node in a bin with DDAK. `hotness[v]` = pre-sampled accesses of node v; `order`
    (optional) = node ids by descending hotness, ties by id, if the caller already has it."""
    pr = _prepare(hotness, bins, pool, order, cache_fill)
    kernel = ddak_kernel() if engine in ("auto", "native") else None
    if engine == "native" and kernel is None:
        raise MomentError("the native DDAK kernel is unavailable (no C compiler, or MOMENT_NO_NATIVE set)")
    if engine == "reference":
        return ddak_reference(hotness, bins, pool, order=pr.order, cache_fill=cache_fill)
    if kernel is not None:
        return _finish(pr, bins, *_run_native(pr, kernel), "native")
    return _finish(pr, bins, *_run_blocks(pr), "numpy")
