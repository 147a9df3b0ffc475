"""PyG and OGB-processed imports on files written the way those libraries write them: `torch.save(data)`, an
`InMemoryDataset` subclass's own `process()`, ogb's `torch.save(InMemoryDataset.collate([data]))` and its
`torch.save({'graph': ..., 'labels': ...}, pickle_protocol=4)`; splits kept, edge counts reported, bad files
refused naming the file and the attribute."""

from __future__ import annotations

import datetime
import gzip
from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.workload.graph import GraphDataset
from moment.workload.import_ogb import import_ogb
from moment.workload.importers import EdgePolicy, import_notices

torch = pytest.importorskip("torch")
from moment.workload.import_pyg import import_pyg  # noqa: E402 - after the skip: needs torch


@pytest.fixture(scope="module", autouse=True)
def _torch_geometric():
    """`pyg_data` (torch_geometric.data), loaded when these tests run: not when each pytest-xdist worker collects the
    suite, which then loaded torch_geometric and the torch._dynamo, sympy and pandas behind it in every worker (1.5 s
    a process, 4 s while Python compiles their bytecode, as on a fresh clone)."""
    global pyg_data
    pyg_data = pytest.importorskip("torch_geometric.data")

N, D = 40, 6
RNG = np.random.default_rng(11)
BASE = np.unique(RNG.integers(0, N, size=(120, 2)), axis=0)
BASE = BASE[BASE[:, 0] != BASE[:, 1]]  # distinct, no self-loops
LOOPS = np.array([[3, 3], [7, 7]])
EDGES = np.concatenate([BASE, BASE[:5], LOOPS])  # 5 duplicates, 2 self-loops
FEAT = RNG.standard_normal((N, D)).astype(np.float32)
LABELS = RNG.integers(0, 5, N)
TRAIN, VAL, TEST = np.arange(0, 20), np.arange(20, 30), np.arange(30, 40)


def mask(ids: np.ndarray, n: int = N) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[torch.from_numpy(ids)] = True
    return m


def graph(**extra) -> pyg_data.Data:
    d = pyg_data.Data(x=torch.from_numpy(FEAT), edge_index=torch.from_numpy(EDGES.T.copy()),
                      y=torch.from_numpy(LABELS), train_mask=mask(TRAIN), val_mask=mask(VAL), test_mask=mask(TEST))
    for k, v in extra.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    return d


def rows_of(ds: GraphDataset) -> dict[int, list[int]]:
    ip, ix = np.asarray(ds.indptr), np.asarray(ds.indices)
    return {v: sorted(ix[ip[v] : ip[v + 1]].tolist()) for v in range(ds.num_nodes)}


def expected_rows(edges: np.ndarray, dedupe: bool = True, loops: bool = True) -> dict[int, list[int]]:
    pairs = [(int(s), int(d)) for s, d in edges if loops or s != d]
    if dedupe:
        pairs = sorted(set(pairs))
    return {v: sorted(s for s, d in pairs if d == v) for v in range(N)}


def test_data_file_with_masks(tmp_path: Path) -> None:
    torch.save(graph(), tmp_path / "data.pt")
    ds = import_pyg(tmp_path / "data.pt", tmp_path / "out")
    ds.verify()
    assert rows_of(ds) == expected_rows(EDGES)
    np.testing.assert_array_equal(ds.features_memmap(), FEAT)
    np.testing.assert_array_equal(ds.labels, LABELS)
    for got, want in zip((ds.train_idx, ds.val_idx, ds.test_idx), (TRAIN, VAL, TEST)):
        np.testing.assert_array_equal(got, want)
    s = ds.manifest.source
    assert s["importer"] == "pyg" and s["split"] == "given"
    assert (s["input_edges"], s["self_loops_found"], s["self_loops_dropped"]) == (len(EDGES), 2, 0)
    assert (s["duplicate_edges_found"], s["duplicate_edges_dropped"]) == (5, 5)
    assert ds.num_edges == len(BASE) + 2
    assert import_notices(s) == ["5 duplicate edges dropped (--duplicates keep keeps them)"]


def test_masks_of_0_1_integers_are_masks(tmp_path: Path) -> None:
    """uint8 masks (PyG's own before torch 1.2) and `.long()` ones hold the split their boolean ones hold: read
    as ids they were node 0 listed again and again."""
    torch.save(graph(train_mask=mask(TRAIN).to(torch.uint8), val_mask=mask(VAL).long(), test_mask=mask(TEST).int()),
               tmp_path / "data.pt")
    ds = import_pyg(tmp_path / "data.pt", tmp_path / "out")
    for got, want in zip((ds.train_idx, ds.val_idx, ds.test_idx), (TRAIN, VAL, TEST)):
        np.testing.assert_array_equal(got, want)


