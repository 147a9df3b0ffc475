"""The realisable solver (default): one shared data placement, every GPU reads every storage node.

Variables: p_s (share of all accesses served by storage node s), T, and f[g, e] (bytes for GPU g on
edge e, one commodity per destination GPU, so a GPU may split its reads over NVLink and PCIe).
Storage node s injects D_g * p_s into commodity g; GPU g absorbs D_g; sum_g f[g, e] <= c_e * T;
sum_g D_g * p_s <= L_s * T; sum p = 1; GPU caches at most their proportional part of the GPU share,
CPU memory at most the CPU share; SSDs take the rest. Minimise T.

Free max-flow (the paper's solver) drops "every GPU reads from every node in proportion" and so
is a relaxation of this LP: its T is never larger.

Backend: HiGHS (`planner.highs`, called as scipy's `linprog(method="highs")` calls it) with sparse
matrices. The model is built as NumPy index arrays in one go, so building costs far less than solving; OR-Tools GLOP would need a
Python call per variable and constraint, which costs more than the solve at these sizes.

With the data spread evenly (`data="even"`: hash or round-robin placement of the rows over the
SSDs) the SSD shares are not the LP's to choose: each SSD serves an equal part of what the caches
leave, and the LP finds the least T for that placement (`_fix_even`).

Units inside: bytes divided by the total epoch demand (flows are O(1)); T in seconds, or, for an epoch far
from a second (a workload of bytes or of exabytes), in a power of two of seconds near it (`_time_unit`), so
that the coefficients stay in the range HiGHS solves accurately whatever the workload's size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from moment.errors import MomentError
from moment.planner.contracts import DATA_PLACEMENTS
from moment.planner.highs import SMALL_MATRIX_VALUE, linprog
from moment.planner.network import TIER_CPU, TIER_GPU, TIER_SSD, FlowNetwork
from moment.planner.solution import Solution

#: Weight of total flow in the objective (relative to T's scale): picks, among the solutions with
#: the least T, one without detours or cycles, so reported link loads are the real ones.
FLOW_PENALTY = 1e-5
#: the rough epoch times (`_time_scale`) for which T is counted in seconds: the LP's rates (shares of the epoch's
#: reads a second) then lie where HiGHS solves them accurately; outside, T is counted in a power of two of seconds
#: near the epoch (1e-12 GB per GPU read 13.19 GB/s for 17.33 and 1e-13 was refused; 1e10 dropped the SSDs)
SECONDS_BAND = (2.0**-20, 2.0**20)


@dataclass
class _Parts:
    """One network's LP in COO form (columns: p_s, T, flows), before stacking."""

    n_var: int
    obj: np.ndarray
    eq: tuple[np.ndarray, np.ndarray, np.ndarray]
    b_eq: np.ndarray
    ub: tuple[np.ndarray, np.ndarray, np.ndarray]
    b_ub: np.ndarray
    bounds: np.ndarray
    load: tuple[np.ndarray, np.ndarray, np.ndarray]  # COO (edge, column, coef): load as a share of demand
    unit: float = 1.0  # seconds per unit of T (`_time_unit`)


#: Above this many simple storage->GPU paths per GPU the path form gives way to the edge form.
MAX_PATHS_PER_GPU = 256


def _parts(net: FlowNetwork, formulation: str, data: str = "planned") -> _Parts:
    net.check_servable()
    if formulation not in ("auto", "paths", "edges"):
        raise ValueError(f"formulation must be auto, paths or edges, not {formulation!r}")
    if data not in DATA_PLACEMENTS:
        raise ValueError(f"data must be one of {', '.join(DATA_PLACEMENTS)}, not {data!r}")
    part = None
    if formulation != "edges":
        form = _path_form(net, None if formulation == "paths" else MAX_PATHS_PER_GPU)
        if form is not None:
            part = _parts_paths(net, form)
    part = part or _parts_edges(net)
    if data == "even":
        _fix_even(net, part)
    return part


