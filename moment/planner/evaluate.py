"""Evaluate one placement: populate the chassis, build the capacity graph, solve, report per link."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moment.errors import MomentError
from moment.planner.contracts import Evaluation, LinkUse, Prediction
from moment.planner.lp import solve_lp
from moment.planner.maxflow import DEFAULT_BACKEND, solve_maxflow
from moment.planner.network import TIER_CPU, TIER_GPU, ChassisTemplate, FlowNetwork, build_network
from moment.planner.solution import Solution
from moment.topology.bandwidth import GB
from moment.topology.devices import populate
from moment.topology.model import Topology
from moment.workload.spec import WorkloadSpec

#: a link at or above this utilisation in the LP solution is reported as a bottleneck
BOTTLENECK_UTILISATION = 0.999
_STORAGE_KIND = {TIER_GPU: "hbm", TIER_CPU: "memory"}


def prediction(sol: Solution) -> Prediction:
    inlet = [r / GB for r in sol.per_gpu_inlet()]
    lo = min(inlet)
    return Prediction(
        solver=sol.solver,
        gpus=list(sol.network.gpus),
        per_gpu_inlet_gbps=inlet,
        aggregate_gbps=sum(inlet),
        epoch_read_s=sol.epoch_read_s,
        imbalance=max(inlet) / lo - 1.0 if lo > 0 else 0.0,
        storage_shares=sol.storage_shares(),
    )


def link_uses(sol: Solution) -> list[LinkUse]:
    """Every directed link (and storage read limit) that carries load or is saturated.

    Unlimited internal hops (socket <-> root complex without a figure) are left out: they cannot
    be a bottleneck and have no capacity to compare with. A storage node's read limit gets its own
    row (`ssd3:read`) unless a single outgoing link of the same capacity already shows it.
    """
    net = sol.network
    T = sol.epoch_read_s
    out: list[LinkUse] = []
    seen: dict[str, int] = {}
    tiny = net.total_demand / T * 1e-9
    for e, b in zip(net.edges, sol.edge_bytes):
        if not np.isfinite(e.capacity):
            continue
        out.append(_use(e.id, e.src, e.dst, e.kind, e.label, e.capacity, float(b) / T, tiny, seen))
    for s in net.storage:
        outs = [e for e in net.edges if e.u == s.id]
        if not np.isfinite(s.limit) or (len(outs) == 1 and outs[0].capacity == s.limit):
            continue
        out.append(_use(f"{s.id}:read", s.id, s.owner, _STORAGE_KIND.get(s.tier, "ssd"), None, s.limit,
                        sol.served_bytes[s.id] / T, tiny, seen))
    return [u for u in out if u is not None]


def _use(lid, src, dst, kind, label, cap, load, tiny, seen) -> LinkUse | None:
    util = load / cap if cap > 0 else 0.0
    bottleneck = util >= BOTTLENECK_UTILISATION
    if load <= tiny and not bottleneck:
        return None
    seen[lid] = seen.get(lid, 0) + 1
    if seen[lid] > 1:  # parallel links between the same pair
        lid = f"{lid}#{seen[lid]}"
    return LinkUse(id=lid, src=src, dst=dst, kind=kind, label=label, capacity_gbps=cap / GB,
                   load_gbps=load / GB, utilisation=min(util, 1.0), bottleneck=bottleneck)


def solve(net: FlowNetwork, solvers: Sequence[str], maxflow_backend: str) -> dict[str, Solution]:
    """`solvers`: 'lp' (the realisable LP, shares chosen by it), 'even' (the same LP with the data
    spread evenly over the SSDs) and 'maxflow' (the paper's)."""
    unknown = set(solvers) - {"lp", "even", "maxflow"}
    if unknown or not solvers:
        raise MomentError(f"unknown solver(s) {sorted(unknown) or '(none)'}", hint="use 'lp', 'even' and/or 'maxflow'")
    out = {}
    if "lp" in solvers:
        out["lp"] = solve_lp(net)
    if "even" in solvers:
        out["even"] = solve_lp(net, data="even")
    if "maxflow" in solvers:
        out["maxflow"] = solve_maxflow(net, maxflow_backend)
    return out


def evaluate(topo_bare: Topology, placement: dict[str, str], workload: WorkloadSpec, *,
             solvers: Sequence[str] = ("lp", "even", "maxflow"), maxflow_backend: str = DEFAULT_BACKEND,
             data: str = "planned", template: ChassisTemplate | None = None) -> Evaluation:
    """Predict a placement with each solver; links and bottlenecks come from the LP under `data` (the
    realisable one: 'planned' or 'even', which must be among `solvers`) when it ran, else from max-flow.
    `template`: `topo_bare` parsed once, for callers that evaluate many placements (the same graph,
    without populating a copy of the machine for each; the placement is then taken as valid)."""
    if ("even" in solvers and "lp" not in solvers) or (data == "even" and "even" not in solvers):
        raise ValueError("the even-data LP comes with the planned one ('lp'), and data 'even' needs it")
    if template is not None:
        assert template.topo is topo_bare, "a template of this chassis"
        ids = template.device_ids(placement)
        net, devices = template.network(placement, workload), {slot: ids[slot] for slot in placement}  # (as below)
    else:
        topo = populate(topo_bare, placement)
        net = build_network(topo, workload)
        devices = {slot: topo.occupant(slot).id for slot in placement}
    sols = solve(net, solvers, maxflow_backend)
    main = sols["even"] if data == "even" else sols.get("lp") or sols["maxflow"]
    return Evaluation(
        placement=dict(placement),
        devices=devices,
        predicted=prediction(sols.get("lp") or main),
        predicted_even=prediction(sols["even"]) if "even" in sols else None,
        predicted_maxflow=prediction(sols["maxflow"]) if "maxflow" in sols and "lp" in sols else None,
        links=link_uses(main),
    )
