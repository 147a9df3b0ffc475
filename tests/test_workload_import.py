"""Importers (OGB CSV/NPZ, IGB, edge list) on small files written here; errors name the file."""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.workload.graph import GraphDataset
from moment.workload.import_ogb import import_ogb
from moment.workload.importers import EdgePolicy, import_edgelist, import_igb
from moment.workload.synth import split_sizes

N, D = 40, 5
RNG = np.random.default_rng(7)
EDGES = np.unique(RNG.integers(0, N, size=(150, 2)), axis=0)  # (src, dst), no duplicates
FEAT = RNG.standard_normal((N, D)).astype(np.float32)
LABELS = RNG.integers(0, 4, N)


def rows_of(ds: GraphDataset) -> dict[int, list[int]]:
    ip, ix = np.asarray(ds.indptr), np.asarray(ds.indices)
    return {v: sorted(ix[ip[v] : ip[v + 1]].tolist()) for v in range(ds.num_nodes)}


def expected_rows(edges: np.ndarray, undirected: bool = False) -> dict[int, list[int]]:
    pairs = {(int(s), int(d)) for s, d in edges}
    if undirected:
        pairs |= {(d, s) for s, d in pairs}
    return {v: sorted(s for s, d in pairs if d == v) for v in range(N)}


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def write_ogb_csv(root: Path, labels: np.ndarray = LABELS) -> Path:
    raw = root / "raw"
    _gz(raw / "edge.csv.gz", [f"{s},{d}" for s, d in EDGES])
    _gz(raw / "node-feat.csv.gz", [",".join(f"{v:.9g}" for v in row) for row in FEAT])
    lab = ["nan" if i == 3 else str(int(v)) for i, v in enumerate(labels)]
    _gz(raw / "node-label.csv.gz", lab)
    _gz(raw / "num-node-list.csv.gz", [str(N)])
    sp = root / "split" / "time"
    _gz(sp / "train.csv.gz", [str(i) for i in range(20) if i != 3])
    _gz(sp / "valid.csv.gz", [str(i) for i in range(20, 30)])
    _gz(sp / "test.csv.gz", [str(i) for i in range(30, 40)])
    return root


def test_ogb_csv(tmp_path: Path) -> None:
    src = write_ogb_csv(tmp_path / "ogbn_x")
    ds = import_ogb(src, tmp_path / "out")
    ds.verify()
    assert rows_of(ds) == expected_rows(EDGES)
    np.testing.assert_allclose(ds.features_memmap(), FEAT, rtol=1e-6)
    lab = np.asarray(ds.labels)
    assert lab[3] == -1 and lab[0] == LABELS[0]
    assert ds.num_classes == LABELS.max() + 1 and len(ds.train_idx) == 19
    assert ds.manifest.source["importer"] == "ogb-csv"
    und = import_ogb(src, tmp_path / "und", undirected=True)
    assert rows_of(und) == expected_rows(EDGES, undirected=True)


def test_ogb_csv_with_a_0_1_column_a_task_is_multi_label(tmp_path: Path) -> None:
    """ogbn-proteins' node-label.csv.gz: 112 binary tasks a node; here 3."""
    src = write_ogb_csv(tmp_path / "proteins")
    targets = (RNG.random((N, 3)) < 0.4).astype(int)
    _gz(src / "raw" / "node-label.csv.gz", [",".join(map(str, row)) for row in targets])
    _gz(src / "split" / "time" / "train.csv.gz", [str(i) for i in range(20)])
    ds = import_ogb(src, tmp_path / "out")
    ds.verify()
    assert ds.multilabel and ds.num_classes == 3 and len(ds.train_idx) == 20
    np.testing.assert_array_equal(ds.labels, targets)


def test_ogb_npz(tmp_path: Path) -> None:
    root = tmp_path / "papers"
    (root / "raw").mkdir(parents=True)
    np.savez(root / "raw" / "data.npz", edge_index=EDGES.T.copy(), node_feat=FEAT, num_nodes_list=[N])
    np.savez(root / "raw" / "node-label.npz", node_label=LABELS.astype(np.float32)[:, None])
    sp = root / "split" / "time"
    _gz(sp / "train.csv.gz", ["0", "1", "2"])
    _gz(sp / "valid.csv.gz", ["3"])
    _gz(sp / "test.csv.gz", ["4"])
    ds = import_ogb(root, tmp_path / "out")
    ds.verify()
    assert rows_of(ds) == expected_rows(EDGES)
    np.testing.assert_array_equal(ds.labels, LABELS)


