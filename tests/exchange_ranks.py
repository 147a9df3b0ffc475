"""The members of tests/test_exchange.py's 2-rank exchange (gloo, a FileStore), with chunks small enough that
a round takes several: every row the sink receives is checked against the owner's rows, and what each
member saw is written as JSON. The members are forked from this process once it has imported torch (one torch
start-up, ~1.8 CPU-s, instead of one per member), as tests/spawned_ranks.py's: torch.multiprocessing's fork
start, which ends the others when one fails (they would wait on it); it exits 1 then.

    python tests/exchange_ranks.py WORLD STORE_FILE OUT_DIR CHUNK_ROWS [BACKEND]

BACKEND is gloo (the default, on CPU) or nccl (rank r on cuda:r). The rounds run on the world group, as the
runtime's do. With WORLD 3, ranks 0 and 2 exchange as members of one exchange while rank 1 is the only
member of its own (a machine of one rank): it asks nothing, serves nothing, and takes part in every round.

Each member's rows are a function of (member, key), so the asker knows what every owner must send. The
scenarios: uneven counts both ways (and a member asking itself), a member that asks nothing while the
other asks many, members with different numbers of batches (the shorter finishes and serves on), and a round
of one exchange on one member while the other runs another's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moment.errors import MomentError
from moment.runtime import exchange
from moment.runtime.exchange import ACTIVE, SERVING, ExchangeGroup, RowExchange, into, nothing



def serve_until_done(ex: RowExchange, serve) -> None:
    """A member whose batches are done serves the others until every member's are (as a tier's `finish`)."""
    none = [np.zeros(0, np.int64)] * ex.group.size
    while ex.round(none, serve, nothing, SERVING):
        pass


ROW = (3, 5)  # a row: 3 x 5 int32, 60 B
TIER = 500  # rows each member holds


def rows_of(member: int, keys: np.ndarray) -> torch.Tensor:
    """Member `member`'s rows for `keys`: every value names the member, the key and its place in the row."""
    k = torch.from_numpy(np.asarray(keys, np.int64)).to(torch.int32)
    return (member * 1_000_000 + k[:, None, None] * 100 + torch.arange(15, dtype=torch.int32).view(1, *ROW))


def check(ex: RowExchange, want: list[np.ndarray], serve, state: int = ACTIVE,
          device: torch.device = torch.device("cpu")) -> tuple[bool, int]:
    """One round into a destination in shuffled order; returns (running, sink calls), raising on a wrong row."""
    n = sum(len(w) for w in want)
    pos = np.random.default_rng(n).permutation(n)  # where each asked row goes
    out = torch.full((n, *ROW), -1, dtype=torch.int32, device=device)
    calls = []

    def sink(at: np.ndarray, rows: torch.Tensor) -> None:
        calls.append(int(at.size))
        into(out, pos)(at, rows)

    running = ex.round(want, serve, sink, state)
    expect = torch.cat([rows_of(j, w) for j, w in enumerate(want)])
    if not torch.equal(out.cpu()[torch.from_numpy(pos)], expect):
        raise SystemExit("a received row differs from its owner's")
    cap = exchange.chunk_rows(int(np.prod(ROW)) * 4, ex.group.size)
    if any(c > cap for c in calls):
        raise SystemExit(f"a chunk of {max(calls)} rows is over the chunk's {cap}")
    return running, len(calls)


def main() -> int:
    try:  # a member that fails ends the others (which would wait on it in a round) and raises here
        mp.start_processes(member, args=(int(sys.argv[1]), *sys.argv[2:]), nprocs=int(sys.argv[1]),
                           start_method="fork")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:  # its own words went to stderr
        print(e, file=sys.stderr)
        return 1
    return 0


