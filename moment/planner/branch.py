"""Branch and bound over placements, for machines whose distinct placements are too many to list.

The listing search (`planner.search`) visits every placement once per symmetry class, which is
exact and fast while the classes number in the thousands. A machine of few interchangeable slots
(64 slots of three widths and PCIe generations) has them by the hundred million, so this search
never lists them:

- Branch: place one device at a time, GPUs first, then SSDs, each model's devices in turn.
- Bound: a partial placement's realisable LP on a relaxed capacity graph (`network.Rest`): the
  devices not placed yet become one GPU sink and one SSD source that may use every free slot they
  could go in, as much as the best of those slots could carry together. Every completion of the
  partial placement is a feasible point of that LP, so its time is a lower bound on theirs; with
  every device placed it is the placement's own LP time.
- Best first with dives: the open partial placement of least bound is followed down through its
  best child at each level (the children of a node bounded in one HiGHS call), the other children
  left open; a node whose bound cannot beat the best placement found (by more than `TIE_REL`) is
  cut. When no open node is left the best placement found is optimal.

Symmetry: free slots under one parent that every model of the inventory would use alike (same
trained link, slot link and read rate, and no `blocks` on them) form a group; devices
of one model take groups in non-decreasing order and a group's narrowest free slot first, so no two
branches differ only by swapping alike slots, and a card leaves wide slots free where it can (what
the listing search's tie-break prefers). Across parents: a partial placement whose subtree holds
every completion of it (each model's devices placed but the next model's; within a model the low
group narrows it) is searched once per class of the canonical form the listing prunes by
(`search.placement_key`), so interchangeable switches give one subtree, not one each. Among
placements of equal epoch time the first one found wins (the search order is fixed, so the answer
is deterministic); the listing search instead compares all of them (`tiebreak`).

Start: before anything else the root is bounded and two greedy placements and the usual layouts
are solved, whatever the deadline (`BranchAndBound._first`): the search then only improves on the
best of them (of equally fast ones, the one wasting the fewest wide-slot lanes). A deadline stops
the search early: the best placement so far is then returned with the least bound still open,
which no placement can beat, so the caller can say how far from optimal it may be.

Only for chassis without peer links on slots (`ChassisTemplate.bridged_slots`): an NVLink bridge
between two slots would let GPUs in them past the entries the relaxation gives them.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

from moment.planner.baselines import baseline_placements
from moment.planner.lp import solve_lp_batch
from moment.planner.network import ChassisTemplate, Rest
from moment.planner.search import placement_key
from moment.planner.tiebreak import TIE_REL, wasted_lanes
from moment.topology.devices import DeviceModel, Inventory, fits
from moment.topology.model import Kind
from moment.workload.spec import WorkloadSpec


@dataclass
class BranchResult:
    placement: dict[str, str] | None  # None: the greedy placement met only dead ends until the deadline
    epoch_read_s: float
    proven_optimal: bool
    lower_bound_s: float  # no placement reads an epoch faster than this
    nodes: int  # partial placements bounded
    lps: int  # LPs solved
    seconds: float


@dataclass
class _Slot:
    id: str
    parent: str
    width: int
    blocks: tuple[str, ...]  # slots a double-width card here covers
    blocked_by: tuple[str, ...]  # slots whose double-width card would cover this one
    # per model index: None when the model cannot go here, else (inlet or read bytes/s it can move)
    rate: list[float | None] = field(default_factory=list)


class _Timeout(Exception):
    pass


def _key(bound: float) -> int:
    """Bounds within a relative 1e-9 of each other sort as equal (then the deeper node goes first)."""
    return round(math.log(bound) / 1e-9) if bound > 0 else -(1 << 62)


class BranchAndBound:
    """One search of `inventory` on a bare chassis (`template`); `run()` does it."""

    def __init__(self, template: ChassisTemplate, inventory: Inventory, workload: WorkloadSpec, *,
                 deadline: float | None = None, progress: Callable[[int, int], None] | None = None,
                 data: str = "planned"):
        self.template = template
        self.inventory = inventory
        self.workload = workload
        self.data = data
        self.deadline = deadline
        self.progress = progress
        topo = template.topo
        merged: dict[str, list] = {}
        for m, c in inventory.models():
            merged.setdefault(m.name, [m, 0])[1] += c
        # GPUs first (their places decide where the demand is), then SSDs; inventory order within a kind
        self.models: list[DeviceModel] = sorted((m for m, _ in merged.values()),
                                                key=lambda m: m.kind != Kind.gpu)
        self.counts = [merged[m.name][1] for m in self.models]
        self.order = [i for i, c in enumerate(self.counts) for _ in range(c)]
        uplink = {child: cap for child, _parent, cap, _kind, _label in template.chassis.fixed}
        empty = topo.empty_slots()
        empty_ids = {s.id for s in empty}
        # a slot covered by a double-width card already in the machine takes nothing
        covered = {b for s in topo.of_kind(Kind.slot) if s.id not in empty_ids
                   and getattr(topo.occupant(s.id), "double_width", False) for b in s.blocks}
        self.slots: dict[str, _Slot] = {}
        for s in empty:
            blocks = tuple(b for b in s.blocks if b in empty_ids and b != s.id)
            covered_by = tuple(o.id for o in empty if s.id in o.blocks and o.id != s.id)
            no_dw = any(b == s.id or b not in empty_ids for b in s.blocks)
            slot = _Slot(s.id, s.parent, s.width, blocks, covered_by)
            for m in self.models:
                if s.id in covered or not fits(s, m) or (m.double_width and no_dw):
                    slot.rate.append(None)
                    continue
                _kind, card, serve, _mem = template.card(s.id, m.name)
                cap = min(card, uplink.get(s.id, card))
                slot.rate.append(min(cap, serve) if m.kind == Kind.ssd else cap)
            self.slots[s.id] = slot
        # groups of alike slots, in the topology's slot order of their first member
        groups: dict[tuple, list[str]] = {}
        for s in empty:
            sl = self.slots[s.id]
            alone = sl.blocks or sl.blocked_by  # (no peer link ends on a slot: `bridged_slots`)
            key = (s.id,) if alone else (sl.parent, tuple(None if r is None else round(r / 1e6, 3) for r in sl.rate))
            groups.setdefault(key, []).append(s.id)
        order = {s.id: i for i, s in enumerate(empty)}
        self.groups = [sorted(g, key=lambda x: (self.slots[x].width, order[x])) for g in groups.values()]
        self.group_of = {x: gi for gi, g in enumerate(self.groups) for x in g}
        # Bytes a GPU still to place must take in over its slot in an epoch, at least: its demand less
        # what its own cache may serve (its memory's part of the GPU-cache share, the largest model's).
        gpu_models = [m for m in self.models if m.kind == Kind.gpu]
        memory = [g.memory_gib for g in topo.of_kind(Kind.gpu)] + [
            m.memory_gib for m, c in zip(self.models, self.counts) if m.kind == Kind.gpu for _ in range(c)]
        demand = workload.bytes_per_gpu(len(memory))
        own = workload.gpu_cache_share * max((m.memory_gib for m in gpu_models), default=0.0) / sum(memory) \
            if sum(memory) > 0 else workload.gpu_cache_share
        self.gpu_need = demand * max(0.0, 1.0 - own)
        self.nodes = self.lps = 0
        self._key = placement_key(topo, self.models)
        self._seen: set[int] = set()  # keys of the partial placements `_fresh` met
        self.best_t = float("inf")
        self.best: dict[str, str] | None = None
        self._shown = -1

    # ---- the search ----------------------------------------------------------------------------------
    def run(self) -> BranchResult:
        """Best first with dives: the open partial placement of least bound is taken next (the deepest
        among equal bounds) and followed down through its best child at each level to a complete
        placement or a cut, its other children left open; until no open bound can beat the best
        placement found. An open node is (bound key, -depth, sequence, bound, share of the search,
        slots in device order, low group); its taken slots are rebuilt when it is expanded.

        Before the deadline counts, the root is bounded and the first placements (`_first`) solved,
        in one batch: a dive of the full search solves a batch of LPs per device, which a large
        inventory (40 devices on 64 slots) cannot finish within a short limit, so without them a
        timed-out search had no placement to recommend and no bound to say how good it is."""
        t0 = time.perf_counter()
        seq = count()
        self._done = 0.0
        heap: list[tuple] = []
        diving: tuple | None = None
        first = self._first()
        root, *times = self._bound([({}, frozenset(), frozenset(), 0, 0),
                                    *((p, frozenset(), frozenset(), len(self.order), 0) for p in first)],
                                   deadline=False)
        for p in first:
            self._seen.add(self._key(p))
        if first:  # the fastest; among equally fast ones the fewest wide-slot lanes wasted, then the first
            fastest = min(times)
            tied = [i for i, t in enumerate(times) if t <= fastest * (1 + TIE_REL)]
            i = min(tied, key=lambda i: (wasted_lanes(first[i], self.template.topo), i))
            self.best_t, self.best = times[i], first[i]
        root = min(root, self.best_t)
        try:
            heapq.heappush(heap, (_key(root), 0, next(seq), root, 1.0, (), 0))
            while heap and heap[0][3] < self.best_t * (1 - TIE_REL):
                diving = heapq.heappop(heap)
                while diving is not None:
                    diving = self._expand(diving, heap, seq)
            proven, lower = True, self.best_t
        except _Timeout:
            proven = False
            lower = min([self.best_t, *(node[3] for node in heap), *([diving[3]] if diving else [])])
        self._report(1.0)
        return BranchResult(self.best, self.best_t, proven, lower, self.nodes, self.lps, time.perf_counter() - t0)

    def _first(self) -> list[dict[str, str]]:
        """Complete placements to start from, so the search only has to improve on them: `_greedy`'s,
        then the usual layouts (`baselines`; the recommendation is then never slower than one of them)
        that keep this search's rules. Equally fast ones are told apart by the lanes they waste
        (`run`)."""
        out: list[dict[str, str]] = []
        for greedy in (self._greedy(narrow=True), self._greedy(narrow=False)):
            if greedy is not None and (p := self._placement(greedy)) not in out:
                out.append(p)
        out += [p for b in baseline_placements(self.template.topo, self.inventory)
                if self._valid(p := b.placement) and p not in out]
        return out

    def _valid(self, placement: dict[str, str]) -> bool:
        """Is `placement` a complete placement of the inventory that this search could reach (every
        device in a slot that takes it, no double-width card covering an occupied slot)?"""
        index = {m.name: i for i, m in enumerate(self.models)}
        per_model = [0] * len(self.models)
        for x, name in placement.items():
            if x not in self.slots or name not in index or self.slots[x].rate[index[name]] is None:
                return False
            per_model[index[name]] += 1
            if self.models[index[name]].double_width and any(b in placement for b in self.slots[x].blocks):
                return False
        return per_model == self.counts

    def _greedy(self, narrow: bool) -> tuple[str, ...] | None:
        """A complete placement without solving an LP: depth first through the search's own children
        (Hall's condition keeps it from dead ends but for double-width covers), each device into the
        slot with the largest fair share of its path to the socket (each link's capacity over the
        devices of its kind behind it, with this one), then the fewest lanes wasted, then group order
        (deterministic); `narrow`: the fewest lanes wasted first, as the listing's tie-break prefers (an
        SSD in a GPU's x16 slot is as fast where the SSDs set the time). Only a dead end makes it look
        at the deadline."""
        up = {child: (parent, cap) for child, parent, cap, _kind, _label in self.template.chassis.fixed}

        def path(x: str) -> list[tuple[str, float]]:  # (node, its uplink's capacity) up to the socket
            out, n = [], self.slots[x].parent
            while n in up:
                out.append((n, up[n][1]))
                n = up[n][0]
            return out

        paths = {x: path(x) for x in self.slots}
        kinds = [m.kind for m in self.models]
        stack: list[list[tuple]] = [[((), frozenset(), frozenset(), 0)]]
        backtracked = False
        while stack:
            if not stack[-1]:
                stack.pop()
                backtracked = True
                continue
            slots, taken, no_dw, low = stack[-1].pop()
            if slots and not self._can_finish(len(slots), low, taken, no_dw):
                continue
            if len(slots) == len(self.order):
                return slots
            if backtracked and self.deadline is not None and time.perf_counter() > self.deadline:
                return None
            m = self.order[len(slots)]
            behind: dict[str, int] = {}  # node -> devices of this kind below it
            for x, i in zip(slots, self.order):
                if kinds[i] == kinds[m]:
                    for n, _ in paths[x]:
                        behind[n] = behind.get(n, 0) + 1
            ranked = []  # (sort key, child): one child per group
            for kid in self._candidates(slots, low):
                x = kid[0][-1]
                fair = min([self.slots[x].rate[m], *(cap / (behind.get(n, 0) + 1) for n, cap in paths[x])])
                waste = self.slots[x].width - self.models[m].lanes
                ranked.append((waste, -fair, self.group_of[x], kid) if narrow else (-fair, waste, self.group_of[x], kid))
            ranked.sort(key=lambda r: r[:3])
            stack.append([kid for *_, kid in reversed(ranked)])  # popped from the end: the best first
        return None

    def _expand(self, node: tuple, heap: list[tuple], seq) -> tuple | None:
        """Bound `node`'s children: keep a complete one that beats the best, leave the others that
        could open, and return the best of them to dive into (None: nothing there can beat the best)."""
        _, _, _, bound, mass, slots, low = node
        if bound >= self.best_t * (1 - TIE_REL):
            self._done += mass
            return None
        kids = self._children(slots, low)
        if not kids:
            self._done += mass
            return None
        share = mass / len(kids)
        fresh = [kid for kid in kids if self._fresh(kid[0])]
        self._done += share * (len(kids) - len(fresh))
        kids = fresh
        bounds = self._bound([(self._placement(k), taken, no_dw, len(k), kl) for k, taken, no_dw, kl in kids]) \
            if kids else []
        live = []
        for (k, _, _, kl), b in zip(kids, bounds):
            if len(k) == len(self.order):  # every device placed: the bound is its own time
                if b < self.best_t * (1 - TIE_REL):
                    self.best_t, self.best = b, self._placement(k)
                self._done += share
            elif b < self.best_t * (1 - TIE_REL):
                live.append((_key(b), -len(k), next(seq), b, share, k, kl))
            else:
                self._done += share
        self._report(self._done)
        if not live:
            return None
        live.sort()
        for other in live[1:]:
            heapq.heappush(heap, other)
        return live[0]

    def _fresh(self, slots: tuple[str, ...]) -> bool:
        """False for a partial placement equivalent to one met before (`search.placement_key`, the rule
        the listing prunes by) where its subtree holds every completion of it: each model's devices
        placed but the next model's (or all). Within a model the low group narrows the subtree, so
        equivalent placements may have different ones and are all kept. Interchangeable switches no
        longer give a subtree each (2 GPUs on 4 alike switches: 6 pairs, 1 searched)."""
        step = len(slots)
        if 0 < step < len(self.order) and self.order[step] == self.order[step - 1]:
            return True
        key = self._key(self._placement(slots))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _placement(self, slots: tuple[str, ...]) -> dict[str, str]:
        return {x: self.models[m].name for x, m in zip(slots, self.order)}

    def _children(self, slots: tuple[str, ...], low_group: int) -> list[tuple[tuple[str, ...], frozenset, frozenset, int]]:
        """The next device in each group it may take: (slots, taken, no double-width, low group)."""
        return [(k, taken, no_dw, low) for k, taken, no_dw, low in self._candidates(slots, low_group)
                if self._can_finish(len(k), low, taken, no_dw)]

    def _candidates(self, slots: tuple[str, ...], low_group: int) -> list[tuple[tuple[str, ...], frozenset, frozenset, int]]:
        """`_children` before Hall's condition, which the greedy placement tests only on the one it takes."""
        taken: set[str] = set()
        no_dw: set[str] = set()
        for x, m in zip(slots, self.order):
            taken.add(x)
            no_dw |= set(self.slots[x].blocked_by)
            if self.models[m].double_width:
                taken |= set(self.slots[x].blocks)  # covered: nothing else goes there
        step = len(slots)
        m = self.order[step]
        model = self.models[m]
        kids = []
        for gi in range(low_group, len(self.groups)):
            slot = next((x for x in self.groups[gi] if x not in taken), None)
            if slot is None or self.slots[slot].rate[m] is None:
                continue
            sl = self.slots[slot]
            if model.double_width and (slot in no_dw or any(b in taken for b in sl.blocks)):
                continue
            now_taken = frozenset(taken | {slot} | (set(sl.blocks) if model.double_width else set()))
            now_no_dw = frozenset(no_dw | set(sl.blocked_by))
            low = gi if step + 1 < len(self.order) and self.order[step + 1] == m else 0
            kids.append(((*slots, slot), now_taken, now_no_dw, low))
        return kids

    def _left(self, step: int) -> list[int]:
        """Devices still to place per model, from `step` on."""
        need = [0] * len(self.models)
        for m in self.order[step:]:
            need[m] += 1
        return need

    def _usable(self, i: int, slot: _Slot, step: int, low: int, no_dw: frozenset) -> bool:
        """Can a model-`i` device still to place go in free `slot`? The model being placed at `step`
        takes groups from `low` on only (alike devices take groups in order)."""
        if slot.rate[i] is None or (self.models[i].double_width and slot.id in no_dw):
            return False
        return not (step < len(self.order) and i == self.order[step] and self.group_of[slot.id] < low)

    def _can_finish(self, step: int, low: int, taken: frozenset, no_dw: frozenset) -> bool:
        """Hall's condition: every set of the models still to place has as many free slots that take
        one of them (a necessary condition; the double-width covers are checked as cards go in). The
        free slots are counted per group (alike for every model) and per set of models they take, not
        slot by slot per model set: six models on 64 slots took a fifth of a second a node, 500 SSDs
        on 1000 bays ten milliseconds."""
        need = self._left(step)
        left = [i for i, c in enumerate(need) if c]
        dw = sum(1 << j for j, i in enumerate(left) if self.models[i].double_width)
        gone = [0] * len(self.groups)  # taken slots per group
        for x in taken:
            gone[self.group_of[x]] += 1
        barred = [0] * len(self.groups)  # free slots per group that a double-width card may not take
        if dw:
            for x in no_dw - taken:
                barred[self.group_of[x]] += 1
        takes: dict[int, int] = {}  # bit j: takes left[j] -> free slots
        for gi, g in enumerate(self.groups):
            free = len(g) - gone[gi]
            if free:
                s = self.slots[g[0]]
                mask = sum(1 << j for j, i in enumerate(left) if self._usable(i, s, step, low, frozenset()))
                takes[mask] = takes.get(mask, 0) + free - barred[gi]
                if barred[gi]:
                    takes[mask & ~dw] = takes.get(mask & ~dw, 0) + barred[gi]
        for subset in range(1, 1 << len(left)):
            room = sum(n for mask, n in takes.items() if mask & subset)
            if room < sum(need[i] for j, i in enumerate(left) if subset >> j & 1):
                return False
        return True

    # ---- bounds --------------------------------------------------------------------------------------
    def _bound(self, partials: list[tuple[dict[str, str], frozenset, frozenset, int, int]], *,
               deadline: bool = True) -> list[float]:
        """Lower bounds on the epoch time of every completion of each partial placement, capped at the
        best time found (which is all pruning needs: see `_rest`); `deadline=False`: whatever the clock."""
        if deadline and self.deadline is not None and time.perf_counter() > self.deadline:
            raise _Timeout
        cap = self.best_t
        out: list[float | None] = []
        nets, datas = [], []
        for p, *state in partials:
            rest = self._rest(*state, cap)
            if rest is None:  # the GPUs left cannot all be fed fast enough to beat the best time
                out.append(cap)
                continue
            nets.append(self.template.network(p, self.workload, rest))
            # a complete placement is solved under the data placement asked for; a partial one's planned
            # LP bounds every completion's under either (equal SSD shares only narrow the LP)
            datas.append(self.data if rest == Rest() else "planned")
            out.append(None)
        self.nodes += len(partials)
        self.lps += len(nets)
        times = iter(s.epoch_read_s for s in solve_lp_batch(nets, data=datas, screen=True)) if nets else iter(())
        return [min(cap, next(times)) if b is None else b for b in out]

    def _rest(self, taken: frozenset, no_dw: frozenset, step: int, low: int, best: float) -> Rest | None:
        """The relaxation of what is left to place (`network.Rest`), or None when no completion can
        beat `best`.

        Only completions faster than `best` matter (the others are pruned anyway), so a GPU left to
        place counts only the slots whose inlet could feed it in less than `best` (its bytes not in
        its own cache, over its slot)."""
        left = self._left(step)
        if not any(left):
            return Rest()
        free = [s for x, s in self.slots.items() if x not in taken]

        def rates(kind: Kind, floor: float = 0.0) -> tuple[int, list[tuple[_Slot, float]]]:
            """(devices of `kind` left, the free slots one of them may use with the most it moves there)."""
            idx = [i for i, m in enumerate(self.models) if m.kind == kind and left[i]]
            out = []
            for s in free:
                r = [s.rate[i] for i in idx if self._usable(i, s, step, low, no_dw)]
                if r and max(r) >= floor:
                    out.append((s, max(r)))
            return sum(left[i] for i in idx), out

        floor = self.gpu_need / best * (1 - 1e-9) if best < float("inf") else 0.0
        n_gpu, gpu_rates = rates(Kind.gpu, floor)
        if len(gpu_rates) < n_gpu:
            return None
        by_parent: dict[str, list[float]] = {}
        for s, r in gpu_rates:
            by_parent.setdefault(s.parent, []).append(r)
        gpu_entry = {p: (sum(sorted(rs, reverse=True)[:n_gpu]), max(rs)) for p, rs in by_parent.items()} \
            if n_gpu else {}
        gpu_ok = {s.id for s, _ in gpu_rates} if n_gpu else set()
        # SSD slot groups: (parent, could hold a GPU, what each SSD model left moves there)
        ssd_models = [i for i, m in enumerate(self.models) if m.kind == Kind.ssd and left[i]]
        groups: dict[tuple, int] = {}
        for s in free:
            moves = tuple(s.rate[i] if self._usable(i, s, step, low, no_dw) else None for i in ssd_models)
            if any(r is not None for r in moves):
                key = (s.parent, s.id in gpu_ok, moves)
                groups[key] = groups.get(key, 0) + 1
        keys = list(groups)
        gpus_left = [self.models[i] for i, c in enumerate(left) for _ in range(c) if self.models[i].kind == Kind.gpu]
        return Rest(gpus=n_gpu, gpu_entry=gpu_entry, hbm=sum(m.hbm_gbps for m in gpus_left) * 1e9,
                    memory=sum(m.memory_gib for m in gpus_left),
                    ssd_slots=tuple((p, groups[(p, g, mv)], g) for p, g, mv in keys),
                    ssds=tuple((left[i], tuple(mv[j] for _, _, mv in keys)) for j, i in enumerate(ssd_models)),
                    gpu_slots=len(gpu_rates))

    def _report(self, done: float) -> None:
        pct = min(100, int(done * 100))
        if self.progress is not None and pct != self._shown:
            self._shown = pct
            self.progress(pct, 100)


def branch_and_bound(template: ChassisTemplate, inventory: Inventory, workload: WorkloadSpec, *,
                     deadline: float | None = None,
                     progress: Callable[[int, int], None] | None = None, data: str = "planned") -> BranchResult:
    """The placement of `inventory` on `template`'s chassis with the least realisable-LP epoch time
    under `data` (see the module docstring); `progress(done, 100)` reports the share of the search covered."""
    return BranchAndBound(template, inventory, workload, deadline=deadline, progress=progress, data=data).run()


def first_placements(template: ChassisTemplate, inventory: Inventory, workload: WorkloadSpec) -> list[dict[str, str]]:
    """The complete placements the search starts from (`BranchAndBound._first`: two greedy ones, then the usual
    layouts), without searching: valid on any chassis, peer links on slots included (only the relaxation's bound
    needs their absence), so a listing whose time limit ran out where no branch and bound can take over still
    has placements to recommend."""
    return BranchAndBound(template, inventory, workload)._first()


__all__ = ["BranchResult", "branch_and_bound", "first_placements"]
