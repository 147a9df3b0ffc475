"""`moment probe`: the files it writes (probe vs fio on this disk: bench/probe_fio.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from moment.cli import main
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
