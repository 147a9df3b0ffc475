"""Cost: the price table and its overrides, Hyperion's TCO/TPC equations, `advise` and `moment advise`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moment.cli import main
from moment.cost import CostParams, advise, cost_report, load_prices, merge_prices
from moment.cost.advisor import _Bound, _inventories
from moment.cost.model import HOURS_PER_YEAR, report
from moment.errors import MomentError
from moment.planner.plan import make_plan
from moment.topology.devices import CATALOG, Inventory, InventoryItem
from moment.topology.model import Kind, Topology
from moment.workload.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["T4", "A100-PCIe-40GB", "P5510", "990-PRO"]

# Two sockets: root complex 0 with an x16 slot and two x4 NVMe bays, root complex 1 with an x16 slot
# and one bay. Five slots, small enough that solving every inventory takes a second or two.
SMALL = {
    "name": "small-5-slot",
    "nodes": [
        {"id": "cpu0", "kind": "socket", "memory_gib": 128, "memory_bandwidth_gbps": 100},
        {"id": "cpu1", "kind": "socket", "memory_gib": 128, "memory_bandwidth_gbps": 100},
        {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "rc1", "kind": "root_complex", "parent": "cpu1"},
        {"id": "rc0-x16", "kind": "slot", "parent": "rc0", "width": 16, "link": {"gen": 4, "width": 16}},
        {"id": "rc0-bay0", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}},
        {"id": "rc0-bay1", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}},
        {"id": "rc1-x16", "kind": "slot", "parent": "rc1", "width": 16, "link": {"gen": 4, "width": 16}},
        {"id": "rc1-bay0", "kind": "slot", "parent": "rc1", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}},
    ],
    "links": [{"a": "cpu0", "b": "cpu1", "kind": "upi", "count": 1, "bandwidth_gbps": 20}],
}


@pytest.fixture(scope="module")
def small() -> Topology:
    return Topology.model_validate(SMALL)


@pytest.fixture(scope="module")
def pruned(small):
    return advise(small, 40_000, models=MODELS, top_k=2)


def _ranked(r) -> list[str]:
    return [c.inventory for c in (r.best_throughput_per_dollar, r.best_throughput, *r.runner_ups)]


# ---- the price table -------------------------------------------------------------------------------


def test_shipped_table_prices_every_device_the_planner_knows_with_date_and_source():
    t = load_prices()
    assert set(t.devices) == {m.name for m in CATALOG}  # GPUs, SSDs and NICs
    # a switch port for each NIC's line rate: a cluster of any catalogue NIC can be priced
    assert {m.port_gbit for m in CATALOG if m.kind == Kind.nic} <= set(t.switch_ports)
    for rate, e in t.switch_ports.items():
        assert e.price_usd > 0 and e.power_w > 0 and e.date and e.source, rate
    for name, e in t.devices.items():
        assert e.price_usd > 0 and e.power_w > 0 and e.date and e.source, name
    # the numbers taken from Hyperion section VI
    assert t.devices["A100-PCIe-80GB"].price_usd == 14177 and "Hyperion" in t.devices["A100-PCIe-80GB"].source
    assert t.devices["P5510"].price_usd == 308
    assert t.server.price_usd == 14098 and t.electricity.usd_per_kwh == 0.10
    assert t.origin == "shipped"


def test_price_override_merges_entry_by_entry(tmp_path):
    f = tmp_path / "quotes.yaml"
    f.write_text("devices:\n  t4: {price_usd: 1000}\n  P5510: {price_usd: 250, date: 2025-05, source: our quote}\n"
                 "electricity: {usd_per_kwh: 0.2}\n")
    t = load_prices(f)
    shipped = load_prices()
    assert t.devices["T4"].price_usd == 1000  # an alias names the catalogue model
    assert t.devices["T4"].power_w == shipped.devices["T4"].power_w  # fields not given are kept
    assert str(f) in t.devices["T4"].source and t.devices["T4"].date == "not given"
    assert t.devices["P5510"].source == "our quote" and t.devices["P5510"].date == "2025-05"
    assert t.devices["L40S"] == shipped.devices["L40S"]
    assert t.electricity.usd_per_kwh == 0.2 and str(f) in t.electricity.source
    assert t.origin == f"shipped + {f}"


@pytest.mark.parametrize("text, expected", [
    ("devices:\n  X100: {price_usd: 5}\n", "devices.X100: unknown device model 'X100'"),
    ("devices:\n  T4: {price_usd: -5}\n", "devices.T4.price_usd: Input should be greater than 0"),
    ("devices:\n  T4: {price: 5}\n", "devices.T4.price: Extra inputs are not permitted"),
    ("switch_ports:\n  fast: {price_usd: 5}\n", "switch_ports.fast: key must be the port rate in Gb/s"),
    ("switch_ports:\n  100: {price_usd: -5}\n", "switch_ports.100.0.price_usd: Input should be greater than 0"),
    ("server: {price_usd: cheap}\n", "server.price_usd: Input should be a valid number"),
    ("currency: EUR\n", "only USD prices are supported"),
    ("- a list\n", "must be a YAML mapping"),
    ("devices: [1\n", "not valid YAML"),
])
def test_bad_price_files_are_one_line_naming_the_field(tmp_path, text, expected):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(MomentError) as e:
        load_prices(f)
    first = str(e.value).splitlines()[0]
    assert expected in first and str(f) in first


@pytest.mark.parametrize("text, expected, hint", [
    ("A100-PCIe-40GB: 7500\n", "A100-PCIe-40GB: not a section of a price table (its sections: currency, server, "
     "electricity, devices, switch_ports)", "devices: {A100-PCIe-40GB: {price_usd: 7500"),
    ("srever: {price_usd: 9000}\n", "srever: not a section of a price table", "docs/planning.md shows a price file"),
])
def test_a_price_file_without_its_sections_names_them(tmp_path, text, expected, hint):
    """A model priced at the top (as a flat name: price mapping) or a misspelt section was pydantic's 'Extra inputs
    are not permitted' under the name; now the sections, and where a device's price goes."""
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(MomentError) as e:
        load_prices(f)
    assert expected in str(e.value).splitlines()[0] and hint in str(e.value), str(e.value)


def test_missing_price_file_is_one_line(tmp_path):
    with pytest.raises(MomentError, match="price file.*file not found|file not found.*price file"):
        load_prices(tmp_path / "none.yaml")


# ---- Hyperion's equations --------------------------------------------------------------------------


def test_tco_reproduces_hyperion_table_i_machine_a():
    """Machine A: one 80 GB A100, 12 P5510, Hyperion's flat 4,000 W at $0.10/kWh for 5 years."""
    prices = load_prices()
    inv = Inventory(items=[InventoryItem(model="A100-PCIe-80GB", count=1), InventoryItem(model="P5510", count=12)])
    r = report(inv, epoch_s=10.0, samples_per_epoch=1000.0, prices=prices, params=CostParams(machine_power_w=4000))
    assert r.hardware_usd == pytest.approx(14098 + 14177 + 12 * 308)  # 31,971
    assert r.energy_kwh == pytest.approx(4.0 * 5 * 8760)  # 175,200 kWh
    assert r.electricity_usd == pytest.approx(17520)  # Hyperion rounds this to $17,000
    assert r.tco_usd - r.electricity_usd + 17000 == pytest.approx(48971)  # Table I's TCO for machine A
    assert r.throughput_samples_per_s == pytest.approx(100.0)
    assert r.tpc == pytest.approx(100.0 / (31971 + 17520))
    assert r.tpc_hardware == pytest.approx(100.0 / 31971)
    assert r.epochs_per_hour == pytest.approx(360.0)


