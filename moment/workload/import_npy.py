"""Importing a graph held as loose `.npy` arrays: `edge_index` [2, E] or [E, 2] (or a SciPy sparse adjacency,
`.npz`), features [N, D], labels [N] (or [N, 1]) and train/val/test node ids or boolean masks.

Why: the arrays PyG and OGB users already have (`data.x.numpy()`, `np.save`) are the cheapest way in, and
features larger than memory stay that way: every array is memory-mapped (`np.load(mmap_mode="r")`) and
the features are copied in chunks, never loaded whole. numpy (scipy for an `.npz`).
"""

from __future__ import annotations

from pathlib import Path

from moment.errors import MomentError
from moment.workload.graph import GraphDataset
from moment.workload.import_files import is_zip, load_npy, load_sparse_edges, need
from moment.workload.import_options import EdgePolicy, check_node_count
from moment.workload.importers import GraphParts, Progress, write_parts


def import_npy(
    out_dir: str | Path,
    *,
    edge_index: str | Path,
    x: str | Path | None = None,
    y: str | Path | None = None,
    train_idx: str | Path | None = None,
    val_idx: str | Path | None = None,
    test_idx: str | Path | None = None,
    num_nodes: int | None = None,
    undirected: bool = False,
    policy: EdgePolicy = EdgePolicy(),
    feature_dim: int = 128,
    num_classes: int = 2,
    seed: int = 0,
    fractions: tuple[float, ...] | str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> GraphDataset:
    """Imports `.npy` arrays (see the module docstring). Without `x`/`y`, features/labels are generated
    (seeded); the split is the three files given, or a seeded random one when none is."""
    check_node_count(num_nodes)
    e = Path(edge_index)
    splits = [None if p is None else Path(p) for p in (train_idx, val_idx, test_idx)]
    given = [s for s in splits if s is not None]
    if given and len(given) < 3:
        missing = [f for f, s in zip(("--train-idx", "--val-idx", "--test-idx"), splits) if s is None]
        raise MomentError(f"give the three split files or none (none: a seeded random split); missing "
                          f"{', '.join(missing)}")
    for p, what in ((e, "edge index file"), (x, "features file"), (y, "labels file"), *[(s, "split file") for s in given]):
        if p is not None:
            need(Path(p), what)  # every input before anything is read
    nodes_source = "--num-nodes"
    if is_zip(e):  # an adjacency saved with scipy.sparse.save_npz: its shape is the node count
        edges, n = load_sparse_edges(e, "edge index file")
        if num_nodes is not None and num_nodes != n:
            raise MomentError(f"--num-nodes {num_nodes}, but the adjacency is {n} x {n}", source=str(e))
        num_nodes, nodes_source = n, str(e)
    else:
        edges = load_npy(e, "edge index file")
    parts = GraphParts(
        edges=edges, edges_source=str(e),
        num_nodes=num_nodes, num_nodes_source=nodes_source,
        features=None if x is None else load_npy(Path(x), "features file"), features_source=str(x),
        labels=None if y is None else load_npy(Path(y), "labels file"), labels_source=str(y) if y else "",
        splits=given or None, split_sources=[str(s) for s in given] or None,
    )
    src = {"importer": "npy", "from": str(e.resolve()), "undirected": undirected}
    return write_parts(parts, out_dir, source=src, undirected=undirected, policy=policy, feature_dim=feature_dim,
                       num_classes=num_classes, seed=seed, fractions=fractions, overwrite=overwrite,
                       progress=progress)
