"""Predictions under the data placement that will be used: `--data planned|even` (the LP's SSD shares,
as DDAK writes them, or equal shares, as hash placement gives) through the LP, the plan, the CLI, the
service and the measurement files."""

from __future__ import annotations

import json

import pytest
import yaml

from moment.cli import main
from moment.errors import MomentError
from moment.planner import search
from moment.planner.calibration import Model, apply_calibration, load_measurements
from moment.planner.lp import solve_lp, solve_lp_batch
from moment.planner.network import REST_GPU, REST_SSD, TIER_SSD, ChassisTemplate, build_network
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory, populate, strip
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec

INV = Inventory.simple(4, 8, "A100-PCIe-40GB", "P5510")
#: link efficiencies under which spreading the data evenly costs most layouts time (machine B; A's
#: advice turns at a faster socket link)
SLOW = {"switch_uplink": 0.6, "socket_link": 0.3}
SLOW_A = {"switch_uplink": 0.6, "socket_link": 0.6}


@pytest.fixture(scope="module")
def machine_b():
    return apply_calibration(load_profile("paper-machine-b"), SLOW)


@pytest.fixture(scope="module")
def plans(machine_b):
    return {d: make_plan(machine_b, INV, WorkloadSpec(), data=d) for d in ("planned", "even")}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _network(topo, layout: str):
    bare = strip(topo)[0]
    lay = bare.layouts[layout]
    placement = {s: "A100-PCIe-40GB" for s in lay.gpu[:4]} | {s: "P5510" for s in lay.ssd[:8]}
    return build_network(populate(bare, placement), WorkloadSpec())


# ---- the LP ------------------------------------------------------------------------------------------
def test_even_fixes_equal_ssd_shares_and_costs_time(machine_b):
    net = _network(machine_b, "paper-moment")
    planned, even = solve_lp(net), solve_lp(net, data="even")
    w = WorkloadSpec()
    ssd = [s.id for s in net.storage if s.tier == TIER_SSD]
    shares = even.storage_shares()
    assert [shares[s] for s in ssd] == pytest.approx([(1 - w.gpu_cache_share - w.cpu_cache_share) / len(ssd)] * 8)
    assert max(planned.storage_shares()[s] for s in ssd) > 1.2 * min(planned.storage_shares()[s] for s in ssd)
    assert even.epoch_read_s > 1.2 * planned.epoch_read_s  # the far SSDs' equal shares cross the slow links


def test_batch_takes_one_data_placement_per_network(machine_b):
    net = _network(machine_b, "paper-moment")
    mixed = solve_lp_batch([net, net], data=["even", "planned"])
    assert mixed[0].epoch_read_s == pytest.approx(solve_lp(net, data="even").epoch_read_s)
    assert mixed[1].epoch_read_s == pytest.approx(solve_lp(net).epoch_read_s)
    with pytest.raises(ValueError, match="data must be one of planned, even"):
        solve_lp(net, data="hash")


def test_calibration_and_plan_predict_an_even_layout_alike(machine_b, plans):
    """One rule: a measurement of data spread evenly is predicted as the plan predicts `predicted_even`."""
    ms = load_measurements("tests/data/paper-machine-b-measured.yaml").measurements
    model = Model(load_profile("paper-machine-b"), INV, ms, data="even")
    got = dict(zip([m.label for m in ms], model.predict(SLOW)))
    base = {b.name: b for b in plans["planned"].baselines}
    assert base["paper-c"].predicted_even.epoch_read_s > 1.05 * base["paper-c"].predicted.epoch_read_s
    assert got["paper-c"] == pytest.approx(base["paper-c"].predicted_even.epoch_read_s, rel=1e-6)
    assert got["paper-moment"] == pytest.approx(base["paper-moment"].predicted.epoch_read_s, rel=1e-6)  # data: planned


