"""Rows that other ranks hold, fetched through torch.distributed collectives: the peer tier's transport,
and the one remote rows between machines use (the members are any explicit list of ranks).

Why collectives: NCCL moves the rows GPU to GPU (NVLink or PCIe peer to peer where the machine has
them) and gloo does the same on CPU, so the code that runs on a CPU-only CI machine is the code a GPU
run executes; nothing maps another process's memory.

Why every round runs on the run's one process group (the world's), whatever its members: NCCL's
communicators are not safe to use concurrently (an operation of one must complete before another's is
enqueued, in the same order on every rank), and a round of the next batch is in flight while the step's
all-reduces are issued. On one communicator, issued from one thread in one order, NCCL and gloo queue
them in that order on every rank, so the round overlaps the step and nothing can deadlock. A member
asks only members; every other rank of the group takes part with nothing to ask or serve (an
all_to_all with zero counts moves nothing between them).

One round (every rank of the group takes part, in the same order on every rank):

1. counts: each rank sends one row to every rank: how many keys it asks of each, its state (ACTIVE:
   the round is one of its batches'; SERVING: its sequence is over, it serves the others'; LEFT: it takes
   no more batches at all, `Run.close`) and which exchange the round is of (`all_to_all_single` of that
   row, so every rank learns the whole matrix: all know whether any row moves this round, whether anyone
   still runs or stays, and how many chunks it takes; and all stop at once, with one MomentError, where
   ranks are in rounds of different exchanges, whose keys would be served as the other's);
2. then, chunk by chunk (`chunks`: every rank derives the same number from the matrix, so all issue the
   same collectives): the keys each rank asks of each other in this chunk (`all_to_all_single`), then
   the rows each owner serves for them from its own rows (`serve`, called per chunk) sent back
   (`all_to_all_single`); the asker hands each chunk's rows to its `sink`, which writes them where they
   belong (the batch's buffer), so no round-sized tensor exists on either side.

A round is started (`start`: the counts, every chunk but the last's rows, and the last chunk's rows
issued without waiting) and finished (`Round.finish`: wait for those rows, hand them to the sink), so a
caller can start the next batch's round before a training step and finish it after: its last chunk's
rows move while the step computes. Between the two, only collectives issued later on the same thread
may run (they queue behind it).

A chunk moves at most `chunk_rows` rows (CHUNK_BYTES of rows) into and at most as many out of any
member: every pair's keys are split evenly over the round's chunks, and the round takes the fewest
chunks for which that split stays within the bound. So a round holds, per member, at most two chunks
of rows and their keys (`RowExchange.round_bytes`), whatever the batch asks; a round costs 1 + 2 x
chunks collectives (1 when nothing is asked).

A rank takes part in one round per batch it completes, whether or not it needs rows, and `finish`
keeps serving until every rank has finished its sequence, so all ranks run the same number of rounds
even when their numbers of batches differ (evaluation can give one rank a batch more than another).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from moment.errors import MomentError
from moment.io.device import index_rows
from moment.runtime import footprint
from moment.runtime.footprint import CHUNK_BYTES, exchange_round_bytes
from moment.runtime.lost import LeftRun, peer_loss


@dataclass
class ExchangeGroup:
    """The members of an exchange (ranks of `group`, the process group its rounds run on: the run's world
    group) and where their tensors live (NCCL: the rank's GPU; gloo: CPU).

    Its maker releases it before destroying the process groups (`release`): this object is the only
    reference to the group outside torch's registry, so whatever still holds an exchange (a store
    left unclosed by an error) no longer keeps the group, and its threads, alive into interpreter
    shutdown (see moment.runtime.dist.import_before_group).
    """

    group: Any  # torch.distributed ProcessGroup the rounds run on; None once released
    ranks: tuple[int, ...]  # the members: ranks of `group`, in member order
    rank: int  # this rank (its rank in `group`)
    device: torch.device
    size_all: int = 0  # ranks in `group` (0: the members are the whole group)

    @property
    def index(self) -> int:
        """This rank's position among the members."""
        return self.ranks.index(self.rank)

    @property
    def size(self) -> int:
        """Members."""
        return len(self.ranks)

    @property
    def everyone(self) -> int:
        """Ranks that take part in every round: the whole group."""
        return self.size_all or self.size

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every member's `obj`, in member order (set-up only; every rank of the group calls it)."""
        out: list[Any] = [None] * self.everyone
        with peer_loss():
            dist.all_gather_object(out, obj, group=self.pg())
        return [out[r] for r in self.ranks]

    def pg(self) -> Any:
        if self.group is None:  # never fall back to the default group (None means it to torch)
            raise LeftRun()
        return self.group

    def release(self) -> None:
        self.group = None


