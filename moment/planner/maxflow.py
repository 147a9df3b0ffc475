"""The paper's solver: bisection on T with max-flow (section 3.2), each GPU's sink edge = its demand.

Graph: source -> tier node (GPU caches: gpu_cache_share of all bytes; CPU memory: cpu_cache_share;
SSDs: unlimited) -> storage node (its serving limit * T; a GPU cache also at most its proportional
part of the GPU share, as in the LP) -> physical edges (capacity * T) -> GPU -> sink (its demand).
T is feasible iff the max flow carries the whole demand; feasibility is monotone in T, so bisect.

Backends: `networkx` (preflow-push on floats, bytes scaled so that the total demand is 1) and
`ortools` (SimpleMaxFlow, integers). For OR-Tools one unit is total_demand / 2**40 bytes (about
0.7 MB for the default workload); capacities are rounded *down* to whole units and clamped at the
total demand (no edge can carry more than everything), demands are rounded to the nearest unit.
Rounding down never over-promises; the relative error it adds to T is about (edges / 2**40).
"""

from __future__ import annotations

import math

import numpy as np

from moment.errors import MomentError
from moment.planner.network import TIER_CPU, TIER_GPU, FlowNetwork
from moment.planner.solution import Solution

# Imports inside functions: a solver's or renderer's library (networkx, OR-Tools, SciPy, matplotlib) loads
# only when it is used.

BACKENDS = ("networkx", "ortools")
#: what a plan, a layout's re-evaluation and any prediction not naming a backend use (OR-Tools: loads in half
#: of networkx's time, 0.07 against 0.14 s, and solves in C++)
DEFAULT_BACKEND = "ortools"
#: bisection stops when hi / lo <= 1 + REL_TOL
REL_TOL = 1e-4
#: a max flow within this fraction of the demand counts as carrying all of it
FEASIBLE_TOL = 1e-9
ORTOOLS_UNITS = 2**40
_SRC, _SNK = "__source__", "__sink__"


class _Arcs:
    """The max-flow arcs: (tail, head, per-second capacity scaled by T, fixed capacity)."""

    def __init__(self, net: FlowNetwork):
        total = net.total_demand
        self.tail: list[str] = []
        self.head: list[str] = []
        self.rate: list[float] = []  # multiplied by T (fraction of total demand per second); inf = none
        self.fixed: list[float] = []  # not scaled (fraction of total demand); inf = none
        self.edge_arc: list[int] = []  # arc carrying each physical edge
        self.storage_arc: dict[str, int] = {}
        tiers = {TIER_GPU: f"__tier:{TIER_GPU}__", TIER_CPU: f"__tier:{TIER_CPU}__"}
        self._add(_SRC, tiers[TIER_GPU], math.inf, net.gpu_cache_share)
        self._add(_SRC, tiers[TIER_CPU], math.inf, net.cpu_cache_share)
        for s, cap in zip(net.storage, net.share_caps()):
            tail = tiers.get(s.tier, _SRC)
            self.storage_arc[s.id] = self._add(tail, s.id, s.limit / total, cap)
        seen: set[tuple[str, str]] = set()
        for i, e in enumerate(net.edges):
            if (e.u, e.v) in seen:  # parallel links: route through a mid node (DiGraph has one edge per pair)
                mid = f"__edge{i}__"
                self.edge_arc.append(self._add(e.u, mid, e.capacity / total, math.inf))
                self._add(mid, e.v, math.inf, math.inf)
            else:
                seen.add((e.u, e.v))
                self.edge_arc.append(self._add(e.u, e.v, e.capacity / total, math.inf))
        self.sink_arc = {g: self._add(g, _SNK, math.inf, net.demand[g] / total) for g in net.gpus}

    def _add(self, u: str, v: str, rate: float, fixed: float) -> int:
        self.tail.append(u)
        self.head.append(v)
        self.rate.append(rate)
        self.fixed.append(fixed)
        return len(self.tail) - 1

    def capacities(self, T: float) -> np.ndarray:
        """Fraction-of-demand capacity of each arc at time T (inf where unlimited)."""
        return np.minimum(np.asarray(self.rate) * T, np.asarray(self.fixed))


