"""Importing a graph in GraphSAINT's release format: `adj_full.npz` (a SciPy sparse adjacency), `feats.npy`
[N, D], `class_map.json` ({node id: class}) and `role.json` ({"tr": ids, "va": ids, "te": ids}).

Why: Flickr, Reddit, PPI, Yelp and Amazon are published this way by GraphSAINT's authors, and PyG's `Flickr`
and `Reddit2` datasets download exactly these four files into their `raw/` folder; they are the common
mid-size benchmarks of sampled training, in neither PyG's processed form nor OGB's. The split is kept as
given. A class map of one-hot lists is read as one class a node; one with several 1s a node (PPI, Yelp,
Amazon) as multi-label targets. The adjacency is symmetric in these releases, so no reverse edges are added
unless asked.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moment.errors import MomentError
from moment.inputs import check_dir
from moment.workload.graph import GraphDataset
from moment.workload.import_files import load_npy, load_sparse_edges, need
from moment.workload.import_options import EdgePolicy
from moment.workload.importers import GraphParts, Progress, write_parts

#: the files of a release, as GraphSAINT names them
FILES = {"adjacency": "adj_full.npz", "features": "feats.npy", "classes": "class_map.json", "roles": "role.json"}
#: role.json's keys for train, val and test
ROLES = ("tr", "va", "te")


def import_saint(
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports one GraphSAINT dataset directory (see the module docstring)."""
    root = check_dir(src_dir, "GraphSAINT dataset directory")
    paths = {k: need(root / name, f"{k} ({name})") for k, name in FILES.items()}  # every file before any is read
    edges, n = load_sparse_edges(paths["adjacency"], "adjacency")
    labels = class_labels(_json(paths["classes"]), n, str(paths["classes"]))
    roles = _json(paths["roles"])
    if not isinstance(roles, dict) or any(r not in roles for r in ROLES):
        raise MomentError('expected an object with the node ids of each role: {"tr": [...], "va": [...], '
                          '"te": [...]}', source=str(paths["roles"]))
    splits = [_ids(roles[r], str(paths["roles"]), r) for r in ROLES]
    parts = GraphParts(
        edges=edges, edges_source=str(paths["adjacency"]), num_nodes=n, num_nodes_source=str(paths["adjacency"]),
        features=load_npy(paths["features"], "features"), features_source=str(paths["features"]),
        labels=labels, labels_source=str(paths["classes"]),
        splits=splits, split_sources=[f"{paths['roles']} ({r})" for r in ROLES],
    )
    src = {"importer": "graphsaint", "from": str(root.resolve()), "undirected": undirected}
    return write_parts(parts, out_dir, source=src, undirected=undirected, policy=policy, overwrite=overwrite,
                       progress=progress)


def class_labels(class_map: object, n: int, source: str) -> np.ndarray:
    """{node id: class} -> labels [n] (-1 for a node the map leaves out: unlabelled); {node id: 0/1 list} ->
    the same when every node has exactly one class (one-hot), else multi-label targets [n, C]."""
    if not isinstance(class_map, dict):
        raise MomentError("expected an object mapping node ids to classes", source=source)
    nodes = np.array([_node(k, n, source) for k in class_map], dtype=np.int64)
    values = list(class_map.values())
    if not values or not isinstance(values[0], list):
        labels = np.full(n, -1, dtype=np.int64)
        labels[nodes] = [_class_of(v, int(u), source) for u, v in zip(nodes, values)]
        return labels
    width = len(values[0])
    for u, v in zip(nodes, values):
        if not isinstance(v, list) or len(v) != width:
            raise MomentError(f"node {u}'s classes are {_short(v)}: expected a list of {width} 0/1 entries, as "
                              "the first node's", source=source)
    try:
        raw = np.asarray(values)
    except ValueError:  # lists within the lists
        raise MomentError("the class lists must hold 0/1 numbers", source=source) from None
    bad = ~((raw == 0) | (raw == 1)) if raw.dtype.kind in "biuf" and raw.ndim == 2 else np.ones((1, 1), bool)
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        what = f"node {int(nodes[i])}'s target {j} is {raw[i, j].item()!r}" if raw.ndim == 2 else "they are not"
        raise MomentError(f"the class lists must hold 0/1 numbers: {what}", source=source)
    if (raw.sum(axis=1) == 1).all():  # one-hot: one class a node
        labels = np.full(n, -1, dtype=np.int64)
        labels[nodes] = raw.argmax(axis=1)
        return labels
    if nodes.size != n:
        missing = n - nodes.size
        raise MomentError(f"a multi-label class map must give every node its classes: {missing:,} of the {n:,} "
                          f"nodes {'has' if missing == 1 else 'have'} none", source=source)
    targets = np.zeros((n, width), dtype=np.uint8)
    targets[nodes] = raw
    return targets


def _node(key: str, n: int, source: str) -> int:
    try:
        node = int(key)
    except ValueError:
        raise MomentError(f"node id {key!r} is not an integer", source=source) from None
    if not 0 <= node < n:
        raise MomentError(f"node id {node} out of range [0, {n}) (the adjacency's nodes)", source=source)
    return node


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _class_of(value: object, node: int, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MomentError(f"node {node}'s class is {_short(value)}: expected a class number (0 or more), as the "
                          "first node's", source=source)
    return value


def _ids(value: object, source: str, role: str) -> np.ndarray:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise MomentError(f'"{role}" must be a list of integer node ids', source=source)
    return np.asarray(value, dtype=np.int64)


def _json(path: Path) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise MomentError(f"cannot read it: {e.strerror}", source=str(path)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise MomentError(f"not valid JSON: {str(e).splitlines()[0]}", source=str(path)) from None
