"""Recommend a placement: search the candidates with the LP, then explain the winner and baselines.

The search solves only the realisable LP, in batches of block-diagonal LPs (one HiGHS call per
batch) on networks built from a parsed chassis template (no pydantic per candidate). The winner
and every baseline are then evaluated with both solvers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from moment.errors import MomentError
from moment.gcpause import paused
from moment.planner import search
from moment.planner.baselines import baseline_placements, layouts_of
from moment.planner.contracts import Baseline, Evaluation, Plan, SearchStats
from moment.planner.equivalence import CapacityCanon, TreeBound
from moment.planner.evaluate import BOTTLENECK_UTILISATION, evaluate
from moment.planner.explain import explain
from moment.planner.lp import solve_lp_batch
from moment.planner.maxflow import DEFAULT_BACKEND
from moment.planner.network import ChassisTemplate
from moment.planner.solution import Solution
from moment.planner.symmetry import node_label
from moment.planner.tiebreak import TIE_REL, preference_arrays, preference_order, wasted_lanes
from moment.topology import checks
from moment.topology.devices import DeviceModel, Inventory, find_model, fits, populate, strip
from moment.topology.model import A_KIND, Kind, Topology
from moment.workload.spec import WorkloadSpec

# Imports inside functions: the heavier search paths load only on the machines that need them.

#: candidates per HiGHS call
BATCH = 64
#: 'auto' lists the candidates while that takes at most this many combinations (about a second;
#: the built-in machines take a few thousand), and otherwise branches and bounds
LIST_LIMIT = 30_000
#: With a time limit, the share of it that counting and listing the placements may take: past it the branch
#: and bound searches with the rest, so a limit always leaves time to find a placement (counting alone can take
#: minutes on a large machine with a mixed inventory).
LIST_SHARE = 0.5
METHODS = ("auto", "exhaustive", "branch-and-bound")


def _check_inventory(bare: Topology, inventory: Inventory) -> None:
    # `field`: the input to change, by kind (a caller that took a COUNTxMODEL list names that instead)
    models = inventory.models()
    free = bare.empty_slots()
    if not models and not free:
        own = bare.of_kind(Kind.gpu)
        raise MomentError(f"{bare.name!r} has no free slot, so there is nothing to place"
                          + (f" around its {len(own)} built-in GPU{'s' if len(own) > 1 else ''}" if own else ""))
    if not models:
        raise MomentError("the inventory is empty: place at least one GPU or SSD", field="gpus")
    if not inventory.count(Kind.gpu) and not bare.of_kind(Kind.gpu):
        raise MomentError("the inventory has no GPU and the machine holds none: there is nothing to feed",
                          field="gpus")
    for m, count in models:
        room = sum(fits(s, m) for s in free)
        if count > room:
            raise MomentError(
                f"{count} x {m.name} need{'s' if count == 1 else ''} {count} free slot{'' if count == 1 else 's'} "
                f"that take{'s' if count == 1 else ''} {A_KIND[m.kind]} (x{m.lanes} or wider), but {bare.name!r} has "
                f"{'none' if room == 0 else f'only {room}'}",
                field="gpus" if m.kind == Kind.gpu else "ssds")
    needed = sum(c for _, c in models)
    if needed > len(free):
        raise MomentError(f"the inventory ({inventory.describe()}) needs {needed} slots, "
                          f"but {bare.name!r} has only {len(free)} free", field="ssds")


def _key(placement: dict[str, str]) -> tuple:
    return tuple(sorted(placement.items()))


def make_plan(topo: Topology, inventory: Inventory, workload: WorkloadSpec, *,
              maxflow_backend: str = DEFAULT_BACKEND,
              progress: Callable[[int, int], None] | None = None,
              method: str = "auto", timeout: float | None = None, data: str = "planned") -> Plan:
    """Search every distinct placement of `inventory` into `topo`'s chassis; least LP epoch time wins
    (times within TIE_REL tie), and `tiebreak.compare_placements` decides between equally fast ones.
    Devices already in slots are taken out first; their layout becomes baseline 'current'.

    `method`: 'exhaustive' lists the placements once per symmetry class; 'branch-and-bound'
    (`planner.branch`) never lists them, for machines where they number in the millions; 'auto'
    lists them while that takes at most LIST_LIMIT combinations (about a second) and otherwise
    branches and bounds. `timeout` (seconds): the search stops there and the best placement found
    is recommended, marked not proven optimal (`SearchStats.proven_optimal`, `lower_bound_s`); in
    'auto', counting and listing stop at LIST_SHARE of it and leave the rest to the branch and bound
    (`raw_candidates` None where the count did not finish).

    `data`: the data placement the search ranks by ('planned': the LP chooses the SSD shares, which
    DDAK realises; 'even': equal SSD shares, as hash placement gives). The winner and every baseline
    are predicted under both (`predicted`, `predicted_even`); links, bottlenecks, gain and explanation
    are under `data`."""
    with paused():  # (see moment.gcpause: the search makes no cycles, and the collector cost a quarter of it)
        return _make_plan(topo, inventory, workload, maxflow_backend, progress, method, timeout, data)


def _make_plan(topo: Topology, inventory: Inventory, workload: WorkloadSpec, maxflow_backend: str,
               progress: Callable[[int, int], None] | None, method: str, timeout: float | None, data: str) -> Plan:
    t0 = time.perf_counter()
    bare, current, found, template = _search(topo, inventory, workload, progress, method, timeout, data=data)
    winner = evaluate(bare, found.placement, workload, maxflow_backend=maxflow_backend, data=data, template=template)

    evaluated = _baselines(bare, current, inventory, workload, maxflow_backend, data, template, winner)
    baselines = [b for b, _ in evaluated]
    gain = (min(b.under(data).epoch_read_s for b in baselines) / winner.under(data).epoch_read_s
            if baselines else None)

    def seen(ev: Evaluation) -> Evaluation:  # the explanation speaks of the prediction under `data`
        return ev if data == "planned" else ev.model_copy(update={"predicted": ev.under(data)})

    return Plan(
        machine=topo.name,
        inventory=inventory.describe(),
        workload=workload,
        data=data,
        placement=winner.placement,
        devices=winner.devices,
        predicted=winner.predicted,
        predicted_even=winner.predicted_even,
        predicted_maxflow=winner.predicted_maxflow,
        links=winner.links,
        bottlenecks=[u.id for u in winner.links if u.utilisation >= BOTTLENECK_UTILISATION],
        search=found.stats.model_copy(update={"seconds_total": time.perf_counter() - t0}),
        baselines=baselines,
        gain_vs_best_baseline=gain,
        explanation=explain(bare, seen(winner), [(b.name, seen(ev)) for b, ev in evaluated]),
        notes=[*layouts_of(bare, inventory)[1], *([found.note] if found.note else []), *_left_out(topo),
               *checks.notes(topo)],
    )


def _left_out(topo: Topology) -> list[str]:
    """What planning leaves out of the devices the profile has in its slots (`strip` empties them, the inventory
    is placed afresh), said: an SSD's measured read rate (`moment probe --profile-out` writes it) and a peer link
    between installed cards. Either was dropped without a word, and the plan read as the measured machine's."""
    held = {n.id: n for n in topo.nodes if n.kind in (Kind.gpu, Kind.ssd) and n.parent is not None
            and topo.node(n.parent).kind == Kind.slot}
    out = []
    measured = []
    for n in held.values():
        try:
            rated = find_model(n.model).read_gbps if n.kind == Kind.ssd and n.model else None
        except MomentError:
            rated = None
        if rated and n.read_gbps and abs(n.read_gbps - rated) > 1e-6 * rated:
            measured.append(f"{n.id} {n.read_gbps:g} GB/s ({n.model} rated {rated:g})")
    if measured:
        out.append(f"the profile's installed SSDs are placed afresh as the inventory's, at their rated rates: their "
                   f"measured rates are not used ({', '.join(measured)}); to plan with them, fit them with `moment "
                   "calibrate --measured` on `moment probe --out`'s file and plan with --calibration")
    links = [lk for lk in topo.links if lk.a in held or lk.b in held]
    if links:
        out.append("the profile's peer links between installed cards are left out with the cards: "
                   + ", ".join(f"{lk.kind} {lk.a}-{lk.b}" for lk in links) + " (a bridge that stays with the slots "
                   "is written between the slots, e.g. links: [{a: SLOT1, b: SLOT2, kind: nvlink, count: 4}])")
    return out


