"""One seed mixer for every per-(seed, epoch, rank, batch) random stream."""

from __future__ import annotations

import numpy as np


def mix(*parts: int) -> int:
    """A 63-bit seed from integers; different tuples give independent streams."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> 1)
