"""The usual layouts a recommendation is compared against.

The profile's named layouts (e.g. the paper's a-d and Moment's own) plus four generic heuristics
that work on any chassis: GPUs spread round-robin over the switches/root complexes or packed onto
as few as possible; SSDs spread the same way, or put on the front backplane / root complexes first.
Everything is deterministic: groups and slots are taken in the topology's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from moment.errors import MomentError
from moment.topology.devices import DeviceModel, Inventory, check_placement, fits
from moment.topology.model import Kind, Slot, Topology


@dataclass(frozen=True)
class NamedPlacement:
    name: str
    description: str
    placement: dict[str, str]  # slot id -> device model


def _expand(inventory: Inventory, kind: Kind) -> list[DeviceModel]:
    return [m for m, c in inventory.models() if m.kind == kind for _ in range(c)]


def named_layouts(topo: Topology, inventory: Inventory) -> list[NamedPlacement]:
    """The profile's layouts that can hold the inventory, first N slots for N devices (`layouts_of`)."""
    return layouts_of(topo, inventory)[0]


def layouts_of(topo: Topology, inventory: Inventory) -> tuple[list[NamedPlacement], list[str]]:
    """The profile's layouts, first N slots for N devices, and notes naming each one that cannot hold
    this inventory (fewer slots than devices, NICs it does not place, one slot in both lists, a card
    that does not fit or covers another's slot), which is left out of the comparison; layouts left out
    for the same reason share a note. What no inventory could use (a slot twice in a list, a kind its
    slot does not accept) is refused with the profile (`Topology`)."""
    gpus, ssds = _expand(inventory, Kind.gpu), _expand(inventory, Kind.ssd)
    out: list[NamedPlacement] = []
    left: dict[str, list[str]] = {}  # why -> the layouts left out for it
    for name, lay in topo.layouts.items():
        pairs = list(zip(lay.gpu, gpus)) + list(zip(lay.ssd, ssds))
        placement = {slot: m.name for slot, m in pairs}
        short = [f"fewer {k} slots than the {_n(len(want), k)}"
                 for k, have, want in (("GPU", lay.gpu, gpus), ("SSD", lay.ssd, ssds)) if len(have) < len(want)]
        if inventory.count(Kind.nic):
            why = "a layout places no NICs"
        elif short:
            why = " and ".join(short)
        elif len(placement) != len(pairs):
            why = f"a GPU and an SSD in slot {next(s for s in lay.gpu[:len(gpus)] if s in lay.ssd[:len(ssds)])!r}"
        else:
            try:
                check_placement(topo, placement)
            except MomentError as e:
                why = e.message
            else:
                out.append(NamedPlacement(name, lay.description, placement))
                continue
        left.setdefault(why, []).append(name)
    notes = [f"layout{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))} {'are' if len(names) > 1 else 'is'} not "
             f"compared for this inventory: {why}" for why, names in left.items()]
    return out, notes


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'s' if count != 1 else ''}"


class _Board:
    """Free slots while a heuristic fills them, honouring double-width cards."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.free = [s for s in topo.empty_slots()]
        self.taken: set[str] = set()
        self.placement: dict[str, str] = {}
        self.groups: dict[str, list[Slot]] = {}  # per parent (topology order): narrowest first, then topology order
        for s in self.free:
            self.groups.setdefault(s.parent, []).append(s)
        for g in self.groups.values():
            g.sort(key=lambda s: s.width)

    def ok(self, slot: Slot, m: DeviceModel) -> bool:
        if slot.id in self.taken or not fits(slot, m):
            return False
        return not (m.double_width and any(b in self.taken for b in slot.blocks))

    def put(self, slot: Slot, m: DeviceModel) -> None:
        self.placement[slot.id] = m.name
        self.taken.add(slot.id)
        if m.double_width:
            self.taken.update(slot.blocks)

    def best_in(self, slots: list[Slot], m: DeviceModel) -> Slot | None:
        """The narrowest free slot that fits (keep wide slots for wide cards), then topology order:
        the first that fits, `slots` being a group's (or part of one), narrowest first."""
        return next((s for s in slots if self.ok(s, m)), None)


def _spread(board: _Board, models: list[DeviceModel], groups: list[list[Slot]]) -> int:
    """Round-robin over the groups; returns how many devices (a prefix of `models`) it placed."""
    i = 0
    for n, m in enumerate(models):
        for _ in range(len(groups)):
            s = board.best_in(groups[i % len(groups)], m)
            i += 1
            if s is not None:
                board.put(s, m)
                break
        else:
            return n
    return len(models)


def _packed(board: _Board, models: list[DeviceModel], groups: list[list[Slot]]) -> int:
    """Fill the group with the most room first, then the next (ties keep topology order)."""
    if not models:
        return 0
    order = sorted(groups, key=lambda g: -sum(board.ok(s, models[0]) for s in g))
    for n, m in enumerate(models):
        s = next((x for g in order for x in [board.best_in(g, m)] if x is not None), None)
        if s is None:
            return n
        board.put(s, m)
    return len(models)


def _front_first(board: _Board, models: list[DeviceModel]) -> int:
    """Front backplane / root-complex slots first (spread over those groups), then the rest."""
    def front(s: Slot) -> bool:
        return s.board == "front" or board.topo.node(s.parent).kind == Kind.root_complex

    pref = [g2 for g2 in ([s for s in g if front(s)] for g in board.groups.values()) if g2]
    rest = [g2 for g2 in ([s for s in g if not front(s)] for g in board.groups.values()) if g2]
    k = _spread(board, models, pref) if pref else 0
    return k + (_spread(board, models[k:], rest) if rest and k < len(models) else 0)


def heuristic_layouts(topo: Topology, inventory: Inventory) -> list[NamedPlacement]:
    gpus, ssds, nics = (_expand(inventory, k) for k in (Kind.gpu, Kind.ssd, Kind.nic))
    out = []
    for gpu_way in ("spread", "packed"):
        for ssd_way in ("spread", "front"):
            board = _Board(topo)
            groups = list(board.groups.values())
            placed = (_spread if gpu_way == "spread" else _packed)(board, gpus, groups) == len(gpus)
            placed = placed and (_spread(board, ssds, groups) if ssd_way == "spread"
                                 else _front_first(board, ssds)) == len(ssds)
            if not (placed and _spread(board, nics, groups) == len(nics)):
                continue
            name = f"gpus-{gpu_way}/ssds-{ssd_way}"
            desc = {"spread": "round-robin over switches and root complexes",
                    "packed": "as few switches/root complexes as possible",
                    "front": "front backplane and root-complex slots first"}
            out.append(NamedPlacement(name, f"GPUs: {desc[gpu_way]}; SSDs: {desc[ssd_way]}", board.placement))
    return out


def baseline_placements(topo: Topology, inventory: Inventory) -> list[NamedPlacement]:
    """Named layouts, then the heuristics (a heuristic identical to an earlier baseline is dropped)."""
    out = named_layouts(topo, inventory)
    seen = [b.placement for b in out]
    for b in heuristic_layouts(topo, inventory):
        if b.placement not in seen:
            out.append(b)
            seen.append(b.placement)
    return out
