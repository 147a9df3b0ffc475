"""The result of a data placement policy: which bin holds each node."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moment.errors import MomentError
from moment.placement.bins import BinSet


@dataclass(frozen=True)
class Assignment:
    """`bin_of[v]` is the bin index (into `bins`) of node v (int16). `order` is the hotness ranking the
    policy used (node ids, hottest first, ties by id); shards store their nodes in this order."""

    policy: str
    bins: BinSet
    bin_of: np.ndarray
    order: np.ndarray
    rows: np.ndarray = field(repr=False)  # per bin, int64
    access: np.ndarray = field(repr=False)  # per bin, float64: sum of the hotness of its nodes
    pool: int | None = None
    engine: str = "numpy"

    @property
    def num_nodes(self) -> int:
        return int(self.bin_of.shape[0])

    @property
    def total_access(self) -> float:
        return float(self.access.sum())

    def achieved_shares(self) -> np.ndarray:
        t = self.access.sum()
        return self.access / t if t > 0 else np.zeros_like(self.access)

    def nodes_of(self, b: int) -> np.ndarray:
        """Node ids in bin b, hottest first (the order a shard stores them in)."""
        return self.order[self.bin_of[self.order] == b]


def validate_hotness(hotness: np.ndarray) -> np.ndarray:
    h = np.asarray(hotness)
    if h.ndim != 1:
        raise MomentError(f"hotness must be a 1-D array (one value per node), got shape {h.shape}")
    if h.dtype.kind not in "biuf":
        raise MomentError(f"hotness must be numeric, got dtype {h.dtype}")
    if h.dtype.kind == "f" and not np.isfinite(h).all():
        raise MomentError("hotness contains NaN or infinite values")
    if h.size and h.min() < 0:
        raise MomentError("hotness must be non-negative (access counts or frequencies)")
    return h


def hotness_order(h: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Node ids by descending hotness, ties by ascending id (stable). A given order is checked."""
    n = h.shape[0]
    if order is None:
        return _radix_order(h) if _small_counts(h) else np.argsort(-h, kind="stable").astype(np.int64)
    order = np.asarray(order)
    if order.shape != (n,) or order.dtype.kind not in "iu":
        raise MomentError(f"order must be {n} integer node ids, got shape {order.shape} dtype {order.dtype}")
    hs = h[order]
    if n > 1 and not (hs[:-1] >= hs[1:]).all():
        raise MomentError("order is not sorted by descending hotness")
    return order.astype(np.int64, copy=False)


def _small_counts(h: np.ndarray) -> bool:
    """Integer-valued hotness below 2^32 (pre-sampling counts): sortable by 16-bit radix passes."""
    if h.size == 0 or h.max() >= 2**32:
        return False
    return h.dtype.kind in "iub" or bool(np.equal(h, np.trunc(h)).all())


def _radix_order(h: np.ndarray) -> np.ndarray:
    """Stable descending order of integer counts with NumPy's O(n) 16-bit radix argsort (LSD, 1-2
    passes): ~2x faster than a comparison sort of floats at 10^8 nodes; same result."""
    key = (h.max() - h).astype(np.uint32)
    order = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")
    if int(key.max()) >= 1 << 16:
        hi = (key >> 16).astype(np.uint16)
        order = order[np.argsort(hi[order], kind="stable")]
    return order.astype(np.int64, copy=False)


def rank_to_nodes(order: np.ndarray, rank_bin: np.ndarray) -> np.ndarray:
    """Scatter per-rank bins to per-node bins."""
    bin_of = np.empty(order.shape[0], dtype=np.int16)
    bin_of[order] = rank_bin
    return bin_of
