"""`moment data …`: make, import, inspect and pre-sample graph datasets."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from moment.cli import app, console
from moment.cli.common import parse_fanouts, progress_bar
from moment.outputs import check_output
from moment.workload.import_options import EDGE_CHOICES, OGB_LAYOUTS, RANDOM_SPLIT_HELP, EdgePolicy
from moment.workload.spec import FANOUTS_HELP

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

data_app = typer.Typer(
    help="Graph datasets: generate synthetic ones, import yours (PyG, OGB, IGB, GraphSAINT, arrays, edge lists), "
    "inspect, and pre-sample to measure which node features training reads most (the input to data placement).",
    no_args_is_help=True,
)
import_app = typer.Typer(
    help="Convert a dataset into Moment's on-disk format (CSR + features as .npy + manifest): OGB, IGB, "
    "GraphSAINT, a PyG Data file, loose .npy arrays (or a SciPy sparse adjacency) or an edge list (text or "
    "Parquet, with node and label tables). A split that "
    "comes with the data is kept as given; duplicate edges and self-loops are counted and kept or dropped "
    "(--duplicates, --self-loops). The output appears only when complete.",
    no_args_is_help=True,
)
data_app.add_typer(import_app, name="import")
app.add_typer(data_app, name="data", help="Graph datasets: synth, import, info, presample.")


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


def _print_summary(s: dict[str, Any], title: str) -> None:
    from rich.table import Table

    t = Table(title=title, show_header=False)
    t.add_column("field")
    t.add_column("value")
    t.add_row("path", s["path"])
    t.add_row("nodes", f"{s['num_nodes']:,}")
    t.add_row("edges", f"{s['num_edges']:,} (avg degree {s['avg_degree']:.2f})")
    t.add_row("features", f"{s['feature_dim']} × {s['feature_dtype']} = {_fmt_bytes(s['feature_bytes'])}")
    multi = " (multi-label: a 0/1 target each)" if s.get("multilabel") else ""
    t.add_row("classes", f"{s['num_classes']}{multi}")
    t.add_row("splits", f"train {s['train']:,} / val {s['val']:,} / test {s['test']:,}")
    t.add_row("on disk", _fmt_bytes(s["bytes"]))
    for k, v in s.get("source", {}).items():
        t.add_row(f"source.{k}", f"{v:.4g}" if isinstance(v, float) else str(v))
    if "elapsed_s" in s:
        t.add_row("time", f"{s['elapsed_s']:.1f} s")
    console.print(t)


@data_app.command("synth")
def synth_cmd(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="number of nodes (thousands to tens of millions)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to create (must not exist)")],
    feature_dim: Annotated[int, typer.Option("--feature-dim", "-d", help="feature vector length per node")] = 128,
    avg_degree: Annotated[float, typer.Option("--avg-degree", help="mean number of neighbours per node")] = 15.0,
    classes: Annotated[int, typer.Option("--classes", help="number of classes (= communities)")] = 16,
    seed: Annotated[int, typer.Option("--seed", help="random seed; the same seed gives the same files")] = 0,
    dtype: Annotated[str, typer.Option("--dtype", help="feature type: float32 or float16")] = "float32",
    homophily: Annotated[float, typer.Option("--homophily", help="share of edges inside a node's own class")] = 0.75,
    power_law: Annotated[float, typer.Option("--power-law", help="degree exponent (> 2; smaller = more skewed)")] = 2.3,
    train_fraction: Annotated[float, typer.Option("--train-fraction", help="share of nodes used as training seeds")] = 0.01,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing dataset at --out")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")] = False,
) -> None:
    """Generate a synthetic power-law graph with learnable labels (community structure) and write it
    to --out. Deterministic for a seed; streams to disk, so 10M nodes need well under 1 GB of RAM.
    """
    from moment.workload.synth import synthesize

    check_output(out, "--out", directory=True)
    t0 = time.perf_counter()
    with progress_bar("generating", enabled=not json_out) as progress:
        ds = synthesize(
            out, nodes, feature_dim=feature_dim, avg_degree=avg_degree, num_classes=classes, seed=seed,
            dtype=dtype, homophily=homophily, power_law=power_law, train_fraction=train_fraction,
            overwrite=overwrite, progress=progress,
        )
    s = ds.summary() | {"elapsed_s": time.perf_counter() - t0}
    if json_out:
        print(json.dumps(s))
    else:
        _print_summary(s, "synthetic dataset written")


def _done(ds: Any, json_out: bool) -> None:
    from moment.workload.importers import import_notices

    notes = import_notices(ds.manifest.source)
    s = ds.summary() | {"notices": notes}
    if json_out:
        print(json.dumps(s))
        return
    _print_summary(s, "dataset imported")
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)


_CHOICES = " or ".join(EDGE_CHOICES)
#: the options every importer shares (the defaults are EdgePolicy's)
Duplicates = Annotated[str | None, typer.Option(
    "--duplicates", help=f"repeated edges (the same u -> v twice): {_CHOICES} (default {EdgePolicy.duplicates}); "
    "the report counts them either way")]
SelfLoops = Annotated[str | None, typer.Option(
    "--self-loops", help=f"edges u -> u: {_CHOICES} (default {EdgePolicy.self_loops}); the report counts them "
    "either way")]
TrustPickle = Annotated[bool, typer.Option(
    "--trust-pickle", help="load the torch file with torch.load(weights_only=False), which runs any code "
    "pickled in it: only for files you made or trust. Without it only tensors, numpy arrays and PyG's Data "
    "classes are unpickled, and a file holding anything else is refused, naming it")]
Out = Annotated[Path, typer.Option("--out", "-o", help="dataset directory to create")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="replace an existing dataset at --out")]
JsonOut = Annotated[bool, typer.Option("--json", help="print one JSON object (the summary, the edge counts "
                                                      "under source, and notices)")]
FeatureDim = Annotated[int, typer.Option("--feature-dim", help="length of generated features (when the input "
                                                                "has none)")]
Seed = Annotated[int, typer.Option("--seed", help="seed for generated features/labels and a random split")]
RandomSplit = Annotated[str | None, typer.Option("--random-split", metavar="TRAIN,VAL,TEST", help=RANDOM_SPLIT_HELP)]


def _policy(duplicates: str | None, self_loops: str | None) -> EdgePolicy:
    return EdgePolicy(**{k: v for k, v in (("duplicates", duplicates), ("self_loops", self_loops)) if v})


@import_app.command("ogb")
def import_ogb_cmd(
    src: Annotated[Path, typer.Argument(help="unzipped OGB dataset directory, e.g. ./ogbn_arxiv (holds raw/ or "
                                             "processed/, and split/)")],
    out: Out,
    split: Annotated[str | None, typer.Option("--split", help="split scheme under split/ (default: the only one)")] = None,
    layout: Annotated[str, typer.Option("--layout", help=f"{', '.join(OGB_LAYOUTS)}: auto reads raw/ when it "
                                        "holds the edge list, else processed/")] = OGB_LAYOUTS[0],
    node_type: Annotated[str | None, typer.Option("--node-type", help="of a heterogeneous raw download (ogbn-mag): "
                                                  "the node type to train on (e.g. paper), with the edges of its "
                                                  "relations to itself")] = None,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges (raw/ of ogbn-products, "
                                             "ogbn-proteins; processed/ already has them)")] = False,
    duplicates: Duplicates = None,
    self_loops: SelfLoops = None,
    trust_pickle: TrustPickle = False,
    overwrite: Overwrite = False,
    json_out: JsonOut = False,
) -> None:
    """Import an OGB node-property-prediction dataset, with the split of split/<scheme>/{train,valid,test}.csv.gz.

    raw/: edge.csv.gz, node-feat.csv.gz, node-label.csv.gz, or data.npz + node-label.npz (streamed).
    processed/: what ogb's loaders write there, geometric_data_processed.pt (PygNodePropPredDataset,
    memory-mapped) or data_processed (NodePropPredDataset, read whole into memory); both are pickles,
    unpickled without running code unless --trust-pickle.
    """
    from moment.workload.import_ogb import import_ogb

    check_output(out, "--out", directory=True)
    policy = _policy(duplicates, self_loops)
    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_ogb(src, out, split_name=split, layout=layout, node_type=node_type, undirected=undirected,
                        policy=policy, trust_pickle=trust_pickle, overwrite=overwrite, progress=progress)
    _done(ds, json_out)


@import_app.command("igb")
def import_igb_cmd(
    src: Annotated[Path, typer.Argument(help="IGB size directory holding processed/, e.g. ./igb/small")],
    out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to create")],
    classes: Annotated[str, typer.Option("--classes", help="label set: 19 or 2K")] = "19",
    directed: Annotated[bool, typer.Option("--directed", help="keep citations one-way (default adds reverse edges)")] = False,
    duplicates: Duplicates = None,
    self_loops: SelfLoops = None,
    overwrite: Overwrite = False,
    json_out: JsonOut = False,
) -> None:
    """Import an IGB dataset (processed/paper/node_feat.npy, node_label_19|2K.npy,
    processed/paper__cites__paper/edge_index.npy). Splits: first 60% train, 20% val, rest test.
    """
    from moment.workload.importers import import_igb

    check_output(out, "--out", directory=True)

    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_igb(src, out, classes=classes, undirected=not directed, policy=_policy(duplicates, self_loops),
                        overwrite=overwrite, progress=progress)
    _done(ds, json_out)


@import_app.command("graphsaint")
def import_saint_cmd(
    src: Annotated[Path, typer.Argument(help="directory holding adj_full.npz, feats.npy, class_map.json and "
                                             "role.json (GraphSAINT's release; PyG's Flickr/Reddit2/Yelp raw/)")],
    out: Out,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges (the releases' adjacency "
                                             "is already symmetric)")] = False,
    duplicates: Duplicates = None,
    self_loops: SelfLoops = None,
    overwrite: Overwrite = False,
    json_out: JsonOut = False,
) -> None:
    """Import a GraphSAINT dataset (Flickr, Reddit, PPI, Yelp, ...): the adjacency, features, class map and
    the tr/va/te roles, kept as the split. A class map of several classes a node (PPI, Yelp, Amazon) gives
    multi-label targets (trained with binary cross entropy, scored by micro-F1)."""
    from moment.workload.import_saint import import_saint

    check_output(out, "--out", directory=True)
    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_saint(src, out, undirected=undirected, policy=_policy(duplicates, self_loops),
                          overwrite=overwrite, progress=progress)
    _done(ds, json_out)


@import_app.command("edgelist")
def import_edgelist_cmd(
    edges: Annotated[Path, typer.Argument(help='text file with one "src dst" pair per line, white space or comma '
                                        'between (a line beginning with # is a comment; a header line such as '
                                        'src,dst is skipped, dst,src swaps the columns, and among more columns '
                                        '(src,dst,weight) the ones it names are read), or a Parquet file (or a directory of '
                                        'Parquet parts, as Spark writes): its two columns, or those named as '
                                        'source and destination (src/dst, source/target...) among more')],
    out: Out,
    features: Annotated[Path | None, typer.Option("--features", help=".npy matrix [N, D] (default: random N(0,1))")] = None,
    labels: Annotated[Path | None, typer.Option("--labels", help=".npy vector [N] (default: random labels)")] = None,
    splits: Annotated[Path | None, typer.Option("--splits", help="directory with your split: train, valid (or val) "
                                                "and test files, each .npy or .parquet (ids or a boolean mask) or "
                                                "text/.csv(.gz) with one id a line (default: a seeded random "
                                                "split)")] = None,
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", help="node count (default: largest id + 1)")] = None,
    renumber: Annotated[bool, typer.Option("--renumber", help="the ids are the graph's own (sparse integers such as "
                                           "user ids, or names): number the distinct ids 0..N-1 in sorted order "
                                           "(integers by value, names as text; ids such as 007, +7 or 7.0 make "
                                           "every id a name, kept as written) and keep them in the dataset "
                                           "(node_ids.npy); --features and --labels rows follow that order, and "
                                           "the --splits files name the graph's own ids")] = False,
    node_ids: Annotated[Path | None, typer.Option("--node-ids", help="the graph's own id of each node, in node order "
                                                  "(text, one a line, .npy or Parquet): as --renumber, in this "
                                                  "order, with nodes no edge names")] = None,
    node_table: Annotated[Path | None, typer.Option("--node-table", help="the nodes and their features, a line "
                                                    "each: the graph's own id, then the features (CSV or white "
                                                    "space; a header line is skipped), as Elliptic's "
                                                    "txs_features.csv; or Parquet: the id column (or the index "
                                                    "pandas kept), then a number column a feature or one list "
                                                    "column of vectors: as --node-ids, in this order")] = None,
    label_table: Annotated[Path | None, typer.Option("--label-table", help="a line a node: its id and its label, a "
                                                     "class number or a class name (names are numbered in sorted "
                                                     "order; a header line is skipped), or Parquet's two columns "
                                                     "(a null: no label); nodes it leaves out have no "
                                                     "label")] = None,
    unlabelled: Annotated[list[str] | None, typer.Option("--unlabelled", metavar="<word>", help="a --label-table label "
                                                         "that means no label (Elliptic's 'unknown'); repeat for "
                                                         "several")] = None,
    header: Annotated[bool | None, typer.Option("--header/--no-header", help="the text edge list's first line is a "
                                                "header (skipped) / an edge; default: a header when it holds no "
                                                "number, and with --renumber a line of two names that no other line "
                                                "names is refused until one of these says which")] = None,
    feature_dim: FeatureDim = 128,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges")] = False,
    duplicates: Duplicates = None,
    self_loops: SelfLoops = None,
    seed: Seed = 0,
    random_split: RandomSplit = None,
    overwrite: Overwrite = False,
    json_out: JsonOut = False,
) -> None:
    """Import a plain edge list (edge u v means v aggregates from u), text or Parquet, with optional features,
    labels and split. Ids are node numbers 0..N-1, or the graph's own (sparse integers, names) with --renumber or
    --node-ids. Parquet files (tables from Spark, DuckDB, pandas' to_parquet) need pyarrow, the parquet
    extra."""
    from moment.workload.importers import import_edgelist

    check_output(out, "--out", directory=True)
    policy = _policy(duplicates, self_loops)
    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_edgelist(
            edges, out, features=features, labels=labels, splits_dir=splits, num_nodes=num_nodes, renumber=renumber,
            node_ids=node_ids, node_table=node_table, label_table=label_table, unlabelled=tuple(unlabelled or ()),
            header=header, feature_dim=feature_dim, undirected=undirected, policy=policy, seed=seed, fractions=random_split,
            overwrite=overwrite, progress=progress,
        )
    _done(ds, json_out)


@import_app.command("pyg")
def import_pyg_cmd(
    file: Annotated[Path, typer.Argument(help="a torch.save'd torch_geometric Data (data.pt), or the processed file "
                                              "of an InMemoryDataset with one graph (processed/data.pt)")],
    out: Out,
    node_type: Annotated[str | None, typer.Option("--node-type", help="of a HeteroData: the node type to train on "
                                                  "(e.g. paper), imported with the edges of its relations to "
                                                  "itself")] = None,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges (PyG graphs usually have them)")] = False,
    duplicates: Duplicates = None,
    self_loops: SelfLoops = None,
    trust_pickle: TrustPickle = False,
    feature_dim: FeatureDim = 128,
    seed: Seed = 0,
    random_split: RandomSplit = None,
    overwrite: Overwrite = False,
    json_out: JsonOut = False,
) -> None:
    """Import a PyG graph: edge_index [2, E], x [N, D], y [N] or [N, 1] (or multi-label 0/1 targets [N, C]), and
    a split as boolean masks (train_mask, val_mask, test_mask) or index tensors (train_idx, val_idx or valid_idx,
    test_idx), kept as given.

    Without x or y, seeded features/labels are generated; without any split, a seeded random one (each said
    in the report). Of a HeteroData (ogbn-mag), --node-type chooses the node type. The file is a pickle: it is
    unpickled without running code (tensors, numpy arrays and PyG's Data classes only) unless --trust-pickle;
    its tensors are memory-mapped, so x may exceed memory.
    """
    from moment.workload.import_pyg import import_pyg

    check_output(out, "--out", directory=True)
    policy = _policy(duplicates, self_loops)
    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_pyg(file, out, trust_pickle=trust_pickle, node_type=node_type, undirected=undirected,
                        policy=policy, feature_dim=feature_dim, seed=seed, fractions=random_split,
                        overwrite=overwrite, progress=progress)
    _done(ds, json_out)


@import_app.command("npy")
def import_npy_cmd(
    out: Out,
    edge_index: Annotated[Path, typer.Option("--edge-index", help="integer .npy [2, E] (PyG's layout) or [E, 2], "
                                             "or a square SciPy sparse adjacency (scipy.sparse.save_npz, .npz); "
                                             "edge u v means v aggregates from u")],
    x: Annotated[Path | None, typer.Option("--x", help="features .npy [N, D], memory-mapped and copied in chunks "
                                           "(float16/float32 kept, other numbers become float32; default: random)")] = None,
    y: Annotated[Path | None, typer.Option("--y", help="labels .npy [N] or [N, 1], integers (-1 or NaN: unlabelled), "
                                           "or multi-label 0/1 targets [N, C] (default: random)")] = None,
    train_idx: Annotated[Path | None, typer.Option("--train-idx", help="train node ids .npy (integers) or a "
                                                   "boolean mask [N]")] = None,
    val_idx: Annotated[Path | None, typer.Option("--val-idx", help="validation ids or mask .npy")] = None,
    test_idx: Annotated[Path | None, typer.Option("--test-idx", help="test ids or mask .npy (the three together; "
                                                  "none: a seeded random split)")] = None,
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", help="node count (default: rows of --x or --y, "
                                                  "else the largest id + 1)")] = None,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges")] = False,
    duplicates: Duplicates = None,
    self_loops: SelfLoops = None,
    feature_dim: FeatureDim = 128,
    seed: Seed = 0,
    random_split: RandomSplit = None,
    overwrite: Overwrite = False,
    json_out: JsonOut = False,
) -> None:
    """Import a graph held as .npy arrays (e.g. saved from a PyG Data's tensors); every array is memory-mapped,
    so features larger than memory import in bounded memory."""
    from moment.workload.import_npy import import_npy

    check_output(out, "--out", directory=True)
    policy = _policy(duplicates, self_loops)
    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_npy(out, edge_index=edge_index, x=x, y=y, train_idx=train_idx, val_idx=val_idx,
                        test_idx=test_idx, num_nodes=num_nodes, undirected=undirected, policy=policy,
                        feature_dim=feature_dim, seed=seed, fractions=random_split, overwrite=overwrite,
                        progress=progress)
    _done(ds, json_out)


@data_app.command("info")
def info_cmd(
    path: Annotated[Path, typer.Argument(help="dataset directory")],
    verify: Annotated[bool, typer.Option("--verify", help="re-hash every file and check the whole structure (slow)")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Show a dataset's size, shape and origin; --verify checks checksums and CSR validity."""
    from moment.workload.graph import GraphDataset

    ds = GraphDataset.open(path, verify=verify)
    s = ds.summary() | {"verified": verify}
    if json_out:
        print(json.dumps(s))
    else:
        _print_summary(s, "dataset" + (" (verified)" if verify else ""))


@data_app.command("presample")
def presample_cmd(
    path: Annotated[Path, typer.Argument(help="dataset directory")],
    out: Annotated[Path, typer.Option("--out", "-o", help="hotness directory to write (hotness.json + .npy counts)")],
    fanouts: Annotated[str, typer.Option("--fanouts", help=FANOUTS_HELP)] = "25,10",
    batch_size: Annotated[int, typer.Option("--batch-size", help="training seeds per mini-batch")] = 1024,
    epochs: Annotated[int, typer.Option("--epochs", help="epochs to sample")] = 1,
    num_batches: Annotated[int | None, typer.Option("--num-batches", help="stop after this many batches instead")] = None,
    seed: Annotated[int, typer.Option("--seed", help="sampling seed (same seed = same counts)")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Run the training sampler ahead of time and count how often each node's feature and neighbour list
    is read; prints the access skew (share of reads that hit the hottest 1%/5%/10% of nodes).
    """
    from moment.workload.graph import GraphDataset
    from moment.workload.hotness import check_hotness_out, presample

    f = parse_fanouts(fanouts)
    ds = GraphDataset.open(path)
    check_hotness_out(out)
    with progress_bar("pre-sampling", enabled=not json_out) as progress:
        hot = presample(ds, f, batch_size, epochs=epochs, num_batches=num_batches, seed=seed, progress=progress)
    hot.save(out)
    s = hot.summary() | {"out": str(out)}
    if json_out:
        print(json.dumps(s))
        return
    from rich.table import Table

    t = Table(title=f"access skew ({hot.num_batches} batches, fan-outs {','.join(map(str, f))})")
    t.add_column("hottest nodes", justify="right")
    t.add_column("share of feature reads", justify="right")
    t.add_column("share of adjacency reads", justify="right")
    fs, ads = hot.skew(), hot.skew(kind="adjacency")
    for k in fs:
        t.add_row(f"{k:.0%}", f"{fs[k]:.1%}", f"{ads[k]:.1%}")
    console.print(t)
    console.print(
        f"unique ratio {hot.unique_ratio:.3f} · {s['sampled_per_s']:,.0f} sampled nodes/s · "
        f"{s['never_read']:.1%} of nodes never read · written to {out}"
    )
