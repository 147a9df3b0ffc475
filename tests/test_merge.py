"""Request merging (moment.io.merge) alone: the runs cover every row exactly where the plan says, stay
aligned and within max_request, and merge only across gaps the shape allows."""

from __future__ import annotations

import numpy as np
import pytest

from moment.io import merge
from moment.io.merge import SHAPES, plan_runs

ALIGN, ROW = 4096, 640


@pytest.mark.parametrize("merge_gap", [0, 16 << 10])
@pytest.mark.parametrize("max_request", [4096, 128 << 10])
def test_runs_cover_every_row_aligned_and_bounded(merge_gap, max_request):
    rng = np.random.default_rng(3)
    n = 500
    f = rng.integers(0, 3, n).astype(np.int32)
    off = rng.integers(0, 2000, n) * ROW  # unsorted, with repeats
    p = plan_runs(f, off, ROW, ALIGN, merge_gap, max_request)
    assert (p.start % ALIGN == 0).all() and (p.length % ALIGN == 0).all()
    # each row lies inside its run, at the offset the plan gives
    assert (p.file[p.row_run] == f).all()
    assert (p.start[p.row_run] + p.row_at == off).all()
    assert (p.row_at + ROW <= p.length[p.row_run]).all()
    # pieces are cut at max_request by their rows' first block: the last row may spill one block over
    assert (p.length <= max_request + ALIGN).all()


def test_a_wider_gap_means_fewer_larger_reads():
    off = np.arange(0, 200, 3) * ALIGN  # every third block
    f = np.zeros(off.shape[0], np.int32)
    tight = plan_runs(f, off, ROW, ALIGN, 0, 1 << 20)
    loose = plan_runs(f, off, ROW, ALIGN, 2 * ALIGN, 1 << 20)
    assert len(tight) == off.shape[0] and len(loose) < len(tight) and loose.bytes > tight.bytes
    assert SHAPES["block"].cost(loose) != SHAPES["block"].cost(tight)


def test_no_rows_no_runs():
    p = plan_runs(np.zeros(0, np.int32), np.zeros(0, np.int64), ROW, ALIGN, 0, 1 << 20)
    assert len(p) == 0 and p.bytes == 0


@pytest.mark.skipif(merge._native_plan is None, reason="the native extension is not built")
@pytest.mark.parametrize("align", [512, 4096, 1000])  # 1000: a block size that is not a power of two
def test_the_native_pass_plans_as_numpy_does(monkeypatch, align):
    """The C pass and the NumPy fallback give the same reads and row places, for every shape's choice of
    gap, on unsorted rows with repeats, sorted rows (no sort then) and rows spanning blocks."""
    rng = np.random.default_rng(7)
    for case in range(60):
        n, row = int(rng.integers(0, 300)), int(rng.choice([100, 640, 5000]))
        f = rng.integers(0, 3, n).astype(np.int32)
        off = rng.integers(0, 400, n).astype(np.int64) * int(rng.choice([row, align, 96]))
        if case % 3 == 0:
            order = np.lexsort((off, f))
            f, off = f[order], off[order]
        sizes = np.full(3, int(off.max(initial=0)) + row + int(rng.integers(0, align)), np.int64) if case % 2 else None
        for shape in ("rows", "block"):
            for max_request in (align, 3 * align, 1 << 20):
                s = SHAPES[shape].limited(max_request=max_request)
                native = s.plan(f, off, row, align, 1 << 20, sizes)
                monkeypatch.setattr(merge, "_native_plan", None)
                numpy = s.plan(f, off, row, align, 1 << 20, sizes)
                monkeypatch.undo()
                for k in ("file", "start", "length", "row_run", "row_at"):
                    assert np.array_equal(getattr(native, k), getattr(numpy, k)), (case, shape, k)
                # the place order groups the rows by run, runs in order (the reader copies a window's rows by it)
                assert np.array_equal(np.sort(native.order), np.arange(n))
                assert (np.diff(native.row_run[native.order]) >= 0).all()


