"""OGB node-property-prediction datasets: the raw download (`raw/`: CSV or NPZ) through the CSR build of
`moment.workload.importers`, or what ogb's loaders wrote under `processed/`
(`moment.workload.import_ogb_processed`); `ogb_layout` says which one a directory holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moment.errors import NPZ_ERRORS, MomentError
from moment.inputs import check_dir, exists
from moment.workload.graph import SPLITS, GraphDataset, GraphWriter
from moment.workload.import_files import need, read_csv_chunks, read_node_ids
from moment.workload.import_options import OGB_LAYOUTS, EdgePolicy, check_choice
from moment.workload.import_ogb_hetero import import_ogb_hetero, is_hetero
from moment.workload.importers import (PROCESSED_FILES, Progress, _edge_chunks, _finish, _labels_to_int,
                                       _matrix_chunks, _write_features, build_csr, ogb_split_dir, ogb_split_files,
                                       read_csv_labels, write_csv_graph)

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.


def ogb_layout(root: Path, layout: str = "auto") -> str:
    """"raw" or "processed": `auto` reads raw/ when it holds the edge list (streamed, the download's own
    files), else processed/ when ogb's loaders left a file there."""
    if check_choice("layout", layout, OGB_LAYOUTS) != "auto":
        return layout
    raw = root / "raw"
    if (raw / "data.npz").is_file() or (raw / "edge.csv.gz").is_file() or is_hetero(root):
        return "raw"
    return "processed" if any((root / "processed" / f).is_file() for f in PROCESSED_FILES) else "raw"


def import_ogb(
    src_dir: str | Path,
    out_dir: str | Path,
    *,
    split_name: str | None = None,
    layout: str = "auto",
    node_type: str | None = None,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    trust_pickle: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports an unzipped OGB node-property-prediction dataset: the raw CSV or NPZ layout, or processed/
    (see `ogb_layout`); the split from split/<scheme>/ as given. A heterogeneous raw download (ogbn-mag):
    `node_type`'s graph (moment.workload.import_ogb_hetero)."""
    root = check_dir(src_dir, "OGB dataset directory")
    if ogb_layout(root, layout) == "processed":
        from moment.workload.import_ogb_processed import import_ogb_processed

        return import_ogb_processed(root, out_dir, split_name=split_name, undirected=undirected, policy=policy,
                                    trust_pickle=trust_pickle, overwrite=overwrite, progress=progress)
    if is_hetero(root):  # raw/ (processed/ returned above)
        return import_ogb_hetero(root, out_dir, node_type=node_type, split_name=split_name, undirected=undirected,
                                 policy=policy, overwrite=overwrite, progress=progress)
    if node_type is not None:
        raise MomentError(f"a node type ({node_type!r}) is given, but this OGB dataset has one node type",
                          source=str(root))
    raw = root / "raw"
    npz = raw / "data.npz"
    if not npz.is_file():
        if not exists(raw / "edge.csv.gz"):
            raise MomentError("missing edge list (raw/edge.csv.gz or raw/data.npz)", source=str(raw / "edge.csv.gz"),
                              hint="a dataset ogb's loaders already processed is read from processed/ "
                                   "(--layout processed)")
        need(raw / "edge.csv.gz", "edge list (raw/edge.csv.gz or raw/data.npz)")
    split_dir = ogb_split_dir(root, split_name)
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        if npz.is_file():
            try:
                data = np.load(npz, allow_pickle=False)
                ei, feat = data["edge_index"], data["node_feat"]
            except NPZ_ERRORS as e:
                raise MomentError(f"need arrays edge_index and node_feat: {e}", source=str(npz)) from None
            lab_path = need(raw / "node-label.npz", "node labels (node-label.npz)")
            try:
                labels = _labels_to_int(np.load(lab_path, allow_pickle=False)["node_label"], str(lab_path))
            except NPZ_ERRORS as e:
                raise MomentError(f"need array node_label: {e}", source=str(lab_path)) from None
            if ei.ndim != 2 or ei.shape[0] != 2:
                raise MomentError(f"edge_index must have shape [2, E], got {list(ei.shape)}", source=str(npz))
            if feat.ndim != 2:
                raise MomentError(f"node_feat must have shape [N, D], got {list(feat.shape)}", source=str(npz))
            n = feat.shape[0]
            if labels.shape[0] != n:
                raise MomentError(f"{labels.shape[0]} labels for {n} nodes", source=str(lab_path))
            rep = build_csr(w, lambda: _edge_chunks(ei, "cols"), n, source=f"{npz}:edge_index",
                            undirected=undirected, policy=policy, progress=progress)
            _write_features(w, _matrix_chunks(feat), n, f"{npz}:node_feat")
            kind = "ogb-npz"
        else:
            edge_csv = need(raw / "edge.csv.gz", "edge list (raw/edge.csv.gz or raw/data.npz)")
            lab_csv = need(raw / "node-label.csv.gz", "node labels")
            feat_csv = need(raw / "node-feat.csv.gz", "node features")
            labels = read_csv_labels(lab_csv)
            n = labels.shape[0]
            nn_file = raw / "num-node-list.csv.gz"
            if nn_file.is_file():
                declared = int(next(read_csv_chunks(nn_file, 16, "int64"))[0, 0])
                if declared != n:
                    raise MomentError(f"says {declared} nodes but node-label.csv.gz has {n} rows", source=str(nn_file))
            rep = write_csv_graph(w, [edge_csv], feat_csv, n, undirected=undirected, policy=policy,
                                  progress=progress)
            kind = "ogb-csv"
        files = ogb_split_files(split_dir)
        splits = [read_node_ids(f, n, f"{part} split") for f, part in zip(files, SPLITS)]
        src = {"importer": kind, "from": str(root.resolve()), "split": split_dir.name, "undirected": undirected}
        return _finish(w, labels, splits, None, src, [str(raw / "node-label"), *map(str, files)], rep, policy)
