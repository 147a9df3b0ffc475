"""`moment probe`: the files it writes (probe vs fio on this disk: bench/probe_fio.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from moment.cli import main
from moment.io import IOStack
from moment.planner.calibration import load_measurements

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_probe_cli_writes_a_measurement_file_and_profile(tmp_path, capsys):
    out, prof = tmp_path / "m.yaml", tmp_path / "p.yaml"
    assert main(["probe", "--ssd-path", f"ssd0={tmp_path}", "--size-mib", "16", "--profile", "asus-esc8000a-e12",
                 "--out", str(out), "--profile-out", str(prof), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ssd"]["ssd0"]["seq_read_gbps"] > 0 and res["memory_copy_gbps"] > 0
    mf = load_measurements(out)
    assert mf.measurements[0].device == "ssd0"
    assert mf.measurements[0].read_gbps == pytest.approx(res["ssd"]["ssd0"]["seq_read_gbps"], rel=1e-3)
    data = yaml.safe_load(prof.read_text())
    mem = [n["memory_bandwidth_gbps"] for n in data["nodes"] if n["kind"] == "socket"]
    assert mem == pytest.approx([res["memory_copy_gbps"] / 2] * 2)
    ssd0 = next(n for n in data["nodes"] if n["id"] == "ssd0")
    assert ssd0["read_gbps"] == pytest.approx(res["ssd"]["ssd0"]["seq_read_gbps"])
    assert main(["probe", "--ssd-path", "bad"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml", "p.yaml"]  # no scratch file left


def test_probe_reads_land_in_place(tmp_path, monkeypatch):
    """Every read the probe asks for is block-aligned in the file and in memory, so O_DIRECT fills its
    buffers in place as fio does (a bounce copy per read cost the probe a fifth of its 4 KiB IOPS)."""
    from moment.io.probe import probe_ssd

    seen = []
    submit = IOStack.submit

    def watch(self, batch, dest, **kw):
        addr = np.asarray(dest).ctypes.data + batch.dest_offset
        seen.append(bool(((addr | batch.offset | batch.length) % 4096 == 0).all()))
        return submit(self, batch, dest, **kw)

    monkeypatch.setattr(IOStack, "submit", watch)
    r = probe_ssd(tmp_path, file_bytes=16 << 20, rand_reads=1000, repeats=1)
    assert r.direct and len(seen) > 4 and all(seen)


def test_cuda_copy_rates_where_cuda_exists():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (host->GPU and GPU->GPU copy rates)")
    from moment.io.probe import probe_cuda

    got = probe_cuda(nbytes=16 << 20)
    n = torch.cuda.device_count()
    assert sorted(got["h2d_gbps"]) == sorted(f"gpu{i}" for i in range(n))
    assert len(got["d2d_gbps"]) == n * (n - 1)
    assert all(v > 0.1 for v in [*got["h2d_gbps"].values(), *got["d2d_gbps"].values()]), got


def test_no_cuda_means_no_cuda_block():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from moment.io.probe import probe_cuda

    assert probe_cuda() is None


class FakeGpus:
    """`n` GPUs whose copies are asynchronous: a copy queues `seconds` of work on every GPU it involves, and
    only waiting on a GPU moves the host's clock past its queued work."""

    def __init__(self, n: int, seconds: float) -> None:
        self.now, self.seconds, self.busy_until = 0.0, seconds, [0.0] * n

    def copy(self, src: int | None, dst: int) -> None:
        for d in {dst} if src is None else {src, dst}:
            self.busy_until[d] = max(self.busy_until[d], self.now) + self.seconds

    def sync(self, devices: tuple[int, ...]) -> None:
        self.now = max([self.now, *(self.busy_until[d] for d in devices)])

    def clock(self) -> float:
        return self.now


def test_every_gpus_copies_are_timed_until_that_gpu_is_done():
    """Waiting on GPU 0 alone stopped the clock while copies to GPUs 1 and 2 were still running: they
    reported absurd rates. Each copy now waits on every GPU it involves: 1 GB in 0.1 s is 10 GB/s, on every
    GPU and between every pair."""
    from moment.io.probe import copy_rates

    gpus = FakeGpus(3, 0.1)
    got = copy_rates(3, 10**9, gpus.copy, gpus.sync, repeats=3, clock=gpus.clock)
    assert sorted(got["h2d_gbps"]) == ["gpu0", "gpu1", "gpu2"] and len(got["d2d_gbps"]) == 6
    assert all(v == pytest.approx(10.0) for v in [*got["h2d_gbps"].values(), *got["d2d_gbps"].values()]), got


def test_copy_rates_are_the_best_of_the_timings():
    from moment.io.probe import copy_gbps, timed_copies

    assert copy_gbps(3 * 10**9, [0.5, 0.3, 0.4]) == pytest.approx(10.0)
    ticks = iter([0.0, 0.5, 1.0, 1.2, 2.0, 2.4])
    seen = []
    got = timed_copies(lambda: seen.append("copy"), lambda: seen.append("wait"), 3, clock=lambda: next(ticks))
    assert got == pytest.approx([0.5, 0.2, 0.4]) and seen == ["copy", "wait"] * 4  # a warm-up, then 3 timed
    with pytest.raises(ValueError, match="the clock stopped before the copy ended"):
        copy_gbps(10**9, [0.0])