@dataclass
class Best:
    """`best_placement`'s answer: what `make_plan` recommends, without the baselines and max-flow."""

    placement: dict[str, str]
    evaluation: Evaluation  # the realisable LP's prediction and link loads
    bottlenecks: list[str]
    stats: SearchStats


class SearchCache:
    """What `best_placement` reuses between the inventories it places on one machine (`moment advise`
    places hundreds): the stripped and parsed chassis, its capacity classes and tree bounds with what
    they memoised, one listing of distinct placements per inventory shape (`search.Listings`) and the
    tie-break's arrays per listing (`preferences`), and the answer for each look of an inventory
    (`alike_key`): one that looks the same as an inventory placed before takes its answer, renamed."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.bare, self.current = strip(topo)
        self.template = ChassisTemplate(self.bare)
        self.listings = search.Listings(self.bare)
        # their memos hold per subtree filling (the models named): valid for every inventory
        self.canon, self.bound = CapacityCanon(self.template), TreeBound(self.template)
        self._free = self.bare.empty_slots()
        self._looks: dict[str, Hashable] = {}
        self._alike: dict[Hashable, tuple[tuple[str, ...], Best]] = {}
        self._preferences: dict[Hashable, tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def preferences(self, space: search.SearchSpace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`tiebreak.preference_arrays` of `space` and their `preference_order`, once per shared listing, models'
        widths and order of their names (all they depend on besides the chassis)."""
        key = (id(space.rows), tuple(find_model(m).lanes for m in space.models),
               tuple(sorted(range(len(space.models)), key=space.models.__getitem__)))
        found = self._preferences.get(key)
        if found is None or found[0] is not space.rows:  # (the rows are held, so their id is not reused)
            wasted, order = preference_arrays(space, self.bare)
            found = self._preferences[key] = (space.rows, (wasted, order, preference_order(wasted, order)))
        return found[1]

    def _look(self, m: DeviceModel) -> Hashable:
        """All the search sees of model `m` on this chassis: per free slot whether it fits and the
        card there (trained link, HBM or read rate as capped by that link, memory), its width and
        double width, and which cards already in the machine it would be alike with. Models that look
        the same (SSDs whose link caps their different read rates) are placed the same."""
        if m.name not in self._looks:
            cards = tuple(self.template.card(s.id, m.name) if fits(s, m) else None for s in self._free)
            label = node_label(populate(self.bare, {self._free[0].id: m.name}, check=False).occupant(
                self._free[0].id)) if self._free else m.name
            alike = tuple(s.id for s in self.bare.of_kind(Kind.slot) if (card := self.bare.occupant(s.id))
                          is not None and node_label(card) == label)
            self._looks[m.name] = (m.kind, m.lanes, m.double_width, m.memory_gib, m.hbm_gbps, cards, alike)
        return self._looks[m.name]

    def alike_key(self, inventory: Inventory, workload: WorkloadSpec, data: str) -> tuple[tuple[str, ...], Hashable]:
        """(the inventory's model names, in order; a key equal for inventories `best_placement` answers
        alike with the names changed): each model's look and count, in inventory order, and the order of
        the names (the last tie-break compares them)."""
        models = inventory.merged()
        names = tuple(m.name for m, _ in models)
        order = tuple(sorted(range(len(names)), key=names.__getitem__))
        return names, (tuple((self._look(m), c) for m, c in models), order, data, workload.model_dump_json())


