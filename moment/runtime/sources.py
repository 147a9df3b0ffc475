"""The feature-source contract, and the two baselines that speak it beside the tiered store.

Every source speaks the same small contract (`FeatureSource`: `submit(ids, tag=None) -> pending`,
`complete(pending) -> Tensor`, `complete_local(pending) -> Staged`, `cancel(pending)`, `finish()`,
`tier_stats()`, `epoch_start(epoch)`, `close()`, and what a batch's rows look like), as DGL GraphBolt's
wrapped features do: the pipeline, the trainer and PyG's adapter use nothing else, so a run differs only
in where features come from. `complete_local` is `complete` without the exchange rounds (collectives),
which the rank's collective thread runs (`Staged`); a source without rounds returns its rows whole.

* the tiered store — a chain of tiers, each a source over the next (moment.runtime.tier, built by
  moment.runtime.store.open_store);
* `InMemoryFeatures` — the dataset's whole feature matrix in RAM: the correctness reference.
* `MemmapFeatures`   — `np.load(mmap_mode="r")` of features.npy, indexed per batch: what PyG users do
  when features do not fit in memory. With `drop_cache=True` (or "epoch") the file's pages are dropped
  from the page cache at every epoch start (POSIX_FADV_DONTNEED), so the baseline really reads the
  disk; "batch" drops them before every batch and `random=True` advises MADV_RANDOM (no read-around):
  a stand-in for a memory bound where cgroups are unavailable.
"""

from __future__ import annotations

import mmap
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from moment.errors import MomentError
from moment.io.device import HostBatches
from moment.io.rows import copy_rows
from moment.workload.seeds import split_of


def in_step(tag: tuple | None) -> bool:
    """Whether the batch tagged `tag` ((sampling key, index); None: a lookup) is one every rank takes in step:
    a training batch (every rank iterates its train loader alike, as DDP needs). Only those take part in the
    rounds of an exchange whose rows this rank can read itself (the peer tier's: the layout's files hold the
    other GPUs' bins too). Why: an evaluation batch or a lookup may be one rank's alone: PyG's multi-GPU
    examples test on rank 0 and wait for it at a barrier, where the other rank cannot serve a round, and
    rank 0 waited in its first for ever (on NCCL too)."""
    return tag is not None and split_of(tag[0]) == "train"


@dataclass
class Staged:
    """A batch completed as far as its rank alone can: `x` holds the rows of its own tiers, on the device;
    the rows other ranks serve arrive through `fetches` (exchange rounds: collectives), which the rank's
    collective thread starts and finishes (`start`, `finish`), in the same order on every rank. Why apart:
    the rank's other threads read disks and fill buffers, never a collective (NCCL deadlocks when two
    threads of a rank issue them). A source's `idle()` gives rounds with no batch (x None): this rank's
    sequence is over, it serves the others, and `running` says whether any rank still had a batch."""

    x: torch.Tensor | None
    fetches: tuple = ()
    finished: bool = field(default=False, init=False, repr=False)

    def start(self) -> None:
        for f in self.fetches:
            f.start()

    def finish(self) -> torch.Tensor | None:
        """Finish the rounds (once: a sequence paused for another finished them early, moment.runtime.pipeline)."""
        if not self.finished:
            self.finished = True
            for f in self.fetches:
                f.finish()
        return self.x

    @property
    def running(self) -> bool:
        """After `finish`: whether any rank was still active in these rounds."""
        return any(f.running for f in self.fetches)

    @property
    def staying(self) -> bool:
        """After `finish`: whether any rank had not left the run (`FeatureSource.leave`)."""
        return any(f.staying for f in self.fetches)

    def run(self) -> bool:
        """Start and finish at once (a caller with nothing to overlap); returns `running`."""
        self.start()
        self.finish()
        return self.running


class FeatureSource(Protocol):
    num_nodes: int
    row_shape: tuple[int, ...]
    feature_dim: int
    backend: str
    lookahead: int  # batches a caller may submit before it completes the first
    first_ahead: int  # at a sequence's start, those it needs submitted before the first completes (<= lookahead)

    def submit(self, node_ids: torch.Tensor, tag: tuple | None = None) -> Any:
        """`tag` names the batch ((sampling key), index) so a source may use what was prepared for it."""

    def complete(self, pending: Any) -> torch.Tensor:
        """The batch's rows, exchange rounds included (on the calling thread)."""

    def complete_local(self, pending: Any) -> Staged:
        """The batch's rows this rank holds; the exchange rounds are the caller's (`Staged`)."""

    def idle(self, stepped: bool = True) -> Staged:
        """Exchange rounds without a batch of this rank's (its sequence is over): see `Staged`; `stepped`: the
        sequence's batches were taken in step (`in_step`), so the rounds of every exchange, not only of those its
        batches needed."""

    def cancel(self, pending: Any) -> None:
        """Drop a submitted batch whose rows are no longer wanted (the consumer stopped early)."""

    def finish(self) -> None:
        """The caller has completed the last batch of a sequence of training batches (`in_step`), or of a split
        layout's lookups. A source that exchanges rows with other ranks (the tiered store's peer and remote
        tiers) serves their remaining batches here: every rank calls it at the end of each such sequence,
        whatever its own number of batches."""

    def leave(self) -> None:
        """This rank takes no more batches (the run is closed): a source that exchanges rows serves the
        others until every rank has left (collective: every rank calls it once, at its end)."""

    def tier_stats(self) -> dict[str, Any]: ...

    def ssd_files(self) -> dict[str, Path]:
        """The files its SSD reads come from, by name (moment.io.diskstats watches their devices)."""

    def epoch_start(self, epoch: int) -> None: ...

    def close(self) -> None: ...


