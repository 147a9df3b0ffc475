"""Where one id sequence lies inside another that holds it in the same order.

Why: a pack segment holds its batch's uncached rows in the batch's order (moment.placement.pack). A run whose
caches hold more than the pack assumed misses a part of those rows, still in that order: matching them is one
pass (native/moment_io.c), where finding each id in the segment by a search cost as much as the read's whole
planning (9 ms for a batch's 45k misses). Without the extension the same match is made with NumPy.
"""

from __future__ import annotations

import numpy as np

from moment.io.engines import _native

_native_subsequence = getattr(_native, "subsequence", None)


def subsequence(have: np.ndarray, want: np.ndarray) -> np.ndarray | None:
    """The position in `have` of each of `want` when `want` is `have` with entries left out, the rest in the
    same order; None otherwise. `have` holds each id once."""
    have, want = np.ascontiguousarray(have, np.int64), np.ascontiguousarray(want, np.int64)
    if _native_subsequence is not None:
        out = np.empty(want.shape[0], np.int64)
        return out if _native_subsequence(have, want, out) else None
    rows = np.flatnonzero(np.isin(have, want))
    return rows if rows.shape[0] == want.shape[0] and np.array_equal(have[rows], want) else None
