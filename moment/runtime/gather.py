"""Reading a set of feature rows from the layout's files: windows and a reader thread.

Which reads cover the rows (request merging, per I/O shape) is decided in `moment.io.merge`. A
job's reads are grouped into windows of at most `window` bytes; the reader thread keeps `inflight`
windows submitted to its own `IOStack` and copies the wanted rows out of each finished window into
the job's destination, so a scan of gigabytes needs only `window * inflight` bytes of staging.
Destinations are lent from a byte pool (`BufferPool`, one arena) by the reader thread, in job order, so
the buffers of jobs not yet consumed never exceed the pool (the memory budget's "read buffers").
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import MomentError
from moment.io import IOStack, ReadBatch, aligned_buffer, huge_page_buffer
from moment.io.merge import Plan, Shape, size_histogram
from moment.io.rows import copy_rows
from moment.runtime.threads import start_thread

WINDOW = 8 << 20  # bytes a reader job's reads may span at once: one staging buffer
INFLIGHT = 4  # staging buffers (windows) a reader keeps submitted


def staging_bytes(align: int, window: int = WINDOW, inflight: int = INFLIGHT) -> int:
    """What a `Reader` holds for its staging buffers (the memory budget charges this)."""
    return max(1, int(inflight)) * (max(int(window), int(align)) + int(align))


class BufferPool:
    """A byte budget for destinations, served from one arena of `capacity` bytes: `lend` blocks until a job's
    destination fits, `release` gives it back.

    Why one arena: a destination mapped afresh (a hyperbatch's is tens of MiB, above glibc's mmap threshold)
    has every page zeroed by the kernel when the direct read first pins it. On the 8M bench layout without a
    cgroup (2 ranks, `--memory-budget 2900MiB`) that was 0.16 CPU-s of a steady epoch's 2.7 (perf: clear_page
    under io_uring submission); the arena's pages are faulted in once and reused by every later job, and the
    epoch took 2.54-2.59. A destination goes at the lowest offset with room (first fit), so the arena's touched
    part stays the most the jobs held at once, not its whole capacity (under the bench's 3 GiB cgroup the runs'
    peak fell by 100-150 MiB). A job larger than the whole arena waits until the pool is idle and gets its own
    buffer (counted in `oversize`: the budget sizes the pool so this does not happen)."""

    def __init__(self, capacity: int, align: int = 4096):
        self.capacity, self.used = int(capacity), 0
        self.align = int(align)  # of every destination's first byte, so whole rows can be read into it directly
        self._cv = threading.Condition()
        self.peak = self.oversize = 0
        self._arena: np.ndarray | None = None  # made at the first lend: a pool never used holds nothing
        self._live: dict[int, int] = {}  # arena offset of a destination lent -> its bytes
        self._own: dict[int, int] = {}  # an oversize destination's first byte's address -> its bytes

    def _place(self, n: int) -> int | None:
        """The lowest arena offset where `n` bytes (a multiple of `align`) fit now, or None (never beside an
        oversize job)."""
        if self._own:
            return None
        end = 0
        for at in sorted(self._live):
            if at - end >= n:
                return end
            end = at + self._live[at]
        return end if self.capacity - end >= n else None

    def lend(self, rows: int, row_bytes: int, stop: threading.Event | None = None) -> np.ndarray | None:
        """A [rows, row_bytes] uint8 destination, its first byte aligned, once it fits; None when `stop` is set
        while waiting."""
        n = rows * row_bytes
        if not n:  # holds no byte (and an empty view's address is not its place)
            return np.empty((rows, row_bytes), np.uint8)
        size = -(-n // self.align) * self.align
        with self._cv:
            while True:
                at = self._place(size) if size <= self.capacity else None if self._live or self._own else -1
                if at is not None:
                    break
                if stop is not None and stop.is_set():
                    return None
                self._cv.wait(0.1)
            self.used += size
            self.peak = max(self.peak, self.used)
            if at < 0:
                self.oversize += 1
                dest = huge_page_buffer(size, self.align)[:n].reshape(rows, row_bytes)
                self._own[dest.ctypes.data] = size
                return dest
            if self._arena is None:
                self._arena = huge_page_buffer(self.capacity, self.align)
            self._live[at] = size
            return self._arena[at: at + n].reshape(rows, row_bytes)

    def release(self, dest: np.ndarray) -> None:
        """Give back a destination `lend` made."""
        if not dest.nbytes:
            return
        with self._cv:
            size = self._own.pop(dest.ctypes.data, None)
            self.used -= self._live.pop(dest.ctypes.data - self._arena.ctypes.data) if size is None else size
            self._cv.notify_all()


@dataclass
class Job:
    """Rows (file, offset) to read into `dest` rows [0, n) in the given order; `wait()` for them."""

    file: np.ndarray
    offset: np.ndarray
    shape: Shape
    dest: np.ndarray | None = None
    sizes: np.ndarray | None = None  # merge.size_histogram of its reads: how many, how many bytes
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    on_done: Callable[[Job], None] | None = None

    @property
    def n(self) -> int:
        return int(self.file.shape[0])

    def wait(self) -> np.ndarray:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.dest is not None
        return self.dest


class Reader:
    """One rank's reader thread over the layout's files; jobs run in submission order."""

    def __init__(self, paths: Sequence[str | Path], row_bytes: int, align: int, *, pool: BufferPool,
                 window: int = WINDOW, inflight: int = INFLIGHT, queue_depth: int = 128, backend: str | None = None,
                 direct: bool = True, device: Any = "cpu", trace: str | Path | None = None):
        self.row_bytes, self.align = int(row_bytes), int(align)
        self.window = max(int(window), self.align)
        self.inflight = max(1, int(inflight))
        self.pool = pool
        self.stack = IOStack(paths, queue_depth=queue_depth, backend=backend, direct=direct, alignment=align,
                             trace=trace)
        self.sizes = np.array([Path(p).stat().st_size for p in paths], np.int64)
        self._jobs: collections.deque[Job] = collections.deque()
        self._cv = threading.Condition()
        self._stop = threading.Event()
        # aligned, so the block-aligned runs are read in place (no bounce copy per read)
        self._staging = [aligned_buffer(self.window + self.align, self.align) for _ in range(self.inflight)]
        self.direct_rows = 0  # rows read straight into their job's destination (`_direct`)
        self._thread = start_thread(self._loop, "moment-reader", device)

    @property
    def backend(self) -> str:
        return self.stack.backend

    @property
    def staging_bytes(self) -> int:
        return sum(b.nbytes for b in self._staging)

    @property
    def busy(self) -> bool:
        """Whether a job submitted earlier is still being read."""
        return bool(self._jobs)

    def submit(self, job: Job) -> Job:
        if self._stop.is_set():
            raise MomentError("the reader is closed")
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()
        return job

    def close(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        self._thread.join()
        self.stack.close()
        for j in self._jobs:
            j.error = MomentError("the reader was closed before this read finished")
            j.done.set()
        self._jobs.clear()

    # -- the thread

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._stop.is_set():
                    self._cv.wait()
                if self._stop.is_set():
                    return
                job = self._jobs[0]
            try:
                if job.dest is None:
                    job.dest = self.pool.lend(job.n, self.row_bytes, self._stop)
                    if job.dest is None:
                        return
                self._run(job)
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the job
                job.error = e
            with self._cv:
                self._jobs.popleft()
            if job.on_done is not None:
                job.on_done(job)
            job.done.set()

    def _windows(self, plan: Plan) -> list[tuple[int, int]]:
        """Run ranges [a, b) whose bytes fit one staging buffer each."""
        if not len(plan):
            return []
        ends = np.cumsum(plan.length)
        out, a = [], 0
        n = len(plan)
        while a < n:
            base = int(ends[a - 1]) if a else 0
            b = int(np.searchsorted(ends, base + self.window, side="right"))
            b = max(b, a + 1)
            out.append((a, min(b, n)))
            a = b
        return out

    def _direct(self, plan: Plan, by_run: np.ndarray, run_rows: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """Per run: whether its bytes are exactly its rows, at consecutive rows of `dest` in file order, so it
        can be read straight into `dest` (no staging, no copy): the run holds nothing else, its rows are
        adjacent in the file and in `dest`, and its place in `dest` is aligned for a direct read."""
        rb, n = self.row_bytes, len(plan)
        counts = np.diff(run_rows)
        base = dest.ctypes.data
        if not n or base % self.align or not dest.flags.c_contiguous:
            return np.zeros(n, bool)
        first = run_rows[:-1]
        k = np.arange(by_run.shape[0]) - np.repeat(first, counts)  # each row's place in its run
        lead = np.repeat(by_run[first], counts)
        fits = (by_run == lead + k) & (plan.row_at[by_run] == k * rb)
        return ((plan.length == counts * rb) & (by_run[first] * rb % self.align == 0)
                & np.logical_and.reduceat(fits, first))

    def _run(self, job: Job) -> None:
        plan = job.shape.plan(job.file, job.offset, self.row_bytes, self.align, self.window, self.sizes)
        job.sizes = size_histogram(plan.length)
        wins = self._windows(plan)
        # rows grouped by run (the plan's place order), so each window's rows are one contiguous slice
        by_run = plan.order
        run_rows = np.searchsorted(plan.row_run[by_run], np.arange(len(plan) + 1))
        direct = self._direct(plan, by_run, run_rows, job.dest)
        flat = job.dest.reshape(-1) if direct.any() else job.dest  # a view: `_direct` asks a contiguous one
        self.direct_rows += int(np.diff(run_rows)[direct].sum())
        flight: collections.deque[tuple[list[int], int, int, int, np.ndarray]] = collections.deque()
        free = list(range(self.inflight))
        w = 0
        while w < len(wins) or flight:
            while w < len(wins) and free:
                a, b = wins[w]
                k = free.pop()
                staged = ~direct[a:b]
                at = np.zeros(b - a, np.int64)  # a staged run's place in the staging buffer
                np.cumsum(np.where(staged, plan.length[a:b], 0)[:-1], out=at[1:])
                tickets = []
                for sel, dst, buf in ((staged, at, self._staging[k]),
                                      (~staged, by_run[run_rows[a:b]] * self.row_bytes, flat)):
                    if sel.any():
                        r = slice(a, b)
                        tickets.append(self.stack.submit(ReadBatch(plan.file[r][sel], plan.start[r][sel],
                                                                   plan.length[r][sel], dst[sel]), buf))
                flight.append((tickets, a, b, k, at))
                w += 1
            tickets, a, b, k, at = flight.popleft()
            for t in tickets:
                self.stack.wait(t)
            if self._stop.is_set():
                raise MomentError("the reader was closed before this read finished")
            rows = by_run[run_rows[a]:run_rows[b]]
            run = plan.row_run[rows] - a
            staged = ~direct[a:b][run]
            if staged.any():
                rows, run = rows[staged], run[staged]
                copy_rows(job.dest, rows, self._staging[k], at[run] + plan.row_at[rows], 1)  # byte offsets
            free.append(k)
