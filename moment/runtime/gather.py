"""Reading a set of feature rows from the layout's files: windows and a reader thread.

Which reads cover the rows (request merging, per I/O shape) is decided in `moment.io.merge`. A
job's reads are grouped into windows of at most `window` bytes; the reader thread keeps `inflight`
windows submitted to its own `IOStack` (the next job's as soon as the last of the one before are) and
copies the wanted rows out of each finished window into the job's destination, so a scan of gigabytes
needs only `window * inflight` bytes of staging.
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
from moment.io.merge import Plan, Shape, size_histogram, span_plan
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

    def lend(self, rows: int, row_bytes: int, stop: threading.Event | None = None, *, wait: bool = True
             ) -> np.ndarray | None:
        """A [rows, row_bytes] uint8 destination, its first byte aligned, once it fits; None when `stop` is set
        while waiting, or at once when it does not fit now and not `wait`."""
        n = rows * row_bytes
        if not n:  # holds no byte (and an empty view's address is not its place)
            return np.empty((rows, row_bytes), np.uint8)
        size = -(-n // self.align) * self.align
        with self._cv:
            while True:
                at = self._place(size) if size <= self.capacity else None if self._live or self._own else -1
                if at is not None:
                    break
                if not wait or stop is not None and stop.is_set():
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
    """Rows (file, offset) to read into `dest` rows [0, n) in the given order; `wait()` for them. `span`: the rows
    lie back to back in one file from the first's offset (a whole pack segment), planned by arithmetic."""

    file: np.ndarray
    offset: np.ndarray
    shape: Shape
    dest: np.ndarray | None = None
    span: bool = False
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


@dataclass(eq=False)
class _Reading:
    """A job being read: its plan, its windows and the next to submit, how many are in flight."""

    job: Job
    plan: Plan | None = None
    wins: list[tuple[int, int]] = field(default_factory=list)
    w: int = 0
    in_flight: int = 0
    by_run: np.ndarray | None = None
    run_rows: np.ndarray | None = None
    direct: np.ndarray | None = None
    flat: np.ndarray | None = None