def member(rank: int, world: int, store_file: str, out: str, chunk: str, backend: str = "gloo") -> int:
    out, chunk = Path(out), int(chunk)
    exchange.CHUNK_BYTES = chunk * int(np.prod(ROW)) * 4  # chunks of `chunk` rows
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    if world == 3:
        return subset(rank, out, device)
    group = ExchangeGroup(dist.group.WORLD, tuple(range(world)), rank, device, world)
    served = []

    def serve(keys: torch.Tensor) -> torch.Tensor:
        served.append(int(keys.numel()))
        if keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= TIER):
            raise SystemExit("asked for a key this member does not hold")
        return rows_of(rank, keys.cpu().numpy()).to(device)

    rng = np.random.default_rng(rank)
    ex = RowExchange(group)
    report: dict = {"chunk_rows": exchange.chunk_rows(int(np.prod(ROW)) * 4, world)}
    # uneven counts: rank 0 asks 23 of rank 1 and 4 of itself, rank 1 asks 5 of rank 0 and 9 of itself
    counts = {0: [4, 23], 1: [5, 9]}[rank]
    before = ex.chunks
    _, sunk = check(ex, [rng.integers(0, TIER, c) for c in counts], serve, device=device)
    report["uneven"] = {"chunks": ex.chunks - before, "sink_calls": sunk, "peak": ex.peak_bytes}
    # one member asks nothing, the other 41 rows of it
    before, served_before = ex.chunks, sum(served)
    want = [np.zeros(0, np.int64)] * world if rank == 0 else [rng.integers(0, TIER, 41), np.zeros(0, np.int64)]
    _, sunk = check(ex, want, serve, device=device)
    report["one_sided"] = {"chunks": ex.chunks - before, "sink_calls": sunk, "served": sum(served) - served_before}
    # zero-size: nobody asks anything (one collective, no chunk)
    before = ex.chunks
    check(ex, [np.zeros(0, np.int64)] * world, serve, device=device)
    report["nothing"] = {"chunks": ex.chunks - before}
    # different numbers of batches: rank 1 has three more, rank 0 serves them from finish()
    rounds_before = ex.rounds
    for i in range(2 + 3 * rank):
        check(ex, [rng.integers(0, TIER, 7 * i + rank) if j != rank else np.zeros(0, np.int64)
                   for j in range(world)], serve, device=device)
    serve_until_done(ex, serve)
    report["uneven_batches"] = {"rounds": ex.rounds - rounds_before}
    report.update(rounds=ex.rounds, chunks=ex.chunks, served_rows=ex.served_rows, peak_bytes=ex.peak_bytes,
                  round_bytes=RowExchange.round_bytes(10_000, int(np.prod(ROW)) * 4, world))
    # a round of one exchange on rank 0 and of another on rank 1: one MomentError on both, no key served
    other = RowExchange(group, "peer" if rank == 0 else "remote")
    try:
        other.round([rng.integers(0, TIER, 3)] * world, serve, nothing)
    except MomentError as e:
        report["mixed"] = {"error": str(e), "served": other.served_rows}
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    group.release()
    dist.destroy_process_group()
    return 0


def subset(rank: int, out: Path, device: torch.device) -> int:
    """Ranks 0 and 2 one exchange, rank 1 alone in its own: rows between 0 and 2 only, every round together."""
    members = (0, 2) if rank != 1 else (1,)
    group = ExchangeGroup(dist.group.WORLD, members, rank, device, 3)

    def serve(keys: torch.Tensor) -> torch.Tensor:
        if rank == 1 and keys.numel():
            raise SystemExit("rank 1 was asked for rows though no exchange has it as an owner")
        return rows_of(group.index, keys.cpu().numpy()).to(device)

    ex = RowExchange(group)
    rng = np.random.default_rng(rank)
    rows = 0
    for i in range(3 + rank):  # rank 2 has two batches more than rank 0, rank 1 one more
        if rank == 1:
            want = [np.zeros(0, np.int64)]
        else:
            want = [rng.integers(0, TIER, 5 + i) if m != rank else np.zeros(0, np.int64) for m in members]
        check(ex, want, serve, device=device)
        rows += sum(len(w) for w in want)
    serve_until_done(ex, serve)
    (out / f"rank{rank}.json").write_text(json.dumps({"rounds": ex.rounds, "chunks": ex.chunks, "rows": rows,
                                                      "served_rows": ex.served_rows}))
    group.release()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
