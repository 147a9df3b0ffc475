"""The two small graph questions the search asks, answered without networkx (which takes a fifth of a
second to import, longer than planning a small machine takes): connected components, and the largest
set of nodes no two of which are joined (double-width cards that do not block each other)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable


def components(nodes: Iterable[Hashable], edges: Iterable[tuple[Hashable, Hashable]]) -> list[set]:
    """The connected components of the graph, in the order of their first node in `nodes` (an edge
    end that is not in `nodes` is added after them)."""
    parent: dict = {}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x in nodes:
        parent.setdefault(x, x)
    for a, b in edges:
        ra, rb = root(parent.setdefault(a, a)), root(parent.setdefault(b, b))
        if ra != rb:
            parent[rb] = ra
    out: dict = {}
    for x in parent:
        out.setdefault(root(x), set()).add(x)
    return list(out.values())


def independent_set_size(nodes: Iterable[Hashable], edges: Iterable[tuple[Hashable, Hashable]]) -> int:
    """The most nodes of which no two are joined by an edge (exact; exponential in the worst case, so
    for small graphs). Branches on a node of highest degree: leave it out, or take it and drop its
    neighbours; a graph with no edge left takes every node."""
    adj: dict = {x: set() for x in nodes}
    for a, b in edges:
        if a != b:
            adj.setdefault(a, set()).add(b)
            adj.setdefault(b, set()).add(a)

    def best(alive: frozenset) -> int:
        degree = {x: len(adj[x] & alive) for x in alive}
        v = max(alive, key=lambda x: (degree[x], repr(x)), default=None)
        if v is None or degree[v] == 0:
            return len(alive)
        if degree[v] <= 2 and all(d <= 2 for d in degree.values()):
            return _paths_and_cycles(alive, adj)
        return max(best(alive - {v}), 1 + best(alive - {v} - adj[v]))

    return best(frozenset(adj))


def _paths_and_cycles(alive: frozenset, adj: dict) -> int:
    """Every node has at most two neighbours: the components are paths and cycles, whose largest
    independent sets are ceil(n / 2) and floor(n / 2)."""
    total = 0
    for comp in components(alive, ((a, b) for a in alive for b in adj[a] & alive)):
        n = len(comp)
        edges = sum(len(adj[x] & comp) for x in comp) // 2
        total += n // 2 if edges == n and n > 2 else (n + 1) // 2
    return total