# ---- the plan ----------------------------------------------------------------------------------------
def test_every_layout_gets_both_predictions_and_planned_is_unchanged(plans):
    planned, even = plans["planned"], plans["even"]
    assert planned.data == "planned" and even.data == "even"
    for p in (planned, even):
        assert p.predicted_even is not None and all(b.predicted_even is not None for b in p.baselines)
    # --data changes which figure ranks, never what either figure is
    assert [b.predicted.epoch_read_s for b in planned.baselines] == [b.predicted.epoch_read_s for b in even.baselines]
    assert [b.predicted_even.epoch_read_s for b in planned.baselines] == \
        [b.predicted_even.epoch_read_s for b in even.baselines]
    moment_b = {b.name: b for b in planned.baselines}["paper-moment"]
    assert moment_b.predicted_even.epoch_read_s > 1.2 * moment_b.predicted.epoch_read_s


def test_even_plan_ranks_links_and_gain_by_the_even_figures(plans):
    even = plans["even"]
    assert even.predicted_even.epoch_read_s > 1.005 * even.predicted.epoch_read_s  # the two differ here
    assert even.gain_vs_best_baseline == pytest.approx(
        min(b.predicted_even.epoch_read_s for b in even.baselines) / even.predicted_even.epoch_read_s)
    reads = {lu.id: lu.load_gbps for lu in even.links if lu.id.endswith(":read")}
    ssd_loads = [v for k, v in reads.items() if k.startswith("ssd")]
    assert ssd_loads and max(ssd_loads) == pytest.approx(min(ssd_loads), rel=1e-6)  # equal shares, equal loads
    rec = next(e for e in even.explanation if e.layout == "recommended")
    assert rec.epoch_read_s == pytest.approx(even.predicted_even.epoch_read_s)


@pytest.mark.parametrize("method", ["exhaustive", "branch-and-bound"])
def test_the_search_solves_complete_placements_under_the_data_asked_for(monkeypatch, method):
    """Its bounds may be the planned LP's (equal shares only narrow the LP); the times it compares not."""
    from moment.planner import branch, plan as plan_mod

    seen = []

    def spy(real):
        def solve(nets, **kw):
            data = kw.get("data", "planned")
            partial = [REST_GPU in n.gpus or any(x.id.startswith(REST_SSD) for x in n.storage) for n in nets]
            seen.extend(zip(partial, [data] * len(nets) if isinstance(data, str) else data))
            return real(nets, **kw)
        return solve

    monkeypatch.setattr(plan_mod, "solve_lp_batch", spy(plan_mod.solve_lp_batch))
    monkeypatch.setattr(branch, "solve_lp_batch", spy(branch.solve_lp_batch))
    make_plan(load_profile("paper-machine-a"), Inventory.simple(2, 3, "A100-PCIe-40GB", "P5510"), WorkloadSpec(),
              data="even", method=method)
    complete = [d for partial, d in seen if not partial]
    assert complete and set(complete) == {"even"}
    if method == "branch-and-bound":
        assert {d for partial, d in seen if partial} == {"planned"}


@pytest.mark.parametrize("method", ["exhaustive", "branch-and-bound"])
def test_even_search_finds_the_least_even_time(method):
    """Brute force over every distinct placement of a small inventory, with the data spread evenly."""
    topo = apply_calibration(load_profile("paper-machine-a"), {"switch_uplink": 0.4})
    inv = Inventory.simple(2, 3, "A100-PCIe-40GB", "P5510")
    bare = strip(topo)[0]
    space = search.enumerate_placements(bare, inv)
    tpl = ChassisTemplate(bare)
    nets = [tpl.network(space.placement(i), WorkloadSpec()) for i in range(len(space.rows))]
    best_even = min(s.epoch_read_s for s in solve_lp_batch(nets, data="even"))
    plan = make_plan(topo, inv, WorkloadSpec(), data="even", method=method)
    assert plan.predicted_even.epoch_read_s == pytest.approx(best_even, rel=1e-6)


