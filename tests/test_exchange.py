"""The collective row exchange (moment.runtime.exchange): a group of one rank asks itself, through the same
all_to_all_single calls a node's ranks make (gloo on CPU; NCCL where CUDA exists); the chunk plan alone; and
two gloo members with chunks small enough that a round takes several (tests/exchange_ranks.py). The peer
tier over the exchange, under torchrun with ranks of different batch counts, is tests/test_peers.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from moment.runtime import exchange
from moment.runtime.lost import LeftRun
from moment.runtime.exchange import SERVING, ExchangeGroup, RowExchange, chunk_bounds, chunk_rows, chunks, into
from tests.exchange_ranks import serve_until_done

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def group(request):
    backend, device = request.param
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the exchange's NCCL path)")
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    eg = ExchangeGroup(dist.new_group([0]), (0,), 0, torch.device(device))
    try:
        yield eg
    finally:
        eg.release()
        dist.destroy_process_group()


BACKENDS = [pytest.param(("gloo", "cpu"), id="gloo"), pytest.param(("nccl", "cuda"), id="nccl")]


@pytest.mark.parametrize("group", BACKENDS, indirect=True)
def test_a_round_returns_the_owner_rows_in_the_order_asked(group):
    tier = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (50, 24), dtype=np.uint8)).to(group.device)
    asked = []
    def serve(keys: torch.Tensor) -> torch.Tensor:
        asked.append(keys.numel())
        return tier[keys]

    ex = RowExchange(group)
    keys = np.array([7, 3, 3, 49, 0], np.int64)
    got = torch.zeros(5, 24, dtype=torch.uint8, device=group.device)
    running = ex.round([keys], serve, into(got))
    assert torch.equal(got.cpu(), tier.cpu()[keys])
    assert running and ex.served_rows == 5 and asked[-1] == 5 and ex.chunks == 1
    running = ex.round([np.zeros(0, np.int64)], serve, into(got), state=SERVING)  # nothing asked: no key moves
    assert not running and ex.rounds == 2 and ex.chunks == 1
    serve_until_done(ex, serve)  # alone and done: one round, then it returns
    assert ex.rounds == 3 and ex.served_rows == 5
    with pytest.raises(ValueError, match="the group 1 members"):
        ex.round([keys, keys], serve, into(got))
    group.release()
    with pytest.raises(LeftRun, match="the run is closed on this rank"):  # never the default group in its place
        ex.round([keys], serve, into(got))


@pytest.mark.parametrize("group", BACKENDS, indirect=True)
def test_a_round_larger_than_a_chunk_moves_in_chunks_into_the_sink(group, monkeypatch):
    rb = 24
    monkeypatch.setattr(exchange, "CHUNK_BYTES", 10 * rb)  # chunks of 10 rows
    tier = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (500, rb), dtype=np.uint8)).to(group.device)
    served = []

    def serve(keys: torch.Tensor) -> torch.Tensor:
        served.append(keys.numel())
        return tier[keys]

    ex = RowExchange(group)
    keys = np.random.default_rng(2).integers(0, 500, 73)
    pos = np.random.default_rng(3).permutation(73)
    got = torch.zeros(73, rb, dtype=torch.uint8, device=group.device)
    assert ex.round([keys], serve, into(got, pos))
    assert torch.equal(got.cpu()[torch.from_numpy(pos)], tier.cpu()[keys])  # each row at its own position
    assert ex.chunks == 8 and max(served) == 10 and sum(served) == 73  # 73 rows, 10 a chunk
    assert ex.peak_bytes == 2 * 10 * (rb + 8)  # one chunk's keys and rows, asked and served: not the round's


def _matrix(n: int, draw) -> np.ndarray:
    return np.array([[draw() for _ in range(n)] for _ in range(n)], np.int64)


@settings(max_examples=40)
@given(st.integers(1, 5), st.integers(1, 40), st.data())
def test_the_chunk_plan_moves_every_key_once_within_the_bound_in_the_fewest_chunks(n, cap, data):
    asks = _matrix(n, lambda: data.draw(st.integers(0, 300)))
    cap = max(cap, n)
    k = chunks(asks, cap)
    if not asks.any():
        assert k == 0
        return
    parts = [np.subtract(*chunk_bounds(asks, i, k)[::-1]) for i in range(k)]
    assert sum(parts).tolist() == asks.tolist()  # every key of every pair once, in order
    assert all(p.sum(0).max() <= cap and p.sum(1).max() <= cap for p in parts)  # into and out of each member
    if k > 1:  # one chunk fewer would not fit
        fewer = [np.subtract(*chunk_bounds(asks, i, k - 1)[::-1]) for i in range(k - 1)]
        assert any(p.sum(0).max() > cap or p.sum(1).max() > cap for p in fewer)


def test_a_chunk_too_small_for_one_row_of_each_member_is_refused():
    assert chunk_rows(1 << 30, 3) == 3  # rows larger than a chunk: one of each member at a time
    with pytest.raises(ValueError, match="one row of each of 3 members"):
        chunks(np.ones((3, 3), np.int64), 2)


def test_a_round_holds_at_most_two_chunks_whatever_the_batch_asks():
    rb = 520
    cap = chunk_rows(rb, 2)
    assert cap == exchange.CHUNK_BYTES // rb
    assert RowExchange.round_bytes(100, rb, 2) == 2 * 100 * (rb + 8)  # under a chunk: the rows themselves
    assert RowExchange.round_bytes(80_000, rb, 2) == 2 * cap * (rb + 8) < 10 << 20  # the bench's batch
    assert RowExchange.round_bytes(80_000, rb, 2, held=50) == 2 * 50 * (rb + 8)  # a peer holds 50 rows
    assert RowExchange.round_bytes(80_000, rb, 1) == 0  # nobody to ask


def _members(tmp_path: Path, world: int, chunk: int, backend: str = "gloo") -> list[dict]:
    """tests/exchange_ranks.py's `world` members (a FileStore), forked from one process; each one's report."""
    store = tmp_path / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # its own process group: on a timeout the members go down with it
    p = subprocess.Popen([sys.executable, str(REPO / "tests" / "exchange_ranks.py"), str(world), str(store),
                          str(tmp_path), str(chunk), backend], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=120)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:  # every member gone already
            pass
    assert p.returncode == 0, err[-3000:]
    return [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (the exchange on NCCL between two ranks)"))])
def test_two_members_exchange_in_chunks_bit_exact(tmp_path, backend, chunk=4):
    """Uneven counts, a member asking itself, one asking nothing, nobody asking, different numbers of batches,
    two exchanges' rounds at once: every row checked by the members (tests/exchange_ranks.py), chunks of `chunk` rows; gloo on CPU, NCCL on
    two GPUs (where they exist)."""
    r = _members(tmp_path, 2, chunk, backend)
    assert r[0]["chunk_rows"] == chunk
    # uneven: the matrix [[4, 23], [5, 9]]: 32 rows asked of rank 1, so at least 32 / chunk chunks, on both
    u = [x["uneven"] for x in r]
    assert u[0]["chunks"] == u[1]["chunks"] == chunks(np.array([[4, 23], [5, 9]]), chunk) >= -(-32 // chunk) > 1
    assert all(x["sink_calls"] > 1 for x in u)
    # one-sided: rank 0 asks nothing (its sink never called) and serves rank 1's 41 rows chunk by chunk
    o = [x["one_sided"] for x in r]
    assert o[0]["chunks"] == o[1]["chunks"] == -(-41 // chunk)
    assert o[0]["sink_calls"] == 0 and o[1]["sink_calls"] == o[1]["chunks"] and o[0]["served"] == 41
    # different numbers of batches: rank 0 serves rank 1's three more in finish(); both ran the same rounds
    assert r[0]["uneven_batches"]["rounds"] == r[1]["uneven_batches"]["rounds"] == 6
    assert r[0]["rounds"] == r[1]["rounds"] and r[0]["chunks"] == r[1]["chunks"]
    # one chunk's keys and rows, asked and served: within what the exchange states for any round
    assert all(0 < x["peak_bytes"] <= x["round_bytes"] == 2 * chunk * (60 + 8) for x in r)
    assert [x["nothing"]["chunks"] for x in r] == [0, 0]  # nobody asked: the counts alone, on both
    # rank 0 in a round of one exchange, rank 1 of another: both stop at its counts, naming it, nothing served
    for rank, x in enumerate(r):
        name = ("peer", "remote")[rank]
        assert f"rank {rank} ran a round of the {name} exchange and rank {1 - rank} a round of another" in \
            x["mixed"]["error"] and x["mixed"]["served"] == 0, x


@pytest.mark.slow
def test_members_of_one_exchange_and_a_rank_of_another_take_part_in_every_round_on_the_world_group(tmp_path):
    """The runtime's exchanges run on the world group (one communicator): ranks 0 and 2 exchange rows while
    rank 1, the only member of its own exchange, asks and serves nothing, yet every rank runs every round
    until the last one is done (rank 2 has the most batches)."""
    r = _members(tmp_path, 3, 4)
    assert r[0]["rounds"] == r[1]["rounds"] == r[2]["rounds"] == 6  # rank 2's 5 batches, then the last idle round
    assert r[1]["rows"] == r[1]["served_rows"] == 0
    assert r[0]["served_rows"] == r[2]["rows"] > 0 and r[2]["served_rows"] == r[0]["rows"] > 0


@pytest.mark.parametrize("group", BACKENDS[:1], indirect=True)
def test_rows_still_being_read_are_sent_when_the_round_is_finished(group, monkeypatch):
    """A serving rank's disk reads (the remote tier's) come back as a Deferred: the last chunk's are waited for
    only when the round is finished (they run during the caller's training step); earlier chunks' at once."""
    rb = 16
    monkeypatch.setattr(exchange, "CHUNK_BYTES", 4 * rb)  # chunks of 4 rows
    tier = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (40, rb), dtype=np.uint8))
    waited = []

    class Reading:
        def __init__(self, keys):
            self.keys = keys

        def wait(self):
            waited.append(int(self.keys.numel()))
            return tier[self.keys]

    def serve(keys: torch.Tensor):
        return tier[keys] if keys.numel() == 0 else Reading(keys)

    ex = RowExchange(group)
    keys = np.array([3, 9, 1], np.int64)
    got = torch.zeros(3, rb, dtype=torch.uint8)
    r = ex.start([keys], serve, into(got))
    assert waited == [] and r.pending and not got.any()  # nothing read yet, nothing sent
    assert r.finish() and waited == [3] and torch.equal(got, tier[keys]) and not r.pending
    keys = np.arange(10, 20)
    got = torch.zeros(10, rb, dtype=torch.uint8)
    r = ex.start([keys], serve, into(got))
    assert waited == [3, 3, 3]  # chunks of 3, 3 and 4 rows (split evenly): the first two at once
    r.finish()
    assert waited == [3, 3, 3, 4] and torch.equal(got, tier[keys])  # the last one at finish
