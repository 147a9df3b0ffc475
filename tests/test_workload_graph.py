"""On-disk graph format: round trip, crash safety, and one test per validation error (each names the file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.workload import graph as G
from moment.outputs import sha256_file
from moment.workload.graph import GraphDataset, GraphWriter, write_graph


def tiny(n: int = 6, d: int = 4) -> dict[str, np.ndarray]:
    # row v = in-neighbours of v
    rows = [[1, 2], [0], [], [0, 1, 2], [5], [4]]
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    indices = np.array([x for r in rows for x in r], dtype=np.int64)
    return {
        "indptr": indptr,
        "indices": indices,
        "features": np.arange(n * d, dtype=np.float32).reshape(n, d),
        "labels": np.array([0, 1, 2, 0, 1, -1]),
        "train_idx": np.array([0, 1]),
        "val_idx": np.array([2]),
        "test_idx": np.array([3, 4]),
    }


@pytest.fixture
def ds_dir(tmp_path: Path) -> Path:
    write_graph(tmp_path / "g", num_classes=3, **tiny())
    return tmp_path / "g"


def test_round_trip(ds_dir: Path) -> None:
    ds = GraphDataset.open(ds_dir, verify=True)
    t = tiny()
    assert (ds.num_nodes, ds.num_edges, ds.feature_dim, ds.num_classes) == (6, 8, 4, 3)
    assert ds.indices.dtype == np.int32 and ds.labels.dtype == np.int16
    assert ds.feature_dtype == np.float32 and ds.row_bytes == 16
    np.testing.assert_array_equal(ds.indptr, t["indptr"])
    np.testing.assert_array_equal(ds.indices, t["indices"])
    f = ds.features_memmap()
    assert isinstance(f, np.memmap) and f.shape == (6, 4)
    np.testing.assert_array_equal(f, t["features"])
    np.testing.assert_array_equal(ds.degrees(), [2, 1, 0, 3, 1, 1])
    np.testing.assert_array_equal(ds.split("test"), [3, 4])
    m = json.loads((ds_dir / "manifest.json").read_text())
    assert m["schema_version"] == 1 and m["files"]["features"]["sha256"] == sha256_file(ds_dir / "features.npy")
    assert ds.summary()["train"] == 2
    with pytest.raises(MomentError, match="unknown split"):
        ds.split("nope")


def test_float16_features(tmp_path: Path) -> None:
    t = tiny()
    t["features"] = t["features"].astype(np.float16)
    ds = write_graph(tmp_path / "h", **t)
    assert ds.feature_dtype == np.float16 and ds.row_bytes == 8 and ds.num_classes == 3


def test_streamed_file_matches_np_save(tmp_path: Path) -> None:
    a = np.random.default_rng(0).standard_normal((100, 3)).astype(np.float32)
    w = G.NpyStreamWriter(tmp_path / "x.npy", np.float32, (3,))  # unknown row count: header rewritten
    for s in range(0, 100, 7):
        w.write(a[s : s + 7])
    rec = w.close()
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), a)
    assert rec.shape == [100, 3] and rec.sha256 == sha256_file(tmp_path / "x.npy")


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), GraphWriter(tmp_path / "out") as w:
        w.write_array("indptr", np.zeros(3, dtype=np.int64))
        raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_directory_without_manifest_is_not_a_dataset(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    np.save(tmp_path / "half" / "indptr.npy", np.zeros(2, dtype=np.int64))
    with pytest.raises(MomentError, match="no manifest.json"):
        GraphDataset.open(tmp_path / "half")
    with pytest.raises(MomentError, match="not found"):
        GraphDataset.open(tmp_path / "missing")


def test_existing_output_refused_then_overwritten(ds_dir: Path) -> None:
    with pytest.raises(MomentError, match="already exists"):
        write_graph(ds_dir, **tiny())
    t = tiny()
    t["features"] = t["features"] + 1
    ds = write_graph(ds_dir, overwrite=True, **t)
    assert float(ds.features_memmap()[0, 0]) == 1.0
    assert sorted(p.name for p in ds_dir.parent.iterdir()) == ["g"]


def _tamper(d: Path, name: str, arr: np.ndarray) -> None:
    """Replace one array and make the manifest agree on size and checksum (so deeper checks run)."""
    f = d / f"{name}.npy"
    np.save(f, arr)
    m = json.loads((d / "manifest.json").read_text())
    whole, blocks, size = G.hash_blocks(f)
    m["files"][name].update(bytes=f.stat().st_size, sha256=whole, block_sha256=blocks, block_bytes=size,
                            shape=list(arr.shape), dtype=arr.dtype.name)
    (d / "manifest.json").write_text(json.dumps(m))


BAD = [
    ("indptr", lambda t: np.array([1, 2, 3, 4, 7, 8, 8], dtype=np.int64), "must start at 0"),
    ("indptr", lambda t: np.array([0, 2, 3, 3, 6, 7, 9], dtype=np.int64), "end at num_edges"),
    ("indptr", lambda t: np.array([0, 2, 1, 3, 6, 7, 8], dtype=np.int64), "not monotone"),
    ("indices", lambda t: np.array([1, 2, 0, 0, 1, 9, 5, 4], dtype=np.int32), "neighbour id 9 out of range"),
    ("indices", lambda t: np.array([1, 2, 0, 0, 1, -1, 5, 4], dtype=np.int32), "out of range"),
    ("features", lambda t: t["features"][:5], "wrong row count"),
    ("features", lambda t: t["features"].astype(np.float64), "dtype float64"),
    ("labels", lambda t: np.array([0, 1, 2, 0, 3, -1], dtype=np.int16), "label 3 out of range"),
    ("labels", lambda t: np.array([0, 1, 2, 0, -2, -1], dtype=np.int16), "label -2 out of range"),
    ("labels", lambda t: np.zeros(5, dtype=np.int16), "shape"),
    ("train_idx", lambda t: np.array([0, 6]), "node id 6 out of range"),
    ("val_idx", lambda t: np.array([-1]), "node id -1 out of range"),
    ("test_idx", lambda t: np.array([5]), "unlabelled"),
    ("test_idx", lambda t: np.zeros((2, 2), dtype=np.int64), "1-d integer"),
]


@pytest.mark.parametrize(("name", "make", "msg"), BAD, ids=[f"{b[0]}:{b[2]}" for b in BAD])
def test_validation_errors_name_the_file(ds_dir: Path, name: str, make, msg: str) -> None:
    _tamper(ds_dir, name, make(tiny()))
    with pytest.raises(MomentError, match=msg) as e:
        GraphDataset.open(ds_dir, verify=True)
    assert f"{name}.npy" in str(e.value)


def test_size_disagreeing_with_manifest(ds_dir: Path) -> None:
    with open(ds_dir / "indices.npy", "ab") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(MomentError, match="disagrees with the manifest") as e:
        GraphDataset.open(ds_dir)
    assert "indices.npy" in str(e.value)


def test_checksum_mismatch(ds_dir: Path) -> None:
    f = ds_dir / "features.npy"
    b = bytearray(f.read_bytes())
    b[-1] ^= 0xFF
    f.write_bytes(bytes(b))
    GraphDataset.open(ds_dir)  # cheap checks pass: same size
    with pytest.raises(MomentError, match="sha256 mismatch") as e:
        GraphDataset.open(ds_dir, verify=True)
    assert "features.npy" in str(e.value)


def test_missing_file_and_bad_manifest(ds_dir: Path) -> None:
    (ds_dir / "labels.npy").unlink()
    with pytest.raises(MomentError, match="missing") as e:
        GraphDataset.open(ds_dir)
    assert "labels.npy" in str(e.value)
    m = ds_dir / "manifest.json"
    m.write_text("{not json")
    with pytest.raises(MomentError, match="unreadable manifest"):
        GraphDataset.open(ds_dir)
    m.write_text(json.dumps({"format": "moment-graph", "schema_version": 99}))
    with pytest.raises(MomentError, match="schema_version 99"):
        GraphDataset.open(ds_dir)
    m.write_text(json.dumps({"format": "moment-graph", "schema_version": 1, "num_nodes": -1}))
    with pytest.raises(MomentError, match="invalid manifest field"):
        GraphDataset.open(ds_dir)


def test_validation_is_chunked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny chunks: a decrease exactly at a chunk boundary is still found."""
    monkeypatch.setattr(G, "CHUNK_BYTES", 16)  # 2 int64 per chunk
    rng = np.random.default_rng(1)
    n = 50
    deg = rng.integers(0, 4, n)
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    t = {
        "indptr": indptr,
        "indices": rng.integers(0, n, int(indptr[-1])),
        "features": np.zeros((n, 2), np.float32),
        "labels": rng.integers(0, 3, n),
        "train_idx": np.arange(5),
        "val_idx": np.arange(5, 7),
        "test_idx": np.arange(7, 9),
    }
    d = tmp_path / "c"
    write_graph(d, **t)
    GraphDataset.open(d, verify=True)
    bad = indptr.copy()
    bad[4] = bad[3] - 1 if bad[3] > 0 else bad[3]
    bad[3] = bad[3] + 100
    _tamper(d, "indptr", bad)
    with pytest.raises(MomentError, match="not monotone"):
        GraphDataset.open(d, verify=True)


