"""Parquet edge lists, node and label tables and id lists (what Spark, DuckDB and `df.to_parquet` write): each
imports as the same data given as text or `.npy` arrays does, read a record batch at a time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.workload import node_tables, parquet
from moment.workload.importers import import_edgelist

pa = pytest.importorskip("pyarrow", reason="pyarrow (the parquet extra) is not installed")
pq = pytest.importorskip("pyarrow.parquet")

RNG = np.random.default_rng(23)
N, E, D = 300, 2000, 4
NAMES = np.array([f"acct-{k}" for k in RNG.choice(10**9, N, replace=False)])
SPARSE = RNG.choice(2**62, N, replace=False).astype(np.int64)
X = RNG.standard_normal((N, D)).astype(np.float32)
PAIRS = RNG.integers(0, N, (E, 2))
CLASS = RNG.choice(np.array(["fraud", "ok", None], dtype=object), N, p=[0.2, 0.5, 0.3])
ARRAYS = ("indptr", "indices", "labels", "node_ids", "train_idx", "val_idx", "test_idx")


def save(path: Path, columns: dict, row_group_size: int = 256) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def same(a, b) -> None:
    for name in ARRAYS:
        if (a.path / f"{name}.npy").exists() or (b.path / f"{name}.npy").exists():
            np.testing.assert_array_equal(a._load(name), b._load(name), err_msg=name)
    np.testing.assert_array_equal(a.features_memmap(), b.features_memmap())


def test_names_with_a_vector_column_and_class_names_import_as_their_text(tmp_path: Path) -> None:
    """The oracle: the same edges, nodes and labels written as CSV. The edge list has a third column (a weight)
    beside its named source and destination, dictionary-encoded names (pandas' categoricals), row groups
    smaller than a batch and batches smaller than the tables (forced below)."""
    names = pa.array(NAMES).dictionary_encode()
    save(tmp_path / "e.parquet", {"w": RNG.random(E), "dst": names.take(PAIRS[:, 1]), "src": names.take(PAIRS[:, 0])})
    save(tmp_path / "n.parquet", {"acct": NAMES, "x": pa.array(list(X), type=pa.list_(pa.float32(), D))})
    save(tmp_path / "l.parquet", {"acct": NAMES, "class": CLASS})
    (tmp_path / "e.csv").write_text("src,dst\n" + "".join(f"{NAMES[a]},{NAMES[b]}\n" for a, b in PAIRS))
    (tmp_path / "n.csv").write_text("".join(",".join([NAMES[i], *map(repr, X[i].tolist())]) + "\n" for i in range(N)))
    (tmp_path / "l.csv").write_text("acct,class\n" + "".join(f"{NAMES[i]},{CLASS[i] or ''}\n" for i in range(N)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(node_tables, "ROWS", 70)
        got = import_edgelist(tmp_path / "e.parquet", tmp_path / "p", node_table=tmp_path / "n.parquet",
                              label_table=tmp_path / "l.parquet")
    want = import_edgelist(tmp_path / "e.csv", tmp_path / "c", node_table=tmp_path / "n.csv",
                           label_table=tmp_path / "l.csv")
    got.verify()
    same(got, want)
    assert got.class_names == want.class_names == ["fraud", "ok"]
    assert got.manifest.source["columns"] == ["src", "dst"]  # by their names, whatever their order
    assert got.manifest.source["labels_left_out"] == {"": int(sum(c is None for c in CLASS))}


def test_node_numbers_sparse_ids_and_parquet_splits_import_as_the_arrays(tmp_path: Path) -> None:
    """int32 node numbers (two unnamed columns) import plainly; sparse int64 ids in a table whose id pandas kept
    as its index (`df.set_index(...).to_parquet()`, written last) with numeric feature columns and integer
    labels with nulls, and splits as Parquet files of those ids (one a boolean mask), give what `--node-ids`,
    `.npy` features, labels and splits give."""
    save(tmp_path / "plain.parquet", {"a": PAIRS[:, 0].astype(np.int32), "b": PAIRS[:, 1].astype(np.int32)})
    np.save(tmp_path / "x.npy", X)
    got = import_edgelist(tmp_path / "plain.parquet", tmp_path / "p1", features=tmp_path / "x.npy")
    np.savetxt(tmp_path / "plain.txt", PAIRS, fmt="%d")
    same(got, import_edgelist(tmp_path / "plain.txt", tmp_path / "t1", features=tmp_path / "x.npy"))

    import pandas as pd

    save(tmp_path / "e.parquet", {"from": SPARSE[PAIRS[:, 0]], "to": SPARSE[PAIRS[:, 1]]})
    pd.DataFrame({"tx": SPARSE, **{f"f{k}": X[:, k] for k in range(D)}}).set_index("tx").to_parquet(tmp_path / "n.parquet")
    order = RNG.permutation(N)
    y = RNG.integers(0, 3, N).astype(float)
    y[order[-20:]] = np.nan  # in no split
    pd.DataFrame({"tx": SPARSE, "y": y}).to_parquet(tmp_path / "l.parquet")  # nulls make pandas' column float
    splits = tmp_path / "splits"
    splits.mkdir()
    save(splits / "train.parquet", {"tx": SPARSE[order[:150]]})
    save(splits / "valid.parquet", {"tx": SPARSE[order[150:200]]})
    mask = np.zeros(N, bool)
    mask[order[200:-20]] = True
    save(splits / "test.parquet", {"is_test": mask})
    got = import_edgelist(tmp_path / "e.parquet", tmp_path / "p2", node_table=tmp_path / "n.parquet",
                          label_table=tmp_path / "l.parquet", splits_dir=splits)
    np.savetxt(tmp_path / "ids.txt", SPARSE, fmt="%d")
    np.save(tmp_path / "y.npy", np.where(np.isnan(y), -1, y).astype(np.int64))
    text = tmp_path / "tsplits"
    text.mkdir()
    np.savetxt(text / "train.txt", SPARSE[order[:150]], fmt="%d")
    np.savetxt(text / "valid.txt", SPARSE[order[150:200]], fmt="%d")
    np.save(text / "test.npy", mask)
    want = import_edgelist(tmp_path / "e.parquet", tmp_path / "a2", node_ids=tmp_path / "ids.txt",
                           features=tmp_path / "x.npy", labels=tmp_path / "y.npy", splits_dir=text)
    same(got, want)
    np.testing.assert_array_equal(got.node_ids, SPARSE)
    # --node-ids as Parquet, and --renumber of Parquet integers
    save(tmp_path / "ids.parquet", {"tx": SPARSE})
    same(import_edgelist(tmp_path / "e.parquet", tmp_path / "p3", node_ids=tmp_path / "ids.parquet",
                         features=tmp_path / "x.npy", labels=tmp_path / "y.npy", splits_dir=text), want)
    renumbered = import_edgelist(tmp_path / "e.parquet", tmp_path / "p4", renumber=True)
    assert np.all(np.diff(renumbered.node_ids) > 0) and set(renumbered.node_ids) <= set(SPARSE.tolist())


ERRORS = [
    ("null-id", lambda d: save(d / "e.parquet", {"src": pa.array([1, 2, None]), "dst": [0, 1, 2]}),
     {}, "edge 3 lacks an id (a null in its row)"),
    ("empty-name", lambda d: save(d / "e.parquet", {"src": ["a", "b", ""], "dst": ["b", "c", "a"]}),
     {"renumber": True}, "edge 3 ('', 'a') lacks an id: each row needs two"),
    ("float-ids", lambda d: save(d / "e.parquet", {"src": [0.0, 1.5], "dst": [1.0, 0.0]}),
     {}, "column 'src' holds float values: ids are integers or names"),
    ("names-plain", lambda d: save(d / "e.parquet", {"src": ["a", "b"], "dst": ["b", "a"]}),
     {}, "column 'src' holds names, not node numbers"),
    ("three-columns", lambda d: save(d / "e.parquet", {"a": [0, 1], "b": [1, 0], "c": [1, 1]}),
     {}, "a Parquet edge list needs two id columns"),
    ("huge-unsigned", lambda d: save(d / "e.parquet", {"src": pa.array([2**64 - 1, 1], pa.uint64()), "dst": [1, 2]}),
     {}, "id 18446744073709551615 is above 2^63 - 1\n  hint: --renumber"),
    ("vectors-unequal", lambda d: (save(d / "e.parquet", {"src": ["a"], "dst": ["b"]}),
                                   save(d / "n.parquet", {"id": ["a", "b"], "x": [[1.0, 2.0], [3.0]]})),
     {"node_table": "n.parquet"}, "node b (row 2) has 1 features, the first node 2"),
    ("text-feature", lambda d: (save(d / "e.parquet", {"src": ["a"], "dst": ["b"]}),
                                save(d / "n.parquet", {"id": ["a", "b"], "x": ["1", "2"]})),
     {"node_table": "n.parquet"}, "column 'x' holds text values"),
    ("null-feature", lambda d: (save(d / "e.parquet", {"src": ["a"], "dst": ["b"]}),
                                save(d / "n.parquet", {"id": ["a", "b"], "x": [1.0, None]})),
     {"node_table": "n.parquet"}, "the features of node b (row 2) are missing, NaN or infinite"),
    ("nested-vectors", lambda d: (save(d / "e.parquet", {"src": ["a"], "dst": ["b"]}),
                                  save(d / "n.parquet", {"id": ["a", "b"], "x": [[[1.0]], [[2.0]]]})),
     {"node_table": "n.parquet"}, "column 'x' holds lists of list values: a node's vector holds numbers"),
    ("same-names", lambda d: pq.write_table(pa.table([pa.array([0]), pa.array([1])], names=["src", "src"]),
                                            d / "e.parquet"),
     {}, "two columns are named 'src'"),
    ("unknown-name", lambda d: (save(d / "e.parquet", {"src": ["a", "b"], "dst": ["b", "carol"]}),
                                save(d / "n.parquet", {"id": ["a", "b"], "x": [1.0, 2.0]})),
     {"node_table": "n.parquet"}, "names node carol, not among the 2 node ids of"),
    ("half-label", lambda d: (save(d / "e.parquet", {"src": [0], "dst": [1]}),
                              save(d / "l.parquet", {"id": [0, 1], "y": [1.0, 2.5]})),
     {"label_table": "l.parquet"}, "node 1 (row 2) has label 2.5: a class is a whole number or a name"),
    ("truncated", lambda d: (d / "e.parquet").write_bytes(
        (save(d / "full.parquet", {"src": [0, 1], "dst": [1, 0]})).read_bytes()[:-30]),
     {}, "cannot read the edge list as Parquet"),
]


@pytest.mark.parametrize("case, make, kwargs, words", ERRORS, ids=[c[0] for c in ERRORS])
def test_a_bad_parquet_table_is_one_error_naming_it_and_nothing_is_written(tmp_path: Path, case, make, kwargs,
                                                                           words: str) -> None:
    make(tmp_path)
    kwargs = {k: tmp_path / v if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(MomentError) as e:
        import_edgelist(tmp_path / "e.parquet", tmp_path / "out", **kwargs)
    assert words in str(e.value), str(e.value)
    assert str(tmp_path) in str(e.value)  # names the file
    assert not (tmp_path / "out").exists()


def test_without_pyarrow_a_parquet_file_says_how_to_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    save(tmp_path / "e.parquet", {"src": [0], "dst": [1]})
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(MomentError, match=r"reading Parquet needs pyarrow\n  hint: pip install 'moment\[parquet\]'"):
        import_edgelist(tmp_path / "e.parquet", tmp_path / "out")
    assert parquet.is_parquet(tmp_path / "e.parquet") and not (tmp_path / "out").exists()


def test_the_cli_imports_parquet_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save(tmp_path / "e.parquet", {"source": NAMES[PAIRS[:, 0]], "target": NAMES[PAIRS[:, 1]]})
    save(tmp_path / "n.parquet", {"acct": NAMES, "x": pa.array(list(X), type=pa.list_(pa.float32()))})
    save(tmp_path / "l.parquet", {"acct": NAMES, "class": CLASS})
    rc = main(["data", "import", "edgelist", str(tmp_path / "e.parquet"), "--node-table", str(tmp_path / "n.parquet"),
               "--label-table", str(tmp_path / "l.parquet"), "--out", str(tmp_path / "ds"), "--json"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    assert got["num_nodes"] == N and got["feature_dim"] == D, got
    rc = main(["data", "import", "edgelist", str(tmp_path / "l.parquet"), "--out", str(tmp_path / "bad")])
    assert rc != 0 and "column 'acct' holds names, not node numbers" in capsys.readouterr().err


def test_a_parquet_table_given_for_an_array_says_where_it_goes(tmp_path: Path) -> None:
    """--features (a .npy) or `import npy`/`import pyg` given a Parquet file: named as such, with where it goes,
    not a wrong-header or not-a-pickle error."""
    from moment.workload.import_files import load_npy
    from moment.workload.torch_files import load_torch

    t = save(tmp_path / "x.parquet", {"id": [0, 1], "f": [0.5, 1.5]})
    for load in (load_npy, load_torch):
        with pytest.raises(MomentError) as e:
            load(t, "features file")
        assert "this is a Parquet table, not a" in str(e.value) and "--node-table" in str(e.value), str(e.value)


def test_a_directory_of_parts_is_its_parts_in_name_order(tmp_path: Path) -> None:
    """What Spark's `df.write.parquet(DIR)` leaves: part files (read in name order, their rows' order) beside
    `_SUCCESS` and `.crc` checksums, which are not data; a node table in parts keeps the node order. A part
    whose columns differ is one error naming that part."""
    edges = pa.table({"src": SPARSE[PAIRS[:, 0]], "dst": SPARSE[PAIRS[:, 1]]})
    nodes = pa.table({"id": SPARSE, "x": pa.array(list(X), type=pa.list_(pa.float32(), D))})
    for name, t in (("e", edges), ("n", nodes)):
        d = tmp_path / name
        d.mkdir()
        cut = t.num_rows // 3
        for k, (s, e) in enumerate(((cut, None), (0, cut))):  # written out of order: read by name
            pq.write_table(t.slice(s, None if e is None else e - s), d / f"part-{1 - k:05d}-9f3c.snappy.parquet")
        (d / "_SUCCESS").write_bytes(b"")
        (d / ".part-00000-9f3c.snappy.parquet.crc").write_bytes(b"crc")
        pq.write_table(t, tmp_path / f"{name}.parquet")
    got = import_edgelist(tmp_path / "e", tmp_path / "p", node_table=tmp_path / "n")
    same(got, import_edgelist(tmp_path / "e.parquet", tmp_path / "f", node_table=tmp_path / "n.parquet"))
    np.testing.assert_array_equal(got.node_ids, SPARSE)
    pq.write_table(pa.table({"src": ["a"], "dst": ["b"]}), tmp_path / "e" / "part-00002-9f3c.snappy.parquet")
    with pytest.raises(MomentError, match=r"part-00002-9f3c.snappy.parquet: its columns differ from those of the first"):
        import_edgelist(tmp_path / "e", tmp_path / "bad", node_table=tmp_path / "n")
    assert not (tmp_path / "bad").exists()


def test_a_hive_partitioned_table_is_refused_by_name(tmp_path: Path) -> None:
    """pandas' `partition_cols` / Spark's `partitionBy` write `key=value` sub-directories, whose rows carry the key in
    the directory's name: one error saying so (it was "is a directory, expected an edge list file")."""
    for k in range(2):
        (tmp_path / "e" / f"bucket={k}").mkdir(parents=True)
        pq.write_table(pa.table({"src": [k, 1], "dst": [2, k]}), tmp_path / "e" / f"bucket={k}" / "part-0.parquet")
    with pytest.raises(MomentError, match=r"e: a Hive-partitioned Parquet table \(bucket=0, bucket=1\), given as the "
                                          r"edge list file: one Parquet file or a directory of its parts is read.*"
                                          r"\n  hint: write it without partitions"):
        import_edgelist(tmp_path / "e", tmp_path / "out")
    assert not (tmp_path / "out").exists()