#: a rank's state in a round (its counts row's last entry): the round is one of its batches'; its sequence is
#: over and it serves the others until theirs are; it takes no more batches and serves until every rank has left
ACTIVE, SERVING, LEFT = 2, 1, 0


class Deferred(Protocol):
    """Rows still being read (a serving rank's disk reads): `wait()` gives them."""

    def wait(self) -> torch.Tensor: ...


#: keys this rank is asked for -> its rows for them (a tensor [len(keys), ...], one dtype and row shape
#: on every member), or a `Deferred` of them: the last chunk's are then sent when the round is finished, so
#: the reads run while the caller goes on
Serve = Callable[[torch.Tensor], "torch.Tensor | Deferred"]


def ready(rows: torch.Tensor | Deferred) -> torch.Tensor:
    return rows if isinstance(rows, torch.Tensor) else rows.wait()


@dataclass
class _Sent:
    """The last chunk's rows on their way: the collective, and the served rows it reads until it is done."""

    work: Any
    out: torch.Tensor

    def wait(self) -> None:
        self.work.wait()
        self.out = None
#: (positions among the round's asked keys, `want` concatenated in member order; their rows, on the group's
#: device) -> None: put the rows where they belong. The rows are the exchange's buffer, reused by the next
#: chunk: copy them, do not keep them.
Sink = Callable[[np.ndarray, torch.Tensor], None]


def chunk_rows(row_bytes: int, members: int) -> int:
    """`footprint.chunk_rows` at this module's CHUNK_BYTES (a test sets it to make chunks of a few rows)."""
    return footprint.chunk_rows(row_bytes, members, CHUNK_BYTES)


