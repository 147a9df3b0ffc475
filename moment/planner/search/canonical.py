"""Canonical form: one key per subtree filling, equal iff the filled subtrees are alike.

Equivalence is defined in `moment.planner.symmetry`: two placements are equivalent when the
populated machines are isomorphic as attributed graphs (PCIe tree plus peer links, names ignored).
The key is built bottom up as in AHU tree canonisation: a node's key is its physical label plus the
sorted keys of what hangs below it, interned to small integers (`Interner`). Sorting is what makes
interchangeable children collapse: two switches with the same fillings in either order get one key.

Peer links break the plain tree picture, and are handled by where their ends sit:

- both ends on one node (a card's link to its own slot, once a card is identified with its slot):
  the link becomes part of the node's label;
- ends on siblings: the siblings joined by such links form a *unit* (`Unit`), whose key
  (`symmetry.unit_key`) is minimised over the orders of members with equal keys, so it is exact;
- ends under different parents, or a unit larger than `MAX_UNIT`: both ends are *pinned* (their id
  joins their label). Pinned keys are exact only up to automorphisms that fix the pins, so
  `placement_key` also takes the least key over the images of the pins (`orbit`, from
  `symmetry.pin_images`); when there are more than `MAX_ORBIT` images, `dedup` falls back to
  pairwise isomorphism tests (`symmetry.dedup_isomorphic`).

The enumeration also needs to know which sibling subtrees are interchangeable *while filling*, which
is stricter than alike once filled: same structure, same slot options and the same open `blocks`
constraint ends. Siblings joined by a peer link or a `blocks` constraint are filled together as one
`Part`; parts with equal `group` are interchangeable, and the enumeration takes them as multisets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from moment.planner.search.constraints import ROOT, Constraint, Slots
from moment.planner.search.graph import components
from moment.planner.symmetry import (
    MAX_UNIT,
    Interner,
    StructureGraphs,
    dedup_isomorphic,
    node_label,
    peer_label,
    pin_images,
    unit_key,
)
from moment.topology.devices import populate
from moment.topology.model import Kind

MAX_ORBIT = 5000  # pinned-node images tried before falling back to pairwise isomorphism tests

Edge = tuple[int, int, int, bool]  # member i, member j, interned label, directed


@dataclass
class Unit:
    """Siblings joined by peer links: one node of the canonical form (`unit_key`)."""

    members: tuple[int, ...]  # positions in the part
    edges: list[Edge]  # between positions in `members`
    memo: dict[tuple[int, ...], int] = field(default_factory=dict)  # member keys -> unit key


@dataclass
class Part:
    """Siblings that must be filled together: one subtree, or siblings joined by links or `blocks`."""

    members: tuple[str, ...]
    units: list[Unit]
    blocks: list[Constraint]  # `blocks` constraints among the members
    group: int = -1  # equal for interchangeable parts (same structure, slot options and constraints)


@dataclass
class _PeerLinks:
    """The machine's peer links, sorted by where their ends sit (after lifting cards to slots)."""

    on_node: dict[str, list[int]]  # node -> labels of links with both ends on it
    between_siblings: dict[str, list[tuple[str, str, int, bool]]]  # parent -> (x, y, label, directed)
    pins: set[str]  # ends of links between different parents


