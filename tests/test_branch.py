"""The branch and bound for machines whose placements are too many to list: the same optimum as
solving every distinct placement on small machines, a 64-slot machine of mixed slots in seconds
(the listing search ran for minutes without a word), and a time limit that says what it stopped at."""

from __future__ import annotations

import json

import pytest

from moment.cli import main
from moment.planner import branch, search
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory, InventoryItem, strip
from moment.topology.generate import mixed_chassis
from moment.topology.model import Topology
from moment.topology.profiles import load_profile, save_profile
from moment.workload.spec import WorkloadSpec

MIXED = Inventory(items=[InventoryItem(model=m, count=c) for m, c in
                         (("A100-PCIe-40GB", 1), ("T4", 1), ("P5510", 2), ("PM1743", 1))])
WORKLOADS = [WorkloadSpec(), WorkloadSpec(gpu_cache_share=0.0, cpu_cache_share=0.6),
             WorkloadSpec(gpu_cache_share=0.3, cpu_cache_share=0.0)]


def lp_times(template, placements, workload, memo: dict | None = None) -> list[float]:
    """Each placement's LP time, 64 LPs a batch; with `memo` (placement -> time, for one template and workload),
    a placement solved before is not solved again (the tree's leaves are mostly the listing's placements)."""
    memo = {} if memo is None else memo
    keys = [frozenset(p.items()) for p in placements]
    new = list({k: p for k, p in zip(keys, placements) if k not in memo}.items())
    for i in range(0, len(new), 64):
        batch = new[i:i + 64]
        for (k, _), s in zip(batch, solve_lp_batch([template.network(p, workload) for _, p in batch])):
            memo[k] = s.epoch_read_s
    return [memo[k] for k in keys]


def exhaustive_best(topo, inventory, workload, memo: dict | None = None) -> float:
    """Every placement of the listing search (one per symmetry class), each solved with the LP."""
    return min(lp_times(ChassisTemplate(topo), search.enumerate_placements(topo, inventory).distinct, workload, memo))


@pytest.mark.slow
@pytest.mark.parametrize("seed, inventory", [(0, Inventory.simple(2, 3)), (1, Inventory.simple(2, 3)),
                                             (3, Inventory.simple(2, 3)), (0, MIXED), (2, MIXED)],
                         ids=["2+3-0", "2+3-1", "2+3-3", "mixed-models-0", "mixed-models-2"])
def test_same_optimum_as_solving_every_placement(seed, inventory):
    """Small mixed machines (12 slots, two sockets, double-width covers), three workloads (SSD-bound,
    CPU-memory reads over the socket link, large GPU caches read by the peers)."""
    topo = mixed_chassis(12, seed=seed, root_complexes=2)
    for wl in WORKLOADS:
        res = branch.branch_and_bound(ChassisTemplate(topo), inventory, wl)
        assert res.proven_optimal and res.placement is not None
        assert res.epoch_read_s == pytest.approx(exhaustive_best(topo, inventory, wl), rel=1e-6)
        # the placement it names is valid and reaches that time on its own
        assert solve_lp_batch([ChassisTemplate(topo).network(res.placement, wl)])[0].epoch_read_s == \
            pytest.approx(res.epoch_read_s, rel=1e-9)


def _tree(bb: branch.BranchAndBound, slots: tuple = (), low: int = 0):
    """Every node of the search tree below (`slots`, `low`), bounds not used: (slots, taken, no_dw, low)."""
    for kid in bb._children(slots, low):
        yield kid
        if len(kid[0]) < len(bb.order):
            yield from _tree(bb, kid[0], kid[3])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 2, 5])
