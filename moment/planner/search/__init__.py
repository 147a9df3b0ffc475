"""The placement search: every physically valid placement of an inventory into a chassis's empty
slots, once per symmetry class, without listing the raw placements (they can number in the
trillions).

Stages, each in its own module:

- `constraints`: which empty slot can take which model, and the double-width `blocks` constraints
  still open (carried up the tree until both ends meet);
- `bounds`: Hall's condition on the devices not yet placed, which prunes partial fillings that
  cannot be completed and names what does not fit before any search (`check_capacity`);
- `canonical`: the canonical form (AHU keys on the PCIe tree, units of peer-linked siblings, pins
  and their orbit for links between subtrees) that decides when two placements are alike;
- `enumeration`: the bottom-up pass that keeps one representative per canonical key;
- `counting`: the raw count of valid placements, by a DP that shares nothing with the canonical form.

`enumerate_placements` runs them in that order; `canonical_keys` exposes the canonical form.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from moment.errors import MomentError
from moment.planner.search.bounds import HallBound, check_capacity
from moment.planner.search.canonical import CanonicalForm
from moment.planner.search.constraints import Slots
from moment.planner.search.counting import count_placements
from moment.planner.search.enumeration import Enumeration, Timeout, TooMany
from moment.planner.symmetry import Interner, iso_classes
from moment.topology.devices import DeviceModel, Inventory, InventoryItem
from moment.topology.model import Topology

__all__ = ["Listings", "SearchSpace", "Timeout", "TooMany", "canonical_keys", "count_valid", "enumerate_placements",
           "placement_key"]


@dataclass
class SearchSpace:
    """The distinct placements as rows of model indices: the planner ranks them by array operations
    and turns only the few it solves into dicts."""

    slots: tuple[str, ...]  # the empty slots, in topology order
    models: tuple[str, ...]  # model names, in inventory order (a model listed twice once)
    rows: np.ndarray  # per distinct placement, per slot: the model's index, len(models) where empty
    raw_count: int  # physically valid placements before symmetry pruning

    def placement(self, i: int) -> dict[str, str]:
        """Distinct placement `i`: slot id -> model name."""
        none = len(self.models)
        return {s: self.models[m] for s, m in zip(self.slots, self.rows[i].tolist()) if m != none}

    @cached_property
    def distinct(self) -> list[dict[str, str]]:
        """slot id -> model name, one per distinct placement, in a stable order."""
        return [self.placement(i) for i in range(len(self.rows))]


class Listings:
    """Listings of distinct placements shared by the inventories placed on one machine (`moment
    advise` places hundreds): inventories whose models take the same slots alike, in the same
    numbers, have the same listing with the model names changed, so each shape is listed once.

    The listing depends on the models only through the slots each may take, which are double-width,
    how many there are of each, and the canonical form's numbers for them (`CanonicalForm.model_key`,
    and a card already in the machine that a model would be alike with): that is the key. Machines
    whose canonical form pins nodes (NVLink between subtrees), and listings with a deadline, are
    listed each time."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self._found: dict[Hashable, tuple[np.ndarray, int] | TooMany] = {}
        # per list of model names: (the empty slots, the models' part of the key, None where pinned,
        # and a search structure built for it that no listing has used yet)
        self._models: dict[tuple[str, ...], tuple[tuple[str, ...], Hashable | None, list]] = {}

    def shape(self, models: list[tuple[DeviceModel, int]]) -> tuple[tuple[str, ...], Hashable | None]:
        """(the empty slots, the key's part that depends on the models: None when the machine pins
        nodes): built once per list of models, so a listing found again costs no search structure."""
        names = tuple(m.name for m, _ in models)
        if names not in self._models:
            slots, bound, canon = _build(self.topo, models, pin_all=False)
            part = None if canon.pinned else (
                tuple(tuple(slots.options[s]) for s in slots.empty), tuple(m.double_width for m in slots.models),
                tuple(canon.model_key), tuple(sorted(canon.fixed_cards.items())))
            self._models[names] = (tuple(slots.empty), part, [(slots, canon)])
        empty, part, _ = self._models[names]
        return empty, part

    def unused(self, models: list[tuple[DeviceModel, int]]) -> tuple[Slots, CanonicalForm] | None:
        """The search structure `shape` built for these models, once (the enumeration changes it)."""
        spare = self._models[tuple(m.name for m, _ in models)][2]
        return spare.pop() if spare else None


