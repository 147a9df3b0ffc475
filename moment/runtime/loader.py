"""The memmap baseline as PyG users run it: a torch `DataLoader` whose worker processes sample and gather.

A PyG user whose features do not fit in memory indexes a memmap of them inside `NeighborLoader(...,
num_workers=N)`: each worker samples a batch and reads its rows (one page fault at a time per worker, so
N in flight per rank) while the rank trains on an earlier batch. `LoaderPipeline` is that, with the same
`run(batches, key, start)` contract and batch contents as `moment.runtime.pipeline.Pipeline`: batch i is
sampled with a generator seeded from (key, i), so results do not depend on which worker made it, and the
loss curve equals the tiered store's.

Stage seconds: `sample` and `gather_wait` are the workers' busy seconds summed over the workers (they run
at the same time, so they may exceed the wall time); `train` is the rank's time between batches.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from moment.io.device import DeviceLayer
from moment.runtime.pipeline import Prepared, StageTimes, link_labels, seed_labels
from moment.runtime.sources import MemmapFeatures
from moment.workload.sampler import CSRGraph, NeighborSampler
from moment.workload.seeds import mix


#: the first CPython 3.11 whose forked child cannot hang on the interpreter's lock held, at the fork, by another
#: thread that was starting or ending (gh-112275; 3.12 never had it)
FORK_SAFE_311 = (3, 11, 8)


def fork_hang_note(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str | None:
    """What to tell a run whose DataLoader workers fork from a rank on this Python, None where it is safe: each
    epoch forks them while the rank's own threads come and go, and on 3.11 before 3.11.8 such a fork can leave
    a worker hung for good (one of the memmap baseline's did, for 15 min, on 3.11.7)."""
    if not (3, 11) <= tuple(version) < FORK_SAFE_311:
        return None
    return (f"Python {'.'.join(map(str, version))} can leave a forked process hung for good when another of its "
            "threads starts or ends at the fork (CPython gh-112275, fixed in 3.11.8), and --loader-workers forks "
            "its workers at every epoch: a worker may hang. Use Python 3.11.8 or later")


class _Batches(Dataset):
    """Item j: batch `start + j` sampled and its feature rows read from the memmap, in a worker."""

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int], source: MemmapFeatures, labels: torch.Tensor,
                 batches: Sequence[torch.Tensor], key: Sequence[int], start: int, sampler: Callable):
        self.graph, self.fanouts, self.labels, self.make_sampler = graph, list(fanouts), labels, sampler
        self.path, self.random = source.path, source.random
        self.batches, self.key, self.start = batches, tuple(key), start
        self.features: MemmapFeatures | None = None  # mapped in the worker that reads it
        self.sampler: Any = None

    def __len__(self) -> int:
        return max(0, len(self.batches) - self.start)

    def __getitem__(self, j: int):
        if self.features is None:
            self.features = MemmapFeatures(self.path, "cpu", random=self.random)
            self.sampler = self.make_sampler(self.graph, self.fanouts)
        i = self.start + j
        t0 = time.perf_counter()
        self.sampler.generator.manual_seed(mix(*self.key, i))
        mb = self.sampler.sample(self.batches[i])
        t1 = time.perf_counter()
        x = self.features.gather(mb.n_id)
        y = seed_labels(self.labels, mb.seeds)
        return i, mb, x, y, t1 - t0, time.perf_counter() - t1

    def __getstate__(self) -> dict:  # a spawned worker maps the file itself (never a pickled copy of it)
        return {**self.__dict__, "features": None, "sampler": None}


class LoaderPipeline:
    """`Pipeline`'s contract with the sampling and the memmap reads in `workers` DataLoader processes;
    each worker prepares up to `depth` batches ahead (DataLoader's prefetch_factor)."""

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int], source: MemmapFeatures, labels: torch.Tensor,
                 device: torch.device, *, workers: int, depth: int = 2, sampler: Callable = NeighborSampler):
        if workers < 1:
            raise ValueError("LoaderPipeline needs at least one worker")
        self.graph, self.fanouts, self.source, self.labels = graph, list(fanouts), source, labels
        self.device, self.workers, self.depth = torch.device(device), workers, max(1, depth)
        self.times = StageTimes()
        self.dev = DeviceLayer(self.device)
        self.make_sampler = sampler

    def prepare(self, batches: Sequence[torch.Tensor], key: Sequence[int], start: int = 0) -> None:
        """`Pipeline.prepare`'s contract; the workers start on a sequence only when it runs."""

    def run(self, batches: Sequence[torch.Tensor], key: Sequence[int], start: int = 0) -> Iterator[Prepared]:
        t0 = time.perf_counter()
        data = _Batches(self.graph, self.fanouts, self.source, self.labels, batches, key, start, self.make_sampler)
        loader = DataLoader(data, batch_size=None, shuffle=False, num_workers=self.workers,
                            prefetch_factor=self.depth, persistent_workers=False)
        it = iter(loader)
        try:
            for i, mb, x, y, sample_s, gather_s in it:
                self.times.sample += sample_s
                self.times.gather_wait += gather_s
                self.source.rows += int(x.shape[0])
                to = self.dev.to_device
                blocks = [type(b)(to(b.edge_index), b.num_src, b.num_dst) for b in mb.blocks()]
                item = Prepared(i, mb, to(x), to(y), blocks, None, None, None, *link_labels(mb, to))
                now = time.perf_counter()
                yield item
                self.times.train += time.perf_counter() - now
        finally:
            it._shutdown_workers()  # also when the consumer stopped early: no worker outlives the run
            self.times.wall += time.perf_counter() - t0

