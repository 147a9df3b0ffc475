"""Request merging (moment.io.merge) alone: the runs cover every row exactly where the plan says, stay
aligned and within max_request, and merge only across gaps the shape allows."""

from __future__ import annotations

import numpy as np
import pytest

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
