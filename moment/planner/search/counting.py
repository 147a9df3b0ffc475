"""Counting: how many valid placements there are before symmetry pruning (`SearchSpace.raw_count`).

A dynamic programme over the PCIe tree, separate from the enumeration and sharing none of its
canonical form, so it also serves as a check on it. Per node it keeps a table from (devices placed
per model, occupancy of the `blocks` constraint ends carried above the node) to the number of ways
to fill the subtree that way. A node's table is the product of its children's tables, one child
at a time (device counts add, carried ends concatenate); constraints whose ends meet at the node
are checked and their ends dropped there. Entries that break Hall's condition (`HallBound`) are
dropped: no completion of them exists, so the count is unchanged.

The product is quadratic in the table sizes, which mixed inventories make large (a table can hold
prod(count + 1) placed-vectors for each ends state); so at the root, where only the whole inventory
counts, the last child is joined by looking up the complement of each entry instead, and a
`deadline` (time.perf_counter()) stops the count with `Timeout` so a time-limited search still has
time to search.
"""

from __future__ import annotations

import time

from moment.planner.search.bounds import HallBound, Placed
from moment.planner.search.constraints import EMPTY, ROOT, EndState, Slots
from moment.planner.search.enumeration import Timeout

Counts = dict[tuple[Placed, EndState], int]


def count_placements(slots: Slots, bound: HallBound, deadline: float | None = None) -> int:
    """Number of valid placements of the whole inventory; Timeout past `deadline`."""
    counter = _Counter(slots, bound, deadline)
    return sum(c for (placed, _), c in counter.count(ROOT, bound.full).items() if placed == bound.full)


class _Counter:
    def __init__(self, slots: Slots, bound: HallBound, deadline: float | None):
        self.slots, self.bound, self.deadline = slots, bound, deadline
        self.steps = 0

    def tick(self, work: int) -> None:
        """Count `work` products done; look at the clock every 2**16 of them."""
        if self.deadline is None:
            return
        self.steps += work
        if self.steps >= 1 << 16:
            self.steps = 0
            if time.perf_counter() > self.deadline:
                raise Timeout()

    def count(self, n: str, only: Placed | None = None) -> Counts:
        """The table of `n` (entries placing `only` alone, where given: the rest are never used)."""
        slots, bound = self.slots, self.bound
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
        kids = [child for child in slots.children[n] if slots.has_empty_slot[child]]
        for k, child in enumerate(kids):
            child_table = self.count(child)
            if only is not None and k == len(kids) - 1:
                self.tick(len(ways) + len(child_table))
                ways = _join(ways, child_table, only)
                break
            child_ways = child_table.items()
            combined: Counts = {}
            for (placed1, ends1), c1 in ways.items():
                self.tick(len(child_ways))
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


def _join(ways: Counts, child_ways: Counts, only: Placed) -> Counts:
    """The product of two tables, only its entries that place `only`: linear, by complement look-up."""
    by_placed: dict[Placed, list[tuple[EndState, int]]] = {}
    for (placed2, ends2), c2 in child_ways.items():
        by_placed.setdefault(placed2, []).append((ends2, c2))
    combined: Counts = {}
    for (placed1, ends1), c1 in ways.items():
        need = tuple(a - b for a, b in zip(only, placed1))
        for ends2, c2 in by_placed.get(need, ()):
            key = (only, ends1 + ends2)
            combined[key] = combined.get(key, 0) + c1 * c2
    return combined
