"""Importing a graph the way PyG users hold it: a `torch_geometric.data.Data` saved with `torch.save`, or the
processed file of an `InMemoryDataset` with one graph (`processed/data.pt`, ogb's
`geometric_data_processed.pt`).

Why: a PyG user's graph is already one object with `edge_index` [2, E], `x` [N, D], `y` [N] (or [N, 1])
and a split as boolean masks (`train_mask`, `val_mask`, `test_mask`) or index tensors (`train_idx`,
`val_idx`/`valid_idx`, `test_idx`); asking them to export loose arrays first loses the split. The file is
unpickled safely (`moment.workload.torch_files`) and memory-mapped, so `x` is read in chunks.

Missing `x` or `y`: generated (seeded), as for an edge list, and said in the report; no split at all: a
seeded random one. Of a HeteroData, one node type is imported with the edges of its relations to itself
(`--node-type`: ogbn-mag's papers and their citations); a `y` [N, C] of 0/1 is multi-label targets. A split
given in part, several graphs or a HeteroData without a node type chosen are refused, naming the file and the
attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import MomentError
from moment.workload.graph import SPLITS, GraphDataset
from moment.workload.import_files import need
from moment.workload.import_options import EdgePolicy, random_split_shares
from moment.workload.importers import GraphParts, Progress, write_parts
from moment.workload.torch_files import load_torch

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

#: the attribute names a split may have in a PyG graph, masks first (PyG's own datasets use masks)
SPLIT_ATTRS = {
    "train": ("train_mask", "train_idx"),
    "val": ("val_mask", "valid_mask", "val_idx", "valid_idx"),
    "test": ("test_mask", "test_idx"),
}


def pyg_store(obj: Any, source: str, node_type: str | None = None) -> dict[str, Any]:
    """The attributes of the one graph a PyG file holds: a `Data`, an `InMemoryDataset`'s processed tuple
    ((data or its dict, slices) or (dict, slices, class)), or a plain dict with `edge_index`; of a
    `HeteroData`, `node_type`'s (`one_node_type`)."""
    slices = None
    cls_name = type(obj).__name__
    if isinstance(obj, tuple) and len(obj) in (2, 3):
        data, slices = obj[0], obj[1]
        if len(obj) == 3:
            cls_name = getattr(obj[2], "__name__", str(obj[2]))
        else:
            cls_name = type(data).__name__
        obj = data
    hetero = cls_name == "HeteroData" or type(obj).__name__ == "HeteroData"
    if not hetero and node_type is not None:
        raise MomentError(f"a node type ({node_type!r}) is given, but the graph is a {cls_name} (one node type): "
                          "a node type chooses among a HeteroData's", source=source)
    if isinstance(slices, dict) and slices:
        flat = [w for v in slices.values() for w in (v.values() if isinstance(v, dict) else [v])]  # HeteroData's nest
        counts = {int(len(v)) - 1 for v in flat if hasattr(v, "__len__")}
        if counts and max(counts) > 1:
            raise MomentError(f"an InMemoryDataset with {max(counts)} graphs: Moment imports one graph "
                              "(node classification); save the one to import: torch.save(dataset[i], path)",
                              source=source)
    if hetero:
        return one_node_type(dict(obj.to_dict() if hasattr(obj, "to_dict") and not isinstance(obj, dict) else obj),
                             node_type, source)
    if hasattr(obj, "to_dict") and not isinstance(obj, dict):
        store = dict(obj.to_dict())
        if "num_nodes" not in store and getattr(obj, "__num_nodes__", None) is not None:  # PyG 1.x's Data
            store["num_nodes"] = obj.__num_nodes__
        return store
    if isinstance(obj, dict) and ("edge_index" in obj or "adj_t" in obj):
        return dict(obj)
    raise MomentError(f"holds a {type(obj).__name__}: expected a torch_geometric Data, an InMemoryDataset's "
                      "processed file, or a dict with edge_index", source=source)


#: the key under which `one_node_type` tells the importer what it took (popped before the graph is read)
TAKEN = "_moment_taken"


