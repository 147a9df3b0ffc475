"""How busy the block devices under a run's files were over its epochs: the kernel's own counters
(/sys/dev/block/MAJ:MIN/stat, what iostat reads), not the reader's.

Why: a feed rate alone does not say what limits it. An SSD that reads at 1.6 GB/s while it has reads in flight
but is busy 60% of the epoch waits on the CPU side (sampling, copies), and a faster or a further SSD would not
help; one busy all the epoch at its rated speed is the limit. The device's busy time (`io_ticks`: time with at
least one request in flight, over every process's reads, the other ranks' included) gives both figures: the
busy share and the rate while busy, the one comparable with fio's on the same disk. A file on no block device
(tmpfs, overlayfs, a network file system) is left out: its reads have no such counter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter

#: /sys/dev/block/*/stat fields (Documentation/block/stat.rst): read I/Os, read sectors, io_ticks (ms)
READ_IOS, READ_SECTORS, IO_TICKS = 0, 2, 9
SECTOR = 512  # the stat file's sectors are 512 bytes whatever the device's block size


def block_device(path: str | Path) -> Path | None:
    """The sysfs directory of the block device (or partition) holding `path`; None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    return dev.resolve() if (dev / "stat").is_file() else None


def _counters(dev: Path) -> tuple[int, int, int] | None:
    """(read I/Os, read bytes, busy ms) of `dev` now; None when its stat file cannot be read."""
    try:
        f = (dev / "stat").read_text().split()
        return int(f[READ_IOS]), int(f[READ_SECTORS]) * SECTOR, int(f[IO_TICKS])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class DiskUse:
    """One device over the spans watched."""

    device: str  # its kernel name: vda, nvme0n1, nvme0n1p2, dm-0
    files: list[str]  # the names of the watched files on it (bins, "pack")
    #: each span's [reads, read bytes, busy seconds (at least one request in flight), its own seconds]
    spans: list[list[float]] = field(default_factory=list)

    def as_dict(self) -> dict:
        reads, read_bytes, busy, span = (sum(s[i] for s in self.spans) for i in range(4))
        return {"device": self.device, "files": self.files, "reads": int(reads), "read_bytes": int(read_bytes),
                "busy_s": busy, "span_s": span, "busy_share": min(1.0, busy / span) if span > 0 else None,
                "read_MB_per_s_busy": read_bytes / 1e6 / busy if busy > 0 else None, "spans": self.spans}


class DiskWatch:
    """The devices under `files` (name -> path), counted over the spans between `begin()` and `end()`."""

    def __init__(self, files: Mapping[str, str | Path]):
        self._devs: dict[Path, DiskUse] = {}
        for name, path in files.items():
            dev = block_device(path)
            if dev is not None:
                self._devs.setdefault(dev, DiskUse(dev.name, [])).files.append(name)
        self._at: tuple[float, dict[Path, tuple[int, int, int] | None]] | None = None

    def begin(self) -> None:
        self._at = perf_counter(), {d: _counters(d) for d in self._devs}

    def end(self) -> None:
        """Add the span since `begin()` (nothing without one)."""
        if self._at is None:
            return
        t0, before = self._at
        self._at = None
        span = perf_counter() - t0
        for dev, use in self._devs.items():
            now, then = _counters(dev), before[dev]
            if now is None or then is None:
                continue
            use.spans.append([now[0] - then[0], now[1] - then[1], (now[2] - then[2]) / 1e3, span])

    def report(self) -> list[dict]:
        """Each device watched over some span, in the order its first file was named."""
        return [u.as_dict() for u in self._devs.values() if u.spans]
