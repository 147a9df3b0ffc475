"""The peer tier under torchrun (2 ranks): rows on the other rank's GPU tier come from it through the
collective exchange (gloo on CPU, NCCL on GPUs: the same code), bit-exact against the layout, and are
no longer read from the layout; the ranks stay in step when their numbers of batches differ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from moment.runtime import agent, hostcache

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def layout(runtime_layout):
    return runtime_layout  # 2 GPU bins: rank r holds gpu r, its peer the other (the session's, read-only)


def _ranks(layout: Path, out: Path, device: str) -> list[dict]:
    out.mkdir()
    e = {**os.environ, "OMP_NUM_THREADS": "1"}
    # its own process group: ranks that hang (out of step) go down with torchrun on the timeout
    p = subprocess.Popen([*agent.COMMAND, "--standalone", "--nproc-per-node=2",
                          str(REPO / "tests" / "peer_ranks.py"), str(layout), str(out), device],
                         cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        raise AssertionError("the ranks hung for 300 s (out of step?):\n" + stderr[-5000:]) from None
    assert p.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in (0, 1)]


def _check(reports: list[dict]) -> None:
    for rank, rep in enumerate(reports):
        other = reports[1 - rank]
        for name in ("peers_shared", "peers_lru"):
            run = rep[name]
            assert run["peer_rows"] > 0 and run["tiers"]["peer"] > 0, (name, run)
            assert run["peer_rows_checked"] == run["tiers"]["peer"], (name, run)  # each one checked
            assert run["gpu_bin_rows_read"] == 0, (name, run)  # no GPU-bin row read from the layout
            assert run["memory"]["gpu_cache"] == run["gpu_rows"] * 128  # own tier only
            # what this rank received, the other served (the pipelined sequence included)
            assert other[name]["served_rows"] == run["received_rows"] > run["tiers"]["peer"], (name, run, other[name])
            assert run["rounds"] == other[name]["rounds"], (name, run["rounds"], other[name]["rounds"])
            # rounds of several chunks (tests/peer_ranks.py makes them small), as many on both ranks
            assert run["chunks"] == other[name]["chunks"] > run["rounds"], (name, run["chunks"], run["rounds"])
            assert run["pipelined_batches"] == 4 + 2 * rank
        alone = rep["no_peers"]
        for name in ("peers_shared", "no_peers"):  # the SSD-read model serves the same rows from the tiers
            assert rep[name]["model_ssd_rows"] == rep[name]["tiers"]["ssd"], (name, rep[name])
        assert alone["peer_rows"] == 0 and alone["tiers"]["peer"] == 0 and alone["gpu_bin_rows_read"] > 0
        # with peers the shared cache leaves out every GPU tier of the node, not only the rows no GPU holds
        assert rep["peers_shared"]["cache_rows"] == alone["cache_rows"]
        assert rep["peers_shared"]["tiers"]["ssd"] < alone["tiers"]["ssd"]
        # the peer tier alone over the disk tier: bit-exact (checked by the ranks), one round's buffers
        # within what the exchange states for the memory budget
        solo = rep["peer_alone"]
        assert solo["chain"] == ["peer", "ssd"] and solo["tiers"]["peer"] == solo["peer_rows_checked"] > 0, solo
        # rank 0's lookup and evaluation batch alone (rank 1 at a barrier): the peers' rows read from the layout
        if rank == 0:
            assert solo["alone"]["peer"] == 0 and solo["alone"]["ssd"] > 0, solo
        else:
            assert "alone" not in solo, solo
        # a round of k peer rows each way, in chunks that split the k evenly: within the stated size, and
        # near it (a chunk holds more than half of the chunk the statement charges)
        assert solo["full_round_stated"] // 2 < solo["full_round"] <= solo["full_round_stated"], solo
        assert solo["exchange_peak"] == solo["memory"]["exchange"] <= solo["round_bytes"], solo
    # only rank 1 asks (rank 1's tier is empty), and rank 0 took part in every one of its rounds
    zero, one = reports[0]["one_sided"], reports[1]["one_sided"]
    assert zero["peer_rows"] == zero["received_rows"] == 0 and zero["served_rows"] == one["received_rows"] > 0
    assert one["gpu_rows"] == 0 and one["peer_rows"] > 0 and zero["rounds"] == one["rounds"]
    # the two ranks sized the shared cache alike
    assert reports[0]["peers_shared"]["cache_rows"] == reports[1]["peers_shared"]["cache_rows"]


@pytest.mark.slow
def test_two_gloo_ranks_exchange_peer_rows_bit_exact(layout, tmp_path):
    if why := hostcache.shm_room(8 << 20):  # the static policy's shared CPU cache (not the peer tier)
        pytest.skip(why)
    _check(_ranks(layout, tmp_path / "cpu", "cpu"))


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL runs one rank per GPU)")
def test_two_nccl_ranks_exchange_peer_rows_bit_exact(layout, tmp_path):
    _check(_ranks(layout, tmp_path / "cuda", "cuda"))
