"""One node type of a heterogeneous OGB node-property dataset's raw download (ogbn-mag): its features, labels
and split, and the edges of every relation from it to itself (`raw/relations/paper___cites___paper/`), joined.

Why one type: Moment trains node classification on one graph, as with a PyG `HeteroData`
(moment.workload.import_pyg.one_node_type); ogbn-mag's papers with their citations are how its
homogeneous baselines train. The layout is ogb's `read_heterograph_raw`: `raw/num-node-dict.csv.gz` (a header of
node types, a row of counts), `raw/relations/<src>___<rel>___<dst>/edge.csv.gz`,
`raw/node-feat/<type>/node-feat.csv.gz`, `raw/node-label/<type>/node-label.csv.gz` and
`split/<scheme>/<type>/{train,valid,test}.csv.gz`.
"""

from __future__ import annotations

from pathlib import Path

from moment.errors import MomentError
from moment.workload.graph import SPLITS, GraphDataset, GraphWriter
from moment.workload.import_files import need, read_node_ids
from moment.workload.import_options import EdgePolicy
from moment.workload.importers import (Progress, _finish, ogb_split_dir, ogb_split_files, read_csv_labels,
                                       write_csv_graph)

# Imports inside functions: pandas loads only to read the node counts' header.

#: the file that marks a heterogeneous raw download: the node types and their counts
NODE_COUNTS = "num-node-dict.csv.gz"


def is_hetero(root: Path) -> bool:
    return (root / "raw" / NODE_COUNTS).is_file()


def node_counts(root: Path) -> dict[str, int]:
    """{node type: count} from raw/num-node-dict.csv.gz."""
    import pandas as pd

    path = root / "raw" / NODE_COUNTS
    try:
        frame = pd.read_csv(path)
        return {str(k): int(v) for k, v in frame.iloc[0].items()}
    except (ValueError, IndexError, OSError) as e:
        raise MomentError(f"cannot read the node types and counts: {str(e).splitlines()[0]}",
                          source=str(path)) from None


def import_ogb_hetero(
    root: Path,
    out_dir: str | Path,
    *,
    node_type: str | None,
    split_name: str | None = None,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports `node_type` of the raw download at `root` (see the module docstring)."""
    raw = root / "raw"
    counts = node_counts(root)
    label_dir = raw / "node-label"
    labelled = sorted(p.name for p in label_dir.iterdir() if p.is_dir()) if label_dir.is_dir() else []
    if node_type is None:
        raise MomentError(f"a heterogeneous OGB dataset (node types: {', '.join(counts)}): choose the one to train on",
                          source=str(raw / NODE_COUNTS), hint=f"--node-type {(labelled or list(counts))[0]} (the "
                          f"node types with labels: {', '.join(labelled) or 'none'})")
    if node_type not in counts:
        raise MomentError(f"no node type {node_type!r} (its node types: {', '.join(counts)})",
                          source=str(raw / NODE_COUNTS))
    rel_dir = raw / "relations"
    relations = sorted(p for p in rel_dir.iterdir() if p.is_dir()) if rel_dir.is_dir() else []
    own = [p for p in relations if p.name.split("___")[0] == node_type == p.name.split("___")[-1]]
    if not own:
        names = ", ".join(p.name for p in relations) or "none"
        raise MomentError(f"no relation from {node_type} to {node_type} (its relations: {names}): Moment trains on "
                          "one node type's own edges", source=str(rel_dir))
    n = counts[node_type]
    edge_files = [need(p / "edge.csv.gz", "edge list") for p in own]
    lab_csv = need(raw / "node-label" / node_type / "node-label.csv.gz", f"{node_type}'s labels")
    feat_csv = need(raw / "node-feat" / node_type / "node-feat.csv.gz", f"{node_type}'s features")
    split_dir = ogb_split_dir(root, split_name)
    files = ogb_split_files(split_dir / node_type)
    labels = read_csv_labels(lab_csv)
    if labels.shape[0] != n:
        raise MomentError(f"{labels.shape[0]} labels for {n} {node_type} nodes ({NODE_COUNTS})", source=str(lab_csv))
    with GraphWriter(out_dir, overwrite=overwrite) as w:
        rep = write_csv_graph(w, edge_files, feat_csv, n, undirected=undirected, policy=policy, progress=progress,
                              nodes_from=f"{n} {node_type} nodes in {NODE_COUNTS}")
        splits = [read_node_ids(f, n, f"{part} split") for f, part in zip(files, SPLITS)]
        src = {"importer": "ogb-csv", "from": str(root.resolve()), "split": split_dir.name, "undirected": undirected,
               "node_type": node_type, "relations": [p.name for p in own]}
        return _finish(w, labels, splits, None, src, [str(lab_csv), *map(str, files)], rep, policy)
