"""`moment doctor --gpu` (moment.runtime.gpucheck): the checks a GPU machine runs first, run here on the CPU
through the same code (`--device cpu`); without CUDA the plain command says so in one line and exits 0."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert code == 2 and "--device tpu: not a device the checks run on; choose cuda or cpu" in err
    code, _, err = _doctor(capsys, "--gpu", "--device", "cpu", "--ranks", "0")
    assert code == 2 and "--ranks 0: must be at least 1" in err
    code, _, err = _doctor(capsys)
    assert code == 2 and "--gpu is required" in err
    code, out, _ = _doctor(capsys, "--help")  # and its help says so, before 'without CUDA ... exits 0'
    help_text = " ".join(out.replace("│", " ").split())
    assert code == 0 and "--gpu is required" in help_text and "Without CUDA, --gpu says so in one line" in help_text


@pytest.mark.slow
def test_on_cpu_the_pipelined_epoch_equals_the_in_memory_run_and_the_ring_delivers_every_byte(capsys):
    """The same comparisons a GPU runs, here on the CPU with two ranks: every batch bit for bit and the loss
    curves equal, every tier read, every collective from the training thread; no GPU to check ranks on."""
    code, out, err = _doctor(capsys, "--gpu", "--device", "cpu", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ok"] and doc["device"] == "cpu"
    checks = {c["name"]: c for c in doc["checks"]}
    assert list(checks) == ["pipelined epoch", "collectives", "rank devices", "staging ring"]  # no CUDA tests on CPU
    epoch = checks["pipelined epoch"]
    assert epoch["status"] == "ok" and epoch["data"]["bit_exact"] and epoch["data"]["steps"] == 8
    assert epoch["data"]["batch_differences"] == [] and "feature bytes equal" in epoch["detail"]
    assert {"gpu", "peer", "cpu", "ssd"} <= set(epoch["data"]["tier_rows"])  # the tiered store read every tier
    coll = checks["collectives"]
    assert coll["status"] == "ok" and coll["data"]["problems"] == [] and min(coll["data"]["calls"]) > 10
    assert checks["rank devices"]["status"] == "skipped"
    ring = checks["staging ring"]
    assert ring["status"] == "ok" and ring["data"]["mismatched"] == [] and ring["data"]["batches"] == len(gc.RING_BATCHES)
    assert doc["counts"] == {"ok": 3, "skipped": 1, "failed": 0}
    assert doc["summary"] == "3 passed, 1 skipped (rank devices: no GPU: the ranks run on the CPU)"


def _fake_runs(monkeypatch, curves: dict[str, list[float]], features: dict[str, str] | None = None):
    """make_layout and launch without training: each run's metrics and per-rank records as given."""
    def launch(ranks, args, metrics, env):
        from moment.runtime.run_record import RECORD_ENV

        where = Path(env[RECORD_ENV])
        where.mkdir(parents=True, exist_ok=True)
        for r in range(ranks):
            b = [{"epoch": 0, "batch": i, "ids": "i", "blocks": "b", "labels": "l",
                  "features": (features or {}).get(f"{metrics.name}:{r}:{i}", "f")} for i in range(3)]
            (where / f"run-rank{r}.json").write_text(json.dumps({"rank": r, "batches": b}))
        return {"loss_curve": curves[metrics.name], "tier_rows": {"ssd": 3}}

    monkeypatch.setattr(gc, "make_layout", lambda root, gpus, pci=None: root / "L")
    monkeypatch.setattr(gc, "launch", launch)


@pytest.mark.parametrize("device,off,status", [("cpu", 0.0, "ok"), ("cpu", 1e-9, "failed"), ("cuda", 5e-3, "ok"),
                                               ("cuda", 2e-2, "failed")])
def test_a_loss_curve_further_than_the_tolerance_from_the_in_memory_run_fails(monkeypatch, tmp_path, device, off,
                                                                              status):
    """On CPU the two runs compute the same bytes in the same order: any difference fails; on CUDA 1e-3 + 1%."""
    _fake_runs(monkeypatch, {"memory.json": [1.25, 0.75, 0.5], "tiered.json": [1.25, 0.75 + off, 0.5]})
    monkeypatch.setattr(gc, "plan_addresses", lambda device, ranks: None)
    c = gc.pipelined_epoch(device, tmp_path, 2)
    assert c.status == status and c.data["bit_exact"] == (off == 0.0) and c.data["max_abs_diff"] == pytest.approx(off)
    assert ("bit for bit" in c.detail) == (off == 0.0)
    if status == "failed":
        assert "the loss of step 2 differs from the in-memory run's" in c.detail


