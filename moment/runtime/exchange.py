"""Rows that other ranks hold, fetched through torch.distributed collectives: the peer tier's transport,
and the one remote rows between machines can use (the group is any explicit list of ranks).

Why collectives: NCCL moves the rows GPU to GPU (NVLink or PCIe peer to peer where the machine has
them) and gloo does the same on CPU, so the code that runs on a CPU-only CI machine is the code a GPU
run executes; nothing maps another process's memory.

One round, collective over the group (members in group order; every member takes part):

1. counts: each member sends one row to every member: how many keys it asks of each member, and
   whether it still has batches of its own (`all_to_all_single` of that row, so every member learns
   the whole matrix: all know whether any row moves this round and whether anyone still runs);
2. keys: the keys each member asks of each other (`all_to_all_single`, split sizes from the matrix);
3. rows: each owner serves the keys it was asked from its own rows (`serve`) and sends them back
   (`all_to_all_single`); the asker gets them grouped by owner, in the order it asked.

Ordering: collectives on a group must be issued in the same order on every member. The exchange has
its own group (made at start-up on every rank: `moment.runtime.dist.DistContext.peer_group`), so
the all-reduces of training on the default group, issued from another thread, cannot interleave
with its rounds. A rank takes part in one round per batch it completes, whether or not it needs
rows, and `finish` keeps serving until every member has finished its sequence, so all ranks run the
same number of rounds even when their numbers of batches differ (evaluation can give one rank a
batch more than another).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class ExchangeGroup:
    """A process group of explicit ranks, and where its tensors live (NCCL: the rank's GPU; gloo: CPU).

    Its maker releases it before destroying the process groups (`release`): this object is the only
    reference to the group outside torch's registry, so whatever still holds an exchange (a store
    left unclosed by an error) no longer keeps the group, and its threads, alive into interpreter
    shutdown (see moment.runtime.dist.import_before_group).
    """

    group: Any  # torch.distributed ProcessGroup with exactly `ranks`; None once released
    ranks: tuple[int, ...]  # global ranks of the members, in group order
    rank: int  # this rank (global)
    device: torch.device

    @property
    def index(self) -> int:
        """This rank's position among the members."""
        return self.ranks.index(self.rank)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every member's `obj`, in member order (set-up only)."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.pg())
        return out

    def pg(self) -> Any:
        if self.group is None:  # never fall back to the default group (None means it to torch)
            raise RuntimeError("the exchange's process group was released")
        return self.group

    def release(self) -> None:
        self.group = None


#: keys this rank is asked for -> its rows for them (a tensor [len(keys), ...], one dtype and row shape
#: on every member)
Serve = Callable[[torch.Tensor], torch.Tensor]


class RowExchange:
    """Rounds of the exchange over `group`. It moves rows and holds none: each round is given what this
    rank serves (`serve`)."""

    def __init__(self, group: ExchangeGroup):
        self.group = group
        self.rounds = 0
        self.served_rows = 0  # rows this rank sent to others
        self.peak_bytes = 0  # the most one round held: keys and rows, asked and served

    @staticmethod
    def round_bytes(rows: int, row_bytes: int, members: int, held: int | None = None) -> int:
        """The most one round holds on a member when every member asks for at most `rows` rows of
        `row_bytes` each, and at most `held` of any one member (what a member holds; None: no limit): the
        keys and rows it asks and those it serves the others, each row with its int64 key."""
        others = max(int(members), 1) - 1
        each = int(rows) if held is None else min(int(rows), int(held))
        asked, served = min(int(rows), others * each), others * each
        return (asked + served) * (int(row_bytes) + np.dtype(np.int64).itemsize)

    def round(self, want: Sequence[np.ndarray], serve: Serve, active: bool = True) -> tuple[torch.Tensor, bool]:
        """Ask member j for the keys `want[j]`; serve what the others ask. Returns (the rows asked for,
        grouped by member in member order, each group in the order asked; whether any member was active)."""
        g = self.group
        n, me, dev = g.size, g.index, g.device
        if len(want) != n:
            raise ValueError(f"want has {len(want)} entries, the group {n} members")
        row = np.array([len(w) for w in want] + [int(active)], np.int64)
        counts = torch.empty(n * (n + 1), dtype=torch.int64, device=dev)
        pg = g.pg()
        dist.all_to_all_single(counts, torch.from_numpy(np.tile(row, n)).to(dev), group=pg)
        matrix = counts.view(n, n + 1).cpu().numpy()  # matrix[i, j]: keys member i asks of member j
        self.rounds += 1
        asks, running = matrix[:, :n], bool(matrix[:, n].any())
        send, recv = asks[me].tolist(), asks[:, me].tolist()  # keys I ask of each; keys each asks of me
        if not asks.any():  # every member knows it: no key and no row moves this round
            rows = serve(torch.empty(0, dtype=torch.int64, device=dev))
            return rows, running
        keys = torch.from_numpy(np.concatenate([np.asarray(w, np.int64) for w in want])).to(dev)
        asked = torch.empty(sum(recv), dtype=torch.int64, device=dev)
        dist.all_to_all_single(asked, keys, recv, send, group=pg)
        out = serve(asked).to(dev).contiguous()
        rows = out.new_empty((sum(send), *out.shape[1:]))
        dist.all_to_all_single(rows, out, send, recv, group=pg)
        self.served_rows += int(out.shape[0])
        held = keys.nbytes + asked.nbytes + out.nbytes + rows.nbytes
        self.peak_bytes = max(self.peak_bytes, int(held))
        return rows, running

    def finish(self, serve: Serve) -> None:
        """Serve the other members until every one has finished its sequence (each calls this once its
        own batches are done; all return after the same round)."""
        nothing = [np.zeros(0, np.int64)] * self.group.size
        while self.round(nothing, serve, active=False)[1]:
            pass
