"""`moment cache simulate`: how well each cache policy would serve a dataset's training accesses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from moment.cli import app, console
from moment.cli.common import check_at_least, parse_fanouts, progress_bar
from moment.errors import MomentError
from moment.workload.spec import FANOUTS_HELP

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

cache_app = typer.Typer(help="CPU-cache policies: replay the sampled training trace and compare them.",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache", help="Cache policies: simulate hit rates and SSD bytes.")


@cache_app.command("simulate")
def simulate_cmd(
    dataset: Annotated[Path, typer.Option("--dataset", help="dataset directory")],
    capacity: Annotated[list[str], typer.Option("--capacity", help="cache size: a share of the feature rows "
                                                "(10%) or bytes (512MiB); repeat for several")],
    policy: Annotated[list[str] | None, typer.Option("--policy", help="static, lru, belady-superbatch "
                                                     "(repeatable; default all three)")] = None,
    superbatch: Annotated[int, typer.Option("--superbatch", help="batches belady-superbatch sees ahead")] = 16,
    fanouts: Annotated[str | None, typer.Option("--fanouts", help=f"{FANOUTS_HELP} (default: "
                                                "25,10, or --hotness's)", show_default=False)] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="seeds per rank and batch (default: "
                                                   "the training default, or --hotness's)")] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="epochs of the trace")] = 1,
    ranks: Annotated[int, typer.Option("--ranks", help="training ranks (the trace is one rank's)")] = 1,
    rank: Annotated[int, typer.Option("--rank", help="whose trace")] = 0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    hotness: Annotated[Path | None, typer.Option("--hotness", help="pre-sampled hotness (moment data presample "
                                                 "--out); default: pre-sample now with seed+1")] = None,
    trace_out: Annotated[Path | None, typer.Option("--trace-out", help="also save the trace (.npz)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Replay one rank's sampled epochs (the batches training will read) through each cache policy at
    each capacity; reports hit rate and bytes read from SSD, with Belady's optimum as the bound."""
    import numpy as np

    from moment.caching.simulate import DEFAULT_POLICIES, check_policies, simulate
    from moment.runtime.config import TrainConfig
    from moment.sizes import fmt_size, parse_size
    from moment.workload.graph import GraphDataset
    from moment.workload.hotness import Hotness, presample
    from moment.workload.sampler import DEFAULT_FANOUTS
    from moment.workload.seeds import check_seed
    from moment.workload.trace import sample_trace

    f = None if fanouts is None else parse_fanouts(fanouts)
    check_at_least(batch_size=(batch_size, 1), superbatch=(superbatch, 1), epochs=(epochs, 1), ranks=(ranks, 1),
                   rank=(rank, 0))
    check_seed(seed)
    check_policies(policy or DEFAULT_POLICIES)  # before the trace is sampled
    if rank >= ranks:
        raise MomentError(f"--rank {rank} must be below --ranks {ranks}")
    ds = GraphDataset.open(dataset)
    if trace_out is not None:
        from moment.outputs import check_output

        check_output(trace_out, "--trace-out")
    hot = None
    if hotness is not None:  # counts sampled at other fan-outs or batch size rank the rows differently
        hot = Hotness.load(hotness)
        hot.check_dataset(ds, source=str(hotness))
        f, batch_size = hot.sampled_as(f, batch_size, source=str(hotness))
    f = f or list(DEFAULT_FANOUTS)
    n = ds.num_nodes
    caps = []
    for c in capacity:
        try:
            size = parse_size(c, n * ds.row_bytes) or 0
        except MomentError as e:  # (it named no option)
            raise MomentError(f"--capacity {c!r}: {e}") from None
        rows = size // ds.row_bytes
        if rows <= 0 or rows > n:  # (a bare number is bytes here: say how it was read)
            raise MomentError(f"--capacity {c!r}: read as {fmt_size(size)}, {rows:,} rows of {ds.row_bytes} B: must be "
                              f"more than 0 rows and at most the dataset's {n:,} rows ({fmt_size(n * ds.row_bytes)})",
                              hint="give a size with its unit (e.g. 64MiB) or a share of the rows (e.g. 10%)")
        caps.append(rows)
    bs = batch_size if batch_size is not None else TrainConfig().resolved_batch_size(
        int(np.asarray(ds.train_idx).size), ranks)
    with progress_bar("sampling the trace", enabled=not json_out) as progress:
        tr = sample_trace(ds, f, bs, seed=seed, epochs=epochs, rank=rank, world_size=ranks, progress=progress)
    if trace_out is not None:
        tr.save(trace_out)
    if hot is not None:
        counts = hot.feature_reads
    else:
        with progress_bar("pre-sampling hotness", enabled=not json_out) as progress:
            counts = presample(ds, f, bs, seed=seed + 1, progress=progress).feature_reads
    runs = []
    for rows in caps:
        with progress_bar(f"simulating {rows:,} rows", enabled=not json_out) as progress:
            r = simulate(tr, rows, policy or DEFAULT_POLICIES, hotness=counts, superbatch=superbatch,
                         progress=progress)
        bel = r.pop("belady")
        runs.append({"capacity_rows": rows, "capacity_bytes": rows * ds.row_bytes, "policies": r, "belady": bel})
    doc = {"dataset": str(dataset), "batches": len(tr), "accesses": tr.total_accesses, "batch_size": bs,
           "fanouts": f, "ranks": ranks, "rank": rank, "superbatch": superbatch, **runs[0], "runs": runs}
    if json_out:
        print(json.dumps(doc))
        return
    from rich.table import Table

    for run in runs:
        t = Table(title=f"{run['capacity_rows']:,} rows ({run['capacity_bytes'] / 2**20:.0f} MiB) · "
                        f"{len(tr)} batches, {tr.total_accesses:,} accesses")
        for col in ("policy", "hit rate", "SSD GB", "of Belady's hits"):
            t.add_column(col, justify="right" if col != "policy" else "left")
        for name, v in [*run["policies"].items(), ("belady (bound)", run["belady"])]:
            share = v["hits"] / run["belady"]["hits"] if run["belady"]["hits"] else 1.0
            t.add_row(name, f"{v['hit_rate']:.1%}", f"{v['ssd_bytes'] / 1e9:.3f}", f"{share:.1%}")
        console.print(t)

