"""A script that starts its own ranks as PyG's multi-GPU examples do: `torch.multiprocessing` and its own
`init_process_group(rank=..., world_size=...)`, no torchrun, so no RANK, WORLD_SIZE or LOCAL_RANK in the
environment. Each rank opens a run on the layout, reads its train epoch's seeds and writes what it saw
(tests/test_open_run.py). Forked, not spawned: the same group, without a torch start-up per rank.

    python tests/spawned_ranks.py LAYOUT OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

import moment


def rank_main(rank: int, world: int, layout: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=world)
    with moment.open_run(layout, fanouts=[5, 5], batch_size=64, quiet=True) as run:
        seeds = [b.n_id[: b.batch_size].tolist() for b in run.loader("train", 0)]
        seen = {"rank": run.rank, "world_size": run.world_size, "local_rank": run.local_rank,
                "device": str(run.device), "seeds": seeds}
    dist.destroy_process_group()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    mp.start_processes(rank_main, args=(2, sys.argv[1], sys.argv[2]), nprocs=2, start_method="fork")
