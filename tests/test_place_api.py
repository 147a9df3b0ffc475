"""`moment.placement.place()`: the library call behind `moment place`, with a typed result."""

from __future__ import annotations

import json

import pytest

from moment.errors import MomentError
from moment.placement import PlaceResult, open_layout, place
from moment.placement.planning import load_plan
from moment.topology.devices import Inventory
from moment.topology.profiles import load_profile
from tests.test_place import CACHE, INV, TINY, run


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from moment.workload.hotness import presample
    from moment.workload.synth import synthesize

    tmp = tmp_path_factory.mktemp("place_api")
    ds = synthesize(tmp / "ds", 5_000, feature_dim=16, seed=5)
    prof = tmp / "tiny2.yaml"
    prof.write_text(TINY)
    rc, plan_json, err = run(["plan", "--profile", prof, *INV, "--json"])
    assert rc == 0, err
    (tmp / "plan.json").write_text(plan_json)
    presample(ds, [25, 10], 64, seed=0).save(tmp / "hot")
    topo = load_profile(str(prof))
    return {"tmp": tmp, "ds": ds, "prof": prof, "topo": topo,
            "inv": Inventory.simple(2, 3, "A100-PCIe-40GB", "P5510")}


def test_place_returns_the_cli_json(setup):
    """The library's result is the CLI's --json object, key for key (timings aside)."""
    t = setup["tmp"]
    stages: list[str] = []

    def stage(name, label):
        import contextlib

        stages.append(name)
        return contextlib.nullcontext(None)

    res = place(t / "ds", t / "A", setup["topo"], setup["inv"], plan=t / "plan.json", hotness=t / "hot",
                gpu_cache="2%", cpu_cache="5%", stage=stage)
    assert isinstance(res, PlaceResult) and stages == ["verify", "presample", "write"]  # the held-out sample
    assert res.policy == "ddak" and set(res.policies) == {"ddak", "hash", "degree"}
    assert open_layout(res.layout, expected_machine="tiny2").num_nodes == 5_000
    rc, out, err = run(["place", "--dataset", t / "ds", "--profile", setup["prof"], *INV, *CACHE,
                        "--plan", t / "plan.json", "--hotness", t / "hot", "--out", t / "B", "--json"])
    assert rc == 0, err
    cli = json.loads(out)
    lib = json.loads(json.dumps(res.model_dump()))
    assert list(cli) == list(lib)
    for k in cli:
        if k not in ("layout", "timings", "policies"):
            assert cli[k] == lib[k], k
    assert set(cli["timings"]) == set(lib["timings"])
    for name, pol in cli["policies"].items():
        assert {k: v for k, v in pol.items() if k != "seconds"} == \
            {k: v for k, v in lib["policies"][name].items() if k != "seconds"}


def test_place_takes_a_plan_object_and_checks_first(setup):
    t = setup["tmp"]
    plan = load_plan(str(t / "plan.json"), setup["topo"], setup["inv"])
    res = place(setup["ds"], t / "C", setup["topo"], setup["inv"], plan=plan, hotness=t / "hot", policy="hash")
    assert res.policy == "hash" and res.plan["placement"] == plan.placement
    with pytest.raises(MomentError, match="--policy"):
        place(setup["ds"], t / "D", setup["topo"], setup["inv"], policy="nope")
    with pytest.raises(MomentError, match="layout already exists"):
        place(setup["ds"], t / "C", setup["topo"], setup["inv"], plan=plan, hotness=t / "hot")
    # a dataset given as --out: not a layout to overwrite (the hint was --overwrite)
    with pytest.raises(MomentError, match=r"exists and is not a Moment layout .*\n  hint: choose another --out"):
        place(setup["ds"], setup["ds"].path, setup["topo"], setup["inv"], plan=plan, hotness=t / "hot")
    assert not (t / "D").exists()


def test_place_predicts_its_cache_shares_on_a_held_out_sample(setup):
    """`place`'s workload (and so its predicted epoch) takes the cache shares of a sample the cached rows were
    not chosen from."""
    import numpy as np

    from moment.placement import planning as pl
    from moment.workload.hotness import Hotness, heldout_reads

    t = setup["tmp"]
    r = place(setup["ds"], t / "held", setup["topo"], setup["inv"], hotness=t / "hot", gpu_cache="5%",
              cpu_cache="10%")
    hot = Hotness.load(t / "hot")
    held = heldout_reads(setup["ds"], [25, 10], 64, seed=0)
    order = np.argsort(-hot.feature_reads, kind="stable")
    gpus, sockets = pl.device_counts(setup["topo"], setup["inv"])
    g = gpus * pl.cache_rows(("share", 0.05), 0.0, setup["ds"])
    c = g + sockets * pl.cache_rows(("share", 0.10), 0.0, setup["ds"])
    assert r.workload["gpu_cache_share"] == pytest.approx(held[order[:g]].sum() / held.sum())
    assert r.workload["cpu_cache_share"] == pytest.approx(held[order[g:c]].sum() / held.sum())
    assert r.workload["gpu_cache_share"] < hot.feature_reads[order[:g]].sum() / hot.feature_reads.sum()


@pytest.mark.parametrize("edit, says", [
    (lambda p: {**{k: v for k, v in p.items() if k != "g0"}, "s0": p["g0"], "g0": p["s0"]} if "s0" in p else None,
     "does not fit slot 's0'"),
    (lambda p: {**{k: v for k, v in p.items() if k != "g0"}, "nonslot": p["g0"]}, "'nonslot' is not a slot of 'tiny2'"),
], ids=["gpu-in-an-ssd-bay", "no-such-slot"])
def test_a_hand_edited_plan_whose_placement_the_machine_cannot_hold_is_named(setup, tmp_path, edit, says):
    """A plan putting a GPU in an SSD bay, or naming a slot the machine lacks, was refused without naming the plan
    file (its other faults, another machine or inventory, name it): `place --plan` and `simulate --plan` both."""
    plan = json.loads((setup["tmp"] / "plan.json").read_text())
    placement = edit(plan["placement"])
    assert placement is not None, plan["placement"]
    bad = tmp_path / "edited-plan.json"
    bad.write_text(json.dumps({**plan, "placement": placement}))
    with pytest.raises(MomentError) as e:
        load_plan(str(bad), setup["topo"], setup["inv"])
    assert str(e.value).startswith(f"{bad}: ") and says in str(e.value)
    rc, out, err = run(["simulate", "--plan", bad, "--profile", setup["prof"], "--uniform"])
    assert rc == 2 and err.startswith(f"error: {bad}: ") and says in err, err