def test_every_bound_is_below_every_completion(seed):
    """The relaxation's LP never exceeds the LP time of any completion of the partial placement, and
    the bound given the best time so far B is a bound on the completions faster than B; the tree
    reaches the same optimum as the listing search (no placement lost to the slot groups)."""
    topo = mixed_chassis(10, seed=seed, root_complexes=2)
    tpl = ChassisTemplate(topo)
    inv = Inventory(items=[InventoryItem(model="A100-PCIe-40GB", count=1), InventoryItem(model="T4", count=1),
                           InventoryItem(model="P5510", count=1), InventoryItem(model="PM1743", count=1)])
    for wl in WORKLOADS:
        bb = branch.BranchAndBound(tpl, inv, wl)
        nodes = list(_tree(bb))
        leaves = [n for n in nodes if len(n[0]) == len(bb.order)]
        memo: dict = {}  # the leaves' LPs, solved once for both sides of the comparison
        exact = dict(zip((n[0] for n in leaves), lp_times(tpl, [bb._placement(n[0]) for n in leaves], wl, memo)))
        assert min(exact.values()) == pytest.approx(exhaustive_best(topo, inv, wl, memo), rel=1e-6)
        best = sorted(exact.values())[len(exact) // 2]  # a best-so-far some completions beat
        for slots, taken, no_dw, low in nodes[:: max(1, len(nodes) // 60)]:
            below = min(t for leaf, t in exact.items() if leaf[:len(slots)] == slots)
            state = (bb._placement(slots), taken, no_dw, len(slots), low)
            bb.best_t = float("inf")
            assert bb._bound([state])[0] <= below * (1 + 1e-6)
            bb.best_t = best  # capped at B: B, or a bound on the completions faster than B
            assert bb._bound([state])[0] <= below * (1 + 1e-6)


def test_alike_slots_behind_another_parent_are_not_interchangeable():
    """Four alike PCIe 4.0 x4 bays, the first two behind a switch with a PCIe 3.0 x4 uplink: only
    slots under one parent are interchangeable, so the SSDs go in the two bays on the root complex."""
    topo = Topology.model_validate({"name": "bays", "nodes": [
        {"id": "cpu0", "kind": "socket"},
        {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "sw", "kind": "switch", "parent": "rc0", "link": {"gen": 3, "width": 4}},
        *({"id": b, "kind": "slot", "parent": parent, "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}}
          for b, parent in (("a1", "sw"), ("a2", "sw"), ("b1", "rc0"), ("b2", "rc0"))),
        {"id": "g", "kind": "slot", "parent": "rc0", "width": 16, "link": {"gen": 4, "width": 16}}]})
    wl = WORKLOADS[2]
    res = branch.branch_and_bound(ChassisTemplate(topo), Inventory.simple(1, 2), wl)
    assert set(res.placement) == {"g", "b1", "b2"}
    assert res.epoch_read_s == pytest.approx(exhaustive_best(topo, Inventory.simple(1, 2), wl), rel=1e-6)


def test_make_plan_methods_agree_and_auto_lists_small_machines():
    topo = mixed_chassis(12, seed=1, root_complexes=2)
    inv = Inventory.simple(2, 3)
    auto = make_plan(topo, inv, WorkloadSpec())
    bnb = make_plan(topo, inv, WorkloadSpec(), method="branch-and-bound")
    assert auto.search.method == "exhaustive" and auto.search.distinct_candidates
    assert bnb.search.method == "branch-and-bound" and bnb.search.distinct_candidates is None
    assert bnb.search.raw_candidates == auto.search.raw_candidates and bnb.search.nodes
    assert bnb.predicted.epoch_read_s == pytest.approx(auto.predicted.epoch_read_s, rel=1e-6)
    assert bnb.search.proven_optimal and bnb.search.lower_bound_s is None


def test_64_mixed_slots_plan_in_seconds():
    """2 GPUs + 4 SSDs on 64 slots of three widths and generations: the listing gives up after its
    limit and the branch and bound proves the optimum, which no placement of 4 P5510 can beat (the
    SSDs' aggregate read rate)."""
    topo = mixed_chassis(64, seed=0)
    calls = []
    plan = make_plan(topo, Inventory.simple(2, 4), WorkloadSpec(), progress=lambda d, t: calls.append((d, t)))
    s = plan.search
    assert s.method == "branch-and-bound" and s.proven_optimal and s.raw_candidates == 264_207_015
    assert s.seconds_total < 60
    wl = WorkloadSpec()
    assert plan.predicted.epoch_read_s == pytest.approx(wl.epoch_bytes() * wl.ssd_share / (4 * 6.5e9), rel=1e-6)
    assert calls[-1] == (100, 100) and [d for d, _ in calls] == sorted(d for d, _ in calls)


@pytest.fixture
def clock(monkeypatch):
    """A clock that moves only when the branch and bound bounds a batch of nodes: a second each."""
    import time

    now = [0.0]
    real = branch.BranchAndBound._bound

    def bound(self, partials, **kw):
        now[0] += 1.0
        return real(self, partials, **kw)

    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(branch.BranchAndBound, "_bound", bound)
    return now


# 8 GPUs + 16 SSDs on this machine: the first dive (24 batches) finds the optimum, proving it takes
# about 180 batches in all
HARD = dict(slots=64, seed=4)


@pytest.mark.slow
def test_deadline_returns_the_best_so_far_with_a_bound(clock):
    tpl, inv, wl = ChassisTemplate(mixed_chassis(**HARD)), Inventory.simple(8, 16), WorkloadSpec()
    full = branch.branch_and_bound(tpl, inv, wl)
    assert full.proven_optimal and clock[0] > 60
    clock[0] = 0.0
    cut = branch.branch_and_bound(tpl, inv, wl, deadline=40.0)
    assert cut.placement is not None and not cut.proven_optimal
    # the open nodes' least bound: below the optimum (that is why the search went on), never above it
    assert cut.lower_bound_s < full.epoch_read_s * (1 - 1e-6) and cut.epoch_read_s >= full.epoch_read_s * (1 - 1e-6)
    clock[0] = 0.0
    first = branch.branch_and_bound(tpl, inv, wl, deadline=5.0)  # before the first dive is complete
    assert first.placement is not None and not first.proven_optimal
    assert first.lower_bound_s <= full.epoch_read_s * (1 + 1e-6) <= first.epoch_read_s * (1 + 2e-6)


@pytest.mark.slow
def test_plan_timeout_cli(tmp_path, capsys, clock):
    prof = tmp_path / "mixed.yaml"
    save_profile(mixed_chassis(**HARD), prof)
    argv = ["plan", "--profile", str(prof), "--gpus", "8", "--ssds", "16", "--timeout", "40"]
    assert main([*argv, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["search"]
    assert s["method"] == "branch-and-bound" and s["proven_optimal"] is False and 0 < s["lower_bound_s"]
    clock[0] = 0.0
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not proven optimal: the time limit stopped the search" in out and "no placement reads an epoch faster" in out
    for bad in ("0", "-1", "nan", "inf"):
        assert main(["plan", "--timeout", bad]) == 2
        assert f"--timeout {bad}: give a positive number of seconds" in capsys.readouterr().err


def test_a_limit_past_before_the_search_starts_recommends_the_first_placements(clock):
    """The deadline has passed when the branch and bound starts (counting took the whole limit): the
    root's bound and the first placements (the usual layouts and the greedy one) are solved all the
    same, so the plan recommends the best of them with a bound (it was an error: "no placement ... was
    complete within the time limit")."""
    clock[0] = 1e9
    tpl, inv, wl = ChassisTemplate(mixed_chassis(**HARD)), Inventory.simple(8, 16), WorkloadSpec()
    res = branch.branch_and_bound(tpl, inv, wl, deadline=1.0)
    first = branch.BranchAndBound(tpl, inv, wl)._first()  # the usual layouts that fit, and the greedy one
    assert res.placement in first and not res.proven_optimal and res.nodes == 1 + len(first)
    assert 0 < res.lower_bound_s < res.epoch_read_s
    assert solve_lp_batch([tpl.network(res.placement, wl)])[0].epoch_read_s == pytest.approx(res.epoch_read_s)
    plan = make_plan(mixed_chassis(**HARD), inv, wl, timeout=5)
    assert plan.devices and not plan.search.proven_optimal and plan.search.lower_bound_s < plan.predicted.epoch_read_s
    assert plan.predicted.epoch_read_s <= min(b.predicted.epoch_read_s for b in plan.baselines) * (1 + 1e-9)


BRIDGE = "links+={a: rc0-x16, b: rc1-x16a, kind: nvlink, count: 4}"


def test_a_listing_stopped_where_no_branch_and_bound_can_take_over_recommends_the_fastest_first_placement(capsys):
    """NVLink bridges on slots make the relaxation no bound, so no branch and bound takes over where the time
    limit stops the listing (it was an error: "no placement ... was complete within the time limit"): the
    fastest of the placements the branch and bound starts from, never slower than a usual layout, marked not
    proven optimal with no bound, and a note saying why; the same for the exhaustive search asked for by name."""
    topo, inv, wl = load_profile("paper-machine-b", [BRIDGE]), Inventory.simple(4, 8), WorkloadSpec()
    plan = make_plan(topo, inv, wl, timeout=1e-6)
    s = plan.search
    assert (s.method, s.proven_optimal, s.lower_bound_s, s.raw_candidates) == ("first-placements", False, None, None)
    tpl = ChassisTemplate(strip(topo)[0])
    first = branch.first_placements(tpl, inv, wl)
    times = [x.epoch_read_s for x in solve_lp_batch([tpl.network(p, wl) for p in first])]
    assert s.solved == len(first) > 2 and plan.placement in first
    assert plan.predicted.epoch_read_s == pytest.approx(min(times), rel=1e-9)
    assert plan.predicted.epoch_read_s <= min(b.predicted.epoch_read_s for b in plan.baselines) * (1 + 1e-9)
    assert any("NVLink bridges" in n and "no bound on the best" in n for n in plan.notes), plan.notes
    plain = make_plan(load_profile("paper-machine-b"), inv, wl, method="exhaustive", timeout=1e-6)
    assert plain.search.method == "first-placements" and any("method='exhaustive'" in n for n in plain.notes)
    argv = ["plan", "--profile", "paper-machine-b", "--set", BRIDGE, "--gpus", "4", "--ssds", "8", "--timeout", "1e-6"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not proven optimal: the time limit stopped the search before any bound on the best placement" in out
    assert f"search: the time limit stopped the listing of the placements; the {len(first)} distinct placements it " \
           "starts from solved (greedy ones and the usual layouts)" in out
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["search"]["method"] == "first-placements" and got["search"]["lower_bound_s"] is None


def test_time_limit_on_the_listing_search(monkeypatch):
    """paper-machine-b with a 20 GB/s socket link, 4 + 8, most reads from CPU memory: the listing
    solves its classes in batches (188 LPs); stopped after the first batch, the best of it comes back
    with the least bound of the classes left, and a limit that passes while listing leaves the branch and
    bound's first placements."""
    import time

    from moment.planner import plan as plan_module
    from moment.topology.profiles import load_profile

    topo = load_profile("paper-machine-b", ["links.0.bandwidth_gbps=20"])
    inv, wl = Inventory.simple(4, 8), WorkloadSpec(gpu_cache_share=0.0, cpu_cache_share=0.6)
    full = make_plan(topo, inv, wl)
    assert full.search.method == "exhaustive" and full.search.proven_optimal and full.search.solved > 4
    now = [0.0]
    real = plan_module.solve_lp_batch

    def solve_then_late(nets, **kw):  # the clock passes the limit once the first batch is solved
        out = real(nets, **kw)
        now[0] = 1e9
        return out

    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(plan_module, "solve_lp_batch", solve_then_late)
    cut = make_plan(topo, inv, wl, timeout=100)
    s = cut.search
    assert not s.proven_optimal and s.solved == 4
    assert s.lower_bound_s <= full.predicted.epoch_read_s * (1 + 1e-6) <= cut.predicted.epoch_read_s * (1 + 2e-6)
    ticks = iter(range(10**6))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))  # a second per look at the clock
    late = make_plan(topo, inv, wl, timeout=0.5)  # past the limit while listing: the branch and bound's first
    s = late.search
    assert s.method == "branch-and-bound" and not s.proven_optimal
    assert s.lower_bound_s <= full.predicted.epoch_read_s * (1 + 1e-6) <= late.predicted.epoch_read_s * (1 + 2e-6)


SIX = Inventory(items=[InventoryItem(model=m, count=c) for m, c in
                       (("A100-PCIe-40GB", 2), ("H100-PCIe-80GB", 2), ("L40S", 2), ("P5510", 4), ("PM1743", 4),
                        ("P4510", 4))])


def test_the_count_stops_at_its_deadline_and_is_unchanged_without_one():
    """Six models on asus-esc8000a-e12: the count's table holds 27,000 placed-vectors a node, and
    it ignored --timeout (11 s, now 0.4 s by joining the root's last child by look-up)."""
    import time

    from moment.topology.devices import strip
    from moment.topology.profiles import load_profile

    bare, _ = strip(load_profile("asus-esc8000a-e12"))
    assert search.count_valid(bare, SIX) == 4_399_779_384_000
    assert search.count_valid(bare, SIX, deadline=time.perf_counter()) is None


def test_a_count_past_the_time_limit_leaves_the_branch_and_bound_its_share(monkeypatch):
    """Counting or listing may use half of --timeout; past that the branch and bound searches with the
    rest and recommends its best (it was an error, after the count had run for minutes)."""
    import time

    from moment.planner.search import Timeout
    from moment.topology.profiles import load_profile

    def slow_count(slots, bound, deadline=None):  # a count too large for any time limit
        assert deadline is not None
        time.sleep(max(deadline - time.perf_counter(), 0) + 0.01)
        raise Timeout()

    monkeypatch.setattr(search, "count_placements", slow_count)
    t0 = time.perf_counter()
    plan = make_plan(load_profile("asus-esc8000a-e12"), SIX, WorkloadSpec(), timeout=4)
    assert time.perf_counter() - t0 < 4.5
    assert plan.search.method == "branch-and-bound" and plan.search.raw_candidates is None and plan.devices


def alike_switches(switches: int, bays: int) -> Topology:
    """hunt-C-many.yaml's shape: one root complex, `switches` alike PCIe 5.0 x16 switches, each with
    a x16 GPU slot and `bays` x4 SSD bays."""
    nodes = [{"id": "cpu0", "kind": "socket"}, {"id": "rc0", "kind": "root_complex", "parent": "cpu0"}]
    for i in range(switches):
        nodes += [{"id": f"sw{i}", "kind": "switch", "parent": "rc0", "link": {"gen": 5, "width": 16}},
                  {"id": f"g{i}", "kind": "slot", "parent": f"sw{i}", "width": 16, "link": {"gen": 5, "width": 16}},
                  *({"id": f"b{i}_{k}", "kind": "slot", "parent": f"sw{i}", "width": 4, "accepts": ["ssd"],
                     "link": {"gen": 4, "width": 4}} for k in range(bays))]
    return Topology.model_validate({"name": "alike", "nodes": nodes})


def test_alike_switches_are_searched_once():
    """2 GPUs on 4 alike switches: the 6 pairs of GPU slots are one placement up to the machine's
    symmetry (`search.placement_key`), so the SSDs are placed below one of them only; the optimum is
    the listing search's."""
    topo, inv, wl = alike_switches(4, 3), Inventory.simple(2, 5), WORKLOADS[1]
    bb = branch.BranchAndBound(ChassisTemplate(topo), inv, wl)
    pairs = [(f"g{i}", f"g{j}") for i in range(4) for j in range(i + 1, 4)]
    assert [bb._fresh(p) for p in pairs] == [True] + [False] * 5
    assert bb._fresh(("g0",)) and bb._fresh(("g3",))  # within a model the low group tells them apart
    res = branch.branch_and_bound(ChassisTemplate(topo), inv, wl)
    assert res.proven_optimal and res.epoch_read_s == pytest.approx(exhaustive_best(topo, inv, wl), rel=1e-6)


def test_a_long_dive_is_not_needed_to_prove_the_optimum():
    """2 GPUs + 120 SSDs on 4 alike switches: a dive of the search bounds every device's children
    (hunt-C-many.yaml, 500 SSDs: 2,258 LPs of 500 SSDs, 96 s); the greedy placement reaches the root's
    bound, so the search ends at the root."""
    res = branch.branch_and_bound(ChassisTemplate(alike_switches(4, 60)), Inventory.simple(2, 120), WorkloadSpec())
    assert res.proven_optimal and res.nodes < 10


def test_equally_fast_first_placements_keep_wide_slots_free():
    """asus-esc8000a-e12, 4 GPUs + 8 SSDs: the SSDs set the time, so many placements tie; the greedy
    placement that takes the narrowest slots first is kept over the usual layouts that put SSDs in
    x16 GPU slots (the listing's tie-break: fewer wide-slot lanes wasted)."""
    from moment.planner.tiebreak import wasted_lanes
    from moment.topology.profiles import load_profile

    topo = load_profile("asus-esc8000a-e12")
    plan = make_plan(topo, Inventory.simple(4, 8), WorkloadSpec())
    assert plan.search.method == "branch-and-bound" and plan.search.proven_optimal
    assert wasted_lanes(plan.placement, topo) == 0
    assert plan.predicted.epoch_read_s <= min(b.predicted.epoch_read_s for b in plan.baselines) * (1 + 1e-9)
