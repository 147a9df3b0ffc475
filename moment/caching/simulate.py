"""Replay a sampled access trace through the cache policies the runtime uses.

Every policy starts from the same warm contents (the `capacity` hottest rows by pre-sampled hotness,
as the runtime fills its cache), so `belady` (the whole trace known: the offline optimum for unit rows
with bypass) bounds every other policy's hit rate. `belady-superbatch` is told each next superbatch
of `superbatch` batches before running it, as the runtime does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from moment.caching.policies import make_policy
from moment.errors import MomentError

DEFAULT_POLICIES = ("static", "lru", "belady-superbatch")
#: the bound every simulation reports besides the policies compared
BOUND = "belady"


def check_policies(policies: Sequence[str]) -> None:
    """The policies a simulation compares (`--policy`): DEFAULT_POLICIES, or the bound it reports anyway."""
    for name in policies:
        if name not in (*DEFAULT_POLICIES, BOUND):
            raise MomentError(f"--policy {name!r}: not a cache policy the simulation compares; choose from "
                              f"{', '.join(DEFAULT_POLICIES)} ({BOUND}, the whole-trace optimum, is always reported "
                              "as the bound)")


def simulate(trace, capacity_rows: int, policies: Sequence[str] = DEFAULT_POLICIES, *,
             hotness: np.ndarray | None, superbatch: int = 16,
             progress: Callable[[int, int], None] | None = None) -> dict[str, dict[str, Any]]:
    """Per policy (and always `belady`): hit_rate, hits, accesses, ssd_bytes, admitted_rows."""
    check_policies(policies)
    names = list(dict.fromkeys([*policies, BOUND]))
    if superbatch < 1:
        raise MomentError(f"--superbatch must be >= 1, got {superbatch}")
    batches = trace.batches()
    out: dict[str, dict[str, Any]] = {}
    total = len(names) * len(batches)
    done = 0
    for name in names:
        p = make_policy(name, capacity_rows, trace.num_nodes, hotness=hotness)
        if name == "belady":
            p.plan(batches)
        hits = admitted = 0
        for t, b in enumerate(batches):
            if name == "belady-superbatch" and t % superbatch == 0:
                p.plan(batches[t : t + superbatch])
            d = p.access(b)
            hits += int(np.count_nonzero(d.hit))
            admitted += int(d.admit.shape[0])
            done += 1
            if progress:
                progress(done, total)
        acc = trace.total_accesses
        out[name] = {"hit_rate": hits / acc if acc else 0.0, "hits": hits, "accesses": acc,
                     "ssd_bytes": (acc - hits) * trace.row_bytes, "admitted_rows": admitted}
    return out