@dataclass(eq=False)
class _Window:
    """A window's reads in flight: its tickets, its runs [a, b) of the job's plan, its staging buffer (-1: read
    straight into the destination) and its runs' places there."""

    reading: _Reading
    tickets: list[int]
    a: int
    b: int
    slot: int
    at: np.ndarray


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
        """Jobs' windows in one queue: the next job is planned and its first windows submitted while the last
        windows of the one before are still being read, so a rank's reads do not drain to nothing between its
        jobs (a job is one batch, or one hyperbatch). Jobs still finish, and lend their destinations, in order.

        Why: read one job at a time, the bench's 8M data-only run (two ranks, a whole 38 MB batch a job) left the
        disk with no read at all 10% of each epoch, at the ends of jobs, while each rank had three batches
        waiting, and planning a job (its place order and merge) went on while its rank read nothing."""
        flight: collections.deque[_Window] = collections.deque()  # submitted, oldest first
        started: collections.deque[_Reading] = collections.deque()  # jobs begun, not yet finished, in order
        free = list(range(self.inflight))  # staging buffers
        while True:
            cur = started[-1] if started else None
            while len(flight) < self.inflight and not self._stop.is_set():
                if cur is None or cur.w == len(cur.wins):
                    cur = self._begin(len(started), wait=not started)
                    if cur is None:
                        break
                    started.append(cur)
                    if not cur.wins:
                        continue
                if not self._submit_window(cur, flight, free):
                    break
            if self._stop.is_set():  # reaped before the stack closes: no read lands in a buffer given back
                while flight:
                    self._finish_window(flight.popleft(), free)
                return
            if flight:
                self._finish_window(flight.popleft(), free)
            while started and started[0].w == len(started[0].wins) and not started[0].in_flight:
                self._end(started.popleft())

    def _begin(self, i: int, wait: bool) -> _Reading | None:
        """The `i`-th job not yet finished (0: the oldest), planned; None when there is none yet (waiting
        for one when `wait`), or its destination does not fit the pool now (only waited for with nothing else
        in flight: the jobs whose buffers hold the pool end only as the reads in flight finish)."""
        with self._cv:
            while len(self._jobs) <= i:
                if not wait or self._stop.is_set():
                    return None
                self._cv.wait()
            job = self._jobs[i]
        r = _Reading(job)
        try:
            if job.dest is None:
                job.dest = self.pool.lend(job.n, self.row_bytes, self._stop, wait=wait)
                if job.dest is None:
                    return None
            self._plan(r)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the job
            job.error, r.wins = e, []
        return r

    def _plan(self, r: _Reading) -> None:
        job = r.job
        plan = None
        if job.span and job.n:
            f = int(job.file[0])
            plan = span_plan(f, int(job.offset[0]), job.n, self.row_bytes, self.align,
                             job.shape.longest(self.align, self.window), int(self.sizes[f]))
        spanned = plan is not None  # its rows fill its runs in order (plan.order is 0..n-1)
        if plan is None:
            plan = job.shape.plan(job.file, job.offset, self.row_bytes, self.align, self.window, self.sizes)
        job.sizes = size_histogram(plan.length)
        r.plan, r.wins = plan, self._windows(plan)
        # rows grouped by run (the plan's place order), so each window's rows are one contiguous slice
        r.by_run = plan.order
        r.run_rows = np.searchsorted(plan.row_run if spanned else plan.row_run[r.by_run], np.arange(len(plan) + 1))
        r.direct = self._direct(plan, r.by_run, r.run_rows, job.dest, spanned)
        r.flat = job.dest.reshape(-1) if r.direct.any() else job.dest  # a view: `_direct` asks a contiguous one
        self.direct_rows += int(np.diff(r.run_rows)[r.direct].sum())

    def _submit_window(self, r: _Reading, flight: collections.deque[_Window], free: list[int]) -> bool:
        """Submit `r`'s next window; False when it needs a staging buffer and none is free."""
        a, b = r.wins[r.w]
        staged = ~r.direct[a:b]
        if staged.any() and not free:
            return False
        k = free.pop() if staged.any() else -1
        plan = r.plan
        at = np.zeros(b - a, np.int64)  # a staged run's place in the staging buffer
        np.cumsum(np.where(staged, plan.length[a:b], 0)[:-1], out=at[1:])
        tickets = []
        try:
            for sel, dst, buf in ((staged, at, self._staging[k]),
                                  (~staged, r.by_run[r.run_rows[a:b]] * self.row_bytes, r.flat)):
                if sel.any():
                    s = slice(a, b)
                    tickets.append(self.stack.submit(ReadBatch(plan.file[s][sel], plan.start[s][sel],
                                                               plan.length[s][sel], dst[sel]), buf))
        except BaseException as e:  # noqa: BLE001 - the job fails; what it submitted is still reaped
            r.job.error = r.job.error or e
            r.w = len(r.wins)
        else:
            r.w += 1
        r.in_flight += 1
        flight.append(_Window(r, tickets, a, b, k, at))
        return True

    def _finish_window(self, win: _Window, free: list[int]) -> None:
        r = win.reading
        try:
            failed = None
            for t in win.tickets:  # every one reaped, even after a failure
                try:
                    self.stack.wait(t)
                except BaseException as e:  # noqa: BLE001 - the first is raised below
                    failed = failed or e
            if failed is not None:
                raise failed
            if self._stop.is_set():
                raise MomentError("the reader was closed before this read finished")
            if r.job.error is None:
                a, b = win.a, win.b
                rows = r.by_run[r.run_rows[a]:r.run_rows[b]]
                run = r.plan.row_run[rows] - a
                staged = ~r.direct[a:b][run]
                if staged.any():
                    rows, run = rows[staged], run[staged]
                    copy_rows(r.job.dest, rows, self._staging[win.slot], win.at[run] + r.plan.row_at[rows], 1)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the job
            r.job.error = r.job.error or e
            r.w = len(r.wins)  # no more of its windows: those in flight are still reaped
        finally:
            if win.slot >= 0:
                free.append(win.slot)
            r.in_flight -= 1

    def _end(self, r: _Reading) -> None:
        job = r.job
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

    def _direct(self, plan: Plan, by_run: np.ndarray, run_rows: np.ndarray, dest: np.ndarray,
                spanned: bool = False) -> np.ndarray:
        """Per run: whether its bytes are exactly its rows, at consecutive rows of `dest` in file order, so it
        can be read straight into `dest` (no staging, no copy): the run holds nothing else, its rows are
        adjacent in the file and in `dest`, and its place in `dest` is aligned for a direct read. `spanned`: a
        `span_plan`'s, whose rows are adjacent in both by construction, so no row is looked at (a 75k-row segment
        planned in 0.40 ms against 1.29-1.32 with the per-row test, bench/segment_plan.py; at an epoch's start the
        disk waits for that plan)."""
        rb, n = self.row_bytes, len(plan)
        counts = np.diff(run_rows)
        base = dest.ctypes.data
        if not n or base % self.align or not dest.flags.c_contiguous:
            return np.zeros(n, bool)
        first = run_rows[:-1]
        if spanned:
            return (plan.length == counts * rb) & (by_run[first] * rb % self.align == 0)
        k = np.arange(by_run.shape[0]) - np.repeat(first, counts)  # each row's place in its run
        lead = np.repeat(by_run[first], counts)
        fits = (by_run == lead + k) & (plan.row_at[by_run] == k * rb)
        return ((plan.length == counts * rb) & (by_run[first] * rb % self.align == 0)
                & np.logical_and.reduceat(fits, first))

