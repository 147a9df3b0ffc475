"""The last tier: rows read from the layout's files (and the pack's) by the rank's own reader.

Why (Moment (SC'25), section 3.1; Hyperion, section III-B; AGNES, section 4; DiskGNN): every rank reads
the rows no memory tier holds with O_DIRECT through its own reader thread and I/O stack, with
submission and completion apart so the reads of later batches run while earlier ones train. The I/O
shape decides the reads: ``rows`` (each batch's rows, merged only where they share blocks), ``block``
(the rows of a hyperbatch of batches at once, merged across small gaps into large reads; see
moment.io.merge) or ``packed`` (as block, but a batch's rows are read from the segment `moment data
pack` wrote for it, contiguous, when the batch is tagged with its sampling key and the pack holds them,
evaluation batches too in packs that hold them; any other row comes from the layout). Batches are issued
in superbatches of `superbatch` (or when the tier above flushes). With `verify`, each shard chunk is
checked against the manifest's `chunk_sha256` the first time a read touches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moment.caching.tiers import NodeBits
from moment.caching.tiers import lookahead as lookahead_of
from moment.errors import MomentError
from moment.io.files import forget_pages
from moment.io.merge import SHAPES, SIZE_BUCKETS, Placed, place
from moment.io.rows import copy_rows
from moment.io.trace import rank_trace
from moment.outputs import bad_chunk
from moment.placement.manifest import Shard
from moment.placement.opened import Layout
from moment.placement.pack import EVAL_SPLITS, cached_mask, open_pack, pack_path
from moment.placement.reader import shard_path
from moment.runtime.gather import BufferPool, Job, Reader
from moment.runtime.run_plan import TierPlan
from moment.runtime.sources import in_step
from moment.runtime.tier import LayoutRows, Tier
from moment.workload.seeds import split_of

# a batch reads its segment whole when the segment holds at most this much more than it asks, or when reading it
# whole costs the disk at most this much more than the general path's reads of the rows it asks (`_whole_pays`)
SEGMENT_SLACK = 1 / 4


class _JobRef:
    """Gives a job's destination back to the pool once every batch using it has been completed."""

    def __init__(self, pool: BufferPool | None, job: Job, users: int):
        self.pool, self.job, self.users = pool, job, users  # pool None: the destination is not the pool's

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.job.dest is not None:
            if self.pool is not None:
                self.pool.release(self.job.dest)
            self.job.dest = None


@dataclass
class _Part:
    ids: np.ndarray  # the rows to read
    pos: np.ndarray | None  # their positions in the batch
    segment: int | None  # the pack segment prepared for this batch
    row: np.ndarray | None = None  # row of each id in its job's destination
    ref: _JobRef | None = None  # its job, once issued
    stepped: bool = True  # a training batch's (sources.in_step)


def _check_chunks(path: Path, s: Shard, chunks: np.ndarray | None = None) -> None:
    """Re-hash the given chunks (all when None) of a layout file against the manifest."""
    k = bad_chunk(path, s.chunk_bytes, s.chunk_sha256, None if chunks is None else chunks.tolist())
    if k is not None:
        raise MomentError(
            f"bin {s.bin}: checksum mismatch in chunk {k} ({s.chunk_span(k)}); "
            "refusing to return its rows", source=str(path),
            hint="the layout is damaged: run `moment layout verify` and rewrite it")


