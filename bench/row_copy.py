"""The gather path's row copy (moment.io.rows.copy_rows, native) in its two cases, each against what it would do
otherwise, interleaved so that a neighbour's burst falls on all of them, the best of `--repeat` passes:

* random rows of a segment as large as the 8M bench's CPU cache (shared memory, as that cache's) into a batch's
  buffer: with its prefetch, without it, and NumPy's fancy indexing (the copy it replaced);
* rows read in order (a finished read's or a pack segment's, `--rows` of them) into scattered rows of a batch
  twice as large, as the disk tier copies them: with streaming stores (what the copy picks there) and with memcpy.

Rows of 256 B to 1 KiB are the feature rows of 64 to 256 float32 dimensions. Prints `name: value` lines; each ratio
is baseline / now.

    .venv/bin/python bench/row_copy.py [--segment 2GiB] [--rows 200000] [--row-bytes 256,512,1024] [--repeat 8]
"""

from __future__ import annotations

import argparse
import mmap
import time

import numpy as np

from moment.errors import MomentError
from moment.io.rows import _copy, copy_rows
from moment.sizes import available_memory, parse_size


def measure(rb: int, segment: int, rows: int, repeat: int, rng: np.random.Generator) -> dict[str, float]:
    """ns per row of each copy, the best of `repeat` interleaved passes."""
    # shared memory, as the CPU cache's /dev/shm segment (moment.runtime.hostcache): its pages are the kernel's
    # small ones where shared memory gets no transparent huge pages, which NumPy's own arrays may get
    shared = mmap.mmap(-1, segment // rb * rb, flags=mmap.MAP_SHARED)
    src = np.frombuffer(shared, np.uint8).reshape(-1, rb)
    src[:] = 1  # written: every page is real
    idx = rng.integers(0, src.shape[0], rows)
    dst = np.zeros((rows, rb), np.uint8)
    # in order: the first rows of the segment into every other row of a batch, scattered as a batch's misses are
    ordered = np.arange(rows, dtype=np.int64) % src.shape[0]  # in order where the segment holds `rows` rows
    spread = np.sort(rng.permutation(2 * rows)[:rows]).astype(np.int64)
    batch = np.zeros((2 * rows, rb), np.uint8)
    runs = {"prefetch": lambda: copy_rows(dst, None, src, idx),
            "no_prefetch": lambda: _copy(dst, None, src, idx, rb, rb, 0),
            "numpy": lambda: np.take(src, idx, axis=0, out=dst),
            "in_order": lambda: copy_rows(batch, spread, src, ordered),
            "in_order_memcpy": lambda: _copy(batch, spread, src, ordered, rb, rb, 8, 0)}
    got = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            got[name] = min(got[name], (time.perf_counter() - t) / rows * 1e9)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segment", default="2GiB", help="the source segment's size, or a share of available memory (default 2GiB)")
    ap.add_argument("--rows", type=int, default=200_000, help="rows copied per pass (default 200000)")
    ap.add_argument("--row-bytes", default="256,512,1024", help="row sizes, comma-separated (default 256,512,1024)")
    ap.add_argument("--repeat", type=int, default=8, help="passes of each copy; the best counts (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if _copy is None:
        raise SystemExit("the native extension is not built: python setup.py build_ext --inplace")
    try:
        segment = parse_size(args.segment, available_memory() or 0)
    except MomentError as e:
        raise SystemExit(f"error: --segment {e}") from None
    try:
        sizes = [int(b) for b in args.row_bytes.split(",")]
    except ValueError:
        raise SystemExit(f"error: --row-bytes {args.row_bytes!r}: integers, comma-separated (e.g. 256,512)") from None
    if args.rows < 1 or args.repeat < 1 or min(sizes) < 1 or segment < max(sizes):
        raise SystemExit("error: --rows, --repeat and every --row-bytes must be >= 1, and --segment hold a row")
    rng = np.random.default_rng(args.seed)
    for rb in sizes:
        got = measure(rb, segment, args.rows, args.repeat, rng)
        print(f"row_bytes: {rb}")
        for name, ns in got.items():
            print(f"  {name}_ns_per_row: {ns:.1f}")
        print(f"  ratio_no_prefetch_over_prefetch: {got['no_prefetch'] / got['prefetch']:.3f}")
        print(f"  ratio_numpy_over_prefetch: {got['numpy'] / got['prefetch']:.3f}")
        print(f"  ratio_memcpy_over_streamed_in_order: {got['in_order_memcpy'] / got['in_order']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
