"""`moment data …`: make, import, inspect and pre-sample graph datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from moment.cli import app, console
from moment.cli.common import parse_fanouts, progress_bar
from moment.outputs import check_output

data_app = typer.Typer(
    help="Graph datasets: generate synthetic ones, import OGB/IGB/edge lists, inspect, and pre-sample "
    "to measure which node features training reads most (the input to data placement).",
    no_args_is_help=True,
)
import_app = typer.Typer(
    help="Convert a downloaded dataset into Moment's on-disk format (CSR + features as .npy + manifest).",
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
    t.add_row("classes", str(s["num_classes"]))
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
    import time

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
    s = ds.summary()
    if json_out:
        print(json.dumps(s))
    else:
        _print_summary(s, "dataset imported")


@import_app.command("ogb")
def import_ogb_cmd(
    src: Annotated[Path, typer.Argument(help="unzipped OGB dataset directory, e.g. ./ogbn_arxiv (holds raw/ and split/)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to create")],
    split: Annotated[str | None, typer.Option("--split", help="split scheme under split/ (default: the only one)")] = None,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges (needed for ogbn-products)")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing dataset at --out")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Import an OGB node-property-prediction dataset (raw/*.csv.gz or raw/data.npz + split/<scheme>/)."""
    from moment.workload.importers import import_ogb

    check_output(out, "--out", directory=True)

    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_ogb(src, out, split_name=split, undirected=undirected, overwrite=overwrite, progress=progress)
    _done(ds, json_out)


@import_app.command("igb")
def import_igb_cmd(
    src: Annotated[Path, typer.Argument(help="IGB size directory holding processed/, e.g. ./igb/small")],
    out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to create")],
    classes: Annotated[str, typer.Option("--classes", help="label set: 19 or 2K")] = "19",
    directed: Annotated[bool, typer.Option("--directed", help="keep citations one-way (default adds reverse edges)")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing dataset at --out")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Import an IGB dataset (processed/paper/node_feat.npy, node_label_19|2K.npy,
    processed/paper__cites__paper/edge_index.npy). Splits: first 60% train, 20% val, rest test.
    """
    from moment.workload.importers import import_igb

    check_output(out, "--out", directory=True)

    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_igb(src, out, classes=classes, undirected=not directed, overwrite=overwrite, progress=progress)
    _done(ds, json_out)


@import_app.command("edgelist")
def import_edgelist_cmd(
    edges: Annotated[Path, typer.Argument(help='text file with one "src dst" pair per line (# comments allowed)')],
    out: Annotated[Path, typer.Option("--out", "-o", help="dataset directory to create")],
    features: Annotated[Path | None, typer.Option("--features", help=".npy matrix [N, D] (default: random N(0,1))")] = None,
    labels: Annotated[Path | None, typer.Option("--labels", help=".npy vector [N] (default: random labels)")] = None,
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", help="node count (default: largest id + 1)")] = None,
    feature_dim: Annotated[int, typer.Option("--feature-dim", help="length of generated features")] = 128,
    undirected: Annotated[bool, typer.Option("--undirected", help="add reverse edges")] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed for generated features/labels and the random splits")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing dataset at --out")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Import a plain edge list (edge u v means v aggregates from u), with optional features and labels."""
    from moment.workload.importers import import_edgelist

    check_output(out, "--out", directory=True)

    with progress_bar("importing", enabled=not json_out) as progress:
        ds = import_edgelist(
            edges, out, features=features, labels=labels, num_nodes=num_nodes, feature_dim=feature_dim,
            undirected=undirected, seed=seed, overwrite=overwrite, progress=progress,
        )
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
    fanouts: Annotated[str, typer.Option("--fanouts", help="neighbours sampled per layer, first hop first")] = "25,10",
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
