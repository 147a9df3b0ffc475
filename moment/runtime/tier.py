"""One tier of the feature store, wrapping the next: the contract every tier speaks, and what they share.

Why tiers that compose (DGL GraphBolt's wrapped features; Moment (SC'25), section 3.1): each tier
(own GPU cache -> the peers' GPU caches -> the CPU cache -> the layout's files) is a small object that
serves the rows it holds and hands the rest to the tier it wraps; a run without a GPU cache or peers
simply has no such tier in its chain. `moment.runtime.store.open_store` builds the chain from the run
plan.

Every tier speaks the feature-source contract (moment.runtime.sources.FeatureSource) on its own:
`submit(ids, tag) -> Batch`, `complete(batch) -> Tensor`, `cancel(batch)`, `finish()`, so a tier can be
used alone over its next (the tests do). Inside the chain the tiers talk through four calls that carry
the positions of their rows in the batch, so that each writes straight into the one output buffer:

* `take(ids, pos, tag)`: decide what this tier serves of `ids` (at positions `pos` of the batch; None:
  0..n-1) and pass the rest to the next tier's `take`; returns this tier's pending part;
* `host(part, out, count)`: fill the rows served from host memory into the host buffer `out` (the CPU
  cache, the reads), deeper tiers first where a tier needs their rows (admissions);
* `device_rows(part, out)`: after the host buffer went to the device, fill the rows served there (the
  own GPU tier);
* `fetches(part, out)`: the rows other ranks serve (the peer and remote tiers): one exchange round each
  per completed batch, collectives that the caller starts and finishes on the rank's one collective
  thread (`complete_local` returns them in a `Staged`; `complete` runs them at once);
* `flush()`: issue what is held back for a superbatch now.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from moment.caching.tiers import lookahead as lookahead_of
from moment.errors import MomentError
from moment.io.device import DeviceLayer, StagingRing
from moment.placement.opened import Layout
from moment.runtime.exchange import ACTIVE, LEFT, SERVING, Round, RowExchange, Serve, into, nothing
from moment.runtime.sources import Staged

TIERS = ("gpu", "peer", "remote", "cpu", "ssd")  # the tiers' names, fastest first (the keys of `tier_stats`)

T = TypeVar("T", bound="Tier")


class LayoutRows:
    """What every tier of one chain shares about the layout's rows: their format and where each node lives
    (`index.npy`: node -> (bin, slot), loaded once per chain). In a machine's part of a split layout the
    bins after the shards are remote: their rows are on the machine `machine_of[bin]` (-1: a shard here)."""

    def __init__(self, layout: Layout):
        m = layout.manifest
        self.path: Path = layout.path
        self.manifest = m
        self.num_nodes = int(m.dataset.num_nodes)
        self.row_bytes = int(m.row.row_bytes)
        self.row_shape = tuple(m.dataset.row_shape)
        self.dtype = np.dtype(m.dataset.dtype)
        self.torch_dtype = _torch_dtype(self.dtype)
        self.bin, self.slot = layout.load_index()
        self.stride = np.array([s.stride for s in m.shards], dtype=np.int64)
        self.nbins = layout.nbins
        self.machine_of = np.full(self.nbins, -1, np.int64)
        if m.split is not None:
            self.machine_of[len(m.shards):] = [r.machine for r in m.split.remote]

    @property
    def split(self):
        """This machine's part of a split layout (`SplitRef`), or None."""
        return self.manifest.split

    def remote(self, ids: np.ndarray) -> np.ndarray:
        """Mask of the ids whose rows are on another machine (none outside a split layout)."""
        return self.machine_of[self.bin[ids]] >= 0

    @property
    def index_bytes(self) -> int:
        return self.bin.nbytes + self.slot.nbytes

    def ids(self, node_ids: Any) -> np.ndarray:
        """`node_ids` as int64 node ids, refused when one is not a node of the layout."""
        if isinstance(node_ids, torch.Tensor):
            node_ids = node_ids.detach().cpu().numpy()
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise MomentError(f"node ids must be in [0, {self.num_nodes})", source=str(self.path))
        return ids

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bin, byte offset in its file) of each id."""
        b = self.bin[ids].astype(np.int32)
        return b, self.slot[ids].astype(np.int64) * self.stride[b]


def at(pos: np.ndarray | None, local: np.ndarray) -> np.ndarray:
    """Positions in the batch of a tier's rows `local` (positions among the ids it was given)."""
    return local if pos is None else pos[local]


@dataclass
class Batch:
    """A batch submitted to a tier's contract: its size and the tier's pending part."""

    n: int
    part: Any
    tag: tuple | None = None  # what `submit` was told it is (sources.in_step)


