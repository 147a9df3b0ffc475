"""`moment data pack`: write each training batch's uncached feature rows contiguously (DiskGNN). Its options
are PackRequest's fields (moment.placement.requests); `pack(req)` (moment.runtime.packing) does the work."""

from __future__ import annotations

import json

import typer

from moment.cli import console
from moment.cli.common import progress_bar
from moment.cli.data_cmds import data_app
from moment.cli.requests import given, request_options
from moment.placement.requests import PackRequest

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


@data_app.command("pack")
@request_options(PackRequest)
def pack_cmd(
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    **options,
) -> None:
    """Sample the batches `moment train` will read (same ranks, batch size, fan-outs and seed: each epoch's
    training batches and the validation batches it evaluates after it) and write each batch's rows
    contiguously into LAYOUT/pack, one file per rank, for training to use (--io-shape auto, the default, or
    packed): it reads a batch's rows sequentially. On a machine with no GPU driver the pack holds every row
    of each batch (a CPU run reads it straight into the batch's buffer), else the rows outside the caches
    (--whole and --fitted choose). A row read by several batches is stored once per batch, so the pack costs
    disk space (reported). Rows the pack lacks are read from the layout.
    """
    from moment.runtime.packing import pack

    req = PackRequest(**given(options))
    res = pack(req, progress=lambda: progress_bar("sampling and packing", enabled=not json_out))
    s, man, bs, f = res.summary, res.manifest, res.batch_size, req.fanouts
    if json_out:
        print(json.dumps(s))
        return
    from moment.placement.pack import what_it_holds

    chosen = f" (no kind given: {s['chosen']})" if s["chosen"] else ""
    console.print(
        f"packed {s['rows']:,} rows for {req.ranks} rank(s) x {req.epochs} epoch(s) of training"
        f"{''.join(f' and {x}' for x in s['eval_splits'])} batches into {s['path']}: "
        f"{s['bytes'] / 2**20:,.0f} MiB on disk ({s['disk_overhead']:.2f}x the features), "
        f"{what_it_holds(man.cached_rows)}{chosen}\ntrain with: --io-shape packed --epochs {req.epochs} --batch-size {bs} "
        f"--fanouts {','.join(map(str, f))} --seed {req.seed} (torchrun --nproc-per-node {req.ranks}); epochs past "
        f"{req.epochs} are read from the layout, many times slower", highlight=False)
