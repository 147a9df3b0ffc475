"""A sequence's (an epoch's, an evaluation's) sampling with the run's sampler reused (`SamplerPool`, as every
pipeline of a run now takes it) against a sampler made for each sequence (as before), alternated on the same
graph and batches in one process. Prints the first batch's and the whole sequence's milliseconds of each, and
their ratios (made / reused: above 1, reuse is faster).

Why it matters: a fresh sampler fills its node map (4 B per node) at its first batch, while the rank's reader
waits for that batch's reads; on a graph of 16M nodes that is a 64 MB fill at every epoch and evaluation.

    .venv/bin/python bench/sequence_start.py [--nodes 16000000] [--data DIR] [--sequences 6] [--batches 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from moment.runtime.sampler_pool import SamplerPool
from moment.workload.graph import GraphDataset
from moment.workload.sampler import CSRGraph, NeighborSampler
from moment.workload.seeds import mix


def random_graph(n: int, degree: int, seed: int) -> CSRGraph:
    """`degree` uniform random in-neighbours per node: the sampler's cost here is its node map and the draws."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, (n + 1) * degree, degree, dtype=np.int64)
    return CSRGraph.from_arrays(indptr, rng.integers(0, n, n * degree, dtype=np.int32))


def sequence(sampler, batches: list[torch.Tensor], key: tuple) -> tuple[float, float]:
    """(first batch's seconds, the sequence's), the sampler made or taken before the clock starts."""
    t0 = time.perf_counter()
    first = 0.0
    for i, seeds in enumerate(batches):
        sampler.generator.manual_seed(mix(*key, i))
        sampler.sample(seeds)
        if i == 0:
            first = time.perf_counter() - t0
    return first, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=float, default=16e6)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--data", type=Path, help="an existing dataset's graph (default: a random one)")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--sequences", type=int, default=6, help="sequences of each kind, alternated")
    ap.add_argument("--batches", type=int, default=4, help="batches per sequence")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    graph = CSRGraph.from_dataset(GraphDataset(a.data)) if a.data else random_graph(int(a.nodes), a.degree, a.seed)
    n, fanouts = graph.num_nodes, [int(f) for f in a.fanouts.split(",")]
    gen = torch.Generator().manual_seed(a.seed)
    batches = [torch.randperm(n, generator=gen)[: a.batch_size] for _ in range(a.batches)]
    pool = SamplerPool(NeighborSampler)
    made: list[tuple[float, float]] = []
    reused: list[tuple[float, float]] = []
    first = pool.take(graph, fanouts)  # the run's first sequence makes it
    sequence(first, batches, (a.seed, a.sequences, 0))
    pool.give(graph, fanouts, first)
    for s in range(a.sequences):
        made.append(sequence(NeighborSampler(graph, fanouts), batches, (a.seed, s, 0)))
        sampler = pool.take(graph, fanouts)
        reused.append(sequence(sampler, batches, (a.seed, s, 0)))
        pool.give(graph, fanouts, sampler)
    med = {k: [statistics.median(x[j] for x in v) * 1e3 for j in (0, 1)] for k, v in (("made", made), ("reused", reused))}
    print(f"graph: {n} nodes, {graph.indices.numel()} edges; {a.batches} batches of {a.batch_size} seeds per sequence, "
          f"fan-outs {a.fanouts}; medians of {a.sequences} sequences each, alternated")
    print(f"first_batch_ms_made: {med['made'][0]:.1f}")
    print(f"first_batch_ms_reused: {med['reused'][0]:.1f}")
    print(f"first_batch_ratio: {med['made'][0] / med['reused'][0]:.2f}  (made / reused)")
    print(f"sequence_ms_made: {med['made'][1]:.1f}")
    print(f"sequence_ms_reused: {med['reused'][1]:.1f}")
    print(f"sequence_ratio: {med['made'][1] / med['reused'][1]:.2f}  (made / reused)")
    print(f"samplers_made_by_the_pool: {pool.made}")


if __name__ == "__main__":
    main()
