"""Rows held in memory the runtime owns: the CPU cache tier.

Why not the page cache: pages the kernel can take back under pressure are not a cache the runtime can
size against a budget (the old store memory-mapped its cache files and thrashed at the edge of its
cgroup). The cache is anonymous memory, or for a cache every local rank reads unchanged (the static
policy) one shared segment in /dev/shm, filled by local rank 0, mapped by every local rank, and
unlinked as soon as all have mapped it: the kernel frees it when the last rank exits, however it
exits, so nothing leaks even when torchrun kills a rank. A segment left by a creator that died before
the unlink carries its pid in the name and is removed by the next creator.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.locking import pid_alive

SHM = Path("/dev/shm")
# Every page of the segment mapped at once: mapped lazily, each rank's first touch of each 4 KiB page is a fault
# (shared memory gets no transparent huge pages where shmem_enabled is "never", the usual default), and a random
# row's copy took 2.5x as long while its page was faulted in (the first epoch, mostly); populating a 1.2 GB
# mapping takes 0.05 s
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
PREFIX = "moment-cache-"


def shm_room(nbytes: int) -> str:
    """Why a shared segment of `nbytes` cannot be made here ("" when it can)."""
    if not SHM.is_dir():
        return f"{SHM} does not exist"
    st = os.statvfs(SHM)
    free = st.f_bavail * st.f_frsize
    if free < nbytes + (16 << 20):
        return f"{SHM} has {free >> 20} MiB free, the cache needs {nbytes >> 20} MiB"
    return ""



def remove_stale() -> None:
    """Delete segments whose creator is gone (it died between creating and unlinking them)."""
    for f in SHM.glob(PREFIX + "*"):
        try:
            pid = int(f.name.rsplit("-", 1)[1].split(".")[0])
        except (IndexError, ValueError):
            continue
        if not pid_alive(pid):
            f.unlink(missing_ok=True)


class HostCache:
    """`rows[slot]` is a cached row (uint8, `row_bytes` wide); `capacity` slots."""

    def __init__(self, capacity: int, row_bytes: int):
        self.capacity, self.row_bytes = int(capacity), int(row_bytes)
        self.shared = False
        self._mm: mmap.mmap | None = None
        self.rows = np.empty((self.capacity, self.row_bytes), np.uint8)

    @property
    def nbytes(self) -> int:
        return self.capacity * self.row_bytes

    @classmethod
    def shared_segment(cls, key: str, capacity: int, row_bytes: int, *, creator: bool,
                       fill: Callable[[np.ndarray], None], barrier: Callable[[], None],
                       timeout: float = 120.0) -> HostCache:
        """One segment for all local ranks: the creator fills it, all map it, then it is unlinked."""
        self = cls.__new__(cls)
        self.capacity, self.row_bytes, self.shared = int(capacity), int(row_bytes), True
        nbytes = max(self.capacity * self.row_bytes, 1)
        final = None
        if creator:
            remove_stale()
            final = SHM / f"{PREFIX}{key}-{os.getpid()}"
            part = final.with_name(final.name + ".partial")
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, nbytes)
                self._mm = mmap.mmap(fd, nbytes, flags=_MAP_FLAGS)
            finally:
                os.close(fd)
            self.rows = np.frombuffer(self._mm, np.uint8, self.capacity * self.row_bytes).reshape(
                self.capacity, self.row_bytes)
            try:
                fill(self.rows)
            except BaseException:
                part.unlink(missing_ok=True)
                raise
            os.rename(part, final)
        barrier()  # the creator has filled and published it
        if not creator:
            deadline = time.monotonic() + timeout
            while True:
                found = [p for p in SHM.glob(f"{PREFIX}{key}-*") if not p.name.endswith(".partial")]
                if found:
                    break
                if time.monotonic() > deadline:
                    raise MomentError(f"local rank 0 did not publish the shared CPU cache {PREFIX}{key}")
                time.sleep(0.05)
            fd = os.open(found[0], os.O_RDONLY)
            try:
                self._mm = mmap.mmap(fd, nbytes, flags=_MAP_FLAGS, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self.rows = np.frombuffer(self._mm, np.uint8, self.capacity * self.row_bytes).reshape(
                self.capacity, self.row_bytes)
        barrier()  # every rank has it mapped: the name can go, the memory stays until the last unmap
        if final is not None:
            final.unlink(missing_ok=True)
        return self

    def close(self) -> None:
        self.rows = np.empty((0, self.row_bytes), np.uint8)
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes with the process
                pass
            self._mm = None
