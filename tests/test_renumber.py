"""An edge list in the graph's own ids (sparse integers, names): `--renumber` and `--node-ids`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.workload.graph import GraphDataset
from moment.workload.importers import import_edgelist

RNG = np.random.default_rng(7)
N, E = 300, 2000
#: the graph's own ids: sparse, beyond what a dense graph could hold, some negative
OWN = np.sort(RNG.choice(2 * 10**12, N, replace=False).astype(np.int64) - 10**12)
DENSE = RNG.integers(0, N, (E, 2))
DENSE[:, 0] %= N - 1  # the last node is only ever a destination
DENSE[0, 1] = N - 1
FEAT = RNG.standard_normal((N, 4)).astype(np.float32)
LABELS = RNG.integers(0, 3, N)


def _write(path: Path, pairs: np.ndarray, sep: str = " ", head: str = "") -> Path:
    path.write_text(head + "".join(f"{s}{sep}{d}\n" for s, d in pairs))
    return path


def _same_graph(a: GraphDataset, b: GraphDataset) -> None:
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.features_memmap(), b.features_memmap())
    np.testing.assert_array_equal(a.labels, b.labels)


def test_sparse_integer_ids_import_as_the_dense_graph_they_name(tmp_path: Path) -> None:
    """The oracle: the same edges written in node numbers 0..N-1 (the sorted own ids' positions) and imported
    without renumbering. Rows of the features and labels follow the sorted ids, and the split names own ids."""
    np.save(tmp_path / "x.npy", FEAT)
    np.save(tmp_path / "y.npy", LABELS)
    sp, dense_sp = tmp_path / "sp", tmp_path / "dense_sp"
    sp.mkdir(), dense_sp.mkdir()
    for name, nodes in (("train", np.arange(0, 60)), ("valid", np.arange(100, 130)), ("test", np.arange(200, 240))):
        (sp / f"{name}.txt").write_text("".join(f"{OWN[i]}\n" for i in nodes[::-1]))
        np.save(dense_sp / f"{name}.npy", nodes[::-1])
    ds = import_edgelist(_write(tmp_path / "own.txt", OWN[DENSE]), tmp_path / "own", renumber=True,
                         features=tmp_path / "x.npy", labels=tmp_path / "y.npy", splits_dir=sp)
    want = import_edgelist(_write(tmp_path / "dense.txt", DENSE), tmp_path / "dense", num_nodes=N,
                           features=tmp_path / "x.npy", labels=tmp_path / "y.npy", splits_dir=dense_sp)
    ds.verify()
    _same_graph(ds, want)
    for s in ("train", "val", "test"):
        np.testing.assert_array_equal(ds.split(s), want.split(s))
    np.testing.assert_array_equal(ds.node_ids, OWN)
    assert want.node_ids is None
    assert ds.manifest.source["node_ids"] == f"{N} distinct integer ids of {tmp_path / 'own.txt'}, in sorted order"
    np.testing.assert_array_equal(ds.nodes_of(OWN[[5, 0, 299]]), [5, 0, 299])
    with pytest.raises(MomentError, match=r"nodes_of names node 12345, not among the 300 node ids of .*node_ids\.npy"):
        ds.nodes_of([OWN[3], 12345])
    np.testing.assert_array_equal(want.nodes_of(np.array([3, 1])), [3, 1])
    with pytest.raises(MomentError, match=r"node id 300 out of range \[0, 300\)"):
        want.nodes_of([300])


def test_names_are_numbered_in_sorted_order_and_a_line_of_names_is_an_edge(tmp_path: Path) -> None:
    names = np.array([f"user{i:03d}" for i in range(N)])
    pairs = names[DENSE]
    ds = import_edgelist(_write(tmp_path / "e.csv", pairs, ","), tmp_path / "a", renumber=True, num_nodes=N)
    want = import_edgelist(_write(tmp_path / "d.csv", DENSE, ","), tmp_path / "d", num_nodes=N)
    np.testing.assert_array_equal(ds.indptr, want.indptr)
    np.testing.assert_array_equal(ds.indices, want.indices)
    assert list(ds.node_ids) == sorted(names) and ds.node_ids.dtype.kind == "U"
    # the first line names two nodes, not the columns: it is an edge, and no header is reported
    assert "header" not in ds.manifest.source and ds.manifest.source["input_edges"] == E
    # a header that names the columns is one, and dst,src still swaps them
    h = import_edgelist(_write(tmp_path / "h.csv", pairs[:, ::-1], ",", "dst,src\n"), tmp_path / "h", renumber=True)
    assert h.manifest.source["header"] == "dst,src" and h.manifest.source["columns_swapped"]
    np.testing.assert_array_equal(h.indices, want.indices)
    # names that are numbers among others are text: "10" sorts before "9"
    mixed = import_edgelist(_write(tmp_path / "m.txt", np.array([["9", "10"], ["10", "x"]])), tmp_path / "m",
                            renumber=True)
    assert list(mixed.node_ids) == ["10", "9", "x"]
    # a line of one name is refused, not read as an edge to a node named ""
    for i, text in enumerate(("a,b\nc,\nd,a\n", "a b\nc\n", "dst,src\n,b\n")):
        (tmp_path / f"hole{i}.txt").write_text(text)
        with pytest.raises(MomentError, match=r"hole\d\.txt: edge \d \('\w?', '\w?'\) lacks an id: each line needs two"):
            import_edgelist(tmp_path / f"hole{i}.txt", tmp_path / "out", renumber=True)
    assert not (tmp_path / "out").exists()
    assert GraphDataset.open(tmp_path / "m", verify=True).nodes_of(["x", "9"]).tolist() == [2, 1]


def test_a_hash_inside_a_name_is_part_of_it_and_a_line_beginning_with_one_is_a_comment(tmp_path: Path) -> None:
    """Tags as names (`c#`, `f#`): pandas' comment option cut them at the #, merging `c#` into `c`. Whole-line
    comments, indented ones and one before the header, are still skipped, also in a label table of class names
    holding a #, and a bad line is still named by its line in the file."""
    (tmp_path / "e.csv").write_text("# tags, from a dump\n  # indented\nsrc,dst\nalice,c#\nbob,c\n# between\n"
                                    "carol,c++\ndave,f#\nc#,f#\n")
    (tmp_path / "y.csv").write_text("# classes\nid,class\nc#,C#\nf#,F#\nc,C#\n")
    ds = import_edgelist(tmp_path / "e.csv", tmp_path / "a", renumber=True, label_table=tmp_path / "y.csv")
    assert list(ds.node_ids) == ["alice", "bob", "c", "c#", "c++", "carol", "dave", "f#"]
    assert ds.manifest.source["input_edges"] == 5 and ds.class_names == ["C#", "F#"]
    assert ds.labels[ds.nodes_of(["c#", "f#", "c", "alice"])].tolist() == [0, 1, 0, -1]
    (tmp_path / "bad.txt").write_text("a b\n# x\n\nc d e\n")
    with pytest.raises(MomentError, match=r"bad\.txt: cannot parse edge list: .*Expected 2 fields in line 4, saw 3"):
        import_edgelist(tmp_path / "bad.txt", tmp_path / "out", renumber=True)


def test_white_space_around_a_name_is_no_part_of_it_in_the_edge_list_and_the_tables(tmp_path: Path) -> None:
    """`alice ` (a space after the name) was a node of its own beside `alice`, each with half of her edges, while
    the label table stripped the same space from a label: white space around a field is stripped on both
    sides, in the edge list, the node table and the label table alike."""
    (tmp_path / "e.csv").write_text("alice,bob\nbob,alice \ncarol , alice\n")
    (tmp_path / "n.csv").write_text("id,f\nalice ,1\n bob,2\ncarol,3\n")
    (tmp_path / "y.csv").write_text("id,label\nalice ,cat \n bob,dog\ncarol,cat\n")
    (tmp_path / "sp").mkdir()
    for part, name in (("train", "alice"), ("val", "bob"), ("test", "carol")):
        (tmp_path / "sp" / f"{part}.txt").write_text(f"{name}\n")
    for kw in ({"renumber": True, "feature_dim": 1}, {"node_table": tmp_path / "n.csv"}):
        ds = import_edgelist(tmp_path / "e.csv", tmp_path / "o", label_table=tmp_path / "y.csv", overwrite=True,
                             splits_dir=tmp_path / "sp", **kw)
        assert ds.node_ids.tolist() == ["alice", "bob", "carol"] and ds.num_edges == 3
        assert ds.labels.tolist() == [0, 1, 0] and ds.class_names == ["cat", "dog"]
        # edges u -> v land in row v: bob <- alice, alice <- bob, alice <- carol
        assert [ds.indices[ds.indptr[v]:ds.indptr[v + 1]].tolist() for v in range(3)] == [[1, 2], [0], []]


def test_a_split_of_a_graph_of_names_names_nodes_as_written(tmp_path: Path) -> None:
    """`007` and `7` are two names: a split file listing `007` trains on `007` (it was read as the integer 7)."""
    (tmp_path / "e.csv").write_text("src,dst\n007,abc\n7,abc\nabc,007\nx,7\n")
    (tmp_path / "sp").mkdir()
    for part, name in (("train", "007"), ("val", "abc"), ("test", "x")):
        (tmp_path / "sp" / f"{part}.txt").write_text(f"{name}\n")
    ds = import_edgelist(tmp_path / "e.csv", tmp_path / "a", renumber=True, splits_dir=tmp_path / "sp")
    assert ds.node_ids[ds.train_idx].tolist() == ["007"] and ds.node_ids[ds.test_idx].tolist() == ["x"]


def test_node_ids_give_the_order_and_the_nodes_no_edge_names(tmp_path: Path) -> None:
    order = ["zed", "carol", "alice", "bob", "dave"]  # zed has no edge
    (tmp_path / "ids.txt").write_text("# my nodes\n" + "\n".join(order) + "\n")
    e = _write(tmp_path / "e.txt", np.array([["alice", "bob"], ["bob", "carol"], ["dave", "alice"]]))
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    np.save(tmp_path / "x.npy", x)
    sp = tmp_path / "sp"
    sp.mkdir()
    (sp / "train.txt").write_text("alice\nzed\n")
    np.save(sp / "val.npy", np.array([False, True, False, False, False]))  # a mask: in node order
    np.save(sp / "test.npy", np.array(["dave"]))
    ds = import_edgelist(e, tmp_path / "o", node_ids=tmp_path / "ids.txt", features=tmp_path / "x.npy",
                         splits_dir=sp)
    assert list(ds.node_ids) == order and ds.num_nodes == 5
    np.testing.assert_array_equal(ds.features_memmap(), x)
    # edges u -> v land in row v: bob <- alice, carol <- bob, alice <- dave; zed (0) has none
    assert [ds.indices[ds.indptr[v]:ds.indptr[v + 1]].tolist() for v in range(5)] == [[], [3], [4], [2], []]
    assert ds.train_idx.tolist() == [2, 0] and ds.val_idx.tolist() == [1] and ds.test_idx.tolist() == [4]
    assert ds.manifest.source["node_ids"] == f"5 names in the order of {tmp_path / 'ids.txt'}"
    # integer ids in a .npy, in the order given
    np.save(tmp_path / "ids.npy", np.array([40, 10, 30]))
    g = import_edgelist(_write(tmp_path / "g.txt", np.array([[10, 30], [40, 10]])), tmp_path / "g",
                        node_ids=tmp_path / "ids.npy")
    assert g.node_ids.tolist() == [40, 10, 30] and g.indices.tolist() == [0, 1]


@pytest.mark.parametrize("case, words", [
    ("unknown", r"e\.txt: the edge list \(e\.txt\) names nodes mallory, trudy, not among the 3 node ids of "),
    ("duplicate", r"ids\.txt: node id bob is listed twice: each node once"),
    ("integers", r"e\.txt: the edge list \(e\.txt\) names node 'alice', but the node ids of .*ids\.txt are integers"),
    ("split", r"test\.txt: test split names node eve, not among the 3 node ids of "),
    ("rows", r"x\.npy: wrong row count: 2 features rows for 3 nodes \(3 names in the order of "),
    ("count", r"--num-nodes: gives 4 nodes, but the ids number 3 \(3 names in the order of "),
    ("empty", r"ids\.txt: no node ids: the file lists no node"),
    ("columns", r"ids\.txt: node ids file: expected one node id a line, got 'alice bob'"),
])
def test_ids_that_do_not_match_are_one_error_and_nothing_is_written(tmp_path: Path, case: str, words: str) -> None:
    ids = {"duplicate": "alice\nbob\nbob\n", "integers": "1\n2\n3\n", "empty": "# none\n",
           "columns": "alice bob\ncarol\n"}.get(case, "alice\nbob\ncarol\n")
    (tmp_path / "ids.txt").write_text(ids)
    edges = "alice bob\nmallory trudy\ntrudy bob\n" if case == "unknown" else "alice bob\nbob carol\n"
    (tmp_path / "e.txt").write_text(edges)
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    sp = tmp_path / "sp"
    sp.mkdir()
    for name, text in (("train", "alice\n"), ("val", "bob\n"), ("test", "eve\n")):
        (sp / f"{name}.txt").write_text(text)
    kw = {"rows": {"features": tmp_path / "x.npy"}, "split": {"splits_dir": sp}, "count": {"num_nodes": 4}}.get(case, {})
    with pytest.raises(MomentError, match=words):
        import_edgelist(tmp_path / "e.txt", tmp_path / "out", node_ids=tmp_path / "ids.txt", **kw)
    assert not (tmp_path / "out").exists()


def test_the_cli_renumbers_and_a_huge_id_points_to_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    e = _write(tmp_path / "e.txt", np.array([[5, 10**15], [10**15, 12]]))
    code = main(["data", "import", "edgelist", str(e), "--out", str(tmp_path / "a")])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    assert "the largest node id is 1,000,000,000,000,000" in err and "--renumber numbers them 0..N-1" in err
    code = main(["data", "import", "edgelist", str(e), "--out", str(tmp_path / "a"), "--renumber", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = json.loads(out)
    assert got["num_nodes"] == 3 and got["source"]["node_ids"].startswith("3 distinct integer ids of ")
    assert GraphDataset.open(tmp_path / "a").node_ids.tolist() == [5, 12, 10**15]
    code = main(["data", "info", str(tmp_path / "a"), "--verify"])
    out, err = capsys.readouterr()
    assert code == 0 and "source.node_ids" in out, err


@pytest.mark.parametrize("case", ["split", "label-table", "uint64-split"])
def test_an_id_beyond_int64_is_a_node_the_graph_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      case: str) -> None:
    """On a graph of integer ids, an id beyond int64 in a split or label table was a StopIteration traceback,
    and a uint64 one in a split .npy wrapped to the node of id -1: each is named as any id the graph lacks."""
    e = _write(tmp_path / "e.txt", np.array([[100, 200], [200, -1], [300, 100]]))
    sp = tmp_path / "sp"
    sp.mkdir()
    (sp / "valid.txt").write_text("200\n")
    (sp / "test.txt").write_text("300\n")
    big = "99999999999999999999" if case != "uint64-split" else str(2**64 - 1)
    if case == "uint64-split":
        np.save(sp / "train.npy", np.array([100, 2**64 - 1], np.uint64))
        bad = sp / "train.npy"
    else:
        (sp / "train.txt").write_text(f"100\n{big}\n" if case == "split" else "100\n")
        bad = sp / "train.txt"
    args = ["data", "import", "edgelist", str(e), "--renumber", "--feature-dim", "1", "--out", str(tmp_path / "o")]
    if case == "label-table":
        bad = tmp_path / "y.csv"
        bad.write_text(f"100,1\n{big},0\n")
        args += ["--label-table", str(bad)]
    code = main([*args, "--splits", str(sp)])
    err = capsys.readouterr().err
    what = "label table" if case == "label-table" else "train split"
    assert code == 2 and err.strip() == f"error: {bad}: {what} names node {big}, not among the 4 node ids of {e}", err


@pytest.mark.parametrize("train, val, words", [
    ("100\n200\n", "200\n", "valid.txt: node id 200 is in both the train split ({sp}/train.txt) and the val split"),
    ("100\n200\n200\n", "300\n", "train.txt: node id 200 is listed more than once in the train split (1 repeats)"),
    ("100\n", "200\n", "valid.txt: split contains unlabelled nodes (1, node id 200 the first)"),
])
def test_a_split_of_own_ids_names_a_node_by_its_id(tmp_path: Path, capsys: pytest.CaptureFixture[str], train: str,
                                                   val: str, words: str) -> None:
    """Under --renumber a node in two splits was named by its node number (1), which no file of the user holds."""
    e = _write(tmp_path / "e.txt", np.array([[100, 200], [200, 300], [300, 100], [500, 100]]))
    (tmp_path / "y.csv").write_text("100,1\n300,0\n500,1\n")
    sp = tmp_path / "sp"
    sp.mkdir()
    for part, text in (("train", train), ("valid", val), ("test", "500\n")):
        (sp / f"{part}.txt").write_text(text)
    code = main(["data", "import", "edgelist", str(e), "--renumber", "--feature-dim", "1", "--out", str(tmp_path / "o"),
                 "--splits", str(sp), *(["--label-table", str(tmp_path / "y.csv")] if "unlabelled" in words else [])])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().startswith(f"error: {sp}/" + words.format(sp=sp)), err


def test_nodes_of_an_id_beyond_int64_names_it(tmp_path: Path) -> None:
    ds = import_edgelist(_write(tmp_path / "e.txt", np.array([[2**63 - 1, 5], [5, -(2**63)], [-1, 5]])),
                         tmp_path / "o", renumber=True)
    for ids, shown in (([2**70], str(2**70)), (np.array([2**64 - 1], np.uint64), str(2**64 - 1))):
        with pytest.raises(MomentError, match=rf"nodes_of names node {shown}, not among the 4 node ids of "):
            ds.nodes_of(ids)
    assert ds.nodes_of([-1, 2**63 - 1]).tolist() == [1, 3]


def test_own_ids_of_another_shape_are_refused_when_the_dataset_opens(tmp_path: Path) -> None:
    ds = import_edgelist(_write(tmp_path / "e.txt", np.array([[7, 9], [9, 8]])), tmp_path / "o", renumber=True)
    f = ds.file("node_ids")
    np.save(f, np.zeros(3, np.float64))  # the same size, another dtype
    with pytest.raises(MomentError, match=r"node_ids\.npy: expected the 3 nodes' own ids \(integers or names\), "
                                          r"got float64 \[3\]"):
        GraphDataset.open(tmp_path / "o")


def test_ids_written_other_than_as_plain_integers_are_kept_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`--renumber` read `0012345` as the integer 12345 (node_ids gave it back without its zeros) and made `007`
    and `7` one node, turning the edge between them into a self-loop, without a word: a file with an id written
    other than in an integer's plain digits is read as names, each kept as written, and the report says so."""
    (tmp_path / "pad.csv").write_text("src,dst\n0012345,0067890\n0067890,0000042\n0000042,0012345\n")
    ds = import_edgelist(tmp_path / "pad.csv", tmp_path / "pad", renumber=True, feature_dim=1)
    assert ds.node_ids.tolist() == ["0000042", "0012345", "0067890"]
    assert ds.manifest.source["ids_as_written"] == "0012345" and ds.manifest.source["header"] == "src,dst"
    monkeypatch.setattr("moment.workload.renumber._SCAN_BLOCK", 5)  # an id across the scan's blocks, and its lines
    for i, (text, first) in enumerate((("7 1\n1 12\n007 7\n", "007"), ("1 2\n2 +3\n3 1\n", "+3"),
                                       ("1 -0\n0 1\n-0 0\n", "-0"), ("1e3 1000\n1000 5\n5 1e3\n", "1e3"),
                                       ("\ufeff07 1\n1 7\n7 07\n", "07"))):
        (tmp_path / f"z{i}.txt").write_text(text)
        ds = import_edgelist(tmp_path / f"z{i}.txt", tmp_path / f"z{i}", renumber=True, feature_dim=1,
                             fractions=(0.3, 0.3, 0.3))
        assert ds.manifest.source["ids_as_written"] == first and ds.node_ids.dtype.kind == "U"
        assert ds.manifest.source["self_loops_found"] == 0 and ds.num_edges == 3  # `007 7` is no self-loop
    assert GraphDataset.open(tmp_path / "z0").nodes_of(["007", "7"]).tolist() == [0, 3]
    # plain integers stay integers: a point or exponent in a weight column, a zero alone, a comment are no ids
    for i, (text, fields) in enumerate((("src,dst,w\n10,0,0.5\n0,-3,1e3\n-3,10,+1\n", [-3, 0, 10]),
                                        ("# 007 and 1.5e3 said here\n10 0\n0 -3 # 007\n-3 10\n", [-3, 0, 10]))):
        (tmp_path / f"p{i}.txt").write_text(text)
        ds = import_edgelist(tmp_path / f"p{i}.txt", tmp_path / f"p{i}", renumber=True, feature_dim=1,
                             fractions=(0.3, 0.3, 0.3))
        assert ds.node_ids.tolist() == fields and "ids_as_written" not in ds.manifest.source
    # a --node-ids file and a node table give names by the same rule, matched as written
    (tmp_path / "ids.txt").write_text("007\n7\n12\n")
    (tmp_path / "e.txt").write_text("7 007\n007 12\n12 7\n")
    ds = import_edgelist(tmp_path / "e.txt", tmp_path / "n", node_ids=tmp_path / "ids.txt", feature_dim=1,
                         fractions=(0.3, 0.3, 0.3))
    assert ds.node_ids.tolist() == ["007", "7", "12"] and sorted(ds.indices.tolist()) == [0, 1, 2]
    (tmp_path / "nt.csv").write_text("007,1.5\n7,2.5\n12,3.5\n")
    ds = import_edgelist(tmp_path / "e.txt", tmp_path / "t", node_table=tmp_path / "nt.csv", fractions=(0.3, 0.3, 0.3))
    assert ds.node_ids.tolist() == ["007", "7", "12"] and ds.features_memmap()[:, 0].tolist() == [1.5, 2.5, 3.5]
    code = main(["data", "import", "edgelist", str(tmp_path / "pad.csv"), "--renumber", "--feature-dim", "1",
                 "--out", str(tmp_path / "cli")])
    out, err = capsys.readouterr()
    assert code == 0 and ("note: the ids are kept as written: '0012345' is the integer 12345 written another way, so "
                          "'0012345' and '12345' would be two nodes, and node_ids are text") in out, err


@pytest.mark.parametrize("header", [None, True, False])
def test_a_first_line_of_names_no_other_line_names_is_a_header_or_an_edge_as_the_user_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], header: bool | None) -> None:
    """A header whose column names Moment does not know (`user_a,user_b`) was an edge between two phantom nodes,
    without a word. It may as well be an edge between two nodes of their own, so without --header or --no-header
    it is refused, naming the file, the line and how to say which; a first edge one of whose names another line
    names is an edge, as before."""
    (tmp_path / "e.csv").write_text("# exported\nuser_a,user_b\nalice,bob\nbob,carol\ncarol,alice\n")
    flag = {None: [], True: ["--header"], False: ["--no-header"]}[header]
    code = main(["data", "import", "edgelist", str(tmp_path / "e.csv"), "--renumber", "--feature-dim", "1",
                 "--random-split", "0.3,0.3,0.3", "--out", str(tmp_path / "o"), *flag])
    err = capsys.readouterr().err
    if header is None:
        assert code == 2 and err.strip() == (
            f"error: {tmp_path / 'e.csv'}: line 2 (user_a,user_b) names nodes that no other line names: it may be a "
            "header or an edge of its own\n  hint: --header skips it (or name its columns src,dst), --no-header "
            "reads it as an edge"), err
        assert not (tmp_path / "o").exists()
        return
    assert code == 0, err
    ds = GraphDataset.open(tmp_path / "o")
    if header:
        assert ds.node_ids.tolist() == ["alice", "bob", "carol"] and ds.manifest.source["header"] == "user_a,user_b"
    else:
        assert ds.node_ids.tolist()[3:] == ["user_a", "user_b"] and "header" not in ds.manifest.source


