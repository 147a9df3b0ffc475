"""The symmetry-pruned placement search against brute force.

Equivalence is checked with an invariant that shares no code with the search: the populated
topology (`populate`) as a networkx graph, Weisfeiler-Lehman hashes to bucket and VF2 isomorphism
to decide. Two placements must be merged iff their populated machines are isomorphic.
"""

from __future__ import annotations

import itertools
import json
import time
from math import comb

import networkx as nx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from moment.errors import MomentError
from moment.planner.search import canonical, canonical_keys, enumerate_placements
from moment.planner.search.bounds import HallBound
from moment.planner.search.constraints import Slots
from moment.topology.devices import Inventory, InventoryItem, find_model, fits, populate
from moment.topology.model import Kind, Topology
from moment.topology.profiles import load_profile

A100, T4, SSD = "A100-PCIe-40GB", "T4", "P5510"


# ---- building machines ----------------------------------------------------------------------------


def inv(**counts: int) -> Inventory:
    names = {"a100": A100, "t4": T4, "ssd": SSD, "h100": "H100-PCIe-80GB"}
    return Inventory(items=[InventoryItem(model=names[k], count=c) for k, c in counts.items()])


def slot(sid: str, parent: str, width: int = 16, accepts=("gpu", "ssd"), blocks=(), gen: int = 4, **kw) -> dict:
    return dict(id=sid, kind="slot", parent=parent, width=width, accepts=list(accepts), blocks=list(blocks),
                link={"gen": gen, "width": width}, **kw)


def machine(nodes: list[dict], links: list[dict] = ()) -> Topology:
    return Topology.model_validate({"name": "t", "nodes": nodes, "links": list(links)})


def socket(c: int, **kw) -> list[dict]:
    return [dict(id=f"cpu{c}", kind="socket", **kw), {"id": f"rc{c}", "kind": "root_complex", "parent": f"cpu{c}"}]


def switch(sid: str, parent: str, width: int = 16) -> dict:
    return {"id": sid, "kind": "switch", "parent": parent, "link": {"gen": 4, "width": width}}


UPI = {"a": "cpu0", "b": "cpu1", "kind": "upi", "count": 2}


# ---- the independent reference ------------------------------------------------------------------


def brute(topo: Topology, inventory: Inventory) -> list[dict[str, str]]:
    """Every valid placement, by trying every assignment."""
    want: dict[str, int] = {}
    for m, c in inventory.models():
        want[m.name] = want.get(m.name, 0) + c
    models = [find_model(n) for n in want]
    empty = topo.empty_slots()
    options = [[None] + [m.name for m in models if fits(s, m)] for s in empty]
    fixed = {s.id: topo.occupant(s.id) for s in topo.of_kind(Kind.slot) if topo.occupant(s.id) is not None}
    out = []
    for combo in itertools.product(*options):
        got: dict[str, int] = {}
        for name in combo:
            if name is not None:
                got[name] = got.get(name, 0) + 1
        if any(got.get(n, 0) != c for n, c in want.items()):
            continue
        pl = {s.id: name for s, name in zip(empty, combo) if name is not None}
        occupied = set(pl) | set(fixed)
        dw = {s for s, n in pl.items() if find_model(n).double_width}
        dw |= {s for s, d in fixed.items() if getattr(d, "double_width", False)}
        if any(b in occupied and (s.id in pl or b in pl) for s in topo.of_kind(Kind.slot) if s.id in dw for b in s.blocks):
            continue  # (a clash between two cards already present is the machine's, not the placement's)
        out.append(pl)
    return out


