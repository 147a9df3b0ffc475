"""Recommend a placement: search the candidates with the LP, then explain the winner and baselines.

The search solves only the realisable LP, in batches of block-diagonal LPs (one HiGHS call per
batch) on networks built from a parsed chassis template (no pydantic per candidate). The winner
and every baseline are then evaluated with both solvers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from moment.errors import MomentError
from moment.planner import search
from moment.planner.baselines import baseline_placements
from moment.planner.contracts import Baseline, Evaluation, Plan, SearchStats
from moment.planner.equivalence import CapacityCanon, TreeBound
from moment.planner.evaluate import BOTTLENECK_UTILISATION, evaluate
from moment.planner.explain import explain
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate
from moment.planner.solution import Solution
from moment.topology.devices import Inventory, find_model, fits, strip
from moment.topology.model import Kind, Topology
from moment.workload.spec import WorkloadSpec

#: candidates per HiGHS call
BATCH = 64
#: epoch times within this relative distance are a tie
TIE_REL = 1e-6


def _check_inventory(bare: Topology, inventory: Inventory) -> None:
    models = inventory.models()
    if not models:
        raise MomentError("the inventory is empty", hint="e.g. --gpus 4 --ssds 8")
    if not inventory.count(Kind.gpu) and not bare.of_kind(Kind.gpu):
        raise MomentError("the inventory has no GPU and the machine holds none: there is nothing to feed")
    free = bare.empty_slots()
    for m, count in models:
        room = sum(fits(s, m) for s in free)
        if count > room:
            raise MomentError(
                f"{count} x {m.name} need {count} free slots that take a {m.kind.value} "
                f"(x{m.lanes} or wider), but {bare.name!r} has only {room}")
    needed = sum(c for _, c in models)
    if needed > len(free):
        raise MomentError(f"the inventory ({inventory.describe()}) needs {needed} slots, "
                          f"but {bare.name!r} has only {len(free)} free")


def _key(placement: dict[str, str]) -> tuple:
    return tuple(sorted(placement.items()))


def _wasted_lanes(placement: dict[str, str], template: ChassisTemplate) -> int:
    """Lanes of wide slots taken by narrow cards (kept free for later GPUs)."""
    topo = template.topo
    return sum(topo.node(s).width - find_model(m).lanes for s, m in placement.items())


def make_plan(topo: Topology, inventory: Inventory, workload: WorkloadSpec, *,
              maxflow_backend: str = "ortools",
              progress: Callable[[int, int], None] | None = None) -> Plan:
    """Search every distinct placement of `inventory` into `topo`'s chassis; least LP epoch time wins,
    ties go to the loosest tightest link (leximax of the per-link bounds), then fewer lanes of wide
    slots taken by narrow cards, then slot order. Devices already in slots are taken out first; their
    layout becomes baseline 'current'."""
    t0 = time.perf_counter()
    bare, current = strip(topo)
    _check_inventory(bare, inventory)
    space = search.enumerate_placements(bare, inventory)
    cands = space.distinct
    if not cands:
        raise MomentError(f"the inventory ({inventory.describe()}) cannot be placed in {bare.name!r}")

    template = ChassisTemplate(bare)
    # one LP per capacity-equivalence class; its representative wastes the fewest wide-slot lanes
    canon = CapacityCanon(template)
    classes: dict = {}
    for p in cands:
        k = canon.key(p)
        rank = (_wasted_lanes(p, template), _key(p))
        if k not in classes or rank < classes[k][0]:
            classes[k] = (rank, p)
    # Branch and bound on a cheap lower bound: solve in bound order until no unsolved class can
    # beat the best time; then, among the classes that could tie it, take the first (by link
    # headroom of the bound, then slot order) whose LP reaches it.
    bound = TreeBound(template)
    ranked = []
    for (lanes, key), p in classes.values():
        lb, links = bound.bound(p, workload)
        ranked.append((lb, (links, lanes, key), p))
    ranked.sort(key=lambda r: (r[0], r[1]))
    t_solve = time.perf_counter()
    solved: dict[tuple, Solution] = {}

    def solve(batch: list[dict[str, str]]) -> None:
        sols = solve_lp_batch([template.network(p, workload) for p in batch])
        solved.update((_key(p), s) for p, s in zip(batch, sols))
        if progress is not None:
            progress(len(solved), len(ranked))

    best_t, i, size = float("inf"), 0, 4
    while i < len(ranked) and ranked[i][0] < best_t * (1 - TIE_REL):
        batch = [r[2] for r in ranked[i:i + size] if r[0] < best_t * (1 - TIE_REL)]
        size = min(BATCH, size * 2)  # small first: the first classes often settle the optimum
        solve(batch)
        best_t = min(best_t, *(solved[_key(p)].epoch_read_s for p in batch))
        i += len(batch)
    contenders = sorted((r for r in ranked if r[0] <= best_t * (1 + TIE_REL)), key=lambda r: r[1])
    winner_key = None
    for j, (_, _, p) in enumerate(contenders):
        if _key(p) not in solved:
            solve([q for _, _, q in contenders[j:j + 8] if _key(q) not in solved])
        if solved[_key(p)].epoch_read_s <= best_t * (1 + TIE_REL):
            winner_key = _key(p)
            break
    assert winner_key is not None  # the class that set best_t is among the contenders
    if progress is not None:
        progress(len(ranked), len(ranked))  # the rest are ruled out by their bound
    solve_seconds = time.perf_counter() - t_solve

    winner = evaluate(bare, dict(winner_key), workload, maxflow_backend=maxflow_backend)

    evaluated = _baselines(bare, current, inventory, workload, maxflow_backend)
    baselines = [b for b, _ in evaluated]
    gain = (min(b.predicted.epoch_read_s for b in baselines) / winner.predicted.epoch_read_s
            if baselines else None)
    return Plan(
        machine=topo.name,
        inventory=inventory.describe(),
        workload=workload,
        placement=winner.placement,
        devices=winner.devices,
        predicted=winner.predicted,
        predicted_maxflow=winner.predicted_maxflow,
        links=winner.links,
        bottlenecks=[u.id for u in winner.links if u.utilisation >= BOTTLENECK_UTILISATION],
        search=SearchStats(raw_candidates=space.raw_count, distinct_candidates=len(cands),
                           capacity_classes=len(classes), solved=len(solved),
                           seconds_total=time.perf_counter() - t0,
                           seconds_per_solve=solve_seconds / len(solved)),
        baselines=baselines,
        gain_vs_best_baseline=gain,
        explanation=explain(bare, winner, [(b.name, ev) for b, ev in evaluated]),
    )


def _baselines(bare: Topology, current: dict[str, str], inventory: Inventory, workload: WorkloadSpec,
               backend: str) -> list[tuple[Baseline, Evaluation]]:
    named: list[tuple[str, str, dict[str, str]]] = []
    if current:
        named.append(("current", "the layout the machine has now", current))
    named += [(b.name, b.description, b.placement) for b in baseline_placements(bare, inventory)]
    out = []
    for name, desc, placement in named:
        try:
            ev: Evaluation = evaluate(bare, placement, workload, maxflow_backend=backend)
        except MomentError:
            if name == "current":
                continue  # e.g. a scanned device model the catalogue does not know
            raise
        out.append((Baseline(name=name, description=desc, placement=placement, predicted=ev.predicted,
                             predicted_maxflow=ev.predicted_maxflow,
                             bottlenecks=[u.id for u in ev.links if u.bottleneck]), ev))
    return out