class CanonicalForm:
    """Labels, parts and pins of one machine, and the canonical keys of its fillings.

    `pin_all` pins every node, which turns symmetry pruning off (every valid placement its own class).
    """

    def __init__(self, slots: Slots, intern: Interner, *, pin_all: bool):
        self.slots = slots
        self.topo = topo = slots.topo
        self.intern = intern
        self._bare: dict[str, int] = {}
        self._shape: dict[str, int] = {}

        links = self._sort_peer_links()
        blocks_label = self.intern(("E", "blocks"))
        sibling_blocks: dict[str, list[Constraint]] = {}
        for a, b in slots.open_blocks:
            if slots.parent[a] == slots.parent[b]:
                sibling_blocks.setdefault(slots.parent[a], []).append((a, b))
        self.parts: dict[str, list[Part]] = {}
        part_edges: dict[int, list[Edge]] = {}  # id(part) -> peer links and `blocks` among its members
        for p in slots.children:
            self.parts[p] = self._parts_of(p, links, sibling_blocks.get(p, []), blocks_label, part_edges)

        pins = links.pins
        self.pinned = bool(pins) and not pin_all
        order = {n.id: i for i, n in enumerate(topo.nodes)}
        self.pins = sorted(pins, key=order.__getitem__)
        self._orbit: list[dict[str, str]] | None | bool = False
        self.label: dict[str, int] = {ROOT: self.intern(("L", "ROOT"))}
        for n in topo.nodes:
            pin = n.id if (pin_all or n.id in pins) else None
            self.label[n.id] = self.intern(("L", node_label(n), pin, tuple(sorted(links.on_node.get(n.id, [])))))

        # what a placed card looks like, exactly as `populate` builds it
        self.model_labels: dict[str, str] = {}
        self.model_key: list[int] = []  # model index -> key of a slot's content holding it
        for m in slots.models:
            label = m.name
            if slots.empty:
                populated = populate(topo, {slots.empty[0]: m.name}, check=False)
                label = node_label(populated.occupant(slots.empty[0]))
            self.model_labels[m.name] = label
            self.model_key.append(self.intern(("N", self.intern(("L", label, None, ())), ())))

        # cards already in the machine that are indistinguishable from a placed one (a leaf with no
        # peer link and a placed model's label): equivalence may swap them with placed cards
        linked = {x for lk in topo.links for x in (lk.a, lk.b)}
        placed_keys = set(self.model_key)
        self.fixed_cards: dict[str, int] = {}  # slot -> key of the card in it
        for s in topo.of_kind(Kind.slot):
            card = topo.occupant(s.id)
            if (card is not None and not slots.children[card.id] and card.id not in linked
                    and self.bare_key(card.id) in placed_keys):
                self.fixed_cards[s.id] = self.bare_key(card.id)
        self.content_slots = slots.empty_set | set(self.fixed_cards)

        self._group_interchangeable_parts(part_edges)

    # ---- structure --------------------------------------------------------------------------------
    def _lift(self, x: str) -> tuple[str, int]:
        """A device alone in a slot is identified with its slot, so its links become the slot's
        (with depth 1 below it, 0 for the node itself)."""
        p = self.slots.parent[x]
        if p != ROOT and self.topo.node(p).kind == Kind.slot:
            return p, 1
        return x, 0

    def _sort_peer_links(self) -> _PeerLinks:
        out = _PeerLinks({}, {}, set())
        for lk in self.topo.links:
            (x, dx), (y, dy) = self._lift(lk.a), self._lift(lk.b)
            if dx > dy:
                x, y, dx, dy = y, x, dy, dx
            label = self.intern(("E", peer_label(lk), dx, dy))
            if x == y:
                out.on_node.setdefault(x, []).append(label)
            elif self.slots.parent[x] == self.slots.parent[y]:
                out.between_siblings.setdefault(self.slots.parent[x], []).append((x, y, label, dx != dy))
            else:
                out.pins.update((x, y))
        return out

    def _parts_of(self, p: str, links: _PeerLinks, blocks: list[Constraint], blocks_label: int,
                  part_edges: dict[int, list[Edge]]) -> list[Part]:
        """The children of `p` grouped into parts (filled together) and units (canonised together).

        Units larger than MAX_UNIT are pinned instead (added to `links.pins`)."""
        kids = self.slots.children[p]
        at = {k: i for i, k in enumerate(kids)}
        sibling_links = links.between_siblings.get(p, [])
        linked = [(x, y) for x, y, _, _ in sibling_links]  # peer links: what the canonical form sees
        for c in components(kids, linked):
            if len(c) > MAX_UNIT:
                links.pins.update(c)
        parts = []  # linked plus `blocks`: what has to be filled together
        for members in sorted((sorted(c, key=at.__getitem__) for c in components(kids, linked + list(blocks))),
                              key=lambda c: at[c[0]]):
            pos = {m: i for i, m in enumerate(members)}
            edges = [(pos[x], pos[y], label, d) for x, y, label, d in sibling_links if x in pos]
            units = []
            inside = [(x, y) for x, y in linked if x in pos]
            for unit in sorted((sorted(pos[m] for m in c) for c in components(members, inside)),
                               key=lambda c: c[0]):
                if len(unit) > MAX_UNIT:  # pinned: its members stand alone in the canonical form
                    units += [Unit((i,), []) for i in unit]
                    continue
                local = {m: j for j, m in enumerate(unit)}
                units.append(Unit(tuple(unit), [(local[a], local[b], label, d) for a, b, label, d in edges
                                                 if a in local]))
            part_blocks = [(a, b) for a, b in blocks if a in pos]
            part = Part(tuple(members), units, part_blocks)
            part_edges[id(part)] = edges + [(pos[a], pos[b], blocks_label, True) for a, b in part_blocks]
            parts.append(part)
        return parts

    def _group_interchangeable_parts(self, part_edges: dict[int, list[Edge]]) -> None:
        """Give interchangeable parts one `group` and put each group's parts next to each other.

        A part's group is its members' *shapes* (label, slot options, open constraint ends), joined
        by `unit_key` over its edges when it has several members."""
        slots = self.slots
        for p in slots.postorder():
            parts = self.parts[p]
            for part in parts:
                shapes = [self._shape[m] for m in part.members]
                part.group = shapes[0] if len(shapes) == 1 else self.intern(unit_key(shapes, part_edges[id(part)]))
            first: dict[int, int] = {}
            for i, part in enumerate(parts):
                first.setdefault(part.group, i)
            parts.sort(key=lambda q: first[q.group])
            if p in slots.empty_set:
                self._shape[p] = self.intern(("V", self.label[p], slots.options[p],
                                              p if p in slots.crossing.carried else None))
            else:
                self._shape[p] = self.intern(("V", self.label[p], tuple(sorted(q.group for q in parts))))

    def graphs(self) -> StructureGraphs:
        return StructureGraphs(self.topo, self.model_labels)

    # ---- keys -------------------------------------------------------------------------------------
    def node_key(self, n: str, child_keys: Iterable[int]) -> int:
        return self.intern(("N", self.label[n], tuple(sorted(child_keys))))

    def slot_key(self, n: str, model: int | None) -> int:
        """Key of empty slot `n` holding `model` (None: left empty)."""
        return self.node_key(n, () if model is None else (self.model_key[model],))

    def unit_keys(self, part: Part, member_keys: list[int]) -> list[int]:
        """Keys of a part's units, given its members' keys."""
        out = []
        for unit in part.units:
            if len(unit.members) == 1:
                out.append(member_keys[unit.members[0]])
                continue
            key = tuple(member_keys[i] for i in unit.members)
            found = unit.memo.get(key)
            if found is None:
                found = unit.memo[key] = self.intern(unit_key(key, unit.edges))
            out.append(found)
        return out

    def bare_key(self, n: str) -> int:
        """Key of the subtree as it is now (no new devices)."""
        found = self._bare.get(n)
        if found is None:
            if n in self.slots.empty_set:
                found = self.slot_key(n, None)
            else:
                found = self.node_key(n, [
                    k for part in self.parts[n] for k in self.unit_keys(part, [self.bare_key(m) for m in part.members])
                ])
            self._bare[n] = found
        return found

    def key_with(self, n: str, content: dict[str, int], touched: set[str]) -> int:
        """Key of the subtree under `n` with `content` (slot -> device key) in its content slots
        (`touched`: the nodes above slots whose content differs from now)."""
        if n not in touched:
            return self.bare_key(n)
        if n in self.content_slots:
            return self.node_key(n, (content[n],) if n in content else ())
        return self.node_key(n, [
            k for part in self.parts[n]
            for k in self.unit_keys(part, [self.key_with(m, content, touched) for m in part.members])
        ])

    def orbit(self) -> list[dict[str, str]] | None:
        """Per place the pinned nodes can go: an automorphism of the machine without its content,
        inverted and restricted to content slots (cached; None when there are too many)."""
        if self._orbit is False:
            drop = frozenset(self.topo.occupant(s).id for s in self.fixed_cards)
            graphs = StructureGraphs(self.topo, self.model_labels, drop)
            maps = pin_images(graphs, self.pins, MAX_ORBIT)
            self._orbit = None if maps is None else [
                {b: a for a, b in m.items() if b in self.content_slots} for m in maps
            ]
        return self._orbit

    def placement_key(self, placement: dict[str, int]) -> int:
        """Equal iff equivalent; with pins, only if `orbit()` is not None (else up to the pins)."""
        content = {**self.fixed_cards, **{s: self.model_key[i] for s, i in placement.items()}}

        def key(c: dict[str, int]) -> int:
            return self.key_with(ROOT, c, {a for s in (*c, *self.fixed_cards) for a in self.slots.path(s)})

        orbit = self.orbit() if self.pinned else None
        if not orbit:
            return key(content)
        return min(key({inverse[s]: c for s, c in content.items()}) for inverse in orbit)

    def dedup(self, placements: list[dict[str, str]], index: dict[str, int]) -> list[dict[str, str]]:
        """Merge candidates that are equivalent only by moving pinned nodes (first one kept);
        `index` maps model names to model indices."""
        if self.orbit() is None:
            return dedup_isomorphic(self.graphs(), placements)
        seen: set[int] = set()
        out = []
        for placement in placements:
            k = self.placement_key({s: index[m] for s, m in placement.items()})
            if k not in seen:
                seen.add(k)
                out.append(placement)
        return out
