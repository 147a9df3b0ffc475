"""`moment probe`: the files it writes (probe vs fio on this disk: bench/probe_fio.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from moment.cli import main
from moment.io import IOStack
from moment.planner.calibration import load_measurements


@pytest.mark.slow
def test_probe_cli_writes_a_measurement_file_and_profile(tmp_path, capsys):
    out, prof = tmp_path / "m.yaml", tmp_path / "p.yaml"
    assert main(["probe", "--ssd-path", f"ssd0={tmp_path}", "--size-mib", "16", "--profile", "paper-machine-a",
                 "--out", str(out), "--profile-out", str(prof), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ssd"]["ssd0"]["seq_read_gbps"] > 0 and res["memory_copy_gbps"] > 0
    mf = load_measurements(out)
    assert mf.measurements[0].device == "ssd0"
    assert mf.measurements[0].read_gbps == pytest.approx(res["ssd"]["ssd0"]["seq_read_gbps"], rel=1e-3)
    data = yaml.safe_load(prof.read_text())
    mem = [n["memory_bandwidth_gbps"] for n in data["nodes"] if n["kind"] == "socket"]
    assert mem == pytest.approx([res["memory_copy_gbps"] / 2] * 2)
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