def empty_stats() -> dict[str, Any]:
    return {"rows": dict.fromkeys(TIERS, 0), "bytes": dict.fromkeys(TIERS, 0), "ssd_requests": 0,
            "ssd_bytes_read": 0, "cpu_admitted_rows": 0, "cpu_hit_rate": 0.0, "packed_rows": 0,
            "segment_batches": 0, "whole_batches": 0, "pack_left_out_rows": 0, "direct_rows": 0, "remote_served_rows": 0, "remote_served_bytes": 0}


class Tier:
    """A tier over `next` (None: the last). Subclasses implement take/host/device (and stats, memory,
    finish and close of what they hold); this class turns them into the feature-source contract."""

    name = ""  # the key of the rows this tier serves in `tier_stats`
    #: the most bytes of rows a batch holds (the plan's batch extent): the staging ring's slot size, set by
    #: moment.runtime.store on the chain's top tier (0: a tier used alone: every row of the layout)
    batch_bytes = 0

    def __init__(self, rows: LayoutRows, next: Tier | None, device: torch.device | str = "cpu"):
        self.layout_rows, self.next = rows, next
        self.device = torch.device(device)
        self.served = 0  # rows served by this tier (completed batches only)
        self._staging: StagingRing | None = None
        self._whole_in_flight = 0  # bytes of the batches read whole (`_read_whole`) not yet completed

    # ---------------------------------------------------------------- the contract

    @property
    def num_nodes(self) -> int:
        return self.layout_rows.num_nodes

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.layout_rows.row_shape

    @property
    def feature_dim(self) -> int:
        return int(np.prod(self.row_shape))

    @property
    def backend(self) -> str:
        return self.next.backend if self.next is not None else "none"

    @property
    def lookahead(self) -> int:
        """Batches a caller keeps submitted beyond the next one to complete: what the tiers ask (`ahead`), and
        where the batches are read whole into their own buffers (`_read_whole`), so many that they and the next
        one fit the reads' budget at once (the chain's top tier knows a batch's extent): none of them is then
        refused for want of room and sent through the tiers instead."""
        n = self.ahead
        *_, last = self.chain()
        if self.batch_bytes and last.reads_whole and self._ring().lends:
            n = min(n, max(1, last.read_budget // self.batch_bytes - 1))
        return n

    @property
    def ahead(self) -> int:
        """Batches the tiers need submitted ahead (two superbatches where one decides or reads by superbatch)."""
        return self.next.ahead if self.next is not None else lookahead_of(1)

    @property
    def first_ahead(self) -> int:
        """Batches a caller needs submitted at a sequence's start before it completes the first (0 unless a
        tier decides by whole superbatches or reads a disk)."""
        return self.next.first_ahead if self.next is not None else 0

    def submit(self, node_ids: Any, tag: tuple | None = None) -> Batch:
        """Queue a batch; `tag` is ((seed, epoch, rank), batch) for a training batch (the pack uses it)."""
        ids = self.layout_rows.ids(node_ids)
        return Batch(int(ids.shape[0]), self._read_whole(ids, tag) or self.take(ids, None, tag), tag)

    def _read_whole(self, ids: np.ndarray, tag: tuple | None) -> Whole | None:
        """A batch that the reading tier holds whole, every row in the batch's order (a pack written with no
        row taken as cached), read straight into the batch's own buffer, lent now: no tier routes it and no row
        is copied. Where the device batch is a copy of a staging slot (CUDA), that slot is lent at completion
        only: None, and the batch goes through the tiers (its misses read from the same segment).

        Why: on a machine whose CPU binds, not its SSDs, copying rows into the batch is what the out-of-core run
        pays beyond the in-memory one. On the bench's 8M and 16M runs (2 cores, 2 ranks) the steady epochs took
        0.98-1.04x and 0.88-0.97x the in-memory run's this way, against 1.11-1.13x and 1.09-1.20x through the caches,
        for about twice the bytes read (docs/benchmarks.md)."""
        *_, last = self.chain()
        if not ids.shape[0] or (seg := last.whole_segment(ids, tag)) is None:
            return None
        nbytes = int(ids.shape[0]) * self.layout_rows.row_bytes
        # its buffer holds a read in flight: those stay within the reads' budget (the tier's read buffers, which
        # such batches leave unused), or the batch goes through the tiers
        if self._whole_in_flight + nbytes > last.read_budget:
            return None
        buf = self._ring().lend(nbytes, last.read_align)
        if buf is None:
            return None
        self.flush()  # the batches taken before it are issued before it: the reads go in submission order
        self._whole_in_flight += nbytes
        return Whole(self, last, last.take_whole(ids, seg, buf.reshape(ids.shape[0], -1)), buf)

    def _ring(self) -> StagingRing:
        if self._staging is None:
            extent = self.batch_bytes or self.num_nodes * self.layout_rows.row_bytes
            self._staging = StagingRing(DeviceLayer(self.device), extent)
        return self._staging

    def complete(self, b: Batch) -> torch.Tensor:
        """The batch's rows as a tensor [n, *row_shape] on `device` (batches complete in submission order).
        With a peer or remote tier, one round of each exchange (see `finish`), on this thread."""
        staged = self.complete_local(b)
        staged.start()
        return staged.finish()

    def complete_local(self, b: Batch) -> Staged:
        """The batch as far as this rank alone completes it: the rows its own tiers hold, on the device; the
        rows other ranks serve come through the returned batch's exchange rounds, which the caller starts
        and finishes on the rank's collective thread (moment.runtime.pipeline)."""
        n, rb = b.n, self.layout_rows.row_bytes
        if isinstance(b.part, Whole):  # its rows are in its buffer once read; the exchanges still run a round each
            out = self._ring().take(n * rb, host=b.part.wait(True)).to_device(n * rb).view(n, rb)
            fetches = tuple(self.fetches_of_none(out, b.tag))
        else:
            stage = self._ring().take(n * rb)  # pinned on CUDA: the copy below is asynchronous
            self.host(b.part, stage.array[: n * rb].reshape(n, rb), True)
            out = stage.to_device(n * rb).view(n, rb)
            self.device_rows(b.part, out)
            fetches = tuple(self.fetches(b.part, out))
        if n == 0:
            return Staged(torch.empty((0, *self.row_shape), dtype=self.layout_rows.torch_dtype, device=out.device),
                          fetches)
        return Staged(out.view(self.layout_rows.torch_dtype).reshape(n, *self.row_shape), fetches)

    def gather(self, node_ids: Any) -> torch.Tensor:
        return self.complete(self.submit(node_ids))

    def cancel(self, b: Batch) -> None:
        """Drop `b` unread by the caller (it stopped early): its reads are waited for and its admissions to
        the CPU cache made, so the tiers stay consistent; no exchange round."""
        if isinstance(b.part, Whole):
            b.part.wait(False)
        else:
            self.host(b.part, np.empty((b.n, self.layout_rows.row_bytes), np.uint8), False)

    def finish(self) -> None:
        """The caller completed the last batch of a sequence (collective with an exchanging tier: every rank
        calls it at the end of each sequence): serve the others until every rank's sequence is over, one
        round of each exchange at a time, as a batch's rounds run (never one exchange's rounds against
        another's)."""
        while self.idle().run():
            pass

    def leave(self) -> None:
        """This rank takes no more batches at all (the run is closed): serve the others until every rank has
        left, so that a rank that made fewer lookups or batches than another never leaves it waiting."""
        while (s := Staged(None, tuple(self.idle_fetches(left=True)))).fetches:
            s.run()
            if not s.staying:
                return

    def reads_idle(self, tag: tuple | None) -> bool:
        """Whether the batch tagged `tag`, taken now, is best read at once, alone, instead of with the next batches
        of its superbatch: the tier that reads says (the disk tier: a packed batch, its reader idle)."""
        return self.next.reads_idle(tag) if self.next is not None else False

    def flush(self) -> None:
        """Decide and issue a superbatch held back now (end of an epoch)."""
        if self.next is not None:
            self.next.flush()

    def epoch_start(self, epoch: int) -> None:
        pass

    def ssd_files(self) -> dict[str, Path]:
        """The files this rank's SSD reads come from, by name (a bin, "pack"): the tier that reads says."""
        return self.next.ssd_files() if self.next is not None else {}

    def tier_stats(self) -> dict[str, Any]:
        """Rows and bytes served per tier, the reads, admissions and packed rows: every tier's together."""
        out = empty_stats()
        for t in self.chain():
            out["rows"][t.name] += t.served
            out["bytes"][t.name] += t.served * self.layout_rows.row_bytes
            t.add_stats(out)
        looked = out["rows"]["cpu"] + out["rows"]["ssd"]
        out["cpu_hit_rate"] = out["rows"]["cpu"] / looked if looked else 0.0
        return out

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds, by item, every tier's together (the layout index once; on CPU the batches'
        buffers at their most, `batch_buffers_most`: how many of the batches the budget charges were alive)."""
        out = {"index": self.layout_rows.index_bytes}
        for t in self.chain():
            out.update(t.own_memory())
        if self._staging is not None and self._staging.batches is not None:
            out["batch_buffers_most"] = self._staging.batches.most_bytes
        return out

    def close(self) -> None:
        """Close every tier of the chain (a shared cache goes with its last user)."""
        for t in self.chain():
            t.release()

    # ---------------------------------------------------------------- the chain

    def chain(self) -> Iterator[Tier]:
        """This tier and the ones it wraps, fastest first."""
        t: Tier | None = self
        while t is not None:
            yield t
            t = t.next

    def find(self, kind: type[T]) -> T | None:
        """The tier of class `kind` in this chain, if the chain has one."""
        return next((t for t in self.chain() if isinstance(t, kind)), None)

    # ---------------------------------------------------------------- what tiers implement

    def take(self, ids: np.ndarray, pos: np.ndarray | None, tag: tuple | None) -> Any:
        raise NotImplementedError

    def host(self, part: Any, out: np.ndarray, count: bool) -> None:
        """A tier that serves on the device passes the host phase on (a part's `inner` is its next's)."""
        if self.next is not None:
            self.next.host(part.inner, out, count)

    def device_rows(self, part: Any, out: torch.Tensor) -> None:
        if self.next is not None:
            self.next.device_rows(part.inner, out)

    def fetches(self, part: Any, out: torch.Tensor) -> list[ExchangeFetch]:
        """The batch's exchange rounds (rows other ranks serve into `out`), one per exchanging tier of the
        chain, fastest first: the same tiers, so the same rounds in the same order, on every rank."""
        return self.next.fetches(part.inner, out) if self.next is not None else []

    def fetches_of_none(self, out: torch.Tensor, tag: tuple | None) -> list[ExchangeFetch]:
        """The exchange rounds of a batch tagged `tag` that asks no other rank for a row (`Whole`): those `fetches`
        gives such a batch, so every rank runs the same rounds in the same order."""
        return self.next.fetches_of_none(out, tag) if self.next is not None else []

    def whole_segment(self, ids: np.ndarray, tag: tuple | None) -> int | None:
        """The segment this tier reads that holds the batch `ids` tagged `tag` whole, in its order (the tier that
        reads says; None: none does)."""
        return None

    read_budget = 0  # the bytes of reads in flight the reading tier's budget holds
    reads_whole = False  # whether the reading tier's pack holds its batches whole (`whole_segment`)

    def idle(self, stepped: bool = True) -> Staged:
        """One round of each exchange its sequence's batches took part in (`stepped`: all; see
        sources.in_step), without a batch (this rank's sequence is over): it serves the others."""
        return Staged(None, tuple(self.idle_fetches(stepped=stepped)))

    def idle_fetches(self, left: bool = False, stepped: bool = True) -> list[ExchangeFetch]:
        return self.next.idle_fetches(left, stepped) if self.next is not None else []

    def add_stats(self, out: dict[str, Any]) -> None:
        pass

    def own_memory(self) -> dict[str, int]:
        return {}

    def release(self) -> None:
        pass


class Whole:
    """A batch the reading tier `tier` reads whole into its own buffer `buf` (`Tier._read_whole`): its part there."""

    def __init__(self, top: Tier, tier: Tier, part: Any, buf: np.ndarray):
        self.top, self.tier, self.part, self.buf = top, tier, part, buf

    def wait(self, count: bool) -> np.ndarray:
        """The buffer once the rows are in it (`count`: the batch is served, not dropped)."""
        try:
            self.tier.complete_whole(self.part, count)
        finally:
            self.top._whole_in_flight -= self.buf.nbytes
        return self.buf


class ExchangeFetch:
    """One exchanging tier's round for one batch: the rows `owner` members hold at `keys` go to positions
    `pos` of `out` (the batch's rows). Started and finished on the rank's collective thread; every rank
    runs one per batch, asking nothing as well. Without `out`: an idle round (`ExchangeFetch.idle`)."""

    def __init__(self, tier: Tier, exchange: RowExchange, serve: Serve, owner: np.ndarray, keys: np.ndarray,
                 pos: np.ndarray, out: torch.Tensor | None):
        order = np.argsort(owner, kind="stable")
        cuts = np.searchsorted(owner[order], np.arange(exchange.group.size + 1))
        keys = keys[order]
        self.want = [keys[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        self.tier, self.exchange, self.serve = tier, exchange, serve
        self.sink = into(out, pos[order]) if out is not None else None
        self.round: Round | None = None
        self.state = ACTIVE
        self.running = False  # after `finish`: whether any rank was active in the round
        self.staying = True  # after `finish`: whether any rank had not left

    @classmethod
    def idle(cls, tier: Tier, exchange: RowExchange, serve: Serve, left: bool = False) -> ExchangeFetch:
        """A round that asks nothing, for a rank whose sequence is over (`left`: that takes no more batches):
        it serves the others."""
        none = np.zeros(0, np.int64)
        f = cls(tier, exchange, serve, none, none, none, None)
        f.state = LEFT if left else SERVING
        return f

    def start(self) -> None:
        self.round = self.exchange.start(self.want, self.serve, self.sink or nothing, self.state)

    def finish(self) -> None:
        self.running = self.round.finish()
        self.staying = self.round.staying
        self.tier.served += int(sum(w.size for w in self.want))


def _torch_dtype(dt: np.dtype) -> torch.dtype:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.from_numpy(np.zeros(1, dtype=dt)).dtype
