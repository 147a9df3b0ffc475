"""`moment advise --machines-max`: one server or several under the same budget, NICs and switch ports
priced, each k of servers planned as a cluster."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from moment.cli import main
from moment.cost import CostParams, advise, load_prices
from moment.cost.machines import compare_machines
from moment.cost.model import HOURS_PER_YEAR, samples_per_epoch
from moment.errors import MomentError
from moment.planner.cluster import plan_cluster
from moment.topology.cluster import cluster_from_dict
from moment.topology.model import Topology
from moment.workload.spec import WorkloadSpec
from tests.test_cost import MODELS, SMALL

#: the cost tests' five-slot machine with one more x16 slot, for a NIC
WITH_NIC = {**SMALL, "name": "small-nic", "nodes": [*SMALL["nodes"], {
    "id": "rc0-nic", "kind": "slot", "parent": "rc0", "width": 16, "accepts": ["nic"], "link": {"gen": 4, "width": 16}}]}


@pytest.fixture(scope="module")
def topo() -> Topology:
    return Topology.model_validate(WITH_NIC)


@pytest.fixture(scope="module")
def options(topo):
    prices, params = load_prices(), CostParams()
    single = advise(topo, 60_000, models=MODELS, top_k=2, prices=prices, params=params)
    opts = compare_machines(topo, 60_000, 2, single, nic="CX6-Dx-100GbE", prices=prices, params=params,
                            advise_args=dict(models=MODELS, top_k=2))
    return single, opts


def _network(prices) -> tuple[float, float]:
    """One server's NIC and switch port: (purchase, five years of their power)."""
    nic, port = prices.devices["CX6-Dx-100GbE"], prices.switch_ports[100]
    return (nic.price_usd + port.price_usd,
            (nic.power_w + port.power_w) * 5 * HOURS_PER_YEAR / 1000 * prices.electricity.usd_per_kwh)


def _half(topo):
    """What advise recommends for one of two servers: half the budget less its NIC and switch port."""
    half = advise(topo, 30_000 - _network(load_prices())[0], models=MODELS, top_k=2,
                  reserve=(("CX6-Dx-100GbE", 1),))
    return {c.inventory: c for c in (half.best_throughput_per_dollar, half.best_throughput, *half.runner_ups)}


def _two(topo, c):
    inv = ",".join(f"{i.count}x{i.model}" for i in c.items)
    return plan_cluster(cluster_from_dict({"servers": [{"profile": "x", "inventory": inv, "count": 2}],
                                           "network": {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}}, "c"),
                        load=lambda _: topo)


def test_one_server_is_advise_s_pick_and_two_are_priced_with_their_network(topo, options):
    single, (one, two) = options
    best = single.best_throughput_per_dollar
    assert (one.machines, one.inventory, one.tco_usd, one.tpc, one.network_usd) == (1, best.inventory, best.tco_usd,
                                                                                     best.tpc, 0.0)
    assert two.machines == 2 and two.nic == "CX6-Dx-100GbE" and two.nics_per_server == 1
    c = _half(topo)[two.inventory]
    # TCO: two servers' TCO, plus per server a NIC and a switch port, bought and powered for five years
    net, ele = _network(load_prices())
    assert two.network_usd == pytest.approx(2 * net)
    assert two.hardware_usd == pytest.approx(2 * (c.hardware_usd + net))
    assert two.tco_usd == pytest.approx(2 * (c.tco_usd + net + ele))
    # throughput: the workload's seeds per epoch of the two servers planned as a cluster
    cp = _two(topo, c)
    assert two.epoch_s == pytest.approx(cp.epoch_s) and two.network_share == pytest.approx(cp.network_share)
    assert two.tpc == pytest.approx(samples_per_epoch(WorkloadSpec()) / cp.epoch_s / two.tco_usd)
    assert [o.best for o in (one, two)] == [one.tpc >= two.tpc, two.tpc > one.tpc]


def test_each_count_is_represented_by_its_best_cluster_per_dollar(topo, options):
    _, (_, two) = options
    net, ele = _network(load_prices())
    advised = _half(topo)
    assert len(advised) > 1  # a real choice
    for c in advised.values():
        tpc = samples_per_epoch(WorkloadSpec()) / _two(topo, c).epoch_s / (2 * (c.tco_usd + net + ele))
        assert tpc <= two.tpc * (1 + 1e-9), c.inventory


def test_the_network_comes_out_of_each_server_s_share_of_the_budget(topo):
    # half of this budget buys the cheapest server (server + T4 + 990-PRO) with 1,000 USD to spare, less
    # than a NIC and its switch port cost: two servers cannot be bought
    prices, params = load_prices(), CostParams()
    cheapest = prices.server.price_usd + prices.devices["T4"].price_usd + prices.devices["990-PRO"].price_usd
    budget = 2 * (cheapest + 1000)
    single = advise(topo, budget, models=MODELS, top_k=1, prices=prices, params=params)
    opts = compare_machines(topo, budget, 2, single, nic="CX6-Dx-100GbE", prices=prices, params=params,
                            advise_args=dict(models=MODELS, top_k=1))
    assert [o.machines for o in opts] == [1, 2] and opts[0].best and opts[1].inventory is None
    share = cheapest + 1000 - _network(prices)[0]
    assert opts[1].note.startswith(f"2 servers, {share:,.0f} USD each: budget {share:,.0f} USD buys nothing")