def test_without_a_gpu_driver_no_process_starts_torch_to_hear_there_is_no_cuda(tmp_path):
    """No driver node (NVIDIA's, WSL2's, ROCm's): the probe, the launcher's device choice and the rank ->
    device map say "no CUDA" and torch stays unloaded (seconds of start-up per process)."""
    code = ("import sys; from moment.io import device; device.GPU_DRIVER_PATHS = (sys.argv[1],); "
            "from moment.io.probe import probe_cuda; from moment.runtime.devices import cuda_pci_addresses, "
            "default_device; assert device.no_gpu_driver(); "
            "assert probe_cuda() is None and cuda_pci_addresses() is None and default_device(None) == 'cpu'; "
            "assert default_device('cuda') == 'cuda'; assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nvidiactl")], cwd=REPO, capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_with_a_gpu_driver_torch_decides_as_before(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from moment.io import device
    from moment.io.probe import probe_cuda
    from moment.runtime.devices import cuda_available, cuda_pci_addresses, default_device

    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(device, "GPU_DRIVER_PATHS", (str(tmp_path / "absent"), str(tmp_path / "nvidiactl")))
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or False)
    assert not device.no_gpu_driver()
    assert probe_cuda() is None and cuda_pci_addresses() is None and not cuda_available()
    assert default_device(None) == "cpu" and len(asked) == 4  # each asked torch


def test_profile_out_refuses_a_measured_ssd_the_profile_does_not_have(tmp_path, capsys, monkeypatch):
    """--profile-out writes each rate into the profile's SSD of that id: an id it lacks (or any, where the
    profile has only empty slots) is refused before measuring, listing its SSDs (the rate was dropped without a
    word and the profile written as 'measured': hunt-H 7); an installed SSD gets its rate."""
    import moment.io.probe as probe_mod

    def fake(targets, **kw):
        return {"ssd": {k: {"seq_read_gbps": 2.5} for k in targets}, "memory_copy_gbps": 20.0, "cuda": None}

    monkeypatch.setattr(probe_mod, "probe_machine", fake)
    out = tmp_path / "p.yaml"
    for profile, ssd, said in (
            ("asus-esc8000a-e12", "ssd99", "its SSDs: ssd0, ssd1, "),
            ("paper-machine-b", "ssd0", "it has no installed SSD, only empty slots")):
        assert main(["probe", "--ssd-path", f"{ssd}={tmp_path}", "--size-mib", "16", "--profile", profile,
                     "--profile-out", str(out)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"error: --profile-out: {ssd} is not an SSD of profile '{profile}', so its measured rate would " \
               "be written nowhere" in err and said in err and "Traceback" not in err
        assert not out.exists()
    assert main(["probe", "--ssd-path", f"ssd3={tmp_path}", "--size-mib", "16", "--profile", "asus-esc8000a-e12",
                 "--profile-out", str(out), "--json"]) == 0
    ssds = {n["id"]: n["read_gbps"] for n in yaml.safe_load(out.read_text())["nodes"] if n["kind"] == "ssd"}
    assert ssds["ssd3"] == 2.5 and ssds["ssd0"] == 3.5


def test_two_ssd_ids_on_one_file_system_are_refused_before_measuring(tmp_path, capsys, monkeypatch):
    """Two ids on one file system (one directory twice, or two directories on one disk) measured one disk as two
    SSDs, and `calibrate` took the two rates as two distinct measurements (hunt-H 7, its note)."""
    import moment.io.probe as probe_mod

    measured = []
    monkeypatch.setattr(probe_mod, "probe_machine", lambda targets, **kw: measured.append(targets))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for second in ("a", "b"):
        assert main(["probe", "--ssd-path", f"ssd0={tmp_path / 'a'}", "--ssd-path", f"ssd1={tmp_path / second}",
                     "--size-mib", "16"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert err.startswith("error: --ssd-path: ssd0 and ssd1 are on one file system") and "Traceback" not in err
    assert measured == []


def test_a_directory_without_room_is_named_as_it_was_given(tmp_path, capsys, monkeypatch):
    """The probe's room check named the CLI's flags in a service job's error too ('--ssd-path ssd0 probe/p0: ...
    hint: use a smaller --size-mib'): it names the inputs as its caller does."""
    import os

    import moment.io.probe as probe_mod

    full = os.statvfs(tmp_path)
    monkeypatch.setattr(probe_mod.os, "statvfs", lambda p: type("Full", (), {"f_bavail": 2, "f_frsize": 1 << 20})()
                        if str(p).startswith(str(tmp_path)) else full)
    assert main(["probe", "--ssd-path", f"ssd0={tmp_path}", "--size-mib", "16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --ssd-path ssd0 {tmp_path}: needs 16 MiB free for the scratch file, 2 MiB free")
    assert "hint: use a smaller --size-mib" in err
    with pytest.raises(probe_mod.MomentError) as e:
        probe_mod.probe_machine({"ssd0": tmp_path}, file_bytes=16 << 20, label=lambda ssd: f"ssd_dirs.{ssd}",
                                flag=lambda name: name)
    assert str(e.value).startswith(f"ssd_dirs.ssd0 {tmp_path}: needs 16 MiB") and e.value.hint == "use a smaller size_mib"