def invariant_graph(topo: Topology, placement: dict[str, str]) -> nx.Graph:
    """The populated machine: tree + peer links, physical attributes as labels (no names, no blocks)."""
    pop = populate(topo, placement, check=False)
    g = nx.Graph()
    for n in pop.nodes:
        attrs = n.model_dump(mode="json", exclude={"id", "label", "parent", "pci", "numa", "designation", "blocks"})
        if attrs.get("link"):
            attrs["link"].pop("label", None)
        if "accepts" in attrs:
            attrs["accepts"] = sorted(attrs["accepts"])
        g.add_node(n.id, l=json.dumps(attrs, sort_keys=True))
        if n.parent:
            g.add_edge(n.id, n.parent, l="pcie")
    for i, lk in enumerate(pop.links):
        g.add_node(("link", i), l=json.dumps(lk.model_dump(mode="json", exclude={"a", "b", "label"}), sort_keys=True))
        g.add_edge(("link", i), lk.a, l="peer")
        g.add_edge(("link", i), lk.b, l="peer")
    return g


def classes(topo: Topology, placements: list[dict[str, str]]) -> list[int]:
    """Isomorphism class (index of its first member) of each placement."""
    def match(a, b):
        return a["l"] == b["l"]
    buckets: dict[str, list[tuple[int, nx.Graph]]] = {}
    out = []
    for i, pl in enumerate(placements):
        g = invariant_graph(topo, pl)
        h = nx.weisfeiler_lehman_graph_hash(g, node_attr="l", edge_attr="l", iterations=5)
        bucket = buckets.setdefault(h, [])
        found = next((j for j, o in bucket if nx.is_isomorphic(g, o, node_match=match, edge_match=match)), None)
        if found is None:
            bucket.append((i, g))
            found = i
        out.append(found)
    return out


def frozen(pl: dict[str, str]) -> frozenset:
    return frozenset(pl.items())


def check_against_brute(topo: Topology, inventory: Inventory) -> tuple[int, int]:
    """The search agrees with brute force; returns (raw, distinct)."""
    raw = brute(topo, inventory)
    if not raw:
        with pytest.raises(MomentError):
            enumerate_placements(topo, inventory)
        return 0, 0
    full = enumerate_placements(topo, inventory, prune=False)
    assert full.raw_count == len(raw)
    assert len(full.distinct) == len(raw)
    assert {frozen(p) for p in full.distinct} == {frozen(p) for p in raw}

    space = enumerate_placements(topo, inventory)
    assert space.raw_count == len(raw)
    raw_set = {frozen(p) for p in raw}
    assert all(frozen(p) in raw_set for p in space.distinct), "a representative is not a valid placement"
    # every raw placement's class is represented exactly once
    cls = classes(topo, space.distinct + raw)
    rep_cls = cls[: len(space.distinct)]
    assert len(set(rep_cls)) == len(rep_cls), "two representatives are isomorphic (duplicate)"
    assert set(cls[len(space.distinct):]) <= set(rep_cls), "a class of raw placements was lost"
    # merged iff isomorphic, placement by placement
    keys = canonical_keys(topo, raw)
    raw_cls = cls[len(space.distinct):]
    assert len({(k, c) for k, c in zip(keys, raw_cls)}) == len(set(keys)) == len(set(raw_cls))
    # deterministic
    assert enumerate_placements(topo, inventory).distinct == space.distinct
    return len(raw), len(space.distinct)


# ---- small machines ------------------------------------------------------------------------------


def two_identical_switches() -> Topology:
    nodes = socket(0) + [switch("swa", "rc0"), switch("swb", "rc0")]
    for sw in ("swa", "swb"):
        nodes += [slot(f"{sw}-x16a", sw), slot(f"{sw}-x16b", sw), slot(f"{sw}-bay", sw, width=4, accepts=["ssd"])]
    nodes.append(slot("rc0-x16", "rc0"))
    return machine(nodes)


def test_identical_switches_merge():
    raw, distinct = check_against_brute(two_identical_switches(), inv(a100=2, ssd=2))
    assert raw > distinct > 1


def test_blocks_and_nvlink_pair():
    nodes = socket(0) + [switch("sw", "rc0")]
    nodes += [slot("s0", "sw", blocks=["s1"]), slot("s1", "sw"), slot("s2", "sw", blocks=["s3"]), slot("s3", "sw"),
              slot("s4", "sw", width=8), slot("r0", "rc0", blocks=["s4"])]
    topo = machine(nodes, [{"a": "s0", "b": "s2", "kind": "nvlink", "count": 4}])
    check_against_brute(topo, inv(a100=2, ssd=1))
    check_against_brute(topo, inv(a100=1, t4=1, ssd=2))


