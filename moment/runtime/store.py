"""The tiered feature store: own GPU cache -> peers' GPU caches -> CPU cache (a cache policy) -> SSD shards.

Why this shape (Moment §3.1, Hyperion §III-A/B, Ginex §4, AGNES §4): every rank looks a node up in the
fastest tier that holds it and reads the rest from the layout's files through its own reader thread
and I/O stack, with submission and completion split (`submit` / `complete`) so the reads of later
batches run while earlier ones train.

Tiers, per rank (`index.npy` maps node -> (bin, slot); every bin, cache bins included, is a file):

* ``gpu`` — the GPU-cache bins of the plan GPUs this rank serves (moment.runtime.devices: bin j of the
  layout's GPU bins belongs to local rank j % local_world_size), loaded into a tensor on `device`; on
  CPU runs it stands in for device memory and is capped by `gpu_rows` (the budget's grant), hottest
  rows first.
* ``peer`` — rows on the GPU tier of another rank of the same node (moment.runtime.peers): fetched
  from their owner by a collective exchange per batch (NCCL device to device on GPUs, gloo on CPU);
  never read from the layout, never a CPU-cache candidate. Needs the node's group (`Collectives.peers`,
  made by `DistContext.peer_group`); `moment train --no-peer-tier` goes without. With it, every rank
  completes its batches in rounds with the others: call `finish()` after the last batch of each
  sequence (the pipeline does), or have every rank complete as many batches.
* ``cpu`` — `HostCache`: `cpu_rows` rows in memory the runtime owns, managed by a cache policy from
  `moment.caching` (the same objects the simulator replays): ``static`` (the hottest rows by the
  layout's pre-sampled hotness order; one shared segment for all local ranks), ``lru``, or
  ``belady-superbatch`` (Ginex: the next superbatch's sampled accesses decide what stays; the rows it
  admits are copied in from the reads that fetched them, which is Ginex's changeset).
* ``ssd`` — everything else, read with O_DIRECT by the rank's `Reader` in the chosen I/O shape:
  ``rows`` (each batch's misses, merged only where they share blocks), ``block`` (the misses of a
  hyperbatch of batches at once, merged across small gaps into large reads; see moment.io.merge) or
  ``packed`` (DiskGNN: as block, but a batch's misses are read from the segment `moment data pack`
  wrote for it, contiguous, when the batch is tagged with its sampling key and the pack holds them;
  any other row comes from the layout).

Batches are routed in superbatches of `superbatch` batches by `moment.caching.tiers.TierRouter` (the
policy is told the superbatch's accesses first); `complete` waits for a batch's reads, then fills its rows from the tiers in order,
so a row admitted by batch i is in the cache before batch i+1 reads it. Bit-identical to the
dataset's features on every tier, policy and shape (tested).

Construct it as ``TieredFeatureStore(layout, where, options, collectives)`` (moment.runtime.store_options):
`layout` a path or an opened `moment.placement.opened.Layout`, `where` who this rank is (a `RankPlace`,
or the launcher's `DistContext`), `options` this rank's part of a training run's plan
(`RunPlan.store_plan(rank)`, moment.runtime.run_plan) or a `StoreOptions` (the option names above are
its fields), resolved by the same rules (`plan_store`); `collectives` the process group's barrier and
the peer tier's group (None: one process, no peer tier, no shared cache). `StoreOptions(verify=True)` checks each
shard chunk (manifest `chunk_sha256`) the first time a read touches it.
PyG code reads it through `moment.runtime.pyg.PygFeatureStore(store)`, on the same submit/complete path.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from moment.caching import make_policy
from moment.caching.policies import rank_dtype
from moment.caching.tiers import TierRouter, no_gpu, no_peers, slots_for
from moment.errors import MomentError
from moment.outputs import bad_chunk
from moment.placement.manifest import Shard
from moment.placement.opened import Layout
from moment.placement.pack import open_pack, pack_path
from moment.placement.reader import shard_path
from moment.io.device import DeviceLayer, StagingRing
from moment.io.merge import SHAPES
from moment.runtime.gather import BufferPool, Job, Reader
from moment.runtime.hostcache import HostCache, shm_room
from moment.runtime.peers import TierMap, open_peers
from moment.runtime.run_plan import StorePlan, TierPlan, plan_store
from moment.runtime.store_options import Collectives, Place, RankPlace, StoreOptions
from moment.sizes import parse_size

TIERS = ("gpu", "peer", "cpu", "ssd")
__all__ = ["TIERS", "Collectives", "RankPlace", "StoreOptions", "StorePlan", "TieredFeatureStore", "parse_size"]


@dataclass
class TierCounters:
    """Rows and logical bytes served per tier, plus what the reader actually read."""

    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    ssd_requests: int = 0
    ssd_bytes_read: int = 0
    admitted: int = 0
    packed: int = 0  # ssd rows read from the pack

    def as_dict(self) -> dict[str, Any]:
        looked = self.rows["cpu"] + self.rows["ssd"]
        return {"rows": dict(self.rows), "bytes": dict(self.bytes), "ssd_requests": self.ssd_requests,
                "ssd_bytes_read": self.ssd_bytes_read, "cpu_admitted_rows": self.admitted,
                "cpu_hit_rate": self.rows["cpu"] / looked if looked else 0.0, "packed_rows": self.packed}


@dataclass
class Pending:
    """A batch submitted: its tiers are decided when its superbatch closes."""

    ids: np.ndarray
    sb: _Superbatch
    segment: int | None = None  # the pack segment prepared for this batch
    gpu_pos: np.ndarray | None = None
    gpu_idx: np.ndarray | None = None
    peer_pos: np.ndarray | None = None
    peer_owner: np.ndarray | None = None
    peer_idx: np.ndarray | None = None
    hit_pos: np.ndarray | None = None
    hit_slot: np.ndarray | None = None
    miss_pos: np.ndarray | None = None
    miss_row: np.ndarray | None = None  # row of each miss in its job's destination
    admit_pos: np.ndarray | None = None
    admit_slot: np.ndarray | None = None
    ref: _JobRef | None = None

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class _Superbatch:
    batches: list[Pending] = field(default_factory=list)
    closed: bool = False


class _JobRef:
    """Gives a job's destination back to the pool once every batch using it has been completed."""

    def __init__(self, pool: BufferPool, job: Job, users: int):
        self.pool, self.job, self.users = pool, job, users

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.job.dest is not None:
            self.pool.give(self.job.dest.nbytes)
            self.job.dest = None