def test_the_search_ends_where_a_share_of_the_budget_buys_nothing(topo):
    # every larger count buys less: one row says so, not one row (and one search) per count up to the bound
    prices, params = load_prices(), CostParams()
    cheapest = prices.server.price_usd + prices.devices["T4"].price_usd + prices.devices["990-PRO"].price_usd
    budget = 2 * (cheapest + 1000)
    single = advise(topo, budget, models=MODELS, top_k=1, prices=prices, params=params)
    opts = compare_machines(topo, budget, 512, single, prices=prices, params=params,
                            advise_args=dict(models=MODELS, top_k=1))
    assert [o.machines for o in opts] == [1, 2] and opts[1].note.startswith("2 servers or more, ")


def test_a_network_dearer_than_the_share_is_said_not_priced_negative(topo):
    prices, params = load_prices(), CostParams()
    net = _network(prices)[0] * 16
    budget = 2.5 * net  # three servers' share is less than their network
    single = advise(topo, budget, models=MODELS, top_k=1, prices=prices, params=params)
    opts = compare_machines(topo, budget, 50, single, nics=16, prices=prices, params=params,
                            advise_args=dict(models=MODELS, top_k=1))
    assert [o.machines for o in opts] == [1, 2, 3]
    assert opts[2].note.startswith(f"3 servers or more: each one's network (16 x CX6-Dx-100GbE and its switch ports, "
                                   f"{net:,.0f} USD) costs more than its share of the budget ({budget / 3:,.0f} USD)")
    assert not any(re.search(r"(^|[\s(])-\d", o.note) for o in opts)  # no negative amounts


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "small-nic.yaml"
    path.write_text(yaml.safe_dump(WITH_NIC))
    return path


def test_cli_json_carries_the_options(profile, capsys):
    argv = ["advise", "--profile", str(profile), "--budget", "60000", "--models", ",".join(MODELS), "--top", "2"]
    assert main([*argv, "--machines-max", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["machines"] for o in out["machines"]] == [1, 2] and sum(o["best"] for o in out["machines"]) == 1
    assert out["machines"][0]["inventory"] == out["best_throughput_per_dollar"]["inventory"]
    assert main([*argv, "--machines-max", "2"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "one server or several, 60,000 USD in all" in text and "CX6-Dx-100GbE" in text


@pytest.mark.parametrize("extra, want", [
    (["--machines-max", "0"], "--machines-max 0: give 1 to 512 servers"),
    (["--machines-max", "1000000"], "--machines-max 1000000: give 1 to 512 servers"),
    (["--machines-max", "2", "--nics", "1000"], "--nics 1000: give 1 to 16 NICs per server"),
    (["--machines-max", "2", "--switch-gbit", "1e9"], "--switch-gbit 1e+09: give the switch's port rate in Gb/s"),
    (["--nic", "CX7"], "--nic prices the network between servers, which only --machines-max compares"),
    (["--nics", "2"], "--nics prices the network between servers, which only --machines-max compares"),
    (["--switch-gbit", "100"], "--switch-gbit prices the network between servers"),
    (["--machines-max", "2", "--nic", "P5510"], "--nic P5510: P5510 is an SSD, not a NIC"),
    (["--machines-max", "2", "--nic", "nope"], "unknown device model 'nope'"),
    (["--machines-max", "2", "--switch-gbit", "0"], "--switch-gbit 0: give the switch's port rate in Gb/s"),
    (["--machines-max", "2", "--switch-gbit", "25"], "no price for a 25 Gb/s switch port (priced: 100, 200, 400)"),
    (["--machines-max", "2", "--nics", "0"], "--nics 0: give 1 to 16 NICs per server"),
])
def test_cli_errors_name_the_flag(profile, capsys, extra, want):
    argv = ["advise", "--profile", str(profile), "--budget", "60000", "--models", ",".join(MODELS), "--top", "1"]
    assert main([*argv, *extra]) == 2
    cap = capsys.readouterr()
    err = " ".join(cap.err.split())
    assert err.startswith("error: ") and want in err and "Traceback" not in err, err


def test_a_price_file_prices_switch_ports(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("switch_ports:\n  25: {price_usd: 300, power_w: 5, date: 2025-01, source: our quote}\n"
                 "  100: {price_usd: 400}\n")
    t = load_prices(f)
    assert t.switch_port(25).price_usd == 300 and t.switch_port(25).source == "our quote"
    assert t.switch_port(100).price_usd == 400 and str(f) in t.switch_port(100).source
    assert t.switch_port(400) == load_prices().switch_port(400)
    with pytest.raises(MomentError, match="no price for a 50 Gb/s switch port"):
        t.switch_port(50)


def test_each_server_s_inventory_leaves_a_slot_for_its_nic():
    """paper-machine-b's x16 slots take GPUs and NICs alike: an inventory that fills them all cannot
    be a cluster's server, so the advice for k >= 2 servers searches only inventories that leave room."""
    from moment.cost.advisor import _inventories
    from moment.topology.devices import find_model, fits, strip
    from moment.topology.profiles import load_profile

    bare = strip(load_profile("paper-machine-b"))[0]
    nic = find_model("CX6-Dx-100GbE")
    x16 = sum(fits(s, nic) for s in bare.empty_slots())
    args = (bare, ["T4"], ["990-PRO"], None, None, WorkloadSpec())
    gpus_alone = max(i.count for inv in _inventories(*args) for i in inv.items if i.model == "T4")
    beside = _inventories(*args, reserve=(("CX6-Dx-100GbE", 1),))
    gpus_beside = max(i.count for inv in beside for i in inv.items if i.model == "T4")
    assert gpus_alone == x16 and gpus_beside == x16 - 1
    most = max(sum(i.count for i in inv.items) for inv in beside)
    assert most == len(bare.empty_slots()) - 1  # every other slot may still be filled
