"""The sampler's C loops (native/sampling.c) against its torch path, the spec: the same batches bit for bit
from the same seed, over random graphs, batch after batch (the generator's stream stays in step), and the
C loops' own checks of what they are handed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moment.workload import batch_bytes
from moment.workload.links import LinkNeighborSampler
from moment.workload.sampler import CSRGraph, NeighborSampler

_native = batch_bytes.native_sampling()
pytestmark = pytest.mark.skipif(_native is None, reason="the sampler's C extension is not built (pip install -e .)")


def random_graph(rng: np.random.Generator, n: int, max_deg: int, index_dtype) -> CSRGraph:
    """Degrees from isolated to hubs (a few nodes get `max_deg`), neighbours uniform, each row sorted."""
    deg = rng.integers(0, max_deg // 4 + 1, n)
    deg[rng.choice(n, max(1, n // 50), replace=False)] = max_deg
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = np.concatenate([np.sort(rng.choice(n, d, replace=d > n)) for d in deg]).astype(index_dtype)
    return CSRGraph.from_arrays(indptr, indices)


def same_batches(graph: CSRGraph, fanouts: list[int], seeds: list[torch.Tensor], sampler_seed: int, **kw) -> None:
    native = NeighborSampler(graph, fanouts, seed=sampler_seed, **kw)
    spec = NeighborSampler(graph, fanouts, seed=sampler_seed, native=False, **kw)
    assert native.native and not spec.native
    for s in seeds:
        a, b = native.sample(s), spec.sample(s)
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
        assert a.num_sampled == b.num_sampled
        assert all(torch.equal(x, y) for x, y in zip(a.targets_per_hop, b.targets_per_hop, strict=True))
    assert torch.equal(native.generator.get_state(), spec.generator.get_state())  # as many draws on both


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), max_deg=st.integers(1, 90), fanouts=st.lists(st.integers(1, 80), min_size=1, max_size=3),
       wide=st.booleans(), seed=st.integers(0, 2**16), dedup=st.sampled_from(["map", "unique"]))
def test_the_c_loops_sample_what_the_torch_path_samples(n, max_deg, fanouts, wide, seed, dedup):
    """Fan-outs below, at and above the degrees (some above 64: the C sort's other branch), isolated nodes and
    hubs, int32 and int64 neighbour ids, both de-duplications, several batches in a row."""
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, n, max_deg, np.int64 if wide else np.int32)
    batches = [torch.from_numpy(rng.choice(n, int(rng.integers(1, n + 1)), replace=False)) for _ in range(3)]
    same_batches(graph, fanouts, batches, seed, dedup=dedup)


def test_a_large_batch_on_a_power_law_graph_is_the_same():
    """The size the bench samples (1,024 seeds, fan-outs 25 and 10) on a skewed graph of 200,000 nodes."""
    rng = np.random.default_rng(7)
    n = 200_000
    deg = np.minimum(rng.zipf(1.8, n), 5000)
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    indices = rng.integers(0, n, int(indptr[-1]), dtype=np.int64).astype(np.int32)
    graph = CSRGraph.from_arrays(indptr, indices)  # rows unsorted and with repeats: slots, not ids, are drawn
    seeds = [torch.from_numpy(rng.choice(n, 1024, replace=False)) for _ in range(4)]
    same_batches(graph, [25, 10], seeds, 3)
    # the loops' prefetch distance changes no batch: none, one item on, beyond a hop's targets
    ahead = _native.prefetch()
    try:
        for n_ahead in (0, 1, 1024):
            _native.prefetch(n_ahead)
            same_batches(graph, [25, 10], seeds[:2], 3)
    finally:
        _native.prefetch(ahead)
    assert _native.prefetch() == ahead > 0
    for bad in (-1, 1025):
        with pytest.raises(ValueError, match="ahead must be"):
            _native.prefetch(bad)
    assert _native.prefetch(None) == ahead


def test_link_batches_are_the_same():
    rng = np.random.default_rng(5)
    graph = random_graph(rng, 300, 40, np.int32)
    seeds = torch.from_numpy(rng.choice(300, 64, replace=False))
    a, b = LinkNeighborSampler(graph, [5, 3], 2, seed=1), LinkNeighborSampler(graph, [5, 3], 2, seed=1)
    b.nodes.native = False
    b.nodes._map = None
    for _ in range(3):
        x, y = a.sample(seeds), b.sample(seeds)
        assert torch.equal(x.n_id, y.n_id) and torch.equal(x.edge_index, y.edge_index)
        assert torch.equal(x.edge_label_index, y.edge_label_index) and torch.equal(x.edge_label, y.edge_label)


def test_the_node_table_is_what_the_memory_budget_charges():
    """The C loops keep one int32 per node; the torch path two (its first-occurrence table beside it)."""
    graph = random_graph(np.random.default_rng(0), 1000, 10, np.int32)
    for native in (True, False):
        s = NeighborSampler(graph, [3], native=native)
        s.sample(torch.arange(10))
        assert s._map.nbytes == batch_bytes.map_bytes(1000, native) == (4 if native else 8) * 1000
    assert NeighborSampler.map_bytes(1000) == 4000


def test_the_c_loops_refuse_what_would_read_or_write_outside_their_arrays():
    """Each check names the array and the entry; a refused de-duplication leaves the table as it was."""
    indptr = np.array([0, 2, 3, 3], np.int64)
    indices = np.array([1, 2, 0], np.int32)
    start, deg = np.empty(2, np.int64), np.empty(2, np.int64)
    with pytest.raises(IndexError, match="target 3 is not a node of the graph"):
        _native.prepare(indptr, np.array([0, 3], np.int64), 2, start, deg)
    with pytest.raises(ValueError, match="must be int64"):
        _native.prepare(indptr, np.array([0, 1], np.int32), 2, start, deg)
    out = np.empty(4, np.int64)
    with pytest.raises(IndexError, match="outside the 3 of indices"):
        _native.fill(indices, np.array([2], np.int64), np.array([2], np.int64), 2, np.empty(0), out, out.copy())
    with pytest.raises(ValueError, match="uniforms needed"):  # a partial target with no uniforms handed in
        _native.fill(indices, np.array([0], np.int64), np.array([2], np.int64), 1, np.empty(0), out, out.copy())
    local = np.full(4, -1, np.int32)
    loc, new = np.empty(3, np.int64), np.empty(3, np.int64)
    with pytest.raises(IndexError, match="node 9 is not in the table of 4 nodes"):
        _native.dedup(local, np.array([1, 2, 9], np.int64), 0, loc, new)
    assert (local == -1).all()  # the ids it had added before the bad one went back
    assert _native.dedup(local, np.array([3, 1, 3], np.int64), 5, loc, new) == 2
    assert loc.tolist() == [5, 6, 5] and new[:2].tolist() == [3, 1]
    with pytest.raises(IndexError, match="node -1 is not in the table"):
        _native.clear(local, np.array([3, -1], np.int64))
    _native.clear(local, np.array([3, 1], np.int64))
    assert (local == -1).all()
