"""What the kernel says about a descriptor and a file's pages, for tests that must not take the code
under test at its word (a `direct` flag the code sets itself proves nothing about how a file was opened).

* `open_flags(fd)`: the flags the descriptor was opened with, from /proc/self/fdinfo.
* `direct_refused(directory)`: why a file there cannot be read with O_DIRECT ("" when it can), found by
  trying it here, independently of moment.io.
* `drop_cached(path)` / `cached_pages(path)`: evict a file's clean pages, count the ones resident
  (posix_fadvise and mincore), so a test can see whether reads went through the page cache.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path

O_DIRECT = getattr(os, "O_DIRECT", 0)


def open_flags(fd: int) -> int:
    """The open flags of descriptor `fd` of this process (Linux /proc/self/fdinfo, octal)."""
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    raise AssertionError(f"/proc/self/fdinfo/{fd} has no flags line")


def direct_refused(directory: Path) -> str:
    """Why this directory's filesystem refuses an O_DIRECT open or aligned read ("" when it allows both)."""
    if not O_DIRECT:
        return "this platform has no O_DIRECT"
    probe = Path(directory) / ".odirect-probe"
    probe.write_bytes(b"\x01" * 8192)
    buf = mmap.mmap(-1, 4096)  # page-aligned memory
    try:
        fd = os.open(probe, os.O_RDONLY | O_DIRECT)
    except OSError as e:
        probe.unlink()
        return f"open(O_DIRECT) fails with {errno.errorcode.get(e.errno, e.errno)}"
    try:
        os.preadv(fd, [buf], 0)
    except OSError as e:
        return f"an aligned O_DIRECT read fails with {errno.errorcode.get(e.errno, e.errno)}"
    finally:
        os.close(fd)
        buf.close()
        probe.unlink()
    return ""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def cached_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache now (mincore on a mapping that touches none)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * (-(-size // page)))()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(v & 1 for v in vec)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cached(path: Path) -> None:
    """Write back and evict the file's pages (they stay where the filesystem is memory, e.g. tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
