"""Shard files opened lazily with O_DIRECT, falling back to buffered reads where it is refused.

tmpfs (before Linux 6.6) and some network/overlay filesystems reject O_DIRECT with EINVAL, either
at open or at the first read; the stack then reads through the page cache and says so
(`ShardFiles.direct` is False, `fallback_reason` tells why) instead of failing.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path

import numpy as np

from moment.errors import MomentError

O_DIRECT = getattr(os, "O_DIRECT", 0)


class ShardFiles:
    """File index → path and descriptor; descriptors open on first use."""

    def __init__(self, paths, *, direct: bool = True, alignment: int = 4096):
        if alignment < 1 or alignment & (alignment - 1):
            raise MomentError(f"I/O alignment must be a power of two, got {alignment}")
        self.paths = [Path(p) for p in paths]
        self.fds = np.full(len(self.paths), -1, dtype=np.int32)
        self.direct = bool(direct and O_DIRECT)
        self.fallback_reason = ""
        if not direct:
            self.fallback_reason = "buffered reads requested"
        elif not O_DIRECT:
            self.fallback_reason = "O_DIRECT is not available on this platform"
        self._alignment = alignment
        self._n_direct = 0

    @property
    def alignment(self) -> int:
        """Offset/length/memory granularity of reads: the block size while any descriptor is O_DIRECT."""
        return self._alignment if self.direct or self._n_direct else 1

    def ensure_open(self, file_idx: np.ndarray, offset: np.ndarray, length: np.ndarray) -> None:
        """Open every file the batch names; a missing one raises with the first request that wanted it."""
        if len(file_idx) == 0:
            return
        bad = file_idx >= len(self.paths)
        if bad.any():
            i = int(np.argmax(bad))
            raise MomentError(f"read request {i} names shard file {int(file_idx[i])}, "
                              f"but the stack has {len(self.paths)} files")
        closed = self.fds[file_idx] < 0
        if not closed.any():
            return
        for i in np.flatnonzero(closed):
            k = int(file_idx[i])
            if self.fds[k] < 0:
                self._open(k, int(offset[i]), int(length[i]))

    def _open(self, k: int, offset: int, length: int) -> None:
        path = self.paths[k]
        where = f"reading {length} bytes at offset {offset}"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise MomentError(f"shard file not found ({where})", source=str(path)) from None
        except OSError as e:
            raise MomentError(f"cannot access shard file ({where}): {e.strerror}", source=str(path)) from None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise MomentError(f"shard is not a regular file or block device ({where})", source=str(path))
        if self.direct:
            fd = self._open_direct(path, st.st_size)
            if fd >= 0:
                self.fds[k] = fd
                self._n_direct += 1
                return
        try:
            self.fds[k] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise MomentError(f"cannot open shard file ({where}): {e.strerror}", source=str(path)) from None

    def _open_direct(self, path: Path, size: int) -> int:
        """O_DIRECT descriptor, or -1 after switching the stack to buffered reads (EINVAL)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise MomentError(f"cannot open shard file: {e.strerror}", source=str(path)) from None
            self._fall_back(f"O_DIRECT refused by the filesystem of {path} (EINVAL at open)")
            return -1
        if size > 0:  # some filesystems accept the flag but refuse the first aligned read
            buf = mmap.mmap(-1, self._alignment)
            try:
                os.preadv(fd, [buf], 0)
            except OSError as e:
                os.close(fd)
                if e.errno != errno.EINVAL:
                    raise MomentError(f"cannot read shard file: {e.strerror}", source=str(path)) from None
                self._fall_back(f"O_DIRECT reads refused on {path} (EINVAL)")
                return -1
            finally:
                buf.close()
        return fd

    def _fall_back(self, reason: str) -> None:
        """Later opens are buffered.  Descriptors already open stay (batches in flight use them) and
        keep reads rounded to the block size, which is harmless on buffered descriptors."""
        self.direct = False
        self.fallback_reason = reason

    def close(self) -> None:
        for k in np.flatnonzero(self.fds >= 0):
            os.close(int(self.fds[k]))
            self.fds[k] = -1
        self._n_direct = 0


def file_identity(path: str | Path) -> tuple | None:
    """A file as a verdict about it (a check, a copy kept from it) holds for: its resolved path, device, inode,
    size and modification time, so that a file written again or replaced is another one. None: no such file."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError:
        return None
    return str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """An .npy file's (shape, Fortran order, dtype) from its header, `f` left at its data's first byte: what a
    reader that streams the data itself needs (ValueError: not an .npy file)."""
    fmt = np.lib.format
    read = fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0) else fmt.read_array_header_2_0
    return read(f)


def forget_pages(path: str | Path, offset: int = 0, length: int = 0) -> None:
    """Drop a file's clean pages (from `offset`, `length` bytes; 0: to the end) from the page cache.

    Why: a file a run reads once at start through the page cache (the layout index, the hotness order,
    the GPU tier's bins) would stay cached, and a memory cgroup charges that cache to the run: memory its
    budget does not count, reclaimed only when the run presses on its limit (measured on the bench's 16M
    run: about 500 MiB, and the limit reached). A page another process maps stays. Nothing where the
    file cannot be opened or the kernel does not take the advice."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass
    finally:
        os.close(fd)
