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


def test_a_random_split_says_its_sizes_and_takes_the_shares_given(tmp_path: Path, capsys) -> None:
    """Without a split an import draws ogbn-papers100M's 1% / 0.5% / 0.5% (at least 512 train): the note gives the
    sizes, so that a fully labelled graph's user is not left comparing accuracies on 1% of it unknowingly, and
    --random-split takes other shares; given with a split of the input's own, it is refused (it would be ignored)."""
    from moment import import_graph

    n = 4000
    rng = np.random.default_rng(0)
    np.save(tmp_path / "e.npy", rng.integers(0, n, (2, 20000)))
    np.save(tmp_path / "y.npy", rng.integers(0, 4, n))
    common = ["data", "import", "npy", "--edge-index", tmp_path / "e.npy", "--y", tmp_path / "y.npy", "--feature-dim", "2"]
    code, out, err = run(capsys, *common, "--out", tmp_path / "a", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert (s["train"], s["val"], s["test"]) == (512, 128, 128)
    assert ("a seeded random one was drawn from the 4,000 labelled nodes, train 512 / val 128 / test 128 (shares "
            "0.01,0.005,0.005, at least 512 train; --random-split 0.6,0.2,0.2 draws others)") in " ".join(s["notices"])
    code, out, err = run(capsys, *common, "--out", tmp_path / "b", "--random-split", "0.6,0.2,0.2", "--json")
    assert code == 0, err
    assert [json.loads(out)[k] for k in ("train", "val", "test")] == [2400, 800, 800]
    for shares in ("0.6,0.5,0.2", "0.6,0.2", "0,0.5,0.5", "a,b,c"):
        code, _, err = run(capsys, *common, "--out", tmp_path / "c", "--random-split", shares)
        assert code == 2 and f"--random-split {shares}: give three shares" in err and not (tmp_path / "c").exists()
    for name, ids in (("tr", [0, 1]), ("va", [2]), ("te", [3])):
        np.save(tmp_path / f"{name}.npy", np.array(ids))
    code, _, err = run(capsys, *common, "--out", tmp_path / "c", "--random-split", "0.6,0.2,0.2", "--train-idx",
                       tmp_path / "tr.npy", "--val-idx", tmp_path / "va.npy", "--test-idx", tmp_path / "te.npy")
    assert code == 2 and "--random-split: the input has its own split, which is kept as given" in err
    g = {"edge_index": np.load(tmp_path / "e.npy"), "y": np.load(tmp_path / "y.npy")}
    assert len(import_graph(g, tmp_path / "m", feature_dim=2, random_split=(0.5, 0.25, 0.25)).train_idx) == 2000


def test_labels_that_use_few_of_their_class_numbers_are_said_to(tmp_path: Path, capsys) -> None:
    """Codes such as 0, 1000, ..., 4000 made a 4,001-wide output layer of which five are ever a target, silently."""
    np.save(tmp_path / "e.npy", np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]))
    for name, y in (("codes", [0, 1000, 2000, 3000, 4000]), ("dense", [0, 1, 2, 3, 4])):
        np.save(tmp_path / f"{name}.npy", np.array(y))
        code, out, err = run(capsys, "data", "import", "npy", "--edge-index", tmp_path / "e.npy", "--y",
                             tmp_path / f"{name}.npy", "--feature-dim", "2", "--out", tmp_path / name, "--json")
        assert code == 0, err
        said = [n for n in json.loads(out)["notices"] if "distinct labels" in n]
        assert said == (["5 distinct labels spread over class numbers 0..4,000: the model gets 4,001 outputs, one "
                         "for every number between; if the labels are codes, number them 0..N-1 first (or give "
                         "them as names)"] if name == "codes" else []), said


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


def test_import_npy_and_pyg_report_counts_and_notices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1, 1, 2], [1, 2, 2, 2]]))  # one duplicate, one self-loop
    np.save(tmp_path / "x.npy", np.ones((3, 2), np.float32))
    code, out, err = run(capsys, "data", "import", "npy", "--out", tmp_path / "g", "--edge-index", tmp_path / "e.npy",
                         "--x", tmp_path / "x.npy", "--self-loops", "drop", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert (s["num_edges"], s["source"]["duplicate_edges_dropped"], s["source"]["self_loops_dropped"]) == (2, 1, 1)
    assert any("labels were generated" in n for n in s["notices"])
    code, out, err = run(capsys, "data", "import", "npy", "--out", tmp_path / "t", "--edge-index", tmp_path / "e.npy")
    assert code == 0, err
    assert "source.duplicate_edges_found" in out and "note:" in out and "1 duplicate edges dropped" in out
    torch = pytest.importorskip("torch")
    data = pytest.importorskip("torch_geometric.data")
    g = data.Data(edge_index=torch.tensor([[0, 1], [1, 2]]), x=torch.ones(3, 2), y=torch.tensor([0, 1, 1]),
                  train_mask=torch.tensor([True, False, False]), val_mask=torch.tensor([False, True, False]),
                  test_mask=torch.tensor([False, False, True]))
    torch.save(g, tmp_path / "data.pt")
    code, out, err = run(capsys, "data", "import", "pyg", tmp_path / "data.pt", "--out", tmp_path / "p", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["source"]["split"] == "given" and s["train"] == 1 and s["notices"] == []


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["data", "import", "npy", "--out", "{tmp}/o", "--edge-index", "{tmp}/none.npy"], "missing edge index file"),
        (["data", "import", "npy", "--out", "{tmp}/o", "--edge-index", "{tmp}/e.npy", "--duplicates", "maybe"],
         "--duplicates 'maybe': must be one of keep, drop"),
        (["data", "import", "pyg", "{tmp}/bad.pt", "--out", "{tmp}/o"], "bad.pt: not a readable torch file"),
        (["data", "import", "ogb", "{tmp}", "--out", "{tmp}/o", "--layout", "processed"], "no processed dataset"),
        (["data", "import", "edgelist", "{tmp}/e.txt", "--out", "{tmp}/o", "--splits", "{tmp}"], "no train split file"),
    ],
)
def test_import_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], msg: str) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2]]))
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04 not really")
    (tmp_path / "e.txt").write_text("0 1\n")
    code, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and "error:" in err and msg in " ".join(err.split())
    assert "Traceback" not in err + out and not (tmp_path / "o").exists()
