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

NumPy, with the run-finding pass in C where the extension is built (no torch): the runtime's reader
and the planner-side SSD model use the same plans.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from moment.io.engines import _native

_native_plan = getattr(_native, "plan_runs", None)

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
        return self.price(len(plan), plan.bytes)

    def price(self, requests: int, nbytes: int) -> float:
        """Seconds the disk takes for `requests` reads of `nbytes` bytes in all."""
        return nbytes / self.bandwidth + requests / self.iops

    def limited(self, merge_gap: int | None = None, max_request: int | None = None) -> Shape:
        """This shape with a run's --io-merge-gap / --io-max-request (None: the shape's own)."""
        return dataclasses.replace(self, merge_gap=self.merge_gap if merge_gap is None else int(merge_gap),
                                   max_request=self.max_request if max_request is None else int(max_request))

    def longest(self, align: int, window: int) -> int:
        """The longest read of a plan (`max_request`, and no longer than the reader's staging buffer)."""
        return min(self.max_request, max(int(window), int(align)))

    def _least(self, placed: Placed, row_bytes: int, align: int, window: int, sizes: np.ndarray | None
               ) -> tuple[float, int]:
        """(price, merge gap) of the least costly plan of `placed` among the shape's gaps (`merge_gap`, or with -1
        those of `GAPS`), the smallest gap on a tie."""
        gaps = [self.merge_gap] if self.merge_gap >= 0 else [g for g in GAPS if g <= self.max_request]
        longest = self.longest(align, window)
        return min((self.price(*run_count(placed, row_bytes, align, g, longest, sizes)), g) for g in gaps)

    def _gap(self, placed: Placed, row_bytes: int, align: int, window: int, sizes: np.ndarray | None) -> int:
        """The merge gap of the plan of `placed` (`_least`; a fixed `merge_gap` without pricing it)."""
        return self.merge_gap if self.merge_gap >= 0 else self._least(placed, row_bytes, align, window, sizes)[1]

    def plan(self, f: np.ndarray, off: np.ndarray, row_bytes: int, align: int, window: int,
             sizes: np.ndarray | None = None) -> Plan:
        """The reads of one job (`_gap`); no read longer than `window` (the reader's staging buffer)."""
        placed = place(f, off)  # sorted once for every gap's plan
        gap = self._gap(placed, row_bytes, align, window, sizes)
        return plan_runs(f, off, row_bytes, align, gap, self.longest(align, window), sizes, placed)

    def plan_price(self, placed: Placed, row_bytes: int, align: int, window: int) -> float:
        """Seconds the disk takes for the reads `plan` makes of the rows `placed`."""
        return self._least(placed, row_bytes, align, window, None)[0]


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
    order: np.ndarray  # the rows sorted by place: grouped by run, runs in order

    @property
    def bytes(self) -> int:
        return int(self.length.sum())

    def __len__(self) -> int:
        return int(self.file.shape[0])


@dataclass(frozen=True)
class Placed:
    """Rows in place order (file, then offset): their numbers, files and offsets."""

    order: np.ndarray
    file: np.ndarray  # int32
    offset: np.ndarray  # int64


def place(f: np.ndarray, off: np.ndarray) -> Placed:
    """The rows at (file f, byte offset off) sorted by place.

    One int64 key per row when file and offset fit in it: rows already in place order (a scan) are not
    sorted again, rows in place order within each file are only grouped by file (`_by_file`), and the sort of
    one key is several times faster than `np.lexsort` of two. Rows at the same place (the same row twice) may
    come in either order: with a merge gap >= 0 they share a run."""
    n = f.shape[0]
    f64, off = f.astype(np.int64), off.astype(np.int64, copy=False)
    if n and int(off.min()) >= 0 and int(off.max()) < 1 << 40 and int(f64.min()) >= 0 and int(f64.max()) < 1 << 22:
        key = (f64 << 40) | off
        if (key[1:] >= key[:-1]).all():
            order = np.arange(n)
        elif (order := _by_file(f, key)) is None:
            order = np.argsort(key)
    else:
        order = np.lexsort((off, f))
    return Placed(order, _i32(f[order]), _i64(off[order]))


#: rows from which `_by_file` tries grouping by file before sorting the keys (below, a sort is quick anyway)
BY_FILE_ROWS = 1 << 16


