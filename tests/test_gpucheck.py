"""`moment doctor --gpu` (moment.runtime.gpucheck): the checks a GPU machine runs first, run here on the CPU
through the same code (`--device cpu`); without CUDA the plain command says so in one line and exits 0."""

from __future__ import annotations

import json

import pytest
import torch

import moment.runtime.gpucheck as gc
from moment.cli import main

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the checks would run")


def _doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out, err


@no_cuda
def test_without_cuda_it_says_so_in_one_line_and_exits_0(capsys):
    code, out, err = _doctor(capsys, "--gpu")
    assert code == 0 and err == ""
    assert out.strip().splitlines() == [f"no CUDA here: torch {torch.__version__} sees no CUDA device; nothing to "
                                        "check on a GPU"]
    code, out, _ = _doctor(capsys, "--gpu", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["cuda"] is None and doc["checks"] == [] and doc["device"] is None
    assert gc.main([]) == 0  # python -m moment.runtime.gpucheck: the same
    assert capsys.readouterr().out.startswith("no CUDA here")


@no_cuda
def test_what_cannot_run_is_one_error(capsys):
    code, _, err = _doctor(capsys, "--gpu", "--device", "cuda")
    assert code == 2 and "--device cuda: torch" in err and "sees no CUDA device" in err and "Traceback" not in err
    code, _, err = _doctor(capsys, "--gpu", "--device", "tpu")
    assert code == 2 and "--device 'tpu': choose cpu or cuda" in err
    code, _, err = _doctor(capsys, "--gpu", "--device", "cpu", "--ranks", "0")
    assert code == 2 and "--ranks 0: must be at least 1" in err
    code, _, err = _doctor(capsys)
    assert code == 2 and "--gpu" in err


@pytest.mark.slow
def test_on_cpu_the_pipelined_epoch_equals_the_in_memory_run_and_the_ring_delivers_every_byte(capsys):
    """The same comparison a GPU runs, here on the CPU with one rank (the 2-rank tiered run against the
    in-memory baseline is tests/test_train.py's): every tier is read, and the loss curves agree bit for bit."""
    code, out, err = _doctor(capsys, "--gpu", "--device", "cpu", "--ranks", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] and doc["device"] == "cpu"
    checks = {c["name"]: c for c in doc["checks"]}
    assert list(checks) == ["pipelined epoch", "staging ring"]  # no CUDA tests on the CPU
    epoch = checks["pipelined epoch"]
    assert epoch["status"] == "ok" and epoch["data"]["bit_exact"] and epoch["data"]["steps"] == 8
    assert {"gpu", "cpu", "ssd"} <= set(epoch["data"]["tier_rows"])  # the tiered store really read its tiers
    ring = checks["staging ring"]
    assert ring["status"] == "ok" and ring["data"]["mismatched"] == [] and ring["data"]["batches"] == len(gc.RING_BATCHES)


@pytest.mark.parametrize("device,off,status", [("cpu", 0.0, "ok"), ("cpu", 1e-9, "failed"), ("cuda", 5e-7, "ok"),
                                               ("cuda", 2e-6, "failed")])
def test_a_loss_curve_further_than_the_tolerance_from_the_in_memory_run_fails(monkeypatch, tmp_path, device, off,
                                                                              status):
    """On CPU the two runs read the same bytes in the same order: any difference fails; on CUDA, 1e-6."""
    curves = {"memory.json": [1.25, 0.75, 0.5], "tiered.json": [1.25, 0.75 + off, 0.5]}
    monkeypatch.setattr(gc, "make_layout", lambda root, gpus: root / "L")
    monkeypatch.setattr(gc, "launch", lambda ranks, args, metrics: {"loss_curve": curves[metrics.name],
                                                                   "tier_rows": {"ssd": 3}})
    c = gc.pipelined_epoch(device, tmp_path, 2)
    assert c.status == status and c.data["bit_exact"] == (off == 0.0) and c.data["max_abs_diff"] == pytest.approx(off)
    assert ("bit for bit" in c.detail) == (off == 0.0)


def test_the_ring_check_finds_a_batch_that_arrives_changed(monkeypatch):
    from moment.io.device import DeviceStaging

    real = DeviceStaging.to_device
    calls = []

    def flip_third(self, nbytes=None):
        out = real(self, nbytes)
        calls.append(1)
        if len(calls) == 3:
            out = out.clone()
            out[7] ^= 1
        return out

    monkeypatch.setattr(DeviceStaging, "to_device", flip_third)
    c = gc.staging_ring("cpu")
    assert c.status == "failed" and c.data["mismatched"] == [2] and "batch 2 arrived changed" in c.detail


def test_a_check_that_breaks_is_reported_failed_the_others_still_run_and_the_command_exits_1(monkeypatch, capsys):
    def pipelined_epoch(device, work, ranks):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gc, "pipelined_epoch", pipelined_epoch)
    code, out, err = _doctor(capsys, "--gpu", "--device", "cpu")
    lines = out.splitlines()
    assert code == 1 and "Traceback" not in out + err
    assert any(ln.split()[:3] == ["failed", "pipelined", "epoch"] and "RuntimeError: CUDA error" in ln for ln in lines)
    assert any(ln.split()[:3] == ["ok", "staging", "ring"] for ln in lines) and lines[-1].startswith("some checks FAILED")
