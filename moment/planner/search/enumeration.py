"""Enumeration: one representative placement per canonical key, without listing raw placements.

Raw placements can number in the trillions, so they are never listed. One bottom-up pass over the
PCIe tree computes, per node, its *fillings*: a table from (canonical key of the filled subtree,
occupancy of the open constraint ends carried above it) to (devices placed, one concrete
representative). A node's table is built from its parts' tables:

- Correct: two fillings of a subtree with equal key and equal carried ends are interchangeable in
  every completion of the rest of the machine (the rest sees the subtree only through its key, its
  device counts, which the key determines, and the carried ends). Keeping one per entry therefore
  loses no class, and since the root's key is the canonical form of the whole machine, the root's
  table holds one representative per class.
- Multisets: parts in one `group` are interchangeable, and their entry lists are equal and in the
  same order; taking non-decreasing positions in them lists each multiset of fillings once instead
  of every permutation.
- Pruned: a combination is extended only while the rest of the machine can still take the devices
  left (`HallBound`); constraints whose two ends meet at a node are checked there, and those
  between siblings filled as one part are checked when the part is complete.

The first filling found for an entry is kept; entry lists are walked in a fixed order (descending
keys), so the representatives are deterministic.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Hashable

import numpy as np

from moment.planner.search.bounds import HallBound, Placed
from moment.planner.search.canonical import CanonicalForm, Part
from moment.planner.search.constraints import EMPTY, ROOT, EndState, Slots

Cards = tuple[tuple[str, int], ...]  # (slot id, model index) pairs: a concrete representative
Table = dict[tuple[Hashable, EndState], tuple[Placed, Cards]]  # (key, carried ends) -> (placed, cards)


# One entry of a part's table, as the combination step consumes it: (canonical keys it contributes
# to its parent, one per unit; carried ends; devices placed; cards). A plain tuple, not a NamedTuple:
# the garbage collector untracks plain tuples of immutable values, and there are many of them.
Filling = tuple[tuple[int, ...], EndState, Placed, Cards]


Finish = Callable[[list[int], EndState, Cards], Hashable | None]  # a combination's table key, None: invalid


class TooMany(Exception):
    """The distinct placements are more than the listing may hold (`Enumeration(limit=...)`);
    `raw_count`: the valid placements before symmetry pruning, when known."""

    def __init__(self, raw_count: int | None = None):
        super().__init__(raw_count)
        self.raw_count = raw_count


class Timeout(Exception):
    """The listing passed its deadline (`Enumeration(deadline=...)`)."""


class Enumeration:
    """`limit`: the most combinations tried before giving up with TooMany (None: no limit); the
    work grows with the distinct placements, which a machine of few interchangeable slots has by the
    hundred million, so a caller that has another way to search sets one. `deadline`
    (time.perf_counter()): past it, Timeout."""

    def __init__(self, slots: Slots, bound: HallBound, canon: CanonicalForm, *, limit: int | None = None,
                 deadline: float | None = None):
        self.slots = slots
        self.bound = bound
        self.canon = canon
        self._tables: dict[str, Table] = {}
        self.work = 0
        self._limit = limit
        self._deadline = deadline
        self._next_check = 0

    def representatives(self) -> np.ndarray:
        """One placement of the whole inventory per class, as a row per placement of the model index
        in each empty slot (`slots.empty` order; len(models): empty), ordered by occupant per slot in
        the topology's slot order (inventory order, empty last)."""
        slots = self.slots
        none = len(slots.models)
        rows = []
        for placed, cards in self._root_fillings().values():
            if placed == self.bound.full:
                row = [none] * len(slots.empty)
                for s, i in cards:
                    row[slots.order[s]] = i
                rows.append(row)
        rows.sort()
        return np.array(rows, dtype=np.int16).reshape(len(rows), len(slots.empty))

    def fillings(self, n: str) -> Table:
        """One representative per (canonical key, carried ends) of the subtree under `n`."""
        found = self._tables.get(n)
        if found is None:
            found = self._tables[n] = self._fillings(n)
        return found

    def _fillings(self, n: str) -> Table:
        slots, bound, canon = self.slots, self.bound, self.canon
        if not slots.has_empty_slot[n]:
            return {(canon.bare_key(n), ()): (bound.none, ())}
        room = bound.room[n]
        if n in slots.empty_set:
            out: Table = {}
            carried = n in slots.crossing.carried
            if bound.can_finish(room, bound.none):
                out[(canon.slot_key(n, None), ((n, EMPTY),) if carried else ())] = (bound.none, ())
            for i in slots.options[n]:
                one = bound.one(i)
                if bound.counts[i] and bound.can_finish(room, one):
                    ends = ((n, slots.occupancy(i)),) if carried else ()
                    out[(canon.slot_key(n, i), ends)] = (one, ((n, i),))
            return out
        parts = canon.parts[n]
        same_as_previous = [i > 0 and parts[i].group == parts[i - 1].group for i in range(len(parts))]
        closing = slots.crossing.closes_at.get(n, [])
        carried = slots.crossing.carried.get(n, set())

        def finish(keys: list[int], ends: EndState, cards: Cards) -> Hashable | None:
            if closing and slots.violated_by_ends(closing, ends):
                return None
            return (canon.node_key(n, keys), tuple(sorted(e for e in ends if e[0] in carried)))

        return self._combine([self._part_fillings(p) for p in parts], same_as_previous, room, finish)

    def _part_fillings(self, part: Part) -> list[Filling]:
        """Distinct fillings of a part, keyed by its units' canonical keys, in descending order.

        Interchangeable parts get equal lists, so the search takes non-decreasing positions in them
        (multisets); descending order puts the later-seen, usually fuller, fillings first.
        """
        if len(part.members) == 1:
            table = self.fillings(part.members[0])
            return sorted((((k,), ends, placed, cards) for (k, ends), (placed, cards) in table.items()),
                          reverse=True)
        per_member = [
            [((k,), ends, placed, cards) for (k, ends), (placed, cards) in sorted(self.fillings(m).items())]
            for m in part.members
        ]
        slots, canon = self.slots, self.canon

        def finish(keys: list[int], ends: EndState, cards: Cards) -> Hashable | None:
            if part.blocks and slots.violated_by_cards(part.blocks, cards):
                return None
            return (tuple(sorted(canon.unit_keys(part, keys))), ends)

        room = tuple(map(sum, zip(*(self.bound.room[m] for m in part.members))))
        table = self._combine(per_member, [False] * len(part.members), room, finish)
        return sorted(((k, ends, placed, cards) for (k, ends), (placed, cards) in table.items()), reverse=True)

    def _combine(self, fillings: list[list[Filling]], same_as_previous: list[bool], room: tuple[int, ...],
                 finish: Finish) -> dict:
        """Distinct fillings of a node (or part) from its parts' fillings, keyed by `finish`.

        A part marked `same_as_previous` is interchangeable with the one before it, so it only takes
        fillings at or after that one's position: each multiset once. The last part only looks at
        the device counts that leave the rest of the machine able to take what is left.
        """
        bound = self.bound
        out: dict = {}
        n_parts = len(fillings)
        if not n_parts:
            if bound.can_finish(room, bound.none):
                out[finish([], (), ())] = (bound.none, ())
            return out
        _deep_enough(n_parts)
        keys: list[int] = []
        last: dict[Placed, list[tuple[int, Filling]]] = {}  # the last part's fillings by device counts
        for position, filling in enumerate(fillings[-1]):
            _, _, placed, _ = filling
            last.setdefault(placed, []).append((position, filling))
        completions: dict[Placed, list[tuple[Placed, list[tuple[int, Filling]]]]] = {}

        def extend(i: int, lowest: int, placed: Placed, ends: EndState, cards: Cards) -> None:
            if i == n_parts - 1:
                start = lowest if same_as_previous[i] else 0
                options = completions.get(placed)
                if options is None:
                    options = completions[placed] = [
                        (total, group) for last_placed, group in last.items()
                        if (total := bound.add(placed, last_placed)) is not None and bound.can_finish(room, total)
                    ]
                for total, group in options:
                    self.work += len(group)
                    if self.work >= self._next_check:
                        self._check()
                    for position, (more_keys, more_ends, _, more_cards) in group:
                        if position < start:
                            continue
                        keys.extend(more_keys)
                        key = finish(keys, ends + more_ends, cards + more_cards)
                        del keys[len(keys) - len(more_keys):]
                        if key is not None and key not in out:
                            out[key] = (total, cards + more_cards)
                return
            options = fillings[i]
            for position in range(lowest if same_as_previous[i] else 0, len(options)):
                more_keys, more_ends, more_placed, more_cards = options[position]
                total = bound.add(placed, more_placed)
                if total is None:
                    continue
                keys.extend(more_keys)
                extend(i + 1, position, total, ends + more_ends, cards + more_cards)
                del keys[len(keys) - len(more_keys):]

        extend(0, 0, bound.none, (), ())
        return out

    def _check(self) -> None:
        if self._limit is not None and self.work > self._limit:
            raise TooMany
        if self._deadline is not None and time.perf_counter() > self._deadline:
            raise Timeout
        self._next_check = self.work + 1000

    def _root_fillings(self) -> dict:
        """The root's fillings; their keys are only used to tell them apart.

        When the sockets form one unit (UPI) and no filling of one socket is a filling of another,
        no two combinations can be isomorphic, so the unit's canonical key need not be computed.
        """
        parts = self.canon.parts[ROOT]
        if len(parts) == 1 and len(parts[0].members) > 1:
            part = parts[0]
            tables = [self.fillings(m) for m in part.members]
            key_sets = [{k for k, _ in t} for t in tables]
            if sum(map(len, key_sets)) == len(set().union(*key_sets)):
                closing = part.blocks + self.slots.crossing.closes_at.get(ROOT, [])
                slots = self.slots

                def finish(keys: list[int], ends: EndState, cards: Cards) -> Hashable | None:
                    if closing and slots.violated_by_cards(closing, cards):
                        return None
                    return tuple(keys)

                return self._combine(
                    [[((k,), ends, placed, cards) for (k, ends), (placed, cards) in sorted(t.items())]
                     for t in tables],
                    [False] * len(tables), self.bound.room[ROOT], finish,
                )
        return self.fillings(ROOT)


def _deep_enough(parts: int) -> None:
    """Room on the interpreter's stack for `_combine`'s one call per part (a node's children): Python's default of
    1,000 frames was a RecursionError traceback on a machine with 1,000 slots under one root complex. Raised,
    never lowered (the limit is the process's, and a search in another thread may be deep)."""
    need = parts + 1000  # the call's own depth, the tree above it and the caller's
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)
