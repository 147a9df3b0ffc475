"""A batch of read requests as parallel arrays, so a whole batch crosses into the engine at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moment.errors import MomentError


@dataclass(frozen=True)
class ReadBatch:
    """Request i reads `length[i]` bytes at byte `offset[i]` of shard file `file[i]` into the
    destination buffer at byte `dest_offset[i]`.  Arrays are normalised to contiguous int32/int64."""

    file: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    dest_offset: np.ndarray

    def __post_init__(self) -> None:
        arrays = {
            "file": np.ascontiguousarray(self.file, dtype=np.int32).reshape(-1),
            "offset": np.ascontiguousarray(self.offset, dtype=np.int64).reshape(-1),
            "length": np.ascontiguousarray(self.length, dtype=np.int64).reshape(-1),
            "dest_offset": np.ascontiguousarray(self.dest_offset, dtype=np.int64).reshape(-1),
        }
        n = len(arrays["file"])
        for name, arr in arrays.items():
            if len(arr) != n:
                raise MomentError(f"read batch: '{name}' has {len(arr)} entries, 'file' has {n}")
            if n and arr.min() < 0:
                raise MomentError(f"read batch: '{name}' has a negative entry at index {int(arr.argmin())}")
            object.__setattr__(self, name, arr)

    def __len__(self) -> int:
        return len(self.file)

    @property
    def bytes_wanted(self) -> int:
        return int(self.length.sum())

    @property
    def dest_size(self) -> int:
        """Smallest destination buffer (bytes) that holds every request."""
        return int((self.dest_offset + self.length).max()) if len(self) else 0

    @classmethod
    def packed(cls, file, offset, length) -> ReadBatch:
        """Requests laid end to end in the destination, in order."""
        length = np.asarray(length, dtype=np.int64).reshape(-1)
        dest = np.zeros(len(length), dtype=np.int64)
        np.cumsum(length[:-1], out=dest[1:])
        return cls(np.asarray(file), np.asarray(offset), length, dest)

    @classmethod
    def rows(cls, file, offset, row_bytes: int, row) -> ReadBatch:
        """Fixed-size feature rows: request i fills destination row `row[i]` of `row_bytes` bytes."""
        row = np.asarray(row, dtype=np.int64).reshape(-1)
        return cls(np.asarray(file), np.asarray(offset), np.full(len(row), row_bytes, np.int64), row * row_bytes)
