"""Counting: how many valid placements there are before symmetry pruning (`SearchSpace.raw_count`).

A dynamic programme over the PCIe tree, separate from the enumeration and sharing none of its
canonical form, so it also serves as a check on it. Per node it keeps a table from (devices placed
per model, occupancy of the `blocks` constraint ends carried above the node) to the number of ways
to fill the subtree that way. A node's table is the product of its children's tables, one child
at a time (device counts add, carried ends concatenate); constraints whose ends meet at the node
are checked and their ends dropped there. Entries that break Hall's condition (`HallBound`) are
dropped: no completion of them exists, so the count is unchanged.
"""

from __future__ import annotations

from moment.planner.search.bounds import HallBound, Placed
from moment.planner.search.constraints import EMPTY, ROOT, EndState, Slots

Counts = dict[tuple[Placed, EndState], int]


def count_placements(slots: Slots, bound: HallBound) -> int:
    """Number of valid placements of the whole inventory."""
    return sum(c for (placed, _), c in _count(slots, bound, ROOT).items() if placed == bound.full)


def _count(slots: Slots, bound: HallBound, n: str) -> Counts:
    if not slots.has_empty_slot[n]:
        return {(bound.none, ()): 1}
    room = bound.room[n]
    carried = slots.every.carried.get(n, set())
    if n in slots.empty_set:
        out: Counts = {}
        if bound.can_finish(room, bound.none):
            out[(bound.none, ((n, EMPTY),) if n in carried else ())] = 1
        for i in slots.options[n]:
            one = bound.one(i)
            if bound.counts[i] and bound.can_finish(room, one):
                out[(one, ((n, slots.occupancy(i)),) if n in carried else ())] = 1
        return out
    ways: Counts = {(bound.none, ()): 1}
    for child in slots.children[n]:
        if not slots.has_empty_slot[child]:
            continue
        child_ways = _count(slots, bound, child).items()
        combined: Counts = {}
        for (placed1, ends1), c1 in ways.items():
            for (placed2, ends2), c2 in child_ways:
                placed = bound.add(placed1, placed2)
                if placed is not None:
                    key = (placed, ends1 + ends2)
                    combined[key] = combined.get(key, 0) + c1 * c2
        ways = combined
    closing = slots.every.closes_at.get(n, [])
    out = {}
    for (placed, ends), c in ways.items():
        if not bound.can_finish(room, placed):
            continue
        if closing and slots.violated_by_ends(closing, ends):
            continue
        key = (placed, tuple(sorted(e for e in ends if e[0] in carried)))
        out[key] = out.get(key, 0) + c
    return out