def test_energy_from_tdps_pue_and_utilisation():
    prices = load_prices()
    inv = Inventory.simple(2, 3, "T4", "990-PRO")
    params = CostParams(years=3, pue=1.5, utilisation=0.5)
    r = report(inv, 20.0, 4000.0, prices, params)
    watts = prices.server.power_w + 2 * prices.devices["T4"].power_w + 3 * prices.devices["990-PRO"].power_w
    kwh = watts * 1.5 * 0.5 * 3 * HOURS_PER_YEAR / 1000
    hw = prices.server.price_usd + 2 * prices.devices["T4"].price_usd + 3 * prices.devices["990-PRO"].price_usd
    assert r.power_w == pytest.approx(watts)
    assert r.energy_kwh == pytest.approx(kwh)
    assert r.tco_usd == pytest.approx(hw + kwh * 0.10)
    assert r.tpc == pytest.approx(200.0 / (hw + kwh * 0.10))


def test_cost_report_of_a_plan_uses_its_epoch_and_training_seeds(small):
    wl = WorkloadSpec()
    inv = Inventory.simple(1, 2, "T4", "P5510")
    plan = make_plan(small, inv, wl)
    r = cost_report(plan, inv, load_prices())
    seeds = wl.num_nodes * wl.train_fraction
    assert r.epoch_s == plan.predicted.epoch_read_s
    assert r.throughput_samples_per_s == pytest.approx(seeds / plan.predicted.epoch_read_s)
    assert r.tpc == pytest.approx(r.throughput_samples_per_s / r.tco_usd)


