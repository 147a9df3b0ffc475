"""One rank of tests/test_peers.py, run under torchrun: gathers nodes through the tiered store with and
without the peer tier, checks every row (and separately the rows the peer tier served) against the
layout's own rows, and writes what it saw as JSON.

The ranks have different numbers of batches (rank 1 has more), and each run is two sequences of
batches, the second through the training pipeline: the exchange must keep the ranks in step anyway.
After each of the batches both ranks have, the consumer waits for the other rank (`step`), as DDP's
all-reduce does: a rank that skipped a round because its own batch needed no peer row would leave
the other waiting in that round while it waits in the barrier. The exchange's chunks are made small
(CHUNK_ROWS rows) so that a batch's round takes several, each written straight into the batch.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/peer_ranks.py LAYOUT OUT DEVICE
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from moment.placement.opened import Layout
from moment.placement.reader import load_manifest, open_layout
from moment.runtime.dist import setup
from moment.runtime.lifetime import die_with_parent
from moment.runtime.pipeline import Pipeline
from moment.runtime.run_plan import plan_store, rank_plan
from moment.runtime.ssd_model import TierModel
from moment.runtime.disk_tier import DiskTier
from moment.runtime import exchange
from moment.runtime.exchange import RowExchange
from moment.runtime.gpu_tier import load_gpu_table
from moment.runtime.peers import PeerTier, gather_peer_map
from moment.runtime.store import Collectives, RankPlace, StoreInfo, StoreOptions, open_tiers
from moment.runtime.tier import LayoutRows, Tier
from moment.workload.sampler import CSRGraph
from moment.workload.seeds import sampling_key


COMMON = 5  # batches every rank has in the first sequence; 4 in the pipelined one
CHUNK_ROWS = 64  # rows of one chunk of the exchange here (a batch's round: several)


def batches_of(rank: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rank)
    extra = [rng.permutation(n)[:300] for _ in range(3 * rank)]  # rank 1: three batches more
    return [rng.permutation(n)[:900] for _ in range(3)] + [np.arange(n), rng.integers(0, n, 700)] + extra


def train_tag(rank: int, i: int) -> tuple:
    """Batch i of a training epoch's: every rank takes those in step, so they join the peers' rounds."""
    return sampling_key(7, 0, rank), i


def gather_all(store: Tier, want, seen: dict, step) -> None:
    """Submit ahead and complete in order, as the pipeline does; check each batch; finish the sequence."""
    pend = []
    rank = store.find(DiskTier).rank
    for i, b in enumerate(batches_of(rank, store.num_nodes)):
        pend.append((i, b, store.submit(b, train_tag(rank, i))))
        if len(pend) > store.lookahead:
            _check(store, *pend.pop(0), want, seen, step)
    for i, b, p in pend:
        _check(store, i, b, p, want, seen, step)
    store.finish()


def _check(store: Tier, i: int, b: np.ndarray, p, want, seen: dict, step) -> None:
    got = store.complete(p).cpu()
    if i < COMMON:
        step()
    if not torch.equal(got, want(b)):
        raise SystemExit("a gathered row differs from the layout's")
    # the rows the peer tier served, on their own
    at = next((part.pos for part in _parts(store, p.part) if hasattr(part, "owner")), np.zeros(0, np.int64))
    if not torch.equal(got[torch.from_numpy(at)], want(b[at])):
        raise SystemExit("a row served by the peer tier differs from the layout's")
    seen["peer_rows_checked"] += int(at.size)


def _parts(store: Tier, part):
    """The pending part of each tier of the chain, fastest first."""
    for _ in store.chain():
        yield part
        part = getattr(part, "inner", None)


def through_pipeline(store: Tier, graph: CSRGraph, labels: torch.Tensor, want, device, step) -> int:
    """A second sequence: the training pipeline (threads, lookahead, `finish` at its end), uneven batch counts."""
    rank = store.find(DiskTier).rank
    rng = np.random.default_rng(100 + rank)
    seeds = [torch.from_numpy(rng.permutation(store.num_nodes)[:64]) for _ in range(4 + 2 * rank)]
    pipe = Pipeline(graph, [5, 3], store, labels, device)
    done = 0
    for item in pipe.run(seeds, (7, 0, rank)):
        item.wait()
        if not torch.equal(item.x.cpu(), want(item.batch.n_id.numpy())):
            raise SystemExit("a pipelined batch differs from the layout's rows")
        if item.index < COMMON - 1:
            step()
        done += 1
    return done


def peer_alone(layout: Path, where: RankPlace, group, want, step) -> dict:
    """The peer tier alone over the disk tier (no GPU-tier object, no CPU cache): this rank's own GPU bins
    are read from the layout, the peers' rows come through the exchange."""
    lay = Layout.open(layout)
    plan = plan_store(lay, where, StoreOptions(buffer_bytes=1 << 20), None)
    rows = LayoutRows(lay)
    disk = DiskTier(lay, rows, where.device, plan.tiers, rank=where.rank, world_size=where.world_size)
    held, table = load_gpu_table(rows, plan.rank.gpu_bins, disk.file_rows, where.device)
    peer = PeerTier(rows, disk, where.device, group, gather_peer_map(held, group), table)
    try:
        # first a batch of k rows that all sit on the peer's tier, on both ranks: the round the exchange's
        # stated size is for (each asks k rows and serves k)
        k = min(held.rows, peer.rows)
        ids = np.arange(rows.num_nodes)
        ids = ids[peer.peers.lookup(rows.bin[ids], rows.slot[ids])[0]][:k]
        if not torch.equal(peer.complete(peer.submit(ids, train_tag(where.rank, 0))).cpu(), want(ids)):
            raise SystemExit("a row served by the peer tier differs from the layout's")
        full = peer.exchange.peak_bytes
        seen = {"peer_rows_checked": k}
        gather_all(peer, want, seen, step)
        # rank 0 alone looks the same rows up and evaluates a batch of them while rank 1 waits at a barrier (PyG's
        # `if rank == 0: test()`): they are read from the layout, in no round, so rank 0 gets to the barrier too
        if where.rank == 0:
            before = peer.tier_stats()["rows"]
            for tag in (None, (sampling_key(7, 0, 0, "val"), 0)):
                if not torch.equal(peer.complete(peer.submit(ids, tag)).cpu(), want(ids)):
                    raise SystemExit("a row of a peer's bin read alone differs from the layout's")
            after = peer.tier_stats()["rows"]
            seen["alone"] = {t: after[t] - before[t] for t in ("peer", "ssd")}
        step()
        return {"tiers": peer.tier_stats()["rows"], "chain": [t.name for t in peer.chain()], **seen,
                "full_round": full, "full_round_stated": RowExchange.round_bytes(k, rows.row_bytes, group.size),
                "exchange_peak": peer.exchange.peak_bytes, "memory": peer.memory(),
                "round_bytes": RowExchange.round_bytes(rows.num_nodes, rows.row_bytes, group.size)}
    finally:
        peer.close()


