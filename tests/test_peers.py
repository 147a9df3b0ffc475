"""The peer tier under torchrun (2 ranks, gloo): rows on the other rank's GPU tier come from its memory
(a shared segment on CPU, CUDA IPC on GPUs), bit-exact, and are no longer read from the layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from runtime_data import make_dataset, make_layout

from moment.runtime import hostcache

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    ds = make_dataset(root)
    return make_layout(ds, root / "L")  # 2 GPU bins: rank r holds gpu r, its peer the other


def _ranks(layout: Path, out: Path, device: str) -> list[dict]:
    out.mkdir()
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(REPO / "tests" / "peer_ranks.py"), str(layout), str(out), device],
                       cwd=REPO, env=e, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in (0, 1)]


def _check(reports: list[dict]) -> None:
    for rep in reports:
        for name in ("peers_shared", "peers_lru"):
            run = rep[name]
            assert run["peer_rows"] > 0 and run["tiers"]["peer"] > 0, (name, run)
            assert run["gpu_bin_rows_read"] == 0, (name, run)  # no GPU-bin row read from the layout
            assert run["memory"]["gpu_cache"] == run["gpu_rows"] * 128  # own tier only: peers are mapped
        alone = rep["no_peers"]
        for name in ("peers_shared", "no_peers"):  # the SSD-read model serves the same rows from the tiers
            assert rep[name]["model_ssd_rows"] == rep[name]["tiers"]["ssd"], (name, rep[name])
        assert alone["peer_rows"] == 0 and alone["tiers"]["peer"] == 0 and alone["gpu_bin_rows_read"] > 0
        # with peers the shared cache leaves out every GPU tier of the node, not only the rows no GPU holds
        assert rep["peers_shared"]["cache_rows"] == alone["cache_rows"]
        assert rep["peers_shared"]["tiers"]["ssd"] < alone["tiers"]["ssd"]
    # the two ranks sized the shared cache alike
    assert reports[0]["peers_shared"]["cache_rows"] == reports[1]["peers_shared"]["cache_rows"]


def test_two_ranks_on_cpu_copy_peer_rows_from_shared_segments(layout, tmp_path):
    if why := hostcache.shm_room(8 << 20):
        pytest.skip(why)
    _check(_ranks(layout, tmp_path / "cpu", "cpu"))
    assert not list(hostcache.SHM.glob(hostcache.PREFIX + "*-gpu*"))  # every segment unlinked


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the CUDA IPC path of the peer tier)")
def test_two_ranks_on_cuda_copy_peer_rows_device_to_device(layout, tmp_path):
    """Runs with one GPU too: two processes on one device still map each other's memory through CUDA IPC
    (with two or more GPUs each rank has its own device and the copy is peer to peer)."""
    _check(_ranks(layout, tmp_path / "cuda", "cuda"))
