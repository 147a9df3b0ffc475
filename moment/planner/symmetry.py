"""Canonical forms: when two placements describe the same machine.

Two placements are *equivalent* when the populated machines are isomorphic as attributed graphs:
the PCIe tree with every node's physical attributes (slot width, accepted kinds, board, uplink
gen/width/bandwidth, socket DRAM, device model and figures, ...) and the peer links (UPI, NVLink,
...). Names (ids, labels, bus addresses, NUMA numbers) do not count, and neither does `blocks`:
which empty slot a card happens to cover changes no link, so it only decides which placements are
valid (the search's business), not which valid ones are alike. Equivalent placements give the same
capacity graph up to renaming, so the planner evaluates one of them.

Canonisation is bottom-up (AHU): a node's key is its label plus the sorted keys of its children,
interned to small integers so that comparing and hashing stay cheap. Siblings joined by peer links
form a unit whose key (`unit_key`) is minimised over member orders; a peer link between nodes under
different parents *pins* both ends (the id joins the label), which is sound but can miss a
symmetry, so `dedup_isomorphic` then merges what is left with a full isomorphism test.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Sequence
from itertools import chain, groupby, permutations, product
from typing import TYPE_CHECKING

from moment.topology.model import PeerLink, Topology

# Imports inside functions: a solver's or renderer's library (networkx, OR-Tools, SciPy, matplotlib) loads
# only when it is used.

if TYPE_CHECKING:  # networkx is imported where a graph is built: only the fallbacks need it
    import networkx as nx

#: Fields that name a node rather than describe it (`blocks` is no link; `link` is labelled apart).
COSMETIC = frozenset({"id", "label", "parent", "pci", "numa", "designation", "blocks", "link"})

#: A compound unit larger than this is pinned instead of canonised by trying member orders.
MAX_UNIT = 6


def node_label(node) -> str:
    """The attributes of a node (and of its uplink) that make it physically what it is."""
    d = node.model_dump(mode="json", exclude=COSMETIC)
    if "accepts" in d:
        d["accepts"] = sorted(set(d["accepts"]))
    link = None if node.link is None else node.link.model_dump(mode="json", exclude={"label"})
    return json.dumps([d, link], sort_keys=True, separators=(",", ":"))


def peer_label(link: PeerLink) -> str:
    return json.dumps(link.model_dump(mode="json", exclude={"a", "b", "label"}), sort_keys=True)


class Interner:
    """Maps hashable keys to dense integers (first come, first numbered: deterministic)."""

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def __call__(self, key: Hashable) -> int:
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._ids)
        return found


def unit_key(canons: Sequence[int], edges: Sequence[tuple[int, int, int, bool]]) -> tuple:
    """Canonical key of a compound unit: its members' keys and the edges among them.

    `edges` are (member i, member j, edge label, directed). Members are put in key order and the
    edge list is minimised over the orders of members with equal keys, so two units get the same
    key iff some member bijection preserves keys and edges.
    """
    order = sorted(range(len(canons)), key=canons.__getitem__)

    def encode(members: Iterable[int]) -> tuple:
        pos = {m: p for p, m in enumerate(members)}
        return tuple(sorted(
            (pos[a], pos[b], lab) if directed or pos[a] <= pos[b] else (pos[b], pos[a], lab)
            for a, b, lab, directed in edges
        ))

    if len(set(canons)) == len(canons):  # the usual case: one order only
        best = encode(order)
    else:
        blocks = [list(g) for _, g in groupby(order, key=canons.__getitem__)]
        best = min(encode(chain.from_iterable(c)) for c in product(*(permutations(b) for b in blocks)))
    return ("U", tuple(canons[i] for i in order), best)


class StructureGraphs:
    """The populated machine as a networkx graph, for the exact fallback dedup.

    Peer links become small labelled nodes between their ends, so parallel links survive in a
    simple graph.
    """

    def __init__(self, topo: Topology, model_labels: dict[str, str], drop: frozenset[str] = frozenset()):
        import networkx as nx

        self.model_labels = model_labels
        g = nx.Graph()
        for n in topo.nodes:
            if n.id not in drop:
                g.add_node(n.id, l=node_label(n))
        for n in topo.nodes:
            if n.parent is not None and n.id not in drop:
                g.add_edge(n.id, n.parent, l="tree")
        for i, lk in enumerate(topo.links):
            x = ("peer", i)
            g.add_node(x, l=peer_label(lk))
            g.add_edge(x, lk.a, l="end")
            g.add_edge(x, lk.b, l="end")
        self.base = g
        # enough refinement rounds for colours to travel from a device up to a socket and back down
        depth = {n.id: len(topo.ancestors(n.id)) for n in topo.nodes}
        self.iterations = 2 * (max(depth.values(), default=0) + 2) + 2

    def graph(self, placement: dict[str, str]) -> nx.Graph:
        g = self.base.copy()
        for slot_id, model in placement.items():
            g.add_node(("dev", slot_id), l=self.model_labels[model])
            g.add_edge(("dev", slot_id), slot_id, l="tree")
        return g


def _same(a: dict, b: dict) -> bool:
    return a["l"] == b["l"]


def _refine(g: nx.Graph, iterations: int) -> str:
    """Colour refinement (WL): each node gets its final colour in "c"; returns the graph's hash.

    Any isomorphism maps nodes to nodes of the same colour, so matching colours (not just labels)
    keeps VF2 from wandering through the many equal empty slots of a symmetric machine.
    """
    import networkx as nx

    colours = nx.weisfeiler_lehman_subgraph_hashes(g, node_attr="l", edge_attr="l", iterations=iterations)
    for n, hs in colours.items():
        g.nodes[n]["c"] = hs[-1]
    return "|".join(sorted(hs[-1] for hs in colours.values()))


def _same_colour(a: dict, b: dict) -> bool:
    return a["c"] == b["c"]


def iso_classes(graphs: StructureGraphs, placements: Sequence[dict[str, str]]) -> list[int]:
    """For each placement, the index of the first placement isomorphic to it."""
    import networkx as nx

    out: list[int] = []
    buckets: dict[str, list[tuple[int, nx.Graph]]] = {}
    for i, pl in enumerate(placements):
        g = graphs.graph(pl)
        bucket = buckets.setdefault(_refine(g, graphs.iterations), [])
        match = next(
            (j for j, o in bucket if nx.is_isomorphic(g, o, node_match=_same_colour, edge_match=_same)), None
        )
        if match is None:
            bucket.append((i, g))
            match = i
        out.append(match)
    return out


def pin_images(graphs: StructureGraphs, pins: Sequence[Hashable], limit: int) -> list[dict] | None:
    """One automorphism of the bare machine per place the pinned nodes can go (as a tuple).

    Pinned canonical keys are exact up to automorphisms that fix the pins; taking the least key
    over these automorphisms makes them exact up to all of them (None: more than `limit` images).
    """
    import networkx as nx

    g1 = graphs.base.copy()
    _refine(g1, graphs.iterations)
    by_colour: dict[str, list] = {}
    for n, c in g1.nodes(data="c"):
        by_colour.setdefault(c, []).append(n)
    cands = [by_colour[g1.nodes[p]["c"]] for p in pins]
    size = 1
    for c in cands:
        size *= len(c)
    if size > limit:
        return None
    for i, p in enumerate(pins):
        g1.nodes[p]["pin"] = i
    out = []
    for image in product(*cands):
        if len(set(image)) < len(image):
            continue
        g2 = graphs.base.copy()
        for n, c in g1.nodes(data="c"):
            g2.nodes[n]["c"] = c
        for i, q in enumerate(image):
            g2.nodes[q]["pin"] = i
        gm = nx.isomorphism.GraphMatcher(g1, g2, node_match=_same_pin, edge_match=_same)
        found = next(gm.isomorphisms_iter(), None)
        if found is not None:
            out.append(found)
    return out


def _same_pin(a: dict, b: dict) -> bool:
    return a["c"] == b["c"] and a.get("pin") == b.get("pin")


def dedup_isomorphic(graphs: StructureGraphs, placements: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """Keep the first placement of each isomorphism class."""
    return [pl for i, (pl, c) in enumerate(zip(placements, iso_classes(graphs, placements))) if c == i]
