"""What the sampler's objects hold, stated without torch: a mini-batch's ids and a sampler's node table, items
of a run's memory budget. They live here, not beside the objects, so that `moment train --dry-run` states them
without loading torch; moment.workload.sampler's classes state their sizes through these."""

from __future__ import annotations

_INT64, _INT32, _F32 = 8, 4, 4  # bytes of the sampler's dtypes


def id_bytes(num_nodes: int, num_edges: int, num_labels: int = 0) -> int:
    """What a batch of this many nodes and edges (and, a link batch, label edges) holds in ids: `n_id` and
    `edge_index`, int64, and `edge_label_index` (int64) with `edge_label` (float32)."""
    return (num_nodes + 2 * num_edges + 2 * num_labels) * _INT64 + num_labels * _F32


def map_bytes(num_nodes: int) -> int:
    """The node-sized table one sampler keeps (its de-duplication map: a local id and a first position per
    node, int32)."""
    return 2 * num_nodes * _INT32
