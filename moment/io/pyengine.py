"""Pure-Python engine: a pool of threads doing os.preadv (which releases the GIL) per request.

Same queues and semantics as the native engines, used where the C extension could not be built.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import time

import numpy as np


class _Batch:
    __slots__ = ("align", "bytes_read", "dest", "err", "id", "next", "remaining", "reqs")

    def __init__(self, bid, reqs, align, dest):
        self.id, self.reqs, self.next, self.remaining = bid, reqs, 0, len(reqs)
        self.bytes_read, self.err, self.align, self.dest = 0, None, align, dest


class PyEngine:
    kind = "python"

    def __init__(self, queue_depth: int, threads: int | None = None):
        self._cv = threading.Condition()
        self._pending: collections.deque[_Batch] = collections.deque()
        self._done: dict[int, _Batch] = {}
        self._live: set[int] = set()
        self._next_id = 1
        self._stopping = False
        self._threads = [threading.Thread(target=self._worker, daemon=True, name=f"moment-io-{i}")
                         for i in range(threads or queue_depth)]
        for t in self._threads:
            t.start()

    def submit(self, fds, offsets, lengths, dest_offsets, dest, align: int) -> int:
        dest = np.frombuffer(dest, dtype=np.uint8) if not isinstance(dest, np.ndarray) else dest.view(np.uint8)
        if not dest.flags.writeable:
            raise ValueError("destination is not writable")
        keep = np.flatnonzero(np.asarray(lengths) > 0)
        base = dest.ctypes.data
        reqs = []
        for i in keep.tolist():
            off, ln, doff = int(offsets[i]), int(lengths[i]), int(dest_offsets[i])
            if doff + ln > len(dest):
                raise ValueError(f"request {i} out of range of the destination")
            aoff = off & ~(align - 1)
            alen = ((off + ln + align - 1) & ~(align - 1)) - aoff
            inplace = aoff == off and alen == ln and (base + doff) % align == 0
            reqs.append((i, int(fds[i]), off, ln, doff, aoff, alen, inplace))
        with self._cv:
            if self._stopping:
                raise RuntimeError("engine is closed")
            b = _Batch(self._next_id, reqs, align, dest)
            self._next_id += 1
            self._live.add(b.id)
            if reqs:
                self._pending.append(b)
            else:
                self._done[b.id] = b
            self._cv.notify_all()
        return b.id

    def reap(self, batch_id: int, min_count: int, timeout: float) -> list[tuple[int, int, int, int, int]]:
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._cv:
            while True:
                if batch_id > 0:
                    if batch_id not in self._live:
                        raise KeyError(f"unknown or already reaped batch {batch_id}")
                    ready = [batch_id] if batch_id in self._done else []
                    if ready:
                        break
                elif len(self._done) >= max(min_count, 1) or min_count <= 0:
                    ready = list(self._done)
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    ready = [] if batch_id > 0 else list(self._done)
                    break
                self._cv.wait(left)
            out = []
            for bid in ready:
                b = self._done.pop(bid)
                self._live.discard(bid)
                idx, code, got = b.err if b.err else (-1, 0, 0)
                out.append((bid, b.bytes_read, idx, code, got))
            return out

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _take(self):
        while self._pending:
            b = self._pending[0]
            if b.err is not None or self._stopping:
                self._pending.popleft()
                if b.err is None:
                    b.err = (b.reqs[b.next][0], 125, 0)  # ECANCELED
                b.remaining -= len(b.reqs) - b.next
                b.next = len(b.reqs)
                if b.remaining == 0:
                    self._done[b.id] = b
                    self._cv.notify_all()
                continue
            r = b.reqs[b.next]
            b.next += 1
            if b.next == len(b.reqs):
                self._pending.popleft()
            return b, r
        return None

    def _worker(self) -> None:
        bounce = None
        while True:
            with self._cv:
                item = self._take()
                while item is None:
                    if self._stopping:
                        return
                    self._cv.wait()
                    item = self._take()
            b, (i, fd, off, ln, doff, aoff, alen, inplace) = item
            if inplace:
                target = memoryview(b.dest)[doff:doff + ln]
            else:
                if bounce is None or len(bounce) < alen:
                    bounce = mmap.mmap(-1, max(alen, 1 << 16))  # page aligned, as O_DIRECT needs
                target = memoryview(bounce)[:alen]
            got, err, short = 0, 0, False
            need = off + ln - aoff
            while got < need:
                try:
                    res = os.preadv(fd, [target[got:]], aoff + got)
                except InterruptedError:
                    continue
                except OSError as e:
                    err = e.errno or 5
                    break
                got += res
                if got < need and (res == 0 or got % b.align):
                    short = True
                    break
            if not err and not short and not inplace:
                b.dest[doff:doff + ln] = np.frombuffer(bounce, np.uint8, ln, off - aoff)
            del target
            with self._cv:
                b.bytes_read += got
                if (err or short) and b.err is None:
                    b.err = (i, err, got)
                b.remaining -= 1
                if b.remaining == 0:
                    self._done[b.id] = b
                    self._cv.notify_all()