class _NetworkX:
    def __init__(self, arcs: _Arcs):
        import networkx as nx

        self.nx = nx
        self.arcs = arcs
        self.g = nx.DiGraph()
        for u, v in zip(arcs.tail, arcs.head):
            self.g.add_edge(u, v)

    def _set(self, T: float) -> None:
        for u, v, c in zip(self.arcs.tail, self.arcs.head, self.arcs.capacities(T)):
            attrs = self.g[u][v]
            if math.isinf(c):
                attrs.pop("capacity", None)  # networkx: no attribute = unlimited
            else:
                attrs["capacity"] = float(c)

    def value(self, T: float) -> float:
        from networkx.algorithms.flow import preflow_push

        self._set(T)
        return float(self.nx.maximum_flow_value(self.g, _SRC, _SNK, flow_func=preflow_push))

    def flows(self, T: float) -> np.ndarray:
        from networkx.algorithms.flow import preflow_push

        self._set(T)
        _, fd = self.nx.maximum_flow(self.g, _SRC, _SNK, flow_func=preflow_push)
        return np.array([fd[u][v] for u, v in zip(self.arcs.tail, self.arcs.head)], dtype=float)


class _OrTools:
    def __init__(self, arcs: _Arcs):
        from ortools.graph.python import max_flow

        names = sorted(set(arcs.tail) | set(arcs.head))
        self.id = {n: i for i, n in enumerate(names)}
        self.arcs = arcs
        self.mf = max_flow.SimpleMaxFlow()
        tails = np.array([self.id[u] for u in arcs.tail], dtype=np.int32)
        heads = np.array([self.id[v] for v in arcs.head], dtype=np.int32)
        self.arc_ids = np.asarray(
            self.mf.add_arcs_with_capacity(tails, heads, np.zeros(len(tails), dtype=np.int64)), dtype=np.int32)

    def _solve(self, T: float) -> float:
        cap = self.arcs.capacities(T)
        units = np.floor(np.minimum(cap, 1.0) * ORTOOLS_UNITS).astype(np.int64)
        sink = np.array(list(self.arcs.sink_arc.values()))
        units[sink] = np.rint(np.minimum(cap[sink], 1.0) * ORTOOLS_UNITS).astype(np.int64)
        self.mf.set_arcs_capacity(self.arc_ids, units)
        status = self.mf.solve(self.id[_SRC], self.id[_SNK])
        if status != self.mf.OPTIMAL:
            raise RuntimeError(f"OR-Tools max flow failed with status {status}")
        return float(self.mf.optimal_flow()) / ORTOOLS_UNITS

    def value(self, T: float) -> float:
        return self._solve(T)

    def flows(self, T: float) -> np.ndarray:
        self._solve(T)
        return np.asarray(self.mf.flows(self.arc_ids), dtype=float) / ORTOOLS_UNITS


def solve_maxflow(net: FlowNetwork, backend: str = DEFAULT_BACKEND, *, rel_tol: float = REL_TOL) -> Solution:
    if backend not in BACKENDS:
        raise MomentError(f"unknown max-flow backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}")
    net.check_servable()
    arcs = _Arcs(net)
    engine = _NetworkX(arcs) if backend == "networkx" else _OrTools(arcs)
    need = sum(net.demand[g] for g in net.gpus) / net.total_demand  # == 1
    need_units = need * (1 - FEASIBLE_TOL) - (len(arcs.tail) / ORTOOLS_UNITS if backend == "ortools" else 0.0)

    def feasible(T: float) -> bool:
        return engine.value(T) >= need_units

    lo = _lower_bound(net)
    if not feasible(lo * 2.0**60):
        raise MomentError("some GPU cannot receive its data at any speed",
                          hint="is every GPU connected to the storage (check links and slots)?")
    hi = lo
    while not feasible(hi):
        lo, hi = hi, hi * 2.0
    while hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    flows = engine.flows(hi) * net.total_demand
    edge_bytes = flows[np.asarray(arcs.edge_arc, dtype=np.int64)]
    served = {s: float(flows[a]) for s, a in arcs.storage_arc.items()}
    received = {g: float(flows[a]) for g, a in arcs.sink_arc.items()}
    return Solution(f"maxflow-{backend}", hi, edge_bytes, served, received, net)


def _lower_bound(net: FlowNetwork) -> float:
    """No GPU is fed faster than the sum of its inbound links; no storage faster than its limits."""
    bounds = [net.total_demand / sum(s.limit for s in net.storage)]
    for g in net.gpus:
        inbound = sum(e.capacity for e in net.edges if e.v == g)
        if inbound > 0 and math.isfinite(inbound):
            bounds.append(net.demand[g] / inbound)
    return max(bounds)
