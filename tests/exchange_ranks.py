"""One member of tests/test_exchange.py's 2-rank exchange (gloo, a FileStore), with chunks small enough that
a round takes several: every row the sink receives is checked against the owner's rows, and what the
member saw is written as JSON.

    python tests/exchange_ranks.py RANK WORLD STORE_FILE OUT_DIR CHUNK_ROWS

Each member's rows are a function of (member, key), so the asker knows what every owner must send. The
scenarios: uneven counts both ways (and a member asking itself), a member that asks nothing while the
other asks many, and members with different numbers of batches (the shorter finishes and serves on).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from moment.runtime import exchange
from moment.runtime.exchange import ExchangeGroup, RowExchange, into

ROW = (3, 5)  # a row: 3 x 5 int32, 60 B
TIER = 500  # rows each member holds


def rows_of(member: int, keys: np.ndarray) -> torch.Tensor:
    """Member `member`'s rows for `keys`: every value names the member, the key and its place in the row."""
    k = torch.from_numpy(np.asarray(keys, np.int64)).to(torch.int32)
    return (member * 1_000_000 + k[:, None, None] * 100 + torch.arange(15, dtype=torch.int32).view(1, *ROW))


def check(ex: RowExchange, want: list[np.ndarray], serve, active: bool = True) -> tuple[bool, int]:
    """One round into a destination in shuffled order; returns (running, rows received), raising on a wrong row."""
    n = sum(len(w) for w in want)
    pos = np.random.default_rng(n).permutation(n)  # where each asked row goes
    out = torch.full((n, *ROW), -1, dtype=torch.int32)
    calls = []

    def sink(at: np.ndarray, rows: torch.Tensor) -> None:
        calls.append(int(at.size))
        into(out, pos)(at, rows)

    running = ex.round(want, serve, sink, active)
    expect = torch.cat([rows_of(j, w) for j, w in enumerate(want)])
    if not torch.equal(out[torch.from_numpy(pos)], expect):
        raise SystemExit("a received row differs from its owner's")
    cap = exchange.chunk_rows(int(np.prod(ROW)) * 4, ex.group.size)
    if any(c > cap for c in calls):
        raise SystemExit(f"a chunk of {max(calls)} rows is over the chunk's {cap}")
    return running, len(calls)


def main() -> int:
    rank, world, store_file, out, chunk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), \
        int(sys.argv[5])
    exchange.CHUNK_BYTES = chunk * int(np.prod(ROW)) * 4  # chunks of `chunk` rows
    dist.init_process_group("gloo", store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    group = ExchangeGroup(dist.new_group(list(range(world))), tuple(range(world)), rank, torch.device("cpu"))
    served = []

    def serve(keys: torch.Tensor) -> torch.Tensor:
        served.append(int(keys.numel()))
        if keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= TIER):
            raise SystemExit("asked for a key this member does not hold")
        return rows_of(rank, keys.numpy())

    rng = np.random.default_rng(rank)
    ex = RowExchange(group)
    report: dict = {"chunk_rows": exchange.chunk_rows(int(np.prod(ROW)) * 4, world)}
    # uneven counts: rank 0 asks 23 of rank 1 and 4 of itself, rank 1 asks 5 of rank 0 and 9 of itself
    counts = {0: [4, 23], 1: [5, 9]}[rank]
    before = ex.chunks
    _, sunk = check(ex, [rng.integers(0, TIER, c) for c in counts], serve)
    report["uneven"] = {"chunks": ex.chunks - before, "sink_calls": sunk, "peak": ex.peak_bytes}
    # one member asks nothing, the other 41 rows of it
    before, served_before = ex.chunks, sum(served)
    want = [np.zeros(0, np.int64)] * world if rank == 0 else [rng.integers(0, TIER, 41), np.zeros(0, np.int64)]
    _, sunk = check(ex, want, serve)
    report["one_sided"] = {"chunks": ex.chunks - before, "sink_calls": sunk, "served": sum(served) - served_before}
    # different numbers of batches: rank 1 has three more, rank 0 serves them from finish()
    rounds_before = ex.rounds
    for i in range(2 + 3 * rank):
        check(ex, [rng.integers(0, TIER, 7 * i + rank) if j != rank else np.zeros(0, np.int64)
                   for j in range(world)], serve)
    ex.finish(serve)
    report["uneven_batches"] = {"rounds": ex.rounds - rounds_before}
    report.update(rounds=ex.rounds, chunks=ex.chunks, served_rows=ex.served_rows, peak_bytes=ex.peak_bytes,
                  round_bytes=RowExchange.round_bytes(10_000, int(np.prod(ROW)) * 4, world))
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    group.release()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
