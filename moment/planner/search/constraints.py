"""Physical validity: which empty slot can take which device model, and the `blocks` constraints.

A placement is valid when every device of the inventory is placed, each in an empty slot that
accepts its kind and is wide enough (`fits`), one per slot, and no double-width card covers an
occupied slot: if slot s holds a double-width card, every slot in `s.blocks` stays empty.

Most of this is settled per slot before any search (`Slots.options`): a slot covered by a
double-width card already in the machine takes nothing, and a slot whose `blocks` names an
occupied slot (or itself) takes no double-width card. What is left are the *open* constraints
(`Slots.open_blocks`): pairs (a, b) of empty slots where a may take a double-width card and b
may take something. The searches walk the PCIe tree bottom up, so a constraint between slots
under different parents cannot be checked where either slot is filled: each end's occupancy
(`EMPTY`, `CARD`, `DOUBLE_WIDTH`) is carried up the tree (`OpenEnds.carried`) to the lowest common
ancestor of its two ends, where it is checked and dropped (`OpenEnds.closes_at`). A clash between
two cards already in the machine is the machine's business and is ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from moment.topology.devices import DeviceModel, fits
from moment.topology.model import Kind, Topology

ROOT = ""  # the virtual node above the sockets (node ids are never empty)

# occupancy of an open constraint end, as carried up the tree
EMPTY, CARD, DOUBLE_WIDTH = 0, 1, 2

Constraint = tuple[str, str]  # (a, b): a double-width card in slot a keeps slot b empty
EndState = tuple[tuple[str, int], ...]  # (slot, occupancy) of the open ends carried up, sorted


@dataclass(frozen=True)
class OpenEnds:
    """Where constraints spanning subtrees are carried and where they are checked."""

    carried: dict[str, set[str]]  # node -> constraint ends below it whose occupancy goes above it
    closes_at: dict[str, list[Constraint]]  # node -> constraints whose two ends meet there


class Slots:
    """The machine as the search sees it: a tree under a virtual root, its empty slots (in the
    topology's order), what each can take, and the `blocks` constraints still open."""

    def __init__(self, topo: Topology, models: list[DeviceModel]):
        self.topo = topo
        self.models = models
        self.parent = {n.id: (n.parent if n.parent is not None else ROOT) for n in topo.nodes}
        self.children = {ROOT: [n.id for n in topo.nodes if n.parent is None]}
        self.children.update({n.id: topo.children(n.id) for n in topo.nodes})
        self.empty = [s.id for s in topo.empty_slots()]
        self.empty_set = set(self.empty)
        self.order = {sid: i for i, sid in enumerate(self.empty)}

        # what each empty slot can take (model indices), cards already present included
        slots = topo.of_kind(Kind.slot)
        covered = {b for s in slots if s.id not in self.empty_set and self._fixed_double_width(s.id) for b in s.blocks}
        self.options: dict[str, tuple[int, ...]] = {}
        for s in slots:
            if s.id in self.empty_set:
                no_double = any(b == s.id or b not in self.empty_set for b in s.blocks)
                self.options[s.id] = () if s.id in covered else tuple(
                    i for i, m in enumerate(models) if fits(s, m) and not (m.double_width and no_double)
                )
        # constraints still open: both ends empty and able to matter
        self.open_blocks: list[Constraint] = sorted({
            (s.id, b) for s in slots if s.id in self.empty_set for b in s.blocks
            if b != s.id and b in self.empty_set and self.options[b]
            and any(models[i].double_width for i in self.options[s.id])
        }, key=lambda c: (self.order[c[0]], self.order[c[1]]))
        # The enumeration fills siblings joined by a constraint together, so only constraints
        # between different parents travel up; the count fills one child at a time, so all do.
        self.crossing = self._open_ends([c for c in self.open_blocks if self.parent[c[0]] != self.parent[c[1]]])
        self.every = self._open_ends(self.open_blocks)

        self.has_empty_slot: dict[str, bool] = {}
        for n in self.postorder():
            self.has_empty_slot[n] = n in self.empty_set or any(self.has_empty_slot[k] for k in self.children[n])

    def _fixed_double_width(self, slot_id: str) -> bool:
        card = self.topo.occupant(slot_id)
        return card is not None and bool(getattr(card, "double_width", False))

    def _open_ends(self, constraints: list[Constraint]) -> OpenEnds:
        carried: dict[str, set[str]] = {}
        closes_at: dict[str, list[Constraint]] = {}
        for a, b in constraints:
            top = self.common_ancestor(a, b)
            closes_at.setdefault(top, []).append((a, b))
            for end in (a, b):
                x = end
                while x != top:
                    carried.setdefault(x, set()).add(end)
                    x = self.parent[x]
        return OpenEnds(carried, closes_at)

    def path(self, x: str) -> list[str]:
        """`x` and its ancestors up to the virtual root."""
        out = [x]
        while x != ROOT:
            x = self.parent[x]
            out.append(x)
        return out

    def common_ancestor(self, x: str, y: str) -> str:
        up = set(self.path(x))
        return next(a for a in self.path(y) if a in up)

    def postorder(self) -> list[str]:
        """Every node after its children, the virtual root last."""
        out, stack = [], [(ROOT, False)]
        while stack:
            n, done = stack.pop()
            if done:
                out.append(n)
            else:
                stack.append((n, True))
                stack.extend((k, False) for k in reversed(self.children[n]))
        return out

    def occupancy(self, model: int) -> int:
        return DOUBLE_WIDTH if self.models[model].double_width else CARD

    def violated_by_ends(self, constraints: Iterable[Constraint], ends: EndState) -> bool:
        """Does a double-width card at some constraint's first end face a card at its second?"""
        occupancy = dict(ends)
        return any(occupancy[a] == DOUBLE_WIDTH and occupancy[b] for a, b in constraints)

    def violated_by_cards(self, constraints: Iterable[Constraint], cards: Iterable[tuple[str, int]]) -> bool:
        """The same, from the (slot, model) pairs placed."""
        placed = dict(cards)
        return any(a in placed and b in placed and self.models[placed[a]].double_width for a, b in constraints)
