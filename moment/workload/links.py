"""Link-prediction batches: label edges drawn from a batch of seed nodes, their endpoints' neighbourhood
sampled by `NeighborSampler` (the same code, the same generator).

Why from seed nodes: a link batch reuses the node batches (`SeedBatches`: the per-rank shares, the
pipeline's batch order and seeding, the memory budget's batch extent) unchanged; only what a batch holds
differs.

Semantics of `LinkNeighborSampler.sample(seeds)` (every draw from the sampler's `generator`, in this
order, so a batch is a pure function of the seeds and the generator's seed):

* Positives: for each seed v with in-degree > 0, in seed order, one edge u -> v with u uniform over v's
  CSR row (row v holds v's in-neighbours, so the edge exists). A seed without an in-neighbour gives none.
* Negatives: for each positive u -> v, `negatives` edges u -> w, w uniform over all nodes (the
  destination corrupted). Not filtered, as PyG's are not: u -> w may be a real edge, w may be u (rare on
  large graphs). PyG's "binary" mode draws both endpoints of a negative at random; keeping u adds only w
  to the batch's nodes.
* Endpoints: the label edges' nodes, de-duplicated in order of first appearance (the sources, then the
  destinations, then the negatives' w), are the batch's seeds, neighbour-sampled exactly as node seeds.
* `edge_label_index`: int64 [2, P * (1 + negatives)], local ids (positions in `n_id`, which starts with
  the endpoints), row 0 source, row 1 destination; the P positives first, then negative j of positive i
  at column P + i * negatives + j. `edge_label`: float32, 1 for a positive, 0 for a negative.

A batch whose seeds all lack in-neighbours is an empty batch (no nodes, no labels), not an error: a
shuffle may put a few such seeds together, and a run should not stop on it (`link_loss` gives 0 for it).
`with_in_edges` drops such seeds up front, so every seed of a batch gives a positive.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from moment.workload.sampler import (DEFAULT_FANOUTS, CSRGraph, MiniBatch, NeighborSampler,
                                     _stable_dedup)  # the sampler's own stable de-duplication, for the endpoints


def _ids(ids: torch.Tensor | np.ndarray | Sequence[int], n: int, what: str) -> torch.Tensor:
    t = ids if isinstance(ids, torch.Tensor) else torch.as_tensor(np.asarray(ids, dtype=np.int64))
    t = t.to(torch.int64).reshape(-1)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
        raise ValueError(f"{what} ids out of range [0, {n})")
    return t


def with_in_edges(graph: CSRGraph, nodes: torch.Tensor | np.ndarray | Sequence[int]) -> torch.Tensor:
    """`nodes` (int64, in order) without those that have no in-neighbour: the seeds a link batch can use."""
    t = _ids(nodes, graph.num_nodes, "node")
    return t[graph.indptr[t + 1] > graph.indptr[t]]


class LinkNeighborSampler:
    """Link batches from seed nodes (see the module docstring); the interface of `NeighborSampler`."""

    @staticmethod
    def map_bytes(num_nodes: int) -> int:
        """The node-sized table one sampler keeps: its `NeighborSampler`'s (the endpoints' de-duplication is
        batch-sized)."""
        return NeighborSampler.map_bytes(num_nodes)

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int] = DEFAULT_FANOUTS, negatives: int = 1,
                 seed: int = 0, dedup: str = "map"):
        if int(negatives) < 0:
            raise ValueError(f"negatives must be >= 0, got {negatives}")
        self.nodes = NeighborSampler(graph, fanouts, seed=seed, dedup=dedup)
        self.negatives = int(negatives)

    @property
    def graph(self) -> CSRGraph:
        return self.nodes.graph

    @property
    def fanouts(self) -> list[int]:
        return self.nodes.fanouts

    @property
    def generator(self) -> torch.Generator:
        """The one generator of every draw (positives, negatives, neighbours): seed it per batch."""
        return self.nodes.generator

    def positives(self, seeds: torch.Tensor | np.ndarray | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(sources u, destinations v), int64: one uniform in-edge u -> v of each seed v that has one, in seed
        order."""
        g = self.graph
        v = _ids(seeds, g.num_nodes, "seed")
        start = g.indptr[v]
        deg = g.indptr[v + 1] - start
        has = deg > 0
        v, start, deg = v[has], start[has], deg[has]
        r = torch.rand(v.numel(), generator=self.generator, dtype=torch.float64)
        slot = torch.minimum((r * deg.to(torch.float64)).to(torch.int64), deg - 1)
        return g.indices[start + slot].to(torch.int64), v

    def sample(self, seeds: torch.Tensor | np.ndarray | Sequence[int]) -> MiniBatch:
        """The link batch of `seeds` (global ids): their positives, negatives and the endpoints' neighbourhood."""
        return self.sample_edges(*self.positives(seeds))

    def sample_edges(self, src: torch.Tensor | np.ndarray | Sequence[int],
                     dst: torch.Tensor | np.ndarray | Sequence[int]) -> MiniBatch:
        """The link batch of the given positive edges src -> dst (e.g. held-out ones, `split_edges`): their
        negatives drawn, then the endpoints' neighbourhood, laid out as `sample`'s."""
        n = self.graph.num_nodes
        s, d = _ids(src, n, "source"), _ids(dst, n, "destination")
        if s.numel() != d.numel():
            raise ValueError(f"{s.numel()} sources but {d.numel()} destinations")
        p, k = s.numel(), self.negatives
        w = (torch.randint(n, (p * k,), generator=self.generator, dtype=torch.int64) if p * k
             else torch.empty(0, dtype=torch.int64))
        ends = torch.cat([s, s.repeat_interleave(k), d, w])  # the label edges' sources, then destinations
        local, endpoints = _stable_dedup(torch.empty(0, dtype=torch.int64), ends)
        mb = self.nodes.sample(endpoints)
        mb.edge_label_index = local.reshape(2, -1)
        mb.edge_label = torch.cat([torch.ones(p, dtype=torch.float32), torch.zeros(p * k, dtype=torch.float32)])
        return mb


