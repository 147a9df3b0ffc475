"""A reader's planning of one whole pack segment (a batch read straight into its buffer): which runs go straight in
decided by arithmetic (`Reader._direct(spanned=True)`) against the per-row test every other plan takes, alternated
in one process on the same segment. Prints the medians of the milliseconds each way and their ratio.

Why it matters: a rank's first reads of an epoch wait for this plan, and at the start both ranks' samplers, gather
threads and readers share the cores, so a millisecond here was three to five of an idle disk on the bench's 8M
data-only run (75k rows of 512 B a batch).

    .venv/bin/python bench/segment_plan.py [--rows 75000] [--row-bytes 512] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from moment.io.merge import SHAPES
from moment.io import aligned_buffer
from moment.runtime.gather import WINDOW, Job, Reader, _Reading


class Planner(Reader):
    """A reader's planning alone (no files, no thread); `per_row`: every segment through the per-row test."""

    def __init__(self, row_bytes: int, align: int, per_row: bool):
        self.row_bytes, self.align, self.window = row_bytes, align, WINDOW
        self.sizes = np.array([1 << 50], np.int64)
        self.direct_rows, self.per_row = 0, per_row

    def _direct(self, plan, by_run, run_rows, dest, spanned=False):
        return super()._direct(plan, by_run, run_rows, dest, spanned and not self.per_row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=75_000)
    ap.add_argument("--row-bytes", type=int, default=512)
    ap.add_argument("--align", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=200, help="plans each way, alternated")
    a = ap.parse_args()
    n, rb = a.rows, a.row_bytes
    dest = aligned_buffer(n * rb, a.align)[: n * rb].reshape(n, rb)
    job = Job(np.zeros(n, np.int32), np.arange(n, dtype=np.int64) * rb, SHAPES["block"].limited(merge_gap=0),
              dest=dest, span=True)
    ways = {"per_row": Planner(rb, a.align, True), "spanned": Planner(rb, a.align, False)}
    got: dict[str, list[float]] = {k: [] for k in ways}
    plans = {}
    for i in range(2 * a.rounds + 2):
        name = ("per_row", "spanned")[i % 2]
        r = _Reading(job)
        t = time.perf_counter()
        ways[name]._plan(r)
        if i >= 2:  # the first of each, which touches the arrays first, is left out
            got[name].append((time.perf_counter() - t) * 1e3)
        plans[name] = r
    same = all(np.array_equal(getattr(plans["per_row"], k), getattr(plans["spanned"], k))
               for k in ("direct", "run_rows", "by_run"))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"segment: {n} rows of {rb} B ({n * rb / 1e6:.1f} MB), {len(plans['spanned'].plan)} runs, "
          f"{int(plans['spanned'].direct.sum())} read straight in; medians of {a.rounds} plans each way, alternated")
    print(f"same_plan: {same}")
    print(f"plan_ms_per_row_test: {med['per_row']:.3f}")
    print(f"plan_ms_spanned: {med['spanned']:.3f}")
    print(f"plan_ratio: {med['per_row'] / med['spanned']:.2f}  (per-row test / by arithmetic)")


if __name__ == "__main__":
    main()
