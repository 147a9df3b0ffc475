"""PyG's FeatureStore and GraphStore over the tiered store and a CSRGraph: every index form PyG users write,
one error per bad index, the graph's own arrays as PyG's CSC (memory-mapped, not copied), derived layouts
bounded, and PyG's NeighborSampler/NeighborLoader taking the pair."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moment.errors import MomentError
from moment.placement.opened import Layout
from moment.runtime.store import RankPlace, open_tiers
from moment.workload.sampler import CSRGraph


@pytest.fixture(scope="module", autouse=True)
def _torch_geometric():
    """PyG's names and moment.runtime.pyg's, loaded when these tests run: not when each pytest-xdist worker collects
    the suite, which then loaded torch_geometric and the torch._dynamo, sympy and pandas behind it in every worker
    (1.5 s a process, 4 s while Python compiles their bytecode, as on a fresh clone)."""
    global pyg_typing, FeatureStore, GraphStore, TensorAttr, EdgeAttr, EdgeLayout, EDGE_TYPE, PygFeatureStore
    global PygGraphStore
    import torch_geometric.typing as pyg_typing
    from torch_geometric.data import FeatureStore, GraphStore, TensorAttr
    from torch_geometric.data.graph_store import EdgeAttr, EdgeLayout

    from moment.runtime.pyg import EDGE_TYPE, PygFeatureStore, PygGraphStore


@pytest.fixture(scope="module")
def stores(runtime_layout):
    lay = Layout.open(runtime_layout)
    ds = lay.dataset
    source = open_tiers(lay, RankPlace(local_world_size=1))
    yield ds, np.load(ds.file("features")), PygFeatureStore(source)
    source.close()


def _want(feats: np.ndarray, idx) -> torch.Tensor:
    ids = idx.cpu().numpy() if isinstance(idx, torch.Tensor) else np.arange(len(feats))[
        list(idx) if isinstance(idx, tuple) else idx]
    return torch.from_numpy(feats[ids])


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
INDICES = {
    "numpy": lambda: np.array([5, 17, 3999, 0, 5]),
    "numpy uint32": lambda: np.array([3, 2, 1], np.uint32),
    "numpy one": lambda: np.array([7]),
    "list": lambda: [9, 1, 3999],
    "tuple": lambda: (4, 4),
    "range": lambda: range(10, 20, 3),
    "slice": lambda: slice(2, 6),
    "tensor": lambda: torch.tensor([5, 17, 3999, 0]),
    "int32 tensor": lambda: torch.tensor([8, 1], dtype=torch.int32),
    "cuda tensor": lambda: torch.tensor([5, 17, 0], device="cuda"),
}
FORMS = {
    "item": lambda s, i: s["node", "x", i],
    "view": lambda s, i: s["node"].x[i],
    "view index": lambda s, i: s.view(TensorAttr("node", "x"))[i],
    "get_tensor kwargs": lambda s, i: s.get_tensor(group_name="node", attr_name="x", index=i),
    "get_tensor attr": lambda s, i: s.get_tensor(TensorAttr("node", "x", i)),
    "item attr": lambda s, i: s[TensorAttr("node", "x", i)],
    "multi_get_tensor": lambda s, i: s.multi_get_tensor([TensorAttr("node", "x", i), ("node", "x", [1])])[0],
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", [pytest.param(k, marks=CUDA) if "cuda" in k else k for k in INDICES])
def test_every_index_form_reads_the_layouts_rows(stores, form, kind):
    _, feats, store = stores
    idx = INDICES[kind]()
    assert torch.equal(FORMS[form](store, idx).cpu(), _want(feats, idx))


def test_one_id_is_one_row_a_mask_selects_and_types_convert(stores):
    ds, feats, store = stores
    assert torch.equal(store["node", "x", 7], torch.from_numpy(feats[7]))  # as torch reads x[7]
    assert torch.equal(store["node", "x", np.int64(7)], torch.from_numpy(feats[7]))
    mask = np.zeros(ds.num_nodes, bool)
    mask[[3, 30, 300]] = True
    assert torch.equal(store["node", "x", mask], torch.from_numpy(feats[mask]))
    assert torch.equal(store["node", "x", torch.from_numpy(mask)], torch.from_numpy(feats[mask]))
    out = store.get_tensor(TensorAttr("node", "x", np.array([1, 2])), convert_type=True)
    assert isinstance(out, np.ndarray) and np.array_equal(out, feats[[1, 2]])  # PyG's convert_type
    assert store["node", "x", []].shape == (0, ds.feature_dim)
    assert store["node", "x", None].shape == (ds.num_nodes, ds.feature_dim)  # every row: asked for
    assert store.get_tensor_size(TensorAttr("node", "x", np.array([1, 2]))) == (ds.num_nodes, ds.feature_dim)
    a, b = store.multi_get_tensor([TensorAttr("node", "x", 4), TensorAttr("node", "x", range(3))])
    assert torch.equal(a, torch.from_numpy(feats[4])) and torch.equal(b, torch.from_numpy(feats[:3]))
    attr = TensorAttr("node", "x", np.array([1, 2]))
    store.get_tensor(attr)
    assert type(attr) is TensorAttr and isinstance(attr.index, np.ndarray)  # the caller's own, unchanged


@pytest.mark.parametrize("index,says", [
    (np.array([4000]), r"node ids must be in \[0, 4000\); 4000 at position 0 is not"),
    (torch.tensor([3, -1]), r"-1 at position 1 is not.*\n  hint: negative ids are not counted from the end"),
    ([1, 2, 99999], "99999 at position 2"),
    (np.array([1.0, 2.0]), "node ids must be integers, not float64"),
    (torch.tensor([0.5]), r"\(float32 tensor of shape \(1,\)\): node ids must be integers, not float32"),
    ([0.5, 1], "node ids must be integers, not float64"),
    (np.array([[1, 2], [3, 4]]), r"node ids must be one-dimensional, not of shape \(2, 2\)"),
    (np.ones(3, bool), r"a boolean mask must have one entry per node \(4000\), not shape \(3,\)"),
    (True, "a bool is not a node id"),
    ("5", "give node ids as a tensor, NumPy array, list, range, slice or int"),
    ([[1], [2, 3]], "not an array of node ids"),
])
def test_a_bad_index_is_one_error_naming_it(stores, index, says):
    _, _, store = stores
    for form in ("item", "get_tensor attr", "multi_get_tensor"):
        with pytest.raises(MomentError, match=says):
            FORMS[form](store, index)


def test_the_store_is_read_only_and_holds_one_tensor(stores):
    ds, _, store = stores
    assert isinstance(store, FeatureStore) and store.get_all_tensor_attrs() == [TensorAttr("node", "x")]
    idx = np.array([1, 2])
    for write in (lambda: store.__setitem__(("node", "x", idx), torch.zeros(2, ds.feature_dim)),
                  lambda: store.put_tensor(torch.zeros(2, ds.feature_dim), TensorAttr("node", "x", idx)),
                  lambda: store.update_tensor(torch.zeros(2, ds.feature_dim), group_name="node", attr_name="x",
                                              index=idx),
                  lambda: store.remove_tensor(TensorAttr("node", "x", idx)),
                  lambda: store.__delitem__(("node", "x", idx))):
        with pytest.raises(MomentError, match="feature store is read-only"):
            write()
    with pytest.raises(KeyError, match="this store holds"):
        store["paper", "x", idx]


def test_multi_get_tensor_is_one_read(stores):
    """PyG's loader asks every attribute of a batch in one `multi_get_tensor`: one batch through the tiers."""
    _, feats, store = stores
    seen = []

    class Counting:
        num_nodes, row_shape = store.num_nodes, store.row_shape

        def submit(self, ids):
            seen.append(np.array(ids))
            return store.source.submit(ids)

        def complete(self, pending):
            return store.source.complete(pending)

    counting = PygFeatureStore(Counting())
    a, b = counting.multi_get_tensor([TensorAttr("node", "x", np.array([3, 4])), TensorAttr("node", "x", [9])])
    assert [s.tolist() for s in seen] == [[3, 4, 9]]
    assert torch.equal(a, torch.from_numpy(feats[[3, 4]])) and torch.equal(b, torch.from_numpy(feats[[9]]))


