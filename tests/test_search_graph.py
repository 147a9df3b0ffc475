"""The search's own graph helpers (`moment.planner.search.graph`) against networkx on random graphs:
connected components, and the largest set of slots whose double-width cards do not block each other."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from moment.planner.search.graph import components, independent_set_size


def _graphs(seed: int, count: int, most: int):
    rnd = random.Random(seed)
    for _ in range(count):
        n = rnd.randint(0, most)
        p = rnd.choice((0.05, 0.15, 0.3, 0.6))
        nodes = [f"s{i}" for i in range(n)]
        edges = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:] if rnd.random() < p]
        yield nodes, edges


@pytest.mark.parametrize("seed", range(3))
def test_components_are_networkx_components(seed):
    for nodes, edges in _graphs(seed, 60, 30):
        g = nx.Graph()
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        ours = components(nodes, edges)
        assert sorted(map(sorted, ours)) == sorted(map(sorted, nx.connected_components(g)))
        # in the order of their first node
        assert [min(c, key=nodes.index) for c in ours] == sorted((min(c, key=nodes.index) for c in ours),
                                                                  key=nodes.index)


@pytest.mark.parametrize("seed", range(3))
def test_independent_set_size_is_networkx_max_clique_of_the_complement(seed):
    for nodes, edges in _graphs(seed, 40, 16):
        g = nx.Graph()
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        want = len(nx.max_weight_clique(nx.complement(g), weight=None)[0]) if nodes else 0
        assert independent_set_size(nodes, edges) == want, (nodes, edges)


def test_paths_and_cycles():
    path = [(i, i + 1) for i in range(6)]  # 7 nodes
    assert independent_set_size(range(7), path) == 4
    assert independent_set_size(range(7), path + [(6, 0)]) == 3  # a 7-cycle
    assert independent_set_size(range(6), [(i, (i + 1) % 6) for i in range(6)]) == 3
    assert independent_set_size(range(3), [(0, 1), (1, 2), (2, 0)]) == 1
    assert independent_set_size(range(4), []) == 4