def test_planner_side_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import moment.workload.graph, moment.workload.synth, moment.workload.importers, "
        "moment.workload.import_npy, moment.workload.import_pyg, moment.workload.import_ogb_processed, "
        "moment.workload.hotness, moment.cli.data_cmds; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_overwrite_never_replaces_user_data(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "thesis.tex").write_text("precious")
    with pytest.raises(MomentError, match="not a Moment dataset"):
        write_graph(d, overwrite=True, **tiny())
    assert (d / "thesis.tex").read_text() == "precious"


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, ">i4"])
def test_the_first_id_outside_the_nodes_is_found_in_any_chunk(dtype) -> None:
    """One unsigned maximum per chunk finds a negative id (a huge unsigned one) and one past the last node, in
    the first chunk, the last, or at a boundary between two; the first such id is named."""
    n = 1000
    a = (np.arange(100, dtype=np.int64) * 7 % n).astype(dtype)
    for chunk in (8, 40, 1 << 20):  # 2 ids of 4 bytes a chunk, or 8 bytes, ..., everything at once
        assert G._first_outside(a, n, chunk) is None
        for at, bad in ((0, n), (99, n + 5), (50, -3), (49, 10**6)):
            if bad < 0 and np.dtype(dtype).kind == "u":
                continue
            b = a.copy()
            b[at] = bad
            b[at + (1 if at < 99 else -1)] = n + 7  # a second bad id: after it, or before the last
            want = bad if at < 99 else n + 7
            assert G._first_outside(b, n, chunk) == want, (chunk, at, bad)
