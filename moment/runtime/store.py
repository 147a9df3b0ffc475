"""The feature store of a rank: the chain of tiers its run plan calls for, built by `open_store`.

Why a factory: the tiers (moment.runtime.tier) are small objects, each wrapping the next: own GPU cache
(moment.runtime.gpu_tier) -> the peers' GPU caches (moment.runtime.peers) -> CPU cache
(moment.runtime.cpu_tier) -> the layout's files and pack (moment.runtime.disk_tier). What they need
from each other at start-up (the rows every GPU tier of the node holds, so the CPU cache leaves them
out; the shared cache's segment) and the collectives that set it up (the peers' `all_gather`, the local
ranks' barrier) are done here, once, in the same order on every rank. A tier the run does not have (no
GPU cache rows, no peers, no CPU-cache rows) is not in the chain. Callers use only the feature-source
contract (moment.runtime.sources.FeatureSource) and the `StoreInfo` that says what was built.

`open_store(run_plan, dist)` opens a training rank's store; `open_tiers(layout, where, options,
collectives)` one outside a run (tests, benchmarks, notebooks), its options resolved by the rules a run
plan uses (moment.runtime.run_plan.plan_store). PyG code reads a store through
`moment.runtime.pyg.PygFeatureStore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from moment.errors import MomentError
from moment.placement.opened import Layout
from moment.runtime.cpu_tier import CpuTier, cache_shared, open_cpu_tier
from moment.runtime.disk_tier import DiskTier
from moment.runtime.gpu_tier import GpuTier, TierMap, load_gpu_table
from moment.runtime.peers import PeerTier, gather_peer_map
from moment.runtime.remote_tier import RemoteTier
from moment.runtime.run_plan import RunPlan, StorePlan, plan_store
from moment.runtime.store_options import Collectives, Place, RankPlace, StoreOptions
from moment.runtime.tier import TIERS, LayoutRows, Tier

__all__ = ["TIERS", "Collectives", "RankPlace", "StoreInfo", "StoreOptions", "open_store", "open_tiers"]


@dataclass(frozen=True)
class StoreInfo:
    """What a rank's chain holds, as built (where it differs from the plan: a shared cache the machine
    had no room for, the rows the CPU cache leaves to the GPU tiers, the rows the peers hold)."""

    tiers: tuple[str, ...]  # the chain's tiers, fastest first (names as in TIERS)
    gpu_rows: int  # rows on this rank's GPU tier
    peer_rows: int  # rows on the other local ranks' GPU tiers (0 without a peer tier)
    peers: bool  # a peer tier is in the chain
    remote_rows: int  # rows other machines own (a split layout's remote tier; 0 without one)
    cpu_rows: int  # CPU-cache rows
    shared_cache: bool  # the CPU cache is one segment for the machine's ranks
    backend: str  # the reader's I/O backend

    @classmethod
    def of(cls, top: Tier) -> StoreInfo:
        gpu, peer, cpu, far = top.find(GpuTier), top.find(PeerTier), top.find(CpuTier), top.find(RemoteTier)
        return cls(tiers=tuple(t.name for t in top.chain()), gpu_rows=gpu.rows if gpu else 0,
                   peer_rows=peer.rows if peer else 0, peers=peer is not None, remote_rows=far.rows if far else 0,
                   cpu_rows=cpu.capacity if cpu else 0, shared_cache=bool(cpu and cpu.shared), backend=top.backend)

    def summary(self) -> str:
        """Cache and peer figures for the run's start-up summary."""
        return (f"{self.cpu_rows} rows ({'shared' if self.shared_cache else 'per rank'}), gpu stand-in "
                f"{self.gpu_rows} rows{f', peers {self.peer_rows} rows' if self.peers else ''}"
                f"{f', other machines {self.remote_rows} rows' if self.remote_rows else ''}")


