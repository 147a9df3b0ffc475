"""`moment place` assumes the hardware placement `moment plan` recommends (or --plan's), says which, and
records it in the layout; when the caches hold everything, place and train say so and
suggest sizes that exercise the SSDs (item 11)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from moment.cli import main
from moment.placement.planning import RECOMMENDED

INV = ["--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8"]


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def unwrap(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from moment.workload.synth import synthesize

    tmp = tmp_path_factory.mktemp("hw")
    synthesize(tmp / "ds", 3000, feature_dim=16, seed=2)
    rc, out, err = run("plan", *INV, "--json")
    assert rc == 0, err
    (tmp / "plan.json").write_text(out)
    rc, out, err = run("place", "--dataset", tmp / "ds", *INV, "--batches", "4", "--out", tmp / "L", "--json")
    assert rc == 0, err
    return {"tmp": tmp, "plan": json.loads((tmp / "plan.json").read_text()), "placed": json.loads(out)}


def _packed(plan: dict) -> dict[str, str]:
    return next(b["placement"] for b in plan["baselines"] if b["name"] == "gpus-packed/ssds-spread")


@pytest.mark.slow
def test_place_uses_the_placement_moment_plan_recommends(env):
    plan, r = env["plan"], env["placed"]
    assert plan["placement"] != _packed(plan)  # the packed layout is rated slower
    assert r["hardware"]["placement"] == plan["placement"] == r["plan"]["placement"]
    assert r["hardware"]["devices"] == plan["devices"]
    assert r["hardware"]["source"] == RECOMMENDED
    gpu_slots = sorted(s for s, d in plan["devices"].items() if d.startswith("gpu"))
    assert not all(s.startswith("sw1-x16") for s in gpu_slots)


def test_layout_records_and_shows_the_hardware(env):
    layout, plan = env["tmp"] / "L", env["plan"]
    rc, out, err = run("layout", "info", layout, "--json")
    assert rc == 0, err
    hw = json.loads(out)["hardware"]
    assert hw["placement"] == plan["placement"] and hw["devices"] == plan["devices"] and hw["source"] == RECOMMENDED
    rc, out, _ = run("layout", "info", layout)
    text = unwrap(out)
    assert rc == 0 and "hardware placement (recommended by `moment plan`" in text
    for slot, dev in plan["devices"].items():
        assert f"{dev} in {slot}" in text


def test_place_follows_a_given_plan_and_prints_it(env):
    t, plan = env["tmp"], dict(env["plan"])
    packed = _packed(plan)
    plan["placement"] = packed
    (t / "packed.json").write_text(json.dumps(plan))
    rc, out, err = run("place", "--dataset", t / "ds", *INV, "--batches", "4", "--plan", t / "packed.json",
                       "--out", t / "Lp")
    assert rc == 0, err
    text = unwrap(out)
    assert f"hardware placement assumed (from {t / 'packed.json'})" in text
    gpus = [s for s in packed if packed[s].startswith("A100")]
    assert all(f" in {s}" in text for s in gpus)
    hw = json.loads(run("layout", "info", t / "Lp", "--json")[1])["hardware"]
    assert hw["placement"] == packed and hw["source"] == f"from {t / 'packed.json'}"


def test_caches_holding_everything_are_reported_with_sizes_that_exercise_the_ssds(env):
    t, r = env["tmp"], env["placed"]
    assert r["workload"]["gpu_cache_share"] + r["workload"]["cpu_cache_share"] == pytest.approx(1.0)
    (note,) = r["notes"]
    assert "training will read nothing from the SSDs" in note
    m = re.search(r"--gpu-cache (\S+%) --cpu-cache (\S+%)", note)
    assert m, note
    rc, out, err = run("place", "--dataset", t / "ds", *INV, "--batches", "4", "--plan", t / "plan.json",
                       "--gpu-cache", m.group(1), "--cpu-cache", m.group(2), "--out", t / "Ls", "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert s["notes"] == []
    ssd_share = 1 - s["workload"]["gpu_cache_share"] - s["workload"]["cpu_cache_share"]
    assert 0.3 < ssd_share < 0.7, ssd_share
    ssd_rows = sum(b["rows"] for b in s["policies"]["ddak"]["bins"] if b["kind"] == "ssd")
    assert ssd_rows > 0
    rc, out, _ = run("place", "--dataset", t / "ds", *INV, "--batches", "4", "--plan", t / "plan.json",
                     "--out", t / "Lt")
    assert rc == 0 and "note: the caches" in unwrap(out) and "--gpu-cache" in unwrap(out)


def test_train_says_when_nothing_is_read_from_the_ssds(env, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from runtime_data import make_dataset, make_layout

    from moment.runtime.config import TrainConfig
    from moment.runtime.train import train

    fast = {"fanouts": [5, 3], "hidden": 16, "threads": 1, "quiet": True, "epochs": 1}
    m = train(TrainConfig(layout=Path(env["placed"]["layout"]), **fast))
    assert m["ssd_bytes_read"] == 0
    assert m["notes"] and "nothing will be read from the SSDs" in m["notes"][0] and "--cpu-cache-limit" in m["notes"][0]
    # a layout with rows on the SSDs and caches smaller than the data: no note
    ds = make_dataset(tmp_path)
    m = train(TrainConfig(layout=make_layout(ds, tmp_path / "L"), **fast))
    assert m["ssd_bytes_read"] > 0 and m["notes"] == []


def test_layout_info_ties_each_gpu_and_ssd_bin_to_the_plans_device_and_slot(env):
    """The plan -> runtime interface: `layout info --json` bins carry plan_gpu/plan_ssd and the plan's slot."""
    plan = env["plan"]
    bins = json.loads(run("layout", "info", env["tmp"] / "L", "--json")[1])["bins"]
    slot_of = {dev: slot for slot, dev in plan["devices"].items()}
    gpu_bins = [b for b in bins if b["kind"] == "gpu"]
    ssd_bins = [b for b in bins if b["kind"] == "ssd"]
    assert [b["plan_gpu"] for b in gpu_bins] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert sorted(b["plan_ssd"] for b in ssd_bins) == [f"ssd{i}" for i in range(8)]
    for b in gpu_bins:
        assert b["name"] == f"hbm:{b['plan_gpu']}" and b["slot"] == slot_of[b["plan_gpu"]]
    for b in ssd_bins:
        assert b["slot"] == slot_of[b["plan_ssd"]]
    assert all("plan_gpu" not in b and "slot" not in b for b in bins if b["kind"] == "cpu")
