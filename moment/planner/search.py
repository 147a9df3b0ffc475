"""Enumerate physically valid placements of an inventory into a chassis's empty slots, once per
symmetry class.

A placement maps empty slots to device models (devices of one model are identical). It is valid when
every device of the inventory is placed, each in a slot that accepts its kind and is wide enough
(`fits`), one per slot, and no double-width card covers an occupied slot: if slot s holds a
double-width card, every slot in `s.blocks` stays empty. Cards already in the machine count too (a
fixed double-width card keeps the slots it covers empty; a slot whose `blocks` names an occupied
slot cannot take a double-width card); a clash between two cards already present is ignored.

Equivalence is defined in `moment.planner.symmetry`. Raw placements can number in the trillions, so
the search never lists them: one bottom-up pass over the PCIe forest keeps, per subtree, one
representative per canonical key of its filling, and combines interchangeable siblings as
multisets. Siblings joined by `blocks` or by a peer link are filled together as one part (a
compound unit), so no symmetry is assumed between them; a `blocks` constraint between slots under
different parents is carried up as the occupancy of its two slots until the branches meet. A peer
link between different parents pins its ends; the candidates are then merged by the least key over
the automorphisms that move the pins (`symmetry.pin_images`). `raw_count` comes from a separate
counting pass over the same tree.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

import networkx as nx

from moment.errors import MomentError
from moment.planner.symmetry import (
    MAX_UNIT,
    Interner,
    StructureGraphs,
    dedup_isomorphic,
    iso_classes,
    node_label,
    peer_label,
    pin_images,
    unit_key,
)
from moment.topology.devices import DeviceModel, Inventory, InventoryItem, fits, populate
from moment.topology.model import Kind, Topology

ROOT = ""  # the virtual node above the sockets (node ids are never empty)
MAX_ORBIT = 5000  # pinned-node images tried before falling back to pairwise isomorphism tests

Usage = int  # devices placed per inventory model, as one mixed-radix number (see _Search.vec)
State = tuple[tuple[str, int], ...]  # occupancy (0 empty, 1 card, 2 double-width) of open blocks ends
Rep = tuple[tuple[str, int], ...]  # (slot id, model index) pairs: a concrete representative
Entry = tuple[tuple[int, ...], State, Usage, Rep]  # a part filled: its components' keys, state, usage, rep
Edge = tuple[int, int, int, bool]  # member i, member j, interned label, directed


@dataclass
class SearchSpace:
    distinct: list[dict[str, str]]  # slot id -> model name, one per distinct placement, stable order
    raw_count: int  # physically valid placements before symmetry pruning


def enumerate_placements(topo: Topology, inventory: Inventory, *, prune: bool = True) -> SearchSpace:
    """All valid placements of `inventory` into `topo`'s empty slots, one per symmetry class.

    With `prune=False` every valid placement is listed (only sensible on small machines).
    `distinct` is ordered by occupant per slot in the topology's slot order (inventory order,
    empty last). Raises MomentError when the inventory cannot be placed at all.
    """
    s = _Search(topo, _merged(inventory), pin_all=not prune)
    s.check_capacity()
    raw = s.count()
    if raw == 0:
        raise MomentError(
            f"the inventory ({inventory.describe()}) cannot be placed in the free slots of {topo.name!r}: "
            "double-width cards would cover slots that the other devices need"
        )
    reps = s.enumerate()
    if prune and s.pinned:
        reps = s.dedup(reps)
    return SearchSpace(distinct=reps, raw_count=raw)


def canonical_keys(topo: Topology, placements: Iterable[dict[str, str]]) -> list[int]:
    """A key per placement such that two keys are equal iff the placements are equivalent.

    Keys are only comparable within one call. Useful to find which candidate a named layout is.
    """
    pls = [dict(p) for p in placements]
    names = sorted({m for p in pls for m in p.values()})
    models = [(Inventory(items=[InventoryItem(model=n, count=1)]).models()[0][0], 1) for n in names]
    s = _Search(topo, models, pin_all=False)
    for p in pls:
        for slot in p:
            if slot not in s.empty_set:
                raise MomentError(f"{slot!r} is not an empty slot of {topo.name!r}")
    keys = [s.placement_key({slot: s.index[m] for slot, m in p.items()}) for p in pls]
    if not s.pinned or s.orbit() is not None:
        return keys
    first: dict[int, int] = {}  # pinned key -> first placement with it
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    idx = list(first.values())
    cls = iso_classes(s.graphs(), [pls[i] for i in idx])
    merged = {keys[i]: keys[idx[c]] for i, c in zip(idx, cls)}
    return [merged[k] for k in keys]


# ---- internals ------------------------------------------------------------------------------------


def _merged(inventory: Inventory) -> list[tuple[DeviceModel, int]]:
    """Inventory lines per model (a model listed twice is one line), in the inventory's order."""
    out: dict[str, list] = {}
    for m, c in inventory.models():
        if m.name in out:
            out[m.name][1] += c
        else:
            out[m.name] = [m, c]
    return [(m, c) for m, c in out.values()]