def best_placement(topo: Topology, inventory: Inventory, workload: WorkloadSpec, *,
                   progress: Callable[[int, int], None] | None = None, cache: SearchCache | None = None,
                   data: str = "planned") -> Best:
    """The placement `make_plan` recommends and its LP prediction, for callers that compare many
    inventories (`moment advise`): the usual layouts and the paper's max-flow are left out. `cache`:
    what other inventories on `topo` found (`SearchCache`); `data`: as `make_plan`'s (the even-data
    prediction is made only under 'even')."""
    with paused():  # as make_plan's; between inventories the collector runs (what `moment advise` keeps is freed)
        return _best_placement(topo, inventory, workload, progress, cache, data)


def _best_placement(topo: Topology, inventory: Inventory, workload: WorkloadSpec,
                    progress: Callable[[int, int], None] | None, cache: SearchCache | None, data: str) -> Best:
    t0 = time.perf_counter()
    if cache is not None:  # an inventory that looks the same to the search was placed already
        names, key = cache.alike_key(inventory, workload, data)
        if key in cache._alike:
            then, best = cache._alike[key]
            rename = dict(zip(then, names))
            placement = {slot: rename[m] for slot, m in best.placement.items()}
            return Best(placement, best.evaluation.model_copy(update={"placement": placement}), best.bottlenecks,
                        best.stats.model_copy(update={"seconds_total": time.perf_counter() - t0}))
    bare, _current, found, _ = _search(topo, inventory, workload, progress, "auto", None, cache, data=data)
    ev = evaluate(bare, found.placement, workload, solvers=("lp", "even") if data == "even" else ("lp",), data=data,
                  template=cache.template if cache is not None else None)
    best = Best(found.placement, ev, [u.id for u in ev.links if u.utilisation >= BOTTLENECK_UTILISATION],
                found.stats.model_copy(update={"seconds_total": time.perf_counter() - t0}))
    if cache is not None:
        cache._alike[key] = (names, best)
    return best


