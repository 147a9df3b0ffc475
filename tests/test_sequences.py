"""moment.io.sequences.subsequence: the native pass and the NumPy one agree, on matches and on refusals."""

from __future__ import annotations

import numpy as np
import pytest

from moment.io import sequences


@pytest.fixture(params=["native", "numpy"])
def subsequence(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(sequences, "_native_subsequence", None)
    elif sequences._native_subsequence is None:
        pytest.skip("the native extension is not built here")
    return sequences.subsequence


def test_a_part_in_order_is_found_and_anything_else_refused(subsequence):
    rng = np.random.default_rng(2)
    have = rng.permutation(10_000)[:3000]
    keep = np.sort(rng.choice(3000, 1800, replace=False))
    assert np.array_equal(subsequence(have, have[keep]), keep)
    assert np.array_equal(subsequence(have.astype(np.int32), have), np.arange(3000))
    assert subsequence(have, have[:0]).shape == (0,) and subsequence(have[:0], have[:0]).shape == (0,)
    swapped = have[keep].copy()
    swapped[[5, 6]] = swapped[[6, 5]]
    assert subsequence(have, swapped) is None  # out of order
    assert subsequence(have, np.append(have[keep], 10_001)) is None  # one not in it
    assert subsequence(have, have[[1, 1]]) is None  # one twice
    assert subsequence(have[:0], have[:1]) is None
