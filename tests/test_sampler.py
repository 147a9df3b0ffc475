"""Neighbour sampler and seed batches: correctness on random CSR graphs, determinism, edge cases."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moment.workload.sampler import CSRGraph, NeighborSampler, SeedBatches


def csr(rows: list[list[int]]) -> CSRGraph:
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    indices = np.array([x for r in rows for x in r], dtype=np.int32)
    return CSRGraph.from_arrays(indptr, indices)


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[int]]:
    n = draw(st.integers(1, 30))
    rows = [sorted(draw(st.sets(st.integers(0, n - 1), max_size=12))) for _ in range(n)]
    seeds = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    fanouts = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    return rows, seeds, fanouts


def check_batch(rows: list[list[int]], seeds: list[int], fanouts: list[int], mb) -> None:
    n_id = mb.n_id.tolist()
    assert n_id[: len(seeds)] == seeds  # seeds first, in order
    assert len(set(n_id)) == len(n_id)  # de-duplicated
    assert sum(mb.num_sampled_nodes) == len(n_id)
    assert sum(mb.num_sampled_edges) == mb.edge_index.shape[1]
    src, dst = mb.edge_index.tolist()
    node_off = np.cumsum([0, *mb.num_sampled_nodes]).tolist()
    edge_off = np.cumsum([0, *mb.num_sampled_edges]).tolist()
    for hop, f in enumerate(fanouts):
        lo, hi = node_off[hop], node_off[hop + 1]  # this hop's targets (local ids)
        per: dict[int, list[int]] = {t: [] for t in range(lo, hi)}
        for e in range(edge_off[hop], edge_off[hop + 1]):
            assert lo <= dst[e] < hi
            assert src[e] < node_off[hop + 2]  # neighbours are known by the end of this hop
            per[dst[e]].append(n_id[src[e]])
        for t, nb in per.items():
            g = n_id[t]
            assert len(nb) == min(f, len(rows[g]))  # count = min(fanout, degree)
            assert len(set(nb)) == len(nb)  # without replacement
            assert set(nb) <= set(rows[g])  # every sampled edge exists
        # new nodes of this hop are exactly the unseen neighbours, in first-seen order
        seen, new = set(n_id[:hi]), []
        for e in range(edge_off[hop], edge_off[hop + 1]):
            v = n_id[src[e]]
            if v not in seen:
                seen.add(v)
                new.append(v)
        assert n_id[hi : node_off[hop + 2]] == new


@settings(max_examples=60, deadline=None)
@given(graphs(), st.integers(0, 3), st.sampled_from(["map", "unique"]))
def test_sampler_properties(g, seed: int, dedup: str) -> None:
    rows, seeds, fanouts = g
    s = NeighborSampler(csr(rows), fanouts, seed=seed, dedup=dedup)
    mb = s.sample(seeds)
    check_batch(rows, seeds, fanouts, mb)
    mb2 = s.sample(seeds)  # the dense map was reset correctly: still a valid batch
    check_batch(rows, seeds, fanouts, mb2)
    again = NeighborSampler(csr(rows), fanouts, seed=seed, dedup="unique" if dedup == "map" else "map").sample(seeds)
    assert torch.equal(mb.n_id, again.n_id) and torch.equal(mb.edge_index, again.edge_index)


def test_deterministic_and_seed_dependent() -> None:
    rng = np.random.default_rng(0)
    rows = [sorted(set(rng.integers(0, 500, 40).tolist())) for _ in range(500)]
    seeds = list(range(0, 500, 7))
    a = NeighborSampler(csr(rows), [5, 3], seed=1).sample(seeds)
    b = NeighborSampler(csr(rows), [5, 3], seed=1).sample(seeds)
    c = NeighborSampler(csr(rows), [5, 3], seed=2).sample(seeds)
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    assert not torch.equal(a.edge_index, c.edge_index)


def test_floyd_is_uniform() -> None:
    """deg 5, fanout 2: all 10 pairs about equally likely."""
    s = NeighborSampler(csr([[1, 2, 3, 4, 5]] + [[]] * 5), [2], seed=0)
    counts = Counter()
    for _ in range(200):
        sel = s._floyd(torch.full((100,), 5, dtype=torch.int64), 2)
        counts.update(map(tuple, sel.tolist()))
    assert set(counts) == set(combinations(range(5), 2))
    assert max(counts.values()) / min(counts.values()) < 1.25  # 20000 draws, 2000 expected each


def test_isolated_and_hub_nodes() -> None:
    n = 20_001
    rows = [list(range(1, n))] + [[] for _ in range(n - 1)]  # node 0 has 20000 in-neighbours
    rows[5] = [0]
    g = csr(rows)
    s = NeighborSampler(g, [25, 10], seed=0)
    mb = s.sample([0, 7, 5])  # hub, isolated, a node pointing to the hub
    check_batch(rows, [0, 7, 5], [25, 10], mb)
    assert mb.num_sampled_edges[0] == 25 + 0 + 1
    iso = s.sample([7])
    assert iso.n_id.tolist() == [7] and iso.num_sampled_edges == [0, 0] and iso.edge_index.shape == (2, 0)


def test_blocks_feed_pyg_layers() -> None:
    from torch_geometric.nn import SAGEConv

    rng = np.random.default_rng(3)
    rows = [sorted(set(rng.integers(0, 200, 8).tolist())) for _ in range(200)]
    mb = NeighborSampler(csr(rows), [4, 3], seed=0).sample(list(range(10)))
    blocks = mb.blocks()
    assert [b.num_dst for b in blocks] == [sum(mb.num_sampled_nodes[:2]), 10]
    assert blocks[0].num_src == mb.num_nodes
    x = torch.randn(mb.num_nodes, 6)
    layers = [SAGEConv(6, 8), SAGEConv(8, 3)]
    for layer, b in zip(layers, blocks, strict=True):
        x = layer((x[: b.num_src], x[: b.num_dst]), b.edge_index, size=(b.num_src, b.num_dst))
    assert x.shape == (10, 3)


def test_sampler_rejects_bad_input() -> None:
    g = csr([[1], [0]])
    with pytest.raises(ValueError, match="distinct"):
        NeighborSampler(g).sample([0, 0])
    with pytest.raises(ValueError, match="range"):
        NeighborSampler(g).sample([2])
    with pytest.raises(ValueError, match="positive"):
        NeighborSampler(g, [0])


def test_memmap_graph(tmp_path) -> None:
    from moment.workload.synth import synthesize

    ds = synthesize(tmp_path / "g", 3000, feature_dim=4)
    a = NeighborSampler(CSRGraph.from_dataset(ds, in_memory=False), seed=0).sample(ds.train_idx[:50])
    b = NeighborSampler(CSRGraph.from_dataset(ds), seed=0).sample(ds.train_idx[:50])
    assert torch.equal(a.n_id, b.n_id)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 5), st.integers(0, 2))
def test_seed_batches_split_ranks(n: int, batch: int, world: int, epoch: int) -> None:
    seeds = np.arange(1000, 1000 + n)
    per = [SeedBatches(seeds, batch, seed=9, rank=r, world_size=world) for r in range(world)]
    shares = [p.share(epoch) for p in per]
    assert all(len(s) == n // world for s in shares)  # equal
    allx = torch.cat(shares).tolist()
    assert len(set(allx)) == len(allx) and set(allx) <= set(seeds.tolist())  # disjoint, from the seeds
    assert len({len(p) for p in per}) == 1  # same number of batches on every rank
    batches = list(per[0].epoch(epoch))
    assert len(batches) == len(per[0]) and all(len(b) <= batch for b in batches)
    assert torch.cat(batches).tolist() == shares[0].tolist() if batches else True
    assert torch.equal(SeedBatches(seeds, batch, seed=9, rank=0, world_size=world).share(epoch), shares[0])


def test_seed_batches_reshuffle_and_drop_last() -> None:
    sb = SeedBatches(np.arange(100), 30, seed=1)
    assert not torch.equal(sb.share(0), sb.share(1))
    assert len(sb) == 4 and len(SeedBatches(np.arange(100), 30, drop_last=True)) == 3
    assert SeedBatches(np.arange(10), 3, shuffle=False).share(5).tolist() == list(range(10))
    with pytest.raises(ValueError):
        SeedBatches(np.arange(10), 3, rank=2, world_size=2)
