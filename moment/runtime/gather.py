"""Reading a set of feature rows from the layout's files: windows and a reader thread.

Which reads cover the rows (request merging, per I/O shape) is decided in `moment.io.merge`. A
job's reads are grouped into windows of at most `window` bytes; the reader thread keeps `inflight`
windows submitted to its own `IOStack` and copies the wanted rows out of each finished window into
the job's destination, so a scan of gigabytes needs only `window * inflight` bytes of staging.
Destinations are taken from a byte pool (`BufferPool`) by the reader thread, in job order, so the
buffers of jobs not yet consumed never exceed the pool (the memory budget's "read buffers").
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
from moment.io import IOStack, ReadBatch, aligned_buffer
from moment.io.merge import Plan, Shape, size_histogram
from moment.io.rows import copy_rows
from moment.runtime.threads import start_thread

WINDOW = 8 << 20  # bytes a reader job's reads may span at once: one staging buffer
INFLIGHT = 4  # staging buffers (windows) a reader keeps submitted


def staging_bytes(align: int, window: int = WINDOW, inflight: int = INFLIGHT) -> int:
    """What a `Reader` holds for its staging buffers (the memory budget charges this)."""
    return max(1, int(inflight)) * (max(int(window), int(align)) + int(align))


class BufferPool:
    """A byte budget for destinations: `take` blocks until `n` bytes are free (FIFO by caller).

    Destinations given back (`release`) are kept for the next jobs while they fit the budget beside the
    bytes in use: a fresh batch-sized array is mapped anew by the allocator (glibc's 1 MiB mmap threshold,
    moment.runtime.budget.return_freed_memory), and faulting its pages in cost the reader more CPU than
    copying the rows into it. What the pool holds, used and kept, stays within its capacity."""

    def __init__(self, capacity: int):
        self.capacity, self.used = int(capacity), 0
        self._cv = threading.Condition()
        self.peak = self.oversize = 0
        self._kept: list[np.ndarray] = []  # freed flat uint8 buffers, ready for a job
        self.kept_bytes = 0
        self.reused = 0  # destinations served from a kept buffer

    def array(self, rows: int, row_bytes: int) -> np.ndarray:
        """A [rows, row_bytes] uint8 destination for bytes already taken: the smallest kept buffer that holds
        it when its extra bytes fit the budget (counted as used until it is released), else a new one."""
        n = rows * row_bytes
        with self._cv:
            fits = [b for b in self._kept if n <= b.nbytes and self.used + b.nbytes - n <= max(self.capacity, n)]
            if fits:
                buf = min(fits, key=lambda b: b.nbytes)
                del self._kept[next(i for i, b in enumerate(self._kept) if b is buf)]  # arrays compare by value
                self.kept_bytes -= buf.nbytes
                self.used += buf.nbytes - n
                self.peak = max(self.peak, self.used)
                self.reused += 1
                return buf[:n].reshape(rows, row_bytes)
            while self._kept and self.used + self.kept_bytes > self.capacity:  # room for the new one
                self.kept_bytes -= self._kept.pop(0).nbytes
        return np.empty(n, np.uint8).reshape(rows, row_bytes)

    def release(self, dest: np.ndarray) -> None:
        """Give back a destination `array` made: its bytes, and the buffer kept if it fits beside the rest."""
        buf = dest if dest.base is None else dest.base
        with self._cv:
            self.used -= buf.nbytes
            if buf.base is None and buf.ndim == 1 and self.used + self.kept_bytes + buf.nbytes <= self.capacity:
                self._kept.append(buf)
                self.kept_bytes += buf.nbytes
            self._cv.notify_all()

    def take(self, n: int, stop: threading.Event | None = None) -> bool:
        """Wait until `n` bytes fit; a job larger than the whole pool waits until the pool is idle and
        then runs alone (counted in `oversize`: the budget sizes the pool so this does not happen)."""
        with self._cv:
            while self.used and self.used + n > self.capacity:
                if stop is not None and stop.is_set():
                    return False
                self._cv.wait(0.1)
            if n > self.capacity:
                self.oversize += 1
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._cv:
            self.used -= n
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
        self._thread = start_thread(self._loop, "moment-reader", device)

    @property
    def backend(self) -> str:
        return self.stack.backend

    @property
    def staging_bytes(self) -> int:
        return sum(b.nbytes for b in self._staging)

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
                    if not self.pool.take(job.n * self.row_bytes, self._stop):
                        return
                    job.dest = self.pool.array(job.n, self.row_bytes)
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

    def _run(self, job: Job) -> None:
        plan = job.shape.plan(job.file, job.offset, self.row_bytes, self.align, self.window, self.sizes)
        job.sizes = size_histogram(plan.length)
        wins = self._windows(plan)
        # rows grouped by run (the plan's place order), so each window's rows are one contiguous slice
        by_run = plan.order
        run_rows = np.searchsorted(plan.row_run[by_run], np.arange(len(plan) + 1))
        flight: collections.deque[tuple[int, int, int, np.ndarray]] = collections.deque()
        free = list(range(self.inflight))
        w = 0
        while w < len(wins) or flight:
            while w < len(wins) and free:
                a, b = wins[w]
                k = free.pop()
                dst = np.zeros(b - a, np.int64)
                np.cumsum(plan.length[a:b - 1], out=dst[1:])
                t = self.stack.submit(ReadBatch(plan.file[a:b], plan.start[a:b], plan.length[a:b], dst),
                                      self._staging[k])
                flight.append((t, a, b, k))
                w += 1
            t, a, b, k = flight.popleft()
            self.stack.wait(t)
            if self._stop.is_set():
                raise MomentError("the reader was closed before this read finished")
            rows = by_run[run_rows[a]:run_rows[b]]
            dst0 = np.zeros(b - a, np.int64)
            np.cumsum(plan.length[a:b - 1], out=dst0[1:])
            src = dst0[plan.row_run[rows] - a] + plan.row_at[rows]
            copy_rows(job.dest, rows, self._staging[k], src, 1)  # byte offsets in the window
            free.append(k)