def _fix_even(net: FlowNetwork, part: _Parts) -> None:
    """Data spread evenly over the SSDs: every SSD serves the same share of the accesses, and the
    SSDs together what the GPU and CPU caches do not (the caches hold the hot rows either way)."""
    ssd = [i for i, s in enumerate(net.storage) if s.tier == TIER_SSD]
    if not ssd:
        return
    unreachable = [net.storage[i].id for i in ssd if part.bounds[i, 1] == 0.0]
    if unreachable:  # the path form found no route from it to some GPU
        raise MomentError(f"the data cannot be spread evenly: {', '.join(unreachable)} cannot reach every GPU",
                          hint="plan with the data placed by the planner (data 'planned')")
    tiers = {s.tier for s in net.storage}
    cached = (net.gpu_cache_share if TIER_GPU in tiers else 0.0) + (net.cpu_cache_share if TIER_CPU in tiers else 0.0)
    part.bounds[ssd] = (1.0 - cached) / len(ssd)


def _paths(net: FlowNetwork, cap: int | None) -> list[dict[int, list[list[int]]]] | None:
    """For each GPU: storage index -> simple paths (edge index lists) to it; None past `cap`."""
    into: dict[str, list[tuple[int, str]]] = {}
    for i, e in enumerate(net.edges):
        into.setdefault(e.v, []).append((i, e.u))
    for ins in into.values():
        ins.reverse()
    s_index = {s.id: k for k, s in enumerate(net.storage)}
    out = []
    for g in net.gpus:
        found = _PathsTo(g, into, s_index, cap).found()
        if found is None:
            return None
        out.append(found)
    return out


class _PathsTo:
    """The simple paths from every storage node to GPU `g`: depth first, backwards from the GPU
    (storage nodes have no in-edges, so paths end there), a node's in-edges tried last first (`into`
    holds them reversed), which is the order the path form's columns are made in."""

    def __init__(self, g: str, into: dict[str, list[tuple[int, str]]], s_index: dict[str, int], cap: int | None):
        self.g, self.into, self.s_index, self.cap = g, into, s_index, cap
        self.own = f"hbm:{g}"  # a GPU reads its own memory directly, never over its own PCIe link
        self.paths: dict[int, list[list[int]]] = {}
        self.path: list[int] = []
        self.seen = {g}
        self.count = 0

    def found(self) -> dict[int, list[list[int]]] | None:
        """storage index -> paths (edge index lists, storage first); None past `cap` paths."""
        return self.paths if self._walk(self.g) else None

    def _walk(self, node: str) -> bool:
        path, seen = self.path, self.seen
        for i, u in self.into.get(node, ()):
            if u in seen or (u == self.own and node != self.g):
                continue
            path.append(i)
            if u in self.s_index:
                self.paths.setdefault(self.s_index[u], []).append(path[::-1])
                self.count += 1
                if self.cap is not None and self.count > self.cap:
                    return False
            else:
                seen.add(u)
                ok = self._walk(u)
                seen.discard(u)
                if not ok:
                    return False
            path.pop()
        return True


@dataclass(frozen=True)
class _PathForm:
    """The path form of one network shape (`_path_form`), its arrays read-only: the entries that carry a
    GPU's share of the demand name that GPU (`lg`, `eg`; -1 where the entry is 1.0), the rest is the shape's."""

    n_var: int
    lr: np.ndarray  # load entries: edge, column, GPU
    lc: np.ndarray
    lg: np.ndarray
    er: np.ndarray  # equality entries: row, column, GPU (its share negated)
    ec: np.ndarray
    eg: np.ndarray
    b_eq: np.ndarray
    zero_p: frozenset[int]


def _path_form(net: FlowNetwork, cap: int | None) -> _PathForm | None:
    """The path form's structure of `net` (None past `cap` paths a GPU), kept with its shape (`FlowNetwork.shape`:
    the ends of its edges, its storage nodes and its GPUs): the paths and the columns they give depend on nothing
    else, and a listing search builds thousands of networks of a few hundred shapes (the path search and the
    columns were most of building an LP). A network built without a shape dict is searched each time."""
    if net.shape is None:
        paths = _paths(net, cap)
        return None if paths is None else _make_path_form(len(net.storage), paths)
    key = ("path form", cap)
    if key not in net.shape:
        paths = _paths(net, cap)
        net.shape[key] = None if paths is None else _make_path_form(len(net.storage), paths)
    return net.shape[key]


