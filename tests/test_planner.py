"""Planner: capacity graph, both solvers, evaluation, baselines, make_plan."""

from __future__ import annotations

import pytest

from moment.errors import MomentError
from moment.planner import search
from moment.planner.baselines import baseline_placements
from moment.planner.evaluate import evaluate
from moment.planner.lp import solve_lp
from moment.planner.maxflow import solve_maxflow
from moment.planner.network import TIER_CPU, TIER_GPU, TIER_SSD, ChassisTemplate, build_network
from moment.planner.plan import make_plan
from moment.topology.bandwidth import GB
from moment.topology.devices import Inventory, InventoryItem, populate, strip
from moment.topology.model import Kind, Topology
from moment.topology.profiles import builtin_names, load_profile
from moment.workload.spec import WorkloadSpec

GPU, SSD = "A100-PCIe-40GB", "P5510"  # A100: PCIe 4.0 x16; P5510: 6.5 GB/s read, PCIe 4.0 x4


def tiny(uplink_gbps: float = 5.0) -> Topology:
    """1 socket, 1 root complex, 1 switch (uplink `uplink_gbps`), 2 GPU slots, 2 SSD slots."""
    return Topology.model_validate({
        "name": "tiny",
        "nodes": [
            {"id": "cpu0", "kind": "socket", "memory_bandwidth_gbps": 100},
            {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
            {"id": "sw0", "kind": "switch", "parent": "rc0", "link": {"bandwidth_gbps": uplink_gbps, "label": "Bus 1"}},
            {"id": "g0", "kind": "slot", "parent": "sw0", "link": {"bandwidth_gbps": 25}},
            {"id": "g1", "kind": "slot", "parent": "sw0", "link": {"bandwidth_gbps": 25}},
            {"id": "s0", "kind": "slot", "parent": "sw0", "width": 4, "accepts": ["ssd"], "link": {"bandwidth_gbps": 8}},
            {"id": "s1", "kind": "slot", "parent": "sw0", "width": 4, "accepts": ["ssd"], "link": {"bandwidth_gbps": 8}},
        ],
    })


TINY_PLACEMENT = {"g0": GPU, "g1": GPU, "s0": SSD, "s1": SSD}


def work(gpu: float = 0.0, cpu: float = 0.0) -> WorkloadSpec:
    return WorkloadSpec(bytes_per_gpu_per_epoch=100e9, gpu_cache_share=gpu, cpu_cache_share=cpu)


# ---- capacity graph --------------------------------------------------------------------------------
def test_network_structure_on_tiny_machine():
    net = build_network(populate(tiny(), TINY_PLACEMENT), work())
    ids = {e.id: e for e in net.edges}
    assert net.gpus == ["gpu0", "gpu1"] and net.demand == {"gpu0": 100e9, "gpu1": 100e9}
    tiers = {s.id: s.tier for s in net.storage}
    assert tiers == {"hbm:gpu0": TIER_GPU, "hbm:gpu1": TIER_GPU, "ssd0": TIER_SSD, "ssd1": TIER_SSD,
                     "mem:cpu0": TIER_CPU}
    assert {s.id: s.limit for s in net.storage}["ssd0"] == pytest.approx(6.5 * GB)
    # the downstream direction of the switch uplink carries CPU memory; the upstream one is useless
    # here (nothing above the switch reads) and is pruned, as are the dead-end SSD downlinks
    assert ids["rc0->sw0"].capacity == pytest.approx(5 * GB) and ids["rc0->sw0"].label == "Bus 1"
    assert "sw0->rc0" not in ids
    # slot and card are separate edges in series; a GPU's outbound traffic starts at its HBM node
    assert ids["sw0->g0"].capacity == pytest.approx(25 * GB) and ids["g0->gpu0"].capacity > 27 * GB
    assert ids["gpu0->g0"].u == "hbm:gpu0" and ids["gpu0->g0"].capacity > 27 * GB  # PCIe 4.0 x16 card link
    assert ids["hbm:gpu0->gpu0"].capacity == pytest.approx(1555 * GB)
    assert ids["mem:cpu0->cpu0"].capacity == pytest.approx(100 * GB)
    # reads never flow into an SSD, and nothing leaves a GPU node (no transit through GPUs)
    assert not any(e.v.startswith("ssd") for e in net.edges)
    assert not any(e.u in ("gpu0", "gpu1") for e in net.edges)
    assert "sw0->s0" not in ids and "s0->sw0" in ids


def test_template_matches_populate_network():
    topo = load_profile("paper-machine-b")
    lay = topo.layouts["paper-moment"]
    placement = {s: GPU for s in lay.gpu} | {s: SSD for s in lay.ssd}
    a = build_network(populate(topo, placement), WorkloadSpec())
    b = ChassisTemplate(topo).network(placement, WorkloadSpec())
    assert a.edges == b.edges and a.storage == b.storage and a.gpus == b.gpus


@pytest.mark.parametrize("backend", ["networkx", "ortools"])
def test_hand_computed_optimum_ssd_bound(backend):
    # everything from the 2 SSDs (6.5 GB/s each): T = 200 GB / 13 GB/s, links never bind
    net = build_network(populate(tiny(), TINY_PLACEMENT), work())
    for sol in (solve_lp(net), solve_maxflow(net, backend)):
        assert sol.epoch_read_s == pytest.approx(200 / 13, rel=2e-4)
    lp = solve_lp(net)
    assert lp.storage_shares()["ssd0"] == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("backend", ["networkx", "ortools"])
def test_hand_computed_optimum_with_link_bottleneck(backend):
    # half the accesses may come from CPU memory, but only over the 5 GB/s switch uplink:
    # T = max((1-p) 200/13, p 200/5) is least at p = 5/18, T = 200/18 s
    net = build_network(populate(tiny(5.0), TINY_PLACEMENT), work(cpu=0.5))
    lp = solve_lp(net)
    assert lp.epoch_read_s == pytest.approx(200 / 18, rel=1e-6)
    assert lp.storage_shares()["mem:cpu0"] == pytest.approx(5 / 18, rel=1e-6)
    assert solve_maxflow(net, backend).epoch_read_s == pytest.approx(200 / 18, rel=2e-4)
    ev = evaluate(tiny(5.0), TINY_PLACEMENT, work(cpu=0.5), maxflow_backend=backend)
    uses = {u.id: u for u in ev.links}
    assert uses["rc0->sw0"].bottleneck and uses["rc0->sw0"].load_gbps == pytest.approx(5.0, rel=1e-5)
    assert uses["ssd0:read"].bottleneck and uses["ssd0:read"].kind == "ssd"
    assert ev.predicted.per_gpu_inlet_gbps == pytest.approx([9.0, 9.0], rel=1e-5)  # 100 GB in 100/9 s
    assert ev.devices == {"g0": "gpu0", "g1": "gpu1", "s0": "ssd0", "s1": "ssd1"}


def test_lp_forms_agree_and_gpu_cache_is_proportional():
    net = build_network(populate(tiny(5.0), TINY_PLACEMENT), work(gpu=0.2, cpu=0.3))
    a, b = solve_lp(net, formulation="paths"), solve_lp(net, formulation="edges")
    assert a.epoch_read_s == pytest.approx(b.epoch_read_s, rel=1e-7)
    assert a.storage_shares()["hbm:gpu0"] <= 0.1 + 1e-9


# ---- solvers on every built-in profile ---------------------------------------------------------------
def _cases(topo: Topology, n: int = 3) -> list[tuple[Topology, dict[str, str]]]:
    """The machine as described (if it holds GPUs and SSDs), and a few baseline placements of up to
    4 GPUs + 4 SSDs on its emptied chassis."""
    out = [(topo, {})] if topo.of_kind(Kind.gpu) and topo.of_kind(Kind.ssd) else []
    bare, _ = strip(topo)
    free = bare.empty_slots()
    inv = Inventory.simple(min(4, sum(Kind.gpu in s.accepts and s.width >= 16 for s in free)),
                           min(4, sum(Kind.ssd in s.accepts for s in free)))
    if bare.of_kind(Kind.gpu) or inv.count(Kind.gpu):
        out += [(bare, b.placement) for b in baseline_placements(bare, inv)][:n]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", builtin_names())
def test_backends_agree_and_lp_is_never_faster(name):
    cases = _cases(load_profile(name))
    if not cases:
        pytest.skip(f"{name}: no placement with a GPU and an SSD")
    for topo, placement in cases:
        net = build_network(populate(topo, placement), WorkloadSpec())
        nx_t = solve_maxflow(net, "networkx").epoch_read_s
        or_t = solve_maxflow(net, "ortools").epoch_read_s
        lp_t = solve_lp(net).epoch_read_s
        assert abs(nx_t - or_t) / nx_t < 1e-3, (name, placement)
        assert lp_t >= min(nx_t, or_t) * (1 - 2e-4), (name, placement)


def test_lp_never_faster_than_maxflow_on_many_placements():
    """To within the bisection's tolerance, which docs/planning.md states: the max-flow reports the upper
    end of its last interval, so it may read up to REL_TOL slower than the LP."""
    from pathlib import Path

    from moment.planner.maxflow import REL_TOL

    doc = " ".join((Path(__file__).parents[1] / "docs" / "planning.md").read_text().split())
    assert f"the LP is never faster than it, to within the bisection's tolerance: the bisection stops when its " \
           f"interval is {REL_TOL:.2%} wide" in doc and f"up to {REL_TOL:.2%} slower" in doc
    topo = load_profile("paper-machine-b")
    space = search.enumerate_placements(topo, Inventory.simple(2, 3))
    for placement in space.distinct[:: max(1, len(space.distinct) // 12)]:
        net = ChassisTemplate(topo).network(placement, WorkloadSpec())
        lp, mf = solve_lp(net).epoch_read_s, solve_maxflow(net, "ortools").epoch_read_s
        assert lp * (1 + 1e-9) >= mf / (1 + REL_TOL)


# ---- errors ----------------------------------------------------------------------------------------
def test_errors_are_moment_errors():
    with pytest.raises(MomentError, match="free slots"):
        make_plan(tiny(), Inventory.simple(3, 1), work())
    with pytest.raises(MomentError, match="no SSD"):
        evaluate(tiny(), {"g0": GPU}, work())
    with pytest.raises(MomentError, match="backend"):
        solve_maxflow(build_network(populate(tiny(), TINY_PLACEMENT), work()), "glpk")


def test_a_rate_too_small_for_the_solver_is_named_with_its_figure():
    """A valid but tiny rate (1e-9 GB/s: 1 byte/s against 200 GB an epoch) is under the share of the demand HiGHS
    keeps as a coefficient, so the link read as none and the LP said "is every GPU reachable?"; it names the
    link and its figure now. 1e-3 GB/s plans."""
    def machine(gbps: float) -> Topology:
        data = tiny().model_dump(exclude_none=True)
        data["nodes"][5]["link"] = {"bandwidth_gbps": gbps}  # bay s0: its SSD must serve half with data even
        return Topology.model_validate(data)

    net = build_network(populate(machine(1e-3), TINY_PLACEMENT), work())
    assert solve_lp(net, data="even").epoch_read_s == pytest.approx(100e9 / 1e6, rel=1e-6)  # half of 200 GB at 1 MB/s
    with pytest.raises(MomentError) as e:
        solve_lp(build_network(populate(machine(1e-9), TINY_PLACEMENT), work()), data="even")
    said = str(e.value)
    assert "link s0->sw0 (pcie) carries 1e-09 GB/s, less than 1e-09 of the 200 GB an epoch reads" in said, said
    assert "reachable" not in said


def test_the_lp_answers_the_same_rates_whatever_the_workload_size():
    """hunt-L D14: the LP counted T in seconds, so its rates (shares of the epoch's reads a second) grew with a
    tiny workload and shrank with a huge one: 1e-12 GB per GPU solved (screened) at 10.3 GB/s for 17.33, 1e-13
    was refused by HiGHS and 1e10 dropped the SSDs as too slow. T is counted in a unit near the epoch now."""
    from moment.planner.lp import solve_lp_batch

    topo = strip(load_profile("paper-machine-a"))[0]
    placement = {f"sw{i}-{slot}": GPU if slot.startswith("x16") else SSD for i in (0, 1)  # (its recommended)
                 for slot in ("x16a", "x16b", "bay0", "bay1", "bay2", "bay3")}
    for gb in (1e-12, 1e-9, 1.0, 1e9, 1e10):
        net = build_network(populate(topo, placement), WorkloadSpec(bytes_per_gpu_per_epoch=gb * GB))
        for sol in (solve_lp(net), solve_lp_batch([net], screen=True)[0]):
            assert gb * GB / sol.epoch_read_s / GB == pytest.approx(17 + 1 / 3, rel=1e-9), gb


def test_gb_per_gpu_outside_a_byte_to_an_exabyte_is_one_clear_error():
    """hunt-L D14: 1e-20 said "is every GPU reachable?" and 1e-300 "HiGHS refused the model" (with the LP's time
    unit they would plan, but the max-flow check divides by zero in floats that small): the input is named with
    its range, by the CLI's option or the service's field."""
    from moment.planner.api import workload_spec

    assert workload_spec(gb_per_gpu=1e-9).bytes_per_gpu_per_epoch == pytest.approx(1.0)
    for value in (1e-12, 1e-20, 1e-300, 2e9):
        with pytest.raises(MomentError) as e:
            workload_spec(gb_per_gpu=value)
        assert str(e.value).startswith(f"--gb-per-gpu {value:g}: the GB each GPU reads in an epoch must be between "
                                       "1e-09 (a byte) and 1e+09 (an exabyte)"), str(e.value)
        assert e.value.field == "gb_per_gpu" and "reachable" not in str(e.value)
    with pytest.raises(MomentError, match="^gb_per_gpu 1e-300: "):
        workload_spec(gb_per_gpu=1e-300, flag=lambda name: name)  # (the service's spelling)


# ---- baselines and planning ------------------------------------------------------------------------
def test_baselines_on_paper_machine_b():
    names = [b.name for b in baseline_placements(load_profile("paper-machine-b"), Inventory.simple(4, 8))]
    assert names[:5] == ["paper-a", "paper-b", "paper-c", "paper-d", "paper-moment"]
    assert "gpus-spread/ssds-spread" in names
    assert names == [b.name for b in baseline_placements(load_profile("paper-machine-b"), Inventory.simple(4, 8))]


def test_plan_is_deterministic_and_current_layout_is_a_baseline():
    machine = populate(tiny(), {"g0": GPU, "s0": SSD})
    a = make_plan(machine, Inventory.simple(2, 2), work(cpu=0.5), maxflow_backend="ortools")
    b = make_plan(machine, Inventory.simple(2, 2), work(cpu=0.5), maxflow_backend="ortools")
    assert a.model_dump() | {"search": None} == b.model_dump() | {"search": None}
    assert a.baselines[0].name == "current" and a.baselines[0].placement == {"g0": GPU, "s0": SSD}
    assert 1 <= a.search.solved <= a.search.capacity_classes <= a.search.distinct_candidates


@pytest.fixture
def few_candidates(monkeypatch):
    """Every 40th distinct candidate of the real search (the full search is bench/plan_time.py)."""
    real = search.enumerate_placements

    def sampled(topo, inventory, *, prune=True, **limits):
        space = real(topo, inventory, prune=prune, **limits)
        return search.SearchSpace(space.slots, space.models, space.rows[::40], space.raw_count)

    monkeypatch.setattr(search, "enumerate_placements", sampled)


def test_plan_paper_machine_b_beats_every_baseline(few_candidates):
    calls = []
    plan = make_plan(load_profile("paper-machine-b"), Inventory.simple(4, 8), WorkloadSpec(),
                     maxflow_backend="ortools", progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] == plan.search.capacity_classes >= plan.search.solved
    names = {b.name for b in plan.baselines}
    assert {"paper-a", "paper-b", "paper-c", "paper-d", "paper-moment"} <= names
    for b in plan.baselines:
        assert plan.predicted.epoch_read_s <= b.predicted.epoch_read_s * (1 + 1e-6), b.name
    assert plan.gain_vs_best_baseline is not None and plan.gain_vs_best_baseline >= 1 - 1e-6
    assert plan.predicted_maxflow.epoch_read_s <= plan.predicted.epoch_read_s * (1 + 2e-4)
    assert len(plan.devices) == 12 and plan.bottlenecks
    # no placement of 8 P5510s can beat the SSDs' aggregate read rate; the recommendation reaches it
    ssd_bound = WorkloadSpec().epoch_bytes() * WorkloadSpec().ssd_share / (8 * 6.5 * GB)
    assert plan.predicted.epoch_read_s == pytest.approx(ssd_bound, rel=1e-6)


def test_balanced_shares_keep_the_time_and_leave_no_ssd_idle():
    """Among equally fast LP optima the shares are spread in proportion to each SSD's read rate."""
    topo = load_profile("paper-machine-b")
    lay = topo.layouts["paper-c"]
    placement = {s: "A100-PCIe-40GB" for s in lay.gpu} | {s: "P5510" for s in lay.ssd}
    wl = WorkloadSpec(gpu_cache_share=0.3, cpu_cache_share=0.4)  # SSDs are then not the bottleneck
    net = ChassisTemplate(topo).network(placement, wl)
    plain, balanced = solve_lp(net, balance=False), solve_lp(net)
    assert balanced.epoch_read_s == pytest.approx(plain.epoch_read_s, rel=1e-6)
    ssd = [v for k, v in balanced.served_bytes.items() if k.startswith("ssd")]
    assert min(ssd) > 0.5 * max(ssd)


def test_the_requests_name_the_planners_max_flow_backends_and_default():
    """The CLI's and the service's request models state the backends and the default as values (they load before
    the planner's solvers, which must not load for `--help`): they are the planner's."""
    import typing

    from moment.planner import maxflow
    from moment.planner import requests as planner_requests
    from moment.service import schemas

    assert planner_requests.MAXFLOW_BACKENDS == maxflow.BACKENDS
    for model in (planner_requests.PlanRequest, schemas.PlanRequest):
        assert model.model_fields["maxflow_backend"].default == maxflow.DEFAULT_BACKEND, model
    assert set(typing.get_args(schemas.PlanRequest.model_fields["maxflow_backend"].annotation)) == set(maxflow.BACKENDS)


def test_a_socket_without_memory_holds_no_cpu_cache():
    """A socket of `memory_gib: 0` served the CPU cache's share as one of 256 GiB did: it holds none now, the other
    socket serves the share, and with no memory anywhere the SSDs read it (a slower epoch, never a faster one)."""
    inv, wl = Inventory.simple(2, 2), WorkloadSpec()
    shares = {}
    for mem in ((256, 256), (0, 256), (0, 0)):
        topo = load_profile("paper-machine-b", [f"nodes.cpu{i}.memory_gib={m}" for i, m in enumerate(mem)])
        plan = make_plan(topo, inv, wl)
        shares[mem] = ({k for k in plan.predicted.storage_shares if k.startswith("mem:")}, plan.predicted.epoch_read_s)
    assert shares[(256, 256)][0] == {"mem:cpu0", "mem:cpu1"} and shares[(0, 256)][0] == {"mem:cpu1"}
    assert shares[(0, 0)][0] == set() and shares[(0, 0)][1] > shares[(0, 256)][1] * (1 + 1e-6)


BRIDGED = """name: bridged
nodes:
  - {id: cpu0, kind: socket, memory_gib: 256, memory_bandwidth_gbps: 150}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: slot1, kind: slot, parent: rc0, width: 16, accepts: [gpu], link: {gen: 3, width: 4}}
  - {id: slot2, kind: slot, parent: rc0, width: 16, accepts: [gpu], link: {gen: 3, width: 4}}
  - {id: bay0, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
  - {id: bay1, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
  - {id: bay2, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
"""


def test_a_bridge_between_slots_joins_two_cards_of_one_model_that_takes_one(tmp_path):
    """Two T4s (no NVLink connector), or a T4 and an A100, on bridged slots read their peer's cache over the bridge
    as two A100s do (95.39 s against 103.81 s without it): only cards of one model that takes a bridge use it."""
    (tmp_path / "b.yaml").write_text(BRIDGED + "links:\n  - {a: slot1, b: slot2, kind: nvlink, count: 4}\n")
    (tmp_path / "n.yaml").write_text(BRIDGED)
    wl = WorkloadSpec()

    def epoch(profile: str, inventory: Inventory) -> float:
        return make_plan(load_profile(str(tmp_path / profile)), inventory, wl).predicted.epoch_read_s

    a100, t4 = Inventory.simple(2, 3), Inventory.simple(2, 3, "T4", "P5510")
    mixed = Inventory(items=[InventoryItem(model="T4", count=1), InventoryItem(model="A100-PCIe-40GB", count=1),
                             InventoryItem(model="P5510", count=3)])
    assert epoch("b.yaml", a100) < epoch("n.yaml", a100) * (1 - 0.05)  # the bridge carries the peer's reads
    for inv in (t4, mixed):
        assert epoch("b.yaml", inv) == pytest.approx(epoch("n.yaml", inv), rel=1e-9)
