"""Node features and labels as tables keyed by the graph's own ids (`--node-table`, `--label-table`), in
Elliptic's shape: `txs_features.csv` (id, then the features), `txs_classes.csv` (`txId,class`: "1", "2",
"unknown") and `txs_edgelist.csv` (`txId1,txId2`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.workload.graph import GraphWriter
from moment.workload.importers import import_edgelist
from moment.workload.node_tables import read_node_table

RNG = np.random.default_rng(11)
N, E, D = 400, 1500, 5
TX = RNG.choice(10**12, N, replace=False)  # node i of the table is TX[i]: the table's order, not sorted
X = RNG.standard_normal((N, D)).astype(np.float32)
CLASS = RNG.choice(["1", "2", "unknown"], N, p=[0.2, 0.3, 0.5])
PAIRS = RNG.integers(0, N, (E, 2))


def write_elliptic(d: Path, classes: np.ndarray = CLASS) -> None:
    d.mkdir(exist_ok=True)
    (d / "txs_features.csv").write_text("".join(",".join([str(TX[i]), *(repr(float(v)) for v in X[i])]) + "\n"
                                                for i in range(N)))
    order = RNG.permutation(N)  # the label table in an order of its own
    (d / "txs_classes.csv").write_text("txId,class\n" + "".join(f"{TX[i]},{classes[i]}\n" for i in order))
    (d / "txs_edgelist.csv").write_text("txId1,txId2\n" + "".join(f"{TX[a]},{TX[b]}\n" for a, b in PAIRS))


def test_tables_import_as_the_arrays_they_hold(tmp_path: Path) -> None:
    """The oracle: the same graph given as node ids, a features .npy and a labels .npy in the table's order."""
    write_elliptic(tmp_path)
    ds = import_edgelist(tmp_path / "txs_edgelist.csv", tmp_path / "t", node_table=tmp_path / "txs_features.csv",
                         label_table=tmp_path / "txs_classes.csv", unlabelled=("unknown",))
    np.savetxt(tmp_path / "ids.txt", TX, fmt="%d")
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.array([-1 if c == "unknown" else int(c) for c in CLASS]))
    want = import_edgelist(tmp_path / "txs_edgelist.csv", tmp_path / "a", node_ids=tmp_path / "ids.txt",
                           features=tmp_path / "x.npy", labels=tmp_path / "y.npy")
    ds.verify()
    for name in ("indptr", "indices", "labels", "node_ids", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(ds._load(name), want._load(name), err_msg=name)
    np.testing.assert_array_equal(ds.features_memmap(), X)
    src = ds.manifest.source
    assert src["labels_left_out"] == {"unknown": int(np.sum(CLASS == "unknown"))}
    assert src["label_table_header"] == "txId,class" and src["generated_features"] is False
    assert src["unlabelled_nodes"] == int(np.sum(CLASS == "unknown")) and ds.class_names is None


def test_class_names_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    names = np.where(CLASS == "1", "illicit", np.where(CLASS == "2", "licit", ""))  # "" : no label
    write_elliptic(tmp_path, names)
    ds = import_edgelist(tmp_path / "txs_edgelist.csv", tmp_path / "t", node_table=tmp_path / "txs_features.csv",
                         label_table=tmp_path / "txs_classes.csv")
    assert ds.class_names == ["illicit", "licit"] and ds.num_classes == 2
    want = np.select([names == "illicit", names == "licit"], [0, 1], -1)
    np.testing.assert_array_equal(ds.labels, want)
    assert ds.manifest.source["labels_left_out"] == {"": int(np.sum(names == ""))}


def test_a_label_table_of_node_numbers_needs_no_own_ids(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("0 1\n1 2\n2 3\n")
    (tmp_path / "y.csv").write_text("node,label\n3,cat\n0,dog\n1,cat\n")
    ds = import_edgelist(tmp_path / "e.txt", tmp_path / "o", label_table=tmp_path / "y.csv")
    assert ds.labels.tolist() == [1, 0, -1, 0] and ds.node_ids is None
    assert ds.manifest.source["class_names"] == ["cat", "dog"]


BOM = "\ufeff"  # what Excel's "CSV UTF-8" and PowerShell's Export-Csv write first


@pytest.mark.parametrize("shape", ["bom", "bom-header", "comment-before-header", "pandas-floats", "spaces",
                                   "pandas-columns"])
def test_tables_as_spreadsheets_and_pandas_write_them_import_as_the_clean_ones(tmp_path: Path, shape: str) -> None:
    """The same edges, node table and label table, written as tools do: with a byte-order mark (on a header, as
    "dst,src", or on the first row), a comment above the header, labels of an integer column with a gap as pandas' to_csv
    writes them (`10.0`, `2.0`: numbered as text, class 10 became 2), a space after each comma, a node table's
    header of pandas' unnamed columns (`user,0,1,2,3,4`: read as a node). The oracle is the clean files' import."""
    rows = [(int(t), x) for t, x in zip(TX[:40], X[:40])]
    classes = [i % 11 for i in range(40)]
    classes[5] = None  # the gap: pandas writes the column as floats
    edges = [(TX[a % 40], TX[b % 40]) for a, b in PAIRS[:120]]

    def files(d: Path, bom: str, head: str, label, sep: str) -> None:
        d.mkdir()
        (d / "e.csv").write_text(bom + head + "src,dst\n" + "".join(f"{a}{sep}{b}\n" for a, b in edges))
        (d / "n.csv").write_text(bom + head + "id,f0,f1,f2,f3,f4\n" + "".join(
            sep.join([str(t), *map(repr, map(float, x))]) + "\n" for t, x in rows))
        (d / "l.csv").write_text(bom + head + "id,class\n" + "".join(
            f"{t}{sep}{'' if c is None else label(c)}\n" for (t, _), c in zip(rows, classes)))

    files(tmp_path / "clean", "", "", str, ",")
    files(tmp_path / "messy", BOM if shape.startswith("bom") else "",
          "# exported by job 42\n\n" if shape == "comment-before-header" else "",
          (lambda c: f"{float(c)}") if shape == "pandas-floats" else str, ", " if shape == "spaces" else ",")
    if shape == "pandas-columns":  # a frame of unnamed features with the ids inserted first: `user,0,1,2,3,4`
        f = tmp_path / "messy" / "n.csv"
        f.write_text("user,0,1,2,3,4\n" + f.read_text().split("\n", 1)[1])
    if shape == "bom-header":  # the destination first: the header says so, behind the mark
        (tmp_path / "messy" / "e.csv").write_text(BOM + "dst,src\n" + "".join(f"{b},{a}\n" for a, b in edges))
    if shape == "bom":  # no header: the mark is on the first row's id
        for name in ("n.csv", "l.csv"):
            f = tmp_path / "messy" / name
            f.write_text(BOM + f.read_text().split("\n", 1)[1].lstrip(BOM))
    got, want = (import_edgelist(tmp_path / d / "e.csv", tmp_path / f"out-{d}", node_table=tmp_path / d / "n.csv",
                                 label_table=tmp_path / d / "l.csv") for d in ("messy", "clean"))
    for name in ("indptr", "indices", "labels", "node_ids", "train_idx"):
        np.testing.assert_array_equal(got._load(name), want._load(name), err_msg=name)
    np.testing.assert_array_equal(got.features_memmap(), want.features_memmap())
    assert got.class_names is None and got.labels.max() == 10


def test_pandas_index_column_is_named_with_how_to_leave_it_out(tmp_path: Path) -> None:
    """pandas' default `to_csv()` writes its index first under a header with no name there: read as the ids, it
    was nodes the graph does not have (a node table) or three fields where two are (a label table)."""
    write_elliptic(tmp_path)
    (tmp_path / "n.csv").write_text(",id,a,b\n" + "".join(f"{i},{TX[i]},0.5,1.5\n" for i in range(N)))
    (tmp_path / "y.csv").write_text(",txId,class\n" + "".join(f"{i},{TX[i]},1\n" for i in range(N)))
    for table, header in (({"node_table": tmp_path / "n.csv"}, ",id,a,b"),
                          ({"node_table": tmp_path / "txs_features.csv", "label_table": tmp_path / "y.csv"},
                           ",txId,class")):
        with pytest.raises(MomentError, match=rf"the first column of its header \('{header}'\) has no name: pandas' "
                                              r"index.*\n  hint: write the table with to_csv\(path, index=False\)"):
            import_edgelist(tmp_path / "txs_edgelist.csv", tmp_path / "o", **table)
        assert not (tmp_path / "o").exists()


def test_a_fractional_label_is_one_error_naming_its_node(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("0 1\n1 2\n")
    (tmp_path / "y.csv").write_text("0,1.0\n1,2.5\n")
    with pytest.raises(MomentError, match=r"y\.csv: node 1 has label 2\.5: a class is a whole number or a name"):
        import_edgelist(tmp_path / "e.txt", tmp_path / "o", label_table=tmp_path / "y.csv")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case, words", [
    ("mixed", r"txs_classes\.csv: labels mix class numbers and names \('unknown'\): a label is one or the other\n"
              r"  hint: if 'unknown' marks a node without a label, give --unlabelled unknown"),
    ("twice", r"txs_classes\.csv: node \d+ has two labels: one line a node"),
    ("stranger", r"txs_classes\.csv: label table names node 7, not among the 400 node ids of .*txs_features\.csv"),
    ("hole", r"txs_features\.csv: the features of node \d+ \(row 3\) are missing, NaN or infinite"),
    ("short", r"txs_features\.csv: the features of node \d+ \(row 3\) are missing, NaN or infinite"),
    ("long", r"txs_features\.csv: cannot parse the node table: Error tokenizing data"),
    ("no-id", r"txs_features\.csv: row 2 has no id"),
    ("both", r"--node-table: give one of --node-table and --features/--node-ids: both say the same"),
    ("three", r"txs_classes\.csv: a label table needs two fields a line \(id, label\), got 3"),
    ("unlabelled", r"--unlabelled: names labels that mean no label, which only a --label-table has"),
    ("edge", r"txs_edgelist\.csv: the edge list \(txs_edgelist\.csv\) names node 5, not among the 400 node ids"),
])
def test_tables_that_disagree_are_one_error_and_nothing_is_written(tmp_path: Path, case: str, words: str) -> None:
    write_elliptic(tmp_path)
    feats, labels = tmp_path / "txs_features.csv", tmp_path / "txs_classes.csv"
    rows = feats.read_text().splitlines(keepends=True)
    if case == "twice":
        labels.write_text(labels.read_text() + f"{TX[0]},1\n")
    elif case == "stranger":
        labels.write_text("txId,class\n7,1\n")
    elif case == "hole":
        feats.write_text("".join(rows[:2]) + rows[2].rsplit(",", 1)[0] + ",\n" + "".join(rows[3:]))
    elif case == "short":
        feats.write_text("".join(rows[:2]) + rows[2].rsplit(",", 2)[0] + "\n" + "".join(rows[3:]))
    elif case == "long":
        feats.write_text("".join(rows[:2]) + rows[2].rstrip("\n") + ",1.0\n" + "".join(rows[3:]))
    elif case == "no-id":
        feats.write_text(rows[0] + "," + rows[1].split(",", 1)[1] + "".join(rows[2:]))
    elif case == "three":
        labels.write_text("txId,class,time\n")
    elif case == "edge":
        (tmp_path / "txs_edgelist.csv").write_text(f"{TX[0]},{TX[1]}\n5,{TX[2]}\n")
    kw = {"unlabelled": ()} if case == "mixed" else {"unlabelled": ("unknown",)}
    if case == "both":
        np.save(tmp_path / "x.npy", X)
        kw["features"] = tmp_path / "x.npy"
    if case == "unlabelled":
        labels = None
    with pytest.raises(MomentError, match=words):
        import_edgelist(tmp_path / "txs_edgelist.csv", tmp_path / "out", node_table=feats, label_table=labels, **kw)
    assert not (tmp_path / "out").exists()


def test_the_cli_imports_elliptic_as_published(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_elliptic(tmp_path)
    code = main(["data", "import", "edgelist", str(tmp_path / "txs_edgelist.csv"), "--node-table",
                 str(tmp_path / "txs_features.csv"), "--label-table", str(tmp_path / "txs_classes.csv"),
                 "--unlabelled", "unknown", "--out", str(tmp_path / "ds"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert got["num_nodes"] == N and got["feature_dim"] == D
    assert got["source"]["node_ids"] == f"{N} integer ids in the order of {tmp_path / 'txs_features.csv'}"


ROWS5 = "100,1,2\n200,3,4\n300,5,6\n400,7,8\n500,9,10\n"  # the nodes of E5, with two features each
E5 = "100 200\n200 300\n300 400\n400 100\n500 100\n"


@pytest.mark.parametrize("table, words", [
    ("600,1,\n" + ROWS5, "the features of node 600 (row 1) are missing, NaN or infinite"),
    ("100,1,abc\n" + ROWS5.split("\n", 1)[1], "the features of node 100 (row 1) are not all numbers: 'abc'"),
    ("100,nan,2\n" + ROWS5.split("\n", 1)[1], "the features of node 100 (row 1) are missing, NaN or infinite"),
    (ROWS5.replace("300,5,6", "300,5,abc"), "the features of node 300 (row 3) are not all numbers: 'abc'"),
    (ROWS5.replace("300,5,6", "300,NaN,6"), "the features of node 300 (row 3) are missing, NaN or infinite"),
])
def test_a_row_with_a_bad_feature_is_one_error_naming_it_the_first_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, words: str) -> None:
    """A first row with an empty or non-numeric feature was taken for a header and dropped without a word (node
    600, which no edge names, vanished); on a later row, a word or `nan` got pandas' words, naming neither the
    row nor the node."""
    (tmp_path / "e.txt").write_text(E5)
    (tmp_path / "n.csv").write_text(table)
    code = main(["data", "import", "edgelist", str(tmp_path / "e.txt"), "--node-table", str(tmp_path / "n.csv"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"error: {tmp_path / 'n.csv'}: {words}", err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("first, header", [("dave,0,1", None), ("id,f0,f1", "id,f0,f1")])
def test_a_names_table_keeps_its_first_node_and_reports_a_header(tmp_path: Path, first: str, header: str | None) -> None:
    """`dave,0,1` above names is a node (pandas' unnamed columns are a header only above integer ids); a header
    that is skipped is reported, as the label table's is."""
    (tmp_path / "e.csv").write_text("alice,bob\nbob,carol\n")
    (tmp_path / "n.csv").write_text(first + "\nalice,1,1\nbob,2,2\ncarol,3,3\n")
    ds = import_edgelist(tmp_path / "e.csv", tmp_path / "o", node_table=tmp_path / "n.csv")
    want = ["alice", "bob", "carol"] if header else ["dave", "alice", "bob", "carol"]
    assert ds.node_ids.tolist() == want and ds.manifest.source.get("node_table_header") == header
    np.testing.assert_array_equal(ds.features_memmap()[-1], [3, 3])


@pytest.mark.parametrize("table", ["node", "label"])
def test_a_table_that_is_only_its_header_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 table: str) -> None:
    """A header and no row got pandas' words: "cannot parse the node table: No columns to parse from file"."""
    (tmp_path / "e.txt").write_text(E5)
    (tmp_path / "t.csv").write_text(f"id,{'f' if table == 'node' else 'label'}\n")
    args = ["--node-table", str(tmp_path / "t.csv")] if table == "node" else [
        "--renumber", "--feature-dim", "1", "--label-table", str(tmp_path / "t.csv")]
    code = main(["data", "import", "edgelist", str(tmp_path / "e.txt"), *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    head = "id,f" if table == "node" else "id,label"
    assert code == 2 and err.strip() == f"error: {tmp_path / 't.csv'}: the {table} table lists no node (only its " \
                                       f"header, {head!r})", err


def test_a_table_of_one_row_of_a_name_is_a_node(tmp_path: Path) -> None:
    """No other ids tell a header by: `alice,1,2` alone is the node alice, not a header over no rows."""
    (tmp_path / "n.csv").write_text("alice,1,2\n")
    with GraphWriter(tmp_path / "o") as w:
        ids, header = read_node_table(tmp_path / "n.csv", w)
        assert ids.original.tolist() == ["alice"] and header is None
    assert not (tmp_path / "o").exists()  # nothing finished: the writer leaves nothing
