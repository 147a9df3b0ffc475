"""What the sampler's objects hold, stated without torch: a mini-batch's ids and a sampler's node table, items
of a run's memory budget. They live here, not beside the objects, so that `moment train --dry-run` states them
without loading torch; moment.workload.sampler's classes state their sizes through these."""

from __future__ import annotations

import importlib
from functools import lru_cache
from types import ModuleType

_INT64, _INT32, _F32 = 8, 4, 4  # bytes of the sampler's dtypes


def id_bytes(num_nodes: int, num_edges: int, num_labels: int = 0, num_targets: int = 0) -> int:
    """What a batch of this many nodes and edges (and, a link batch, label edges) holds in ids: `n_id` and
    `edge_index`, int64, and `edge_label_index` (int64) with `edge_label` (float32); and, a multi-label batch,
    its seeds' 0/1 targets (`num_targets` = seeds x classes, float32)."""
    return (num_nodes + 2 * num_edges + 2 * num_labels) * _INT64 + (num_labels + num_targets) * _F32


@lru_cache(maxsize=1)
def native_sampling() -> ModuleType | None:
    """The sampler's C loops (moment.workload._sampling, native/sampling.c), or None where the build has none
    (the sampler then runs its torch path). Asked here, as what a sampler holds depends on it; loading it
    loads no torch."""
    try:
        return importlib.import_module("moment.workload._sampling")
    except ImportError:  # pragma: no cover - depends on the build
        return None


def map_bytes(num_nodes: int, native: bool | None = None) -> int:
    """The node-sized table one sampler keeps (its de-duplication map: a local id per node, int32, and on the
    torch path a first position per node beside it). `native`: whether the C loops run (default: whether
    they are built)."""
    native = native_sampling() is not None if native is None else native
    return (1 if native else 2) * num_nodes * _INT32