def test_one_batch_whose_feature_bytes_differ_fails_though_the_losses_agree(monkeypatch, tmp_path):
    _fake_runs(monkeypatch, {"memory.json": [1.0, 0.5, 0.25], "tiered.json": [1.0, 0.5, 0.25]},
               features={"tiered.json:1:2": "other"})
    c = gc.pipelined_epoch("cuda", tmp_path, 2)
    assert c.status == "failed" and c.data["batch_differences"] == ["rank 1 batch 2 of epoch 1: features"]
    assert "1 batch(es) differ from the in-memory run's: rank 1 batch 2 of epoch 1: features" in c.detail


def _runs_check(tmp_path: Path, ranks: int, recs: list[dict], per_rank: list[dict]) -> gc.Check:
    (tmp_path / "tiered").mkdir(exist_ok=True)
    for r, rec in enumerate(recs):
        (tmp_path / "tiered" / f"run-rank{r}.json").write_text(json.dumps({"rank": r, "batches": [], **rec}))
    return gc.Check("pipelined epoch", "ok", "", data={"work": str(tmp_path), "ranks": ranks, "per_rank": per_rank})


def test_rank_devices_names_a_rank_off_its_gpu_a_context_on_another_and_a_shared_device(tmp_path):
    a, b = "0000:17:00.0", "0000:65:00.0"
    pci = [{"rank": r, "matched_by": "pci bus id"} for r in (0, 1)]
    ok = _runs_check(tmp_path, 2, [{"device": "cuda:1", "pci": a, "gpu_contexts": ["00000000:17:00.0"]},
                                   {"device": "cuda:0", "pci": b, "gpu_contexts": ["00000000:65:00.0"]}], pci)
    c = gc.rank_devices(ok, "cuda")
    assert c.status == "ok" and "matched by PCI address; each holds a CUDA context on its own GPU only" in c.detail
    stray = _runs_check(tmp_path, 2, [{"device": "cuda:1", "pci": a, "gpu_contexts": ["00000000:17:00.0"]},
                                      {"device": "cuda:0", "pci": b, "gpu_contexts": ["00000000:65:00.0",
                                                                                      "00000000:17:00.0"]}], pci)
    c = gc.rank_devices(stray, "cuda")
    assert c.status == "failed" and c.detail == (f"rank 1 (on cuda:0 at {b}) holds CUDA contexts on {a}, {b}")
    shared = _runs_check(tmp_path, 2, [{"device": "cuda:0", "pci": a, "gpu_contexts": None},
                                       {"device": "cuda:0", "pci": a, "gpu_contexts": None}],
                         [{"rank": 0, "matched_by": "pci bus id"}, {"rank": 1, "matched_by": "local-rank order"}])
    c = gc.rank_devices(shared, "cuda")
    assert c.status == "failed" and c.data["problems"] == [
        "two ranks on one device: ['cuda:0', 'cuda:0']",
        "rank 1 took cuda:0 by local-rank order, not by its plan GPU's PCI address"]
    assert gc.rank_devices(ok, "cpu").status == "skipped"
    assert gc.rank_devices(gc.Check("pipelined epoch", "failed", "x"), "cuda").detail == \
        "needs the pipelined epoch's runs, which failed"


def test_collectives_fails_on_a_second_thread(tmp_path):
    runs = _runs_check(tmp_path, 2, [{}, {}], [])
    (tmp_path / "trace").mkdir()
    one = [{"op": "all_reduce", "group": None, "thread": "MainThread"}]
    two = one + [{"op": "all_to_all_single", "group": None, "thread": "moment-gather_loop"}]
    for r, calls in enumerate((two, two)):
        (tmp_path / "trace" / f"collectives-rank{r}.json").write_text(json.dumps({"calls": calls}))
    c = gc.collectives(runs)
    assert c.status == "failed" and c.detail.startswith("rank 0 issued collectives from 2 threads")


def test_a_check_that_hangs_fails_at_its_deadline_and_a_hung_subprocess_is_killed(monkeypatch, tmp_path):
    import time

    monkeypatch.setitem(gc.DEADLINE, "staging ring", 1)
    t0 = time.perf_counter()
    c = gc._timed("staging ring", lambda: time.sleep(30))
    assert c.status == "failed" and c.detail == "did not finish within 1 s: it hangs" and time.perf_counter() - t0 < 5
    marker = tmp_path / "child-alive"
    t0 = time.perf_counter()
    with pytest.raises(gc.MomentError, match="did not finish within 1 s: it hangs"):
        gc.run_bounded(["bash", "-c", f"(sleep 2; touch {marker}) & sleep 60"], 1)
    assert time.perf_counter() - t0 < 5
    time.sleep(max(0.0, t0 + 2.5 - time.perf_counter()))  # past the child's touch, had it lived
    assert not marker.exists()  # the whole group went, its child too