# ---- the CLI -----------------------------------------------------------------------------------------
def test_plan_json_gives_both_figures_for_every_baseline(capsys):
    code, out, _ = run(capsys, "plan", "-p", "paper-machine-a", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["data"] == "planned"
    for x in [d, *d["baselines"]]:
        assert x["predicted"]["epoch_read_s"] > 0 and x["predicted_even"]["epoch_read_s"] >= \
            x["predicted"]["epoch_read_s"] * (1 - 1e-9)
    code, out, _ = run(capsys, "plan", "-p", "paper-machine-a", "--json", "--data", "even")
    e = json.loads(out)
    assert e["data"] == "even"
    assert [b["predicted"] for b in e["baselines"]] == [b["predicted"] for b in d["baselines"]]


def test_plan_table_shows_both_columns_and_the_split(capsys, tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"format": "moment-calibration", "fitted_on": "paper-machine-b",
                                   "params": SLOW, "fitted": list(SLOW)}))
    code, out, _ = run(capsys, "plan", "-p", "paper-machine-b", "--calibration", cal)
    assert code == 0
    assert "planned data" in out and "even data" in out
    row = next(line for line in out.splitlines() if line.startswith("│ paper-moment "))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert float(cells[2]) > 1.2 * float(cells[1])  # even > planned for paper-moment
    words = " ".join(out.split())
    assert "the recommended slots" in words and "the planned data placement" in words


@pytest.mark.parametrize("argv", [
    ["plan", "-p", "paper-machine-a", "--data", "hash"],
    ["compare", "paper-machine-a", "--data", "Even"],
    ["simulate", "-p", "paper-machine-b", "--placement", "paper-c", "--data", "spread"],
    ["advise", "-p", "paper-machine-a", "--budget", "60000", "--data", "random"],
])
def test_an_unknown_data_placement_is_one_line_naming_the_flag(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert "--data" in err and "choose planned or even" in err and "Traceback" not in err


def test_compare_and_simulate_predict_under_the_data_asked_for(capsys, machine_b, tmp_path):
    code, out, _ = run(capsys, "compare", "paper-machine-a", "--json", "--data", "even")
    row = json.loads(out)[0]
    plan = make_plan(load_profile("paper-machine-a"), INV, WorkloadSpec(), data="even")
    assert row["data"] == "even" and row["epoch_read_s"] == pytest.approx(plan.predicted_even.epoch_read_s)
    code, out, _ = run(capsys, "compare", "paper-machine-a", "--json")
    assert json.loads(out)[0]["data"] == "planned"

    code, out, _ = run(capsys, "simulate", "-p", "paper-machine-b", "--placement", "paper-moment", "--uniform",
                       "--data", "even", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["data"] == "even"
    assert rep["lp_epoch_s"] == pytest.approx(solve_lp(_network(load_profile("paper-machine-b"), "paper-moment"),
                                                       data="even").epoch_read_s)
    code, out, err = run(capsys, "simulate", "--layout", tmp_path, "--data", "even")
    assert code == 2 and "--data does not go with --layout" in err


def test_simulate_a_plan_follows_the_plans_data(capsys, tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"format": "moment-calibration", "fitted_on": "paper-machine-b",
                                   "params": SLOW, "fitted": list(SLOW)}))
    code, out, _ = run(capsys, "plan", "-p", "paper-machine-b", "--json", "--data", "even", "--calibration", cal)
    plan = json.loads(out)
    assert plan["predicted_even"]["epoch_read_s"] > 1.005 * plan["predicted"]["epoch_read_s"]
    (tmp_path / "plan.json").write_text(out)
    code, out, _ = run(capsys, "simulate", "--plan", tmp_path / "plan.json", "--uniform", "--json",
                       "--calibration", cal)
    rep = json.loads(out)
    assert code == 0 and rep["data"] == "even"
    assert rep["lp_epoch_s"] == pytest.approx(plan["predicted_even"]["epoch_read_s"], rel=1e-6)
    code, out, _ = run(capsys, "simulate", "--plan", tmp_path / "plan.json", "--uniform", "--json", "--data", "planned",
                       "--calibration", cal)
    rep = json.loads(out)
    assert rep["data"] == "planned"
    assert rep["lp_epoch_s"] == pytest.approx(plan["predicted"]["epoch_read_s"], rel=1e-6)


