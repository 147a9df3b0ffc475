"""Synthetic generator: deterministic, valid, skewed, homophilous, learnable, chunk-streamed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.workload import graph
from moment.workload import synth as S
from moment.workload.graph import GraphDataset
from moment.workload.synth import split_sizes, synthesize


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> GraphDataset:
    return synthesize(tmp_path_factory.mktemp("s") / "g", 20_000, feature_dim=32, num_classes=8, seed=3)


def test_valid_and_shaped(small: GraphDataset) -> None:
    small.verify()
    assert small.num_nodes == 20_000 and small.feature_dim == 32 and small.num_classes == 8
    assert abs(small.num_edges / small.num_nodes - 15) < 2
    src = small.manifest.source
    assert 0.7 <= src["homophily"] <= 0.8
    # rows sorted, no duplicates, no self loops
    ip, ix = np.asarray(small.indptr), np.asarray(small.indices).astype(np.int64)
    rows = np.repeat(np.arange(small.num_nodes), np.diff(ip))
    key = rows * small.num_nodes + ix
    assert np.all(np.diff(key) > 0) and not np.any(rows == ix)


def test_skewed(small: GraphDataset) -> None:
    deg = small.degrees()
    assert deg.max() > 20 * deg.mean()
    appear = np.bincount(np.asarray(small.indices), minlength=small.num_nodes)
    top1 = np.sort(appear)[::-1][: small.num_nodes // 100].sum() / appear.sum()
    assert top1 > 0.1  # the hottest 1% of nodes are >10% of neighbour slots


def test_splits(small: GraphDataset) -> None:
    tr, va, te = (np.asarray(small.split(s)) for s in ("train", "val", "test"))
    assert len(tr) == 512 and len(va) >= 100 and len(te) >= 100  # small graph: minimum train size
    allx = np.concatenate([tr, va, te])
    assert len(np.unique(allx)) == len(allx) and np.all(np.diff(tr) > 0)
    assert split_sizes(10_000_000, 0.01, 0.005, 0.005) == (100_000, 50_000, 50_000)
    with pytest.raises(MomentError):
        split_sizes(10, 0.9, 0.5, 0.5)


def test_learnable_by_aggregation(small: GraphDataset) -> None:
    """Nearest-centroid accuracy: own features are mediocre, own + 2-hop neighbour mean much better."""
    import scipy.sparse as sp

    x = np.asarray(small.features_memmap(), dtype=np.float64)
    y = np.asarray(small.labels).astype(np.int64)
    n = small.num_nodes
    a = sp.csr_matrix((np.ones(small.num_edges), np.asarray(small.indices), np.asarray(small.indptr)), shape=(n, n))
    deg = np.maximum(np.asarray(a.sum(1)).ravel(), 1)[:, None]
    m1 = a @ x / deg
    agg = x + m1 + (a @ m1) / deg
    tr = np.arange(n) < n // 2

    def acc(f: np.ndarray) -> float:
        cent = np.stack([f[tr & (y == c)].mean(0) for c in range(8)])
        pred = np.argmin(((f[~tr, None, :] - cent[None]) ** 2).sum(-1), axis=1)
        return float((pred == y[~tr]).mean())

    own, both = acc(x), acc(agg)
    assert own < 0.6 and both > own + 0.2, (own, both)


def test_deterministic_and_chunked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "CHUNK_ROWS", 700)  # many chunks
    calls: list[tuple[int, int]] = []
    a = synthesize(tmp_path / "a", 3000, feature_dim=8, seed=5, progress=lambda d, t: calls.append((d, t)))
    b = synthesize(tmp_path / "b", 3000, feature_dim=8, seed=5)
    c = synthesize(tmp_path / "c", 3000, feature_dim=8, seed=6, dtype="float16")
    a.verify()
    c.verify()
    for name in a.manifest.files:
        assert a.manifest.files[name].sha256 == b.manifest.files[name].sha256, name
    assert a.manifest.files["indices"].sha256 != c.manifest.files["indices"].sha256
    assert c.feature_dtype == np.float16
    assert len(calls) == 5 and calls[-1] == (3000, 3000)


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"num_nodes": 1}, "at least 2"),
        ({"feature_dim": 0}, "feature-dim"),
        ({"num_classes": 0}, "classes"),
        ({"dtype": "int8"}, "float32 or float16"),
        ({"power_law": 2.0}, "> 2"),
        ({"homophily": 1.5}, "homophily"),
        ({"avg_degree": -1}, "avg-degree"),
        ({"avg_degree": 0}, "avg-degree"),  # an edgeless graph has nothing to sample
        ({"avg_degree": 1e-6}, "no edges"),
        ({"train_fraction": 0}, "train-fraction"),  # was silently 500 training nodes
        ({"train_fraction": 1.5}, "train-fraction"),
    ],
)
def test_bad_arguments(tmp_path: Path, kw: dict, msg: str) -> None:
    args = {"num_nodes": 1000} | kw
    with pytest.raises(MomentError, match=msg):
        synthesize(tmp_path / "x", **args)
    assert not (tmp_path / "x").exists()


def test_one_class(tmp_path: Path) -> None:
    ds = synthesize(tmp_path / "e", 2000, feature_dim=4, avg_degree=2, num_classes=1)
    ds.verify()
    assert ds.num_edges > 0 and ds.num_classes == 1


def test_the_graph_does_not_depend_on_the_feature_width(tmp_path):
    """bench/epoch.py samples a size's batches on its graph synthesized with one-wide features, before
    the real dataset is built: the same seed gives the same graph, labels and splits at any width."""
    one = synthesize(tmp_path / "one", 3000, feature_dim=1, seed=4)
    wide = synthesize(tmp_path / "wide", 3000, feature_dim=48, seed=4)
    for name in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(np.load(one.file(name)), np.load(wide.file(name))), name


def test_a_dataset_larger_than_the_disk_is_refused_before_it_is_drawn(tmp_path: Path, monkeypatch) -> None:
    """Its size is known up front: refused at once, naming the size and the free space, with nothing left behind
    (400 GB of features on a 64 GB disk drew the model for 73 s, then wrote until the disk was full)."""
    real = shutil.disk_usage
    monkeypatch.setattr(graph.shutil, "disk_usage", lambda p: real(p)._replace(free=10 << 20))
    drawn = []
    monkeypatch.setattr(S._Model, "draw", classmethod(lambda cls, *a, **k: drawn.append(a)))
    with pytest.raises(MomentError) as e:
        synthesize(tmp_path / "big", 100_000, feature_dim=64)  # 24.4 MiB of features
    msg = str(e.value)
    assert "the dataset needs at least 24.4 MiB (features: 24.4 MiB)" in msg and "has 10.0 MiB free" in msg, msg
    assert not drawn and sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert synthesize(tmp_path / "big", 100_000, feature_dim=64).num_nodes == 100_000  # room: written
