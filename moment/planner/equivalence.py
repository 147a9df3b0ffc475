"""Capacity equivalence: placements whose capacity graphs are isomorphic get the same LP answer.

The slot search prunes placements that are symmetric *as slot assignments*; many of the rest still
build the same capacity graph (an x4 SSD in an x16 slot or in an x4 bay under the same switch: the
series edges slot -> card carry min(slot, card) either way). Solving one representative per class
is exact. The canonical form is AHU-style on the PCIe forest, so it is only used where the graph is
a forest plus socket links that do not break socket symmetry; elsewhere every placement is its own
class.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from moment.planner.network import ChassisTemplate, distinct
from moment.topology.devices import find_model
from moment.topology.model import Kind

if TYPE_CHECKING:
    from moment.planner.search import SearchSpace


def _round(x: float) -> float:
    return round(x / 1e6, 3)  # MB/s, enough to tell link classes apart, stable under float noise


def _tree(template: ChassisTemplate) -> tuple[dict[str, list[str]], dict[str, float]]:
    """Children of each fixed node and each node's uplink capacity, from the parsed chassis."""
    children: dict[str, list[str]] = {}
    uplink: dict[str, float] = {}
    for child, parent, cap, _kind, _label in template.chassis.fixed:
        children.setdefault(parent, []).append(child)
        uplink[child] = cap
    return children, uplink


