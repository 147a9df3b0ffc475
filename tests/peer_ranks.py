"""One rank of tests/test_peers.py, run under torchrun (gloo): gathers every node through the tiered
store with and without the peer tier, checks each row against the dataset, writes what it saw as JSON.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/peer_ranks.py LAYOUT OUT DEVICE
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from moment.placement.reader import load_manifest
from moment.placement.opened import Layout
from moment.runtime.run_plan import rank_plan
from moment.runtime.ssd_model import TierModel
from moment.runtime.store import Collectives, RankPlace, StoreOptions, TieredFeatureStore


def batches_of(rank: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rank)
    return [rng.permutation(n)[:900] for _ in range(3)] + [np.arange(n), rng.integers(0, n, 700)]


def gather_all(store: TieredFeatureStore, feats: np.ndarray) -> None:
    batches = batches_of(store.rank, feats.shape[0])
    pend = []
    for b in batches:
        pend.append((b, store.submit(b)))
        if len(pend) > store.lookahead:
            b0, p0 = pend.pop(0)
            _check(store.complete(p0), feats[b0])
    for b0, p0 in pend:
        _check(store.complete(p0), feats[b0])


def _check(got: torch.Tensor, want: np.ndarray) -> None:
    if not torch.equal(got.cpu(), torch.from_numpy(want)):
        raise SystemExit("a gathered row differs from the dataset's features")


def main() -> int:
    layout, out, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank, lws = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if device == "cuda":  # one device per rank where there are enough, else both ranks on one (IPC still maps)
        device = f"cuda:{local_rank % torch.cuda.device_count()}"
        torch.cuda.set_device(torch.device(device))
    m = load_manifest(layout)
    feats = np.load(Path(m.dataset.features_path))
    gpu_shards = [i for i, s in enumerate(m.shards) if s.kind == "gpu"]

    def all_gather(obj):
        got = [None] * world
        dist.all_gather_object(got, obj)
        return got

    report = {}
    n = m.dataset.num_nodes
    runs = {"peers_shared": dict(policy="static", shared_cache=True, all_gather=all_gather),
            "peers_lru": dict(policy="lru", shared_cache=False, all_gather=all_gather),
            "no_peers": dict(policy="static", shared_cache=False, all_gather=None)}
    for name, kw in runs.items():
        store = TieredFeatureStore(layout, RankPlace(rank, local_rank, world, lws, device),
                                   StoreOptions(cpu_rows=n // 40, buffer_bytes=1 << 20, policy=kw["policy"],
                                                shared_cache=kw["shared_cache"]),
                                   Collectives(barrier=dist.barrier, all_gather=kw["all_gather"]))
        try:
            gather_all(store, feats)
            report[name] = {"tiers": store.tier_stats()["rows"], "peer_rows": store.peer_rows,
                            "gpu_rows": store.gpu_rows, "memory": store.memory(),
                            "gpu_bin_rows_read": int(store._rows_by_bin[gpu_shards].sum()),
                            "cache_rows": store.cache.capacity}
            if kw["policy"] == "static":  # the read prediction (bench/fidelity.py) knows the peer tier
                opened = Layout.open(layout)
                peers = ([rank_plan(opened, r, r, lws, None) for r in range(lws) if r != local_rank]
                         if kw["all_gather"] is not None else [])
                tm = TierModel(opened, store.plan, peers=peers)
                report[name]["model_ssd_rows"] = sum(int(np.isin(b, tm.misses(b)).sum())
                                                     for b in batches_of(rank, n))
        finally:
            store.close()
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
