"""`moment data …` through `moment.cli.main`: exit codes, JSON output, errors without tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moment.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_synth_info_presample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = tmp_path / "g"
    code, out, _ = run(capsys, "data", "synth", "--nodes", "3000", "--feature-dim", "8", "--out", g, "--json")
    assert code == 0
    s = json.loads(out)
    assert s["num_nodes"] == 3000 and s["feature_dim"] == 8 and s["elapsed_s"] > 0
    code, out, _ = run(capsys, "data", "info", g, "--verify", "--json")
    assert code == 0 and json.loads(out)["verified"] is True
    code, out, _ = run(capsys, "data", "info", g)
    assert code == 0 and "3,000" in out
    code, out, _ = run(capsys, "data", "presample", g, "--fanouts", "5,3", "--batch-size", "64", "--out",
                       tmp_path / "hot", "--json")
    assert code == 0
    h = json.loads(out)
    assert h["fanouts"] == [5, 3] and 0 < h["skew"]["top_0.01"] <= 1
    assert (tmp_path / "hot" / "hotness.json").is_file()
    code, out, _ = run(capsys, "data", "presample", g, "--num-batches", "2", "--out", tmp_path / "hot")
    assert code == 0 and "share of feature reads" in out and "unique ratio" in out
    code, out, _ = run(capsys, "data", "synth", "-n", "2000", "-d", "4", "--out", tmp_path / "t")
    assert code == 0 and "synthetic dataset written" in out


def test_import_edgelist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    e = tmp_path / "e.txt"
    e.write_text("0 1\n1 2\n2 0\n")
    np.save(tmp_path / "x.npy", np.ones((3, 2), np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1, 1]))
    code, out, err = run(capsys, "data", "import", "edgelist", e, "--features", tmp_path / "x.npy", "--labels",
                         tmp_path / "y.npy", "--out", tmp_path / "g", "--json")
    assert code == 0, err
    assert json.loads(out)["num_edges"] == 3


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["data", "info", "{tmp}/missing"], "dataset directory not found"),
        (["data", "synth", "--nodes", "1", "--out", "{tmp}/x"], "at least 2"),
        (["data", "presample", "{tmp}/missing", "--out", "{tmp}/h"], "not found"),
        (["data", "import", "ogb", "{tmp}", "--out", "{tmp}/o"], "missing edge list"),
        (["data", "import", "igb", "{tmp}", "--out", "{tmp}/o"], "node_feat.npy"),
        (["data", "import", "edgelist", "{tmp}/none.txt", "--out", "{tmp}/o"], "none.txt"),
    ],
)
def test_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], msg: str) -> None:
    code, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and "error:" in err and msg in err.replace("\n", "")
    assert "Traceback" not in err + out


def test_bad_fanouts_and_corrupt_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = tmp_path / "g"
    assert run(capsys, "data", "synth", "-n", "2000", "-d", "4", "--out", g, "--json")[0] == 0
    code, _, err = run(capsys, "data", "presample", g, "--fanouts", "25,x", "--out", tmp_path / "h")
    assert code == 2 and "--fanouts" in err
    code, _, err = run(capsys, "data", "synth", "-n", "2000", "--out", g)
    assert code == 2 and "already exists" in err
    f = g / "features.npy"
    b = bytearray(f.read_bytes())
    b[-1] ^= 1
    f.write_bytes(bytes(b))
    assert run(capsys, "data", "info", g)[0] == 0
    code, _, err = run(capsys, "data", "info", g, "--verify")
    assert code == 2 and "sha256 mismatch" in err and "features.npy" in err.replace("\n", "")
