"""Request merging: which aligned reads cover a set of feature rows, for each I/O shape.

Why one mechanism for every I/O shape: the shapes differ only in *which* rows are read together and
*how far* a read may run across rows nobody asked for.

* ``rows``  — each mini-batch's misses alone, merging only rows that share or touch an aligned
  block (per-row direct reads, the Hyperion/Moment path).
* ``block`` — the misses of a whole hyperbatch (many mini-batches, AGNES) at once, merged across
  gaps into large reads (up to `max_request`): reading a gap costs gap / sequential bandwidth, a
  separate request costs 1 / IOPS, so each job takes the merge gap whose plan costs least on the
  disk (`Shape.cost`): dense hyperbatches become sequential scans, sparse ones stay row reads.
* ``packed`` — block reads over the contiguous per-batch segments `moment data pack` wrote (DiskGNN).

Pure NumPy (no torch): the runtime's reader and the planner-side SSD model use the same plans.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np


GAPS = (0, 4 << 10, 16 << 10, 64 << 10, 256 << 10)


@dataclass(frozen=True)
class Shape:
    """How reads are grouped and merged (see the module docstring).

    `merge_gap` -1 picks, per job, the gap among `GAPS` whose plan costs least on a disk that reads
    `bandwidth` bytes/s sequentially and `iops` requests/s (defaults: this VM's disk, measured with dd
    and bench/iostack.py; set MOMENT_IO_BANDWIDTH / MOMENT_IO_IOPS for another).
    """

    name: str
    merge_gap: int
    max_request: int
    bandwidth: float = 1.2e9
    iops: float = 45e3

    def cost(self, plan: Plan) -> float:
        return plan.bytes / self.bandwidth + len(plan) / self.iops

    def limited(self, merge_gap: int | None = None, max_request: int | None = None) -> Shape:
        """This shape with a run's --io-merge-gap / --io-max-request (None: the shape's own)."""
        return dataclasses.replace(self, merge_gap=self.merge_gap if merge_gap is None else int(merge_gap),
                                   max_request=self.max_request if max_request is None else int(max_request))

    def plan(self, f: np.ndarray, off: np.ndarray, row_bytes: int, align: int, window: int,
             sizes: np.ndarray | None = None) -> Plan:
        """The reads of one job: with `merge_gap` -1 the plan of the gap (among `GAPS`) that costs least,
        the smallest gap on a tie; no read longer than `window` (the reader's staging buffer)."""
        gaps = [g for g in GAPS if g <= self.max_request] if self.merge_gap < 0 else [self.merge_gap]
        longest = min(self.max_request, max(int(window), int(align)))
        plans = [plan_runs(f, off, row_bytes, align, g, longest, sizes) for g in gaps]
        return min(plans, key=self.cost)


def _disk(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


SHAPES = {
    "rows": Shape("rows", merge_gap=0, max_request=128 << 10),
    "block": Shape("block", merge_gap=-1, max_request=1 << 20, bandwidth=_disk("MOMENT_IO_BANDWIDTH", 1.2e9),
                   iops=_disk("MOMENT_IO_IOPS", 45e3)),
}
SHAPES["packed"] = dataclasses.replace(SHAPES["block"], name="packed")  # block reads over the pack's segments


SIZE_BUCKETS = 32  # request sizes by power of two: bucket k holds reads of [2**k, 2**(k+1)) bytes


def size_histogram(length: np.ndarray) -> np.ndarray:
    """(2, SIZE_BUCKETS) float64: requests, then bytes, per power-of-two size bucket (what a disk's rate
    for the same mix of request sizes is measured with)."""
    k = np.minimum(np.log2(np.maximum(length, 1)).astype(np.int64), SIZE_BUCKETS - 1)
    return np.stack([np.bincount(k, minlength=SIZE_BUCKETS).astype(np.float64),
                     np.bincount(k, weights=length, minlength=SIZE_BUCKETS)])


@dataclass
class Plan:
    """Reads covering a set of rows, and where each row sits in the read bytes."""

    file: np.ndarray  # per run
    start: np.ndarray  # per run, aligned byte offset
    length: np.ndarray  # per run, multiple of align
    row_run: np.ndarray  # per row: its run
    row_at: np.ndarray  # per row: byte offset inside its run

    @property
    def bytes(self) -> int:
        return int(self.length.sum())

    def __len__(self) -> int:
        return int(self.file.shape[0])


def plan_runs(f: np.ndarray, off: np.ndarray, row_bytes: int, align: int, merge_gap: int,
              max_request: int, sizes: np.ndarray | None = None) -> Plan:
    """Aligned runs covering rows at (file f, byte offset off); rows may come in any order.

    Consecutive rows (sorted by place) share a run when the next row's first block is within
    `merge_gap` bytes of the run's last block and the run stays within `max_request` bytes (a single
    row larger than that still gets its own run). `sizes` (per file) clips runs at the end of a file
    whose length is not a multiple of `align` (the unpadded cache-bin files).
    """
    n = f.shape[0]
    if n == 0:
        z = np.zeros(0, np.int64)
        return Plan(z.astype(np.int32), z, z, z, z)
    order = np.lexsort((off, f))
    fs, os_ = f[order], off[order]
    first = os_ // align
    last = (os_ + row_bytes - 1) // align
    gap_blocks = merge_gap // align
    cap = max(1, max_request // align)
    # a new run where the file changes or the gap is too wide; then split runs longer than `cap` blocks
    new = np.ones(n, dtype=bool)
    new[1:] = (fs[1:] != fs[:-1]) | (first[1:] > last[:-1] + 1 + gap_blocks)
    run = np.cumsum(new) - 1
    start = first[new][run]
    piece = (first - start) // cap
    new[1:] |= piece[1:] != piece[:-1]
    run = np.cumsum(new) - 1
    r_first = first[new]
    r_last = np.maximum.reduceat(last, np.flatnonzero(new))
    row_run = np.empty(n, np.int64)
    row_at = np.empty(n, np.int64)
    row_run[order] = run
    row_at[order] = os_ - r_first[run] * align
    r_file = fs[new].astype(np.int32)
    r_len = (r_last - r_first + 1) * align
    if sizes is not None:
        r_len = np.minimum(r_len, np.asarray(sizes, np.int64)[r_file] - r_first * align)
    return Plan(r_file, r_first * align, r_len, row_run, row_at)