@pytest.mark.parametrize("shape", ["rows", "block", "packed"])
@pytest.mark.parametrize("density", [0.02, 0.3, 0.9])
def test_a_plans_price_is_the_price_of_the_plan_the_shape_makes(shape, density):
    """`plan_price` (what a disk tier weighs against reading a pack segment whole) is the cost model's price
    of exactly the reads `plan` makes of those rows, whichever gap the shape picks."""
    s = SHAPES[shape]
    rng = np.random.default_rng(5)
    off = np.flatnonzero(rng.random(6000) < density) * ROW  # one file, rows in place order
    f = np.zeros(off.shape[0], np.int32)
    window = 1 << 20
    p = s.plan(f, off, ROW, ALIGN, window)
    placed = merge.Placed(np.arange(off.shape[0]), f, off)
    assert s.plan_price(placed, ROW, ALIGN, window) == pytest.approx(s.price(len(p), p.bytes), rel=1e-12)
    assert s.longest(ALIGN, window) == min(s.max_request, window) and (p.length <= s.longest(ALIGN, window) + ALIGN).all()


def test_rows_in_order_within_each_file_are_placed_by_file_alone_and_others_by_their_keys(monkeypatch):
    """A cache's fill comes hottest first, which is slot order within each shard: grouping by file (a linear radix
    sort) places it. Rows that only look so on the sampled rows, or are in no order, are sorted by their keys;
    each way gives the place order."""
    rng = np.random.default_rng(5)
    n = 3 * merge.BY_FILE_ROWS
    f = rng.integers(0, 4, n).astype(np.int32)
    off = np.empty(n, np.int64)
    for k in range(4):  # each file's rows at increasing offsets, the files interleaved
        at = np.flatnonzero(f == k)
        off[at] = np.sort(rng.choice(10 * n, at.size, replace=False)) * ROW
    sorts: list[str] = []  # the dtypes of the whole rows' sorts: int16 by file, int64 by key
    real = np.argsort

    def counting(a, *args, **kw):
        if a.shape[0] == n:
            sorts.append(a.dtype.name)
        return real(a, *args, **kw)

    monkeypatch.setattr(np, "argsort", counting)
    want = np.lexsort((off, f))
    assert np.array_equal(merge.place(f, off).order, want) and sorts == ["int16"]  # grouped by file alone
    off2 = off.copy()
    at, step = np.flatnonzero(f == 2), n // 1024
    i = next(j for j in range(1, at.size) if at[j] % step and at[j - 1] % step)  # two rows no sample takes
    off2[at[i - 1]], off2[at[i]] = off2[at[i]], off2[at[i - 1]]
    sorts.clear()
    p = merge.place(f, off2)
    assert sorts == ["int16", "int64"] and np.array_equal(p.offset, off2[np.lexsort((off2, f))])
    sorts.clear()
    shuffled = rng.permutation(n)
    assert np.array_equal(merge.place(f[shuffled], off[shuffled]).offset, off[want]) and sorts == ["int64"]
    assert np.array_equal(merge.place(f[:1000], off[:1000]).order, np.lexsort((off[:1000], f[:1000])))


def test_a_span_is_planned_by_arithmetic_as_plan_runs_plans_it():
    """A whole pack segment's plan (`span_plan`) is exactly the general one wherever it is made, and declines
    the row widths whose runs `plan_runs` cuts mid-row (a row starting in a run's last block stays in it)."""
    made = declined = 0
    for rb in (4, 512, 640, 768, 4096, 12288, 1 << 20, 3 << 20):
        for align in (512, 4096):
            for max_request in (4096, 1 << 20, 3 << 20):
                for n in (1, 7, 2048, 75001):
                    for start, clip in ((0, False), (3 * align, True)):
                        size = start + n * rb + (0 if clip else 10 * align)  # clipped: a file ending mid-block
                        got = merge.span_plan(2, start, n, rb, align, max_request, size)
                        if got is None:
                            declined += 1
                            continue
                        made += 1
                        want = plan_runs(np.full(n, 2, np.int32), start + np.arange(n, dtype=np.int64) * rb, rb,
                                         align, 0, max_request, np.array([0, 0, size], np.int64))
                        for k in ("file", "start", "length", "row_run", "row_at", "order"):
                            assert np.array_equal(getattr(got, k), getattr(want, k)), (rb, align, max_request, n, k)
    assert made > 250 and declined  # 640 and 12288 bytes into 1 MiB: declined
    assert merge.span_plan(0, 100, 10, 512, 4096, 1 << 20) is None  # not on a block
    assert merge.span_plan(0, 0, 0, 512, 4096, 1 << 20) is None