@pytest.mark.slow
def test_advise_predicts_under_the_data_asked_for():
    from moment.cost import advise

    topo = apply_calibration(load_profile("paper-machine-a"), SLOW_A)
    r = advise(topo, 200_000, models=["A100-PCIe-40GB", "P5510"], max_gpus=4, max_ssds=8, data="even")
    assert r.data == "even"
    full = next(c for c in r.candidates if c.inventory == "4 x A100-PCIe-40GB, 8 x P5510")
    plan = make_plan(topo, INV, WorkloadSpec())
    assert plan.predicted_even.epoch_read_s > 1.1 * plan.predicted.epoch_read_s  # the two differ here
    assert full.predicted.epoch_read_s == pytest.approx(plan.predicted_even.epoch_read_s, rel=1e-6)
    # with the planned shares the eighth SSD pays (4 + 8 is fastest); spread evenly it costs time
    assert r.best_throughput.inventory == "4 x A100-PCIe-40GB, 7 x P5510"


# ---- measurement files -------------------------------------------------------------------------------
def _mfile(tmp_path, data_line: str, extra: str) -> str:
    f = tmp_path / "m.yaml"
    f.write_text(f"machine: paper-machine-a\n{data_line}gpus: 4\nssds: 8\nmeasurements:\n"
                 f"  - {{layout: paper-a, epoch_s: 15.9}}\n  - {extra}\n")
    return str(f)


@pytest.mark.parametrize("data_line, extra, needle", [
    ("data: hash\n", "{layout: paper-b, epoch_s: 26.7}", "data: Input should be 'planned' or 'even'"),
    ("data: even\n", "{layout: paper-b, epoch_s: 26.7, data: evenly}",
     "measurements.1.data: Input should be 'planned' or 'even'"),
    ("", "{device: ssd0, read_gbps: 6.0, data: even}", "measurements.1: data (where the rows were placed) belongs "
     "to an epoch_s measurement"),
])
def test_measurement_files_refuse_a_bad_data_placement(capsys, tmp_path, data_line, extra, needle):
    f = _mfile(tmp_path, data_line, extra)
    with pytest.raises(MomentError, match="not a measurement file"):
        load_measurements(f)
    code, _, err = run(capsys, "calibrate", "-m", f, "--fit", "overhead_s")
    assert code == 2 and needle in err and "Traceback" not in err


def test_a_measurement_overrides_the_files_data(tmp_path, machine_b):
    f = tmp_path / "m.yaml"
    f.write_text("machine: paper-machine-b\ndata: even\ngpus: 4\nssds: 8\nmeasurements:\n"
                 "  - {layout: paper-c, epoch_s: 18.6}\n  - {layout: paper-c, epoch_s: 14.0, data: planned}\n")
    mf = load_measurements(f)
    model = Model(load_profile("paper-machine-b"), INV, mf.measurements, data=mf.data)
    assert model.even == [True, False]
    even_t, planned_t = model.predict(SLOW)
    net = _network(machine_b, "paper-c")
    assert even_t == pytest.approx(solve_lp(net, data="even").epoch_read_s, rel=1e-6)
    assert planned_t == pytest.approx(solve_lp(net).epoch_read_s, rel=1e-6)
    assert even_t > 1.05 * planned_t


def test_the_papers_measurement_files_say_how_their_data_was_placed():
    a, b = (load_measurements(f"tests/data/paper-machine-{m}-measured.yaml") for m in "ab")
    assert a.data == b.data == "even"
    assert [m.data for m in b.measurements if m.layout == "paper-moment"] == ["planned"]  # DDAK's shares