def test_ogb_errors(tmp_path: Path) -> None:
    src = write_ogb_csv(tmp_path / "o")
    (src / "raw" / "node-feat.csv.gz").unlink()
    with pytest.raises(MomentError, match="missing node features") as e:
        import_ogb(src, tmp_path / "out")
    assert "node-feat.csv.gz" in str(e.value)
    _gz(src / "raw" / "node-feat.csv.gz", [",".join(["1"] * D)] * (N - 1))
    with pytest.raises(MomentError, match="wrong row count") as e:
        import_ogb(src, tmp_path / "out")
    assert "node-feat.csv.gz" in str(e.value)
    rows = [",".join(["1"] * D)] * N
    # a short row (the parser pads it with NaN) and an empty field were "features contain NaN or infinity"
    for row, words in ((",".join(["1"] * (D - 1)), f"row 5 has {D - 1} fields, the first row {D}"),
                       (",".join(["1"] * (D - 1)) + ",", f"row 5 has an empty field \\(feature {D - 1}\\)")):
        _gz(src / "raw" / "node-feat.csv.gz", [*rows[:5], row, *rows[6:]])
        with pytest.raises(MomentError, match=rf"node-feat\.csv\.gz: {words}"):
            import_ogb(src, tmp_path / "out")
    _gz(src / "raw" / "node-feat.csv.gz", rows)
    _gz(src / "raw" / "edge.csv.gz", ["0,1", f"2,{N}"])
    with pytest.raises(MomentError, match=f"node id {N} out of range") as e:
        import_ogb(src, tmp_path / "out")
    assert "edge.csv.gz" in str(e.value)
    _gz(src / "raw" / "edge.csv.gz", ["0,1,2"])
    with pytest.raises(MomentError, match="two columns"):
        import_ogb(src, tmp_path / "out")
    _gz(src / "raw" / "edge.csv.gz", ["0,1"])
    _gz(src / "split" / "other" / "train.csv.gz", ["0"])
    with pytest.raises(MomentError, match="several split schemes"):
        import_ogb(src, tmp_path / "out")
    _gz(src / "split" / "time" / "valid.csv.gz", ["3"])  # node 3 has no label
    with pytest.raises(MomentError, match="unlabelled") as e:
        import_ogb(src, tmp_path / "out", split_name="time")
    assert "valid.csv.gz" in str(e.value)
    _gz(src / "raw" / "num-node-list.csv.gz", ["41"])
    with pytest.raises(MomentError, match="says 41 nodes"):
        import_ogb(src, tmp_path / "out", split_name="time")
    with pytest.raises(MomentError, match="not found"):
        import_ogb(tmp_path / "nothing", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["o"]  # no temp directories left behind


def test_an_empty_ogb_file_says_it_is_empty(tmp_path: Path) -> None:
    """An empty split file (or one of comments) got pandas' words: "cannot parse: No columns to parse from file"."""
    src = write_ogb_csv(tmp_path / "o")
    _gz(src / "split" / "time" / "test.csv.gz", ["# none"])
    with pytest.raises(MomentError, match=r"test\.csv\.gz: the file is empty: no rows \(or only comments\)$"):
        import_ogb(src, tmp_path / "out")


def write_igb(root: Path) -> Path:
    p = root / "processed" / "paper"
    p.mkdir(parents=True)
    np.save(p / "node_feat.npy", FEAT)
    np.save(p / "node_label_19.npy", LABELS.astype(np.float32))
    np.save(p / "node_label_2K.npy", (LABELS * 100).astype(np.float32))
    c = root / "processed" / "paper__cites__paper"
    c.mkdir(parents=True)
    np.save(c / "edge_index.npy", EDGES)
    return root


def test_igb(tmp_path: Path) -> None:
    src = write_igb(tmp_path / "small")
    ds = import_igb(src, tmp_path / "out")
    ds.verify()
    assert rows_of(ds) == expected_rows(EDGES, undirected=True)
    assert ds.num_classes == 19
    assert (len(ds.train_idx), len(ds.val_idx), len(ds.test_idx)) == (24, 8, 8)
    np.testing.assert_array_equal(ds.train_idx, np.arange(24))
    d2 = import_igb(src, tmp_path / "out2", classes="2K", undirected=False)
    assert rows_of(d2) == expected_rows(EDGES) and d2.num_classes == 2983


def test_igb_errors(tmp_path: Path) -> None:
    src = write_igb(tmp_path / "small")
    np.save(src / "processed" / "paper__cites__paper" / "edge_index.npy", np.zeros((10, 3), dtype=np.int64))
    with pytest.raises(MomentError, match="expected \\[E, 2\\]") as e:
        import_igb(src, tmp_path / "out")
    assert "edge_index.npy" in str(e.value)
    np.save(src / "processed" / "paper" / "node_label_19.npy", LABELS[:-1])
    with pytest.raises(MomentError, match="labels for") as e:
        import_igb(src, tmp_path / "out")
    assert "node_label_19.npy" in str(e.value)
    (src / "processed" / "paper" / "node_feat.npy").unlink()
    with pytest.raises(MomentError, match="missing node features") as e:
        import_igb(src, tmp_path / "out")
    with pytest.raises(MomentError, match="19 or 2K"):
        import_igb(src, tmp_path / "out", classes="7")


def test_edgelist(tmp_path: Path) -> None:
    f = tmp_path / "e.txt"
    f.write_text("# a comment\n" + "\n".join(f"{s} {d}" for s, d in EDGES) + "\n")
    np.save(tmp_path / "x.npy", FEAT)
    np.save(tmp_path / "y.npy", LABELS)
    ds = import_edgelist(f, tmp_path / "out", features=tmp_path / "x.npy", labels=tmp_path / "y.npy")
    ds.verify()
    assert rows_of(ds) == expected_rows(EDGES) and ds.num_nodes == N
    np.testing.assert_array_equal(ds.features_memmap(), FEAT)
    # comma separated, no features/labels: generated, seeded
    g = tmp_path / "e.csv"
    g.write_text("\n".join(f"{s},{d}" for s, d in EDGES) + "\n")
    a = import_edgelist(g, tmp_path / "a", num_nodes=N + 10, feature_dim=3, undirected=True)
    b = import_edgelist(g, tmp_path / "b", num_nodes=N + 10, feature_dim=3, undirected=True)
    a.verify()
    assert a.num_nodes == N + 10 and a.feature_dim == 3
    assert a.manifest.files["features"].sha256 == b.manifest.files["features"].sha256
    assert a.manifest.source["generated_labels"] is True


def test_edgelist_errors(tmp_path: Path) -> None:
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 x\n")
    with pytest.raises(MomentError, match=r"the id 'x' is not an integer: without --renumber or --node-ids the ids "
                                          r"are node numbers 0\.\.N-1\n  hint: --renumber reads names") as e:
        import_edgelist(f, tmp_path / "out")
    assert "e.txt" in str(e.value)
    f.write_text("0 1 2\n")
    with pytest.raises(MomentError, match="2 columns"):
        import_edgelist(f, tmp_path / "out")
    f.write_text("0 1\n5 2\n")
    np.save(tmp_path / "x.npy", np.zeros((4, 2), np.float32))
    with pytest.raises(MomentError, match="out of range") as e:
        import_edgelist(f, tmp_path / "out", features=tmp_path / "x.npy")
    assert "e.txt" in str(e.value)
    np.save(tmp_path / "y.npy", np.zeros(7))
    with pytest.raises(MomentError, match="wrong row count: 7 labels") as e:
        import_edgelist(f, tmp_path / "out", labels=tmp_path / "y.npy", num_nodes=6)
    assert "y.npy" in str(e.value)
    np.save(tmp_path / "x.npy", np.zeros(6, np.float32))
    with pytest.raises(MomentError, match=r"\[N, D\]") as e:
        import_edgelist(f, tmp_path / "out", features=tmp_path / "x.npy")
    np.save(tmp_path / "x.npy", np.zeros((6, 0), np.float32))  # no value a row: nothing to store (was a traceback)
    with pytest.raises(MomentError, match=r"x\.npy: features must be a matrix \[N, D\] with D >= 1, got shape \[6, 0\]"):
        import_edgelist(f, tmp_path / "out", features=tmp_path / "x.npy")
    for d in (0, -1):
        with pytest.raises(MomentError, match=f"--feature-dim {d}: must be at least 1"):
            import_edgelist(f, tmp_path / "out", feature_dim=d)
    for bad, words in ((np.full((6, 3), 1e300), r"x\.npy: features beyond float32's range: row 0 holds 1e\+300"),
                       (np.where(np.arange(18).reshape(6, 3) == 13, np.nan, 1.0), r"x\.npy: features contain NaN or "
                        r"infinity \(row 4\)")):
        np.save(tmp_path / "x.npy", bad)
        with pytest.raises(MomentError, match=words):
            import_edgelist(f, tmp_path / "out", features=tmp_path / "x.npy")
    for n in (0, -5):
        with pytest.raises(MomentError, match=f"--num-nodes: a node count of {n}: a graph has at least one node"):
            import_edgelist(f, tmp_path / "out", num_nodes=n)
    # labels past any class count: uint32's largest value is -1 cast to it (no label); others are refused
    np.save(tmp_path / "y.npy", np.array([0, 1, 2, 0, 1, 2**32 - 1], np.uint32))
    assert import_edgelist(f, tmp_path / "u32", labels=tmp_path / "y.npy").labels.tolist() == [0, 1, 2, 0, 1, -1]
    for y in (np.array([0, 1, 2, 0, 1, 2**63 + 5], np.uint64), np.array([0, 1, 2, 0, 1, 2**32 - 2], np.uint32),
              np.array([0, 1, 2, 0, 1, 1e20])):
        np.save(tmp_path / "y.npy", y)
        with pytest.raises(MomentError, match=r"y\.npy: node 5 has label .*: classes are numbered 0\.\.C-1 with C at "
                                              r"most 16,777,216"):
            import_edgelist(f, tmp_path / "out", labels=tmp_path / "y.npy")
    (tmp_path / "z.txt").write_bytes(gzip.compress(b"0 1\n"))  # not named .gz: not a codec error
    with pytest.raises(MomentError, match=r"z\.txt: this is gzip-compressed .*\n  hint: use `mv .*z\.txt .*z\.txt\.gz`"):
        import_edgelist(tmp_path / "z.txt", tmp_path / "out")
    (tmp_path / "y.csv").write_text("0,1\n1,0\n")  # too few labels for the random split the import draws
    with pytest.raises(MomentError, match=r"y\.csv: 2 labelled nodes of 6: too few for a random train, val and test "
                       "split"):
        import_edgelist(f, tmp_path / "out", label_table=tmp_path / "y.csv")
    with pytest.raises(MomentError, match="missing edge list"):
        import_edgelist(tmp_path / "none.txt", tmp_path / "out")
    (tmp_path / "bad.npy").write_text("not numpy")
    with pytest.raises(MomentError, match="not a .npy file: it does not begin with NumPy.s header") as e:
        import_edgelist(f, tmp_path / "out", features=tmp_path / "bad.npy")
    assert "bad.npy" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_an_edge_list_with_a_header_line_reads_its_columns_by_name(tmp_path: Path) -> None:
    """`df.to_csv(path, index=False)` writes a header: it is skipped, said in the report, and a header naming
    the destination first swaps the columns; among more columns the named ones are read."""
    want = expected_rows(EDGES)
    for i, (head, pairs, sep) in enumerate((("src,dst", EDGES, ","), ("target source", EDGES[:, ::-1], " "),
                                            ("# my graph\n\nu\tv", EDGES, "\t"))):
        f = tmp_path / f"e{i}.txt"
        f.write_text(head + "\n" + "\n".join(f"{s}{sep}{d}" for s, d in pairs) + "\n")
        ds = import_edgelist(f, tmp_path / f"o{i}", num_nodes=N)
        assert rows_of(ds) == want, head
        src = ds.manifest.source
        assert src["header"] == head.split("\n")[-1].replace(sep, ",") and src["input_edges"] == len(EDGES)
        assert src["columns_swapped"] == (i == 1)
    # among more columns (pandas' index, a weight, a time) the header's source and destination are read
    for i, (head, row) in enumerate(((",src,dst", "{k},{s},{d}"), ("weight,dst,src", "0.{k},{d},{s}"),
                                     ("src,time,dst", "{s},2026-12-05T03:{k},{d}"))):
        f = tmp_path / f"w{i}.csv"
        f.write_text(head + "\n" + "".join(row.format(k=k, s=s, d=d) + "\n" for k, (s, d) in enumerate(EDGES)))
        assert rows_of(import_edgelist(f, tmp_path / f"w{i}", num_nodes=N)) == want, head
    g = tmp_path / "indexed.csv"
    g.write_text(",a,b\n0,0,1\n1,1,2\n")
    with pytest.raises(MomentError, match=r"indexed\.csv: expected 2 columns \(src dst\), got 3 \(the header: "
                                          r",a,b\)\n  hint: .*index=False"):
        import_edgelist(g, tmp_path / "out")
    for text, words in (("0 1 0.5\n", r"expected 2 columns \(src dst\), got 3\n  hint: among more columns \(a weight, "
                                      r"a time\), a header line naming the source and destination"),
                        ("dst src\n0 1.5\n", r"the source column holds a number that is not an integer id"),
                        ("0 18446744073709551615\n", r"an id of the destination column is beyond 2\^63 - 1\n"
                                                      r"  hint: --renumber numbers")):
        g.write_text(text)  # a weight without a header, a float id, a uint64 id: pandas' dtype words before
        with pytest.raises(MomentError, match=r"indexed\.csv: " + words):
            import_edgelist(g, tmp_path / "out")
    plain = tmp_path / "plain.txt"
    plain.write_text("0.0 1.0\n1 2\n")  # numbers, not a header
    assert "header" not in import_edgelist(plain, tmp_path / "p").manifest.source
    assert not (tmp_path / "out").exists()


def test_edgelist_keeps_the_users_split(tmp_path: Path) -> None:
    f = tmp_path / "e.txt"
    f.write_text("\n".join(f"{s} {d}" for s, d in EDGES) + "\n")
    sp = tmp_path / "splits"
    sp.mkdir()
    train = np.zeros(N, bool)
    train[[5, 1, 9]] = True
    np.save(sp / "train.npy", train)  # a boolean mask
    _gz(sp / "valid.csv.gz", ["12", "11"])  # OGB's way
    (sp / "test.txt").write_text("30\n31\n2\n")
    ds = import_edgelist(f, tmp_path / "out", splits_dir=sp, num_nodes=N)
    np.testing.assert_array_equal(ds.train_idx, [1, 5, 9])
    np.testing.assert_array_equal(ds.val_idx, [12, 11])
    np.testing.assert_array_equal(ds.test_idx, [30, 31, 2])
    assert ds.manifest.source["split"] == "given" and ds.manifest.source["generated_labels"]
    random = import_edgelist(f, tmp_path / "r", num_nodes=N)  # (without one: seeded random, as before)
    assert random.manifest.source["split"] == "random"
    (sp / "val.npy").write_bytes(b"")
    with pytest.raises(MomentError, match=r"several val split files \(valid.csv.gz, val.npy\)"):
        import_edgelist(f, tmp_path / "o2", splits_dir=sp)
    (sp / "val.npy").unlink()
    (sp / "test.txt").write_text("30\n5\n")
    with pytest.raises(MomentError, match="node id 5 is in both the train split") as e:
        import_edgelist(f, tmp_path / "o2", splits_dir=sp, num_nodes=N)
    assert "test.txt" in str(e.value)
    (sp / "test.txt").write_text("30\n41\n")
    with pytest.raises(MomentError, match="node id 41 out of range") as e:
        import_edgelist(f, tmp_path / "o2", splits_dir=sp, num_nodes=N)
    assert "test.txt" in str(e.value)
    (sp / "test.txt").unlink()
    with pytest.raises(MomentError, match="no test split file"):
        import_edgelist(f, tmp_path / "o2", splits_dir=sp)
    assert not (tmp_path / "o2").exists()


def test_duplicates_and_self_loops_are_counted_and_kept_or_dropped(tmp_path: Path) -> None:
    f = tmp_path / "e.txt"
    f.write_text("0 1\n0 1\n0 1\n2 2\n1 2\n")
    ds = import_edgelist(f, tmp_path / "a", feature_dim=2)  # defaults: duplicates dropped, self-loops kept
    s = ds.manifest.source
    assert (s["input_edges"], s["duplicate_edges_found"], s["duplicate_edges_dropped"]) == (5, 2, 2)
    assert (s["self_loops_found"], s["self_loops_dropped"], ds.num_edges) == (1, 0, 3)
    keep = import_edgelist(f, tmp_path / "b", feature_dim=2, policy=EdgePolicy("keep", "drop"))
    assert rows_of(keep)[1] == [0, 0, 0] and rows_of(keep)[2] == [1]
    assert (keep.manifest.source["self_loops_dropped"], keep.manifest.source["duplicate_edges_dropped"]) == (1, 0)
    # the same rule in the OGB and IGB importers
    src = write_ogb_csv(tmp_path / "o")
    _gz(src / "raw" / "edge.csv.gz", ["0,1", "0,1", "3,3"])
    o = import_ogb(src, tmp_path / "og", policy=EdgePolicy(self_loops="drop"))
    assert (o.num_edges, o.manifest.source["duplicate_edges_found"], o.manifest.source["self_loops_dropped"]) == (1, 1, 1)
    i = import_igb(write_igb(tmp_path / "igb"), tmp_path / "ig", policy=EdgePolicy(duplicates="keep"))
    assert i.manifest.source["duplicate_edges_dropped"] == 0


def write_ogb_mag(root: Path) -> Path:
    """ogbn-mag's raw layout (ogb's read_heterograph_raw): papers citing papers in two relations here, authors
    writing papers, features and labels for papers only."""
    raw = root / "raw"
    _gz(raw / "num-node-dict.csv.gz", ["paper,author", f"{N},3"])
    half = len(EDGES) // 2
    _gz(raw / "relations" / "paper___cites___paper" / "edge.csv.gz", [f"{s},{d}" for s, d in EDGES[:half]])
    _gz(raw / "relations" / "paper___refs___paper" / "edge.csv.gz", [f"{s},{d}" for s, d in EDGES[half:]])
    _gz(raw / "relations" / "author___writes___paper" / "edge.csv.gz", ["0,1", "2,3"])
    _gz(raw / "node-feat" / "paper" / "node-feat.csv.gz", [",".join(f"{v:.9g}" for v in row) for row in FEAT])
    _gz(raw / "node-label" / "paper" / "node-label.csv.gz", [str(int(v)) for v in LABELS])
    for part, ids in (("train", range(20)), ("valid", range(20, 30)), ("test", range(30, 40))):
        _gz(root / "split" / "time" / "paper" / f"{part}.csv.gz", [str(i) for i in ids])
    return root


def test_one_node_type_of_a_heterogeneous_ogb_download(tmp_path: Path) -> None:
    src = write_ogb_mag(tmp_path / "ogbn_mag")
    ds = import_ogb(src, tmp_path / "out", node_type="paper")
    ds.verify()
    assert rows_of(ds) == expected_rows(EDGES) and ds.num_nodes == N
    np.testing.assert_allclose(ds.features_memmap(), FEAT, rtol=1e-6)
    np.testing.assert_array_equal(ds.labels, LABELS)
    np.testing.assert_array_equal(ds.train_idx, np.arange(20))
    s = ds.manifest.source
    assert s["node_type"] == "paper" and s["relations"] == ["paper___cites___paper", "paper___refs___paper"]
    with pytest.raises(MomentError, match=r"a heterogeneous OGB dataset \(node types: paper, author\): choose the "
                                          r"one to train on\n  hint: --node-type paper"):
        import_ogb(src, tmp_path / "o2")
    with pytest.raises(MomentError, match=r"no relation from author to author \(its relations: "
                                          r"author___writes___paper, paper___cites___paper"):
        import_ogb(src, tmp_path / "o2", node_type="author")
    with pytest.raises(MomentError, match=r"no node type 'venue'"):
        import_ogb(src, tmp_path / "o2", node_type="venue")
    with pytest.raises(MomentError, match=r"a node type \('paper'\) is given, but this OGB dataset has one"):
        import_ogb(write_ogb_csv(tmp_path / "arxiv"), tmp_path / "o2", node_type="paper")
    assert not (tmp_path / "o2").exists()


def test_a_random_split_follows_the_shares_given_and_takes_every_node_when_they_sum_to_one(tmp_path):
    """`--random-split 0.6,0.2,0.2`, as the help suggests, of a Cora-sized graph (2,708 nodes) was refused, "too few
    for a random train, val and test split": each share rounded up on its own needed 2,709 nodes (so for 15,992 of
    the counts 10..20,000). The shares given are followed, the fewest training nodes being the default shares'
    alone (0.1,0.1,0.1 of 1,000 nodes drew 500/125/125, and said nothing)."""
    for shares in ((0.6, 0.2, 0.2), (0.8, 0.1, 0.1), (0.7, 0.2, 0.1)):
        for n in range(10, 3000):
            got = split_sizes(n, *shares, min_train=0)
            assert sum(got) == n and all(abs(k - f * n) < 1 for k, f in zip(got, shares)), (n, shares, got)
    rng = np.random.default_rng(0)
    f = tmp_path / "e.txt"
    np.savetxt(f, rng.integers(0, 2708, (10_000, 2)), fmt="%d")
    ds = import_edgelist(f, tmp_path / "cora", num_nodes=2708, fractions=(0.6, 0.2, 0.2))
    got = [np.asarray(ds.split(s)) for s in ("train", "val", "test")]
    assert [len(x) for x in got] == [1625, 542, 541] and len(np.unique(np.concatenate(got))) == 2708
    np.savetxt(f, rng.integers(0, 1000, (5_000, 2)), fmt="%d")
    sizes = {}
    for i, shares in enumerate([(0.1, 0.1, 0.1), None]):
        ds = import_edgelist(f, tmp_path / str(i), num_nodes=1000, fractions=shares)
        sizes[shares] = [len(ds.split(s)) for s in ("train", "val", "test")]
    assert sizes == {(0.1, 0.1, 0.1): [100, 100, 100], None: [500, 125, 125]}  # the defaults' floor, theirs alone


def test_an_edge_list_of_a_header_alone_is_a_graph_without_edges(tmp_path):
    """What `df.to_csv(index=False)` writes for a filter that matched nothing crashed with a TypeError traceback
    (an empty chunk spooled): as an empty file, it is refused without a node count and is isolated nodes with one."""
    f = tmp_path / "h.csv"
    f.write_text("src,dst\n")
    with pytest.raises(MomentError, match=r"h\.csv: no edges and no node count"):
        import_edgelist(f, tmp_path / "a")
    ds = import_edgelist(f, tmp_path / "b", num_nodes=10, feature_dim=1)
    assert (ds.num_nodes, ds.num_edges) == (10, 0) and not (tmp_path / "a").exists()


def test_a_given_split_with_an_empty_train_split_is_refused_at_the_import(tmp_path):
    """An empty train split (split files of other ids, an empty export) imported without a word; the next command
    said so ("the train split is empty"), far from the cause."""
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n2 3\n3 0\n")
    d = tmp_path / "split"
    d.mkdir()
    for name, ids in (("train.npy", []), ("valid.npy", [1]), ("test.npy", [2])):
        np.save(d / name, np.array(ids, np.int64))
    with pytest.raises(MomentError, match=r"train\.npy: the train split is empty: no node to train on"):
        import_edgelist(f, tmp_path / "out", splits_dir=d)
    assert not (tmp_path / "out").exists()


def test_sparse_ids_read_as_node_numbers_are_refused_with_the_hint_to_renumber(tmp_path):
    """4 edges between ids up to 1,999,999 imported as 2,000,000 nodes (1 GB of drawn features, a random split of
    nodes without an edge) without a word, where the docs said such ids are refused with the hint to renumber:
    refused before anything is written; --renumber keeps them as ids, a node count given keeps them as numbers."""
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n2 1999999\n1999999 0\n")
    with pytest.raises(MomentError, match=r"e\.txt: the edges name 4 distinct nodes, but their largest id is "
                                          r"1,999,999: .* 1,999,996 of them without an edge\n  hint: .*--renumber"):
        import_edgelist(f, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    assert import_edgelist(f, tmp_path / "b", renumber=True, feature_dim=1).num_nodes == 4
    assert import_edgelist(f, tmp_path / "c", num_nodes=2_000_000, feature_dim=1).num_nodes == 2_000_000
    np.save(tmp_path / "ei.npy", np.array([[0, 1, 2, 1999999], [1, 2, 1999999, 0]]))  # the same, as node numbers
    from moment.workload.import_npy import import_npy

    with pytest.raises(MomentError, match=r"ei\.npy.*: the edges name 4 distinct nodes"):
        import_npy(tmp_path / "d", edge_index=tmp_path / "ei.npy")


def test_a_compressed_or_not_utf8_table_is_named_as_such(tmp_path: Path) -> None:
    """A bzip2/xz/zstd edge list, node table, split or node ids file was a UTF-8 codec error ("can't decode byte
    0xbb in position 10"): only gzip is read, so the others are named, with what to do."""
    plain = b"0 1\n1 2\n2 0\n"
    (tmp_path / "e.txt.bz2").write_bytes(bz2.compress(plain))
    with pytest.raises(MomentError, match=r"e\.txt\.bz2: bzip2-compressed: of compressed tables only gzip \(\.gz\) is "
                                          r"read\n  hint: decompress it, or recompress it with gzip"):
        import_edgelist(tmp_path / "e.txt.bz2", tmp_path / "out")
    (tmp_path / "e.txt").write_bytes(plain)
    (tmp_path / "nt.csv").write_bytes(lzma.compress(b"0,1\n1,2\n2,3\n"))
    with pytest.raises(MomentError, match=r"nt\.csv: xz-compressed: of compressed tables only gzip"):
        import_edgelist(tmp_path / "e.txt", tmp_path / "out", node_table=tmp_path / "nt.csv")
    (tmp_path / "ids.txt").write_bytes(bz2.compress(b"0\n1\n2\n"))
    with pytest.raises(MomentError, match=r"ids\.txt: bzip2-compressed"):
        import_edgelist(tmp_path / "e.txt", tmp_path / "out", node_ids=tmp_path / "ids.txt")
    sp = tmp_path / "sp"
    sp.mkdir()
    (sp / "train.txt").write_bytes(gzip.compress(b"0\n"))
    (sp / "valid.txt").write_text("1\n")
    (sp / "test.txt").write_text("2\n")
    with pytest.raises(MomentError, match=r"train\.txt: gzip-compressed, but its name does not end in \.gz .*\n  hint: "
                                          r"mv .*train\.txt .*train\.txt\.gz"):
        import_edgelist(tmp_path / "e.txt", tmp_path / "out", splits_dir=sp)
    (tmp_path / "latin.txt").write_bytes(b"0 1\n1 2\n2 0\n# caf\xe9\n")
    with pytest.raises(MomentError, match=r"latin\.txt: not a UTF-8 text file: it holds the byte 0xe9, which such "
                                          r"text does not"):
        import_edgelist(tmp_path / "latin.txt", tmp_path / "out", renumber=True)
    # past the first line's block, the parser meets it: the same words (a node table's was a traceback)
    (tmp_path / "latin.csv").write_bytes("".join(f"{i},1.5\n" for i in range(20000)).encode() + b"20000,caf\xe9\n")
    with pytest.raises(MomentError, match=r"latin\.csv: not a UTF-8 text file: it holds the byte 0xe9"):
        import_edgelist(tmp_path / "e.txt", tmp_path / "out", node_table=tmp_path / "latin.csv")
    assert not (tmp_path / "out").exists()
