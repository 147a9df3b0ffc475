"""The collective row exchange (moment.runtime.exchange) in one process: a group of one rank asks itself,
through the same three all_to_all_single calls a node's ranks make (gloo on CPU; NCCL where CUDA exists).
The two-rank exchange, with ranks of different batch counts, is tests/test_peers.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from moment.runtime.exchange import ExchangeGroup, RowExchange


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
    rows, running = ex.round([keys], serve)
    assert rows.device.type == group.device.type and torch.equal(rows.cpu(), tier.cpu()[keys])
    assert running and ex.served_rows == 5 and asked == [5]
    rows, running = ex.round([np.zeros(0, np.int64)], serve, active=False)  # nothing asked: no key moves
    assert rows.shape == (0, 24) and not running and ex.rounds == 2
    ex.finish(serve)  # alone and done: one round, then it returns
    assert ex.rounds == 3 and ex.served_rows == 5
    with pytest.raises(ValueError, match="the group 1 members"):
        ex.round([keys, keys], serve)
    group.release()
    with pytest.raises(RuntimeError, match="released"):  # never the default group in its place
        ex.round([keys], serve)