def chunks(asks: np.ndarray, cap: int) -> int:
    """The fewest chunks K such that every pair's keys (asks[i, j]: keys rank i asks of rank j), split
    evenly over K (`chunk_bounds`), move at most `cap` rows into and out of every rank per chunk; 0 when
    nothing is asked. Every rank computes it from the same matrix: the same number of collectives."""
    a = np.asarray(asks, np.int64)
    if not a.any():
        return 0
    if cap < np.count_nonzero(a, axis=0).max() or cap < np.count_nonzero(a, axis=1).max():
        raise ValueError(f"a chunk of {cap} rows cannot hold one row of each of {a.shape[0]} members")

    def fits(k: int) -> bool:
        part = -(-a // k)  # the most any chunk moves of each pair
        return bool(part.sum(0).max() <= cap and part.sum(1).max() <= cap)

    lo, hi = -(-int(max(a.sum(0).max(), a.sum(1).max())) // cap), int(a.max())  # at hi every part is <= 1 row
    while lo < hi:  # fits is monotone in k
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def chunk_bounds(asks: np.ndarray, k: int, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Where chunk k of `total` starts and ends in each pair's keys: [lo[i, j], hi[i, j])."""
    a = np.asarray(asks, np.int64)
    return a * k // total, a * (k + 1) // total


def into(out: torch.Tensor, pos: np.ndarray | None = None) -> Sink:
    """A sink that writes the row asked at position p of the round into out[pos[p]] (pos None: out[p])."""
    def sink(at: np.ndarray, rows: torch.Tensor) -> None:
        index_rows(out, np.ascontiguousarray(at if pos is None else pos[at], np.int64), rows, None)

    return sink


def nothing(at: np.ndarray, rows: torch.Tensor) -> None:
    """The sink of a round that asks nothing."""
    if at.size:
        raise RuntimeError("rows arrived for a round that asked for none")


class Round:
    """A round started by `RowExchange.start`: its last chunk's rows may still be moving, or still be read by
    this rank for the others (`serve` gave a `Deferred`). `finish` (on the thread that started it, before that
    thread's next round of the exchange) sends what it serves if it had not yet, waits for the rows it asked
    for and hands them to the sink; it returns whether any rank was active. `staying`: whether any rank had
    not left."""

    def __init__(self, running: bool, sink: Sink, issue: Callable[[], Any] | None = None,
                 at: np.ndarray | None = None, rows: torch.Tensor | None = None, staying: bool = True):
        self.running, self._sink, self._at, self._rows = running, sink, at, rows
        self.staying = staying
        self._issue, self._work = issue, None

    def send(self) -> None:
        """Put the last chunk's rows on their way (the served ones ready or not: a read is waited for here)."""
        if self._issue is not None:
            self._work, self._issue = self._issue(), None

    @property
    def pending(self) -> bool:
        return self._issue is not None or self._work is not None

    def finish(self) -> bool:
        self.send()
        if self._work is not None:
            with peer_loss():
                self._work.wait()
            at, rows = self._at, self._rows
            self._work = self._at = self._rows = None
            if at is not None and at.size:
                self._sink(at, rows)
        return self.running


class RowExchange:
    """Rounds of the exchange among `group`'s members. It moves rows and holds none between rounds: each
    round is given what this rank serves (`serve`) and where the rows it asked for go (`sink`)."""

    def __init__(self, group: ExchangeGroup, name: str = "rows"):
        self.group, self.name = group, name
        self._id = zlib.crc32(name.encode()) & 0x7FFFFFFF  # what the counts' row says the round is of
        self.rounds = 0
        self.chunks = 0  # chunks moved, all rounds together (each: two all_to_all_single)
        self.served_rows = 0  # rows this rank sent to others
        self.peak_bytes = 0  # the most one chunk held: keys and rows, asked and served
        self._rows_bytes: int | None = None  # bytes of one row `serve` gives (the same on every member)
        self._template: torch.Tensor | None = None  # what `serve` gives for no key: the rows' dtype and shape
        self._open: Round | None = None

    @staticmethod
    def round_bytes(rows: int, row_bytes: int, members: int, held: int | None = None) -> int:
        """The most one round holds on a member (`footprint.exchange_round_bytes`, at this module's
        CHUNK_BYTES)."""
        return exchange_round_bytes(rows, row_bytes, members, held, chunk_bytes=CHUNK_BYTES)

    def round(self, want: Sequence[np.ndarray], serve: Serve, sink: Sink, state: int = ACTIVE) -> bool:
        """A whole round: `start` then `finish`. Returns whether any rank was active."""
        return self.start(want, serve, sink, state).finish()

    def start(self, want: Sequence[np.ndarray], serve: Serve, sink: Sink, state: int = ACTIVE) -> Round:
        """As `_start`; a rank that left the run (its process is gone) is a MomentError that says so."""
        with peer_loss():
            return self._start(want, serve, sink, state)

    def _start(self, want: Sequence[np.ndarray], serve: Serve, sink: Sink, state: int) -> Round:
        """Ask member j for the keys `want[j]`; serve what the others ask. The rows asked for reach `sink`
        chunk by chunk (see `Sink`: positions among want[0], want[1], ... concatenated), the last chunk's when
        the returned round is finished. The previous round must be finished first."""
        g = self.group
        if self._open is not None and self._open.pending:
            raise RuntimeError("the previous round of the exchange is not finished")
        if len(want) != g.size:
            raise ValueError(f"want has {len(want)} entries, the group {g.size} members")
        n, me, dev = g.everyone, g.rank, g.device
        asks_row = np.zeros(n, np.int64)
        asks_row[list(g.ranks)] = [len(w) for w in want]
        row = np.append(asks_row, [int(state), self._id])
        counts = torch.empty(n * (n + 2), dtype=torch.int64, device=dev)
        pg = g.pg()
        dist.all_to_all_single(counts, torch.from_numpy(np.tile(row, n)).to(dev), group=pg)
        matrix = counts.view(n, n + 2).cpu().numpy()  # matrix[i, j]: keys rank i asks of rank j
        if (other := np.flatnonzero(matrix[:, n + 1] != self._id)).size:
            raise MomentError(f"rank {me} ran a round of the {self.name} exchange and rank {int(other[0])} a round "
                              "of another at the same time: every rank iterates each loader that exchanges rows "
                              "(on a split layout, the evaluation loaders and lookups too) in the same order",
                              hint="docs/your-model-loop-data.md says which loaders one rank may iterate alone")
        self.rounds += 1
        asks, running, staying = matrix[:, :n], bool((matrix[:, n] == ACTIVE).any()), bool(matrix[:, n].any())
        total = chunks(asks, chunk_rows(self._row_bytes(serve), g.size)) if asks.any() else 0
        self._open = Round(running, sink, staying=staying)
        if not total:  # every rank knows it: no key and no row moves this round
            return self._open
        # where each owner's keys start among mine, in member order (the order `want` is given in)
        mine = [np.asarray(want[g.ranks.index(r)], np.int64) if r in g.ranks else np.zeros(0, np.int64)
                for r in range(n)]
        first = dict(zip(g.ranks, np.concatenate([[0], np.cumsum([len(w) for w in want])[:-1]]).tolist(),
                         strict=True))
        start = np.array([first.get(r, 0) for r in range(n)], np.int64)
        most = int(max((b - a)[me].sum() for a, b in (chunk_bounds(asks, i, total) for i in range(total))))
        buf: torch.Tensor | None = None
        for k in range(total):
            lo, hi = chunk_bounds(asks, k, total)
            send, recv = (hi - lo)[me].tolist(), (hi - lo)[:, me].tolist()  # keys I ask of each; each asks of me
            keys = torch.from_numpy(np.concatenate([w[a:b] for w, a, b in zip(mine, lo[me], hi[me], strict=True)]))
            keys = keys.to(dev)
            asked = torch.empty(sum(recv), dtype=torch.int64, device=dev)
            dist.all_to_all_single(asked, keys, recv, send, group=pg)
            if buf is None:  # one buffer for the round's received rows, chunk after chunk
                buf = self._template.to(dev).new_empty((most, *self._template.shape[1:]))
            rows = buf[: sum(send)]
            at = np.concatenate([np.arange(s + a, s + b) for s, a, b in zip(start, lo[me], hi[me], strict=True)])
            self.chunks += 1
            got = serve(asked)

            def issue(got=got, keys=keys, asked=asked, rows=rows, buf=buf, send=send, recv=recv, last=k == total - 1):
                out = ready(got).to(dev).contiguous()
                self.served_rows += int(out.shape[0])
                held = keys.nbytes + asked.nbytes + out.nbytes + buf.nbytes  # the round's buffer, not this part
                self.peak_bytes = max(self.peak_bytes, int(held))
                work = dist.all_to_all_single(rows, out, send, recv, group=pg, async_op=last)
                return _Sent(work, out) if last else None

            if k == total - 1:  # the last chunk's rows move while the caller goes on (once its reads are done)
                self._open = Round(running, sink, issue, at, rows, staying)
                if isinstance(got, torch.Tensor):
                    self._open.send()
                return self._open
            issue()
            if at.size:
                sink(at, rows)
        raise AssertionError("unreachable: the last chunk returns")

    def _row_bytes(self, serve: Serve) -> int:
        """Bytes of one served row, from what `serve` gives for no key (once): the chunk's size in rows."""
        if self._rows_bytes is None:
            self._template = ready(serve(torch.empty(0, dtype=torch.int64, device=self.group.device)))
            self._rows_bytes = self._template.element_size() * math.prod(self._template.shape[1:])
        return self._rows_bytes

