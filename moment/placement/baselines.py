"""Baseline placements DDAK is compared against.

Both keep the conventional static caches (Hyperion III-B, and what the paper's Hash arm runs with):
GPU caches, then CPU caches, take the hottest nodes up to their capacity, dealt round-robin by hotness
rank over the tier's bins (a full bin drops out). They differ on the SSDs, which hold everything else:

- `hash_placement`: node id modulo the number of SSD bins (the paper's "naive uniform distribution
  (hash-based partitioning)"). It ignores capacities by design; an SSD it overfills is an error.
- `degree_placement`: frequency/degree-only: the remaining nodes dealt round-robin over the SSD bins
  by hotness rank, so each SSD gets a near-equal slice of every hotness level (ignores targets).
"""

from __future__ import annotations

import numpy as np

from moment.errors import MomentError
from moment.placement.assignment import Assignment, hotness_order, validate_hotness
from moment.placement.bins import BinSet


def _deal(n: int, members: list[int], room: np.ndarray) -> np.ndarray:
    """Bins for n consecutive ranks dealt round-robin over `members`; a bin leaves when full.

    Rounds are vectorised: while the same bins are active, whole rounds go at once."""
    out = np.empty(n, dtype=np.int16)
    active = [b for b in members if room[b] > 0]
    pos = 0
    while pos < n and active:
        k = len(active)
        rounds = int(min(room[b] for b in active))
        take = min(rounds * k, n - pos)
        out[pos : pos + take] = np.resize(np.array(active, dtype=np.int16), take)
        for i, b in enumerate(active):
            room[b] -= take // k + (1 if i < take % k else 0)
        pos += take
        active = [b for b in active if room[b] > 0]
    if pos < n:
        raise MomentError(f"{n - pos} nodes do not fit in bins {members}")
    return out


def _cached_prefix(h: np.ndarray, bins: BinSet, order: np.ndarray | None, policy: str):
    h = validate_hotness(h)
    n = h.shape[0]
    cap = np.array([b.capacity_rows for b in bins], dtype=np.int64)
    if int(cap.sum()) < n:
        raise MomentError(f"{n} nodes do not fit: the bins hold {int(cap.sum())} rows in all")
    order = hotness_order(h, order)
    room = cap.copy()
    parts, pos = [], 0
    for kind in ("gpu", "cpu"):
        members = bins.of_kind(kind)  # type: ignore[arg-type]
        take = min(int(cap[members].sum()) if members else 0, n - pos)
        if take:
            parts.append(_deal(take, members, room))
            pos += take
    return h, order, room, parts, pos


def _build(policy: str, h, bins, order, bin_of) -> Assignment:
    nb = len(bins)
    rows = np.bincount(bin_of, minlength=nb).astype(np.int64)
    access = np.bincount(bin_of, weights=h.astype(np.float64, copy=False), minlength=nb)
    return Assignment(policy=policy, bins=bins, bin_of=bin_of, order=order, rows=rows, access=access)


def hash_placement(hotness: np.ndarray, bins: BinSet, *, order: np.ndarray | None = None) -> Assignment:
    """Hottest nodes into the caches, every other node to SSD bin (node id mod #SSDs)."""
    h, order, room, parts, pos = _cached_prefix(hotness, bins, order, "hash")
    bin_of = np.empty(h.shape[0], dtype=np.int16)
    if pos:
        bin_of[order[:pos]] = np.concatenate(parts)
    rest = order[pos:]
    ssds = np.array(bins.of_kind("ssd"), dtype=np.int16)
    bin_of[rest] = ssds[rest % len(ssds)]
    counts = np.bincount(bin_of[rest], minlength=len(bins))
    over = [bins[b].name for b in ssds.tolist() if counts[b] > room[b]]
    if over:
        raise MomentError(f"hash placement overfills SSD bins {over}", hint="hash ignores capacities")
    return _build("hash", h, bins, order, bin_of)


def degree_placement(hotness: np.ndarray, bins: BinSet, *, order: np.ndarray | None = None) -> Assignment:
    """Hottest nodes into the caches, the rest dealt round-robin over the SSD bins by hotness rank."""
    h, order, room, parts, pos = _cached_prefix(hotness, bins, order, "degree")
    parts.append(_deal(h.shape[0] - pos, bins.of_kind("ssd"), room))
    bin_of = np.empty(h.shape[0], dtype=np.int16)
    bin_of[order] = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return _build("degree", h, bins, order, bin_of)