def _make_path_form(S: int, paths: list[dict[int, list[list[int]]]]) -> _PathForm:
    """Path form: a (storage, GPU) pair with one route needs no column (its load is D_g p_s on
    every edge of the route); a pair with several routes gets one column per route. Equivalent to
    the edge form (any flow decomposes into simple paths plus cycles, and cycles only add load)."""
    lr, lc, lg = [], [], []  # load matrix entries
    er, ec, eg = [], [], []  # equality entries (sum of route columns = d_g p_s)
    zero_p: set[int] = set()
    n_var, n_eq = S + 1, 0
    for gi, found in enumerate(paths):
        for s in range(S):
            routes = found.get(s, [])
            if not routes:
                zero_p.add(s)  # every GPU reads every storage node: one it cannot reach serves nothing
            elif len(routes) == 1:
                lr += routes[0]
                lc += [s] * len(routes[0])
                lg += [gi] * len(routes[0])
            else:
                for route in routes:
                    lr += route
                    lc += [n_var] * len(route)
                    lg += [-1] * len(route)
                    er.append(n_eq)
                    ec.append(n_var)
                    eg.append(-1)
                    n_var += 1
                er.append(n_eq)
                ec.append(s)
                eg.append(gi)
                n_eq += 1
    arrays = [np.array(lr, dtype=np.int64), np.array(lc, dtype=np.int64), np.array(lg, dtype=np.int64),
              np.array(er + [n_eq] * S, dtype=np.int64), np.array(ec + list(range(S)), dtype=np.int64),
              np.array(eg + [-1] * S, dtype=np.int64), np.append(np.zeros(n_eq), 1.0)]
    for a in arrays:
        a.flags.writeable = False
    return _PathForm(n_var, *arrays, frozenset(zero_p))


def _parts_paths(net: FlowNetwork, form: _PathForm) -> _Parts:
    """The path form of `net` (`_make_path_form`) with its GPUs' shares of the demand."""
    total = net.total_demand
    d = np.array([net.demand[g] for g in net.gpus]) / total
    lv = np.where(form.lg >= 0, d[form.lg], 1.0)
    ev = np.where(form.eg >= 0, -d[form.eg], 1.0)
    return _finish(net, form.n_var, (form.lr, form.lc, lv), (form.er, form.ec, ev), form.b_eq, form.zero_p)


def _parts_edges(net: FlowNetwork) -> _Parts:
    """Per-destination multicommodity form: one flow column per (GPU, edge)."""
    total = net.total_demand
    S, G = len(net.storage), len(net.gpus)
    idx = net.index
    V = len(net.nodes)
    tails = np.array([idx[e.u] for e in net.edges], dtype=np.int64)
    heads = np.array([idx[e.v] for e in net.edges], dtype=np.int64)
    d = np.array([net.demand[g] for g in net.gpus], dtype=float) / total
    gpu_nodes = np.array([idx[g] for g in net.gpus], dtype=np.int64)
    is_gpu_node = np.zeros(V, dtype=bool)
    is_gpu_node[gpu_nodes] = True

    # flow columns: commodity g may use every edge except those ending at another GPU, and those
    # leaving its own HBM other than the direct one (no GPU reads its own memory over PCIe)
    own_hbm = np.array([idx[f"hbm:{g}"] for g in net.gpus], dtype=np.int64)
    ok = ~is_gpu_node[heads][None, :] | (heads[None, :] == gpu_nodes[:, None])
    ok &= (tails[None, :] != own_hbm[:, None]) | (heads[None, :] == gpu_nodes[:, None])
    var_g, var_e = np.nonzero(ok)
    F = len(var_e)
    n_var = S + 1 + F
    fcols = S + 1 + np.arange(F)

    # conservation rows (g, v): inflow - outflow + D_g p_s[v] = D_g [v == g]; last row: sum p = 1
    s_nodes = np.array([idx[s.id] for s in net.storage], dtype=np.int64)
    gg, ss = np.meshgrid(np.arange(G), np.arange(S), indexing="ij")
    rows = np.concatenate([var_g * V + heads[var_e], var_g * V + tails[var_e], (gg * V + s_nodes[ss]).ravel()])
    cols = np.concatenate([fcols, fcols, ss.ravel()])
    vals = np.concatenate([np.ones(F), -np.ones(F), d[gg].ravel()])
    used, rows = np.unique(rows, return_inverse=True)
    rhs_full = np.zeros(G * V)
    rhs_full[np.arange(G) * V + gpu_nodes] = d
    n_eq = len(used)
    eq = (np.concatenate([rows, np.full(S, n_eq)]), np.concatenate([cols, np.arange(S)]),
          np.concatenate([vals, np.ones(S)]))
    b_eq = np.append(rhs_full[used], 1.0)
    return _finish(net, n_var, (var_e, fcols, np.ones(F)), eq, b_eq, set())