def enumerate_placements(topo: Topology, inventory: Inventory, *, prune: bool = True,
                         limit: int | None = None, deadline: float | None = None,
                         shared: Listings | None = None) -> SearchSpace:
    """All valid placements of `inventory` into `topo`'s empty slots, one per symmetry class.

    With `prune=False` every valid placement is listed (only sensible on small machines).
    `distinct` is ordered by occupant per slot in the topology's slot order (inventory order,
    empty last). Raises MomentError when the inventory cannot be placed at all, TooMany (with the
    raw count) when listing would take more than `limit` combinations and Timeout past `deadline`
    (see `Enumeration`). `shared`: listings of other inventories on `topo` to take this one's from
    where it has the same shape (and to add it to).
    """
    models = inventory.merged()
    names = tuple(m.name for m, _ in models)
    key = None
    built = None
    if shared is not None and prune and deadline is None:
        assert shared.topo is topo, "listings are shared on one machine"
        empty, part = shared.shape(models)
        key = None if part is None else (part, tuple(c for _, c in models), limit)
        found = shared._found.get(key) if key is not None else None
        if isinstance(found, TooMany):
            raise TooMany(found.raw_count)
        if found is not None:
            return SearchSpace(empty, names, found[0], found[1])
        built = shared.unused(models)
    if built is not None:
        slots, canon = built
        bound = HallBound(slots, tuple(c for _, c in models))
    else:
        slots, bound, canon = _build(topo, models, pin_all=not prune)
    raw = _counted(topo, inventory, slots, bound, deadline)
    try:
        rows = Enumeration(slots, bound, canon, limit=limit, deadline=deadline).representatives()
    except TooMany:
        if key is not None:
            shared._found[key] = TooMany(raw)
        raise TooMany(raw) from None
    space = SearchSpace(tuple(slots.empty), names, rows, raw)
    if prune and canon.pinned:
        kept = {id(p) for p in canon.dedup(space.distinct, {m.name: i for i, (m, _) in enumerate(models)})}
        space = SearchSpace(space.slots, space.models,
                            rows[[i for i, p in enumerate(space.distinct) if id(p) in kept]], raw)
    if key is not None:
        shared._found[key] = (space.rows, raw)
    return space


def count_valid(topo: Topology, inventory: Inventory, deadline: float | None = None) -> int | None:
    """How many physically valid placements `inventory` has in `topo`'s empty slots (a dynamic
    programme, whose tables grow with the product of the models' counts: mixed inventories on large
    machines take minutes); None where `deadline` stopped it, MomentError naming what does not fit
    when none."""
    models = inventory.merged()
    slots = Slots(topo, [m for m, _ in models])
    try:
        return _counted(topo, inventory, slots, HallBound(slots, tuple(c for _, c in models)), deadline)
    except Timeout:
        return None


def _counted(topo: Topology, inventory: Inventory, slots: Slots, bound: HallBound,
             deadline: float | None = None) -> int:
    """The count (Timeout past `deadline`, like the listing it comes before)."""
    check_capacity(slots, bound)
    raw = count_placements(slots, bound, deadline)
    if raw == 0:
        raise MomentError(
            f"the inventory ({inventory.describe()}) cannot be placed in the free slots of {topo.name!r}: "
            "double-width cards would cover slots that the other devices need"
        )
    return raw


def canonical_keys(topo: Topology, placements: Iterable[dict[str, str]]) -> list[int]:
    """A key per placement such that two keys are equal iff the placements are equivalent.

    Keys are only comparable within one call. Useful to find which candidate a named layout is.
    """
    placements = [dict(p) for p in placements]
    names = sorted({m for p in placements for m in p.values()})
    models = [(Inventory(items=[InventoryItem(model=n, count=1)]).models()[0][0], 1) for n in names]
    slots, _, canon = _build(topo, models, pin_all=False)
    for p in placements:
        for slot in p:
            if slot not in slots.empty_set:
                raise MomentError(f"{slot!r} is not an empty slot of {topo.name!r}")
    index = {m.name: i for i, (m, _) in enumerate(models)}
    keys = [canon.placement_key({slot: index[m] for slot, m in p.items()}) for p in placements]
    if not canon.pinned or canon.orbit() is not None:
        return keys
    first: dict[int, int] = {}  # pinned key -> first placement with it
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    firsts = list(first.values())
    classes = iso_classes(canon.graphs(), [placements[i] for i in firsts])
    merged = {keys[i]: keys[firsts[c]] for i, c in zip(firsts, classes)}
    return [merged[k] for k in keys]


def placement_key(topo: Topology, models: list[DeviceModel]) -> Callable[[dict[str, str]], int]:
    """The canonical form's key of a (partial) placement into `topo`'s empty slots, slot -> model name
    (models of `models` only): equal keys are equivalent placements, which every completion with the
    same devices shows alike (the rule the listing prunes by, for searches that do not list). Where
    pinned nodes have too many images, equal keys are still equivalent but some equivalent placements
    differ."""
    slots, _, canon = _build(topo, [(m, 1) for m in models], pin_all=False)
    index = {m.name: i for i, m in enumerate(models)}
    return lambda placement: canon.placement_key({x: index[m] for x, m in placement.items()})


def _build(topo: Topology, models: list[tuple[DeviceModel, int]], *,
           pin_all: bool) -> tuple[Slots, HallBound, CanonicalForm]:
    slots = Slots(topo, [m for m, _ in models])
    bound = HallBound(slots, tuple(c for _, c in models))
    return slots, bound, CanonicalForm(slots, Interner(), pin_all=pin_all)
