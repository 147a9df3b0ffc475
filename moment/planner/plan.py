"""Recommend a placement: search the candidates with the LP, then explain the winner and baselines.

The search solves only the realisable LP, in batches of block-diagonal LPs (one HiGHS call per
batch) on networks built from a parsed chassis template (no pydantic per candidate). The winner
and every baseline are then evaluated with both solvers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from moment.errors import MomentError
from moment.planner import search
from moment.planner.baselines import baseline_placements
from moment.planner.contracts import Baseline, Evaluation, Plan, SearchStats
from moment.planner.evaluate import BOTTLENECK_UTILISATION, evaluate
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate, Edge
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


def _headroom_key(sol: Solution, slots: set[str]) -> tuple[float, ...]:
    """Link utilisations, highest first, rounded: among equally fast placements prefer the one whose
    busiest link is least busy, then the second busiest, and so on (leximax). A slot's own link is
    in series with its card's and carries the same load; it counts only where it is the narrower
    of the two, so an x4 SSD in an x16 slot does not look like "headroom"."""
    edges = sol.network.edges
    devices = set(sol.network.gpus) | {s.owner for s in sol.network.storage}
    card = {e.src: e.capacity for e in edges if e.src in slots and e.dst in devices}
    card |= {e.dst: e.capacity for e in edges if e.dst in slots and e.src in devices}
    util = sol.utilisation()
    keep = [i for i, e in enumerate(edges) if not _redundant_slot_edge(e, slots, card, devices)]
    return tuple(np.round(np.sort(util[keep])[::-1], 3))


def _redundant_slot_edge(e: Edge, slots: set[str], card: dict[str, float], devices: set[str]) -> bool:
    slot = e.src if e.src in slots else e.dst if e.dst in slots else None
    if slot is None or slot not in card:
        return False
    other = e.dst if slot == e.src else e.src
    return other not in devices and e.capacity >= card[slot]


def _wasted_lanes(placement: dict[str, str], template: ChassisTemplate) -> int:
    """Lanes of wide slots taken by narrow cards (kept free for later GPUs)."""
    topo = template.topo
    return sum(topo.node(s).width - find_model(m).lanes for s, m in placement.items())


def make_plan(topo: Topology, inventory: Inventory, workload: WorkloadSpec, *,
              maxflow_backend: str = "networkx",
              progress: Callable[[int, int], None] | None = None) -> Plan:
    """Search every distinct placement of `inventory` into `topo`'s chassis; least LP epoch time wins,
    ties go to more link headroom (leximax of utilisations), then fewer lanes of wide slots taken by
    narrow cards, then the lexicographically first placement. Devices already in slots are taken out first; their layout becomes baseline 'current'."""
    t0 = time.perf_counter()
    bare, current = strip(topo)
    _check_inventory(bare, inventory)
    space = search.enumerate_placements(bare, inventory)
    distinct: dict[tuple, dict[str, str]] = {}
    for p in space.distinct:
        distinct.setdefault(_key(p), p)
    cands = list(distinct.values())
    if not cands:
        raise MomentError(f"the inventory ({inventory.describe()}) cannot be placed in {bare.name!r}")

    template = ChassisTemplate(bare)
    slots = set(template.chassis.slots)
    t_solve = time.perf_counter()
    scores: list[tuple[float, tuple[float, ...], tuple]] = []
    for i in range(0, len(cands), BATCH):
        chunk = cands[i:i + BATCH]
        sols = solve_lp_batch([template.network(p, workload) for p in chunk])
        scores += [(s.epoch_read_s, _headroom_key(s, slots), _key(p)) for s, p in zip(sols, chunk)]
        if progress is not None:
            progress(len(scores), len(cands))
    solve_seconds = time.perf_counter() - t_solve

    t_min = min(s[0] for s in scores)
    tied = [s for s in scores if s[0] <= t_min * (1 + TIE_REL)]
    best = min(tied, key=lambda s: (s[1], _wasted_lanes(dict(s[2]), template), s[2]))
    winner = evaluate(bare, dict(best[2]), workload, maxflow_backend=maxflow_backend)

    baselines = _baselines(bare, current, inventory, workload, maxflow_backend)
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
        search=SearchStats(raw_candidates=space.raw_count, distinct_candidates=len(cands), solved=len(scores),
                           seconds_total=time.perf_counter() - t0,
                           seconds_per_solve=solve_seconds / len(scores)),
        baselines=baselines,
        gain_vs_best_baseline=gain,
    )


def _baselines(bare: Topology, current: dict[str, str], inventory: Inventory, workload: WorkloadSpec,
               backend: str) -> list[Baseline]:
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
        out.append(Baseline(name=name, description=desc, placement=placement, predicted=ev.predicted,
                            predicted_maxflow=ev.predicted_maxflow))
    return out

