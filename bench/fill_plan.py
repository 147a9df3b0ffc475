"""The read plan of a CPU cache's first fill on a layout: its rows placed by file alone (`moment.io.merge._by_file`,
a radix sort of the file numbers) against their keys sorted (the baseline, the same process), alternating rounds.

The fill asks for the hottest rows not on a GPU bin, and each shard holds its rows hottest first, so they are in
place order within each file: both ways give the same reads, which the bench checks. Prints each round, then the
medians and their ratio.

    .venv/bin/python bench/fill_plan.py --layout LAYOUT [--rows 4000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from moment.io import merge
from moment.io.merge import SHAPES
from moment.placement.opened import Layout


def fill_rows(layout: Layout, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(file, byte offset) of the `rows` hottest rows outside the GPU bins, as the fill asks for them."""
    b, s = layout.load_index()
    stride = np.array([x.stride for x in layout.manifest.shards], np.int64)
    order = layout.hot_order()
    ids = order[~np.isin(b[order], layout.shards_of("gpu"))][:rows]
    f = b[ids].astype(np.int32)
    return f, s[ids].astype(np.int64) * stride[f]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows the fill reads")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    lay = Layout.open(a.layout)
    f, off = fill_rows(lay, a.rows)
    sizes = np.array([lay.shard_file(x).stat().st_size for x in lay.manifest.shards], np.int64)
    by_file = merge._by_file
    got: dict[str, list[float]] = {"by_file": [], "sorted_keys": []}
    plans: dict[str, object] = {}
    for i in range(a.rounds):
        for name in got:
            merge._by_file = by_file if name == "by_file" else (lambda f, key: None)
            t = time.perf_counter()
            plan = SHAPES["block"].plan(f, off, lay.row_bytes, lay.manifest.row.align, 1 << 20, sizes)
            got[name].append(time.perf_counter() - t)
            plans[name] = plan
            print(f"round {i} {name}: {got[name][-1]:.3f} s, {len(plan)} reads", flush=True)
    merge._by_file = by_file
    print(f"rows: {f.shape[0]}")
    for name, times in got.items():
        print(f"{name}_s: {statistics.median(times):.3f}")
    print(f"speedup: {statistics.median(got['sorted_keys']) / statistics.median(got['by_file']):.2f}x")
    one, other = plans["by_file"], plans["sorted_keys"]
    same = all(np.array_equal(getattr(one, k), getattr(other, k)) for k in ("file", "start", "length", "row_run", "row_at"))
    print(f"same_reads: {same}")


if __name__ == "__main__":
    main()