@pytest.mark.parametrize("field, value", [("years", 0), ("pue", 0.9), ("utilisation", 1.5), ("machine_power_w", -1)])
def test_cost_params_reject_nonsense(field, value):
    with pytest.raises(ValueError):
        CostParams(**{field: value})


# ---- advise ----------------------------------------------------------------------------------------


def test_bound_never_exceeds_the_planners_epoch(small):
    """The pruning is only as good as this: the optimistic epoch is a lower bound on every inventory."""
    wl = WorkloadSpec()
    bound = _Bound(small, wl)
    invs = _inventories(small, ["T4", "A100-PCIe-40GB"], ["P5510", "990-PRO"], None, None, wl)
    # per GPU model: 1 GPU + 1-4 SSDs of either model (8), 2 GPUs + 1-3 SSDs (6); 5 slots in all
    assert len(invs) == 2 * (8 + 6)
    for inv in invs:
        lb = bound.epoch_s(inv)
        assert 0 < lb <= make_plan(small, inv, wl).predicted.epoch_read_s * (1 + 1e-9), inv.describe()


@pytest.fixture(scope="module")
def naive(small):
    """The same advice without the bound's pruning: every inventory in the budget solved."""
    return advise(small, 40_000, models=MODELS, top_k=2, prune=False)


def test_pruned_search_recommends_what_solving_everything_does(pruned, naive):
    assert naive.pruned == 0 and naive.solved == naive.searched - naive.over_budget
    assert pruned.pruned > 0 and pruned.solved + pruned.pruned + pruned.over_budget == pruned.searched
    assert _ranked(pruned) == _ranked(naive)
    for a, b in zip((pruned.best_throughput_per_dollar, pruned.best_throughput),
                    (naive.best_throughput_per_dollar, naive.best_throughput)):
        assert a.model_dump() == b.model_dump()


def test_advise_rankings_are_consistent(pruned, naive):
    """The ranks follow the figures, and each recommendation is the best by its own criterion among every
    inventory in the budget (the unpruned search solves them all), with or without the pruning."""
    ranked = [c for c in naive.candidates if not c.dominated]  # every inventory in the budget, solved
    assert len(ranked) > 2 * naive.top_k
    best_tpc = sorted((c.tpc for c in ranked), reverse=True)
    best_thr = sorted((c.throughput_samples_per_s for c in ranked), reverse=True)
    for r in (pruned, naive):
        best, fast = r.best_throughput_per_dollar, r.best_throughput
        # equal figures (to the advisor's 6 significant digits) tie; ties go to the lower TCO
        assert best.tpc == pytest.approx(best_tpc[0], rel=1e-6)
        assert fast.throughput_samples_per_s == pytest.approx(best_thr[0], rel=1e-6)
        by_tpc = sorted((c for c in r.candidates if c.rank_per_dollar), key=lambda c: c.rank_per_dollar)
        by_thr = sorted((c for c in r.candidates if c.rank_throughput), key=lambda c: c.rank_throughput)
        assert [c.rank_per_dollar for c in by_tpc] == [c.rank_throughput for c in by_thr] == [1, 2]
        assert [c.tpc for c in by_tpc] == pytest.approx(best_tpc[:2], rel=1e-6)
        assert [c.throughput_samples_per_s for c in by_thr] == pytest.approx(best_thr[:2], rel=1e-6)
        assert by_tpc[0] == best and by_thr[0] == fast
        assert not any(c.dominated for c in by_tpc + by_thr)
        # the runner-ups are the other members of either top list
        assert sorted(c.inventory for c in r.runner_ups) == sorted(
            {c.inventory for c in by_tpc + by_thr} - {best.inventory, fast.inventory})
        # every candidate, best per dollar first, within the budget and priced by its own figures
        assert all(a.tpc >= b.tpc * (1 - 1e-6) for a, b in zip(r.candidates, r.candidates[1:]))
        for c in r.candidates:
            assert c.hardware_usd <= r.budget_usd and c.tco_usd > c.hardware_usd
            assert c.tpc == pytest.approx(c.throughput_samples_per_s / c.tco_usd)
            assert c.throughput_samples_per_s == pytest.approx(c.epochs_per_hour / 3600 * 269_000_000 * 0.01)


