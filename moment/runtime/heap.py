"""What a rank's allocator does with freed memory: hand it back at once, or keep a bounded amount for reuse.

Why: a rank makes and frees arrays of megabytes every batch (sampled blocks, gathered features, the step's
activations and gradients). glibc maps each array above its mmap threshold afresh and unmaps it on free, so
the kernel zeroes and the memory cgroup charges every page of it again on first touch. Measured on the
bench's 8M run (2 ranks on 2 cores, under 3 GiB), a quarter of an out-of-core rank's CPU was those page
faults. Keeping freed memory in the heap instead makes the next batch's arrays free of faults, but the heap
then holds its high-water mark (200-300 MiB per rank there), which a bounded run must charge to its budget.

So the budget grants it (`moment.runtime.budget`: the "heap reuse" item) and the rank keeps at most that much:
a `HeapKeeper` thread reads how much freed heap is resident and trims it (`malloc_trim`) when it is over. When
a CPU step reads packed segments the item is claimed before the CPU cache (at most half of what is left): on
that run the ranks kept 103 MiB each and the cache got 190 MiB instead of 380, steady epochs 1.67-1.68 s against
1.90-2.06 s, the ranks' CPU 17% less, a few trims per rank and run (a packed miss is cheap to read again). With
the block and rows shapes, which pay per request, the same trade made their epochs 20-30% slower (5.1-6.3 s),
and the data-only run (no step: the reads have the cores) 60% slower: there the cache comes first and the heap
keeps only what it leaves. A run granted nothing hands freed memory back at once, as before; so does one off
glibc (or before glibc 2.33: no `mallinfo2`), where the keeper cannot measure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

from moment.runtime.memory_use import status_kib
from moment.runtime.threads import start_thread

RELEASE_THRESHOLD = 1 << 20  # arrays above it are mapped and unmapped: freed memory goes back at once
KEEP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold: batch-sized arrays stay in the heap
RELEASE_ARENAS = 2  # few arenas: threads' freed chunks pool instead of staying in one arena per thread
KEEP_ARENAS = 1  # threads started from then on share one arena: one high-water mark kept, not one per arena
PERIOD_S = 0.1
GROWTH_STEP = 1 << 20  # resident growth that makes the keeper measure again: the interpreter's own pages do not


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018  (glibc only)
    except (OSError, AttributeError):
        return None
    return libc


def _rss_anon() -> int | None:
    kib = status_kib("self", "RssAnon")
    return None if kib is None else kib * 1024


class _AnonPages:
    """This process's resident anonymous bytes (RssAnon), from /proc/self/statm through a descriptor kept open:
    resident less shared (file and shmem pages). About 10 us a read, where parsing /proc/self/status took 230."""

    def __init__(self):
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")

    def read(self) -> int:
        f = os.pread(self._fd, 256, 0).split()
        return (int(f[1]) - int(f[2])) * self._page

    def close(self) -> None:
        os.close(self._fd)


def return_freed_memory() -> None:
    """Make glibc hand arrays above 1 MiB back to the kernel when freed (and use few arenas), so the process
    holds what the budget counts and no more; no effect off glibc."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, RELEASE_THRESHOLD)  # M_MMAP_THRESHOLD
        libc.mallopt(-8, RELEASE_ARENAS)  # M_ARENA_MAX


class HeapKeeper:
    """Keeps up to `limit` bytes of freed heap resident for reuse, trimming the rest.

    The freed heap's resident part is not reported by glibc; it is measured as the growth, since the
    keeper started, of the anonymous memory that is neither allocated (mallinfo2's in-use and mapped
    bytes) nor anything else's: RssAnon - uordblks - hblkhd, less its value at the start. Memory the
    interpreter maps outside malloc counts in it too, so the bound errs towards trimming.

    It is measured only when the resident memory grew by `GROWTH_STEP` (at most an eighth of the limit) since
    the last measure, and trimmed when over the limit less that step, so the unmeasured growth cannot carry it
    past the limit: what a rank holds can only pass its bound by growing, and mallinfo2 walks every free chunk
    of every arena under the arena's lock (29 ms with 200k freed chunks; on the bench's 16M training run the
    keeper's thread took 0.13-0.2 CPU-s of a 3.8 s epoch, checking every 0.1 s, and the other threads'
    allocations wait on that lock). So `peak_kept` is the most seen at those measures.
    """

    def __init__(self, libc: ctypes.CDLL, limit: int, period: float = PERIOD_S, device: Any = "cpu"):
        self.limit, self.period = int(limit), float(period)
        self.trims = 0
        self.peak_kept = 0  # the most freed heap seen resident (bytes over the start)
        self._libc = libc
        libc.mallinfo2.restype = _MallInfo2
        self._anon = _AnonPages()
        self._step = min(GROWTH_STEP, self.limit // 8)
        self._measured = -self._step  # RssAnon at the last measure that found nothing to trim
        self.measures = 0
        self._base: int | None = None
        self._stop = threading.Event()
        self._thread = start_thread(self._watch, "moment-heap-keeper", device)
        self._base = self._untracked(self._anon.read())  # after the thread's start, which may import torch

    def _untracked(self, rss: int) -> int:
        m = self._libc.mallinfo2()
        return rss - m.uordblks - m.hblkhd

    def check(self) -> bool:
        """Trim when the resident memory grew and the kept part of it is over the limit; True when it trimmed."""
        if self._base is None:
            return False
        rss = self._anon.read()
        if rss < self._measured + self._step:  # a page or two of the interpreter's: not worth the heap walk
            return False
        self.measures += 1
        kept = self._untracked(rss) - self._base
        self.peak_kept = max(self.peak_kept, kept)
        if kept <= self.limit - self._step:
            self._measured = rss
            return False
        self._libc.malloc_trim(0)
        self.trims += 1
        self._measured = -self._step  # measured again at the next check
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.period):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._anon.close()

    def summary(self) -> dict:
        return {"mode": "keep", "limit_bytes": self.limit, "peak_kept_bytes": max(self.peak_kept, 0),
                "trims": self.trims}


def keep_freed_memory(limit: int, period: float = PERIOD_S, device: Any = "cpu") -> HeapKeeper | None:
    """Let the heap keep up to `limit` bytes of freed memory (a started `HeapKeeper`, looking every `period`
    seconds, its thread bound to the rank's `device`); with no limit, or where the keeper cannot measure, hand
    freed memory back at once instead (None)."""
    libc = _libc()
    if limit <= 0 or libc is None or not hasattr(libc, "mallinfo2") or _rss_anon() is None:
        return_freed_memory()
        return None
    libc.mallopt(-3, KEEP_THRESHOLD)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, int(limit))  # M_TRIM_THRESHOLD: free memory at the heap's top is kept up to the limit too
    libc.mallopt(-8, KEEP_ARENAS)
    return HeapKeeper(libc, limit, period, device)
