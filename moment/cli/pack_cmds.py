"""`moment data pack`: write each training batch's uncached feature rows contiguously (DiskGNN)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from moment.cli import console
from moment.cli.common import check_at_least, parse_fanouts, progress_bar
from moment.cli.data_cmds import data_app
from moment.workload.spec import FANOUTS_HELP
from moment.errors import MomentError

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


@data_app.command("pack")
def pack_cmd(
    layout: Annotated[Path, typer.Option("--layout", help="layout directory written by `moment place`")],
    dataset: Annotated[Path | None, typer.Option("--dataset", help="dataset directory (default: the layout's)")] = None,
    ranks: Annotated[int, typer.Option("--ranks", help="training ranks (torchrun --nproc-per-node x nodes)")] = 1,
    epochs: Annotated[int, typer.Option("--epochs", help="epochs to pack; later epochs read the layout")] = 1,
    fanouts: Annotated[str, typer.Option("--fanouts", help=FANOUTS_HELP)] = "25,10",
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="seeds per rank and batch (default: the "
                                                   "training default)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="the training run's --seed")] = 0,
    cached: Annotated[str | None, typer.Option("--cached", help="hottest rows the caches will hold and the pack "
                                               "leaves out: rows, a share (30%) or bytes (2GiB); default: the "
                                               "layout's GPU and CPU bins, or --memory-budget's CPU cache")] = None,
    memory_budget: Annotated[str | None, typer.Option("--memory-budget", help="the training run's budget: "
                                                      "leave out the rows its CPU cache will hold (static policy)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace the layout's pack")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Sample the batches `moment train` will read (same ranks, batch size, fan-outs and seed) and write
    each batch's rows outside the caches contiguously into LAYOUT/pack, one file per rank; training
    then uses it (--io-shape auto, the default, or packed).
    Training then reads a batch's misses sequentially; a row read by several batches is stored once
    per batch, so the pack costs disk space (reported). Rows the pack lacks are read from the layout.
    """
    import numpy as np

    from moment.placement.opened import Layout
    from moment.placement.pack import pack_path, pack_summary, refuse_split, write_pack
    from moment.runtime.config import TrainConfig, make_config
    from moment.workload.graph import GraphDataset

    f = parse_fanouts(fanouts)
    check_at_least(ranks=(ranks, 1), epochs=(epochs, 1))
    make_config(seed=seed, batch_size=batch_size)  # the training run's own ranges: one line naming the flag
    opened = Layout.open(layout)
    m = opened.manifest
    refuse_split(layout, m)
    n, rb = m.dataset.num_nodes, m.row.row_bytes
    ds = GraphDataset.open(dataset) if dataset is not None else opened.dataset
    bs = batch_size if batch_size is not None else TrainConfig().resolved_batch_size(
        int(np.asarray(ds.train_idx).size), ranks)
    if cached is not None and memory_budget is not None:
        raise MomentError("give --cached or --memory-budget, not both")
    rows, budget_rows = None, None
    if cached is not None:
        rows = cached_rows(cached, n, rb)
    elif memory_budget is not None:
        from moment.runtime.sizing import preview_inputs, preview_plan

        cfg = make_config(layout=layout, dataset=ds.path, memory_budget=memory_budget, fanouts=f, batch_size=bs,
                          seed=seed, io_shape="block")
        cfg.check()
        measured = preview_inputs(cfg, ds, ranks)  # once: each preview below only resolves the plan again

        def budget_rows(index_bytes: int) -> int:  # the run's CPU cache with a pack index this large
            return preview_plan(cfg, ds, ranks, layout=opened, pack_index_bytes=index_bytes,
                                inputs=measured).memory.cpu_rows

        budget_rows(0)  # a budget too small even without the pack: say so now
    else:
        rows = sum(s.rows for s in m.shards if s.kind in ("gpu", "cpu"))
    with progress_bar("sampling and packing", enabled=not json_out) as progress:
        man = write_pack(layout, ds, world_size=ranks, batch_size=bs, fanouts=f, seed=seed, epochs=epochs,
                         cached_rows=rows, budget_rows=budget_rows, overwrite=overwrite, progress=progress)
    s = pack_summary(man) | {"path": str(pack_path(layout)), "batch_size": bs, "fanouts": f, "seed": seed}
    if json_out:
        print(json.dumps(s))
        return
    console.print(
        f"packed {s['rows']:,} rows for {ranks} rank(s) x {epochs} epoch(s) into {s['path']}: "
        f"{s['bytes'] / 2**20:,.0f} MiB on disk ({s['disk_overhead']:.2f}x the features), leaving out the "
        f"{man.cached_rows:,} hottest rows\ntrain with: --io-shape packed --batch-size {bs} --fanouts "
        f"{','.join(map(str, f))} --seed {seed} (torchrun --nproc-per-node {ranks})", highlight=False)


def cached_rows(text: str, n: int, row_bytes: int) -> int:
    """--cached: a row count, a share of the rows, or bytes."""
    from moment.sizes import parse_size

    t = text.strip()
    if t.isdigit():
        rows = int(t)
    else:
        try:
            rows = (parse_size(t, n * row_bytes) or 0) // row_bytes
        except MomentError as e:
            raise MomentError(f"--cached {text!r}: {e}") from None
    if not 0 <= rows <= n:
        raise MomentError(f"--cached {text!r}: must be between 0 and {n} rows")
    return rows