def _finish(net: FlowNetwork, n_var: int, load: tuple, eq: tuple, b_eq: np.ndarray,
            zero_p: set[int]) -> _Parts:
    """Rows shared by both forms: load_e - c_e T <= 0 on finite edges, p_s - L_s T <= 0, tier caps; T in
    `unit` seconds (rates are shares of the demand a unit: the demand is counted `per` unit)."""
    scale = _time_scale(net)
    unit = _time_unit(scale)
    total = net.total_demand
    per = total / unit  # (exact: unit is a power of two)
    S, col_T = len(net.storage), len(net.storage)
    cap = np.array([e.capacity for e in net.edges], dtype=float) / per
    finite = np.isfinite(cap)
    n_cap = int(finite.sum())
    crow = np.cumsum(finite) - 1  # edge -> capacity row
    lr, lc, lv = load
    keep = finite[lr]
    r = [crow[lr[keep]], np.arange(n_cap)]
    c = [lc[keep], np.full(n_cap, col_T)]
    v = [lv[keep], -cap[finite]]
    limit = np.array([s.limit for s in net.storage]) / per
    sfin = np.nonzero(np.isfinite(limit))[0]
    r += [n_cap + np.arange(len(sfin))] * 2
    c += [sfin, np.full(len(sfin), col_T)]
    v += [np.ones(len(sfin)), -limit[sfin]]
    n_ub = n_cap + len(sfin)
    b_ub = [np.zeros(n_ub)]
    for tier, share in ((TIER_GPU, net.gpu_cache_share), (TIER_CPU, net.cpu_cache_share)):
        members = [i for i, s in enumerate(net.storage) if s.tier == tier]
        if members:
            r.append(np.full(len(members), n_ub))
            c.append(np.array(members))
            v.append(np.ones(len(members)))
            b_ub.append(np.array([share]))
            n_ub += 1
    at = {s.id: i for i, s in enumerate(net.storage)}
    for rates, most in net.counts:  # devices' worth served: sum of served_s / rate_s <= most * T
        members = [at[sid] for sid in rates]
        r.append(np.full(len(members) + 1, n_ub))
        c.append(np.array(members + [col_T]))
        v.append(np.array([per / rates[sid] for sid in rates] + [-most]))
        b_ub.append(np.zeros(1))
        n_ub += 1
    edge_at = {e.id: i for i, e in enumerate(net.edges)} if net.edge_counts else {}
    for rates, most in net.edge_counts:  # devices' worth carried: sum of load_e / rate_e <= most * T
        per_e = np.zeros(len(net.edges))
        for eid, rate in rates.items():
            if eid in edge_at:  # (an entry nothing can use is pruned from the graph)
                per_e[edge_at[eid]] = per / rate
        pick = per_e[lr] > 0
        r.append(np.full(int(pick.sum()) + 1, n_ub))
        c.append(np.append(lc[pick], col_T))
        v.append(np.append(lv[pick] * per_e[lr[pick]], -most))
        b_ub.append(np.zeros(1))
        n_ub += 1
    bounds = np.zeros((n_var, 2))
    bounds[:, 1] = np.inf
    bounds[:S, 1] = [0.0 if i in zero_p else c for i, c in enumerate(net.share_caps())]
    obj = np.bincount(lc, weights=lv, minlength=n_var) * (FLOW_PENALTY * scale / unit)
    obj[col_T] = 1.0
    ub = (np.concatenate(r).astype(np.int64), np.concatenate(c).astype(np.int64), np.concatenate(v))
    return _Parts(n_var, obj, eq, b_eq, ub, np.concatenate(b_ub), bounds, load, unit)