# ------------------------------------------------------------------------------------------- the graph


def _edges(indptr: np.ndarray, indices: np.ndarray) -> set[tuple[int, int]]:
    """(source, destination) of every edge: CSR row v holds v's in-neighbours."""
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return set(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))


def test_csc_is_the_graphs_own_memory_mapped_arrays(runtime_dataset, tmp_path):
    ds = runtime_dataset
    mapped = CSRGraph.from_dataset(ds, in_memory=False)
    assert mapped.indices.dtype == torch.int32  # the dataset's ids: int32 below 2^31 nodes
    row, colptr = PygGraphStore(mapped, index_dtype=None).get_edge_index(EDGE_TYPE, "csc")
    assert row.data_ptr() == ds.indices.ctypes.data and colptr.data_ptr() == ds.indptr.ctypes.data  # no copy
    wide, colptr64 = PygGraphStore(mapped).get_edge_index(edge_type=EDGE_TYPE, layout="csc")
    assert wide.dtype == colptr64.dtype == torch.int64 and torch.equal(wide, row.long())  # PyG's samplers' ids
    np.save(tmp_path / "indptr.npy", np.asarray(ds.indptr, np.int64))
    np.save(tmp_path / "indices.npy", np.asarray(ds.indices, np.int64))
    ip, ix = (np.load(tmp_path / f"{k}.npy", mmap_mode="r") for k in ("indptr", "indices"))
    g64 = PygGraphStore(CSRGraph.from_arrays(ip, ix, in_memory=False), max_copy_bytes=0)  # no copy allowed
    row, colptr = g64[EdgeAttr(EDGE_TYPE, "csc")]
    assert row.data_ptr() == ix.ctypes.data and colptr.data_ptr() == ip.ctypes.data
    (r,), (c,), (p,) = (d.values() for d in g64.csc())
    assert r.data_ptr() == ix.ctypes.data and c.data_ptr() == ip.ctypes.data and p is None


