"""`pack(req)`: the use case `moment data pack` runs (its request, moment.placement.requests.PackRequest):
the checks, the batch size and the rows the caches will hold sized as the training run will (the runtime's
configuration and memory plan), then moment.placement.pack.write_pack.

    res = pack(PackRequest(layout="L", ranks=2))   # -> PackResult
    res.summary   # `moment data pack --json`'s object
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from moment.errors import MomentError, check_at_least
from moment.placement.opened import Layout
from moment.placement.pack import (NoRoom, PackManifest, pack_path, pack_summary, refuse_split, whole_here,
                                   write_pack)
from moment.placement.requests import PackRequest, cached_rows
from moment.requests import expect
from moment.runtime.config import TrainConfig, make_config
from moment.runtime.devices import check_local_ranks
from moment.sizes import fmt_size
from moment.workload.graph import GraphDataset

# Imports inside functions: the memory plan (moment.runtime.sizing) is loaded only for --memory-budget.


@dataclass
class PackResult:
    """What `pack()` wrote: the pack's manifest, the batch size it resolved, and `--json`'s object."""

    manifest: PackManifest
    batch_size: int
    summary: dict[str, Any]


def pack(req: PackRequest, *,
         progress: Callable[[], AbstractContextManager[Callable[[int, int], None] | None]] = nullcontext) -> PackResult:
    """Sample the batches `moment train` will read with `req`'s ranks, batch size, fan-outs and seed, and
    write each batch's rows outside the caches contiguously into LAYOUT/pack (moment.placement.pack); asked for
    no kind, every row on a machine with no GPU driver (`whole_here`: the summary's `chosen` says why) unless
    only the fitted pack fits on the layout's disk.
    `progress()` is entered around the writing (after every check) and yields its progress(done, total)
    callback or None (the command's bar on stderr)."""
    expect(req, PackRequest, "moment.pack")
    for name, least in (("ranks", 1), ("epochs", 1)):
        check_at_least(f"--{name}", getattr(req, name), least)
    make_config(seed=req.seed, batch_size=req.batch_size)  # the training run's own ranges: one line naming the flag
    layout = req.layout
    opened = Layout.open(layout)
    m = opened.manifest
    refuse_split(layout, m)
    # the ranks a run of this layout may have (the pack was written, then the run it named was refused)
    check_local_ranks(req.ranks, [g for g, _ in opened.gpu_devices()], f"--ranks {req.ranks}")
    n, rb = m.dataset.num_nodes, m.row.row_bytes
    ds = GraphDataset.open(req.dataset) if req.dataset is not None else opened.dataset
    bs = req.batch_size if req.batch_size is not None else TrainConfig().resolved_batch_size(
        int(np.asarray(ds.train_idx).size), req.ranks)
    given = [f for f, v in (("--whole", req.whole), ("--cached", req.cached), ("--memory-budget", req.memory_budget))
             if v not in (None, False)]
    if len(given) > 1:
        raise MomentError(f"give one of {' and '.join(given)}, not both: each says which rows the pack leaves out")
    whole, chosen = req.whole, None
    if whole is None and not given:
        whole, chosen = whole_here()
    rows, budget_rows, bins = None, None, sum(s.rows for s in m.shards if s.kind in ("gpu", "cpu"))
    if whole:
        rows = 0
    elif req.cached is not None:
        rows = cached_rows(req.cached, n, rb)
    elif req.memory_budget is not None:
        from moment.runtime.sizing import preview_inputs, preview_plan

        cfg = make_config(layout=layout, dataset=ds.path, memory_budget=req.memory_budget, fanouts=req.fanouts,
                          batch_size=bs, seed=req.seed, io_shape="block")
        cfg.check()
        measured = preview_inputs(cfg, ds, req.ranks)  # once: each preview below only resolves the plan again

        def budget_rows(index_bytes: int) -> int:  # the run's CPU cache with a pack index this large
            return preview_plan(cfg, ds, req.ranks, layout=opened, pack_index_bytes=index_bytes,
                                inputs=measured).memory.cpu_rows

        budget_rows(0)  # a budget too small even without the pack: say so now
    else:
        rows = bins
    with progress() as cb:
        def write(cached: int | None) -> PackManifest:
            return write_pack(layout, ds, world_size=req.ranks, batch_size=bs, fanouts=req.fanouts, seed=req.seed,
                              epochs=req.epochs, cached_rows=cached, budget_rows=budget_rows,
                              overwrite=req.overwrite, progress=cb)

        try:
            man = write(rows)
        except NoRoom as e:  # checked before anything is sampled for writing: the kind not asked for, given up
            if not (chosen and whole):
                raise
            chosen = (f"this machine has no GPU driver, but a whole pack would take about {fmt_size(e.needed)} and "
                      f"the disk holding the layout has {fmt_size(e.free)} free: the caches' rows left out instead, "
                      "as --fitted does")
            man = write(bins)
    summary = pack_summary(man) | {"path": str(pack_path(layout)), "batch_size": bs, "fanouts": req.fanouts,
                                   "seed": req.seed, "whole": not man.cached_rows, "chosen": chosen}
    return PackResult(man, bs, summary)