def _by_file(f: np.ndarray, key: np.ndarray) -> np.ndarray | None:
    """The stable order of the rows by file alone, when it puts their `key`s in order: the rows of a CPU cache's
    first fill come hottest first, and each shard holds its rows hottest first, so they are in place order
    within each file, interleaved across files. A radix sort of the few file numbers is linear: 0.08 s against
    the keys' 0.80 s for the 6M rows of a 16M-node layout's fill. None otherwise, decided on 1,024 rows first,
    so that a batch's rows in no order pay next to nothing for the try."""
    n = f.shape[0]
    if n < BY_FILE_ROWS:
        return None
    step = n // 1024
    k = key[::step][np.argsort(f[::step], kind="stable")]
    if not (k[1:] >= k[:-1]).all() or int(f.max()) >= 1 << 15:
        return None
    order = np.argsort(f.astype(np.int16), kind="stable")  # int16: numpy's radix sort
    k = key[order]
    return order if (k[1:] >= k[:-1]).all() else None


def run_count(p: Placed, row_bytes: int, align: int, merge_gap: int, max_request: int,
              sizes: np.ndarray | None = None) -> tuple[int, int]:
    """(reads, bytes) of `plan_runs` over the placed rows `p`, without building the plan."""
    if _native_plan is not None:
        return _native_plan(p.file, p.offset, None, int(row_bytes), int(align), int(merge_gap), int(max_request),
                            None if sizes is None else _i64(sizes), None)
    plan = plan_runs(p.file, p.offset, row_bytes, align, merge_gap, max_request, sizes)
    return len(plan), plan.bytes


def plan_runs(f: np.ndarray, off: np.ndarray, row_bytes: int, align: int, merge_gap: int,
              max_request: int, sizes: np.ndarray | None = None, placed: Placed | None = None) -> Plan:
    """Aligned runs covering rows at (file f, byte offset off); rows may come in any order.

    Consecutive rows (sorted by place) share a run when the next row's first block is within
    `merge_gap` (>= 0) bytes of the run's last block and the run stays within `max_request` bytes (a
    single row larger than that still gets its own run). `sizes` (per file) clips runs at the end of a
    file whose length is not a multiple of `align` (the unpadded cache-bin files). `placed`: the rows as
    `place` sorted them (None: sorted here). The native pass (native/moment_io.c) and the NumPy one below
    give the same plan.
    """
    n = f.shape[0]
    if n == 0:
        z = np.zeros(0, np.int64)
        return Plan(z.astype(np.int32), z, z, z, z, z)
    p = place(f, off) if placed is None else placed
    order, fs, os_ = p.order, p.file, p.offset
    if _native_plan is not None:
        out = (np.empty(n, np.int32), *(np.empty(n, np.int64) for _ in range(4)))
        runs, _ = _native_plan(fs, os_, _i64(order), int(row_bytes), int(align), int(merge_gap), int(max_request),
                               None if sizes is None else _i64(sizes), out)
        r_file, r_start, r_len, row_run, row_at = out
        return Plan(r_file[:runs], r_start[:runs], r_len[:runs], row_run, row_at, order)
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
    return Plan(r_file, r_first * align, r_len, row_run, row_at, order)


def span_plan(file: int, start: int, n: int, row_bytes: int, align: int, max_request: int,
              size: int | None = None) -> Plan | None:
    """The plan `plan_runs` makes of `n` rows lying back to back from byte `start` of one file (a whole pack
    segment), by arithmetic: runs of as many whole rows as `max_request` holds. None unless those runs each start on
    a block and fill `max_request` exactly (`plan_runs` then).

    Why: the general plan places, merges and maps every row (1.4 ms for a 75k-row segment on its own; 5-10 ms at
    an epoch's start on the bench's 8M data-only run, beside the sampler on the same cores), while the disk
    waited for the epoch's first reads."""
    per = max(1, max_request // row_bytes)
    if n <= 0 or start % align or per * row_bytes % align or (per > 1 and max_request % row_bytes):
        return None  # (a row `plan_runs` starts in one run's last block it reads in that run)
    runs = -(-n // per)
    r_start = start + np.arange(runs, dtype=np.int64) * (per * row_bytes)
    rows = np.full(runs, per, np.int64)
    rows[-1] = n - per * (runs - 1)
    r_len = -(-rows * row_bytes // align) * align
    if size is not None:
        r_len = np.minimum(r_len, int(size) - r_start)
    i = np.arange(n, dtype=np.int64)
    return Plan(np.full(runs, file, np.int32), r_start, r_len, i // per, i % per * row_bytes, i)


def _i32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int32)


def _i64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)