def _check_chunks(path: Path, s: Shard, chunks: np.ndarray | None = None) -> None:
    """Re-hash the given chunks (all when None) of a layout file against the manifest."""
    k = bad_chunk(path, s.chunk_bytes, s.chunk_sha256, None if chunks is None else chunks.tolist())
    if k is not None:
        off = k * s.chunk_bytes
        raise MomentError(
            f"bin {s.bin}: checksum mismatch in chunk {k} (bytes {off}..{off + s.chunk_bytes}); "
            "refusing to return its rows", source=str(path),
            hint="the layout is damaged: run `moment layout verify` and rewrite it")


class TieredFeatureStore:
    """Gathers node features from a layout, bit-exactly as stored in the dataset.

    Use `gather(ids)`, or `submit(ids)` now and `complete(pending)` later from the same thread
    (completions in submission order). `lookahead` is how many batches a caller may submit before completing the first.
    """

    def __init__(self, layout: str | Path | Layout, where: Place = RankPlace(),
                 options: StoreOptions | StorePlan = StoreOptions(), collectives: Collectives | None = None):
        lay = layout if isinstance(layout, Layout) else Layout.open(layout)
        # a training run hands over its RunPlan's part; options given directly are resolved by the same rules
        self.plan = plan = options if isinstance(options, StorePlan) else plan_store(lay, where, options, collectives)
        t = plan.tiers
        rank, local_rank = where.rank, where.local_rank
        barrier = collectives.barrier if collectives is not None else None
        self.path = lay.path
        self.manifest = m = lay.manifest
        self.rank, self.local_rank, self.world_size = rank, local_rank, where.world_size
        self.local_world_size = plan.local_world_size
        self.device = torch.device(where.device)
        self.verify = t.verify
        self.dtype = np.dtype(m.dataset.dtype)
        self.row_shape = tuple(m.dataset.row_shape)
        self.row_bytes = rb = m.row.row_bytes
        self.num_nodes = n = m.dataset.num_nodes
        self.counters = TierCounters()
        self.shape = t.io_shape
        self.superbatch = t.superbatch
        self._check_files()
        self._bin, self._slot = lay.load_index()
        self._load_pack(lay, t)
        nb = len(m.shards)
        self._stride = np.array([s.stride for s in m.shards], dtype=np.int64)
        self._verified: dict[int, np.ndarray] = {}
        self._rows_by_bin = np.zeros(nb, dtype=np.int64)  # distinct rows each job read, by home bin
        # rows are assembled in host buffers (pinned on CUDA, and copied to the device on a side stream)
        self._staging = StagingRing(DeviceLayer(self.device))

        # gpu tier: this rank's GPU bins, hottest rows first, as the plan carved them (run_plan.carve_gpu)
        self.gpu_bins = [g.bin for g in plan.rank.gpu_bins]  # the plan GPUs' bins this rank holds
        self._gpu_base = np.zeros(nb, dtype=np.int64)
        self._gpu_limit = np.zeros(nb, dtype=np.int64)
        gpu = np.empty((plan.rank.gpu_rows, rb), np.uint8)
        at = 0
        for g in plan.rank.gpu_bins:
            self._gpu_base[g.shard], self._gpu_limit[g.shard] = at, g.rows
            if g.rows:
                gpu[at:at + g.rows] = self._read_file_rows(g.shard, g.rows)
            at += g.rows
        self._gpu = torch.from_numpy(gpu).to(self.device)
        del gpu
        # peer tier: the GPU tiers of this node's other ranks, through the exchange (moment.runtime.peers)
        group = collectives.peers if collectives is not None else None
        self.peers = (open_peers(TierMap(self._gpu_base, self._gpu_limit), self._gpu, group)
                      if group is not None else None)
        self.gpu_rows = int(self._gpu.shape[0])
        self.peer_rows = self.peers.rows if self.peers is not None else 0

        # reader: every bin's file, in bin order, then this rank's pack file
        self.paths = [shard_path(self.path, s) for s in m.shards]
        if self.pack is not None:
            self.paths.append(pack_path(self.path) / self.pack.files[rank].data)
        cap = t.cpu_rows
        self.pool = BufferPool(t.buffer_bytes)
        self.reader = Reader(self.paths, rb, m.row.align, pool=self.pool, window=t.window,
                             queue_depth=t.queue_depth, backend=t.io_backend, direct=t.direct)

        # cpu tier: the policy's contents in a HostCache; a slot map node -> slot
        self.policy_name = policy = t.policy
        shared = t.shared_cache
        if shared and (why := shm_room(cap * rb)):
            warnings.warn(f"shared CPU cache not possible ({why}); each rank keeps its own", stacklevel=2)
            shared = False
        self.shared_cache = bool(shared)
        order = lay.hot_order()
        rank = np.empty(n, rank_dtype(n))
        rank[order] = np.arange(n, dtype=rank.dtype)
        # rows on a GPU tier need no CPU copy: this rank's own, and its peers'; a shared cache holds the
        # same rows for every local rank, so it leaves out only what every one of them gets from a GPU
        # (all the node's GPU tiers, when there are peers; else nothing)
        if self.peers is not None or (self.gpu_rows and not self.shared_cache):
            on = self._on_gpu(order)
            if self.peers is not None:
                on |= self.peers.lookup(self._bin[order], self._slot[order])[0]
            rank[order[on]] = n - 1
            order = order[~on]
        cap = min(cap, order.shape[0])
        self.policy = make_policy(policy, cap, n, rank=rank)
        initial = np.array(order[:cap], dtype=np.int64)
        del order
        self.policy.reset(initial)
        del rank
        self.slots = slots_for(self.policy, initial, n)
        self.router = TierRouter(self.policy, self.slots, self._gpu_lookup if self.gpu_rows else no_gpu,
                                 self._peer_lookup if self.peer_rows else no_peers)
        if self.shared_cache:
            self.cache = HostCache.shared_segment(self._run_key(str(cap)), cap, rb, creator=self.local_rank == 0,
                                                  fill=lambda rows: self._fill(rows, initial), barrier=barrier)
        else:
            self.cache = HostCache(cap, rb)
            self._fill(self.cache.rows, initial)
        self._open: _Superbatch = _Superbatch()
        self.lookahead = t.lookahead

    # ------------------------------------------------------------------ setup

    def _check_files(self) -> None:
        for s in self.manifest.shards:
            fp = shard_path(self.path, s)
            if not fp.is_file():
                raise MomentError(f"{s.kind} shard of bin {s.bin} is missing", source=str(fp),
                                  hint="the layout is incomplete or its SSD is not mounted")
            size = fp.stat().st_size
            if size != s.bytes:
                raise MomentError(f"shard of bin {s.bin}: size {size} B, manifest says {s.bytes} B",
                                  source=str(fp), hint="the shard was truncated or replaced; rewrite the layout")

    def _load_pack(self, lay: Layout, t: TierPlan) -> None:
        self.pack, self.segments, self._pack_seed = None, None, t.pack_seed
        if t.shape != "packed":
            return
        self.pack, self.segments = open_pack(self.path, self.manifest, lay.pack, world_size=self.world_size,
                                             rank=self.rank, hashes=self.verify)

    def _run_key(self, what: str) -> str:
        """Names this run's shared segments: the same on every local rank, new for each (re)start."""
        env = os.environ
        return hashlib.sha256(f"{self.path.absolute()}|{what}|{env.get('TORCHELASTIC_RUN_ID', '')}|"
                              f"{env.get('TORCHELASTIC_RESTART_COUNT', '')}|"
                              f"{env.get('MASTER_PORT', '')}".encode()).hexdigest()[:16]

    @property
    def index_bytes(self) -> int:
        return self._bin.nbytes + self._slot.nbytes

    def _on_gpu(self, ids: np.ndarray) -> np.ndarray:
        b = self._bin[ids]
        return self._slot[ids] < self._gpu_limit[b]

    def _gpu_lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of ids on this rank's GPU tier, their rows in it)."""
        mask = self._on_gpu(ids)
        on = ids[mask]
        return mask, self._gpu_base[self._bin[on]] + self._slot[on]

    def _peer_lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mask of ids on a peer's GPU tier, the peer of each, their rows in its tier)."""
        return self.peers.lookup(self._bin[ids], self._slot[ids])

    def _locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = self._bin[ids].astype(np.int32)
        return b, self._slot[ids].astype(np.int64) * self._stride[b]

    def _read_file_rows(self, b: int, k: int) -> np.ndarray:
        """The first k rows of bin b's file (setup only)."""
        s = self.manifest.shards[b]
        fp = shard_path(self.path, s)
        if self.verify:
            _check_chunks(fp, s, np.arange(-(-k * s.stride // s.chunk_bytes)))
        raw = np.fromfile(fp, dtype=np.uint8, count=k * s.stride).reshape(k, s.stride)
        return np.ascontiguousarray(raw[:, : self.row_bytes])

    def _fill(self, rows: np.ndarray, ids: np.ndarray) -> None:
        """Read the rows of `ids` into `rows` (the cache at start) through the reader, in large reads."""
        if not ids.shape[0]:
            return
        f, off = self._locate(ids)
        if self.verify:
            self._verify_chunks(f, off)
        job = Job(f, off, SHAPES["block"], dest=rows[: ids.shape[0]])
        self.reader.submit(job).wait()

    @property
    def backend(self) -> str:
        return self.reader.backend

    @property
    def stack(self):
        return self.reader.stack

    @property
    def feature_dim(self) -> int:
        return int(np.prod(self.row_shape))

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds, by item (the shared cache counted here in full). The peers' GPU tiers are
        their owners': this rank holds only the rows of the batch in flight that they sent."""
        return {"gpu_cache": int(self._gpu.nelement()), "cpu_cache": self.cache.nbytes,
                "index": self.index_bytes, "slot_map": self.slots.memory_bytes(),
                "pack_index": self.segments.memory_bytes if self.segments is not None else 0,
                "policy": self.policy.memory_bytes(), "read_buffers": self.pool.capacity,
                "staging": self.reader.staging_bytes}

    # ------------------------------------------------------------------ gather

    def _ids(self, node_ids) -> np.ndarray:
        if isinstance(node_ids, torch.Tensor):
            node_ids = node_ids.detach().cpu().numpy()
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise MomentError(f"node ids must be in [0, {self.num_nodes})", source=str(self.path))
        return ids

    def submit(self, node_ids, tag: tuple | None = None) -> Pending:
        """Queue a batch; its reads go out when its superbatch is complete (at once when superbatch=1).

        `tag` is ((seed, epoch, rank), batch) for a training batch; with a pack, it finds the batch's segment.
        """
        p = Pending(self._ids(node_ids), self._open, self._segment(tag))
        self._open.batches.append(p)
        if len(self._open.batches) >= self.superbatch:
            self._close()
        return p

    def _segment(self, tag: tuple | None) -> int | None:
        if self.segments is None or tag is None:
            return None
        key, i = tag
        if len(key) != 3 or key[0] != self._pack_seed or key[2] != self.rank:
            return None  # evaluation batches, or another sampling key: not packed
        return self.segments.find(int(key[1]), int(i))

    def flush(self) -> None:
        """Decide and issue the open superbatch now (end of an epoch)."""
        if self._open.batches:
            self._close()

    def _close(self) -> None:
        sb, self._open = self._open, _Superbatch()
        sb.closed = True
        for p, r in zip(sb.batches, self.router.route([p.ids for p in sb.batches]), strict=True):
            p.gpu_pos, p.gpu_idx, p.hit_pos, p.hit_slot = r.gpu_pos, r.gpu_idx, r.hit_pos, r.hit_slot
            p.miss_pos, p.admit_pos, p.admit_slot = r.miss_pos, r.admit_pos, r.admit_slot
            p.peer_pos, p.peer_owner, p.peer_idx = r.peer_pos, r.peer_owner, r.peer_idx
        self._issue(sb)

    def _issue(self, sb: _Superbatch) -> None:
        """Reads for the superbatch's misses: one job per batch (rows) or per hyperbatch (block)."""
        cap = max(1, self.pool.capacity // (2 * self.row_bytes))
        groups: list[list[Pending]] = []
        if self.shape.name == "rows":
            groups = [[p] for p in sb.batches]
        else:
            cur, seen = [], 0
            for p in sb.batches:
                k = int(p.miss_pos.shape[0])
                if cur and seen + k > cap:
                    groups.append(cur)
                    cur, seen = [], 0
                cur.append(p)
                seen += k
            if cur:
                groups.append(cur)
        for grp in groups:
            ids = [p.ids[p.miss_pos] for p in grp]
            if len(grp) == 1:
                u, inv = np.unique(ids[0], return_inverse=True)
                grp[0].miss_row = inv.reshape(-1)
            else:
                u = np.unique(np.concatenate(ids))
                for p, x in zip(grp, ids, strict=True):
                    p.miss_row = np.searchsorted(u, x)
            f, off = self._locate(u)
            self._rows_by_bin += np.bincount(self._bin[u], minlength=self._rows_by_bin.shape[0])
            if self.verify:
                self._verify_chunks(f, off)
            if self.segments is not None:
                self._from_pack(grp, u, f, off)
            job = Job(f, off, self.shape)
            ref = _JobRef(self.pool, job, len(grp))
            for p in grp:
                p.ref = ref
            self.reader.submit(job)

    def _from_pack(self, grp: list[Pending], u: np.ndarray, f: np.ndarray, off: np.ndarray) -> None:
        """Point the rows a batch's pack segment holds at the pack file (in place; first batch wins)."""
        todo = np.ones(u.shape[0], bool)
        pack_file = len(self.paths) - 1
        for p in grp:
            if p.segment is None:
                continue
            found, at = self.segments.locate(p.segment, u, self.row_bytes)
            found &= todo
            f[found], off[found] = pack_file, at[found]
            todo &= ~found
            self.counters.packed += int(found.sum())

    def _verify_chunks(self, bb: np.ndarray, off: np.ndarray) -> None:
        for bi in np.unique(bb).tolist():
            s = self.manifest.shards[bi]
            done = self._verified.setdefault(bi, np.zeros(len(s.chunk_sha256), dtype=bool))
            o = off[bb == bi]
            ks = np.unique(np.concatenate([o // s.chunk_bytes, (o + self.row_bytes - 1) // s.chunk_bytes]))
            todo = ks[~done[ks]]
            if todo.size:
                _check_chunks(shard_path(self.path, s), s, todo)
                done[todo] = True

    def complete(self, p: Pending) -> torch.Tensor:
        """Wait for the reads of `p`; the rows as a tensor [n, *row_shape] on `device`. With a peer tier,
        one round of the exchange with the node's other ranks (they complete in step; see `finish`)."""
        stage = self._staging.take(p.n * self.row_bytes)  # pinned on CUDA: the copy below is asynchronous
        self._to_host(p, stage.array[: p.n * self.row_bytes].reshape(p.n, self.row_bytes))
        c = self.counters
        for name, k in (("gpu", p.gpu_pos.size), ("peer", p.peer_pos.size), ("cpu", p.hit_pos.size),
                        ("ssd", p.miss_pos.size)):
            c.rows[name] += int(k)
            c.bytes[name] += int(k) * self.row_bytes
        out = stage.to_device(p.n * self.row_bytes).view(p.n, self.row_bytes)
        if p.gpu_pos.size:
            out[torch.from_numpy(p.gpu_pos).to(out.device)] = self._gpu[torch.from_numpy(p.gpu_idx).to(self._gpu.device)]
        if self.peers is not None:  # a round for every batch, whether or not it needs a peer's rows
            self.peers.gather(p.peer_owner, p.peer_idx, out, p.peer_pos)
        if p.n == 0:
            return torch.empty((0, *self.row_shape), dtype=_torch_dtype(self.dtype), device=out.device)
        return out.view(_torch_dtype(self.dtype)).reshape(p.n, *self.row_shape)

    def _to_host(self, p: Pending, host: np.ndarray) -> None:
        """The rows of `p` that the CPU cache and the reads serve, into `host`; the admissions they make."""
        if not p.sb.closed:
            self.flush()
        c = self.counters
        if p.hit_pos.size:
            host[p.hit_pos] = self.cache.rows[p.hit_slot]
        if p.miss_pos.size:
            host[p.miss_pos] = p.ref.job.wait()[p.miss_row]
        if p.ref is not None:
            if p.ref.users == 1:  # the job's last batch: count its reads once
                c.ssd_requests += p.ref.job.requests
                c.ssd_bytes_read += p.ref.job.bytes_read
            p.ref.release()
        if p.admit_pos is not None:
            self.cache.rows[p.admit_slot] = host[p.admit_pos]
            c.admitted += int(p.admit_pos.shape[0])

    def cancel(self, p: Pending) -> None:
        """Drop `p` unread by the caller (it stopped early): its reads are waited for and its admissions to
        the CPU cache made, so the store stays consistent; no exchange round."""
        self._to_host(p, np.empty((p.n, self.row_bytes), dtype=np.uint8))

    def finish(self) -> None:
        """The last batch of a sequence is completed: with a peer tier, serve the node's other ranks until
        they have completed theirs (collective; every rank calls it at the end of each sequence)."""
        if self.peers is not None:
            self.peers.finish()

    def gather(self, node_ids) -> torch.Tensor:
        return self.complete(self.submit(node_ids))

    def tier_stats(self) -> dict[str, Any]:
        return self.counters.as_dict()

    def ssd_shares(self) -> dict[str, dict[str, float]]:
        """Per SSD: the share of this rank's SSD rows the plan routes to it (the run plan's
        `ssd_shares`) and the share it actually served."""
        ssd = [i for i, s in enumerate(self.manifest.shards) if s.kind == "ssd"]
        got = self._rows_by_bin[ssd].astype(np.float64)
        achieved = got / got.sum() if got.sum() > 0 else got
        planned = self.plan.rank.ssd_shares
        return {self.manifest.shards[i].bin: {"planned": planned[self.manifest.shards[i].bin], "achieved": float(a),
                                              "rows": int(g)}
                for i, a, g in zip(ssd, achieved, got, strict=True)}

    def epoch_start(self, epoch: int) -> None:  # the FeatureSource protocol
        pass

    def close(self) -> None:
        """Stop the reader and free the caches (a shared segment goes with its last user)."""
        if getattr(self, "reader", None) is not None:
            self.reader.close()
            self.reader = None
        if getattr(self, "cache", None) is not None:
            self.cache.close()
        if getattr(self, "peers", None) is not None:
            self.peers.close()

    def __del__(self) -> None:
        if getattr(self, "reader", None) is not None:
            self.close()


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.from_numpy(np.zeros(1, dtype=dt)).dtype