def _search(topo: Topology, inventory: Inventory, workload: WorkloadSpec,
            progress: Callable[[int, int], None] | None, method: str,
            timeout: float | None, cache: SearchCache | None = None,
            data: str = "planned") -> tuple[Topology, dict[str, str], _Found, ChassisTemplate]:
    """(the bare chassis, the devices that were in its slots, the best placement found, the chassis
    parsed, to evaluate placements on without populating a copy of it for each). The lower
    bounds (tree bounds, the branch and bound's relaxations) are the planned LP's: with the data
    spread evenly the SSD shares are fixed, a narrower LP, so they bound its time as well."""
    t0 = time.perf_counter()
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
        raise MomentError(f"a time limit of {timeout:g} s: give a positive number of seconds")
    deadline = None if timeout is None else t0 + timeout
    if cache is not None:
        assert cache.topo is topo, "a search cache serves one machine"
        bare, current, template = cache.bare, cache.current, cache.template
    else:
        bare, current = strip(topo)
        template = ChassisTemplate(bare)
    _check_inventory(bare, inventory)
    bnb_ok = not template.bridged_slots  # where the branch and bound's relaxation is a bound
    if method == "branch-and-bound" and not bnb_ok:
        raise MomentError(f"{bare.name!r} has peer links (NVLink bridges) on slots, which the branch and bound "
                          "cannot bound", hint="plan it with the exhaustive search")
    found = None
    raw: int | None = None
    # where the branch and bound can take over, counting and listing may use LIST_SHARE of a time limit
    list_deadline = deadline if deadline is None or not bnb_ok or method != "auto" else t0 + LIST_SHARE * timeout
    if method != "branch-and-bound":
        try:
            space = search.enumerate_placements(bare, inventory, limit=LIST_LIMIT if method == "auto" and bnb_ok
                                                else None, deadline=list_deadline,
                                                shared=cache.listings if cache is not None else None)
            if not len(space.rows):
                raise MomentError(f"the inventory ({inventory.describe()}) cannot be placed in {bare.name!r}")
            found = _exhaustive(bare, template, space, workload, deadline, progress,
                                *((cache.canon, cache.bound) if cache is not None else (None, None)), data=data,
                                prefer=cache.preferences if cache is not None else None)
        except search.TooMany as e:
            raw = e.raw_count
        except search.Timeout:
            if list_deadline == deadline:  # no branch and bound takes over: the first placements, unbounded
                why = ("the machine's peer links (NVLink bridges) on slots leave no branch and bound to take over"
                       if not bnb_ok else "the exhaustive search was asked for (method='exhaustive')")
                found = _first_found(template, inventory, workload, data, why)
                if found is None:
                    raise _nothing_found(inventory, bare, timeout) from None
    if found is None:
        from moment.planner import branch  # only where the listing gave up: not on plain `moment plan`'s path

        if method == "branch-and-bound":
            raw = search.count_valid(bare, inventory, None if timeout is None else t0 + LIST_SHARE * timeout)
        res = branch.branch_and_bound(template, inventory, workload, deadline=deadline, progress=progress, data=data)
        if res.placement is None:
            raise _nothing_found(inventory, bare, timeout)
        found = _Found(res.placement, SearchStats(
            method="branch-and-bound", raw_candidates=raw, distinct_candidates=None, nodes=res.nodes,
            solved=res.lps, proven_optimal=res.proven_optimal,
            lower_bound_s=None if res.proven_optimal else res.lower_bound_s, seconds_total=0.0,
            seconds_per_solve=res.seconds / max(res.lps, 1)))

    return bare, current, found, template


