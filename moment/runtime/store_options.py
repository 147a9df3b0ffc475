"""What a store is told (`moment.runtime.store.open_tiers`): where this rank sits, how its tiers and reads
are shaped, and the process group's collectives.

Why three groups: the store used to take two dozen keyword arguments one by one; the
rank placement comes from the launcher (`DistContext` already carries it), the options from the run's
configuration and budget split, and the collectives exist only under torchrun. Keeping them apart lets
each caller build the one it owns and lets the options be checked once, where they are made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable

from moment.caching import POLICIES
from moment.errors import MomentError
from moment.io.merge import SHAPES
from moment.runtime.gather import WINDOW

if TYPE_CHECKING:  # no torch at run time: the run plan (moment.runtime.run_plan) resolves these without it
    import torch

    from moment.runtime.exchange import ExchangeGroup

__all__ = ["Collectives", "Place", "RankPlace", "StoreOptions"]


class Place(Protocol):
    """Who this rank is; `moment.runtime.dist.DistContext` is one, `RankPlace` another."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int | None
    device: torch.device | str


@dataclass(frozen=True)
class RankPlace:
    """A rank's place outside torchrun (tests, benchmarks, notebooks): one process by default."""

    rank: int = 0  # global rank: picks this rank's pack file
    local_rank: int = 0  # rank on this node: picks the plan GPUs' bins it holds, creates shared segments
    world_size: int = 1  # ranks in the run
    local_world_size: int | None = None  # ranks on this node; None: $LOCAL_WORLD_SIZE, else world_size
    device: torch.device | str = "cpu"  # where batches (and the GPU tier) live


def local_world_size(where: Place) -> int:
    """The node's rank count: given, else $LOCAL_WORLD_SIZE, else the world size."""
    return where.local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", where.world_size))


@dataclass(frozen=True)
class Collectives:
    """The process group's calls the store needs; absent (None) in a single process."""

    barrier: Callable[[], Any]  # all local ranks wait here (shared segments are made before they are mapped)
    peers: ExchangeGroup | None = None  # the node's ranks, the peer tier's exchange; None: no peer tier
    remote: ExchangeGroup | None = None  # this local rank on every machine, the remote tier's exchange (a split
    #                                      layout); None: no remote tier


@dataclass(frozen=True)
class StoreOptions:
    """The store's tier and I/O options; the defaults are a plain single-rank store that is out of core as
    its layout planned: the CPU cache holds the layout's CPU bins, never silently every row."""

    io_backend: str | None = None  # reader backend (moment.runtime.gather); None: the best one available
    queue_depth: int = 128  # reads in flight per rank
    direct: bool = True  # O_DIRECT reads (bypass the page cache)
    verify: bool = False  # re-hash each shard chunk the first time a read touches it
    cpu_rows: int | None = None  # CPU-cache rows; None: the layout's CPU bins (Layout.cpu_bin_rows), or under a
    #                              memory_budget what it grants (then cpu_rows is the most it may grant)
    memory_budget: str | int | None = None  # bytes, a share ("50%") of the machine, or "auto", read as
    #                                         `moment train --memory-budget` reads it: the CPU cache, the
    #                                         GPU tier's stand-in (CPU) and the read buffers get what this
    #                                         process and the store's fixed needs leave (run_plan.store_budget)
    gpu_rows: int | None = None  # GPU-tier rows (the budget's grant on CPU runs); None: all this rank's GPU bins
    policy: str = "static"  # CPU-cache policy, one of moment.caching.POLICIES
    shape: str = "rows"  # I/O shape, one of moment.io.merge.SHAPES
    superbatch: int = 1  # batches routed together (belady-superbatch looks this far ahead)
    buffer_bytes: int | None = None  # read-buffer pool; None: moment.runtime.run_plan.default_buffer_bytes
    window: int = WINDOW  # bytes a reader job may span
    merge_gap: int | None = None  # merge reads across gaps up to this many bytes; None: the shape's own
    max_request: int | None = None  # largest single read in bytes; None: the shape's own
    shared_cache: bool | None = None  # one CPU cache for all local ranks; None: when the policy is static,
    #                                   there are several local ranks and a barrier
    pack_seed: int | None = None  # the run's seed: a tagged batch is read from the pack only if it matches
    io_trace: str | None = None  # a directory: each rank's SSD reads written there as an fio iolog
    batch_rows: int | None = None  # the most rows a batch asks (sizes the staging ring's slots on CUDA); None:
    #                                moment.runtime.run_plan.default_batch_rows

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise MomentError(f"I/O shape {self.shape!r}: choose one of {', '.join(SHAPES)}")
        if self.policy not in POLICIES:
            raise MomentError(f"unknown cache policy {self.policy!r}: choose one of {', '.join(POLICIES)}")
