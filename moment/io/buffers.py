"""Destination buffers that direct reads can fill in place.

An O_DIRECT read lands straight in the caller's memory only when that memory is aligned to the block
size; otherwise the engine reads into a bounce buffer and copies the bytes over. NumPy's large arrays
start 16 or 320 bytes past a page boundary, so a plain `np.empty` destination costs every read a copy
(measured on this project's probe: 4 KiB random reads at 0.71 of fio's IOPS into `np.empty` buffers,
0.89 into aligned ones).

A buffer of a huge page or more starts on a huge-page boundary and is advised to be backed by huge
pages: a large read into 4 KiB pages is one memory segment per page, and a 1 MiB read (256 segments)
is more than a virtio disk takes in one request (max_segments 254 here), so the block layer splits it;
into huge pages it is one segment. Measured with fio on this machine: 1 MiB reads at qd32 0.9-2.0 GB/s
into 4 KiB pages, 2.9-3.2 GB/s into huge pages. A 4 MiB buffer that merely starts page-aligned
straddles three huge pages and holds one whole.
"""

from __future__ import annotations

import ctypes
import functools
import mmap

import numpy as np

from moment.errors import MomentError

HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages) transparent huge pages
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def aligned_buffer(nbytes: int, alignment: int = 4096) -> np.ndarray:
    """`nbytes` zeroed bytes starting at a multiple of `alignment` (of a huge page too, and advised to be
    backed by huge pages, from one huge page up). The pages are written here, so the first reads into
    them do not also pay the page faults."""
    if alignment < 1 or alignment & (alignment - 1):
        raise MomentError(f"buffer alignment must be a power of two, got {alignment}")
    if nbytes < 0:
        raise MomentError(f"buffer size must not be negative, got {nbytes}")
    if nbytes >= HUGE_PAGE:
        align = max(alignment, HUGE_PAGE)
        # private anonymous memory (a shared one is shmem, which THP leaves alone): page-aligned, zeroed
        region = mmap.mmap(-1, nbytes + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = np.frombuffer(region, np.uint8)  # keeps `region` alive as long as any view of it
        start = -raw.ctypes.data % align
        if _MADV_HUGEPAGE is not None:  # advice only: where THP is off the buffer is plain pages
            region.madvise(_MADV_HUGEPAGE, start, nbytes)
        out = raw[start:start + nbytes]
    else:
        raw = np.empty(nbytes + alignment, np.uint8)
        start = -raw.ctypes.data % alignment
        out = raw[start:start + nbytes]
    out.fill(0)  # not np.zeros: calloc'd pages stay unmapped until first written
    return out


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def huge_page_buffer(nbytes: int, alignment: int = 4096) -> np.ndarray:
    """`nbytes` from malloc (so the heap keeper counts them as in use), starting on a huge page and advised to be
    backed by huge pages from one huge page up, its pages left for the reads that fill it to fault in: not
    `aligned_buffer`, which writes them. Its own advice, not NumPy's (given to arrays from 4 MiB up, unless the
    kernel is older than 4.6 or NUMPY_MADVISE_HUGEPAGE=0 says not to): without it reads here would be split."""
    huge = nbytes >= HUGE_PAGE and _MADV_HUGEPAGE is not None
    align = HUGE_PAGE if huge else alignment
    raw = np.empty(nbytes + align, np.uint8)
    out = raw[-raw.ctypes.data % align:][:nbytes]
    if huge:  # advice: a refusal leaves plain pages
        _libc().madvise(out.ctypes.data, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE, _MADV_HUGEPAGE)
    return out