@dataclass
class _Found:
    placement: dict[str, str]
    stats: SearchStats
    note: str | None = None  # said with the plan (`Plan.notes`)


def _first_found(template: ChassisTemplate, inventory: Inventory, workload: WorkloadSpec, data: str,
                 why: str) -> _Found | None:
    """The listing's time limit ran out and `why` no branch and bound can take over: the fastest of the
    placements the branch and bound starts from (of equally fast ones the fewest wide-slot lanes wasted, as
    there), marked not proven optimal with no bound (none is known without the listing); None if there are none."""
    from moment.planner import branch

    t0 = time.perf_counter()
    first = branch.first_placements(template, inventory, workload)
    if not first:
        return None
    times = [s.epoch_read_s for s in solve_lp_batch([template.network(p, workload) for p in first], data=data)]
    tied = [i for i, t in enumerate(times) if t <= min(times) * (1 + TIE_REL)]
    best = min(tied, key=lambda i: (wasted_lanes(first[i], template.topo), i))
    return _Found(first[best], SearchStats(
        method="first-placements", raw_candidates=None, distinct_candidates=None, solved=len(first),
        proven_optimal=False, lower_bound_s=None, seconds_total=0.0,
        seconds_per_solve=(time.perf_counter() - t0) / len(first)),
        note=f"the time limit stopped the listing of the placements and {why}: this is the fastest of the "
             f"{len(first)} distinct placements the search starts from (greedy ones and the usual layouts), with no "
             "bound on the best placement; allow the search more time, or drop the limit, to search them all")


def _nothing_found(inventory: Inventory, bare: Topology, timeout: float | None) -> MomentError:
    return MomentError(f"no placement of {inventory.describe()} in {bare.name!r} was complete within the "
                       f"{timeout:g} s time limit", hint="allow the search more time")