@dataclass
class _Comp:
    """Siblings joined by peer links: one node of the canonical form (`unit_key`)."""

    members: tuple[int, ...]  # positions in the part
    edges: list[Edge]  # positions in `members`
    memo: dict[tuple[int, ...], int] = field(default_factory=dict)


@dataclass
class _Part:
    """Siblings that must be filled together: one subtree, or siblings joined by edges."""

    members: tuple[str, ...]
    comps: list[_Comp]
    dyn: list[tuple[str, str]]  # `blocks` constraints among the members
    group: int = -1  # equal for interchangeable parts (same structure, slots and constraints)


class _Search:
    def __init__(self, topo: Topology, models: list[tuple[DeviceModel, int]], *, pin_all: bool):
        self.topo = topo
        self.models = [m for m, _ in models]
        self.inv = tuple(c for _, c in models)
        self.index = {m.name: i for i, m in enumerate(self.models)}
        nm = len(self.models)
        self.radix = [1] * nm
        for i in range(1, nm):
            self.radix[i] = self.radix[i - 1] * (self.inv[i - 1] + 1)
        self.zero: Usage = 0
        self.full: Usage = sum(c * r for c, r in zip(self.inv, self.radix))
        self.intern = Interner()
        self._feasible: dict[tuple, bool] = {}
        self._sums: dict[int, Usage] = {}

        # tree, with a virtual root above the sockets
        self.parent = {n.id: (n.parent if n.parent is not None else ROOT) for n in topo.nodes}
        self.kids = {ROOT: [n.id for n in topo.nodes if n.parent is None]}
        self.kids.update({n.id: topo.children(n.id) for n in topo.nodes})
        self.empty = [s.id for s in topo.empty_slots()]
        self.empty_set = set(self.empty)
        self.slot_order = {sid: i for i, sid in enumerate(self.empty)}

        # what each empty slot can take, cards already present included
        slots = topo.of_kind(Kind.slot)
        covered = {b for s in slots if s.id not in self.empty_set and self._fixed_dw(s.id) for b in s.blocks}
        self.allowed: dict[str, tuple[int, ...]] = {}
        for s in slots:
            if s.id in self.empty_set:
                no_dw = any(b == s.id or b not in self.empty_set for b in s.blocks)
                self.allowed[s.id] = () if s.id in covered else tuple(
                    i for i, m in enumerate(self.models) if fits(s, m) and not (m.double_width and no_dw)
                )
        # `blocks` constraints still open: both ends empty and able to matter
        self.dyn = sorted({
            (s.id, b) for s in slots if s.id in self.empty_set for b in s.blocks
            if b != s.id and b in self.empty_set and self.allowed[b]
            and any(self.models[i].double_width for i in self.allowed[s.id])
        }, key=lambda e: (self.slot_order[e[0]], self.slot_order[e[1]]))
        # constraints between different parents travel up as the occupancy of their ends ("open")
        self.iface, self.check_at = self._open_ends([e for e in self.dyn if self.parent[e[0]] != self.parent[e[1]]])
        self.count_iface, self.count_check_at = self._open_ends(self.dyn)

        # Hall's condition over model subsets bounds what the rest of the machine can still take
        self.masks = [[i for i in range(nm) if mask >> i & 1] for mask in range(1 << nm)]
        self.ins: dict[str, tuple[int, ...]] = {}
        self.has_empty: dict[str, bool] = {}
        self._inside(ROOT)
        self.total = self.ins[ROOT]

        self._bare: dict[str, int] = {}
        self._vbare: dict[str, int] = {}
        self._tables: dict[str, dict[tuple[int, State], tuple[Usage, Rep]]] = {}
        self._structure(pin_all)

    # ---- structure: labels, compound units, pins --------------------------------------------------
    def _fixed_dw(self, slot_id: str) -> bool:
        occ = self.topo.occupant(slot_id)
        return occ is not None and bool(getattr(occ, "double_width", False))

    def _lift(self, x: str) -> tuple[str, int]:
        """A device alone in a slot is identified with its slot, so its links become the slot's."""
        p = self.parent[x]
        if p != ROOT and self.topo.node(p).kind == Kind.slot:
            return p, 1
        return x, 0

    def _open_ends(self, edges: list[tuple[str, str]]) -> tuple[dict[str, set[str]], dict[str, list]]:
        """Per node: the constraint ends below it still open above it, and the constraints closed at it."""
        iface: dict[str, set[str]] = {}
        check_at: dict[str, list[tuple[str, str]]] = {}
        for a, b in edges:
            top = self._lca(a, b)
            check_at.setdefault(top, []).append((a, b))
            for end in (a, b):
                x = end
                while x != top:
                    iface.setdefault(x, set()).add(end)
                    x = self.parent[x]
        return iface, check_at

    def _path(self, x: str) -> list[str]:
        out = [x]
        while x != ROOT:
            x = self.parent[x]
            out.append(x)
        return out

    def _lca(self, x: str, y: str) -> str:
        up = set(self._path(x))
        return next(a for a in self._path(y) if a in up)

    def _structure(self, pin_all: bool) -> None:
        """Labels, parts and components per node; pins where a peer link spans different parents."""
        marks: dict[str, list] = {}
        peers: dict[str, list[tuple[str, str, int, bool]]] = {}
        pins: set[str] = set()
        for lk in self.topo.links:
            (x, dx), (y, dy) = self._lift(lk.a), self._lift(lk.b)
            if dx > dy:
                x, y, dx, dy = y, x, dy, dx
            lab = self.intern(("E", peer_label(lk), dx, dy))
            if x == y:
                marks.setdefault(x, []).append(lab)
            elif self.parent[x] == self.parent[y]:
                peers.setdefault(self.parent[x], []).append((x, y, lab, dx != dy))
            else:
                pins.update((x, y))
        blocks_lab = self.intern(("E", "blocks"))
        local_dyn: dict[str, list[tuple[str, str]]] = {}
        for a, b in self.dyn:
            if self.parent[a] == self.parent[b]:
                local_dyn.setdefault(self.parent[a], []).append((a, b))

        self.parts: dict[str, list[_Part]] = {}
        part_edges: dict[int, list[Edge]] = {}
        for p, kids in self.kids.items():
            at = {k: i for i, k in enumerate(kids)}
            sg = nx.Graph()  # peer links: what the canonical form sees
            sg.add_nodes_from(kids)
            sg.add_edges_from((x, y) for x, y, _, _ in peers.get(p, []))
            for c in nx.connected_components(sg):
                if len(c) > MAX_UNIT:
                    pins.update(c)
            vg = sg.copy()  # plus `blocks`: what has to be filled together
            vg.add_edges_from(local_dyn.get(p, []))
            parts = []
            for c in sorted((sorted(c, key=at.__getitem__) for c in nx.connected_components(vg)),
                            key=lambda c: at[c[0]]):
                pos = {m: i for i, m in enumerate(c)}
                edges = [(pos[x], pos[y], lab, d) for x, y, lab, d in peers.get(p, []) if x in pos]
                comps = []
                for sc in sorted((sorted(pos[m] for m in sc) for sc in nx.connected_components(sg.subgraph(c))),
                                 key=lambda sc: sc[0]):
                    if len(sc) > MAX_UNIT:  # pinned: its members stand alone in the canonical form
                        comps += [_Comp((i,), []) for i in sc]
                        continue
                    local = {m: j for j, m in enumerate(sc)}
                    comps.append(_Comp(tuple(sc), [(local[a], local[b], lab, d) for a, b, lab, d in edges
                                                   if a in local]))
                dyn = [(a, b) for a, b in local_dyn.get(p, []) if a in pos]
                part = _Part(tuple(c), comps, dyn)
                part_edges[id(part)] = edges + [(pos[a], pos[b], blocks_lab, True) for a, b in dyn]
                parts.append(part)
            self.parts[p] = parts

        self.pinned = bool(pins) and not pin_all
        order = {n.id: i for i, n in enumerate(self.topo.nodes)}
        self.pins = sorted(pins, key=order.__getitem__)
        self._orbit: list[dict[str, str]] | None | bool = False
        self.label: dict[str, int] = {ROOT: self.intern(("L", "ROOT"))}
        for n in self.topo.nodes:
            pin = n.id if (pin_all or n.id in pins) else None
            self.label[n.id] = self.intern(("L", node_label(n), pin, tuple(sorted(marks.get(n.id, [])))))

        # what a placed card looks like, exactly as `populate` builds it
        self.model_labels: dict[str, str] = {}
        self.dev_canon: list[int] = []
        for m in self.models:
            lab = m.name
            if self.empty:
                pop = populate(self.topo, {self.empty[0]: m.name}, check=False)
                lab = node_label(pop.occupant(self.empty[0]))
            self.model_labels[m.name] = lab
            self.dev_canon.append(self.intern(("N", self.intern(("L", lab, None, ())), ())))

        # cards already in the machine that are indistinguishable from a placed one (a leaf with no
        # peer link and a placed model's label): equivalence may swap them with placed cards
        linked = {x for lk in self.topo.links for x in (lk.a, lk.b)}
        models = set(self.dev_canon)
        self.fixed_content: dict[str, int] = {}
        for s in self.topo.of_kind(Kind.slot):
            occ = self.topo.occupant(s.id)
            if occ is not None and not self.kids[occ.id] and occ.id not in linked and self.bare(occ.id) in models:
                self.fixed_content[s.id] = self.bare(occ.id)
        self.content_slots = self.empty_set | set(self.fixed_content)

        # interchangeable parts: same structure, same slot options, same constraints
        for p in self._postorder():
            parts = self.parts[p]
            for part in parts:
                vk = [self._vbare[m] for m in part.members]
                part.group = vk[0] if len(vk) == 1 else self.intern(unit_key(vk, part_edges[id(part)]))
            first: dict[int, int] = {}
            for i, part in enumerate(parts):
                first.setdefault(part.group, i)
            parts.sort(key=lambda q: first[q.group])
            if p in self.empty_set:
                self._vbare[p] = self.intern(("V", self.label[p], self.allowed[p],
                                              p if p in self.iface else None))
            else:
                self._vbare[p] = self.intern(("V", self.label[p], tuple(sorted(q.group for q in parts))))

    def _postorder(self) -> list[str]:
        out, stack = [], [(ROOT, False)]
        while stack:
            n, done = stack.pop()
            if done:
                out.append(n)
            else:
                stack.append((n, True))
                stack.extend((k, False) for k in reversed(self.kids[n]))
        return out

    def _inside(self, n: str) -> tuple[int, ...]:
        if n in self.empty_set:
            ok = set(self.allowed[n])
            vec = tuple(int(any(i in ok for i in mk)) for mk in self.masks)
            self.has_empty[n] = True
        else:
            kids = [self._inside(k) for k in self.kids[n]]
            vec = tuple(map(sum, zip(*kids))) if kids else (0,) * len(self.masks)
            self.has_empty[n] = any(self.has_empty[k] for k in self.kids[n])
        self.ins[n] = vec
        return vec

    def feasible(self, ins: tuple[int, ...], usage: Usage) -> bool:
        """Can the devices not yet placed still go into empty slots outside this part (Hall)?"""
        key = (ins, usage)
        found = self._feasible.get(key)
        if found is None:
            need = [c - u for c, u in zip(self.inv, self.vec(usage))]
            found = all(
                sum(need[i] for i in mk) <= self.total[k] - ins[k] for k, mk in enumerate(self.masks) if mk
            )
            self._feasible[key] = found
        return found

    def vec(self, u: Usage) -> list[int]:
        return [u // r % (c + 1) for r, c in zip(self.radix, self.inv)]

    def _add(self, a: Usage, b: Usage) -> Usage:
        """a + b, or -1 where that is more devices of some model than the inventory has."""
        key = a * (self.full + 1) + b
        found = self._sums.get(key)
        if found is None:
            ok = all(x + y <= c for x, y, c in zip(self.vec(a), self.vec(b), self.inv))
            found = self._sums[key] = a + b if ok else -1
        return found

    # ---- canonical keys ---------------------------------------------------------------------------
    def _node_canon(self, n: str, comp_canons: Iterable[int]) -> int:
        return self.intern(("N", self.label[n], tuple(sorted(comp_canons))))

    def _slot_canon(self, n: str, model: int | None) -> int:
        return self._node_canon(n, () if model is None else (self.dev_canon[model],))

    def _comp_canons(self, part: _Part, member_canons: list[int]) -> list[int]:
        out = []
        for comp in part.comps:
            if len(comp.members) == 1:
                out.append(member_canons[comp.members[0]])
                continue
            key = tuple(member_canons[i] for i in comp.members)
            found = comp.memo.get(key)
            if found is None:
                found = comp.memo[key] = self.intern(unit_key(key, comp.edges))
            out.append(found)
        return out

    def bare(self, n: str) -> int:
        """Canonical key of the subtree as it is now (no new devices)."""
        found = self._bare.get(n)
        if found is None:
            if n in self.empty_set:
                found = self._slot_canon(n, None)
            else:
                found = self._node_canon(n, [
                    c for part in self.parts[n] for c in self._comp_canons(part, [self.bare(m) for m in part.members])
                ])
            self._bare[n] = found
        return found

    def key_of(self, n: str, content: dict[str, int], touched: set[str]) -> int:
        """Canonical key of the subtree under `n` with `content` (slot -> device key) in its content
        slots (`touched`: the nodes above slots whose content differs from now)."""
        if n not in touched:
            return self.bare(n)
        if n in self.content_slots:
            return self._node_canon(n, (content[n],) if n in content else ())
        return self._node_canon(n, [
            c for part in self.parts[n]
            for c in self._comp_canons(part, [self.key_of(m, content, touched) for m in part.members])
        ])

    def orbit(self) -> list[dict[str, str]] | None:
        """Per place the pinned nodes can go: an automorphism of the machine without its content,
        inverted and restricted to content slots (cached; None when there are too many)."""
        if self._orbit is False:
            drop = frozenset(self.topo.occupant(s).id for s in self.fixed_content)
            graphs = StructureGraphs(self.topo, self.model_labels, drop)
            maps = pin_images(graphs, self.pins, MAX_ORBIT)
            self._orbit = None if maps is None else [
                {b: a for a, b in m.items() if b in self.content_slots} for m in maps
            ]
        return self._orbit

    def placement_key(self, placement: dict[str, int]) -> int:
        """Equal iff equivalent; with pins, only if `orbit()` is not None (else up to the pins)."""
        content = {**self.fixed_content, **{s: self.dev_canon[i] for s, i in placement.items()}}

        def key(c: dict[str, int]) -> int:
            return self.key_of(ROOT, c, {a for s in (*c, *self.fixed_content) for a in self._path(s)})

        orbit = self.orbit() if self.pinned else None
        if not orbit:
            return key(content)
        return min(key({inv[s]: c for s, c in content.items()}) for inv in orbit)

    def dedup(self, reps: list[dict[str, str]]) -> list[dict[str, str]]:
        """Merge candidates that are equivalent only by moving pinned nodes (first one kept)."""
        if self.orbit() is None:
            return dedup_isomorphic(self.graphs(), reps)
        seen: set[int] = set()
        out = []
        for pl in reps:
            k = self.placement_key({s: self.index[m] for s, m in pl.items()})
            if k not in seen:
                seen.add(k)
                out.append(pl)
        return out

    # ---- enumeration ------------------------------------------------------------------------------
    def table(self, n: str) -> dict[tuple[int, State], tuple[Usage, Rep]]:
        """One representative per (canonical key, open-constraint state) of the subtree under `n`."""
        found = self._tables.get(n)
        if found is None:
            found = self._tables[n] = self._table(n)
        return found

    def _table(self, n: str) -> dict[tuple[int, State], tuple[Usage, Rep]]:
        if not self.has_empty[n]:
            return {(self.bare(n), ()): (self.zero, ())}
        ins = self.ins[n]
        if n in self.empty_set:
            out: dict[tuple[int, State], tuple[Usage, Rep]] = {}
            open_end = n in self.iface
            if self.feasible(ins, self.zero):
                out[(self._slot_canon(n, None), ((n, 0),) if open_end else ())] = (self.zero, ())
            for i in self.allowed[n]:
                u = self.radix[i]
                if self.inv[i] and self.feasible(ins, u):
                    st = ((n, 2 if self.models[i].double_width else 1),) if open_end else ()
                    out[(self._slot_canon(n, i), st)] = (u, ((n, i),))
            return out
        parts = self.parts[n]
        same = [i > 0 and parts[i].group == parts[i - 1].group for i in range(len(parts))]
        checks = self.check_at.get(n, [])
        iface = self.iface.get(n, set())

        def finish(canons: list[int], state: State, rep: Rep) -> Hashable | None:
            if checks:
                val = dict(state)
                if any(val[a] == 2 and val[b] for a, b in checks):
                    return None
            return (self._node_canon(n, canons), tuple(sorted(p for p in state if p[0] in iface)))

        return self._combine([self._part_entries(p) for p in parts], same, ins, finish)

    def _part_entries(self, part: _Part) -> list[Entry]:
        """Distinct fillings of a part, keyed by its components' canonical keys, in descending order.

        Interchangeable parts get equal lists, so the search takes non-decreasing positions in them
        (multisets); descending order puts the later-seen, usually fuller, fillings first.
        """
        if len(part.members) == 1:
            tab = self.table(part.members[0])
            return sorted((((c,), st, u, r) for (c, st), (u, r) in tab.items()), reverse=True)
        member_entries = [
            [((c,), st, u, r) for (c, st), (u, r) in sorted(self.table(m).items())] for m in part.members
        ]
        dyn = part.dyn

        def finish(canons: list[int], state: State, rep: Rep) -> Hashable | None:
            if dyn:
                occ = dict(rep)
                if any(a in occ and b in occ and self.models[occ[a]].double_width for a, b in dyn):
                    return None
            return (tuple(sorted(self._comp_canons(part, canons))), state)

        ins = tuple(map(sum, zip(*(self.ins[m] for m in part.members))))
        tab = self._combine(member_entries, [False] * len(part.members), ins, finish)
        return sorted(((k, st, u, r) for (k, st), (u, r) in tab.items()), reverse=True)

    def _combine(self, entries: list[list[Entry]], same: list[bool], ins: tuple[int, ...],
                 finish: Callable[[list[int], State, Rep], Hashable | None]) -> dict:
        """Distinct fillings of a node (or unit) from its parts' fillings, keyed by `finish`.

        A part marked `same` is interchangeable with the one before it, so it only takes entries at
        or after that one's position: each multiset once. The last part only looks at the usages
        that leave the rest of the machine able to take what is left.
        """
        out: dict = {}
        k = len(entries)
        if not k:
            if self.feasible(ins, self.zero):
                out[finish([], (), ())] = (self.zero, ())
            return out
        canons: list[int] = []
        last: dict[Usage, list[tuple[int, Entry]]] = {}
        for idx, e in enumerate(entries[-1]):
            last.setdefault(e[2], []).append((idx, e))
        fits_last: dict[Usage, list[tuple[Usage, list[tuple[int, Entry]]]]] = {}

        def rec(i: int, lo: int, usage: Usage, state: State, rep: Rep) -> None:
            if i == k - 1:
                start = lo if same[i] else 0
                options = fits_last.get(usage)
                if options is None:
                    options = fits_last[usage] = [
                        (nu, ents) for u, ents in last.items()
                        if (nu := self._add(usage, u)) >= 0 and self.feasible(ins, nu)
                    ]
                for nu, ents in options:
                    for idx, (c, st, _, r) in ents:
                        if idx < start:
                            continue
                        canons.extend(c)
                        key = finish(canons, state + st, rep + r)
                        del canons[len(canons) - len(c):]
                        if key is not None and key not in out:
                            out[key] = (nu, rep + r)
                return
            ents = entries[i]
            for idx in range(lo if same[i] else 0, len(ents)):
                c, st, u, r = ents[idx]
                nu = self._add(usage, u)
                if nu < 0:
                    continue
                canons.extend(c)
                rec(i + 1, idx, nu, state + st, rep + r)
                del canons[len(canons) - len(c):]

        rec(0, 0, self.zero, (), ())
        return out

    def _top(self) -> dict:
        """The root's fillings; their keys are only used to tell them apart.

        When the sockets form one unit (UPI) and no filling of one socket is a filling of another,
        no two combinations can be isomorphic, so the unit's canonical key need not be computed.
        """
        parts = self.parts[ROOT]
        if len(parts) == 1 and len(parts[0].members) > 1:
            part = parts[0]
            tabs = [self.table(m) for m in part.members]
            canon_sets = [{c for c, _ in t} for t in tabs]
            if sum(map(len, canon_sets)) == len(set().union(*canon_sets)):
                checks = part.dyn + self.check_at.get(ROOT, [])

                def finish(canons: list[int], state: State, rep: Rep) -> Hashable | None:
                    occ = dict(rep) if checks else {}
                    if any(a in occ and b in occ and self.models[occ[a]].double_width for a, b in checks):
                        return None
                    return tuple(canons)

                return self._combine(
                    [[((c,), st, u, r) for (c, st), (u, r) in sorted(t.items())] for t in tabs],
                    [False] * len(tabs), self.ins[ROOT], finish,
                )
        return self.table(ROOT)

    def enumerate(self) -> list[dict[str, str]]:
        """Representatives, ordered by occupant per slot in topology order."""
        names = [m.name for m in self.models]
        none, order = len(self.models), self.slot_order
        keys = []
        for u, rep in self._top().values():
            if u == self.full:
                key = [none] * len(self.empty)
                for s, i in rep:
                    key[order[s]] = i
                keys.append(key)
        keys.sort()
        return [{self.empty[j]: names[i] for j, i in enumerate(key) if i != none} for key in keys]

    def graphs(self) -> StructureGraphs:
        return StructureGraphs(self.topo, self.model_labels)

    # ---- counting ---------------------------------------------------------------------------------
    def count(self) -> int:
        """Number of valid placements, by a DP over (usage, occupancy of open constraint ends)."""
        return sum(c for (u, _), c in self._count(ROOT).items() if u == self.full)

    def _count(self, n: str) -> dict[tuple[Usage, State], int]:
        if not self.has_empty[n]:
            return {(self.zero, ()): 1}
        ins = self.ins[n]
        iface = self.count_iface.get(n, set())
        if n in self.empty_set:
            out: dict[tuple[Usage, State], int] = {}
            if self.feasible(ins, self.zero):
                out[(self.zero, ((n, 0),) if n in iface else ())] = 1
            for i in self.allowed[n]:
                u = self.radix[i]
                if self.inv[i] and self.feasible(ins, u):
                    val = 2 if self.models[i].double_width else 1
                    out[(u, ((n, val),) if n in iface else ())] = 1
            return out
        acc: dict[tuple[Usage, State], int] = {(self.zero, ()): 1}
        for k in self.kids[n]:
            if not self.has_empty[k]:
                continue
            child = self._count(k).items()
            nxt: dict[tuple[Usage, State], int] = {}
            for (u1, s1), c1 in acc.items():
                for (u2, s2), c2 in child:
                    u = self._add(u1, u2)
                    if u >= 0:
                        key = (u, s1 + s2)
                        nxt[key] = nxt.get(key, 0) + c1 * c2
            acc = nxt
        checks = self.count_check_at.get(n, [])
        out = {}
        for (u, st), c in acc.items():
            if not self.feasible(ins, u):
                continue
            if checks:
                val = dict(st)
                if any(val[a] == 2 and val[b] for a, b in checks):
                    continue
            key = (u, tuple(sorted(p for p in st if p[0] in iface)))
            out[key] = out.get(key, 0) + c
        return out

    # ---- errors -----------------------------------------------------------------------------------
    def check_capacity(self) -> None:
        """Raise MomentError naming what does not fit, before any search."""
        name = self.topo.name
        for i, m in enumerate(self.models):
            have = sum(1 for s in self.empty if i in self.allowed[s])
            if have < self.inv[i]:
                dw = ", double-width" if m.double_width else ""
                raise MomentError(
                    f"{self.inv[i]} x {m.name} ({m.kind.value}, x{m.lanes}{dw}) need {self.inv[i]} free slots "
                    f"that accept a {m.kind.value} and are at least x{m.lanes} wide; {name} has {have}"
                )
        for k, mk in enumerate(self.masks):
            need = sum(self.inv[i] for i in mk)
            if len(mk) > 1 and need > self.total[k]:
                what = " + ".join(f"{self.inv[i]} x {self.models[i].name}" for i in mk if self.inv[i])
                raise MomentError(
                    f"{what} need {need} free slots between them; {name} has {self.total[k]} that take any of them"
                )
        dw = [i for i, m in enumerate(self.models) if m.double_width and self.inv[i]]
        want = sum(self.inv[i] for i in dw)
        if not want:
            return
        cand = [s for s in self.empty if any(i in self.allowed[s] for i in dw)]
        g = nx.Graph()
        g.add_nodes_from(cand)
        g.add_edges_from((a, b) for a, b in self.dyn if a in g and b in g)
        best = 0
        for comp in nx.connected_components(g):
            if len(comp) > 40:
                return  # too big to solve exactly here; the search will say whether it fits
            best += len(nx.max_weight_clique(nx.complement(g.subgraph(comp)), weight=None)[0])
        if best < want:
            kinds = {self.models[i].kind for i in dw}
            noun = f"{kinds.pop().value.upper()}s" if len(kinds) == 1 else "cards"
            lanes = min(self.models[i].lanes for i in dw)
            raise MomentError(
                f"{want} double-width {noun} need {want} free x{lanes} slots that don't block each other; "
                f"{name} has {best}"
            )