def test_coo_and_csr_are_the_same_edges_and_bounded(runtime_dataset):
    ds = runtime_dataset
    graph = CSRGraph.from_dataset(ds)
    store = PygGraphStore(graph)
    n, e = ds.num_nodes, ds.num_edges
    want = _edges(np.asarray(ds.indptr), np.asarray(ds.indices))
    assert isinstance(store, GraphStore)
    assert store.get_all_edge_attrs() == [EdgeAttr(EDGE_TYPE, EdgeLayout.CSC, is_sorted=True, size=(n, n))]
    src, dst = store.get_edge_index(EDGE_TYPE, "coo")
    assert src.dtype == dst.dtype == torch.int64 and src.numel() == e
    assert set(zip(src.tolist(), dst.tolist(), strict=True)) == want and bool((torch.diff(dst) >= 0).all())
    rowptr, col = store.get_edge_index(EDGE_TYPE, "csr")
    assert rowptr.numel() == n + 1 and int(rowptr[-1]) == e
    by_src = np.repeat(np.arange(n), np.diff(rowptr.numpy()))
    assert set(zip(by_src.tolist(), col.tolist(), strict=True)) == want
    (rp,), (cl,), (perm,) = (d.values() for d in store.csr())
    assert torch.equal(rp, rowptr) and torch.equal(cl, col)
    assert torch.equal(graph.indices[perm].long(), torch.from_numpy(by_src))  # perm: CSC order -> CSR order
    assert torch.equal(dst[perm], col)
    small = PygGraphStore(graph, max_copy_bytes=1 << 10)
    for layout in ("coo", "csr"):
        with pytest.raises(MomentError, match=rf"the '{layout}' edge index .* is a copy of .* more than 1.00 KiB "
                                              r"\(max_copy_bytes\)\n  hint: layout='csc'"):
            small.get_edge_index(EDGE_TYPE, layout)
    with pytest.raises(MomentError, match=r"'csc' edge index .* \(the ids as torch.int64\)"):
        small.get_edge_index(EDGE_TYPE, "csc")  # int32 ids widened: a copy too
    assert PygGraphStore(graph, index_dtype=None, max_copy_bytes=0).get_edge_index(EDGE_TYPE, "csc")[0].numel() == e


