"""Which of two equally fast placements the planner recommends.

Many placements reach the same epoch time (the SSDs or the caches, not the layout, set it). The
planner then prefers, in this order, criteria that matter when the workload or the machine drifts
from the model, and ends with an arbitrary but fixed one so the answer is deterministic. Every
criterion is in `compare_placements`, in order, as NCCL's `ncclTopoCompareGraphs` lists its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from moment.topology.devices import find_model
from moment.topology.model import Topology

if TYPE_CHECKING:
    from moment.planner.search import SearchSpace

#: epoch times within this relative distance are a tie
TIE_REL = 1e-6


@dataclass(frozen=True)
class Candidate:
    """A placement with what the tie-break looks at."""

    placement: dict[str, str]  # slot id -> model name
    wasted_lanes: int  # lanes of wide slots taken by narrow cards
    link_bounds: tuple[float, ...] = ()  # per-link lower bounds on the epoch time, highest first

    @cached_property
    def slot_order(self) -> tuple[tuple[str, str], ...]:
        """(slot id, model) pairs sorted by slot id: also the placement's identity in the search."""
        return tuple(sorted(self.placement.items()))

    @cached_property
    def key(self) -> tuple:
        """The criteria of `compare_placements`, in order, as one tuple: the smaller is preferred."""
        return sort_key(self.link_bounds, self.wasted_lanes, self.slot_order)

    @classmethod
    def of(cls, placement: dict[str, str], topo: Topology) -> Candidate:
        return cls(placement, wasted_lanes(placement, topo))


def sort_key(link_bounds: tuple[float, ...], wasted: int, slot_order: tuple) -> tuple:
    """`compare_placements`'s criteria in order, as one tuple: the smaller is preferred. `slot_order` may
    be a row of `preference_arrays` instead of the pairs (it orders placements the same way)."""
    return link_bounds, wasted, slot_order


def preference_arrays(space: SearchSpace, topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Criteria 2 and 3 of `compare_placements` for every placement of a search space at once, for
    ranking thousands of them without a dict each: (wasted lanes per placement, slot orders as rows
    of integers). A placement's (slot id, model) pairs, in slot id order, become rank(slot id) *
    (models + 1) + rank(model name), so comparing two rows lexicographically compares the slot
    orders (every placement of one inventory places as many devices: the rows are equally long)."""
    rows, none = space.rows, len(space.models)
    n = len(rows)
    width = np.array([topo.node(s).width for s in space.slots], dtype=np.int64)
    lanes = np.array([find_model(m).lanes for m in space.models] + [0], dtype=np.int64)
    placed = rows != none
    wasted = np.where(placed, width[None, :] - lanes[rows], 0).sum(axis=1)
    by_id = np.argsort(np.array(space.slots, dtype=object), kind="stable")  # slot ids as strings
    name_rank = np.empty(none + 1, dtype=np.int64)
    name_rank[np.argsort(np.array(list(space.models), dtype=object), kind="stable")] = np.arange(none)
    name_rank[none] = none
    codes = np.arange(len(space.slots), dtype=np.int64)[None, :] * (none + 1) + name_rank[rows[:, by_id]]
    devices = int(placed[0].sum()) if n else 0
    assert (placed.sum(axis=1) == devices).all(), "placements of one inventory place as many devices"
    return wasted, codes[placed[:, by_id]].reshape(n, devices)


def preference_order(wasted: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The placements of `preference_arrays` from the preferred on (wasted lanes, then slot order; ties by index)."""
    return np.lexsort((*order.T[::-1], wasted))


def wasted_lanes(placement: dict[str, str], topo: Topology) -> int:
    """Lanes of wide slots taken by narrow cards (kept free for later GPUs)."""
    return sum(topo.node(s).width - find_model(m).lanes for s, m in placement.items())


def _cmp(a, b) -> int:
    return (a > b) - (a < b)


def compare_placements(a: Candidate, b: Candidate) -> int:
    """Negative when `a` is preferred, positive when `b` is, 0 when they are the same placement.

    For placements whose epoch times tie. Criteria in order; each decides only when all before it tie:

    1. Link headroom: the per-link lower bounds on the epoch time (`TreeBound.bound`), highest
       first, compared lexicographically; the smaller wins. That is the placement whose tightest
       link is loosest, then whose second tightest is, and so on (leximax); a placement that loads
       fewer links wins when the links both load tie. Within one capacity class the bounds are
       equal (one capacity graph), so the planner compares a class's members before computing them
       (left empty: this criterion ties).
    2. Wide-slot lanes: fewer lanes of wide slots taken by narrow cards wins, which keeps x16 slots
       free for GPUs added later.
    3. Slot order: the (slot id, model) pairs sorted by slot id, compared as strings; the smaller
       wins. Arbitrary but total, so the recommendation is deterministic.
    """
    return _cmp(a.key, b.key)


def preference(c: Candidate) -> tuple:
    """Sort key that puts the preferred placement first (`compare_placements`'s order)."""
    return c.key
