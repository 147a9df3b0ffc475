"""The feature-access trace of one rank: the node ids each of its mini-batches reads, in training order.

Why exactly the runtime's batches: the cache simulator's prediction is compared with the training
run's measured hit rate, so the trace is sampled the way `moment.runtime.pipeline.Pipeline` samples:
seeds from `SeedBatches(rank, world_size)`, batch i of epoch e from a sampler re-seeded with
mix(seed, e, rank, i).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import NPZ_ERRORS, MomentError, check_at_least
from moment.outputs import atomic_file
from moment.workload.graph import GraphDataset
from moment.workload.seeds import SPLIT_TAGS, check_seed, mix

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.


@dataclass
class Trace:
    ids: np.ndarray  # int64, every batch's node ids concatenated
    offsets: np.ndarray  # int64, batches + 1
    num_nodes: int
    row_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def batch(self, t: int) -> np.ndarray:
        return self.ids[self.offsets[t] : self.offsets[t + 1]]

    def batches(self) -> list[np.ndarray]:
        return [self.batch(t) for t in range(len(self))]

    @property
    def total_accesses(self) -> int:
        return int(self.ids.shape[0])

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        try:
            with atomic_file(p) as f:
                np.savez(f, ids=self.ids, offsets=self.offsets,
                         info=np.array([self.num_nodes, self.row_bytes], np.int64))
        except OSError as e:
            raise MomentError(f"cannot write the trace: {e.strerror}", source=str(p)) from None
        return p

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        try:
            with np.load(path, allow_pickle=False) as z:
                n, rb = (int(x) for x in z["info"])
                return cls(z["ids"], z["offsets"], n, rb)
        except NPZ_ERRORS as e:
            raise MomentError(f"not a Moment trace file ({e})", source=str(path)) from None


def sample_trace(dataset: GraphDataset, fanouts: Sequence[int], batch_size: int, *, seed: int = 0, epochs: int = 1,
                 rank: int = 0, world_size: int = 1, in_memory: bool = False,
                 progress: Callable[[int, int], None] | None = None) -> Trace:
    """Rank `rank`'s batches for `epochs` epochs, sampled as the training runtime samples them."""
    from moment.workload.sampler import SeedBatches

    meta = _checked(dataset, fanouts, batch_size, epochs, seed, rank, world_size)
    seeds = SeedBatches(np.asarray(dataset.train_idx), batch_size, seed=seed, rank=rank, world_size=world_size)
    if len(seeds) == 0:
        raise MomentError(f"the train split is too small for {world_size} ranks", source=str(dataset.path))
    batches = [(mix(seed, e, rank, i), b) for e in range(epochs) for i, b in enumerate(seeds.epoch(e))]
    return _sampled(dataset, fanouts, batches, in_memory, progress, meta)


def sample_eval_trace(dataset: GraphDataset, fanouts: Sequence[int], batch_size: int, *, split: str = "val",
                      seed: int = 0, epochs: int = 1, rank: int = 0, world_size: int = 1, in_memory: bool = False,
                      progress: Callable[[int, int], None] | None = None) -> Trace:
    """Rank `rank`'s batches of evaluation split `split` after each of `epochs` epochs, sampled as the runtime's
    loader of that split samples them (`moment.runtime.run.Run.loader`): the rank's slice of the split's nodes
    in order, in batches of `batch_size`, batch i of epoch e with mix(seed, e, rank, SPLIT_TAGS[split], i).
    `meta["per_epoch"]`: its batches per epoch (possibly 0)."""
    from moment.workload.sampler import eval_batches

    meta = _checked(dataset, fanouts, batch_size, epochs, seed, rank, world_size)
    if split not in SPLIT_TAGS:
        raise MomentError(f"no evaluation split {split!r}: one of {', '.join(SPLIT_TAGS)}")
    chunks = eval_batches(getattr(dataset, f"{split}_idx"), batch_size, rank=rank, world_size=world_size)
    batches = [(mix(seed, e, rank, SPLIT_TAGS[split], i), b) for e in range(epochs) for i, b in enumerate(chunks)]
    return _sampled(dataset, fanouts, batches, in_memory, progress, meta | {"split": split, "per_epoch": len(chunks)})


def _checked(dataset: GraphDataset, fanouts: Sequence[int], batch_size: int, epochs: int, seed: int, rank: int,
             world_size: int) -> dict[str, Any]:
    """A trace's parameters, each refused in one line when no run could take it; its `meta`."""
    for flag, value in (("--batch-size", batch_size), ("--epochs", epochs)):
        check_at_least(flag, value)
    if not fanouts or any(int(f) <= 0 for f in fanouts):
        raise MomentError(f"--fanouts must be positive integers (got {list(fanouts)})")
    check_seed(seed)
    if not 0 <= rank < world_size:
        raise MomentError(f"need 0 <= rank < ranks, got rank {rank} of {world_size}")
    return {"dataset": str(dataset.path), "fanouts": [int(f) for f in fanouts], "batch_size": int(batch_size),
            "seed": seed, "epochs": epochs, "rank": rank, "world_size": world_size}


def _sampled(dataset: GraphDataset, fanouts: Sequence[int], batches: list, in_memory: bool,
             progress: Callable[[int, int], None] | None, meta: dict[str, Any]) -> Trace:
    """The trace of `batches` ((generator seed, seed nodes) each), sampled in order."""
    import torch

    from moment.workload.sampler import CSRGraph, NeighborSampler

    sampler = NeighborSampler(CSRGraph.from_dataset(dataset, in_memory=in_memory), [int(f) for f in fanouts])
    parts = []
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for done, (key, b) in enumerate(batches, 1):
            sampler.generator.manual_seed(key)
            parts.append(sampler.sample(b).n_id.numpy())
            if progress:
                progress(done, len(batches))
    finally:
        torch.set_num_threads(old)
    lens = np.array([p.shape[0] for p in parts], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ids = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return Trace(ids, offsets, dataset.num_nodes, dataset.row_bytes, meta)