def one_node_type(store: dict[Any, Any], node_type: str | None, source: str) -> dict[str, Any]:
    """One node type of a HeteroData's attributes, as a homogeneous graph: that type's attributes and the
    edges of every relation from it to itself (e.g. ogbn-mag's paper-cites-paper), joined.

    Why one type: Moment trains node classification on one graph; its relations to other types (authors,
    fields) would need a heterogeneous model, so they are left out and the report names what was taken."""
    types = [k for k, v in store.items() if isinstance(k, str) and not k.startswith("_") and isinstance(v, dict)]
    relations = [k for k in store if isinstance(k, tuple) and len(k) == 3]
    if node_type is None:
        labelled = [t for t in types if store[t].get("y") is not None]
        raise MomentError(f"holds a HeteroData (node types: {', '.join(types)}): choose the one to train on",
                          source=source, hint=f"--node-type {(labelled or types or ['TYPE'])[0]} (node_type= in "
                          "Python; the node types with labels: " + (", ".join(labelled) or "none") + ")")
    if node_type not in types:
        raise MomentError(f"no node type {node_type!r} (its node types: {', '.join(types) or 'none'})", source=source)
    own = [r for r in relations if r[0] == node_type and r[2] == node_type and store[r].get("edge_index") is not None]
    if not own:
        names = ", ".join("__".join(r) for r in relations) or "none"
        raise MomentError(f"no relation from {node_type} to {node_type} (its edge types: {names}): Moment trains on "
                          "one node type's own edges", source=source)
    out = dict(store[node_type])
    ei = [as_array(store[r]["edge_index"], f"{source}:{'__'.join(r)}", "edge_index") for r in own]
    out["edge_index"] = ei[0] if len(ei) == 1 else np.concatenate([e.astype(np.int64) for e in ei], axis=1)
    out[TAKEN] = {"node_type": node_type, "relations": ["__".join(r) for r in own]}
    return out


def as_array(value: Any, source: str, name: str) -> np.ndarray:
    """A tensor (or array) attribute as a numpy array sharing its memory (a memory-mapped tensor stays mapped)."""
    if isinstance(value, np.ndarray):
        return value
    import torch

    if not isinstance(value, torch.Tensor):
        raise MomentError(f"{name} is a {type(value).__name__}: expected a tensor", source=source)
    if value.layout != torch.strided:
        raise MomentError(f"{name} is a sparse tensor ({value.layout}): expected a dense one", source=source)
    if value.is_meta:
        raise MomentError(f"{name} is a meta tensor: it has a shape but no data to import", source=source)
    t = value.detach().cpu().as_subclass(torch.Tensor)
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as e:  # bfloat16 and other types numpy has not
        raise MomentError(f"{name} has dtype {t.dtype}, which numpy cannot hold ({e}): store it as float32 "
                          "or float16", source=source) from None


#: names other libraries and scripts give a graph's features and labels (DGL's ndata['feat'], ndata['label'])
_OTHER_NAMES = {"x": ("feat", "features", "X", "node_feat", "feats"), "y": ("label", "labels", "Y", "node_label")}
_MEANS = {"x": "node features", "y": "labels"}


def pyg_parts(store: dict[str, Any], path: str) -> GraphParts:
    """`GraphParts` from a PyG graph's attributes; sources name the file and the attribute (`data.pt:x`)."""
    if "edge_index" not in store:
        hint = " (it has adj_t: save the graph before ToSparseTensor)" if "adj_t" in store else ""
        raise MomentError(f"no attribute edge_index{hint}", source=path)

    def get(name: str) -> np.ndarray | None:
        v = store.get(name)
        return None if v is None else as_array(v, f"{path}:{name}", name)

    for attr, others in _OTHER_NAMES.items():  # else features or labels would be drawn at random: trained on noise
        named = [a for a in others if store.get(a) is not None]
        if store.get(attr) is None and named:
            raise MomentError(f"has no attribute {attr} but has {' and '.join(named)}: the {_MEANS[attr]} are read "
                              f"from {attr} (without it they would be drawn at random)", source=f"{path}:{named[0]}",
                              hint=f"name them {attr} (DGL's ndata[{named[0]!r}] is PyG's {attr})")
    nn = store.get("num_nodes")
    if nn is not None and not isinstance(nn, int | np.integer):
        nn = int(as_array(nn, f"{path}:num_nodes", "num_nodes").reshape(-1)[0])
    found: list[tuple[str, np.ndarray]] = []
    for part in SPLITS:
        there = [a for a in SPLIT_ATTRS[part] if store.get(a) is not None]
        if len(there) > 1:
            raise MomentError(f"the {part} split is given twice ({' and '.join(there)}): keep one", source=path)
        if there:
            found.append((there[0], _as_mask(there[0], get(there[0]), path)))
    if found and len(found) < len(SPLITS):
        have = {n for n, _ in found}
        missing = [f"no {p} split ({', '.join(SPLIT_ATTRS[p])})" for p in SPLITS if not have & set(SPLIT_ATTRS[p])]
        raise MomentError(f"has {', '.join(sorted(have))} but {' and '.join(missing)}: give all three splits or "
                          "none (none: a seeded random split)", source=path)
    return GraphParts(
        edges=get("edge_index"), edges_source=f"{path}:edge_index",
        num_nodes=None if nn is None else int(nn), num_nodes_source=f"{path}:num_nodes",
        features=get("x"), features_source=f"{path}:x",
        labels=get("y"), labels_source=f"{path}:y",
        splits=[a for _, a in found] or None, split_sources=[f"{path}:{n}" for n, _ in found] or None,
    )