def _stack(parts: list[_Parts]) -> dict:
    """Block-diagonal LP: the blocks share nothing, so minimising the sum of T minimises each."""
    col0 = np.cumsum([0] + [p.n_var for p in parts])
    eq0 = np.cumsum([0] + [len(p.b_eq) for p in parts])
    ub0 = np.cumsum([0] + [len(p.b_ub) for p in parts])

    def block(which: str, offs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = np.concatenate([getattr(p, which)[0] + offs[i] for i, p in enumerate(parts)])
        c = np.concatenate([getattr(p, which)[1] + col0[i] for i, p in enumerate(parts)])
        v = np.concatenate([getattr(p, which)[2] for p in parts])
        return r, c, v

    return {"c": np.concatenate([p.obj for p in parts]), "A_ub": block("ub", ub0),
            "b_ub": np.concatenate([p.b_ub for p in parts]), "A_eq": block("eq", eq0),
            "b_eq": np.concatenate([p.b_eq for p in parts]),
            "bounds": np.concatenate([p.bounds for p in parts]), "col0": col0}


def solve_lp(net: FlowNetwork, *, formulation: str = "auto", balance: bool = True, data: str = "planned") -> Solution:
    """Least T in which every GPU can be fed when all GPUs read one shared data placement: the shares
    the LP chooses (`data="planned"`, what DDAK realises) or equal SSD shares (`data="even"`).

    With `balance`, a second LP keeps T and picks, among the equally fast share vectors, the one
    closest to proportional within each tier (every SSD gets a share in proportion to its read rate
    as far as the links allow): the first LP's optimum is often not unique, and DDAK realises these
    shares, so an arbitrary vertex would leave an SSD idle for no reason."""
    first = solve_lp_batch([net], formulation=formulation, data=data)[0]
    if not balance:
        return first
    return _balanced(net, _parts(net, formulation, data), first)


def _balanced(net: FlowNetwork, p: _Parts, first: Solution) -> Solution:
    S, col_T, col_w = len(net.storage), len(net.storage), p.n_var
    served = np.array([first.served_bytes.get(s.id, 0.0) for s in net.storage]) / net.total_demand
    target = np.zeros(S)
    for tier in {s.tier for s in net.storage}:
        members = [i for i, s in enumerate(net.storage) if s.tier == tier and np.isfinite(s.limit)]
        rates = np.array([net.storage[i].limit for i in members])
        if members and rates.sum() > 0:
            target[members] = served[members].sum() * rates / rates.sum()
    rows = np.nonzero(target > 0)[0]
    n_ub = len(p.b_ub)
    ub = (np.concatenate([p.ub[0], n_ub + np.arange(len(rows)), n_ub + np.arange(len(rows))]),
          np.concatenate([p.ub[1], rows, np.full(len(rows), col_w)]),
          np.concatenate([p.ub[2], -np.ones(len(rows)), target[rows]]))
    obj = np.append(p.obj, -1.0)
    obj[col_T] = 0.0
    bounds = np.vstack([p.bounds, [0.0, 1.0]])
    bounds[col_T] = [0.0, first.epoch_read_s * (1 + 1e-7) / p.unit]
    res = linprog(obj, A_ub=ub, b_ub=np.append(p.b_ub, np.zeros(len(rows))), A_eq=p.eq, b_eq=p.b_eq,
                  bounds=bounds)
    if not res.ok:
        return first  # numerically tight: keep the first optimum
    x = res.x
    lr, lc, lv = p.load
    total = net.total_demand
    edge_bytes = np.bincount(lr, weights=lv * x[lc], minlength=len(net.edges)) * total
    share = np.clip(x[:S], 0.0, None)
    return Solution("lp", first.epoch_read_s, edge_bytes,
                    {s.id: float(share[i]) * total for i, s in enumerate(net.storage)}, dict(net.demand), net)


def solve_lp_batch(nets: list[FlowNetwork], *, formulation: str = "auto",
                   data: str | Sequence[str] = "planned", screen: bool = False) -> list[Solution]:
    """Solve several networks' LPs in one HiGHS call (the call overhead dominates small LPs). `data`:
    the data placement of every network, or of each (see `solve_lp`). `screen`: only the times are read (the
    searches' LPs, which compare placements within a tolerance): solved without presolve, 1.04-1.10x faster
    over `moment advise` and the same times to within rounding; the prediction of the chosen placement is
    solved with it (`solve_lp`), so its reported loads are unchanged."""
    datas = [data] * len(nets) if isinstance(data, str) else list(data)
    parts = [_parts(n, formulation, d) for n, d in zip(nets, datas, strict=True)]
    lp = _stack(parts)
    col0 = lp.pop("col0")
    res = linprog(**lp, presolve=not screen)
    if not res.ok:
        if len(nets) > 1:  # find the culprit and report it alone
            return [s for n, d in zip(nets, datas)
                    for s in solve_lp_batch([n], formulation=formulation, data=d, screen=screen)]
        raise _too_slow(nets[0]) or MomentError(f"the placement LP has no solution ({res.message.strip()})",
                                                hint="is every GPU reachable from the storage (check links and slots)?")
    out = []
    for net, p, c0 in zip(nets, parts, col0):
        x = res.x[c0:c0 + p.n_var]
        total, S = net.total_demand, len(net.storage)
        lr, lc, lv = p.load
        edge_bytes = np.bincount(lr, weights=lv * x[lc], minlength=len(net.edges)) * total
        share = np.clip(x[:S], 0.0, None)
        served = {s.id: float(share[i]) * total for i, s in enumerate(net.storage)}
        out.append(Solution("lp", float(x[S]) * p.unit, edge_bytes, served, dict(net.demand), net))
    return out


def _too_slow(net: FlowNetwork) -> MomentError | None:
    """Why an LP failed when a link or a storage node is too slow for the solver: the LP counts bytes as shares
    of the epoch's demand, and a rate under SMALL_MATRIX_VALUE of it a unit of T (a second, or `_time_unit`) is
    dropped as no link at all, so the reads it must carry have no way (`links.0.bandwidth_gbps=1e-9` said "is
    every GPU reachable?")."""
    total, unit = net.total_demand, _time_unit(_time_scale(net))
    rates = [(e.capacity, f"link {e.id} ({e.kind}{', ' + e.label if e.label else ''}) carries") for e in net.edges]
    rates += [(s.limit, f"{s.id} serves") for s in net.storage]
    slow = [(rate, what) for rate, what in rates if math.isfinite(rate) and rate < SMALL_MATRIX_VALUE * total / unit]
    if not slow:
        return None
    rate, what = min(slow)
    per = "per second" if unit == 1.0 else f"per {unit:.3g} s, the LP's unit of time"
    return MomentError(f"the placement LP cannot be solved: {what} {rate / 1e9:.3g} GB/s, less than "
                       f"{SMALL_MATRIX_VALUE:g} of the {total / 1e9:,.0f} GB an epoch reads ({per}): the solver "
                       "takes a rate that small for none, and the reads that must cross it have no way",
                       hint="check that figure (a bandwidth_gbps, read_gbps or memory_bandwidth_gbps in the profile "
                            "or a --set: a link that slow is no link) or the workload's size (the epoch's reads)")


def _time_unit(scale: float) -> float:
    """The seconds one unit of the LP's T stands for: 1 within SECONDS_BAND, else the power of two nearest the
    rough epoch time `scale` (`_time_scale`; a power of two: the coefficients scale without rounding)."""
    if SECONDS_BAND[0] <= scale <= SECONDS_BAND[1] or not math.isfinite(scale) or scale <= 0:
        return 1.0
    return math.ldexp(1.0, round(math.log2(scale)))


def _time_scale(net: FlowNetwork) -> float:
    """A rough epoch time (demand / fastest GPU inlet), to scale the flow penalty."""
    inlet = dict.fromkeys(net.gpus, 0.0)  # (summed in edge order, as a sum per GPU would)
    for e in net.edges:
        if e.v in inlet and math.isfinite(e.capacity):
            inlet[e.v] += e.capacity
    best = max(inlet.values())
    return max(net.demand.values()) / best if best > 0 else 1.0