def test_a_bool_label_vector_is_a_binary_target(tmp_path: Path) -> None:
    """`y` of bools (a plain binary target) was refused ("labels must be numeric, got bool"): classes 0 and 1."""
    from moment import import_graph

    ds = import_graph(graph(y=torch.from_numpy(LABELS > 2)), tmp_path / "out")
    np.testing.assert_array_equal(np.asarray(ds.labels), (LABELS > 2).astype(np.int64))
    assert ds.num_classes == 2 and not ds.multilabel


def test_edge_policy_keep_duplicates_drop_loops(tmp_path: Path) -> None:
    torch.save(graph(), tmp_path / "data.pt")
    ds = import_pyg(tmp_path / "data.pt", tmp_path / "out", policy=EdgePolicy(duplicates="keep", self_loops="drop"))
    assert rows_of(ds) == expected_rows(EDGES, dedupe=False, loops=False)
    s = ds.manifest.source
    assert (s["self_loops_found"], s["self_loops_dropped"], s["duplicate_edges_found"], s["duplicate_edges_dropped"]) \
        == (2, 2, 5, 0)
    assert ds.num_edges == len(BASE) + 5
    # undirected: a self-loop is its own reverse (one entry, not a duplicate)
    und = import_pyg(tmp_path / "data.pt", tmp_path / "und", undirected=True)
    assert und.manifest.source["self_loops_found"] == 2
    assert rows_of(und)[3].count(3) == 1
    with pytest.raises(MomentError, match="--duplicates 'some': must be one of keep, drop"):
        EdgePolicy(duplicates="some")


def save_as_in_memory_dataset(root: str, data: pyg_data.Data) -> pyg_data.InMemoryDataset:
    """A user's InMemoryDataset: its process() saves one graph the way PyG's datasets do."""

    class OneGraph(pyg_data.InMemoryDataset):
        def __init__(self):
            self._graph = data
            super().__init__(root)
            self.load(self.processed_paths[0])

        @property
        def raw_file_names(self) -> list[str]:
            return []

        @property
        def processed_file_names(self) -> list[str]:
            return ["data.pt"]

        def download(self) -> None:
            pass

        def process(self) -> None:
            self.save([self._graph], self.processed_paths[0])

    return OneGraph()


def test_in_memory_dataset_processed_file_with_index_splits(tmp_path: Path) -> None:
    g = graph(train_mask=None, val_mask=None, test_mask=None, y=torch.from_numpy(LABELS)[:, None],
              train_idx=torch.from_numpy(TRAIN[::-1].copy()), valid_idx=torch.from_numpy(VAL),
              test_idx=torch.from_numpy(TEST))
    save_as_in_memory_dataset(str(tmp_path / "ds"), g)
    f = tmp_path / "ds" / "processed" / "data.pt"
    ds = import_pyg(f, tmp_path / "out")
    np.testing.assert_array_equal(ds.labels, LABELS)  # [N, 1] is fine
    np.testing.assert_array_equal(ds.train_idx, TRAIN[::-1])  # kept in the given order
    assert rows_of(ds) == expected_rows(EDGES)


