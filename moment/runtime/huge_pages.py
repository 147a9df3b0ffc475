"""Where a rank's arrays get huge pages: the read buffers always, NumPy's other arrays unless fresh huge pages
are dear on this machine.

Why: NumPy advises huge pages (MADV_HUGEPAGE) for every array from 4 MiB up, and the kernel then backs each
new 2 MiB of it with a free 2 MiB block. A virtual machine whose balloon reports free pages to its host
(virtio's VIRTIO_BALLOON_F_REPORTING) hands exactly those blocks back, so every fresh huge page is faulted in
again by the host. Measured on this project's 2-core VMs (`bench/first_touch.py`): touching a GiB of fresh
memory took 5.6-7.4 CPU-s in huge pages against 0.31-0.35 in 4 KiB pages. A run's first epoch touches most of
its memory for the first time: on the bench's 16M data-only run it took 3.8-4.7 s against 0.6-0.7 for the next
ones, and 1.0-2.2 s with NumPy's advice off there, the steady epochs unchanged (A/B in docs/benchmarks.md).
The read buffers keep huge pages (moment.io.buffers.huge_page_buffer: a large direct read into 4 KiB pages is
split by the block layer); everything else follows the kernel's default. Elsewhere NumPy keeps its advice (a
fresh huge page costs no more than 512 small ones, and a random gather over a large table misses the TLB less).
"""

from __future__ import annotations

from pathlib import Path

try:  # NumPy's switch for its advice; without it NumPy keeps advising
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:
    _set_madvise_hugepage = None

BALLOON_REPORTING = 5  # the virtio feature bit of free page reporting (VIRTIO_BALLOON_F_REPORTING)


def reporting_balloon(sysfs: Path = Path("/sys")) -> str | None:
    """The virtio device (`virtio0`) that reports this machine's free memory to its host, or None."""
    try:
        devices = sorted((sysfs / "bus" / "virtio" / "devices").iterdir())
    except OSError:
        return None
    for dev in devices:
        try:
            if (dev / "driver").resolve().name != "virtio_balloon":
                continue
            features = (dev / "features").read_text().strip()  # one character per feature bit, from bit 0
        except OSError:
            continue
        if features[BALLOON_REPORTING:BALLOON_REPORTING + 1] == "1":
            return dev.name
    return None


def _numpy_advice(on: bool) -> bool | None:
    """Set NumPy's huge-page advice for its large arrays; its previous setting, or None where NumPy has none."""
    return None if _set_madvise_hugepage is None else bool(_set_madvise_hugepage(on))


class HugePages:
    """A rank's huge-page policy for the span of a run: `restore()` gives NumPy back its own setting."""

    def __init__(self, sysfs: Path = Path("/sys")):
        self.balloon = reporting_balloon(sysfs)
        self._before = _numpy_advice(False) if self.balloon else None
        self.mode = "reads only" if self._before is not None else "numpy"

    def summary(self) -> dict[str, str | None]:
        why = (f"{self.balloon} reports free memory to the host: a fresh huge page is faulted in again there"
               if self.mode == "reads only" else None)
        return {"mode": self.mode, "why": why}

    def restore(self) -> None:
        if self._before is not None:
            _numpy_advice(self._before)
            self._before = None