def split_edges(graph: CSRGraph, fraction: float, seed: int = 0, *,
                undirected: bool = False) -> tuple[CSRGraph, torch.Tensor]:
    """Holds out a uniformly drawn `fraction` of the edges for evaluation: (the graph without them, to train on
    and to sample evaluation neighbourhoods from, so a held-out edge never carries a message; the held-out
    edges, int64 [2, k], row 0 source u, row 1 destination v, from row v, in CSR order).

    `undirected`: the graph stores each edge in both directions; a pair is held out once (as its u < v
    direction) and both directions are removed, else the reverse edge would carry the answer.
    Builds the smaller graph in memory (O(edges)): for graphs that fit, such as tests and evaluation sets."""
    if not 0.0 <= float(fraction) < 1.0:
        raise ValueError(f"fraction must be in [0, 1), got {fraction}")
    n, ip = graph.num_nodes, graph.indptr
    row = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), ip.diff())  # each edge's destination v
    col = graph.indices.to(torch.int64)  # its source u
    cand = torch.nonzero(col < row).reshape(-1) if undirected else torch.arange(col.numel())
    k = round(float(fraction) * cand.numel())
    g = torch.Generator().manual_seed(int(seed))
    pick = cand[torch.randperm(cand.numel(), generator=g)[:k]].sort().values
    drop = torch.zeros(col.numel(), dtype=torch.bool)
    drop[pick] = True
    if undirected:  # the reverse of u -> v (row v) is v -> u, in row u: key row * n + col
        drop |= torch.isin(row * n + col, col[pick] * n + row[pick])
    keep = ~drop
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(row[keep], minlength=n).cumsum(0)
    return CSRGraph(indptr, graph.indices[keep]), torch.stack([col[pick], row[pick]])