def _exhaustive(bare: Topology, template: ChassisTemplate, space: search.SearchSpace, workload: WorkloadSpec,
                deadline: float | None, progress: Callable[[int, int], None] | None,
                canon: CapacityCanon | None = None, tree: TreeBound | None = None, data: str = "planned",
                prefer: Callable[[search.SearchSpace], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
                ) -> _Found:
    """Every listed candidate, one LP per capacity-equivalence class, solved in lower-bound order
    (`canon`, `tree`: the chassis' own, from a `SearchCache`)."""
    # One LP per capacity-equivalence class, solved on the class's preferred member. The members
    # share one capacity graph, hence their link bounds: those are computed for representatives only.
    labels = (canon or CapacityCanon(template)).classes(space)
    if prefer is not None:
        wasted, order, preferred_first = prefer(space)
    else:
        wasted, order = preference_arrays(space, bare)
        preferred_first = preference_order(wasted, order)
    # by class, each class's members from the preferred on: the listing's preference order (one per listing
    # in a SearchCache) sorted stably by class, as sorting by (class, wasted lanes, slot order) would
    by_preference = preferred_first[np.argsort(labels[preferred_first], kind="stable")]
    first = np.ones(len(by_preference), dtype=bool)
    first[1:] = labels[by_preference][1:] != labels[by_preference][:-1]
    reps = by_preference[first]  # each class's preferred member
    bounds = (tree or TreeBound(template)).bounds(space, reps, workload)
    lbs = bounds.lb.tolist()
    # `compare_placements`' order of the representatives (link bounds, wasted lanes, slot order)
    preferred = np.lexsort((*order[reps].T[::-1], wasted[reps], *bounds.link_rows().T[::-1]))
    rank = np.empty(len(reps), dtype=np.int64)
    rank[preferred] = np.arange(len(reps))

    # Branch and bound on a cheap lower bound: solve in bound order (the preferred first among equal
    # bounds) until no unsolved class can beat the best time; then, among the classes that could tie
    # it, take the preferred one whose LP reaches it.
    ranked = np.lexsort((rank, bounds.lb)).tolist()
    ranked_lb = [lbs[j] for j in ranked]
    placements: dict[int, dict[str, str]] = {}

    def placement(j: int) -> dict[str, str]:
        if j not in placements:
            placements[j] = space.placement(int(reps[j]))
        return placements[j]

    t_solve = time.perf_counter()
    solved: dict[int, Solution] = {}  # class (index into reps) -> its LP

    def solve(batch: list[int]) -> None:
        sols = solve_lp_batch([template.network(placement(j), workload) for j in batch], data=data,
                               screen=True)
        solved.update(zip(batch, sols))
        if progress is not None:
            progress(len(solved), len(ranked))

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    best_t, i, size, proven = float("inf"), 0, 4, True
    while i < len(ranked) and ranked_lb[i] < best_t * (1 - TIE_REL):
        if late() and solved:
            proven = False
            break
        batch = [j for j, lb in zip(ranked[i:i + size], ranked_lb[i:i + size]) if lb < best_t * (1 - TIE_REL)]
        size = min(BATCH, size * 2)  # small first: the first classes often settle the optimum
        solve(batch)
        best_t = min(best_t, *(solved[j].epoch_read_s for j in batch))
        i += len(batch)
    winner = None
    if proven:
        contenders = sorted((j for j, lb in zip(ranked, ranked_lb) if lb <= best_t * (1 + TIE_REL)),
                            key=rank.__getitem__)
        for n, j in enumerate(contenders):
            if j not in solved:
                solve([q for q in contenders[n:n + 8] if q not in solved])
            if solved[j].epoch_read_s <= best_t * (1 + TIE_REL):
                winner = placement(j)
                break
        assert winner is not None  # the class that set best_t is among the contenders
        lower = None
    else:  # stopped by the deadline: the best solved, and the least bound of the rest
        winner = dict(min((solved[j].epoch_read_s, _key(placement(j))) for j in solved)[1])
        lower = min(best_t, ranked_lb[i]) if i < len(ranked) else best_t
    if progress is not None:
        progress(len(ranked), len(ranked))  # the rest are ruled out by their bound
    solve_seconds = time.perf_counter() - t_solve
    return _Found(winner, SearchStats(
        raw_candidates=space.raw_count, distinct_candidates=len(space.rows), capacity_classes=len(reps),
        solved=len(solved), proven_optimal=proven, lower_bound_s=lower, seconds_total=0.0,
        seconds_per_solve=solve_seconds / max(len(solved), 1)))


def _baselines(bare: Topology, current: dict[str, str], inventory: Inventory, workload: WorkloadSpec,
               backend: str, data: str = "planned", template: ChassisTemplate | None = None,
               winner: Evaluation | None = None) -> list[tuple[Baseline, Evaluation]]:
    """The usual layouts (and the machine's current one), each evaluated. They are valid placements of
    the inventory, so `template` evaluates them; the current layout, which may hold a device the catalogue
    does not know, is populated and checked. An evaluation is a function of the placement, so a usual layout
    that is the `winner`'s (evaluated the same way) or an earlier one's is not solved again."""
    named: list[tuple[str, str, dict[str, str]]] = []
    if current:
        named.append(("current", "the layout the machine has now", current))
    named += [(b.name, b.description, b.placement) for b in baseline_placements(bare, inventory)]
    out = []
    done: dict[frozenset, Evaluation] = {}
    if winner is not None:
        done[frozenset(winner.placement.items())] = winner
    for name, desc, placement in named:
        key = frozenset(placement.items()) if name != "current" else None  # (populated and checked instead)
        try:
            ev: Evaluation = done[key] if key in done else evaluate(
                bare, placement, workload, maxflow_backend=backend, data=data,
                template=None if name == "current" else template)
        except MomentError:
            if name == "current":
                continue  # e.g. a scanned device model the catalogue does not know
            raise
        if key is not None:
            done[key] = ev
        out.append((Baseline(name=name, description=desc, placement=placement, predicted=ev.predicted,
                             predicted_even=ev.predicted_even, predicted_maxflow=ev.predicted_maxflow,
                             bottlenecks=[u.id for u in ev.links if u.bottleneck]), ev))
    return out

