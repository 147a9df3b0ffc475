"""Importing a graph in GraphSAINT's release format: `adj_full.npz` (a SciPy sparse adjacency), `feats.npy`
[N, D], `class_map.json` ({node id: class}) and `role.json` ({"tr": ids, "va": ids, "te": ids}).

Why: Flickr, Reddit, PPI, Yelp and Amazon are published this way by GraphSAINT's authors, and PyG's `Flickr`
and `Reddit2` datasets download exactly these four files into their `raw/` folder; they are the common
mid-size benchmarks of sampled training, in neither PyG's processed form nor OGB's. The split is kept as
given. A class map of one-hot lists is read as its classes; a multi-label one (PPI, Yelp, Amazon: several
1s a node) is refused, naming a node, since Moment's models are single-label classifiers. The adjacency is
symmetric in these releases, so no reverse edges are added unless asked.
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
    """{node id: class or one-hot list} -> labels [n], -1 for a node the map leaves out (unlabelled)."""
    if not isinstance(class_map, dict):
        raise MomentError("expected an object mapping node ids to classes", source=source)
    labels = np.full(n, -1, dtype=np.int64)
    for key, value in class_map.items():
        try:
            node = int(key)
        except ValueError:
            raise MomentError(f"node id {key!r} is not an integer", source=source) from None
        if not 0 <= node < n:
            raise MomentError(f"node id {node} out of range [0, {n}) (the adjacency's nodes)", source=source)
        labels[node] = _class_of(value, node, source)
    return labels


def _class_of(value: object, node: int, source: str) -> int:
    if isinstance(value, list):
        ones = [i for i, v in enumerate(value) if v]
        if len(ones) != 1:
            raise MomentError(f"node {node} has {len(ones)} classes set ({len(value)}-entry list): a multi-label "
                              "dataset; Moment trains single-label classification", source=source)
        return ones[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MomentError(f"node {node}'s class is {value!r}: expected a class number (0 or more) or a one-hot "
                          "list", source=source)
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
