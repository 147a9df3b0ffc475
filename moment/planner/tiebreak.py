"""Which of two equally fast placements the planner recommends.

Many placements reach the same epoch time (the SSDs or the caches, not the layout, set it). The
planner then prefers, in this order, criteria that matter when the workload or the machine drifts
from the model, and ends with an arbitrary but fixed one so the answer is deterministic. Every
criterion is in `compare_placements`, in order, as NCCL's `ncclTopoCompareGraphs` lists its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from moment.topology.devices import find_model
from moment.topology.model import Topology

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
        return self.link_bounds, self.wasted_lanes, self.slot_order

    @classmethod
    def of(cls, placement: dict[str, str], topo: Topology) -> Candidate:
        return cls(placement, wasted_lanes(placement, topo))


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
