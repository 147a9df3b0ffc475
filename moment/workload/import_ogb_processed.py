"""Importing an OGB node-property-prediction dataset from the `processed/` directory ogb's loaders write
beside `raw/` (some copies of a dataset keep only that):

* `processed/geometric_data_processed.pt` (`PygNodePropPredDataset`): `torch.save(InMemoryDataset.collate([data]))`,
  a `Data` with `edge_index` [2, E], `x` [N, D], `y` [N, 1] (float with NaN where unlabelled) and `num_nodes`;
  memory-mapped, so `x` is read in chunks.
* `processed/data_processed` (`NodePropPredDataset`): `torch.save({'graph': {'edge_index', 'edge_feat',
  'node_feat', 'num_nodes'}, 'labels': [N, 1]}, pickle_protocol=4)`, numpy arrays inside the pickle, so the
  whole file is read into memory (a dataset larger than memory: import raw/ instead).

The split comes from `split/<scheme>/{train,valid,test}.csv.gz`, as ogb's `get_idx_split` reads it. Edges
are taken as stored: ogb already added the reverse edges of `add_inverse_edge` datasets when it processed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from moment.errors import MomentError
from moment.workload.graph import GraphDataset
from moment.workload.import_options import EdgePolicy
from moment.workload.import_pyg import pyg_parts, pyg_store
from moment.workload.importers import (PROCESSED_FILES, GraphParts, Progress, ogb_split_dir, ogb_split_files,
                                       write_parts)
from moment.workload.torch_files import load_numpy_pickle, load_torch

__all__ = ["PROCESSED_FILES", "import_ogb_processed", "ogb_graph_parts"]


def ogb_graph_parts(obj: Any, path: str) -> GraphParts:
    """`GraphParts` from `NodePropPredDataset`'s {'graph': ..., 'labels': ...} dict."""
    if not isinstance(obj, dict) or not isinstance(obj.get("graph"), dict) or "labels" not in obj:
        raise MomentError(f"holds a {type(obj).__name__}: expected ogb's {{'graph': {{...}}, 'labels': ...}} dict",
                          source=path)
    g, labels = obj["graph"], obj["labels"]
    if "edge_index_dict" in g or isinstance(labels, dict):
        raise MomentError("a heterogeneous OGB graph (several node types): Moment imports one node type, from "
                          "the raw download", source=path, hint="--layout raw --node-type TYPE (ogbn-mag: paper)")
    for key in ("edge_index", "num_nodes"):
        if g.get(key) is None:
            raise MomentError(f"graph has no {key}", source=f"{path}:graph")
    arrays = {"edge_index": g["edge_index"], "node_feat": g.get("node_feat"), "labels": labels}
    for key, a in arrays.items():
        if a is not None and not isinstance(a, np.ndarray):
            raise MomentError(f"{key} is a {type(a).__name__}: expected a numpy array", source=f"{path}:{key}")
    return GraphParts(
        edges=g["edge_index"], edges_source=f"{path}:graph.edge_index",
        num_nodes=int(g["num_nodes"]), num_nodes_source=f"{path}:graph.num_nodes",
        features=g.get("node_feat"), features_source=f"{path}:graph.node_feat",
        labels=labels, labels_source=f"{path}:labels",
    )


def import_ogb_processed(
    root: Path,
    out_dir: str | Path,
    *,
    split_name: str | None = None,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    trust_pickle: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports `root/processed/` (the first of PROCESSED_FILES present) with the split of `root/split/`."""
    found = [root / "processed" / f for f in PROCESSED_FILES if (root / "processed" / f).is_file()]
    if not found:
        raise MomentError(f"no processed dataset ({' or '.join(PROCESSED_FILES)})", source=str(root / "processed"),
                          hint="the download's raw/ directory is read with --layout raw")
    f = found[0]
    split_dir = ogb_split_dir(root, split_name)
    files = ogb_split_files(split_dir)
    if f.name == PROCESSED_FILES[0]:
        parts = pyg_parts(pyg_store(load_torch(f, "ogb's processed PyG file", trust=trust_pickle), str(f)), str(f))
        kind = "ogb-pyg-processed"
    else:
        parts = ogb_graph_parts(load_numpy_pickle(f, "ogb's processed file", trust=trust_pickle), str(f))
        kind = "ogb-processed"
    if parts.labels is None:
        raise MomentError("no labels (y)", source=parts.labels_source)
    parts.splits, parts.split_sources = list(files), [str(p) for p in files]
    src = {"importer": kind, "from": str(root.resolve()), "split": split_dir.name, "undirected": undirected}
    return write_parts(parts, out_dir, source=src, undirected=undirected, policy=policy, overwrite=overwrite,
                       progress=progress)