def test_nvlink_chain():
    """a-b-c bridged in a chain: GPUs in a,b and in b,c are alike, in a,c they are not."""
    nodes = socket(0) + [switch("sw", "rc0"), *(slot(x, "sw") for x in "abcd")]
    links = [{"a": "a", "b": "b", "kind": "nvlink", "count": 4}, {"a": "c", "b": "b", "kind": "nvlink", "count": 4}]
    raw, distinct = check_against_brute(machine(nodes, links), inv(a100=2, ssd=1))
    assert (raw, distinct) == (12, 7)


def test_units_alike_but_for_blocks():
    """Two slot pairs, one blocking one way, one both ways: not interchangeable when filling."""
    one_way = [slot("p0", "sw", blocks=["p1"]), slot("p1", "sw")]
    both_ways = [slot("q0", "sw", blocks=["q1"]), slot("q1", "sw", blocks=["q0"])]
    for pairs in (one_way + both_ways, both_ways + one_way):
        topo = machine(socket(0) + [switch("sw", "rc0"), *pairs, slot("r", "sw", width=4)])
        for inventory in (inv(a100=1, ssd=1), inv(a100=2, ssd=1), inv(a100=1, t4=1, ssd=1), inv(a100=1, ssd=3)):
            check_against_brute(topo, inventory)


def test_two_sockets_symmetric_and_not():
    def build(mem1: float) -> Topology:
        nodes = socket(0, memory_gib=256) + socket(1, memory_gib=mem1)
        for c in range(2):
            nodes += [switch(f"sw{c}", f"rc{c}"), slot(f"sw{c}-a", f"sw{c}"), slot(f"sw{c}-b", f"sw{c}"),
                      slot(f"rc{c}-bay", f"rc{c}", width=4, accepts=["ssd"])]
        return machine(nodes, [UPI])

    raw_sym, d_sym = check_against_brute(build(256), inv(a100=2, ssd=2))
    raw_asym, d_asym = check_against_brute(build(128), inv(a100=2, ssd=2))
    assert raw_sym == raw_asym and d_sym < d_asym  # equal sockets swap, unequal ones don't


@pytest.mark.parametrize("triangle", [False, True])
def test_three_sockets(triangle):
    """UPI path 0-1-2: only the end sockets swap; triangle: all three do."""
    nodes = []
    for c in range(3):
        nodes += socket(c) + [slot(f"c{c}a", f"rc{c}"), slot(f"c{c}b", f"rc{c}", width=4, accepts=["ssd"])]
    links = [{"a": "cpu0", "b": "cpu1", "kind": "upi"}, {"a": "cpu1", "b": "cpu2", "kind": "upi"}]
    links += [{"a": "cpu0", "b": "cpu2", "kind": "upi"}] if triangle else []
    raw, distinct = check_against_brute(machine(nodes, links), inv(a100=2, ssd=1))
    assert (raw, distinct) == (12, 3 if triangle else 7)


@pytest.mark.parametrize("orbit_limit", [5000, 0])  # 0: pairwise isomorphism tests instead
def test_cross_parent_blocks_and_nvlink(monkeypatch, orbit_limit):
    """Constraints and links between slots under different parents (pins, open constraint ends)."""
    monkeypatch.setattr(canonical, "MAX_ORBIT", orbit_limit)
    nodes = socket(0) + socket(1)
    for c in range(2):
        nodes += [switch(f"sw{c}", f"rc{c}"), slot(f"sw{c}-a", f"sw{c}"), slot(f"sw{c}-b", f"sw{c}")]
    nodes += [slot("rc0-x", "rc0", blocks=["sw0-a"]), slot("rc1-x", "rc1", blocks=["sw1-b"])]
    check_against_brute(machine(nodes, [UPI]), inv(a100=2, ssd=1))
    nv = {"a": "sw0-b", "b": "sw1-a", "kind": "nvlink", "count": 2}
    check_against_brute(machine(nodes, [UPI, nv]), inv(a100=2, ssd=2))


