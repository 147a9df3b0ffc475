"""One rank of tests/test_multinode.py's bit-exactness test, run under two torchrun agents on 127.0.0.1 (one
per machine of a split layout): gathers nodes through the machine's tiered store, its remote tier fetching
the rows the other machine owns, checks every row (and separately those the remote tier served) against the
dataset's features, and writes what it saw as JSON.

The machines have different numbers of batches (machine 1 has more), each batch is submitted ahead of
its completion as the pipeline does, and every node id of the graph is asked by each machine: the exchange
must keep the machines in step and every row must arrive bit for bit.

    python -m torch.distributed.run <Rendezvous.torchrun_args()> --nproc-per-node=1 tests/split_ranks.py SPLIT OUT
    (with Rendezvous.env() in the environment)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from moment.runtime.dist import setup
from moment.runtime.footprint import remote_round_bytes
from moment.runtime.remote_tier import RemoteTier
from moment.runtime.store import Collectives, StoreOptions, open_tiers

MOST = 900  # the most ids one batch asks


def batches_of(machine: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(machine)
    every = rng.permutation(n)
    out = [every[a:a + MOST] for a in range(0, n, MOST)]  # every node once
    return out + [rng.integers(0, n, 500) for _ in range(3 * machine)]  # machine 1: three batches more


def main(split: Path, out: Path) -> None:
    ctx = setup("cpu")
    layout = split / f"m{ctx.node_rank}"
    store = open_tiers(layout, ctx, StoreOptions(cpu_rows=200, shape="block", superbatch=2),
                       Collectives(barrier=ctx.barrier, remote=ctx.remote_group()))
    feats = torch.from_numpy(np.load(json.loads((layout / "manifest.json").read_text())["dataset"]["features_path"]))
    far = store.find(RemoteTier)
    seen = {"rows_checked": 0, "remote_rows_checked": 0}

    def check(b: np.ndarray, p) -> None:
        got = store.complete(p).cpu()
        if not torch.equal(got, feats[torch.from_numpy(b)]):
            raise SystemExit("a gathered row differs from the dataset's")
        at = _remote_part(store, p.part).pos
        if not torch.equal(got[torch.from_numpy(at)], feats[torch.from_numpy(b[at])]):
            raise SystemExit("a row the remote tier fetched differs from the dataset's")
        seen["rows_checked"] += int(b.size)
        seen["remote_rows_checked"] += int(at.size)

    pend = []
    for b in batches_of(ctx.node_rank, store.num_nodes):
        pend.append((b, store.submit(b)))
        if len(pend) > store.lookahead:
            check(*pend.pop(0))
    for b, p in pend:
        check(b, p)
    store.finish()
    stats = store.tier_stats()
    seen |= {"machine": ctx.node_rank, "remote_rows": stats["rows"]["remote"], "served": stats["remote_served_rows"],
             "exchange_peak": far.own_memory()["remote_exchange"],
             "exchange_charged": remote_round_bytes(MOST, store.layout_rows.row_bytes, 2)}
    store.close()
    (out / f"machine{ctx.node_rank}.json").write_text(json.dumps(seen))
    ctx.close()


def _remote_part(store, part):
    """The remote tier's pending part of a batch (the tiers above it hold theirs in `inner`)."""
    for t in store.chain():
        if isinstance(t, RemoteTier):
            return part
        part = part.inner
    raise AssertionError("no remote tier in the chain")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