def test_which_first_line_of_an_edge_list_is_a_header(tmp_path: Path) -> None:
    """The cases the rule tells without the user: a first edge one of whose names recurs (a leaf of a hub) is an
    edge; a line of names over ids such as `007` or plain integers is a header; over --node-ids of names, a line
    naming no node is one; a lone line of names is refused as ambiguous; `header=True` skips a `0,1`."""
    def imported(name: str, text: str, **kw: object) -> GraphDataset:
        (tmp_path / name).write_text(text)
        return import_edgelist(tmp_path / name, tmp_path / name.replace(".", "_"), feature_dim=1,
                               fractions=(0.3, 0.3, 0.3), **kw)

    ds = imported("leaf.csv", "hub,leaf1\nhub,leaf2\nleaf2,leaf3\n", renumber=True)
    assert ds.node_ids.tolist() == ["hub", "leaf1", "leaf2", "leaf3"] and ds.num_edges == 3
    ds = imported("pad.csv", "user_a,user_b\n007,7\n7,8\n", renumber=True)
    assert ds.node_ids.tolist() == ["007", "7", "8"] and ds.manifest.source["header"] == "user_a,user_b"
    ds = imported("int.csv", "user_a,user_b\n100,7\n7,8\n", renumber=True)
    assert ds.node_ids.tolist() == [7, 8, 100] and ds.manifest.source["header"] == "user_a,user_b"
    (tmp_path / "ids.txt").write_text("alice\nbob\ncarol\n")
    ds = imported("named.csv", "user_a,user_b\nalice,bob\nbob,carol\n", node_ids=tmp_path / "ids.txt")
    assert ds.manifest.source["header"] == "user_a,user_b" and ds.num_edges == 2
    with pytest.raises(MomentError, match=r"lone\.csv: line 1 \(alice,bob\) names nodes that no other line names"):
        imported("lone.csv", "alice,bob\n", renumber=True)
    ds = imported("zero.csv", "0,1\n1,2\n2,0\n", header=True)
    assert ds.num_edges == 2 and ds.manifest.source["header"] == "0,1"