@pytest.mark.parametrize("target", ["swa-0", "swa-1", "swb-1"])
def test_constraint_into_one_of_two_equal_switches(target):
    nodes = socket(0) + [slot("x", "rc0", blocks=[target])]
    for sw in ("swa", "swb"):
        nodes += [switch(sw, "rc0"), slot(f"{sw}-0", sw), slot(f"{sw}-1", sw)]
    topo = machine(nodes)
    for inventory in (inv(a100=2, ssd=1), inv(a100=1, ssd=2), inv(a100=2, t4=1), inv(a100=1, t4=1, ssd=2)):
        check_against_brute(topo, inventory)


@pytest.mark.parametrize("order", [0, 1])
def test_slot_that_cannot_take_double_width(order):
    """Equal slots, one of which blocks an occupied slot: equal in the canonical form, not in options."""
    pair = [slot("s0", "sw", blocks=["f"]), slot("s1", "sw")]
    nodes = socket(0) + [switch("sw", "rc0"), *(pair if order else pair[::-1]), slot("s2", "sw"), slot("f", "rc0"),
                         slot("spare", "rc0")]
    nodes.append({"id": "ssd-fixed", "kind": "ssd", "parent": "f", "link": {"gen": 4, "width": 4}})
    topo = machine(nodes)
    for inventory in (inv(a100=1, ssd=1), inv(a100=2, ssd=1), inv(a100=1, t4=1), inv(a100=2, t4=1, ssd=1)):
        check_against_brute(topo, inventory)


def test_fixed_devices():
    """A fixed T4 is the same as a placed one; a fixed double-width card covers its neighbour."""
    nodes = socket(0) + [switch("sw", "rc0")]
    nodes += [slot("s0", "sw"), slot("s1", "sw"), slot("s2", "sw", blocks=["s3"]), slot("s3", "sw"), slot("s4", "sw")]
    nodes.append({"id": "t4-fixed", "kind": "gpu", "parent": "s0", "model": "T4", "memory_gib": 16, "hbm_gbps": 320,
                      "double_width": False, "label": "T4", "link": {"gen": 3, "width": 16}})
    nodes.append({"id": "a100-fixed", "kind": "gpu", "parent": "s2", "model": A100, "double_width": True,
                      "link": {"gen": 4, "width": 16}})
    nodes += [{"id": "g2", "kind": "gpu", "parent": "s4", "model": "other", "link": {"gen": 4, "width": 16}}]
    topo = machine(nodes, [{"a": "t4-fixed", "b": "g2", "kind": "nvlink"}])
    check_against_brute(topo, inv(t4=1))
    with pytest.raises(MomentError):
        enumerate_placements(topo, inv(t4=2))  # s3 is covered by the fixed A100


def test_errors_say_what_does_not_fit():
    topo = load_profile("paper-machine-b")
    with pytest.raises(MomentError, match="10 x A100-PCIe-40GB"):
        enumerate_placements(topo, inv(a100=10))
    nodes = socket(0) + [slot(f"s{i}", "rc0", blocks=[f"s{i + 1}"] if i < 4 else []) for i in range(5)]
    with pytest.raises(MomentError, match="4 double-width GPUs need 4 free x16 slots that don't block each other; t has 3"):
        enumerate_placements(machine(nodes), inv(a100=4))
    with pytest.raises(MomentError, match="cannot be placed"):
        enumerate_placements(machine(nodes), inv(a100=3, ssd=2))


def test_empty_inventory():
    space = enumerate_placements(two_identical_switches(), Inventory(items=[]))
    assert space.distinct == [{}] and space.raw_count == 1


# ---- random small machines ---------------------------------------------------------------------


