"""A batch's ids split by the GPU tier's tables (moment.io.splits): the native pass and the NumPy one give the same
arrays as a plain per-id reading of the tables, for every index dtype a layout uses."""

import numpy as np
import pytest

from moment.io import splits
from moment.io.engines import _native

ENGINES = ["numpy", pytest.param("native", marks=pytest.mark.skipif(
    getattr(_native, "split_held", None) is None, reason="the native extension is not built"))]


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(splits, "_split_held", None)
    return request.param


def _batch(rng, nodes: int, n: int) -> np.ndarray:
    ids = rng.choice(nodes, n, replace=False).astype(np.int64)
    ids[: min(3, n)] = np.array([0, nodes - 1, 63])[: min(3, n)] % nodes  # the first and last nodes
    return ids


@pytest.mark.parametrize("bin_dtype,slot_dtype", [(np.uint8, np.int32), (np.int16, np.int64)])
def test_a_tiers_split_names_each_held_row(engine, bin_dtype, slot_dtype):
    rng = np.random.default_rng(1)
    nodes, bins = 50_000, 9
    bin_of = rng.integers(0, bins, nodes).astype(bin_dtype)
    slot_of = np.zeros(nodes, slot_dtype)
    for b in range(bins):  # each bin's rows numbered from 0
        slot_of[bin_of == b] = rng.permutation(int((bin_of == b).sum()))
    limit = np.zeros(bins, np.int64)
    limit[[0, 4]] = [300, 10_000]  # a few of bin 0's rows, all of bin 4's
    base = np.concatenate([[0], np.cumsum(limit)[:-1]])
    ids = _batch(rng, nodes, 20_000)
    on, idx, rest = splits.split_held(ids, bin_of, slot_of, limit, base)
    want = [i for i, v in enumerate(ids) if slot_of[v] < limit[bin_of[v]]]
    assert on.tolist() == want and idx.tolist() == [int(base[bin_of[ids[i]]] + slot_of[ids[i]]) for i in want]
    assert rest.tolist() == sorted(set(range(len(ids))) - set(want))
    none = splits.split_held(ids[:0], bin_of, slot_of, limit, base)
    assert [a.size for a in none] == [0, 0, 0]


def test_an_id_outside_the_tables_is_an_error_not_a_read_past_them():
    if getattr(_native, "split_held", None) is None:
        pytest.skip("the native extension is not built (NumPy raises IndexError itself)")
    with pytest.raises(ValueError, match=r"ids\[0\] = -1"):
        splits.split_held(np.array([-1]), np.zeros(10, np.uint8), np.zeros(10, np.int32), np.ones(1, np.int64),
                          np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="in no bin"):  # a bin past the limits' table
        splits.split_held(np.array([3]), np.full(10, 2, np.uint8), np.zeros(10, np.int32), np.ones(1, np.int64),
                          np.zeros(1, np.int64))