def main() -> int:
    die_with_parent(os.getppid())  # a hung rank goes down with torchrun (the test kills it on a timeout)
    layout, out, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    ctx = setup(device)  # gloo on CPU, NCCL on CUDA: the runtime's own start-up
    rank, local_rank, world, lws = ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size
    m = load_manifest(layout)
    rows = open_layout(layout)
    dtype = torch.from_numpy(np.zeros(1, m.dataset.dtype)).dtype
    exchange.CHUNK_BYTES = CHUNK_ROWS * m.row.row_bytes

    def want(ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rows.rows(ids)).view(dtype).reshape(len(ids), *m.dataset.row_shape)

    ds = Layout.open(layout).dataset
    graph, labels = CSRGraph.from_dataset(ds), torch.from_numpy(np.array(ds.labels))
    gpu_shards = [i for i, s in enumerate(m.shards) if s.kind == "gpu"]
    group = ctx.peer_group()  # every rank makes it at start-up, once
    report = {}
    n = m.dataset.num_nodes
    runs = {"peers_shared": dict(policy="static", shared_cache=True, peers=group),
            "peers_lru": dict(policy="lru", shared_cache=False, peers=group),
            "no_peers": dict(policy="static", shared_cache=False, peers=None),
            # rank 1's GPU tier is empty: rank 0 never needs a peer's row, yet serves rank 1 every batch
            "one_sided": dict(policy="lru", shared_cache=False, peers=group, gpu_rows=0 if rank == 1 else None)}
    for name, kw in runs.items():
        where = RankPlace(rank, local_rank, world, lws, ctx.device)
        coll = Collectives(barrier=ctx.barrier, peers=kw["peers"])
        plan = plan_store(Layout.open(layout), where, StoreOptions(
            cpu_rows=n // 40, buffer_bytes=1 << 20, policy=kw["policy"], shared_cache=kw["shared_cache"],
            gpu_rows=kw.get("gpu_rows")), coll)
        store = open_tiers(layout, where, plan, coll)
        try:
            seen = {"peer_rows_checked": 0}
            gather_all(store, want, seen, ctx.barrier)
            info = StoreInfo.of(store)
            report[name] = {"tiers": store.tier_stats()["rows"], "peer_rows": info.peer_rows,
                            "gpu_rows": info.gpu_rows, "memory": store.memory(),
                            "gpu_bin_rows_read": int(store.find(DiskTier)._rows_by_bin[gpu_shards].sum()),
                            "cache_rows": info.cpu_rows, **seen}
            if kw["policy"] == "static":  # the read prediction (bench/fidelity.py) knows the peer tier
                opened = Layout.open(layout)
                peers = ([rank_plan(opened, r, r, lws, None) for r in range(lws) if r != local_rank]
                         if kw["peers"] is not None else [])
                tm = TierModel(opened, plan, peers=peers)
                report[name]["model_ssd_rows"] = sum(int(np.isin(b, tm.misses(b)).sum())
                                                     for b in batches_of(rank, n))
            report[name]["pipelined_batches"] = through_pipeline(store, graph, labels, want, ctx.device, ctx.barrier)
            peer = store.find(PeerTier)
            report[name]["rounds"] = peer.exchange.rounds if peer is not None else 0
            report[name]["chunks"] = peer.exchange.chunks if peer is not None else 0
            report[name]["received_rows"] = store.tier_stats()["rows"]["peer"]  # both sequences
            report[name]["served_rows"] = peer.served_rows if peer is not None else 0
        finally:
            store.close()
        ctx.barrier()
    report["peer_alone"] = peer_alone(layout, RankPlace(rank, local_rank, world, lws, ctx.device), group, want,
                                      ctx.barrier)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
