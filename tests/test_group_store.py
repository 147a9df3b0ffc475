"""Where a rank's process group meets the others: torchrun's store, under keys of its own attempt and group.

gloo's ranks find each other by addresses written to the store under keys torch names by the group's number,
which destroy_process_group resets: a second group in the same process (a script's second `open_run`) or
attempt (after a restart) must not read the previous one's addresses, which name closed ports."""

from __future__ import annotations

import itertools

import pytest
import torch.distributed as dist

from moment.runtime import dist as mdist

KEY = "0//cpu//0/1"  # where torch's first group keeps rank 1's gloo address


@pytest.fixture
def store(monkeypatch):
    shared = dist.HashStore()  # the agent's store, as every rank of the machine sees it
    monkeypatch.setattr(mdist.dist, "TCPStore", lambda *a, **k: shared)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    return shared


def _rank_process(monkeypatch) -> None:
    """Another rank's process: its own count of groups made, from none."""
    monkeypatch.setattr(mdist, "_GROUPS_MADE", itertools.count())


def test_a_second_group_in_the_same_process_does_not_read_the_firsts_addresses(store, monkeypatch):
    _rank_process(monkeypatch)
    first = mdist._attempt_store(1, 2)
    first.set(KEY, b"127.0.0.1:40717")  # rank 1's address in the first run, closed with it
    second = mdist._attempt_store(1, 2)
    assert first.check([KEY]) and not second.check([KEY])
    # rank 0's process, opening its runs in the same order, meets rank 1 under the same keys each time
    _rank_process(monkeypatch)
    assert mdist._attempt_store(0, 2).get(KEY) == b"127.0.0.1:40717"
    peer_second = mdist._attempt_store(0, 2)
    second.set(KEY, b"127.0.0.1:45893")
    assert peer_second.get(KEY) == b"127.0.0.1:45893"


def test_a_restart_does_not_read_the_previous_attempts_addresses(store, monkeypatch):
    _rank_process(monkeypatch)
    mdist._attempt_store(1, 2).set(KEY, b"127.0.0.1:40717")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    _rank_process(monkeypatch)  # a restart is a new process
    assert not mdist._attempt_store(0, 2).check([KEY])


def test_without_torchruns_address_the_rank_is_told_to_launch_with_it(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(mdist.MomentError, match="WORLD_SIZE=2 but MASTER_ADDR is not set: launch with torchrun"):
        mdist._attempt_store(0, 2)


def test_a_ddp_model_lets_its_group_go_through_the_groups_own_handle():
    """`run.ddp`'s module frees its reducer and logger (handles that keep the GIL as they go) before its group's
    own handle (which releases it), so gloo's teardown never waits for a worker that waits for the GIL."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain = list(DDP(torch.nn.Linear(4, 2)).__dict__)
        assert plain.index("process_group") < plain.index("reducer")  # torch's order: the reducer frees it last
        model = mdist.free_group_last(DDP(torch.nn.Linear(4, 2)))
        keys = list(model.__dict__)
        assert keys[-1] == "process_group" and {"reducer", "logger"} <= set(keys)
        model(torch.randn(3, 4)).sum().backward()  # and it trains as before
        assert model.module.weight.grad is not None
        del model
    finally:
        dist.destroy_process_group()


ROUNDS = """
import torch, torch.distributed as dist
from moment.runtime import dist as mdist
for _ in range(100):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mdist.release_retired()  # as setup does once a new group has met
    ctx = mdist.DistContext(0, 0, 1, 1, torch.device("cpu"), "gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))  # the script's own, not run.ddp's
    model(torch.ones(3, 4)).sum().backward()
    ctx.all_reduce(torch.tensor([1.0, 2.0]))  # a loss check's collective, its tensor freed at once
    ctx.close()
    del model  # the reducer lets the group go right after the collective (the error's frames freed)
print("rounds done")
"""


def test_a_scripts_own_ddp_freed_right_after_the_runs_close_does_not_hang_the_rank():
    """A run's group stays held past its close (`_RETIRED`) until the next group meets: the script's own DDP
    model, freed right after the run's last collective, is not what frees the group with the GIL held (without
    it this loop hung within ~15-40 rounds)."""
    import subprocess
    import sys

    try:
        out = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a round of open, DDP, collective, close and free hung")
    assert out.returncode == 0 and "rounds done" in out.stdout, out.stderr[-2000:]