@st.composite
def small_machines(draw):
    """1-2 equal (or nearly equal) sockets, 0-2 slots on the root complex, 1-2 equal switches with
    0-3 slots each; random `blocks`, an NVLink, a fixed T4; the inventory of a random filling."""
    def spec():
        both = ["gpu", "ssd"]
        return {"width": draw(st.sampled_from([16, 16, 4])), "gen": draw(st.sampled_from([4, 4, 3])),
                "accepts": draw(st.sampled_from([both, both, both, ["gpu"], ["ssd"]]))}

    direct = [spec() for _ in range(draw(st.integers(0, 2)))]
    sw_tpl = [spec() for _ in range(draw(st.integers(0, 3)))]
    n_sw = draw(st.integers(1, 2)) if sw_tpl else 0
    n_sock = draw(st.integers(1, 2))
    assume(2 <= n_sock * (len(direct) + n_sw * len(sw_tpl)) <= 7)
    vary = draw(st.sampled_from([None, "socket", "switch"]))  # make a copy differ a little
    nodes, slots = [], []
    for c in range(n_sock):
        nodes += socket(c, memory_gib=128 if (vary == "socket" and c == 1) else 256)
        for i, sp in enumerate(direct):
            nodes.append(slot(f"c{c}d{i}", f"rc{c}", **sp))
            slots.append(f"c{c}d{i}")
        for w in range(n_sw):
            nodes.append(switch(f"c{c}w{w}", f"rc{c}", width=8 if (vary == "switch" and w == 1) else 16))
            for i, sp in enumerate(sw_tpl):
                nodes.append(slot(f"c{c}w{w}s{i}", f"c{c}w{w}", **sp))
                slots.append(f"c{c}w{w}s{i}")
    by_id = {n["id"]: n for n in nodes}
    pairs = st.lists(st.tuples(st.sampled_from(slots), st.sampled_from(slots)), max_size=3)
    for a, b in draw(pairs):
        if a != b:
            by_id[a]["blocks"].append(b)
    links = [UPI] if n_sock == 2 else []
    links += [{"a": a, "b": b, "kind": "nvlink", "count": 2} for a, b in draw(pairs)[:1]  # a bridge joins GPU slots
              if a != b and "gpu" in by_id[a]["accepts"] and "gpu" in by_id[b]["accepts"]]
    host = draw(st.sampled_from([None, *slots]))
    if host and "gpu" in by_id[host]["accepts"] and by_id[host]["width"] == 16:
        nodes.append({"id": "fixed", "kind": "gpu", "parent": host, "model": "T4", "memory_gib": 16,
                      "hbm_gbps": 320, "double_width": False, "label": "T4", "link": {"gen": 3, "width": 16}})
    topo = machine(nodes, links)
    names = {"a100": A100, "t4": T4, "ssd": SSD}
    usable = [k for k, n in names.items() if any(fits(s, find_model(n)) for s in topo.empty_slots())]
    assume(usable)
    counts = dict.fromkeys(names, 0)
    for _ in range(draw(st.integers(1, min(4, len(topo.empty_slots()))))):
        counts[draw(st.sampled_from(usable))] += 1
    return topo, inv(**counts)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@pytest.mark.slow
@given(small_machines())
def test_random_machines_against_brute_force(case):
    topo, inventory = case
    check_against_brute(topo, inventory)


# ---- real and big machines -----------------------------------------------------------------------


def occupancy_classes(topo: Topology, gpus: int, ssds: int) -> int:
    """Distinct placements of a machine whose only symmetry is equal slots under one parent.

    A class is how many GPUs and SSDs each group of equal sibling slots holds.
    """
    groups: dict[tuple, int] = {}
    for s in topo.empty_slots():
        key = (s.parent, s.width, tuple(sorted(k.value for k in s.accepts)), s.board, s.link.gen, s.link.width)
        groups[key] = groups.get(key, 0) + 1
    counts = {(0, 0): 1}  # (gpus, ssds) so far -> number of ways
    for (_, width, accepts, *_), n in groups.items():
        opts = [(g, k) for g in range(n + 1) for k in range(n + 1 - g)
                if (g == 0 or ("gpu" in accepts and width >= 16)) and (k == 0 or "ssd" in accepts)]
        nxt: dict[tuple[int, int], int] = {}
        for (g0, k0), c in counts.items():
            for g, k in opts:
                if g0 + g <= gpus and k0 + k <= ssds:
                    nxt[(g0 + g, k0 + k)] = nxt.get((g0 + g, k0 + k), 0) + c
        counts = nxt
    return counts.get((gpus, ssds), 0)