def test_winner_is_what_make_plan_recommends_for_its_inventory(small, pruned):
    for c in (pruned.best_throughput_per_dollar, pruned.best_throughput):
        plan = make_plan(small, Inventory(items=c.items), WorkloadSpec())
        assert plan.placement == c.placement
        assert plan.predicted.epoch_read_s == c.predicted.epoch_read_s == c.epoch_s


def test_advise_is_deterministic(small, pruned):
    again = advise(small, 40_000, models=MODELS, top_k=2)
    a, b = pruned.model_dump(exclude={"elapsed_s"}), again.model_dump(exclude={"elapsed_s"})
    assert a == b


def test_progress_counts_inventories(small):
    seen: list[tuple[int, int]] = []
    r = advise(small, 40_000, models=["T4", "P5510"], progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (r.searched - r.over_budget,) * 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_progress_counts_inventories_ruled_out_as_they_are(small):
    """Most inventories are never solved (their bound cannot enter a top list): the progress counts
    them done once both rankings have ruled them out, so it reaches the total with the last solve."""
    seen: list[tuple[int, int]] = []
    r = advise(small, 40_000, models=MODELS, top_k=2, progress=lambda d, t: seen.append((d, t)))
    total = r.searched - r.over_budget
    assert r.pruned > 0 and seen[-1] == seen[-2] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert any(d > solves for solves, (d, _) in enumerate(seen[:-1], start=1))  # beyond the solves
    assert max(d for d, _ in seen[:-2]) < total  # (and not before the rankings are settled)


def test_a_cheaper_price_changes_the_advice(small, tmp_path):
    base = advise(small, 60_000, models=["T4", "A100-PCIe-40GB", "P5510"], top_k=1)
    assert base.best_throughput_per_dollar.items[0].model == "T4"
    f = tmp_path / "p.yaml"
    f.write_text("devices: {A100-PCIe-40GB: {price_usd: 100, date: '2030', source: a dream}}\n")
    cheap = advise(small, 60_000, models=["T4", "A100-PCIe-40GB", "P5510"], top_k=1, prices=load_prices(f))
    assert cheap.best_throughput_per_dollar.items[0].model == "A100-PCIe-40GB"
    assert cheap.prices["devices"]["A100-PCIe-40GB"]["source"] == "a dream"


def test_a_chassis_with_built_in_gpus_says_its_figures_leave_them_out_until_its_price_is_given(tmp_path):
    """An HGX box's eight SXM GPUs are in no inventory: with the shipped server price (a host's without GPUs) its
    TCO left them out without a word; a server price of the user's own is the whole machine's, and no note."""
    from moment.topology.profiles import load_profile

    hgx = load_profile("hgx-a100-8gpu")
    shipped = advise(hgx, 60_000, models=["P5510"], max_ssds=2, top_k=1)
    assert shipped.notes == ["hardware, power, TCO and samples/s per dollar leave out the machine's built-in GPUs "
                             "(8 A100-SXM4-80GB): the server's price (14,098 USD, 600 W) is a host's without GPUs; "
                             "give the whole machine's with --prices (server: {price_usd: ..., power_w: ..., date: "
                             "..., source: ...})"]
    f = tmp_path / "hgx.yaml"
    f.write_text("server: {price_usd: 180000, power_w: 6500, date: '2024', source: a quote}\n")
    quoted = advise(hgx, 260_000, models=["P5510"], max_ssds=2, top_k=1, prices=load_prices(f))
    assert quoted.notes == [] and quoted.best_throughput.hardware_usd > 180_000
    assert advise(load_profile("paper-machine-b"), 60_000, models=["T4", "P5510"], max_gpus=1, max_ssds=1).notes == []


def test_budget_too_small_is_a_clear_error(small):
    with pytest.raises(MomentError, match=r"budget 10,000 USD buys nothing for 'small-5-slot': the cheapest "
                                          r"inventory searched \(1 x T4, 1 x 990-PRO"):
        advise(small, 10_000, models=MODELS)


@pytest.mark.parametrize("kwargs, match", [
    (dict(models=["X100"]), "unknown device model 'X100'"),
    (dict(models=["CX7"]), "CX7 is a NIC"),
    (dict(budget_usd=-1.0), "give a positive amount"),
    (dict(max_gpus=-1), "--max-gpus -1: must not be negative"),
    (dict(top_k=0), "--top 0: give 1 or more"),
])
def test_bad_requests_are_user_errors(small, kwargs, match):
    args = dict(budget_usd=40_000, models=MODELS) | kwargs
    with pytest.raises(MomentError, match=match):
        advise(small, **args)


def test_model_without_a_price_is_named(small, tmp_path):
    prices = load_prices()
    del prices.devices["L40S"]
    with pytest.raises(MomentError, match="no price for device model 'L40S'"):
        advise(small, 40_000, models=["L40S"], prices=prices)


# ---- moment advise ---------------------------------------------------------------------------------


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("chassis") / "small.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    return p


def test_cli_json_shape(capsys, small_file):
    code, out, _ = _cli(capsys, "advise", "--profile", str(small_file), "--budget", "40000",
                        "--models", ",".join(MODELS), "--top", "2", "--json")
    assert code == 0
    r = json.loads(out)
    for key in ("budget_usd", "best_throughput_per_dollar", "best_throughput", "runner_ups",
                "candidates", "searched", "pruned", "elapsed_s", "prices"):
        assert key in r, key
    assert "best_per_dollar" not in r  # one name for each figure
    assert r["budget_usd"] == 40000
    for c in [r["best_throughput_per_dollar"], r["best_throughput"], *r["runner_ups"], *r["candidates"]]:
        for key in ("inventory", "placement", "epoch_s", "throughput_samples_per_s", "hardware_usd",
                    "tco_usd", "tpc"):
            assert key in c, key
        assert "cost_usd" not in c
        assert c["predicted"]["epoch_read_s"] == c["epoch_s"]
    assert r["prices"]["origin"] == "shipped"
    assert {"date", "source", "price_usd"} <= set(r["prices"]["devices"]["T4"])


def test_cli_tables(capsys, small_file):
    code, out, _ = _cli(capsys, "advise", "-p", str(small_file), "--budget", "40000", "--models", "T4,P5510")
    assert code == 0
    assert "best throughput per dollar" in out and "pruned by the" in out and "T4" in out


@pytest.mark.parametrize("argv, message", [
    (["--models", "T4,X100"], "unknown device model 'X100'"),
    (["--budget", "5000"], "budget 5,000 USD buys nothing"),
    (["--pue", "0.5"], "--pue: Input should be greater than or equal to 1"),
    (["--models", " , "], "--models"),
])
def test_cli_errors_are_one_red_line(capsys, small_file, argv, message):
    args = ["advise", "-p", str(small_file), "--budget", "40000", "--models", "T4,P5510", *argv]
    code, out, err = _cli(capsys, *args)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_cli_bad_price_file(capsys, small_file, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("devices: {T4: {price_usd: 0}}\n")
    code, _, err = _cli(capsys, "advise", "-p", str(small_file), "--budget", "40000", "--prices", str(f))
    assert code == 2 and "devices.T4.price_usd: Input should be greater than 0" in err


def test_cost_and_advise_load_no_torch():
    code = ("import sys, moment.cost, moment.cli.cost_cmds\n"
            "assert 'torch' not in sys.modules, 'moment.cost loaded torch'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_an_ssd_that_buys_nothing_is_not_ranked(pruned):
    """Ranked inventories are faster than the same inventory with one SSD fewer, which was solved."""
    by_label = {c.inventory: c for c in pruned.candidates}
    ranked = [c for c in pruned.candidates if c.rank_per_dollar or c.rank_throughput]
    assert ranked and not any(c.dominated for c in ranked)
    for c in ranked:
        items = [i.model_copy() for i in c.items]
        ssd = next(i for i in items if i.model in ("P5510", "990-PRO"))
        if ssd.count == 1:
            continue
        ssd.count -= 1
        fewer = by_label[Inventory(items=items).describe()]
        assert fewer.throughput_samples_per_s < c.throughput_samples_per_s
    for c in pruned.candidates:
        if c.dominated:
            assert c.rank_per_dollar is None and c.rank_throughput is None


def test_merge_prices_takes_a_parsed_mapping_for_callers_without_a_file():
    t = merge_prices({"devices": {"T4": {"price_usd": 1234}}}, "upload")
    assert t.devices["T4"].price_usd == 1234 and t.devices["T4"].source == "user file upload"
    assert t.origin == "shipped + upload"
    with pytest.raises(MomentError, match="upload: invalid price table: electricity.usd_per_kwh"):
        merge_prices({"electricity": {"usd_per_kwh": -1}}, "upload")


def test_machines_with_built_in_gpus_are_advised_ssds_only():
    from moment.topology.profiles import load_profile

    r = advise(load_profile("hgx-a100-8gpu"), 30_000, models=["P5510", "990-PRO"], max_ssds=3, top_k=1)
    assert r.gpu_models  # listed, but the chassis has no free GPU slot: every inventory is SSDs only
    for c in r.candidates:
        assert [i.model for i in c.items] in (["P5510"], ["990-PRO"])
