"""The static CPU cache's slot lookup (moment.caching.tiers.FixedSlots) against the binary search over the sorted
cached ids it replaced (the baseline, kept here), on the 8M bench's node count: the same cached ids, the same
queries (a superbatch's hits), each lookup the median of `--repeat`. Prints `name: value` lines; the ratio is
baseline / FixedSlots.

    .venv/bin/python bench/fixed_slots.py [--nodes 8000000] [--queries 200000] [--repeat 21]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from moment.caching.tiers import FixedSlots


class SortedSearch:
    """The baseline: slot i holds ids[i]; a lookup sorts the queries and searches the sorted ids."""

    def __init__(self, ids: np.ndarray):
        order = np.argsort(ids, kind="stable")
        self.ids, self.slot = ids[order], order.astype(np.int64)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        order = np.argsort(ids)
        at = np.empty(ids.shape[0], np.int64)
        at[order] = np.searchsorted(self.ids, ids[order])
        return self.slot[at]

    def memory_bytes(self) -> int:
        return self.ids.nbytes + self.slot.nbytes


def median_ms(slots, queries: np.ndarray, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        slots.lookup(queries)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8_000_000)
    p.add_argument("--queries", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=21)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    for share in (0.08, 0.5, 1.0):  # the 8M bench's cache under 3 GiB holds 8% of the rows; a large budget all
        cap = int(a.nodes * share)
        cached = rng.permutation(a.nodes)[:cap].astype(np.int64)
        queries = rng.choice(cached, a.queries)
        base, new = SortedSearch(cached), FixedSlots(cached, a.nodes)
        assert np.array_equal(base.lookup(queries), new.lookup(queries))
        b, n = median_ms(base, queries, a.repeat), median_ms(new, queries, a.repeat)
        tag = f"cache_{round(share * 100)}pct"
        print(f"{tag}_rows: {cap}")
        print(f"{tag}_sorted_search_ms: {b:.2f}")
        print(f"{tag}_fixed_slots_ms: {n:.2f}")
        print(f"{tag}_speedup: {b / n:.2f}  (sorted search / FixedSlots, {a.queries} lookups)")
        print(f"{tag}_memory_MiB: {new.memory_bytes() / 2**20:.1f} (baseline {base.memory_bytes() / 2**20:.1f})")


if __name__ == "__main__":
    main()
