"""GraphSAINT releases (adj_full.npz, feats.npy, class_map.json, role.json) and SciPy sparse adjacencies given
to the `.npy` importer: the edges PyG's Flickr loader builds from the same files, the split as given, labels
from numbers or one-hot lists, and each malformed file one error naming it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from moment.cli import main
from moment.errors import MomentError
from moment.workload.import_npy import import_npy
from moment.workload.import_saint import import_saint

N, D = 40, 6
RNG = np.random.default_rng(11)
PAIRS = np.unique(RNG.integers(0, N, size=(90, 2)), axis=0)
ADJ = sp.coo_matrix((np.ones(len(PAIRS)), (PAIRS[:, 0], PAIRS[:, 1])), shape=(N, N))
ADJ = ((ADJ + ADJ.T) > 0).astype(np.float32).tocsr()  # symmetric, as the releases' adjacency is
FEAT = RNG.standard_normal((N, D)).astype(np.float32)
CLASSES = RNG.integers(0, 5, N)
ROLES = {"tr": list(range(0, 20)), "va": list(range(20, 30)), "te": list(range(30, 38))}  # 38, 39: no role


def write_saint(root: Path, class_map: object = None, roles: object = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    sp.save_npz(root / "adj_full.npz", ADJ)
    np.save(root / "feats.npy", FEAT)
    cm = {str(i): int(c) for i, c in enumerate(CLASSES)} if class_map is None else class_map
    (root / "class_map.json").write_text(json.dumps(cm))
    (root / "role.json").write_text(json.dumps(ROLES if roles is None else roles))
    return root


def pyg_rows(adj: sp.spmatrix) -> dict[int, list[int]]:
    """Each node's in-neighbours as PyG's Flickr builds its edge_index from adj_full.npz (row -> col)."""
    c = adj.tocoo()
    rows: dict[int, list[int]] = {v: [] for v in range(adj.shape[0])}
    for u, v in zip(c.row.tolist(), c.col.tolist()):
        rows[v].append(u)
    return {v: sorted(us) for v, us in rows.items()}


def rows_of(ds) -> dict[int, list[int]]:
    ip, ix = np.asarray(ds.indptr), np.asarray(ds.indices)
    return {v: sorted(ix[ip[v] : ip[v + 1]].tolist()) for v in range(ds.num_nodes)}


def test_a_release_imports_with_its_edges_features_labels_and_split(tmp_path: Path) -> None:
    ds = import_saint(write_saint(tmp_path / "flickr"), tmp_path / "out")
    ds.verify()
    assert ds.num_nodes == N and ds.num_edges == ADJ.nnz
    assert rows_of(ds) == pyg_rows(ADJ)
    np.testing.assert_array_equal(ds.features_memmap(), FEAT)
    np.testing.assert_array_equal(ds.labels, CLASSES)
    for got, role in zip((ds.train_idx, ds.val_idx, ds.test_idx), ("tr", "va", "te")):
        np.testing.assert_array_equal(got, ROLES[role])
    s = ds.manifest.source
    assert s["importer"] == "graphsaint" and s["split"] == "given" and not s["generated_features"]
    assert not s["undirected"] and s["duplicate_edges_found"] == 0


def test_one_hot_lists_are_classes_and_a_node_left_out_is_unlabelled(tmp_path: Path) -> None:
    cm = {str(i): [int(c == k) for k in range(5)] for i, c in enumerate(CLASSES) if i != 39}
    ds = import_saint(write_saint(tmp_path / "s", class_map=cm), tmp_path / "out")
    np.testing.assert_array_equal(ds.labels[:39], CLASSES[:39])
    assert ds.labels[39] < 0 and ds.manifest.source["unlabelled_nodes"] == 1


def test_a_multi_label_class_map_is_multi_label_targets(tmp_path: Path) -> None:
    targets = (RNG.random((N, 7)) < 0.3).astype(np.uint8)
    targets[0] = [1, 1, 0, 0, 0, 0, 1]  # several classes (and some nodes none): PPI's, Yelp's kind
    cm = {str(i): t.tolist() for i, t in enumerate(targets)}
    ds = import_saint(write_saint(tmp_path / "s", class_map=cm), tmp_path / "out")
    ds.verify()
    assert ds.multilabel and ds.num_classes == 7 and ds.labels.dtype == np.uint8
    np.testing.assert_array_equal(ds.labels, targets)
    np.testing.assert_array_equal(ds.train_idx, ROLES["tr"])
    assert ds.summary()["multilabel"] and "unlabelled_nodes" not in ds.manifest.source


def test_the_cli_imports_and_reports(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["data", "import", "graphsaint", str(write_saint(tmp_path / "s")), "--out", str(tmp_path / "o"),
                   "--json"])
    assert rc == 0, err.getvalue()
    got = json.loads(out.getvalue())
    assert got["num_nodes"] == N and got["source"]["importer"] == "graphsaint", got


@pytest.mark.parametrize(("change", "expect"), [
    ({"class_map": {"0": [1, 1, 0]}},
     "a multi-label class map must give every node its classes: 39 of the 40 nodes have none"),
    ({"class_map": {str(i): [1, 0] if i != 7 else [1, 2] for i in range(N)}},
     "the class lists must hold 0/1 numbers: node 7's target 1 is 2"),
    ({"class_map": {"0": ["a", "b"]}}, "the class lists must hold 0/1 numbers: node 0's target 0 is 'a'"),
    ({"class_map": {"0": [1, 0], "1": [1]}}, "node 1's classes are [1]: expected a list of 2 0/1 entries"),
    ({"class_map": {"0": "cat"}}, "node 0's class is 'cat'"),
    ({"class_map": {"x": 1}}, "node id 'x' is not an integer"),
    ({"class_map": {str(N): 1}}, f"node id {N} out of range [0, {N})"),
    ({"class_map": [1, 2]}, "expected an object mapping node ids to classes"),
    ({"roles": {"tr": [0], "va": [1]}}, '{"tr": [...], "va": [...], "te": [...]}'),
    ({"roles": {"tr": [0], "va": [1.5], "te": [2]}}, '"va" must be a list of integer node ids'),
    ({"roles": {"tr": [0, 1], "va": [1], "te": [2]}}, "node id 1 is in both the train split"),
    ({"roles": {"tr": [0, N], "va": [1], "te": [2]}}, f"node id {N} out of range [0, {N})"),
])
def test_a_malformed_file_is_one_error_naming_it(tmp_path: Path, change: dict, expect: str) -> None:
    src = write_saint(tmp_path / "s", **change)
    with pytest.raises(MomentError) as e:
        import_saint(src, tmp_path / "out")
    assert expect in str(e.value), e.value
    name = "class_map.json" if "class_map" in change else "role.json"
    assert name in str(e.value), e.value
    assert not (tmp_path / "out").exists()


def test_a_missing_or_broken_file_is_named_before_anything_is_written(tmp_path: Path) -> None:
    src = write_saint(tmp_path / "s")
    (src / "role.json").unlink()
    with pytest.raises(MomentError, match=r"role\.json: missing roles \(role\.json\)"):
        import_saint(src, tmp_path / "out")
    src = write_saint(tmp_path / "t")
    (src / "class_map.json").write_text('{"0": 1,')
    with pytest.raises(MomentError, match=r"class_map\.json: not valid JSON"):
        import_saint(src, tmp_path / "out")
    np.save(src / "adj_full.npy", np.zeros(3))
    (src / "adj_full.npy").rename(src / "adj_full.npz")  # a .npy under the .npz's name
    with pytest.raises(MomentError, match=r"adj_full\.npz: not an \.npz archive"):
        import_saint(src, tmp_path / "out")
    np.save(src / "feats.npy", FEAT[:-1])
    sp.save_npz(src / "adj_full.npz", ADJ)
    (src / "class_map.json").write_text("{}")
    with pytest.raises(MomentError, match=rf"feats\.npy: wrong row count: {N - 1} feature rows for {N} nodes"):
        import_saint(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_the_npy_importer_takes_a_scipy_adjacency(tmp_path: Path, fmt: str) -> None:
    adj = ADJ.asformat(fmt, copy=True)
    adj.data[0] = 0  # an explicit zero is no edge
    sp.save_npz(tmp_path / "adj.npz", adj)
    np.save(tmp_path / "x.npy", FEAT)
    ds = import_npy(tmp_path / "out", edge_index=tmp_path / "adj.npz", x=tmp_path / "x.npy")
    kept = adj.copy()
    kept.eliminate_zeros()
    assert ds.num_nodes == N and rows_of(ds) == pyg_rows(kept) and ds.num_edges == ADJ.nnz - 1


def test_the_npy_importer_refuses_an_adjacency_that_is_not_one(tmp_path: Path) -> None:
    sp.save_npz(tmp_path / "rect.npz", sp.csr_matrix(np.ones((3, 4))))
    with pytest.raises(MomentError, match=r"rect\.npz: the adjacency must be square .* got shape \[3, 4\]"):
        import_npy(tmp_path / "out", edge_index=tmp_path / "rect.npz")
    np.savez(tmp_path / "arrays.npz", edge_index=np.zeros((2, 3), np.int64))
    with pytest.raises(MomentError, match=r"arrays\.npz: an \.npz archive without a SciPy sparse matrix in it "
                                          r"\(it holds edge_index\)"):
        import_npy(tmp_path / "out", edge_index=tmp_path / "arrays.npz")
    sp.save_npz(tmp_path / "adj.npz", ADJ)
    with pytest.raises(MomentError, match=rf"--num-nodes 7, but the adjacency is {N} x {N}"):
        import_npy(tmp_path / "out", edge_index=tmp_path / "adj.npz", num_nodes=7)
    assert not (tmp_path / "out").exists()