def test_paper_machine_b():
    topo = load_profile("paper-machine-b")
    assert not any(s.blocks for s in topo.of_kind(Kind.slot))  # the counts below assume no blocks
    x16 = sum(1 for s in topo.empty_slots() if s.width >= 16 and Kind.gpu in s.accepts)
    bays = len(topo.empty_slots()) - x16
    t = time.perf_counter()
    space = enumerate_placements(topo, inv(a100=4, ssd=8))
    elapsed = time.perf_counter() - t
    # the GPUs take 4 of the x16 slots, the SSDs 8 of the bays and x16 slots left
    assert space.raw_count == comb(x16, 4) * comb(bays + x16 - 4, 8)
    assert len(space.distinct) == occupancy_classes(topo, 4, 8)
    assert elapsed < 2.0  # about 0.1 s
    # every layout the paper names is among the candidates, once
    layouts = [{**{s: A100 for s in lay.gpu[:4]}, **{s: SSD for s in lay.ssd[:8]}} for lay in topo.layouts.values()]
    keys = canonical_keys(topo, space.distinct + layouts)
    assert set(keys[len(space.distinct):]) <= set(keys[: len(space.distinct)])
    assert len(set(keys[: len(space.distinct)])) == len(space.distinct)


def test_big_symmetric_machine():
    """2 sockets x 2 switches x 8 slots: raw ~7.7e12, distinct = multisets of switch loads."""
    nodes = socket(0) + socket(1)
    for c in range(2):
        for w in range(2):
            nodes.append(switch(f"sw{c}{w}", f"rc{c}"))
            nodes += [slot(f"sw{c}{w}-{k}", f"sw{c}{w}") for k in range(8)]
    topo = machine(nodes, [UPI])
    t = time.perf_counter()
    space = enumerate_placements(topo, inv(a100=8, ssd=8))
    assert time.perf_counter() - t < 3.0
    assert space.raw_count == comb(32, 8) * comb(24, 8)
    loads = [(g, s) for g in range(9) for s in range(9) if g + s <= 8]
    expected = set()
    for q in itertools.product(loads, repeat=3):
        last = (8 - sum(x[0] for x in q), 8 - sum(x[1] for x in q))
        if min(last) >= 0 and sum(last) <= 8:
            q = (*q, last)
            expected.add(tuple(sorted([tuple(sorted(q[:2])), tuple(sorted(q[2:]))])))
    assert len(space.distinct) == len(expected) == 2651


def test_hall_bound_prunes_only_what_cannot_finish():
    """An SSD in an x16 slot leaves too few x16 slots for the GPUs; in the bay it does not."""
    topo = machine(socket(0) + [slot("x0", "rc0"), slot("x1", "rc0"), slot("bay", "rc0", width=4, accepts=["ssd"])])
    models = [find_model(A100), find_model(SSD)]
    slots = Slots(topo, models)
    bound = HallBound(slots, (2, 1))
    one_ssd = bound.one(1)
    assert one_ssd == (0, 1)
    assert not bound.can_finish(bound.room["x0"], one_ssd)  # x1 alone cannot take two GPUs
    assert bound.can_finish(bound.room["bay"], one_ssd)
    assert bound.can_finish(bound.room["x0"], bound.one(0))
    assert bound.add((2, 0), (0, 1)) == (2, 1) and bound.add((2, 0), (1, 0)) is None  # only 2 GPUs