class DiskTier(Tier):
    """Reads rows from the layout's files (rank `rank` of `world_size`: its pack file) as `t` shapes them."""

    name = "ssd"

    def __init__(self, layout: Layout, rows: LayoutRows, device: Any, t: TierPlan, *, rank: int = 0,
                 world_size: int = 1, planned_shares: dict[str, float] | None = None):
        super().__init__(rows, None, device)
        self.path, self.manifest = layout.path, layout.manifest
        self.rank, self.verify = rank, t.verify
        self.shape, self.superbatch = t.io_shape, t.superbatch
        self.planned_shares = planned_shares or {}
        layout.check_files()
        self.pack, self.segments, self._pack_seed = None, None, t.pack_seed
        self._pack_cached: NodeBits | None = None  # the rows the pack took as cached
        #: the hottest rows this rank's caches hold, all of them (`open_cpu_tier`): the `--cached` of a pack for this
        #: run (None: not known, no pack or a cache whose contents change)
        self.pack_fit: int | None = None
        # rows the pack took as cached, read from the layout for training batches: this run's caches do not hold
        # them. Not an evaluation batch's: those read the peers' bins themselves (sources.in_step), which no
        # --cached fits
        self.left_out = 0
        if t.shape == "packed":
            self.pack, self.segments = open_pack(self.path, self.manifest, layout.pack, world_size=world_size,
                                                 rank=rank, hashes=self.verify)
        self._verified: dict[int, np.ndarray] = {}
        self._rows_by_bin = np.zeros(len(self.manifest.shards), dtype=np.int64)  # distinct rows read, by bin
        self.packed = 0
        self.segment_batches = 0  # batches read as their whole segments (`_issue_segments`, `take_whole`)
        self.whole_batches = 0  # of those, read straight into the batch's own buffer (`take_whole`)
        self._direct_done = 0  # rows a closed reader read straight into their destination
        self.request_sizes = np.zeros((2, SIZE_BUCKETS))  # merge.size_histogram of every read counted
        # every bin's file, in bin order, then this rank's pack file
        self.paths = [shard_path(self.path, s) for s in self.manifest.shards]
        if self.pack is not None:
            self.paths.append(pack_path(self.path) / self.pack.files[rank].data)
        self._segment_shape = self.shape.limited(merge_gap=0)  # a segment is contiguous: nothing to merge
        self.pool = BufferPool(t.buffer_bytes, self.manifest.row.align)
        self.reader: Reader | None = Reader(self.paths, rows.row_bytes, self.manifest.row.align, pool=self.pool,
                                            window=t.window, queue_depth=t.queue_depth, backend=t.io_backend,
                                            direct=t.direct, device=self.device,
                                            trace=None if t.io_trace is None else rank_trace(t.io_trace, rank))
        self._open: list[_Part] = []

    @property
    def backend(self) -> str:
        return self.reader.backend

    @property
    def stack(self):
        return self.reader.stack

    @property
    def ahead(self) -> int:
        return lookahead_of(self.superbatch)

    @property
    def first_ahead(self) -> int:
        """Two: at a sequence's start the next two batches are submitted before the first is completed, so their
        jobs are queued when the first's last reads go out and the reader goes straight on to them (`Reader._loop`).
        Completed first, the first batch's reads drained to nothing before the second's were asked for, at every
        epoch's start (the bench's 8M data-only run, three alternated pairs: 2,010-2,216 MB/s over the steady
        epochs against 2,342-2,471 with one; its training epochs, which the cores bind, the same). With one, the
        third was asked for only once the first was complete, and reached the reader as the second's reads ended
        (instrumented: 73-77 ms into a 0.37 s epoch, its first read out 80-92 ms); two, with the first batches
        sampled ahead (`Pipeline.prepare`), the steady epochs read 1,999-2,133 MB/s against 1,996-2,132, ahead
        in 4 of 4 alternated pairs (the device busy 96.1-97.2% of them against 94.6-96.4%), the first epochs
        0.50-0.69 s against 0.53-0.74."""
        return 2

    @property
    def reads_whole(self) -> bool:
        """Whether the pack holds its batches whole (it took no row as cached): `whole_segment` finds them."""
        return self.pack is not None and self.pack.cached_rows == 0 and not self.verify

    # ------------------------------------------------------------------ set-up reads

    def file_rows(self, b: int, k: int, start: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """Rows start..start+k of bin b's file (set-up of the GPU tier, a chunk at a time), into `out` when
        given (k x row_bytes): what is held besides it is the k rows as read, at the file's stride."""
        s = self.manifest.shards[b]
        fp = shard_path(self.path, s)
        if self.verify:
            _check_chunks(fp, s, np.arange(start * s.stride // s.chunk_bytes, -(-(start + k) * s.stride // s.chunk_bytes)))
        raw = np.fromfile(fp, dtype=np.uint8, count=k * s.stride, offset=start * s.stride).reshape(k, s.stride)
        forget_pages(fp, start * s.stride, k * s.stride)  # read once: the tier's table holds the rows
        rows = raw[:, : self.layout_rows.row_bytes]
        if out is None:
            return np.ascontiguousarray(rows)
        out[:] = rows
        return out

    def fill(self, dest: np.ndarray, ids: np.ndarray) -> None:
        """Read the rows of `ids` into `dest` (a cache at start) through the reader, in large reads."""
        if not ids.shape[0]:
            return
        f, off = self.layout_rows.locate(ids)
        if self.verify:
            self.verify_chunks(f, off)
        job = Job(f, off, SHAPES["block"], dest=dest[: ids.shape[0]])
        with self.reader.stack.setup_reads():  # not the epochs' reads: `--io-trace` logs them apart
            self.reader.submit(job).wait()

    # ------------------------------------------------------------------ the chain's calls

    def take(self, ids: np.ndarray, pos: np.ndarray | None, tag: tuple | None) -> _Part:
        p = _Part(ids, pos, self._segment(tag), stepped=in_step(tag))
        self._open.append(p)
        if len(self._open) >= self.superbatch or (p.segment is not None and self._reader_idle()):
            self.flush()
        return p

    def reads_idle(self, tag: tuple | None) -> bool:
        """A batch with a pack segment is read as that segment: reading it with the next ones merges nothing, and
        holding it while the reader has nothing to do left the disk idle until the superbatch was sampled (the
        bench's 8M data-only run waited 0.1-0.2 s of a 0.5 s epoch on one batch's reads). Other batches (block
        reads, epochs the pack does not hold) keep their hyperbatch: merging across its batches is their point."""
        return self._reader_idle() and self._segment(tag) is not None

    def _reader_idle(self) -> bool:
        return self.reader is not None and not self.reader.busy

    def _segment(self, tag: tuple | None) -> int | None:
        """The pack segment of the batch tagged (sampling key, index): a training batch's key is (seed, epoch,
        rank), an evaluation batch's (seed, epoch, rank, its split's tag)."""
        if self.segments is None or tag is None:
            return None
        key, i = tag
        split = split_of(key)
        if split not in ("train", *EVAL_SPLITS) or key[0] != self._pack_seed or key[2] != self.rank:
            return None  # another sampling key, or a split no pack holds: read from the layout
        return self.segments.find(int(key[1]), int(i), split)

    def flush(self) -> None:
        if self._open:
            batches, self._open = self._open, []
            self._issue(batches)

    def _issue(self, batches: list[_Part]) -> None:
        """Reads for a superbatch: one job per batch (rows) or per hyperbatch (block, packed)."""
        rb = self.layout_rows.row_bytes
        cap = max(1, self.pool.capacity // (2 * rb))
        groups: list[list[_Part]] = []
        if self.shape.name == "rows":
            groups = [[p] for p in batches]
        else:
            cur, seen = [], 0
            for p in batches:
                k = int(p.ids.shape[0])
                if cur and seen + k > cap:
                    groups.append(cur)
                    cur, seen = [], 0
                cur.append(p)
                seen += k
            if cur:
                groups.append(cur)
        for grp in groups:
            if self._issue_segments(grp):
                continue
            # the job's rows (sorted ids) and each batch's rows in it: one sort for the whole group, where
            # NumPy's unique without an inverse hashes and a search per batch misses the cache on every id
            ids = grp[0].ids if len(grp) == 1 else np.concatenate([p.ids for p in grp])
            u, inv = np.unique(ids, return_inverse=True)
            for p, row in zip(grp, np.split(inv.reshape(-1), np.cumsum([p.ids.shape[0] for p in grp[:-1]])), strict=True):
                p.row = row
            f, off = self.layout_rows.locate(u)
            self._rows_by_bin += np.bincount(self.layout_rows.bin[u], minlength=self._rows_by_bin.shape[0])
            if self.verify:
                self.verify_chunks(f, off)
            if self.segments is not None:
                self._from_pack(grp, u, f, off)
            # the job's rows in place order (file, offset): a read of adjacent rows then fills adjacent rows of
            # its destination, and goes there directly (Reader._direct), not through the staging and a copy
            placed = place(f, off)
            where = np.empty_like(placed.order)
            where[placed.order] = np.arange(placed.order.shape[0])
            for p in grp:
                p.row = where[p.row]
            self._submit(grp, Job(placed.file, placed.offset, self.shape))

    def pack_cached(self, hot: np.ndarray) -> None:
        """Learn the rows the pack took as cached (`cached_mask` of the layout's hotness order `hot`): no
        segment holds them, and a run whose caches hold fewer misses them (`_issue_segments`)."""
        if self.pack is not None:
            self._pack_cached = NodeBits(cached_mask(hot, self.pack.cached_rows, self.layout_rows.num_nodes))

    def _not_packed(self, ids: np.ndarray) -> np.ndarray:
        """The positions among `ids` of rows the pack took as cached (none when it is not known)."""
        if self._pack_cached is None or not ids.shape[0]:
            return np.zeros(0, np.int64)
        return np.flatnonzero(self._pack_cached.has(ids))

    def _issue_segments(self, grp: list[_Part]) -> bool:
        """Read each batch of `grp` as its pack segment, whole and as written, and the rows no segment holds
        (those the pack took as cached, which this run's caches do not hold) from the layout; False (nothing
        issued) when a batch has no segment, when the rest of its rows are not its segment's (in order), or
        when the segment holds much more than they and reading it whole costs the disk more than reading them
        (`SEGMENT_SLACK`, `_whole_pays`).

        Why: that is every batch of a packed run whose caches are about those the pack was written for, and
        then the general path's work (one sort of the group's rows to merge them, the pack lookup, a second
        sort by place, and the reader's choice among merge gaps) only rebuilds the segments' own order. On
        the bench's 8M run a rank's tier chain took 35 ms of CPU per batch that way (reader thread included)
        and takes 20 this way, beside the model on the same cores."""
        if self.segments is None or self.verify:  # --verify checks the layout chunks of every row read
            return False
        found = []
        for p in grp:
            if p.segment is None:
                return False
            out = self._not_packed(p.ids)
            keep = None
            if out.size:
                keep = np.ones(p.ids.shape[0], bool)
                keep[out] = False
            inside = p.ids if keep is None else p.ids[keep]
            rows = self.segments.rows_of(p.segment, inside)
            if rows is None:
                return False
            k = self.segments.rows_in(p.segment)
            if k > inside.shape[0] * (1 + SEGMENT_SLACK) and not self._whole_pays(rows, k):
                return False
            found.append((out, keep, rows))
        # a job per batch: its rows no segment holds, in place order, then its segment; the pack file is the last
        # of `paths`, so the job's rows are in place order already (not sorted again) and the segment is read
        # straight into the destination (merge gap 0: it is contiguous). Not one job for the group: the reader
        # starts a batch's reads once that batch's bytes fit the pool, and its buffer goes back once that batch
        # is completed, not the group's last (the bench's 16M data-only run, six alternated runs each: steady epochs
        # 1.12 s against 1.29, the means; the group's job waited up to 0.19 s for room in the pool, the disk idle)
        rb = self.layout_rows.row_bytes
        for p, (out, keep, rows) in zip(grp, found, strict=True):
            extra = p.ids[out]
            self.left_out += int(extra.shape[0]) if p.stepped else 0
            placed = place(*self.layout_rows.locate(extra))
            k, base = self.segments.rows_in(p.segment), extra.shape[0]
            if keep is None:
                p.row = rows + base
            else:
                p.row = np.empty(p.ids.shape[0], np.int64)
                p.row[out[placed.order]] = np.arange(base)
                p.row[keep] = rows + base
            files = np.concatenate([placed.file, np.full(k, len(self.paths) - 1, np.int32)])
            start = int(self.segments.offset[p.segment])
            offsets = np.concatenate([placed.offset, start + np.arange(k, dtype=np.int64) * rb])
            self._rows_by_bin += np.bincount(self.layout_rows.bin[p.ids], minlength=self._rows_by_bin.shape[0])
            self.packed += int(rows.shape[0])
            self._submit([p], Job(files, offsets, self._segment_shape))
        self.segment_batches += len(grp)
        return True

    @property
    def read_budget(self) -> int:
        return self.pool.capacity

    @property
    def read_align(self) -> int:
        """What a destination's first byte must be a multiple of for rows to be read straight into it."""
        return self.reader.align

    def whole_segment(self, ids: np.ndarray, tag: tuple | None) -> int | None:
        """The pack segment of the batch tagged `tag` when it is `ids` exactly, in order (a pack that took no
        row as cached); not with --verify, which checks the layout's chunks of every row read."""
        seg = self._segment(tag)
        return seg if seg is not None and not self.verify and self.segments.whole(seg, ids) else None

    def take_whole(self, ids: np.ndarray, seg: int, dest: np.ndarray) -> _Part:
        """Read segment `seg`, the batch `ids` whole, into `dest` ([rows, row_bytes], the batch's own buffer)
        now, after every batch taken before it (`Tier._read_whole` flushes them first)."""
        n, rb = ids.shape[0], self.layout_rows.row_bytes
        p = _Part(ids, None, seg)
        offsets = int(self.segments.offset[seg]) + np.arange(n, dtype=np.int64) * rb
        pack_file = np.full(n, len(self.paths) - 1, np.int32)
        p.ref = _JobRef(None, Job(pack_file, offsets, self._segment_shape, dest=dest, span=True), 1)
        self.reader.submit(p.ref.job)
        # counted once the read is asked for: the count looks up every row's bin, scattered over the index
        self._rows_by_bin += np.bincount(self.layout_rows.bin[ids], minlength=self._rows_by_bin.shape[0])
        self.packed += n
        self.segment_batches += 1
        self.whole_batches += 1
        return p

    def complete_whole(self, p: _Part, count: bool) -> None:
        """Wait for a `take_whole` batch's read (its rows are then in its buffer) and count it."""
        p.ref.job.wait()
        self._done(p, count)

    def _whole_pays(self, rows: np.ndarray, k: int) -> bool:
        """Whether reading a segment of `k` rows whole costs the disk at most 1 + SEGMENT_SLACK times the reads the
        general path would make of its `rows` (the shape's plan and cost model, moment.io.merge). Why: a run whose
        caches hold more than the pack was written for (a --data-only run has no model step to fit, so its CPU
        cache is larger) asks a part of each segment; where that part is dense, the general path merges the gaps
        and reads about the whole segment anyway (883 of 898 MB on the 8M bench's data-only run), after a sort,
        a search and a merge of every batch's rows that cost the CPU the model needs."""
        if not rows.shape[0]:
            return False
        rb, align, window = self.layout_rows.row_bytes, self.reader.align, self.reader.window
        at = np.sort(rows) * rb
        asked = self.shape.plan_price(Placed(np.arange(at.shape[0]), np.zeros(at.shape[0], np.int32), at),
                                      rb, align, window)
        longest = self.shape.longest(align, window)
        return self.shape.price(-(-k * rb // longest), k * rb) <= (1 + SEGMENT_SLACK) * asked

    def _submit(self, grp: list[_Part], job: Job) -> None:
        """Read `job` for the batches of `grp`: its destination goes back once the last of them is completed."""
        ref = _JobRef(self.pool, job, len(grp))
        for p in grp:
            p.ref = ref
        self.reader.submit(job)

    def _from_pack(self, grp: list[_Part], u: np.ndarray, f: np.ndarray, off: np.ndarray) -> None:
        """Point the rows a batch's pack segment holds at the pack file (in place; first batch wins). `u`: the
        job's rows, sorted and distinct."""
        todo = np.ones(u.shape[0], bool)
        pack_file = len(self.paths) - 1
        for p in grp:
            if p.segment is None:
                continue
            where, at = self.segments.held(p.segment, u, self.layout_rows.row_bytes)
            first = todo[where]
            where = where[first]
            f[where], off[where] = pack_file, at[first]
            todo[where] = False
            self.packed += int(where.shape[0])

    def verify_chunks(self, bb: np.ndarray, off: np.ndarray) -> None:
        """Check the shard chunks rows at (bin, offset) touch, each the first time (--verify)."""
        for bi in np.unique(bb).tolist():
            s = self.manifest.shards[bi]
            done = self._verified.setdefault(bi, np.zeros(len(s.chunk_sha256), dtype=bool))
            o = off[bb == bi]
            ks = np.unique(np.concatenate([o // s.chunk_bytes, (o + self.layout_rows.row_bytes - 1) // s.chunk_bytes]))
            todo = ks[~done[ks]]
            if todo.size:
                _check_chunks(shard_path(self.path, s), s, todo)
                done[todo] = True

    def host(self, p: _Part, out: np.ndarray, count: bool) -> None:
        if p.ref is None:  # its superbatch is still open: issue it now
            self.flush()
        if p.ids.size:
            copy_rows(out, p.pos, p.ref.job.wait(), p.row)
        self._done(p, count)

    def _done(self, p: _Part, count: bool) -> None:
        """A batch's rows are where they go: count its job's reads once (at its last batch), give its
        destination back, count its rows."""
        if p.ref.users == 1:  # the job's last batch: count its reads once
            if p.ref.job.sizes is not None:
                self.request_sizes += p.ref.job.sizes
        p.ref.release()
        if count:
            self.served += int(p.ids.size)

    def device_rows(self, part: _Part, out: Any) -> None:
        pass

    # ------------------------------------------------------------------ reports

    def ssd_files(self) -> dict[str, Path]:
        out = {s.bin: p for s, p in zip(self.manifest.shards, self.paths, strict=False) if s.kind == "ssd"}
        return out | ({"pack": self.paths[-1]} if self.pack is not None else {})

    def ssd_shares(self) -> dict[str, dict[str, float]]:
        """Per SSD: the share of this rank's SSD rows the plan routes to it (`planned_shares`) and the share
        it actually served."""
        ssd = [i for i, s in enumerate(self.manifest.shards) if s.kind == "ssd"]
        got = self._rows_by_bin[ssd].astype(np.float64)
        achieved = got / got.sum() if got.sum() > 0 else got
        names = [self.manifest.shards[i].bin for i in ssd]
        return {b: {"planned": self.planned_shares.get(b, 0.0), "achieved": float(a), "rows": int(g)}
                for b, a, g in zip(names, achieved, got, strict=True)}

    def add_stats(self, out: dict[str, Any]) -> None:
        requests, bytes_read = self.request_sizes.sum(axis=1)
        out["ssd_requests"] += int(requests)
        out["ssd_bytes_read"] += int(bytes_read)
        out["ssd_request_sizes"] = out.get("ssd_request_sizes", 0) + self.request_sizes
        out["packed_rows"] += self.packed
        out["segment_batches"] += self.segment_batches
        out["whole_batches"] += self.whole_batches
        out["pack_left_out_rows"] += self.left_out
        if self.pack is not None:
            out["pack_fit"] = self.pack_fit
        out["direct_rows"] += self._direct_done + (self.reader.direct_rows if self.reader is not None else 0)
        out["ssd_shares"] = self.ssd_shares()

    def own_memory(self) -> dict[str, int]:
        return {"pack_index": (self.segments.memory_bytes if self.segments is not None else 0)
                + (self._pack_cached.nbytes if self._pack_cached is not None else 0),
                "read_buffers": self.pool.capacity, "staging": self.reader.staging_bytes if self.reader else 0}

    def release(self) -> None:
        if self.reader is not None:
            self._direct_done += self.reader.direct_rows
            self.reader.close()
            self.reader = None

    def __del__(self) -> None:
        if getattr(self, "reader", None) is not None:
            self.release()
