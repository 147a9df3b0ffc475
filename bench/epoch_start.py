"""How soon a train epoch asks for its first reads: its first batches sampled ahead, as the validation pass before it
ends (`Pipeline.prepare`, what `moment.open_run`'s loaders ask at each train epoch's end), against sampled at the
epoch's start (as before), alternated on the same graph, batches and pipelines in one process. Prints the medians
of the milliseconds from the epoch's start to its first batch's submission and to its third's (a disk-reading
source submits three before it completes the first), each way, and their ratios (at the start / ahead: above 1,
sampling ahead asks sooner).

Why it matters: until its first batch is submitted a rank reads nothing, and at an epoch's start every rank is
there at once, so the disk is idle (12-13 ms of a 0.37 s data-only epoch on the bench's 8M run, 2 ranks on 2
cores, sampled at the start). The source here holds one 4-byte feature per node in memory and reads nothing:
what is measured is the pipeline's own start, without the disk's noise.

    .venv/bin/python bench/epoch_start.py [--nodes 8000000] [--rounds 8] [--batches 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from sequence_start import random_graph

from moment.runtime.pipeline import Pipeline
from moment.runtime.sampler_pool import SamplerPool
from moment.runtime.sources import InMemoryFeatures
from moment.workload.sampler import NeighborSampler
from moment.workload.seeds import SPLIT_TAGS

class Stamped(InMemoryFeatures):
    """In-memory rows, submitted as a disk-reading tier's are at a sequence's start (three before the first is
    completed), each submission's time kept."""

    first_ahead = 2
    lookahead = 2

    def __init__(self, path: Path):
        super().__init__(path)
        self.times: list[float] = []

    def submit(self, node_ids: torch.Tensor, tag: tuple | None = None) -> np.ndarray:
        self.times.append(time.perf_counter())
        return super().submit(node_ids, tag)


def epoch(pipe: Pipeline, src: Stamped, batches: list[torch.Tensor], key: tuple) -> tuple[float, float]:
    """(ms to the first submission, ms to the third) of one sequence, read to its end."""
    src.times.clear()
    t0 = time.perf_counter()
    for _ in pipe.run(batches, key):
        pass
    return (src.times[0] - t0) * 1e3, (src.times[min(2, len(src.times) - 1)] - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=float, default=8e6)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--rounds", type=int, default=8, help="epochs of each kind, alternated")
    ap.add_argument("--batches", type=int, default=6, help="batches per epoch and per validation pass")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    graph = random_graph(int(a.nodes), a.degree, a.seed)
    n, fanouts = graph.num_nodes, [int(f) for f in a.fanouts.split(",")]
    gen = torch.Generator().manual_seed(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "features.npy", np.zeros((n, 1), np.float32))
        src = Stamped(Path(tmp) / "features.npy")
        labels = torch.zeros(n, dtype=torch.int64)
        pool = SamplerPool(NeighborSampler)
        train, val = (Pipeline(graph, fanouts, src, labels, torch.device("cpu"), sampler=pool) for _ in range(2))
        val_batches = [torch.randperm(n, generator=gen)[: a.batch_size] for _ in range(a.batches)]
        got: dict[str, list[tuple[float, float]]] = {"start": [], "ahead": []}
        for e in range(2 * a.rounds + 1):
            batches = [torch.randperm(n, generator=gen)[: a.batch_size] for _ in range(a.batches)]
            way = "ahead" if e % 2 else "start"
            if way == "ahead":
                train.prepare(batches, (a.seed, e, 0))
            epoch(val, src, val_batches, (a.seed, e, 0, SPLIT_TAGS["val"]))  # the validation pass before the epoch
            ms = epoch(train, src, batches, (a.seed, e, 0))
            if e:  # the first, which makes the run's sampler and fills its node map, is left out
                got[way].append(ms)
    med = {k: [statistics.median(x[j] for x in v) for j in (0, 1)] for k, v in got.items()}
    print(f"graph: {n} nodes, {graph.indices.numel()} edges; {a.batches} batches of {a.batch_size} seeds, fan-outs "
          f"{a.fanouts}; medians of {a.rounds} epochs each way, alternated, each after a validation pass")
    print(f"batches_sampled_ahead: {train.sampled_ahead}")
    for j, name in ((0, "first"), (1, "third")):
        print(f"{name}_submit_ms_at_start: {med['start'][j]:.2f}")
        print(f"{name}_submit_ms_ahead: {med['ahead'][j]:.2f}")
        print(f"{name}_submit_ratio: {med['start'][j] / med['ahead'][j]:.1f}  (at the start / ahead)")


if __name__ == "__main__":
    main()
