"""A rank's SSD reads written as an fio iolog (version 2), so fio can replay exactly those reads.

A feed rate is only judged against the disk's limit for the same reads: the same files, offsets, sizes and
order (`fio --read_iolog FILE --replay_no_stall=1 --direct=1 --iodepth=D`), which a synthetic random-read job
only approximates (the block layer merges Moment's sorted reads; fio's random offsets it cannot). The reads
are kept in memory as arrays while the run reads and written once, atomically, when the stack closes. A read
is written as the engine issues it, rounded outward to the alignment, but never past a file's last whole
block: fio replays with O_DIRECT, where a read into the end of a file is refused rather than cut short.
Reads made while `setup` is set (the caches filled at start) go to a log of their own (`setup_trace`): the
feed rate counts the epochs' reads alone, and the disk's rate it is judged against must be for those reads
(on the 8M bench the start's fill was 0.7 GB beside the epochs' 0.9 GB, all in one log before).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.outputs import atomic_write

HEADER = "fio version 2 iolog"


def rank_trace(directory: str | Path, rank: int) -> Path:
    """Where rank `rank` of a run with `--io-trace DIRECTORY` writes its reads."""
    return Path(directory) / f"rank-{rank}.iolog"


def setup_trace(trace: str | Path) -> Path:
    """Where the set-up reads of the stack tracing to `trace` go (rank-N.iolog -> rank-N.setup.iolog)."""
    trace = Path(trace)
    return trace.with_name(f"{trace.stem}.setup{trace.suffix}")


class ReadTrace:
    """The reads of one I/O stack over `paths` (file index i = paths[i]), each as the disk served it."""

    def __init__(self, out: str | Path, paths: Sequence[str | Path], align: int):
        self.out, self.align = Path(out), max(1, int(align))
        self.names = [str(Path(p).resolve()) for p in paths]
        self.ends = np.array([os.stat(n).st_size // self.align * self.align for n in self.names], np.int64)
        for n in self.names:
            if any(c.isspace() for c in n):  # fio splits an iolog line at white space
                raise MomentError("an fio iolog cannot name a file whose path holds white space", source=n,
                                  hint="move the layout to a path without spaces, or run without --io-trace")
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._setup_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.setup = False  # set while the reads recorded are set-up reads (IOStack.setup_reads)

    def record(self, file: np.ndarray, offset: np.ndarray, length: np.ndarray) -> None:
        a = self.align
        start = offset // a * a
        end = np.minimum(-(-(offset + length) // a) * a, self.ends[file])
        keep = end > start
        parts = self._setup_parts if self.setup else self._parts
        parts.append((np.array(file[keep], np.int32), start[keep], end[keep] - start[keep]))

    def text(self, setup: bool = False) -> str:
        """The iolog: every file added and opened, the reads in the order submitted, every file closed."""
        lines = [HEADER]
        lines += [f"{n} add" for n in self.names]
        lines += [f"{n} open" for n in self.names]
        for file, start, length in self._setup_parts if setup else self._parts:
            names = self.names
            lines += [f"{names[f]} read {s} {n}" for f, s, n in zip(file.tolist(), start.tolist(), length.tolist())]
        lines += [f"{n} close" for n in self.names]
        return "\n".join(lines) + "\n"

    def write(self) -> None:
        """The run's log, and its set-up log when it made set-up reads; an earlier run's set-up log is removed
        otherwise, so that the two logs beside each other are always one run's."""
        if self._setup_parts:
            atomic_write(setup_trace(self.out), self.text(setup=True), "--io-trace")
        else:
            setup_trace(self.out).unlink(missing_ok=True)
        atomic_write(self.out, self.text(), "--io-trace")
