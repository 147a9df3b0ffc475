"""A batch's ids split by what node-indexed tables say of each: which the GPU tier holds, and where.

Why native: the split reads each id's bin, and the slot of those in a bin the tier takes rows of, from
node-sized tables (8M nodes: 8 and 32 MB, past the CPU's caches); NumPy makes each gather, mask and
`flatnonzero` its own pass with its own temporaries. One pass that prefetches the bins a few ids ahead
(native/moment_io.c) took 1.6-2.1 ms for 200k ids over 8M nodes where NumPy's took 2.9-3.5
(bench/routing_lookups.py). Without the extension the NumPy passes run, returning the same arrays.

The static CPU cache's split (which ids are cached, and their slots) was tried the same way and not kept: one
pass was 1.5x NumPy's with 8% of the nodes cached but 0.55-0.96x with half of them, its slot reads depending on
the words it reads first.
"""

from __future__ import annotations

import numpy as np

from moment.io.engines import _native

_split_held = getattr(_native, "split_held", None)


def split_held(ids: np.ndarray, bin: np.ndarray, slot: np.ndarray, limit: np.ndarray, base: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions among `ids` of the nodes a tier holds, their rows in the tier, the other positions), each
    ascending. Node i is bin[i]'s row slot[i]; the tier holds bin b's first limit[b] rows, from its row base[b]
    (moment.runtime.gpu_tier.TierMap)."""
    ids = np.ascontiguousarray(ids, np.int64)
    if _split_held is not None:
        n = ids.shape[0]
        on_pos, on_idx, rest_pos = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        on = _split_held(ids, bin, slot, limit, base, on_pos, on_idx, rest_pos)
        return on_pos[:on], on_idx[:on], rest_pos[: n - on]
    # the bins first (1 B per node), the slots (4 B per node) only of ids in a bin the tier takes rows of
    b = bin[ids]
    lim = limit[b]
    maybe = np.flatnonzero(lim)
    s = slot[ids[maybe]]
    ok = s < lim[maybe]
    on = maybe[ok]
    rest = np.ones(ids.shape[0], bool)
    rest[on] = False
    return on, base[b[on]] + s[ok], np.flatnonzero(rest)