@pytest.mark.slow
def test_a_hung_test_is_named_when_the_cuda_tests_are_killed(tmp_path):
    """The H200's hang sat silent until a deadline: pytest, run as tools/cuda_tests.py runs it, dumps a slow test's
    stacks, and the doctor's error names the test and the line it hung at."""
    import sys

    test = tmp_path / "tests" / "test_hang.py"
    test.parent.mkdir()
    test.write_text("import threading\n\n\ndef test_waits_for_a_thread_that_died():\n    threading.Event().wait()\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=1", str(test)]
    with pytest.raises(gc.MomentError, match=r"it hangs \(tests/test_hang.py, line 5, in test_waits_for_a_thread_that_died\)"):
        gc.run_bounded(cmd, 6, cwd=tmp_path)
    assert gc.hung_test("no dump here") is None


def test_the_summary_counts_skips_and_never_calls_them_a_pass():
    rep = gc.Report("cuda", "2.13", {"version": "12", "devices": ["H100"]},
                    [gc.Check("cuda tests", "ok", "12 passed"), gc.Check("rank devices", "skipped", "why not")])
    assert rep.ok and rep.summary() == "1 passed, 1 skipped (rank devices: why not)"
    assert "all" not in " ".join(gc.render(rep)).lower()
    rep.checks.append(gc.Check("staging ring", "failed", "batch 2 arrived changed"))
    assert not rep.ok and rep.summary() == "1 passed, 1 skipped (rank devices: why not), 1 FAILED: see above"
    c = gc.tests_check(0, "SKIPPED [1] tests/test_peers.py:9: needs 2 GPUs\n=== 30 passed, 1 skipped in 9.1s ===",
                       ["tests/test_peers.py"])
    assert c.status == "ok" and c.detail.startswith("30 passed, 1 skipped in 9.1s") and len(c.data["skipped"]) == 1
    # quiet, as the first GPU run printed it: the count line has no rule, and a skip's reason is not the summary
    c = gc.tests_check(0, "SKIPPED [1] tests/test_probe.py:72: this machine has CUDA\n79 passed, 6 skipped in 35.12s",
                       ["tests/test_probe.py"])
    assert c.detail.startswith("79 passed, 6 skipped in 35.12s (")


def test_the_cuda_tests_are_the_clone_s_list_and_a_wheel_says_it_has_none(monkeypatch, tmp_path):
    from tools.cuda_tests import files

    ran = []
    monkeypatch.setattr(gc, "run_bounded", lambda cmd, limit, cwd: ran.append(cmd) or
                        __import__("subprocess").CompletedProcess(cmd, 0, "=== 9 passed in 1.0s ===", ""))
    c = gc.cuda_tests()
    assert c.status == "ok" and ran[0][-len(files()):] == files() and "tests/test_device.py" in files()
    assert "tests/test_gpucheck.py" not in files()  # the checks' own test runs them: not among the tests they run
    monkeypatch.setattr(gc, "CUDA_TESTS", tmp_path / "tools" / "cuda_tests.py")  # an installed wheel: no tools/
    c = gc.cuda_tests()
    assert c.status == "skipped" and "run from a clone of the repository" in c.detail


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


def test_the_sync_debug_modes_notice_about_itself_is_not_a_blocking_call():
    """Seen on the first GPU run (torch 2.11, H200): setting the mode warns once about the mode; that notice
    failed the staging ring. A call that blocks the host still counts."""
    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing "
              "operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")
    blocked = "called a synchronizing CUDA operation (Triggered internally at c10/cuda/CUDAFunctions.cpp:155.)"
    assert gc.host_syncs([notice, "an unrelated warning", blocked]) == [blocked]


def test_a_check_that_breaks_is_reported_failed_the_others_still_run_and_the_command_exits_1(monkeypatch, capsys):
    def pipelined_epoch(device, work, ranks):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gc, "pipelined_epoch", pipelined_epoch)
    code, out, err = _doctor(capsys, "--gpu", "--device", "cpu")
    lines = out.splitlines()
    assert code == 1 and "Traceback" not in out + err
    assert any(ln.split()[:3] == ["failed", "pipelined", "epoch"] and "RuntimeError: CUDA error" in ln for ln in lines)
    assert any(ln.split()[:3] == ["ok", "staging", "ring"] for ln in lines)
    assert lines[-1] == ("1 passed, 2 skipped (collectives: needs the pipelined epoch's runs, which failed; rank devices: "
                         "needs the pipelined epoch's runs, which failed), 1 FAILED: see above")
