"""Uniform neighbour sampling over CSR, vectorised in torch, shared by pre-sampling and training.

Why one sampler: the hotness that decides data placement must come from exactly the access stream that
training will produce, so both call `NeighborSampler.sample`.

Semantics (PyG `NeighborLoader`-compatible, "directed" expansion):

* Hop 1 samples the neighbours of the seeds; hop k+1 samples the neighbours of the nodes that hop k
  added (nodes seen earlier are not expanded again).
* Per target with degree d and fan-out f: if d <= f, all d neighbour slots; otherwise a uniformly random
  f-subset of its d slots, drawn exactly without replacement (Floyd's algorithm, vectorised: f rounds
  over all targets at once, O(f^2) comparisons per target, independent of d, so hubs cost nothing
  extra). A slot is a CSR position: a multi-edge would count twice (our datasets have none).
  Chosen slots are returned in CSR order.
* Node ids are de-duplicated per mini-batch with `torch.unique`; `n_id` lists the seeds first, then
  each hop's new nodes in order of first appearance (stable, so the result depends only on the seed).
* `edge_index` is in local ids: row 0 = the neighbour (message source), row 1 = the target.
  Edges of hop 1 come first. `num_sampled_nodes` / `num_sampled_edges` give the per-hop counts, as
  PyG's `trim_to_layer` expects; `MiniBatch.blocks()` gives the per-layer bipartite views.

Every random draw comes from the sampler's `torch.Generator` (seeded), so a run is reproducible.

Two paths give the same batches bit for bit: the per-hop loops in C (moment.workload._sampling, built with
the package; each target's slots and each candidate's table entry touched once) and the vectorised torch
code below, the spec, used when the extension is not built (or `native=False`). The C loops take the
hop's uniforms from the same generator, drawn in one call: torch draws a CPU generator's doubles in
sequence, so one draw of rounds x targets equals the torch path's one draw per round.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from moment.workload import batch_bytes
from moment.workload.graph import DEGREE_CHUNK, GraphDataset, degree_histogram
from moment.workload.seeds import mix

from moment.workload.spec import DEFAULT_FANOUTS  # noqa: E402 - declared with the workload's other defaults

_native = batch_bytes.native_sampling()


def _as_tensor(a: np.ndarray | torch.Tensor, copy: bool) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a
    if copy:
        return torch.from_numpy(np.array(a))
    with warnings.catch_warnings():  # read-only memmaps: we never write through them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(a))


@dataclass(frozen=True)
class CSRGraph:
    """The adjacency the sampler reads: row v of `indices` = in-neighbours of v."""

    indptr: torch.Tensor  # int64 [num_nodes + 1]
    indices: torch.Tensor  # int32 or int64 [num_edges]

    @classmethod
    def from_arrays(cls, indptr: np.ndarray | torch.Tensor, indices: np.ndarray | torch.Tensor,
                    in_memory: bool = True) -> CSRGraph:
        ip = _as_tensor(indptr, copy=in_memory).to(torch.int64)
        ix = _as_tensor(indices, copy=in_memory)
        if ix.dtype not in (torch.int32, torch.int64):
            ix = ix.to(torch.int64)
        return cls(ip, ix)

    @classmethod
    def from_dataset(cls, ds: GraphDataset, in_memory: bool = True) -> CSRGraph:
        """`in_memory=False` samples straight from the memory-mapped files (page cache does the rest). The
        dataset's structure is validated first (once per opened dataset): a neighbour id beyond the node
        count is one error naming the file, not an IndexError in the middle of sampling."""
        ds.validate()
        return cls.from_arrays(ds.indptr, ds.indices, in_memory=in_memory)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel()) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def degree_histogram(self) -> np.ndarray:
        """How many nodes have each in-degree (entry d: nodes of degree d; the last entry is the largest
        degree's). Read in chunks, so that a memory-mapped graph of any size costs O(largest degree); kept,
        as a rank asks for it more than once (the fan-outs' note, the batch extent)."""
        if "_degrees" not in self.__dict__:  # frozen: cached beside the fields, not through __setattr__
            self.__dict__["_degrees"] = self._count_degrees()
        return self.__dict__["_degrees"]

    def _count_degrees(self) -> np.ndarray:
        return degree_histogram(self.indptr.numpy(), DEGREE_CHUNK)

    def max_degree(self) -> int:
        """The largest in-degree: no fan-out samples more than this many neighbours of any node."""
        return int(self.degree_histogram().size - 1)


@dataclass(frozen=True)
class Block:
    """One GNN layer's bipartite graph: messages flow from `num_src` inputs to the first `num_dst` of them."""

    edge_index: torch.Tensor  # int64 [2, E], local ids
    num_src: int
    num_dst: int


@dataclass
class MiniBatch:
    """A sampled mini-batch, in the layout of PyG's `NeighborLoader` output."""

    n_id: torch.Tensor  # int64 global node ids, seeds first
    edge_index: torch.Tensor  # int64 [2, E] local ids (row 0 neighbour, row 1 target)
    num_sampled_nodes: list[int]  # [num_seeds, new in hop 1, new in hop 2, ...]
    num_sampled_edges: list[int]  # [edges of hop 1, edges of hop 2, ...]
    num_sampled: int = 0  # ids drawn before de-duplication, seeds included
    targets_per_hop: list[torch.Tensor] = field(default_factory=list)  # global ids whose rows were read
    # link batches only (moment.workload.links), None for node batches, as PyG's LinkNeighborLoader's:
    edge_label_index: torch.Tensor | None = None  # int64 [2, L] local ids (row 0 source, row 1 destination)
    edge_label: torch.Tensor | None = None  # float32 [L]: 1 for a positive edge, 0 for a negative one

    @staticmethod
    def id_bytes(num_nodes: int, num_edges: int, num_labels: int = 0) -> int:
        """What a batch of this many nodes and edges (and, a link batch, label edges) holds in ids: `n_id` and
        `edge_index`, int64, and `edge_label_index` (int64) with `edge_label` (float32)."""
        return batch_bytes.id_bytes(num_nodes, num_edges, num_labels)

    @property
    def batch_size(self) -> int:
        return self.num_sampled_nodes[0]

    @property
    def seeds(self) -> torch.Tensor:
        return self.n_id[: self.batch_size]

    @property
    def num_nodes(self) -> int:
        return int(self.n_id.numel())

    @property
    def unique_ratio(self) -> float:
        return self.num_nodes / self.num_sampled if self.num_sampled else 1.0

    def blocks(self) -> list[Block]:
        """Per-layer views, input layer first: layer i of L uses the edges of hops 1..L-i.

        Feed `x[:num_src]` and `edge_index` to layer i and keep the first `num_dst` rows of its output;
        after the last layer the rows are the seeds.
        """
        L = len(self.num_sampled_edges)
        nodes = np.cumsum(self.num_sampled_nodes).tolist()
        edges = np.cumsum([0, *self.num_sampled_edges]).tolist()
        out = []
        for i in range(L):
            hops = L - i
            out.append(Block(self.edge_index[:, : edges[hops]], num_src=nodes[hops], num_dst=nodes[hops - 1]))
        return out


class NeighborSampler:
    """Uniform neighbour sampler; see the module docstring for the exact semantics."""

    @staticmethod
    def map_bytes(num_nodes: int) -> int:
        """The node-sized table one sampler keeps (the default de-duplication, `_DenseMap`, on the default path)."""
        return _DenseMap.bytes_for(num_nodes)

    def __init__(
        self, graph: CSRGraph, fanouts: Sequence[int] = DEFAULT_FANOUTS, seed: int = 0, dedup: str = "map",
        native: bool = True,
    ):
        if not fanouts or any(int(f) <= 0 for f in fanouts):
            raise ValueError(f"fan-outs must be positive integers, got {list(fanouts)}")
        if dedup not in ("map", "unique"):
            raise ValueError(f"dedup must be 'map' or 'unique', got {dedup!r}")
        self.graph = graph
        self.fanouts = [int(f) for f in fanouts]
        self.generator = torch.Generator().manual_seed(int(seed))
        self.dedup = dedup
        self._map: _DenseMap | None = None
        self.native = native and _native is not None

    def _sample_native(self, targets: torch.Tensor, fanout: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample_neighbors` in C: the same draws from the generator, the same result."""
        targets = targets.to(torch.int64).contiguous()
        m = targets.numel()
        start, deg = np.empty(m, np.int64), np.empty(m, np.int64)
        slots, partial, max_deg = _native.prepare(self.graph.indptr.numpy(), targets.numpy(), int(fanout), start, deg)
        f = min(int(fanout), max_deg) if m else 0
        u = torch.rand(f * partial, generator=self.generator, dtype=torch.float64)
        nbr, dst = torch.empty(slots, dtype=torch.int64), torch.empty(slots, dtype=torch.int64)
        _native.fill(self.graph.indices.numpy(), start, deg, f, u.numpy(), nbr.numpy(), dst.numpy())
        return nbr, dst

    def sample_neighbors(self, targets: torch.Tensor, fanout: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (neighbour global ids, index of each one's target in `targets`), both int64.

        Works on an [m, fanout] slot matrix (row i = target i), which avoids `repeat_interleave`. A fan-out
        above the targets' largest degree takes every slot of each, as that degree does (and draws nothing
        at random), so the matrix is only that wide: a huge fan-out costs what the graph holds, no more.
        """
        if self.native:
            return self._sample_native(targets, fanout)
        ip = self.graph.indptr
        targets = targets.to(torch.int64)
        m = targets.numel()
        start = ip[targets]
        deg = ip[targets + 1] - start
        fanout = min(int(fanout), int(deg.max())) if m else 0
        cols = torch.arange(fanout, dtype=torch.int64)
        pos = start.unsqueeze(1) + cols  # rows taken whole: slots 0..deg-1
        partial = deg > fanout
        if bool(partial.any()):
            pos[partial] = start[partial].unsqueeze(1) + self._floyd(deg[partial], fanout)
        valid = cols < deg.unsqueeze(1)
        nbr = self.graph.indices[pos[valid]].to(torch.int64)
        dst = torch.arange(m, dtype=torch.int64).unsqueeze(1).expand(m, fanout)[valid]
        return nbr, dst

    def _floyd(self, deg: torch.Tensor, f: int) -> torch.Tensor:
        """A uniform f-subset of range(deg) for every row at once, sorted; requires deg > f."""
        rows = deg.numel()
        sel = torch.empty((rows, f), dtype=torch.int64)
        for i in range(f):
            j = deg - f + i  # candidate range is [0, j]
            u = torch.rand(rows, generator=self.generator, dtype=torch.float64)
            t = torch.minimum((u * (j + 1).to(torch.float64)).to(torch.int64), j)
            if i:
                taken = (sel[:, :i] == t.unsqueeze(1)).any(1)
                t = torch.where(taken, j, t)
            sel[:, i] = t
        return sel.sort(dim=1).values

    def sample(self, seeds: torch.Tensor | np.ndarray | Sequence[int]) -> MiniBatch:
        """Samples the multi-hop neighbourhood of distinct `seeds` (global ids)."""
        seeds_t = torch.as_tensor(np.asarray(seeds) if not isinstance(seeds, torch.Tensor) else seeds)
        seeds_t = seeds_t.to(torch.int64).reshape(-1)
        n = self.graph.num_nodes
        if seeds_t.numel() and (int(seeds_t.min()) < 0 or int(seeds_t.max()) >= n):
            raise ValueError(f"seed ids out of range [0, {n})")
        if torch.unique(seeds_t).numel() != seeds_t.numel():
            raise ValueError("seeds must be distinct")
        if self.dedup == "map":
            if self._map is None:
                self._map = _DenseMap(n, native=self.native)
            dedup = self._map
            dedup.start(seeds_t)
        else:
            dedup = None
        n_id = seeds_t
        frontier, frontier_start = seeds_t, 0
        edges: list[torch.Tensor] = []
        num_nodes, num_edges = [seeds_t.numel()], []
        targets_per_hop: list[torch.Tensor] = []
        drawn = seeds_t.numel()
        for f in self.fanouts:
            targets_per_hop.append(frontier)
            nbr, dst_rel = self.sample_neighbors(frontier, f)
            drawn += nbr.numel()
            m = n_id.numel()
            src_local, new_nodes = dedup.add(nbr, m) if dedup else _stable_dedup(n_id, nbr)
            edges.append(torch.stack([src_local, dst_rel + frontier_start]))
            num_edges.append(nbr.numel())
            num_nodes.append(new_nodes.numel())
            n_id = torch.cat([n_id, new_nodes])
            frontier, frontier_start = new_nodes, m
        if dedup:
            dedup.reset(n_id)
        edge_index = torch.cat(edges, dim=1) if edges else torch.empty((2, 0), dtype=torch.int64)
        return MiniBatch(n_id, edge_index, num_nodes, num_edges, drawn, targets_per_hop)


class _DenseMap:
    """Node -> local id table of size num_nodes, reused across batches (reset touches only the batch).

    O(K) per hop instead of the O(K log K) sort in `torch.unique`: its cost does not grow with the
    batch's sort, which matters for large batches (bench/presample.py prints both); costs `bytes_for`
    (8 bytes per node). Not thread-safe: one sampler per worker.
    """

    @staticmethod
    def bytes_for(n: int, native: bool = True) -> int:
        return batch_bytes.map_bytes(n, native and _native is not None)  # local, and first on the torch path

    def __init__(self, n: int, native: bool = False):
        self.local = torch.full((n,), -1, dtype=torch.int32)
        self.native = native and _native is not None
        # the torch path's first-occurrence table (the C loop needs none)
        self.first = None if self.native else torch.empty(n, dtype=torch.int32)

    @property
    def nbytes(self) -> int:
        return self.local.nbytes + (0 if self.first is None else self.first.nbytes)

    def start(self, seeds: torch.Tensor) -> None:
        self.local[seeds] = torch.arange(seeds.numel(), dtype=torch.int32)

    def add(self, cand: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.native:
            cand = cand.contiguous()
            loc, new = torch.empty_like(cand), torch.empty_like(cand)
            k = _native.dedup(self.local.numpy(), cand.numpy(), int(m), loc.numpy(), new.numpy())
            return loc, new[:k]
        loc = self.local[cand]
        unseen = torch.nonzero(loc < 0).reshape(-1)
        c_new = cand[unseen]
        # first occurrence of each unseen id = smallest position (scatter amin), kept in candidate order
        order = torch.arange(c_new.numel(), dtype=torch.int32)
        self.first[c_new] = torch.iinfo(torch.int32).max
        self.first.scatter_reduce_(0, c_new, order, reduce="amin")
        new_nodes = c_new[self.first[c_new] == order]
        self.local[new_nodes] = torch.arange(m, m + new_nodes.numel(), dtype=torch.int32)
        loc[unseen] = self.local[c_new]
        return loc.to(torch.int64), new_nodes

    def reset(self, n_id: torch.Tensor) -> None:
        if self.native:
            _native.clear(self.local.numpy(), n_id.contiguous().numpy())
        else:
            self.local[n_id] = -1


def _stable_dedup(known: torch.Tensor, cand: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Local ids of `cand` against the distinct list `known`, appending unseen ids in first-seen order.

    The stateless `torch.unique` reference; `_DenseMap` gives the same result faster.

    Returns (local id of each candidate, the new ids to append).
    """
    m = known.numel()
    cat = torch.cat([known, cand])
    uniq, inv = torch.unique(cat, return_inverse=True)
    first = torch.full((uniq.numel(),), cat.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inv, torch.arange(cat.numel(), dtype=torch.int64), reduce="amin")
    local = first.clone()  # known ids: their position in `known`
    new_u = torch.nonzero(first >= m).reshape(-1)
    new_u = new_u[torch.argsort(first[new_u], stable=True)]
    local[new_u] = m + torch.arange(new_u.numel(), dtype=torch.int64)
    return local[inv[m:]], uniq[new_u]


class SeedBatches:
    """Training seeds in mini-batches: reshuffled per epoch from `seed`, split disjointly across ranks.

    Every rank builds the same permutation for an epoch and takes its own contiguous share of
    `len(seeds) // world_size` ids (the few left over are skipped that epoch, and change every epoch), so
    DDP ranks get disjoint, equal-size shares and the same number of batches.
    """

    def __init__(
        self,
        seeds: np.ndarray | torch.Tensor | Sequence[int],
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ):
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if world_size <= 0 or not (0 <= rank < world_size):
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
        s = seeds if isinstance(seeds, torch.Tensor) else torch.from_numpy(np.array(seeds, dtype=np.int64))
        self.seeds = s.to(torch.int64).reshape(-1)
        self.batch_size = int(batch_size)
        self.seed, self.shuffle = int(seed), shuffle
        self.rank, self.world_size = int(rank), int(world_size)
        self.drop_last = drop_last

    @property
    def per_rank(self) -> int:
        return self.seeds.numel() // self.world_size

    def __len__(self) -> int:
        q, r = divmod(self.per_rank, self.batch_size)
        return q if (self.drop_last or r == 0) else q + 1

    def share(self, epoch: int = 0) -> torch.Tensor:
        """This rank's seeds for `epoch`, in batch order."""
        if self.shuffle:
            g = torch.Generator().manual_seed(mix(self.seed, epoch))
            order = self.seeds[torch.randperm(self.seeds.numel(), generator=g)]
        else:
            order = self.seeds
        k = self.per_rank
        return order[self.rank * k : (self.rank + 1) * k]

    def epoch(self, epoch: int = 0) -> Iterator[torch.Tensor]:
        mine = self.share(epoch)
        for b in range(len(self)):
            yield mine[b * self.batch_size : (b + 1) * self.batch_size]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self.epoch(0)


def eval_batches(seeds: np.ndarray | torch.Tensor | Sequence[int], batch_size: int, *, rank: int = 0,
                 world_size: int = 1) -> list[torch.Tensor]:
    """An evaluation split's seeds for `rank`, in batches: every `world_size`-th node from the rank's, in
    order, not shuffled and not dropped (every node is evaluated once). The runtime's val/test loaders and
    `moment data pack` (moment.workload.trace.sample_eval_trace) both batch by this."""
    s = seeds if isinstance(seeds, torch.Tensor) else torch.from_numpy(np.array(seeds, dtype=np.int64))
    mine = s.to(torch.int64).reshape(-1)[rank::world_size]
    # no node, no batch (torch.split made one empty batch, which a model's BatchNorm or a mean over it failed on)
    return list(torch.split(mine, int(batch_size))) if mine.numel() else []