def open_store(run_plan: RunPlan, dist: Any, layout: Layout | None = None) -> tuple[Tier, StoreInfo]:
    """This rank's chain, as `run_plan` says (`dist`: the launcher's `DistContext`; `layout`: the run's,
    opened once). Collective under torchrun: every rank calls it at the same point of start-up."""
    lay = layout if layout is not None else Layout.open(run_plan.layout)
    mine = run_plan.store_plan(dist.rank)
    if mine.rank.local_rank != dist.local_rank:
        raise MomentError(f"rank {dist.rank} is local rank {dist.local_rank}, where the run plan expected local rank "
                          f"{mine.rank.local_rank}: the ranks of a machine must be numbered consecutively, as "
                          "torchrun numbers them")
    coll = None
    if dist.backend:
        coll = Collectives(barrier=dist.local_barrier, peers=dist.peer_group() if run_plan.tiers.peer_tier else None,
                           remote=dist.remote_group() if run_plan.tiers.remote_tier else None)
    top = _chain(lay, mine, dist, coll)
    return top, StoreInfo.of(top)


def open_tiers(layout: str | Path | Layout, where: Place = RankPlace(), options: StoreOptions | StorePlan = StoreOptions(),
               collectives: Collectives | None = None) -> Tier:
    """A store outside a training run: `where` this rank is, its `options` (or a rank's part of a run
    plan), the process group's `collectives` (None: one process, no peer tier, no shared cache). Given no
    sizes it is as out of core as the layout planned: the CPU cache holds the layout's CPU bins and the rest
    is read from the SSDs; `StoreOptions(memory_budget=...)` sizes it as `moment train --memory-budget` does."""
    lay = layout if isinstance(layout, Layout) else Layout.open(layout)
    plan = options if isinstance(options, StorePlan) else plan_store(lay, where, options, collectives)
    return _chain(lay, plan, where, collectives)


def _chain(lay: Layout, plan: StorePlan, where: Place, coll: Collectives | None) -> Tier:
    """Bottom up: the disk tier, the GPU tier's rows (read through it), the peers' maps (all_gather), the
    CPU cache without what the GPU tiers serve or other machines own (a shared one behind the local ranks'
    barrier), then the tiers that wrap it: other machines' rows (a split layout), the peers', this rank's
    GPU tier."""
    t = plan.tiers
    device = torch.device(where.device)
    rows = LayoutRows(lay)
    far = coll.remote if coll is not None else None
    if rows.split is not None and far is None:
        s = rows.split
        raise MomentError(f"this is machine {s.name}'s part of a layout split over {len(s.machines)} machines: "
                          f"{s.remote_rows:,} of its rows are on the others, which only a run on all of them can "
                          "fetch", source=str(lay.path),
                          hint=f"start it on each machine: moment train --nnodes {len(s.machines)} --node-rank K "
                               "--rdzv-endpoint HOST:PORT --layout <machine K's layout>")
    disk = DiskTier(lay, rows, device, t, rank=where.rank, world_size=where.world_size,
                    planned_shares=plan.rank.ssd_shares)
    try:
        held, own = load_gpu_table(rows, plan.rank.gpu_bins, disk.file_rows, device)  # chunk by chunk
        group = coll.peers if coll is not None else None
        peers = gather_peer_map(held, group) if group is not None else None
        shared = cache_shared(t, rows.row_bytes)
        cpu = open_cpu_tier(lay, rows, disk, device, t, shared=shared, held=_gpu_held(rows, held, peers, shared),
                            creator=where.local_rank == 0, barrier=coll.barrier if coll is not None else None)
        top: Tier = cpu if cpu is not None else disk
        if far is not None:
            top = RemoteTier(rows, top, device, far, lay, t, disk)
        if peers is not None:
            top = PeerTier(rows, top, device, group, peers, own)
        if held.rows:
            top = GpuTier(rows, top, device, held, own)
        top.batch_bytes = t.batch_bytes  # the staging ring's slots (the tier that completes batches makes it)
        return top
    except BaseException:
        disk.release()
        raise


def _gpu_held(rows: LayoutRows, own: TierMap, peers: Any, shared: bool):
    """The rows the CPU cache leaves out: those a GPU tier serves, this rank's and with peers the node's,
    and those other machines own (a split layout); a shared cache holds the same rows for every local
    rank, so without peers it leaves out no GPU tier's rows."""
    split = rows.split is not None
    if peers is None and not split and (not own.rows or shared):
        return None

    def held(ids: np.ndarray) -> np.ndarray:
        on = rows.remote(ids)
        if peers is not None or not shared:
            on |= own.holds(rows, ids)
        if peers is not None:
            on |= peers.lookup(rows.bin[ids], rows.slot[ids])[0]
        return on

    return held
