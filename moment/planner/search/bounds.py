"""Bounds: prune partial fillings that can no longer be completed, and say early what cannot fit.

The searches fill the PCIe tree one subtree at a time and track `Placed`, how many devices of each
inventory model a partial filling holds. A partial filling is only worth extending when the rest of
the machine can still take the devices not yet placed. That is a bipartite matching of devices to
slots, and Hall's theorem says when one exists: for every subset S of the models, the devices of S
still to place must not outnumber the empty slots outside the subtree that take some model in S.
`HallBound.can_finish` tests exactly that, with the per-subset slot counts of every subtree
(`room`) computed once. Because `blocks` constraints are left out, the condition is necessary but
not sufficient: it never prunes a filling that can be completed (so the search stays exact), and it
cuts every branch that fails for lack of slots, which is most of them.

`check_capacity` turns the same counts into error messages before any search, plus one more
necessary condition: double-width cards need slots that do not block each other, an independent set
in the graph of open constraints.
"""

from __future__ import annotations

from collections import defaultdict

from moment.errors import MomentError
from moment.planner.search.constraints import ROOT, Slots
from moment.planner.search.graph import components, independent_set_size

Placed = tuple[int, ...]  # devices placed per inventory model, in inventory order


class HallBound:
    """Hall's condition for the devices not yet placed, per model subset and subtree."""

    def __init__(self, slots: Slots, counts: tuple[int, ...]):
        self.counts = counts
        n_models = len(counts)
        self.none: Placed = (0,) * n_models
        self.full: Placed = counts
        self.subsets = [[i for i in range(n_models) if mask >> i & 1] for mask in range(1 << n_models)]
        # room[n][k]: empty slots under n that take some model of subsets[k]
        self.room: dict[str, tuple[int, ...]] = {}
        for n in slots.postorder():
            if n in slots.empty_set:
                takes = set(slots.options[n])
                self.room[n] = tuple(int(any(i in takes for i in subset)) for subset in self.subsets)
            else:
                below = [self.room[k] for k in slots.children[n]]
                self.room[n] = tuple(map(sum, zip(*below))) if below else (0,) * len(self.subsets)
        self.total = self.room[ROOT]
        self._can_finish: dict[tuple[tuple[int, ...], Placed], bool] = {}
        self._sums: defaultdict[Placed, dict[Placed, Placed | None]] = defaultdict(dict)  # a -> b -> a + b

    def one(self, model: int) -> Placed:
        """One device of `model`."""
        return tuple(int(i == model) for i in range(len(self.counts)))

    def add(self, a: Placed, b: Placed) -> Placed | None:
        """a + b, or None where that is more devices of some model than the inventory has."""
        sums = self._sums[a]  # nested, not keyed by (a, b): the hottest call of the enumeration
        if b in sums:
            return sums[b]
        total = tuple(x + y for x, y in zip(a, b))
        found = sums[b] = total if all(t <= c for t, c in zip(total, self.counts)) else None
        return found

    def can_finish(self, room_inside: tuple[int, ...], placed: Placed) -> bool:
        """Can the devices not in `placed` still go into the empty slots outside the part whose
        per-subset room is `room_inside` (Hall)?"""
        key = (room_inside, placed)
        found = self._can_finish.get(key)
        if found is None:
            need = [c - p for c, p in zip(self.counts, placed)]
            found = all(
                sum(need[i] for i in subset) <= self.total[k] - room_inside[k]
                for k, subset in enumerate(self.subsets) if subset
            )
            self._can_finish[key] = found
        return found


def check_capacity(slots: Slots, bound: HallBound) -> None:
    """Raise MomentError naming what does not fit, before any search."""
    name, models, counts = slots.topo.name, slots.models, bound.counts
    for i, m in enumerate(models):
        have = sum(1 for s in slots.empty if i in slots.options[s])
        if have < counts[i]:
            dw = ", double-width" if m.double_width else ""
            raise MomentError(
                f"{counts[i]} x {m.name} ({m.kind.value}, x{m.lanes}{dw}) need {counts[i]} free slots "
                f"that accept a {m.kind.value} and are at least x{m.lanes} wide; {name} has {have}"
            )
    for k, subset in enumerate(bound.subsets):
        need = sum(counts[i] for i in subset)
        if len(subset) > 1 and need > bound.total[k]:
            what = " + ".join(f"{counts[i]} x {models[i].name}" for i in subset if counts[i])
            raise MomentError(
                f"{what} need {need} free slots between them; {name} has {bound.total[k]} that take any of them"
            )
    double = [i for i, m in enumerate(models) if m.double_width and counts[i]]
    want = sum(counts[i] for i in double)
    if not want:
        return
    candidates = [s for s in slots.empty if any(i in slots.options[s] for i in double)]
    inside = set(candidates)
    edges = [(a, b) for a, b in slots.open_blocks if a in inside and b in inside]
    best = 0
    for comp in components(candidates, edges):
        if len(comp) > 40:
            return  # too big to solve exactly here; the search will say whether it fits
        best += independent_set_size(comp, [(a, b) for a, b in edges if a in comp])
    if best < want:
        kinds = {models[i].kind for i in double}
        noun = f"{kinds.pop().value.upper()}s" if len(kinds) == 1 else "cards"
        lanes = min(models[i].lanes for i in double)
        raise MomentError(
            f"{want} double-width {noun} need {want} free x{lanes} slots that don't block each other; "
            f"{name} has {best}"
        )