def test_the_graph_store_is_read_only_with_one_edge_type(runtime_dataset):
    store = PygGraphStore(CSRGraph.from_dataset(runtime_dataset))
    edge_index = store.get_edge_index(EDGE_TYPE, "coo")
    for write in (lambda: store.put_edge_index(edge_index, EDGE_TYPE, "coo"),
                  lambda: store.__setitem__(EdgeAttr(EDGE_TYPE, "coo"), edge_index),
                  lambda: store.remove_edge_index(EDGE_TYPE, "coo"),
                  lambda: store.__delitem__(EdgeAttr(EDGE_TYPE, "coo")),
                  lambda: store.coo(store=True)):
        with pytest.raises(MomentError, match="graph store is read-only"):
            write()
    with pytest.raises(KeyError):
        store.get_edge_index(("paper", "cites", "paper"), "csc")
    with pytest.raises(MomentError, match="this graph store holds one"):
        store.csc(edge_types=[("paper", "cites", "paper")])


# ------------------------------------------------------------------------------------------- PyG's sampler


def test_pygs_neighbor_sampler_takes_the_pair(stores):
    """PyG's own sampler reads the pair's metadata and CSC at construction. Sampling needs pyg-lib or
    torch-sparse (not installable here): then PyG's own ImportError, at the first batch."""
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.sampler import NeighborSampler, NodeSamplerInput

    ds, feats, fs = stores
    gs = PygGraphStore(CSRGraph.from_dataset(ds, in_memory=False))
    with pytest.warns(UserWarning, match="pyg-lib") if not pyg_typing.WITH_PYG_LIB else _nothing():
        sampler = NeighborSampler((fs, gs), [5, 3])
    assert sampler.is_hetero and sampler.num_nodes == {"node": ds.num_nodes}
    assert sampler.colptr_dict["node__to__node"].data_ptr() == gs.graph.indptr.data_ptr()  # the graph's own
    assert torch.equal(sampler.row_dict["node__to__node"], gs.graph.indices.long())
    seeds = torch.arange(8)
    if not (pyg_typing.WITH_PYG_LIB or pyg_typing.WITH_TORCH_SPARSE):
        with pytest.raises(ImportError, match="'NeighborSampler' requires either 'pyg-lib' or 'torch-sparse'"):
            sampler.sample_from_nodes(NodeSamplerInput(None, seeds, input_type="node"))
        return
    batch = next(iter(NeighborLoader((fs, gs), num_neighbors=[5, 3], input_nodes=("node", seeds), batch_size=8)))
    _check_batch(batch, ds, feats)


def test_pygs_loader_reads_each_batch_through_the_store(stores, monkeypatch):
    """PyG's NeighborLoader over the pair, its C++ sampling kernel (pyg-lib) replaced by a few lines that
    take every in-neighbour from the CSC the sampler was handed: PyG's own loader then fetches the batch's
    features through the store's `multi_get_tensor` and its edges as ("node", "to", "node")."""
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.sampler import HeteroSamplerOutput, NeighborSampler

    ds, feats, fs = stores
    gs = PygGraphStore(CSRGraph.from_dataset(ds, in_memory=False))

    def one_hop(self, seed, seed_time=None, **kw):
        colptr, row = self.colptr_dict["node__to__node"], self.row_dict["node__to__node"]
        seeds = seed["node"]
        src = [row[colptr[v]:colptr[v + 1]] for v in seeds.tolist()]
        dst = torch.cat([torch.full((len(s),), i) for i, s in enumerate(src)])
        new = torch.cat(src)
        node = torch.cat([seeds, new[~torch.isin(new, seeds)].unique()])
        local = {int(v): i for i, v in enumerate(node.tolist())}
        rows = torch.tensor([local[int(v)] for v in new.tolist()])
        return HeteroSamplerOutput(node={"node": node}, row={EDGE_TYPE: rows}, col={EDGE_TYPE: dst},
                                   edge={EDGE_TYPE: None})

    monkeypatch.setattr(NeighborSampler, "_sample", one_hop)
    loader = NeighborLoader((fs, gs), num_neighbors=[-1], input_nodes=("node", torch.arange(40)), batch_size=16)
    batches = list(loader)
    assert len(batches) == 3 and batches[0]["node"].batch_size == 16
    for b in batches:
        _check_batch(b, ds, feats)


def _check_batch(batch, ds, feats) -> None:
    n_id = batch["node"].n_id
    assert torch.equal(batch["node"].x, torch.from_numpy(feats[n_id.numpy()]))
    src, dst = n_id[batch[EDGE_TYPE].edge_index]
    want = _edges(np.asarray(ds.indptr), np.asarray(ds.indices))
    assert src.numel() > 0 and set(zip(src.tolist(), dst.tolist(), strict=True)) <= want


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