class _Plain:
    """Synchronous sources: `submit` only remembers the ids; the read happens in `complete`."""

    tier = "memory"
    backend = "none"
    lookahead = 1
    first_ahead = 0

    def __init__(self, array: np.ndarray, device: torch.device):
        if array.ndim != 2:
            raise MomentError(f"features must be a 2-d matrix, got shape {array.shape}")
        self.array = array
        self.device = torch.device(device)
        self.feature_dim = int(array.shape[1])
        self.num_nodes, self.row_shape = int(array.shape[0]), tuple(array.shape[1:])
        self.row_bytes = int(array.shape[1] * array.dtype.itemsize)
        self.rows = 0
        self._batches = HostBatches()

    def submit(self, node_ids: torch.Tensor, tag: tuple | None = None) -> np.ndarray:
        return node_ids.detach().cpu().numpy() if isinstance(node_ids, torch.Tensor) else np.asarray(node_ids)

    def complete(self, ids: np.ndarray) -> torch.Tensor:
        k, a = int(ids.shape[0]), self.array
        self.rows += k
        if not a.flags.c_contiguous:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return torch.from_numpy(np.ascontiguousarray(a[ids])).to(self.device)
        # each row copied once into a reused buffer (moment.io.device.HostBatches), not gathered into a fresh array
        buf = self._batches.take(k * self.row_bytes).reshape(k, self.row_bytes)
        copy_rows(buf, None, a.reshape(a.shape[0], -1).view(np.uint8), ids)
        return torch.from_numpy(buf.view(a.dtype).reshape(k, *self.row_shape)).to(self.device)

    def complete_local(self, ids: np.ndarray) -> Staged:
        return Staged(self.complete(ids))

    def idle(self, stepped: bool = True) -> Staged:
        return Staged(None)

    def gather(self, node_ids) -> torch.Tensor:
        return self.complete(self.submit(node_ids))

    def cancel(self, ids: np.ndarray) -> None:
        pass

    def finish(self) -> None:
        pass

    def leave(self) -> None:
        pass

    def tier_stats(self) -> dict[str, Any]:
        return {"rows": {self.tier: self.rows}, "bytes": {self.tier: self.rows * self.row_bytes},
                "ssd_requests": 0, "ssd_bytes_read": 0}

    def epoch_start(self, epoch: int) -> None:
        pass

    def ssd_files(self) -> dict[str, Path]:
        return {}

    def close(self) -> None:
        self.array = None


class InMemoryFeatures(_Plain):
    tier = "memory"

    def __init__(self, features_path: str | Path, device: torch.device | str = "cpu"):
        super().__init__(np.load(features_path, allow_pickle=False), torch.device(device))


class MemmapFeatures(_Plain):
    tier = "memmap"

    def __init__(self, features_path: str | Path, device: torch.device | str = "cpu",
                 drop_cache: bool | str = False, random: bool = False):
        self.path = Path(features_path)
        if drop_cache not in (False, True, "", "epoch", "batch"):
            raise MomentError(f"drop_cache must be 'epoch' or 'batch', got {drop_cache!r}")
        self.drop_cache = "epoch" if drop_cache is True else (drop_cache or "")
        self.random = random
        super().__init__(self._map(), torch.device(device))

    def _map(self) -> np.ndarray:
        a = np.load(self.path, mmap_mode="r", allow_pickle=False)
        if self.random and hasattr(a, "_mmap") and hasattr(a._mmap, "madvise"):

            a._mmap.madvise(mmap.MADV_RANDOM)
        return a

    def _remap(self) -> None:
        self.array = None  # unmap first: the kernel keeps pages that are still mapped
        drop_page_cache(self.path)
        self.array = self._map()

    def epoch_start(self, epoch: int) -> None:
        if self.drop_cache:
            self._remap()

    def complete(self, ids: np.ndarray) -> torch.Tensor:
        if self.drop_cache == "batch":
            self._remap()
        return super().complete(ids)


def drop_page_cache(path: str | Path) -> None:
    """Ask the kernel to forget `path`'s cached pages (clean pages only; best effort, no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
