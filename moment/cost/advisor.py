"""What should I buy: search inventories under a budget and rank them by throughput per dollar and by
throughput.

An inventory is n GPUs of one model and m SSDs of one model (the buying decision; mixed models are
not searched). Each is priced exactly (cheap), dropped when its hardware costs more than the budget,
and given an optimistic throughput from a placement-free lower bound on its epoch time:

- the SSDs must serve what the GPU and CPU caches cannot: (1 - gpu share - cpu share) of all bytes
  at no more than the sum of the SSDs' rates, each its read rate capped by its card's link and by
  a slot's link (the m best slots it fits, one SSD per slot);
- without peer links (NVLink) every byte a GPU reads from outside its own cache crosses its slot:
  its bytes x (1 - its own cache's share) at no more than the n-th best slot link (n GPUs sit in n
  distinct slots, the slowest of them sets the pace).

Inventories are then solved exactly with the planner (`best_placement`, the search of `make_plan`
without its usual layouts and max-flow: symmetry pruning and its own branch and bound over
placements; inventories of one shape share its listing of placements, and one that looks the same
to the search as an inventory solved before, such as SSDs whose link caps their read rates, takes
that answer with the names changed) in the order of their optimistic rank, alternating between
the two rankings; a ranking stops asking once its next inventory, even at its bound, cannot enter
its top k. What neither ranking asked for is `pruned`. An
inventory that is no faster than the same one with one SSD fewer is not ranked (`dominated`: the
extra SSD buys nothing); before an inventory enters a top list its smaller sibling is solved, so a
top list never holds an entry a later solve removes. `prune=False` solves every inventory in the
budget (the baseline of bench/advise.py, and what the tests compare against).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, Field

from moment.cost.model import CostParams, costs, report, samples_per_epoch
from moment.cost.prices import PriceTable, builtin_gpus_note, load_prices
from moment.errors import Flag, MomentError, cli_flag
from moment.planner.contracts import DataPlacement
from moment.topology.devices import (Inventory, InventoryItem, builtin_gpus, card_link, find_model, fits, ssd_read_bytes,
                                     strip)
from moment.topology.model import A_KIND, Kind, Topology
from moment.workload.spec import WorkloadSpec

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

#: optimistic bounds are inflated by this much so a solver's rounding can never beat its own bound
BOUND_SLACK = 1e-6
#: inventories enumerated from which the helpers solving ahead start at once, loading while they are priced (a
#: search this large runs for seconds; a smaller one starts them only once it has run a while, moment.cost.ahead)
AHEAD_FROM = 1000
#: significant digits under which two throughputs (or TPCs) tie; ties go to the lower TCO
TIE_DIGITS = 6


class Predicted(BaseModel):
    epoch_read_s: float = Field(description="the plan's predicted epoch time (LP, every GPU fed)")
    aggregate_gbps: float
    bottlenecks: list[str] = Field(default_factory=list)


class Candidate(BaseModel):
    """One inventory solved by the planner, with its best placement and its cost."""

    inventory: str = Field(description="e.g. '2 x A100-PCIe-40GB, 4 x P5510'")
    items: list[InventoryItem]
    placement: dict[str, str] = Field(description="slot id -> device model (the planner's recommendation)")
    predicted: Predicted
    epoch_s: float
    throughput_samples_per_s: float = Field(description="training samples per second (Hyperion's throughput)")
    epochs_per_hour: float
    hardware_usd: float = Field(description="server + devices: what the budget is compared with")
    power_w: float
    electricity_usd: float
    tco_usd: float = Field(description="hardware + electricity over the horizon (Hyperion Eq. 5)")
    tpc: float = Field(description="samples/s per TCO dollar")
    tpc_hardware: float = Field(description="samples/s per hardware dollar")
    dominated: bool = Field(False, description="as fast as the same inventory with one SSD fewer (when that was "
                            "solved too): the extra SSD buys nothing, so it is not ranked")
    rank_per_dollar: int | None = Field(None, description="1 = best throughput per dollar (top k only)")
    rank_throughput: int | None = Field(None, description="1 = best throughput (top k only)")


class PriceSource(BaseModel):
    price_usd: float | None = None
    usd_per_kwh: float | None = None
    power_w: float | None = None
    date: str
    source: str


class AdviseResult(BaseModel):
    machine: str
    workload: str
    data: DataPlacement = Field("planned", description="the data placement the epochs are predicted under: "
                                "'planned' (the LP's SSD shares, DDAK) or 'even' (equal SSD shares, hash)")
    budget_usd: float
    budget_basis: str = Field("hardware_usd", description="the budget caps the purchase, not the TCO")
    top_k: int
    params: CostParams
    best_throughput_per_dollar: Candidate = Field(description="the most samples/s per TCO dollar (`tpc`)")
    best_throughput: Candidate
    runner_ups: list[Candidate] = Field(
        description="the other members of either top k, by per-dollar rank then throughput rank")
    candidates: list[Candidate] = Field(description="every inventory solved, best per dollar first")
    gpu_models: list[str]
    ssd_models: list[str]
    searched: int = Field(description="inventories that fit the chassis' slots (before the budget)")
    over_budget: int
    pruned: int = Field(description="in the budget but skipped: their optimistic bound could not enter a top k")
    solved: int = Field(description="inventories placed and solved by the planner")
    unplaceable: int = Field(description="solved but with no valid placement (e.g. double-width cards)")
    elapsed_s: float
    prices: dict[str, object] = Field(description="origin of the table and the date/source of each price used")
    notes: list[str] = Field(default_factory=list, description="what the figures leave out (a chassis' built-in "
                             "GPUs the price table does not price)")


@dataclass(order=False)
class _Inv:
    inventory: Inventory
    label: str
    hardware_usd: float
    tco_usd: float
    ub_thr: float = 0.0
    ub_tpc: float = 0.0
    pred: str | None = None  # label of the same inventory with one SSD fewer
    done: bool = False
    dominated: bool = False
    exact: Candidate | None = field(default=None)


def _q(x: float) -> float:
    return float(f"{x:.{TIE_DIGITS}g}")


def _key_tpc(tpc: float, inv: _Inv) -> tuple:
    return (-_q(tpc), inv.tco_usd, inv.label)


def _key_thr(thr: float, inv: _Inv) -> tuple:
    return (-_q(thr), inv.tco_usd, inv.label)


def _split_models(models: list[str] | None, prices: PriceTable, flag: Flag) -> tuple[list[str], list[str]]:
    """GPU and SSD models to search: the listed ones of each kind; a kind not listed: every priced model."""
    gpus: list[str] = []
    ssds: list[str] = []
    def named(e: MomentError) -> MomentError:
        return MomentError(f"{flag('models')}: {str(e).splitlines()[0]}", hint=e.hint, field="models")

    for name in models or []:
        try:
            m = find_model(name)
        except MomentError as e:
            raise named(e) from None
        target = gpus if m.kind == Kind.gpu else ssds if m.kind == Kind.ssd else None
        if target is None:
            raise MomentError(f"{flag('models')}: {m.name} is {A_KIND[m.kind]}; list GPU and SSD models", field="models")
        try:
            prices.device(m.name, flag)  # no price: one line naming the model
        except MomentError as e:
            raise named(e) from None
        if m.name not in target:
            target.append(m.name)
    return gpus or prices.models(Kind.gpu), ssds or prices.models(Kind.ssd)


def _one_ssd_fewer(inv: Inventory) -> Inventory | None:
    items = list(inv.items)
    for i, it in enumerate(items):
        if find_model(it.model).kind == Kind.ssd and it.count > 0:
            rest = items[:i] + ([InventoryItem(model=it.model, count=it.count - 1)] if it.count > 1 else []) + items[i + 1:]
            return Inventory(items=rest) if rest else None
    return None


def _room(free: list, models: list) -> list[int]:
    """Per subset of `models` (bit i: models[i]), the free slots that take some model of it: Hall's
    condition says `counts` of the models fit the slots exactly when no subset needs more."""
    takes = [sum(1 << i for i, m in enumerate(models) if m is not None and fits(s, m)) for s in free]
    return [sum(1 for t in takes if t & mask) for mask in range(1 << len(models))]


def _fit_beside(room: list[int], counts: list[int]) -> bool:
    return all(sum(c for i, c in enumerate(counts) if mask >> i & 1) <= room[mask] for mask in range(1, len(room)))


def _inventories(bare: Topology, gpu_models: list[str], ssd_models: list[str], max_gpus: int | None,
                 max_ssds: int | None, workload: WorkloadSpec,
                 reserve: tuple[tuple[str, int], ...] = ()) -> list[Inventory]:
    """Every (n x GPU model, m x SSD model) that the free slots can take by count, in a stable order;
    with `reserve` ((model, count) pairs: a cluster server's NICs), only those the slots take beside
    them (Hall's condition over the three kinds of card, `_room`)."""
    free = bare.empty_slots()
    builtin = builtin_gpus(bare)
    gpu_opts: list[tuple[str | None, int]] = [(None, 0)] if builtin else []
    for g in gpu_models:
        room = sum(fits(s, find_model(g)) for s in free)
        gpu_opts += [(g, n) for n in range(1, min(room, max_gpus if max_gpus is not None else room) + 1)]
    caches_cover = workload.gpu_cache_share + workload.cpu_cache_share >= 1.0 - 1e-9
    ssd_opts: list[tuple[str | None, int]] = [(None, 0)] if caches_cover else []
    for s in ssd_models:
        room = sum(fits(sl, find_model(s)) for sl in free)
        ssd_opts += [(s, n) for n in range(1, min(room, max_ssds if max_ssds is not None else room) + 1)]
    kept = [(find_model(m), c) for m, c in reserve if c > 0]
    rooms: dict[tuple[str | None, str | None], list[int]] = {}
    out = []
    for g, ng in gpu_opts:
        for s, ns in ssd_opts:
            if ng + ns == 0 or ng + ns > len(free):
                continue
            if kept:
                key = (g, s)
                if key not in rooms:
                    rooms[key] = _room(free, [find_model(g) if g else None, find_model(s) if s else None,
                                              *(m for m, _ in kept)])
                if not _fit_beside(rooms[key], [ng, ns, *(c for _, c in kept)]):
                    continue
            items = ([InventoryItem(model=g, count=ng)] if g else []) + ([InventoryItem(model=s, count=ns)] if s else [])
            out.append(Inventory(items=items))
    return out


class _Bound:
    """The placement-free lower bound on an inventory's epoch time (see the module docstring)."""

    def __init__(self, bare: Topology, workload: WorkloadSpec):
        self.workload = workload
        self.scale = bare.ssd_read_scale or 1.0
        self.fixed_ssd = sum(ssd_read_bytes(s.read_gbps, s.link, self.scale) for s in bare.of_kind(Kind.ssd))
        self.builtin = builtin_gpus(bare)
        # a peer link (NVLink bridge) on a slot or GPU lets data into a GPU past its slot; socket
        # links (UPI) and switch links do not
        ends = {x for lk in bare.links for x in (lk.a, lk.b)}
        self.peers = any(bare.has(x) and bare.node(x).kind in (Kind.slot, Kind.gpu) for x in ends)
        self.free = bare.empty_slots()
        self._rates: dict[str, list[float]] = {}

    def _slot_rates(self, model) -> list[float]:
        """Per free slot the model fits, the most bytes/s a card of it can move there (card link, slot
        link and, for an SSD, its read rate), best first. n cards sit in n distinct slots, so the
        n best of these bound what they can do together and the n-th bounds the slowest of them."""
        if model.name not in self._rates:
            rates = []
            for s in self.free:
                if fits(s, model):
                    link = card_link(model, s)
                    card = (ssd_read_bytes(model.read_gbps, link, self.scale) if model.kind == Kind.ssd
                            else link.bandwidth())
                    rates.append(min(card, s.link.bandwidth() if s.link is not None else math.inf))
            self._rates[model.name] = sorted(rates, reverse=True)
        return self._rates[model.name]

    def epoch_s(self, inventory: Inventory) -> float:
        wl = self.workload
        gpus = [(m, c) for m, c in inventory.models() if m.kind == Kind.gpu]
        n = sum(c for _, c in gpus) + len(self.builtin)
        if n == 0:
            return math.inf
        per_gpu = wl.bytes_per_gpu(n)
        total = per_gpu * n
        ssd_rate = self.fixed_ssd + sum(sum(self._slot_rates(m)[:c]) for m, c in inventory.models()
                                        if m.kind == Kind.ssd)
        ssd_min = max(0.0, 1.0 - wl.gpu_cache_share - wl.cpu_cache_share)
        lb = 0.0
        if ssd_min > 0:
            lb = ssd_min * total / ssd_rate if ssd_rate > 0 else math.inf
        if gpus and not self.peers:
            weights = [m.memory_gib for m, c in gpus for _ in range(c)] + [g.memory_gib for g in self.builtin]
            total_w = sum(weights)
            for m, c in gpus:
                own = wl.gpu_cache_share * (m.memory_gib / total_w if total_w > 0 else 1.0 / n)
                rates = self._slot_rates(m)
                inlet = rates[c - 1] if c <= len(rates) else 0.0
                lb = max(lb, per_gpu * (1.0 - own) / inlet if inlet > 0 else math.inf)
        return lb


def check_inputs(budget_usd: float, top_k: int, max_gpus: int | None, max_ssds: int | None, *,
                 flag: Flag = cli_flag, jobs: int | None = 1) -> None:
    """The advisor's numbers, checked before any work (names as `flag` spells them: `--top`, ...)."""
    if jobs is not None and jobs < 0:
        from moment.cost.ahead import MAX_AUTO_JOBS

        raise MomentError(f"{flag('jobs')} {jobs}: give a number of processes, or 0 for one per core (up to "
                          f"{MAX_AUTO_JOBS})", field="jobs")
    if not budget_usd > 0 or not math.isfinite(budget_usd):
        raise MomentError(f"{flag('budget')} {budget_usd:g}: give a positive amount of USD", field="budget")
    if top_k < 1:
        raise MomentError(f"{flag('top')} {top_k}: give 1 or more", field="top")
    for name, v in (("max_gpus", max_gpus), ("max_ssds", max_ssds)):
        if v is not None and v < 0:
            raise MomentError(f"{flag(name)} {v}: must not be negative", field=name)


def advise(topo: Topology, budget_usd: float, *, models: list[str] | None = None, max_gpus: int | None = None,
           max_ssds: int | None = None, workload: WorkloadSpec | None = None, prices: PriceTable | None = None,
           params: CostParams | None = None, top_k: int = 3, prune: bool = True,
           progress: Callable[[int, int], None] | None = None, flag: Flag = cli_flag,
           data: str = "planned", reserve: tuple[tuple[str, int], ...] = (), jobs: int | None = 1) -> AdviseResult:
    """The best inventories for `topo`'s chassis under `budget_usd` (hardware), by throughput per TCO
    dollar and by throughput, with their placements. `progress(done, total)` counts the inventories in the
    budget that are solved or ruled out of both rankings; messages spell the inputs (budget, models,
    max_gpus, ...) as `flag` does. `data`: the data placement each inventory's epoch is predicted under
    ('planned' or 'even', as `moment plan --data`); the throughput bound holds for both. `reserve`: (model,
    count) cards every inventory must leave slots for (a cluster server's NICs, `--machines-max`). `jobs`:
    processes solving inventories (moment.cost.ahead; None or 0: the cores this one may use, up to 4); the answer
    is the same for any.

    The stages: enumerate the inventories the chassis takes, price them and keep those in the budget
    (each with its optimistic bound), solve them in bound order until neither ranking can change (the
    planner places each one), rank what was solved."""
    from moment.cost.ahead import Ahead

    t0 = time.perf_counter()
    check_inputs(budget_usd, top_k, max_gpus, max_ssds, flag=flag, jobs=jobs)
    workload = workload or WorkloadSpec()
    prices = prices or load_prices()
    params = params or CostParams()
    gpu_models, ssd_models = _split_models(models, prices, flag)
    bare = strip(topo)[0]
    unpriced = builtin_gpus_note(prices, [getattr(g, "model", None) or "GPU" for g in builtin_gpus(bare)], flag)
    invs = _enumerate_inventories(topo, bare, gpu_models, ssd_models, max_gpus, max_ssds, workload, reserve, flag)
    seeds = samples_per_epoch(workload)
    setup = (topo, workload, data, seeds, prices, params, prune)
    with Ahead(_solver(setup), jobs, _solver, setup, start=len(invs) >= AHEAD_FROM) as ahead:
        in_budget = _within_budget(topo, invs, budget_usd, _Bound(bare, workload), seeds, prices, params, flag)
        search = _Search(in_budget, top_k, ahead.solve, progress)
        ahead.upcoming = lambda: ((c.label, c.inventory) for c in search.upcoming())
        search.run(prune)
    exact = [c for c in search.solved if c.exact is not None]
    if not exact:
        raise MomentError(f"no inventory within budget {budget_usd:,.0f} USD can be placed in {topo.name!r}",
                          hint=f"raise {flag('budget')} or lower {flag('max_gpus')} (double-width cards cover "
                               "neighbouring slots)", field="budget")
    best_pd, best_thr, runner, candidates = _rank(exact, top_k)
    total = len(in_budget)
    return AdviseResult(
        machine=topo.name, workload=workload.name, data=data, budget_usd=budget_usd, top_k=top_k, params=params,
        best_throughput_per_dollar=best_pd, best_throughput=best_thr, runner_ups=runner,
        candidates=candidates, gpu_models=gpu_models, ssd_models=ssd_models,
        searched=len(invs), over_budget=len(invs) - total, pruned=total - len(search.solved),
        solved=len(search.solved), unplaceable=search.unplaceable, elapsed_s=time.perf_counter() - t0,
        prices=_price_sources(prices, gpu_models + ssd_models), notes=[unpriced] if unpriced else [])


def _enumerate_inventories(topo: Topology, bare: Topology, gpu_models: list[str], ssd_models: list[str],
                           max_gpus: int | None, max_ssds: int | None, workload: WorkloadSpec,
                           reserve: tuple[tuple[str, int], ...], flag: Flag) -> list[Inventory]:
    """Stage 1: every inventory the chassis' free slots take (`_inventories`); none is an error."""
    invs = _inventories(bare, gpu_models, ssd_models, max_gpus, max_ssds, workload, reserve)
    if not invs:
        beside = "".join(f" beside {c} x {m}" for m, c in reserve if c > 0)
        raise MomentError(f"no inventory of {', '.join(gpu_models + ssd_models)} fits the free slots of {topo.name!r}"
                          f"{beside}",
                          hint=f"check {flag('max_gpus')}/{flag('max_ssds')} and the chassis' empty slots "
                               "(`moment profiles`)",
                          field="max_gpus" if max_gpus == 0 else "max_ssds" if max_ssds == 0 else "models")
    return invs


def _within_budget(topo: Topology, invs: list[Inventory], budget_usd: float, bound: _Bound, seeds: float,
                   prices: PriceTable, params: CostParams, flag: Flag) -> list[_Inv]:
    """Stage 2: price every inventory and keep those whose hardware the budget buys, each with its optimistic
    throughput and throughput per dollar (`bound`) and the label of its sibling with one SSD fewer. Nothing
    in the budget is an error naming the cheapest inventory."""
    in_budget: list[_Inv] = []
    cheapest: tuple[float, str] | None = None
    for inv in invs:
        _, hw, _, tco = costs(inv, prices, params)
        label = inv.describe()
        if cheapest is None or (hw, label) < cheapest:
            cheapest = (hw, label)
        if hw > budget_usd:
            continue
        lb = bound.epoch_s(inv)
        ub = seeds / lb * (1 + BOUND_SLACK) if lb > 0 else math.inf
        fewer = _one_ssd_fewer(inv)
        in_budget.append(_Inv(inv, label, hw, tco, ub, ub / tco, pred=fewer.describe() if fewer else None))
    if not in_budget:
        assert cheapest is not None
        raise MomentError(
            f"budget {budget_usd:,.0f} USD buys nothing for {topo.name!r}: the cheapest inventory searched "
            f"({cheapest[1]}, with the ${prices.server.price_usd:,.0f} server) costs {cheapest[0]:,.0f} USD",
            hint=f"raise {flag('budget')}, list cheaper {flag('models')}, or price the server lower with "
                 f"{flag('prices')}", field="budget")
    return in_budget


def _solver(setup: tuple) -> Callable[[Inventory, str], Candidate | None]:
    """Stage 4 for one process (this one, or a helper of moment.cost.ahead): `_plan_inventory` with its own search
    cache, over `setup` = (topo, workload, data, seeds, prices, params, prune)."""
    from moment.planner.plan import SearchCache

    topo, workload, data, seeds, prices, params, prune = setup
    # inventories of one shape share their listing of placements (the unpruned baseline plans each alone)
    cache = SearchCache(topo) if prune else None
    return lambda inv, label: _plan_inventory(topo, inv, label, workload, cache, data, seeds, prices, params)


def _plan_inventory(topo: Topology, inv: Inventory, label: str, workload: WorkloadSpec, cache, data: str,
                    seeds: float, prices: PriceTable, params: CostParams) -> Candidate | None:
    """Stage 4, for one inventory: the planner's best placement and what it predicts, priced; None when the
    inventory has no valid placement (e.g. double-width cards that leave too few slots)."""
    from moment.planner.plan import best_placement

    try:
        best = best_placement(topo, inv, workload, cache=cache, data=data)
    except MomentError:
        return None
    predicted = best.evaluation.under(data)
    rep = report(inv, predicted.epoch_read_s, seeds, prices, params)
    return Candidate(
        inventory=label, items=inv.items, placement=best.placement,
        predicted=Predicted(epoch_read_s=predicted.epoch_read_s,
                            aggregate_gbps=predicted.aggregate_gbps, bottlenecks=best.bottlenecks),
        epoch_s=rep.epoch_s, throughput_samples_per_s=rep.throughput_samples_per_s,
        epochs_per_hour=rep.epochs_per_hour, hardware_usd=rep.hardware_usd,
        power_w=rep.power_w, electricity_usd=rep.electricity_usd, tco_usd=rep.tco_usd, tpc=rep.tpc,
        tpc_hardware=rep.tpc_hardware)


def _check_dominated(c: _Inv, pred: _Inv | None) -> None:
    """Flag `c` when its sibling with one SSD fewer is as fast (its extra SSD buys nothing)."""
    if pred is not None and pred.exact is not None and c.exact is not None and (
            _q(pred.exact.throughput_samples_per_s) >= _q(c.exact.throughput_samples_per_s)):
        c.dominated = True
        c.exact = c.exact.model_copy(update={"dominated": True})


class _Search:
    """Stage 3, the bound pruning: solve (`plan`, stage 4) the inventories in the budget in the order of
    their optimistic rank, alternating between the two rankings, until neither top k can change; or, with
    `run(prune=False)`, every one of them (the baseline)."""

    def __init__(self, in_budget: list[_Inv], top_k: int, plan: Callable[[Inventory, str], Candidate | None],
                 progress: Callable[[int, int], None] | None):
        self.in_budget = in_budget
        self.total = len(in_budget)
        self.by_label = {c.label: c for c in in_budget}
        self.top_k = top_k
        self.plan = plan
        self.progress = progress
        self.unplaceable = 0
        self.solved: list[_Inv] = []
        self.top_tpc: list[tuple] = []
        self.top_thr: list[tuple] = []
        self.ruled_out: list[tuple[list, np.ndarray, list]] = []  # per ranking: (its top, queue position, keys)
        # per ranking (`run`: its queue, the key of its bound, its top list; one queue in label order without pruning)
        self.queues: list[tuple[list[_Inv], Callable[[_Inv], tuple] | None, list]] = []
        self.pos: list[int] = []
        self.active: list[bool] = []

    def enters(self, top: list[tuple], key: tuple) -> bool:
        return len(top) < self.top_k or key < top[-1]

    def solve(self, c: _Inv) -> None:
        """Solve c. If it would enter a top list, first make sure the same inventory with one SSD fewer
        is solved: if that is as fast, c's extra SSD buys nothing and c is not ranked. So a top list
        only ever holds checked entries and its k-th key only improves, which the pruning relies on."""
        c.done = True
        c.exact = self.plan(c.inventory, c.label)
        if c.exact is None:
            self.unplaceable += 1
        self.solved.append(c)
        if c.exact is not None:
            self.rank(c)
        if self.progress is not None:
            self.progress(self.decided(), self.total)

    def rank(self, c: _Inv) -> None:
        k_tpc, k_thr = _key_tpc(c.exact.tpc, c), _key_thr(c.exact.throughput_samples_per_s, c)
        if not (self.enters(self.top_tpc, k_tpc) or self.enters(self.top_thr, k_thr)):
            return
        pred = self.by_label.get(c.pred) if c.pred else None
        if pred is not None and not pred.done:
            self.solve(pred)
        _check_dominated(c, pred)
        if not c.dominated:
            for top, key in ((self.top_tpc, k_tpc), (self.top_thr, k_thr)):
                top.append(key)
                top.sort()
                del top[self.top_k:]

    def decided(self) -> int:
        """Inventories solved, or that neither ranking can take any more: what the progress counts."""
        out = np.array([c.done for c in self.in_budget])
        if len(self.ruled_out) < 2 or any(len(top) < self.top_k for top, _, _ in self.ruled_out):
            return int(out.sum())
        both = np.ones(len(self.in_budget), dtype=bool)
        for top, at, keys in self.ruled_out:  # from the first key that cannot enter the top k on (keys only grow)
            both &= at >= bisect.bisect_right(keys, top[-1])
        return int((out | both).sum())

    def upcoming(self) -> Iterator[_Inv]:
        """The inventories the search will likely ask for next, soonest first: each ranking's next ones that can
        still enter its top k, the rankings in turn, each followed by its sibling with one SSD fewer (a top entry
        asks for it). Without pruning: the rest, in order."""
        def ranking(i: int) -> Iterator[_Inv]:
            queue, best_key, top = self.queues[i]
            for j in range(self.pos[i], len(queue)):
                c = queue[j]
                if best_key is not None and len(top) >= self.top_k and best_key(c) > top[-1]:
                    return
                if not c.done:
                    yield c
                    pred = self.by_label.get(c.pred) if c.pred else None
                    if best_key is not None and pred is not None and not pred.done:
                        yield pred

        runs = [ranking(i) for i in range(len(self.queues)) if self.active[i]]
        for c in itertools.chain.from_iterable(itertools.zip_longest(*runs)):
            if c is not None:
                yield c

    def run(self, prune: bool) -> None:
        if prune:
            self.queues = queues = [
                (sorted(self.in_budget, key=lambda c: _key_tpc(c.ub_tpc, c)), lambda c: _key_tpc(c.ub_tpc, c),
                 self.top_tpc),
                (sorted(self.in_budget, key=lambda c: _key_thr(c.ub_thr, c)), lambda c: _key_thr(c.ub_thr, c),
                 self.top_thr),
            ]
            for queue, best_key, top in queues:
                where = {id(c): i for i, c in enumerate(queue)}
                self.ruled_out.append((top, np.array([where[id(c)] for c in self.in_budget]),
                                       [best_key(c) for c in queue]))
            self.pos = pos = [0, 0]
            self.active = active = [True, True]
            while any(active):
                for i, (queue, best_key, top) in enumerate(queues):
                    if not active[i]:
                        continue
                    while pos[i] < len(queue) and queue[pos[i]].done:
                        pos[i] += 1
                    if pos[i] == len(queue) or (len(top) >= self.top_k and best_key(queue[pos[i]]) > top[-1]):
                        active[i] = False  # nothing left in this ranking can enter its top k
                        continue
                    self.solve(queue[pos[i]])
        else:
            order = sorted(self.in_budget, key=lambda c: c.label)
            self.queues, self.pos, self.active = [(order, None, [])], [0], [True]
            for i, c in enumerate(order):
                self.pos[0] = i
                if not c.done:
                    self.solve(c)
        if self.progress is not None:
            self.progress(self.total, self.total)
        for c in self.solved:  # the flag for every inventory whose smaller sibling was solved too
            if not c.dominated and c.pred in self.by_label:
                _check_dominated(c, self.by_label[c.pred])


def _rank(exact: list[_Inv], top_k: int) -> tuple[Candidate, Candidate, list[Candidate], list[Candidate]]:
    """Stage 5: the solved inventories ranked per dollar and by throughput (the dominated ones aside): the
    best of each, the runners-up (the other members of either top k) and every candidate, best per dollar
    first."""
    ranked = [c for c in exact if not c.dominated]
    by_tpc = sorted(ranked, key=lambda c: _key_tpc(c.exact.tpc, c))
    by_thr = sorted(ranked, key=lambda c: _key_thr(c.exact.throughput_samples_per_s, c))
    ranks: dict[str, dict] = {}
    for r, c in enumerate(by_tpc[:top_k], start=1):
        ranks.setdefault(c.label, {})["rank_per_dollar"] = r
    for r, c in enumerate(by_thr[:top_k], start=1):
        ranks.setdefault(c.label, {})["rank_throughput"] = r
    final = {c.label: c.exact.model_copy(update=ranks.get(c.label, {})) for c in exact}
    best_pd, best_thr = final[by_tpc[0].label], final[by_thr[0].label]
    runner = [final[label] for label in ranks if label not in (best_pd.inventory, best_thr.inventory)]
    runner.sort(key=lambda c: (c.rank_per_dollar or top_k + 1, c.rank_throughput or top_k + 1, c.inventory))
    return best_pd, best_thr, runner, [final[c.label] for c in sorted(exact, key=lambda c: _key_tpc(c.exact.tpc, c))]


def _price_sources(prices: PriceTable, used: list[str]) -> dict[str, object]:
    devs = {m: PriceSource(**prices.device(m).model_dump()).model_dump(exclude_none=True) for m in used}
    return {
        "origin": prices.origin, "currency": prices.currency,
        "server": PriceSource(**prices.server.model_dump()).model_dump(exclude_none=True),
        "electricity": PriceSource(**prices.electricity.model_dump()).model_dump(exclude_none=True),
        "devices": devs,
    }
