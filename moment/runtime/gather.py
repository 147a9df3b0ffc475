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
from moment.io.merge import Plan, Shape
from moment.io.rows import copy_rows
from moment.runtime.threads import start_thread

WINDOW = 8 << 20  # bytes a reader job's reads may span at once: one staging buffer
INFLIGHT = 4  # staging buffers (windows) a reader keeps submitted


def staging_bytes(align: int, window: int = WINDOW, inflight: int = INFLIGHT) -> int:
    """What a `Reader` holds for its staging buffers (the memory budget charges this)."""
    return max(1, int(inflight)) * (max(int(window), int(align)) + int(align))


class BufferPool:
    """A byte budget for destinations: `take` blocks until `n` bytes are free (FIFO by caller)."""

    def __init__(self, capacity: int):
        self.capacity, self.used = int(capacity), 0
        self._cv = threading.Condition()
        self.peak = self.oversize = 0

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
    bytes_read: int = 0
    requests: int = 0
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
                 direct: bool = True, device: Any = "cpu"):
        self.row_bytes, self.align = int(row_bytes), int(align)
        self.window = max(int(window), self.align)
        self.inflight = max(1, int(inflight))
        self.pool = pool
        self.stack = IOStack(paths, queue_depth=queue_depth, backend=backend, direct=direct, alignment=align)
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
                    job.dest = np.empty((job.n, self.row_bytes), np.uint8)
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
        job.requests = len(plan)
        job.bytes_read = plan.bytes
        wins = self._windows(plan)
        # rows grouped by run, so each window's rows are one contiguous slice
        by_run = np.argsort(plan.row_run, kind="stable")
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