def assert_same_dataset(got: GraphDataset, want: GraphDataset) -> None:
    got.verify()
    assert rows_of(got) == rows_of(want) and got.num_edges == want.num_edges
    np.testing.assert_array_equal(got.features_memmap(), want.features_memmap())
    for a in ("labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(got, a), getattr(want, a))


def test_a_graph_in_memory_imports_as_its_file_does(tmp_path: Path) -> None:
    from moment import import_graph

    torch.save(graph(), tmp_path / "data.pt")
    want = import_pyg(tmp_path / "data.pt", tmp_path / "file")
    dataset = save_as_in_memory_dataset(str(tmp_path / "ds"), graph())
    arrays = {k: v.numpy() for k, v in graph().to_dict().items()}  # a dict of NumPy arrays
    for i, g in enumerate((graph(), dataset, arrays)):
        got = import_graph(g, tmp_path / f"mem{i}")
        assert_same_dataset(got, want)
        src = got.manifest.source
        assert src["from"] == ("a graph in memory" if i == 2 else "a Data in memory") and src["split"] == "given"
    und = import_graph(graph(), tmp_path / "und", undirected=True, duplicates="keep", self_loops="drop")
    assert und.manifest.source["self_loops_dropped"] == 2 and und.manifest.source["undirected"]


def test_a_graph_in_memory_that_is_wrong_is_one_error_naming_the_attribute(tmp_path: Path) -> None:
    from moment import import_graph

    with pytest.raises(MomentError, match=r"^Data:y: wrong row count: 40 labels for 39 nodes \(feature rows of "
                                          r"Data:x\)"):
        import_graph(graph(x=torch.from_numpy(FEAT[:-1])), tmp_path / "a")
    with pytest.raises(MomentError, match=r"^graph: has train_mask but no val split"):
        import_graph({"edge_index": torch.from_numpy(EDGES.T.copy()), "train_mask": mask(TRAIN)}, tmp_path / "b")
    two = pyg_data.InMemoryDataset.collate([graph(), graph()])

    class Two(pyg_data.InMemoryDataset):
        def __init__(self):
            super().__init__()
            self.data, self.slices = two

    with pytest.raises(MomentError, match=r"^Two: a Two of 2 graphs: import one graph"):
        import_graph(Two(), tmp_path / "c")
    with pytest.raises(MomentError, match="--duplicates 'some': must be one of keep, drop"):
        import_graph(graph(), tmp_path / "d", duplicates="some")
    with pytest.raises(MomentError, match=r"^list: holds a list: expected a torch_geometric Data"):
        import_graph([1, 2], tmp_path / "e")
    with pytest.raises(MomentError, match=r"^import_graph takes a graph in memory; 'g\.pt' is a path\n  hint: "
                                          r"`moment data import pyg PATH"):
        import_graph("g.pt", tmp_path / "f")
    with pytest.raises(MomentError, match=r"^Data:x: x is a meta tensor: it has a shape but no data"):
        import_graph(graph(x=torch.empty(N, D, device="meta")), tmp_path / "g")
    with pytest.raises(MomentError, match=r"^Data:y: no node has a label \(every one is negative or NaN"):
        import_graph(graph(y=torch.full((N,), float("nan")), train_mask=None, val_mask=None, test_mask=None),
                     tmp_path / "h")
    # a config file's strings and floats, as argparse-to-keyword glue passes them: "false" doubled the edges
    with pytest.raises(MomentError, match=r"^import_graph\(undirected='false'\): must be True or False"):
        import_graph(graph(), tmp_path / "i", undirected="false")
    with pytest.raises(MomentError, match=r"^--seed 1\.5: must be an integer"):
        import_graph(graph(), tmp_path / "j", seed=1.5)
    assert not any((tmp_path / n).exists() for n in "abcdefghij")


def test_features_or_labels_under_other_names_are_refused_not_drawn_at_random(tmp_path: Path) -> None:
    """A dict made from a DGL graph's ndata (`feat`, `label`) imported as random features and labels, the masks
    kept as its split, without a word in a script: the model trained on noise. Refused, naming what to rename;
    from a file, as in memory."""
    from moment import import_graph

    edges = torch.from_numpy(EDGES.T.copy())
    for g, attr, other in (({"edge_index": edges, "feat": torch.from_numpy(FEAT), "label": torch.zeros(N)}, "x",
                            "feat"), ({"edge_index": edges, "x": torch.from_numpy(FEAT), "labels": torch.zeros(N)},
                                      "y", "labels")):
        with pytest.raises(MomentError, match=rf"^graph:{other}: has no attribute {attr} but has {other}: .* read "
                                              rf"from {attr} \(without it they would be drawn at random\)\n  hint: "
                                              rf"name them {attr} \(DGL's ndata\['{other}'\] is PyG's {attr}\)"):
            import_graph(g, tmp_path / "a")
    _raises(tmp_path, pyg_data.Data(edge_index=edges, feat=torch.from_numpy(FEAT)), r"bad\.pt:feat: has no attribute x")
    assert not (tmp_path / "a").exists()


def test_missing_x_y_and_split_are_generated_and_said(tmp_path: Path) -> None:
    g = pyg_data.Data(edge_index=torch.from_numpy(BASE.T.copy()), num_nodes=N)
    torch.save(g, tmp_path / "bare.pt")
    a = import_pyg(tmp_path / "bare.pt", tmp_path / "a", feature_dim=4, seed=3)
    b = import_pyg(tmp_path / "bare.pt", tmp_path / "b", feature_dim=4, seed=3)
    a.verify()
    assert a.num_nodes == N and a.feature_dim == 4 and a.dataset_id == b.dataset_id
    s = a.manifest.source
    assert s["generated_features"] and s["generated_labels"] and s["split"] == "random"
    notes = import_notices(s)
    assert len(notes) == 3 and "not accuracy" in notes[0]


def _raises(tmp_path: Path, g, match: str, name: str = "bad.pt") -> MomentError:
    torch.save(g, tmp_path / name)
    with pytest.raises(MomentError, match=match) as e:
        import_pyg(tmp_path / name, tmp_path / "out")
    assert name in str(e.value)
    assert not (tmp_path / "out").exists()
    return e.value


def test_bad_graphs_name_the_file_and_attribute(tmp_path: Path) -> None:
    _raises(tmp_path, graph(edge_index=None), "no attribute edge_index")
    e = _raises(tmp_path, graph(y=torch.full((N, 3), 0.5)), r"labels of shape \[40, 3\] are read as multi-label "
                r".*node 0's target 0 is 0\.5")
    assert "bad.pt:y" in str(e)
    e = _raises(tmp_path, graph(val_mask=mask(VAL, N - 1)), "boolean mask of 39 entries for 40 nodes")
    assert "bad.pt:val_mask" in str(e)
    e = _raises(tmp_path, graph(x=torch.zeros(N + 1, D)), r"wrong row count: 40 labels for 41 nodes \(feature rows")
    assert "bad.pt:y" in str(e) and "bad.pt:x" in str(e)
    _raises(tmp_path, graph(test_mask=None), r"has train_mask, val_mask but no test split \(test_mask, test_idx\)")
    e = _raises(tmp_path, graph(test_mask=mask(np.arange(15, 40))), "node id 15 is in both the train split")
    assert "bad.pt:test_mask" in str(e) and "disjoint" in str(e)
    _raises(tmp_path, graph(train_idx=torch.tensor([0, N])), "given twice")
    _raises(tmp_path, graph(train_mask=None, train_idx=torch.tensor([0, N])), f"node id {N} out of range")
    _raises(tmp_path, graph(edge_index=torch.tensor([[0, 1], [2, N]])), f"node id {N} out of range")
    _raises(tmp_path, graph(edge_index=torch.zeros(3, 4, dtype=torch.long)), r"\[2, E\] or \[E, 2\]")
    _raises(tmp_path, graph(edge_index=torch.zeros(2, 4)), "dtype float32: expected integer")
    _raises(tmp_path, graph(x=torch.zeros(N, D, dtype=torch.bfloat16)), "bfloat16")
    _raises(tmp_path, graph(train_mask=torch.ones(N, 2, dtype=torch.bool)), "several splits")
    _raises(tmp_path, graph(y=torch.full((N,), 0.5)), "whole numbers")
    e = _raises(tmp_path, graph(val_mask=mask(VAL).long() * 2), "val_mask has dtype int64 with values other than 0 "
                "and 1")
    assert "bad.pt:val_mask" in str(e) and e.hint == "save ids as val_idx"


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(MomentError, match="missing PyG data file"):
        import_pyg(tmp_path / "none.pt", tmp_path / "out")
    torch.save(graph(), tmp_path / "g.pt")
    cut = tmp_path / "cut.pt"
    cut.write_bytes((tmp_path / "g.pt").read_bytes()[:500])
    with pytest.raises(MomentError, match="not a readable torch file") as e:
        import_pyg(cut, tmp_path / "out")
    assert "cut.pt" in str(e.value)
    pyg_data.InMemoryDataset.save([graph(), graph()], str(tmp_path / "two.pt"))
    with pytest.raises(MomentError, match="InMemoryDataset with 2 graphs"):
        import_pyg(tmp_path / "two.pt", tmp_path / "out")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(MomentError, match="holds a list"):
        import_pyg(tmp_path / "list.pt", tmp_path / "out")


def hetero_graph() -> pyg_data.HeteroData:
    """ogbn-mag's shape: labelled papers citing papers (in two relations here), and authors writing them."""
    g, h = graph(), pyg_data.HeteroData()
    for k in ("x", "y", "train_mask", "val_mask", "test_mask"):
        h["paper"][k] = g[k]
    h["author"].x = torch.zeros(3, 2)
    h["paper", "cites", "paper"].edge_index = g.edge_index[:, :50]
    h["paper", "refs", "paper"].edge_index = g.edge_index[:, 50:].to(torch.int32)
    h["author", "writes", "paper"].edge_index = torch.tensor([[0, 1, 2], [3, 4, 5]])
    return h


def test_one_node_type_of_a_hetero_graph_imports_as_its_own_graph(tmp_path: Path) -> None:
    from moment import import_graph

    torch.save(graph(), tmp_path / "homo.pt")
    want = import_pyg(tmp_path / "homo.pt", tmp_path / "want")
    torch.save(hetero_graph(), tmp_path / "h.pt")
    dataset = save_as_in_memory_dataset(str(tmp_path / "ds"), hetero_graph())
    made = [import_pyg(tmp_path / "h.pt", tmp_path / "file", node_type="paper"),
            import_pyg(tmp_path / "ds" / "processed" / "data.pt", tmp_path / "processed", node_type="paper"),
            import_graph(hetero_graph(), tmp_path / "memory", node_type="paper"),
            import_graph(dataset, tmp_path / "dataset", node_type="paper")]
    for got in made:
        assert_same_dataset(got, want)
        src = got.manifest.source
        assert src["node_type"] == "paper" and src["relations"] == ["paper__cites__paper", "paper__refs__paper"]


def test_a_hetero_graph_needs_a_node_type_with_edges_of_its_own(tmp_path: Path) -> None:
    torch.save(hetero_graph(), tmp_path / "h.pt")
    with pytest.raises(MomentError, match=r"h\.pt: holds a HeteroData \(node types: paper, author\): choose the "
                                          r"one to train on\n  hint: --node-type paper .*with labels: paper\)"):
        import_pyg(tmp_path / "h.pt", tmp_path / "out")
    with pytest.raises(MomentError, match=r"no node type 'venue' \(its node types: paper, author\)"):
        import_pyg(tmp_path / "h.pt", tmp_path / "out", node_type="venue")
    with pytest.raises(MomentError, match=r"no relation from author to author \(its edge types: paper__cites__paper, "
                                          r"paper__refs__paper, author__writes__paper\)"):
        import_pyg(tmp_path / "h.pt", tmp_path / "out", node_type="author")
    torch.save(graph(), tmp_path / "homo.pt")
    with pytest.raises(MomentError, match=r"a node type \('paper'\) is given, but the graph is a Data"):
        import_pyg(tmp_path / "homo.pt", tmp_path / "out", node_type="paper")
    assert not (tmp_path / "out").exists()


def test_a_pickle_that_would_run_code_is_refused_unless_trusted(tmp_path: Path) -> None:
    f = tmp_path / "odd.pt"
    torch.save({"edge_index": torch.from_numpy(BASE.T.copy()), "made": datetime.date(2024, 1, 2)}, f)
    with pytest.raises(MomentError, match="pickles datetime.date, which Moment does not unpickle") as e:
        import_pyg(f, tmp_path / "out")
    assert "--trust-pickle" in str(e.value) and "odd.pt" in str(e.value)
    ds = import_pyg(f, tmp_path / "out", trust_pickle=True)
    assert ds.num_edges == len(BASE)


# --------------------------------------------------------------------------------------------- OGB processed


def _gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def ogb_root(root: Path, label_nan: bool = True) -> tuple[Path, np.ndarray]:
    """split/ as ogb's download has it; the [N, 1] labels ogb's loaders read from node-label.csv.gz."""
    sp = root / "split" / "time"
    for part, ids in (("train", TRAIN[1:]), ("valid", VAL), ("test", TEST)):
        _gz(sp / f"{part}.csv.gz", [str(i) for i in ids])
    labels = LABELS.astype(np.float64)[:, None]
    if label_nan:
        labels[0] = np.nan  # unlabelled (in no split), as in ogbn-papers100M
    (root / "processed").mkdir(parents=True)
    return root, labels


def write_node_prop_pred(root: Path, protocol: int = 4, **graph_extra) -> Path:
    """What ogb's NodePropPredDataset.pre_process saves: read_csv_graph_raw's dict and the labels' .values."""
    root, labels = ogb_root(root, label_nan=False)
    g = {"edge_index": EDGES.T.astype(np.int64), "edge_feat": None, "node_feat": FEAT, "num_nodes": N}
    g.update(graph_extra)
    torch.save({"graph": g, "labels": labels.astype(np.int64)}, root / "processed" / "data_processed",
               pickle_protocol=protocol)
    return root


def write_pyg_node_prop_pred(root: Path) -> Path:
    """What ogb's PygNodePropPredDataset.process saves: read_graph_pyg's Data with y, collated."""
    root, labels = ogb_root(root)
    data = pyg_data.Data()
    data.num_nodes = N
    data.edge_index = torch.from_numpy(EDGES.T.astype(np.int64))
    data.x = torch.from_numpy(FEAT)
    data.y = torch.from_numpy(labels).to(torch.float32)  # has NaN: ogb keeps float
    torch.save(pyg_data.InMemoryDataset.collate([data]), root / "processed" / "geometric_data_processed.pt")
    return root


def test_ogb_processed_numpy_dict(tmp_path: Path) -> None:
    for protocol in (4, 2):
        root = write_node_prop_pred(tmp_path / f"ogbn_x{protocol}", protocol=protocol)
        ds = import_ogb(root, tmp_path / f"out{protocol}")
        ds.verify()
        assert rows_of(ds) == expected_rows(EDGES)
        np.testing.assert_array_equal(ds.features_memmap(), FEAT)
        np.testing.assert_array_equal(ds.labels, LABELS)
        np.testing.assert_array_equal(ds.val_idx, VAL)
        s = ds.manifest.source
        assert s["importer"] == "ogb-processed" and s["split"] == "time" and s["duplicate_edges_found"] == 5


def test_ogb_processed_pyg_file_and_layout_choice(tmp_path: Path) -> None:
    root = write_pyg_node_prop_pred(tmp_path / "ogbn_x_pyg")
    ds = import_ogb(root, tmp_path / "out")
    assert ds.manifest.source["importer"] == "ogb-pyg-processed"
    assert rows_of(ds) == expected_rows(EDGES)
    lab = np.asarray(ds.labels)
    assert lab[0] == -1 and (lab[1:] == LABELS[1:]).all()
    np.testing.assert_array_equal(ds.features_memmap(), FEAT)
    # a raw/ beside it is read by default; --layout processed asks for processed/
    _gz(root / "raw" / "edge.csv.gz", ["0,1"])
    with pytest.raises(MomentError, match="missing node labels"):
        import_ogb(root, tmp_path / "o2")
    assert import_ogb(root, tmp_path / "o2", layout="processed").num_edges == ds.num_edges
    with pytest.raises(MomentError, match="--layout 'both': must be one of auto, raw, processed"):
        import_ogb(root, tmp_path / "o3", layout="both")


def test_ogb_processed_errors(tmp_path: Path) -> None:
    root = write_node_prop_pred(tmp_path / "a", edge_index=EDGES.astype(np.float32).T)
    with pytest.raises(MomentError, match="dtype float32: expected integer") as e:
        import_ogb(root, tmp_path / "out")
    assert "data_processed:graph.edge_index" in str(e.value)
    root = write_node_prop_pred(tmp_path / "b", node_feat=FEAT[:-1])
    with pytest.raises(MomentError, match="39 feature rows for 40 nodes"):
        import_ogb(root, tmp_path / "out")
    root = write_node_prop_pred(tmp_path / "c", made=datetime.date(2024, 1, 2))
    with pytest.raises(MomentError, match="pickles datetime.date") as e:
        import_ogb(root, tmp_path / "out")
    assert "--trust-pickle" in str(e.value)
    assert import_ogb(root, tmp_path / "out", trust_pickle=True).num_nodes == N
    (root / "processed" / "data_processed").write_bytes(b"not a zip at all")
    with pytest.raises(MomentError, match="not the zip archive torch.save writes"):
        import_ogb(root, tmp_path / "out2")
    root = write_node_prop_pred(tmp_path / "d")
    _gz(root / "split" / "time" / "test.csv.gz", [str(i) for i in range(25, 40)])
    with pytest.raises(MomentError, match="node id 25 is in both the val split") as e:
        import_ogb(root, tmp_path / "out2")
    assert "test.csv.gz" in str(e.value)
    with pytest.raises(MomentError, match="missing edge list") as e:
        import_ogb(tmp_path / "d" / "split", tmp_path / "out2")
    assert "--layout processed" in str(e.value)
    (tmp_path / "e").mkdir()
    with pytest.raises(MomentError, match="no processed dataset"):
        import_ogb(tmp_path / "e", tmp_path / "out2", layout="processed")
