"""A batch's routing lookups against what they replaced (the baselines, kept here), on the 8M bench's node count,
each the median of `--repeat`:

* the static CPU cache's slot lookup (moment.caching.tiers.FixedSlots) against a binary search over the sorted
  cached ids: the same cached ids, the same queries (a superbatch's hits);
* the GPU tier's membership test (moment.runtime.gpu_tier.TierMap.holds) against reading every id's bin and slot:
  a layout index of 10 bins, the first two the GPU tier's (2% of the nodes, a tenth of the queries);
* the GPU tier's split of a batch (TierMap.split: held ids, their rows and the rest, one native pass) against
  the NumPy passes it replaced.

Prints `name: value` lines; each ratio is baseline / now.

    .venv/bin/python bench/routing_lookups.py [--nodes 8000000] [--queries 200000] [--repeat 21]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from moment.caching.tiers import FixedSlots
from moment.io import splits
from moment.runtime.gpu_tier import TierMap


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


class Index:
    """The two arrays of a layout index TierMap.holds reads (moment.runtime.tier.LayoutRows)."""

    def __init__(self, bin_: np.ndarray, slot: np.ndarray):
        self.bin, self.slot = bin_, slot


def every_slot(held: TierMap, rows: Index, ids: np.ndarray) -> np.ndarray:
    """The baseline membership test: every id's bin and slot."""
    return rows.slot[ids] < held.limit[rows.bin[ids]]


def numpy_held(held: TierMap, rows: Index, ids: np.ndarray) -> tuple:
    """The GPU tier's split on NumPy's passes, as routing made it before (moment.io.splits without its extension)."""
    native, splits._split_held = splits._split_held, None
    try:
        return held.split(rows, ids)
    finally:
        splits._split_held = native


def same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def median_ms(fn, args: tuple, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
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
        b, n = median_ms(base.lookup, (queries,), a.repeat), median_ms(new.lookup, (queries,), a.repeat)
        tag = f"cache_{round(share * 100)}pct"
        print(f"{tag}_rows: {cap}")
        print(f"{tag}_sorted_search_ms: {b:.2f}")
        print(f"{tag}_fixed_slots_ms: {n:.2f}")
        print(f"{tag}_speedup: {b / n:.2f}  (sorted search / FixedSlots, {a.queries} lookups)")
        print(f"{tag}_memory_MiB: {new.memory_bytes() / 2**20:.1f} (baseline {base.memory_bytes() / 2**20:.1f})")
    n = a.nodes
    bins = rng.integers(2, 10, n).astype(np.uint8)
    slots = rng.integers(0, n // 8, n).astype(np.int32)
    gpu = rng.permutation(n)[: n // 50]
    bins[gpu], slots[gpu] = rng.integers(0, 2, gpu.size), rng.integers(0, n // 50, gpu.size)
    rows, held = Index(bins, slots), TierMap(np.array([0, n // 200] + [0] * 8), np.array([n // 200] * 2 + [0] * 8))
    queries = rng.permutation(np.concatenate([rng.choice(gpu, a.queries // 10), rng.integers(0, n, a.queries - a.queries // 10)]))
    assert np.array_equal(every_slot(held, rows, queries), held.holds(rows, queries))
    b, m = median_ms(every_slot, (held, rows, queries), a.repeat), median_ms(held.holds, (rows, queries), a.repeat)
    print(f"gpu_holds_every_slot_ms: {b:.2f}")
    print(f"gpu_holds_ms: {m:.2f}")
    print(f"gpu_holds_speedup: {b / m:.2f}  (every id's bin and slot / TierMap.holds, {a.queries} ids)")
    assert same(numpy_held(held, rows, queries), held.split(rows, queries))
    b, m = median_ms(numpy_held, (held, rows, queries), a.repeat), median_ms(held.split, (rows, queries), a.repeat)
    print(f"gpu_split_numpy_ms: {b:.2f}")
    print(f"gpu_split_ms: {m:.2f}")
    print(f"gpu_split_speedup: {b / m:.2f}  (NumPy's passes / TierMap.split, {a.queries} ids)")


if __name__ == "__main__":
    main()