def _slot_spans(children: dict[str, list[str]], kind: dict[str, Kind],
                roots: list[str]) -> tuple[tuple[str, ...], dict[str, tuple[int, int]]]:
    """The slots under `roots` in depth-first order, and for each node the range of them below it:
    a subtree's slots are one slice of that order, so a placement's occupants are listed once and
    each subtree reads its own by slicing."""
    order: list[str] = []
    span: dict[str, tuple[int, int]] = {}

    def walk(nid: str) -> None:
        lo = len(order)
        if kind.get(nid) == Kind.slot:
            order.append(nid)
        for k in children.get(nid, ()):  # (below a slot: a built-in card, no slot)
            walk(k)
        span[nid] = (lo, len(order))

    for r in roots:
        walk(r)
    return tuple(order), span


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of a non-negative integer matrix, each row's index among them). A row is
    packed into one integer when it fits (np.unique on rows sorts them as bytes, far slower)."""
    a = np.asarray(a, dtype=np.int64)
    base = int(a.max()) + 1 if a.size else 1
    if a.shape[1] * np.log2(max(base, 2)) < 62:
        packed = a @ (base ** np.arange(a.shape[1] - 1, -1, -1, dtype=np.int64))
        _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
        return a[first], inverse.reshape(-1)
    unique, inverse = np.unique(a, axis=0, return_inverse=True)
    return unique, inverse.reshape(-1)


def _fillings(space: SearchSpace, rows: np.ndarray, slots: tuple[str, ...], span: tuple[int, int]
              ) -> tuple[list[tuple[str | None, ...]], np.ndarray]:
    """The distinct fillings of one subtree (the slots `slots[span[0]:span[1]]`) among `rows` of
    `space`: (each as the occupants of every slot in `slots`, None outside the subtree and where
    empty; for each row, the index of its filling)."""
    col = {sid: j for j, sid in enumerate(space.slots)}
    lo, hi = span
    inside = [(i, col[sid]) for i, sid in enumerate(slots[lo:hi], start=lo) if sid in col]
    names = [*space.models, None]
    sub = rows[:, [j for _, j in inside]]
    if not len(rows):
        return [], np.zeros(0, dtype=np.int64)
    unique, inverse = _unique_rows(sub)
    out = []
    for u in unique.tolist():
        occupants: list[str | None] = [None] * len(slots)
        for (i, _), m in zip(inside, u):
            occupants[i] = names[m]
        out.append(tuple(occupants))
    return out, inverse


class CapacityCanon:
    """Canonical capacity form of placements on one bare chassis."""

    def __init__(self, template: ChassisTemplate):
        self.template = template
        topo = template.topo
        self.topo = topo
        ch = template.chassis
        self.enabled = self._symmetric_enough()
        self.children, self.uplink = _tree(template)
        # Canonical forms are interned: a subtree's form holds its children's numbers, sorted (a
        # multiset), so equal numbers mean alike subtrees and sorting compares small integers
        self._forms: dict[tuple, int] = {}
        self.fixed_devices: dict[str, list[int]] = {}
        for d in ch.devices:
            self.fixed_devices.setdefault(d.parent, []).append(self._intern(
                ("dev", d.kind.value, _round(d.serve), d.memory, _round(min(d.uplink, self.uplink.get(d.parent, d.uplink))))))
        self.kind = {n.id: n.kind for n in topo.nodes}
        self.sockets = {sid: (_round(bw), mem) for sid, bw, mem in ch.sockets}
        self._peer_caps = tuple(sorted(_round(p.capacity) for p in ch.peers))
        self.slots, self.span = _slot_spans(self.children, self.kind, list(self.sockets))
        self._devices: dict[tuple[str, str], int | None] = {}
        self._memo: dict[tuple, int | None] = {}

    def _intern(self, form: tuple) -> int:
        return self._forms.setdefault(form, len(self._forms))

    def _symmetric_enough(self) -> bool:
        ch = self.template.chassis
        sockets = [s for s, _, _ in ch.sockets]
        socket_set = set(sockets)
        for p in ch.peers:
            if p.a not in socket_set or p.b not in socket_set:
                return False  # NVLink/xGMI between devices or slots: not a forest
        if len(sockets) <= 2:
            return True
        pairs = {frozenset((p.a, p.b)): p.capacity for p in ch.peers}
        want = len(sockets) * (len(sockets) - 1) // 2
        return len(pairs) == want and len(set(pairs.values())) == 1 and len(ch.peers) == want

    def _device(self, slot: str, model: str) -> int | None:
        k = (slot, model)
        if k not in self._devices:
            kind, cap, serve, memory = self.template.card(slot, model)
            self._devices[k] = (self._intern(("dev", kind.value, _round(serve), memory,
                                              _round(min(cap, self.uplink.get(slot, cap)))))
                                if kind in (Kind.gpu, Kind.ssd) else None)
        return self._devices[k]

    def _canon(self, nid: str, occupants: tuple[str | None, ...]) -> int | None:
        """The number of the subtree's canonical form (None: nothing below, the network drops it).
        Memoised on the models in the subtree's slots (`occupants`: the model in each of
        `self.slots`, None when empty): most subtrees repeat across candidates."""
        lo, hi = self.span[nid]
        sig = (nid, occupants[lo:hi])
        if sig in self._memo:
            return self._memo[sig]
        if self.kind.get(nid) == Kind.slot:
            out = self._device(nid, occupants[lo]) if occupants[lo] is not None else None
        else:
            parts = [c for c in (self._canon(k, occupants) for k in self.children.get(nid, ())) if c is not None]
            parts += self.fixed_devices.get(nid, [])
            if not parts and self.kind.get(nid) != Kind.socket:
                out = None  # nothing below: the network drops it
            else:
                up = _round(self.uplink[nid]) if nid in self.uplink else None
                out = self._intern((self.sockets.get(nid, self.kind[nid].value), up, tuple(sorted(parts))))
        self._memo[sig] = out
        return out

    def key(self, placement: dict[str, str]) -> Hashable:
        if not self.enabled:
            return tuple(sorted(placement.items()))
        occupants = tuple(placement.get(s) for s in self.slots)
        return (tuple(sorted(self._canon(s, occupants) for s in self.sockets)), self._peer_caps)

    def classes(self, space: SearchSpace) -> np.ndarray:
        """A class number for each placement of `space`, equal where `key` is equal: each socket's forms
        for every placement at once (`_forms_of`), interned once per distinct filling of each subtree."""
        n = len(space.rows)
        if not self.enabled or not n:
            return np.arange(n)
        col = {sid: j for j, sid in enumerate(space.slots)}
        forms = [self._forms_of(sock, space, col) for sock in self.sockets]  # (a socket always has a form)
        keys = np.sort(np.stack(forms, axis=1), axis=1)
        return _unique_rows(keys)[1]  # (sorted: the sockets' forms as a multiset)

    def _forms_of(self, nid: str, space: SearchSpace, col: dict[str, int]) -> np.ndarray:
        """`_canon(nid, ...)` of every placement of `space` as one array (-1: None), bottom up: a node's
        form is interned once per distinct combination of its children's forms, not once per placement
        (the search lists thousands of placements; a subtree has tens of fillings)."""
        rows = space.rows
        if self.kind.get(nid) == Kind.slot:
            if nid not in col:
                return np.full(len(rows), -1, dtype=np.int64)
            dev = [self._device(nid, m) for m in space.models]
            return np.array([-1 if d is None else d for d in dev] + [-1], dtype=np.int64)[rows[:, col[nid]]]
        fixed = self.fixed_devices.get(nid, [])
        head = (self.sockets.get(nid, self.kind[nid].value), _round(self.uplink[nid]) if nid in self.uplink else None)
        socket = self.kind.get(nid) == Kind.socket
        kids = [self._forms_of(k, space, col) for k in self.children.get(nid, ())]
        if kids:
            combos, inverse = _unique_rows(np.stack(kids, axis=1) + 1)  # (+1: None is 0)
        else:
            combos, inverse = np.zeros((1, 0), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
        out = []
        for combo in combos.tolist():
            parts = [k - 1 for k in combo if k] + fixed
            out.append(self._intern((*head, tuple(sorted(parts)))) if parts or socket else -1)
        return np.array(out, dtype=np.int64)[inverse]


class TreeBound:
    """A cheap lower bound on a placement's LP epoch time, for pruning the search.

    Each tree edge into or out of a subtree X must carry, for the GPUs on the far side, every byte
    not stored on their side. The share a side can hold is at most its caches' shares plus what
    its SSDs can serve in time T (rate * T / total demand), which gives T >= D(1 - A) / (c + D B)
    per edge. With the SSD aggregate bound this is a relaxation of the LP, so LB <= LP time always;
    only a class whose bound beats the best time found so far needs its LP solved. The aggregate
    bound counts the SSDs of a subtree without GPUs at no more than its uplink carries (every byte
    they serve leaves through it): SSD carriers behind one x16 link bound what their drives add.
    That only prunes; the per-link bounds, which also order equally fast placements, are as above.
    """

    def __init__(self, template: ChassisTemplate):
        self.template = template
        ch = template.chassis
        self.children, self.uplink = _tree(template)
        self.fixed: dict[str, list[tuple[Kind, float, float]]] = {}
        for d in ch.devices:
            self.fixed.setdefault(d.parent, []).append((d.kind, min(d.uplink, self.uplink.get(d.parent, d.uplink)), d.serve))
        self.sockets = [s for s, _, _ in ch.sockets]
        sockets = set(self.sockets)
        # Peer links between devices or slots (NVLink, xGMI) bypass tree edges, so the per-link
        # bounds are then only a heuristic order; the SSDs' aggregate bound stays valid.
        self.tree_only = all(p.a in sockets and p.b in sockets for p in ch.peers)
        kind = {n.id: n.kind for n in template.topo.nodes}
        self.slots, self.span = _slot_spans(self.children, kind, self.sockets)
        self._memo: dict[tuple, tuple] = {}
        self._devices: dict[tuple[str, str], tuple[Kind, float, float] | None] = {}

    def _device(self, slot: str, model: str) -> tuple[Kind, float, float] | None:
        """(kind, link capacity as the slot's uplink caps it, HBM or read rate) of a `model` card in `slot`;
        None for a card that carries no reads (a NIC). Once per slot and model: the search asks per filling."""
        key = (slot, model)
        if key not in self._devices:
            kind, cap, serve, _mem = self.template.card(slot, model)
            self._devices[key] = ((kind, min(cap, self.uplink.get(slot, cap)), serve)
                                  if kind in (Kind.gpu, Kind.ssd) else None)
        return self._devices[key]

    def bound(self, placement: dict[str, str], workload) -> tuple[float, tuple[float, ...]]:
        """(lower bound on the epoch time, per-link bounds highest first).

        The per-link bounds say how close each link comes to limiting this placement: among equally
        fast placements the planner prefers the one whose tightest link is loosest (leximax)."""
        devs = {slot: dev for slot, model in placement.items() if (dev := self._device(slot, model)) is not None}
        n_gpu = sum(1 for k, _, _ in devs.values() if k == Kind.gpu) + sum(
            1 for lst in self.fixed.values() for k, _, _ in lst if k == Kind.gpu)
        if n_gpu == 0:
            return 0.0, ()
        D = workload.bytes_per_gpu(n_gpu)
        total = D * n_gpu
        f_gpu, f_cpu = workload.gpu_cache_share, workload.cpu_cache_share
        g_share = f_gpu / n_gpu
        lb = 0.0
        occupants = tuple(placement.get(s) for s in self.slots)
        per_socket = [self._walk(s, occupants, devs, g_share) for s in self.sockets]
        # (capacity, gpus inside, cache share inside, ssd rate inside) per tree edge, in walk order
        edges = [e for _, _, _, sub_edges, _, _ in per_socket for e in sub_edges]
        ssd_rate_all = deliver = 0.0
        for _, _, _, _, rates, reach in per_socket:
            for rate in rates:  # one at a time, in walk order: the same float sum however it is memoised
                ssd_rate_all += rate
            deliver += reach
        if ssd_rate_all > 0:
            lb = max(lb, (1 - f_gpu - f_cpu) * total / ssd_rate_all)
        if self.tree_only and deliver > 0:
            lb = max(lb, (1 - f_gpu - f_cpu) * total / deliver)
        link_bounds: list[float] = []
        sum_a = sum(a for _, a, _, _, _, _ in per_socket) + f_cpu  # everything cacheable, anywhere
        for cap, g_in, a_in, b_in in edges:
            if cap == float("inf"):
                continue
            d_in, d_out = g_in * D, (n_gpu - g_in) * D
            # into X: its GPUs need what X does not hold (X can hold no CPU memory below a socket)
            link_bounds.append(d_in * max(0.0, 1 - a_in) / (cap + d_in * b_in / total))
            # out of X: the other GPUs need X's share, at least 1 - what the outside can hold
            a_out = sum_a - a_in
            link_bounds.append(d_out * max(0.0, 1 - a_out) / (cap + d_out * (ssd_rate_all - b_in) / total))
        if self.tree_only:
            lb = max([lb, *link_bounds])
        return lb, tuple(round(x, 6) for x in sorted(link_bounds, reverse=True))

    def bounds(self, space: SearchSpace, which: np.ndarray, workload) -> Bounds:
        """`bound` for the placements `which` (indices) of `space`, with the same floats to the bit:
        each socket's distinct fillings are walked once and the per-link formulas run on arrays (the
        same operations in the same order). The per-link bounds are only made into tuples when asked
        for (`Bounds.links`): the planner compares them only between placements whose bounds tie."""
        rows = space.rows[which]
        k = len(rows)
        is_gpu = np.array([find_model(m).kind == Kind.gpu for m in space.models] + [False])
        fixed_gpus = sum(1 for lst in self.fixed.values() for kd, _, _ in lst if kd == Kind.gpu)
        n_gpu_all = is_gpu[rows].sum(axis=1) + fixed_gpus
        out = Bounds(np.zeros(k))
        for n_gpu in sorted(set(n_gpu_all.tolist())):
            at = np.flatnonzero(n_gpu_all == n_gpu)
            if n_gpu == 0:
                out.lb[at] = 0.0
                out.add(at, np.zeros((len(at), 0)))
                continue
            self._bounds_with(space, rows[at], at, int(n_gpu), workload, out)
        return out

    def _bounds_with(self, space: SearchSpace, rows: np.ndarray, at: np.ndarray, n_gpu: int, workload,
                     out: Bounds) -> None:
        D = workload.bytes_per_gpu(n_gpu)
        total = D * n_gpu
        f_gpu, f_cpu = workload.gpu_cache_share, workload.cpu_cache_share
        g_share = f_gpu / n_gpu
        cols: dict[str, list[np.ndarray]] = {"cap": [], "g": [], "a": [], "b": [], "rate": []}
        sum_a = deliver = None
        for sock in self.sockets:
            fillings, inverse = _fillings(space, rows, self.slots, self.span[sock])
            lo, hi = self.span[sock]
            walked = []
            for occ in fillings:
                found = self._memo.get((sock, occ[lo:hi], g_share))  # (`_walk`'s own memo, before its devices)
                if found is not None:
                    walked.append(found)
                    continue
                devs = {slot: dev for slot, model in zip(self.slots[lo:hi], occ[lo:hi])
                        if model is not None and (dev := self._device(slot, model)) is not None}
                walked.append(self._walk(sock, occ, devs, g_share))
            n_edges = max((len(w[3]) for w in walked), default=0)
            n_rates = max((len(w[4]) for w in walked), default=0)
            edge = np.zeros((len(walked), n_edges, 4))
            edge[:, :, 0] = np.inf  # padding: an unlimited link, which gives no bound
            rate = np.zeros((len(walked), n_rates))
            for u, (_g, _a, _b, edges, rates, _reach) in enumerate(walked):
                if edges:
                    edge[u, :len(edges)] = edges
                rate[u, :len(rates)] = rates
            a = np.array([w[1] for w in walked], dtype=float)[inverse]
            sum_a = a if sum_a is None else sum_a + a  # sockets in order, as `sum` adds them
            reach = np.array([w[5] for w in walked], dtype=float)[inverse]
            deliver = reach if deliver is None else deliver + reach
            for name, j in (("cap", 0), ("g", 1), ("a", 2), ("b", 3)):
                cols[name].append(edge[inverse, :, j])
            cols["rate"].append(rate[inverse])
        cap, g_in, a_in, b_in = (np.concatenate(cols[c], axis=1) for c in ("cap", "g", "a", "b"))
        rates = np.concatenate(cols["rate"], axis=1)
        # one rate after the other, as `bound` adds them (a zero of the padding changes no sum)
        ssd_rate_all = np.add.accumulate(rates, axis=1)[:, -1] if rates.shape[1] else np.zeros(len(rows))
        with np.errstate(divide="ignore", invalid="ignore"):
            lb = np.where(ssd_rate_all > 0, np.maximum(0.0, (1 - f_gpu - f_cpu) * total / ssd_rate_all), 0.0)
            if self.tree_only:
                lb = np.where(deliver > 0, np.maximum(lb, (1 - f_gpu - f_cpu) * total / deliver), lb)
        sum_a = sum_a + f_cpu
        d_in, d_out = g_in * D, (n_gpu - g_in) * D
        into = d_in * np.maximum(0.0, 1 - a_in) / (cap + d_in * b_in / total)
        a_out = sum_a[:, None] - a_in
        out_of = d_out * np.maximum(0.0, 1 - a_out) / (cap + d_out * (ssd_rate_all[:, None] - b_in) / total)
        valid = np.isfinite(cap)
        links = np.concatenate([np.where(valid, into, -np.inf), np.where(valid, out_of, -np.inf)], axis=1)
        if self.tree_only and links.shape[1]:
            lb = np.maximum(lb, links.max(axis=1))
        out.lb[at] = lb
        out.add(at, links)

    def _walk(self, nid: str, occupants: tuple[str | None, ...], devs: dict[str, tuple[Kind, float, float]],
              g_share: float) -> tuple[int, float, float, list, list, float]:
        """(GPUs, cache share, SSD rate) below `nid`, its tree edges (capacity, GPUs, cache share, SSD
        rate inside) and its SSDs' rates, both in walk order, and the SSD rate it can deliver to GPUs
        (without GPUs: no more than its uplink). Memoised on the models in its slots: a subtree's
        figures depend on nothing else (and on the GPU cache share each GPU holds)."""
        lo, hi = self.span[nid]
        sig = (nid, occupants[lo:hi], g_share)
        found = self._memo.get(sig)
        if found is not None:
            return found
        edges: list[tuple[float, int, float, float]] = []
        rates: list[float] = []

        def leaf(kind: Kind, cap: float, serve: float) -> tuple[int, float, float]:
            if kind == Kind.gpu:
                edges.append((cap, 1, g_share, 0.0))
                return 1, g_share, 0.0
            rate = min(cap, serve)
            rates.append(rate)
            return 0, 0.0, rate

        if nid in devs:
            g, a, b = leaf(*devs[nid])
            reach = b
        else:
            g = a = b = reach = 0.0
            for k in self.children.get(nid, ()):
                kg, ka, kb, k_edges, k_rates, k_reach = self._walk(k, occupants, devs, g_share)
                edges += k_edges
                rates += k_rates
                g, a, b, reach = g + kg, a + ka, b + kb, reach + k_reach
            for kind, cap, serve in self.fixed.get(nid, ()):
                kg, ka, kb = leaf(kind, cap, serve)
                g, a, b, reach = g + kg, a + ka, b + kb, reach + kb
            if nid in self.uplink and (g or b):
                edges.append((self.uplink[nid], int(g), a, b))
            if not g and nid in self.uplink:
                reach = min(reach, self.uplink[nid])
            g = int(g)
        found = self._memo[sig] = (g, a, b, edges, rates, reach)
        return found


class Bounds:
    """`TreeBound.bounds`' answer: `lb[j]` is `bound(...)[0]` of placement j, `links(j)` its [1]."""

    def __init__(self, lb: np.ndarray):
        self.lb = lb
        # per-link bounds (-inf for none) in blocks: (the placements, a row for each), one per GPU count
        self._blocks: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, at: np.ndarray, links: np.ndarray) -> None:
        """The per-link bounds of placements `at`, a row each."""
        self._blocks.append((at, links))

    def _row(self, j: int) -> np.ndarray:
        for at, links in self._blocks:
            hit = np.flatnonzero(at == j)
            if len(hit):
                return links[hit[0]]
        raise IndexError(j)

    def links(self, j: int) -> tuple[float, ...]:
        row = self._row(j)
        return tuple(round(x, 6) for x in sorted(row[np.isfinite(row)].tolist(), reverse=True))

    def link_rows(self) -> np.ndarray:
        """Every `links(j)` as a row of one matrix, padded with -inf (which sorts before every bound,
        as a shorter tuple does before a longer one it begins): comparing rows lexicographically
        compares the tuples. Each distinct bound is rounded once, by Python's `round` (numpy's rounds
        otherwise in the last digit)."""
        width = max((links.shape[1] for _, links in self._blocks), default=0)
        m = np.full((len(self.lb), width), -np.inf)
        for at, links in self._blocks:
            m[at, :links.shape[1]] = links
        m = -np.sort(-m, axis=1)  # highest first, -inf last
        finite = np.isfinite(m)
        values = distinct(m[finite])
        rounded = np.array([round(x, 6) for x in values.tolist()])
        m[finite] = rounded[np.searchsorted(values, m[finite])]
        return m
