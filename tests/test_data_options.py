"""Options of the data commands that make no sense are one line naming the flag, before any work: a cache
larger than the memory it lives in, zero or negative counts and seeds, hotness sampled for other batches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_data import make_dataset, make_layout

from moment.cli import main
from moment.errors import MomentError
from moment.placement import planning
from moment.placement.planning import check_caches
from moment.topology.devices import Inventory
from moment.topology.profiles import load_profile
from moment.workload.hotness import presample


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    ds = make_dataset(root, nodes=1500)
    hot = root / "h128"
    presample(ds, (10, 5), 128).save(hot)
    return root, ds, make_layout(ds, root / "L"), hot


def _one_line_error(args: list[str], capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) <= 2 and "Usage" not in err and "Traceback" not in err, err  # a line and a hint
    return err


def _place(root: Path, ds, *extra: str) -> list[str]:
    return ["place", "--dataset", str(ds.path), "--gpus", "2", "--ssds", "2", "--out", str(root / "Lx"), *extra]


@pytest.mark.parametrize("extra, says", [
    (["--gpu-cache", "50GiB"], "--gpu-cache '50GiB' is larger than the 40 GiB of memory of the GPU A100-PCIe-40GB"),
    (["--gpu-cache", "40.5"], "--gpu-cache '40.5' is larger than the 40 GiB"),
    (["--cpu-cache", "5000GiB"], "--cpu-cache '5000GiB' is larger than the 256 GiB of memory of socket cpu0"),
])
def test_place_refuses_a_cache_larger_than_its_memory(env, capsys, extra, says):
    root, ds, _, _ = env
    assert says in _one_line_error(_place(root, ds, *extra), capsys)
    assert not (root / "Lx").exists()


def test_a_share_of_the_dataset_larger_than_the_memory_is_refused(env, monkeypatch):
    """A percentage is the dataset's bytes: 100% of these features does not fit in 100 KiB."""
    _, ds, _, _ = env
    tiny = (100 / 2**20, "the GPU X")
    monkeypatch.setattr(planning, "smallest_memories", lambda topo, inv: (tiny, None))
    topo, inv = load_profile("paper-machine-b"), Inventory.simple(1, 1)
    with pytest.raises(MomentError, match=r"--gpu-cache '100%' \(0.00 GiB of this dataset's features\) is larger"):
        check_caches(ds, topo, inv, "100%", None)
    assert check_caches(ds, topo, inv, "1%", None) == (("share", 0.01), None)  # 1% fits: no error


def _cases(root: Path, ds, layout: Path) -> list[tuple[list[str], str]]:
    sim = ["cache", "simulate", "--dataset", str(ds.path), "--capacity", "10%"]
    pack = ["data", "pack", "--layout", str(layout), "--overwrite"]
    synth = ["data", "synth", "--nodes", "100", "--out", str(root / "sx")]
    return [
        ([*sim, "--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
        ([*sim, "--batch-size", "-3"], "--batch-size -3: must be an integer >= 1"),
        ([*sim, "--epochs", "0"], "--epochs 0: must be an integer >= 1"),
        ([*sim, "--ranks", "0"], "--ranks 0: must be an integer >= 1"),
        ([*sim, "--rank", "-1"], "--rank -1: must be an integer >= 0"),
        ([*sim, "--superbatch", "0"], "--superbatch 0: must be an integer >= 1"),
        ([*sim, "--seed", "-1"], f"--seed -1: must be an integer from 0 to {2**63 - 1}"),
        # a bare number is bytes here (GiB for place's caches): the message says how it was read
        ([*sim, "--capacity", "8"], "--capacity '8': read as 8 B, 0 rows of"),
        ([*sim, "--capacity", "1TiB"], "read as 1.0 TiB, 8,589,934,592 rows of 128 B: must be more than 0 rows and at "
                                       "most the dataset's 1,500 rows (187.5 KiB)"),
        ([*pack, "--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
        ([*pack, "--ranks", "0"], "--ranks 0: must be an integer >= 1"),
        ([*pack, "--epochs", "-1"], "--epochs -1: must be an integer >= 1"),
        ([*pack, "--seed", "-1"], "must be an integer from 0 to"),
        (_place(root, ds, "--batches", "0"), "--batches 0: must be an integer >= 1"),
        (_place(root, ds, "--batch-size", "0"), "--batch-size 0: must be an integer >= 1"),
        (_place(root, ds, "--epochs", "-2"), "--epochs -2: must be an integer >= 1"),
        (_place(root, ds, "--seed", "-1"), "must be an integer from 0 to"),
        ([*synth, "--seed", "-1"], "must be an integer from 0 to"),
        ([*synth, "--power-law", "inf"], "--power-law must be a finite exponent > 2 (got inf)"),
        ([*synth, "--homophily", "1.5"], "--homophily must be in [0, 1]"),
        (["data", "presample", str(ds.path), "--out", str(root / "hx"), "--seed", str(2**64)],
         "must be an integer from 0 to"),
    ]


def test_zero_negative_and_out_of_range_options_are_one_line_naming_the_flag(env, capsys):
    root, ds, layout, _ = env
    for args, says in _cases(root, ds, layout):
        assert says in _one_line_error(args, capsys), args
    assert not any((root / x).exists() for x in ("Lx", "sx", "hx"))


def test_hotness_sampled_for_other_batches_is_refused_or_followed(env, capsys):
    """Counts pre-sampled at batch size 128 and fan-outs 10,5: other values given are refused naming both;
    left out, the hotness's are used (and `place` says so)."""
    root, ds, _, hot = env
    sim = ["cache", "simulate", "--dataset", str(ds.path), "--capacity", "10%", "--hotness", str(hot)]
    for extra, says in ((["--batch-size", "64"], "--batch-size 64 (pre-sampled at 128)"),
                        (["--fanouts", "25,10"], "--fanouts 25,10 (pre-sampled at 10,5)")):
        err = _one_line_error([*sim, *extra], capsys)
        assert f"{hot}: this hotness was pre-sampled with other parameters: {says}" in err
        err = _one_line_error(_place(root, ds, "--hotness", str(hot), *extra), capsys)
        assert says in err and not (root / "Lx").exists()
    assert main([*sim, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["batch_size"] == 128 and doc["fanouts"] == [10, 5]
    assert main([*_place(root, ds, "--hotness", str(hot), "--json")]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["workload"]["batch_size"] == 128
    assert "using the hotness's fan-outs 10,5 and batch size 128, which it was pre-sampled at" in " ".join(err.split())