def _as_mask(name: str, a: np.ndarray, path: str) -> np.ndarray:
    """A `*_mask` attribute of 0/1 integers (`torch.uint8`, as PyG's masks were before torch 1.2, or `.long()`)
    as the boolean mask it names: read as ids, its zeros were node 0 listed again and again."""
    if not name.endswith("_mask") or a.dtype.kind not in "iu":
        return a
    if a.size and (int(a.min()) < 0 or int(a.max()) > 1):
        raise MomentError(f"{name} has dtype {a.dtype} with values other than 0 and 1: a mask holds one "
                          "true or false a node", source=f"{path}:{name}", hint=f"save ids as {name[:-5]}_idx")
    return a.astype(bool)


def import_pyg(
    path: str | Path,
    out_dir: str | Path,
    *,
    trust_pickle: bool = False,
    node_type: str | None = None,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    feature_dim: int = 128,
    num_classes: int = 2,
    seed: int = 0,
    fractions: tuple[float, ...] | str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports a PyG `Data` file or a one-graph `InMemoryDataset` processed file (see the module docstring);
    of a `HeteroData`, `node_type`'s own graph. `feature_dim`, `num_classes`, `seed` and `fractions` only shape
    what the file lacks."""
    f = need(Path(path), "PyG data file")
    store = pyg_store(load_torch(f, "the PyG data file", trust=trust_pickle), str(f), node_type)
    src = {"importer": "pyg", "from": str(f.resolve()), "undirected": undirected, **store.pop(TAKEN, {})}
    return write_parts(pyg_parts(store, str(f)), out_dir, source=src, undirected=undirected, policy=policy,
                       feature_dim=feature_dim, num_classes=num_classes, seed=seed, fractions=fractions,
                       overwrite=overwrite, progress=progress)


def import_graph(
    graph: Any,
    out: str | Path,
    *,
    node_type: str | None = None,
    undirected: bool = False,
    duplicates: str = EdgePolicy.duplicates,
    self_loops: str = EdgePolicy.self_loops,
    feature_dim: int = 128,
    seed: int = 0,
    random_split: Sequence[float] | None = None,
    overwrite: bool = False,
) -> GraphDataset:
    """A graph held in memory -> a dataset directory at `out`, as `moment data import pyg` makes from a file.

    Why: a PyG user's graph is usually an object in a script (`Reddit(root)[0]`), not a file; saving it only to
    import it again costs a copy of its features. `graph` is a PyG `Data`, a PyG dataset of one graph, or a
    dict of the same attribute names (`edge_index`, `x`, `y`, the split's masks or index tensors, `num_nodes`)
    to tensors or NumPy arrays; of a `HeteroData`, `node_type`'s own graph (`one_node_type`). Messages name an
    attribute as `Data:x` (the object's type; `graph:x` for a dict). `random_split`: train, val and test shares
    of the labelled nodes for a graph without a split (default `RANDOM_SPLIT`, about 1% train)."""
    if isinstance(graph, str | Path):
        raise MomentError(f"import_graph takes a graph in memory; {str(graph)!r} is a path",
                          hint="`moment data import pyg PATH --out DIR` imports a file")
    if not isinstance(undirected, bool | np.bool_):  # ("false" is true: its edges were doubled, "false" recorded)
        raise MomentError(f"import_graph(undirected={undirected!r}): must be True or False")
    name = "graph" if isinstance(graph, dict) else type(graph).__name__
    if callable(getattr(graph, "len", None)) and callable(getattr(graph, "get", None)):  # a PyG Dataset
        if graph.len() != 1:
            raise MomentError(f"a {name} of {graph.len()} graphs: import one graph (node classification), "
                              "e.g. dataset[0]", source=name)
        graph = graph[0]
        name = type(graph).__name__
    store = pyg_store(graph, name, node_type)
    src = {"importer": "pyg", "from": f"a {name} in memory", "undirected": undirected, **store.pop(TAKEN, {})}
    parts = pyg_parts(store, name)
    shares = None if random_split is None else random_split_shares(random_split, parts.splits is not None,
                                                                   "random_split=")
    return write_parts(parts, out, source=src, undirected=undirected,
                       policy=EdgePolicy(duplicates=duplicates, self_loops=self_loops), feature_dim=feature_dim,
                       seed=seed, fractions=shares, overwrite=overwrite)
