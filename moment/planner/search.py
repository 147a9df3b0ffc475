"""Enumerate physically valid placements of an inventory into a chassis's empty slots.

PLACEHOLDER (brute force, no pruning): the symmetry-pruned search replaces the body of
`enumerate_placements`; its signature is the contract.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from moment.errors import MomentError
from moment.topology.devices import Inventory, fits
from moment.topology.model import Kind, Topology


@dataclass
class SearchSpace:
    distinct: list[dict[str, str]]  # slot id -> model name, one per distinct placement, stable order
    raw_count: int  # physically valid placements before symmetry pruning


def enumerate_placements(topo: Topology, inventory: Inventory, *, prune: bool = True) -> SearchSpace:
    slots = topo.empty_slots()
    models = inventory.models()
    out: list[dict[str, str]] = []

    def rec(i: int, chosen: dict[str, str], free: list):
        if i == len(models):
            out.append(dict(chosen))
            return
        m, c = models[i]
        cand = [s for s in free if fits(s, m)]
        for combo in itertools.combinations(cand, c):
            ids = {s.id for s in combo}
            if m.double_width and any(b in chosen or b in ids for s in combo for b in s.blocks):
                continue
            blocked = {b for s in combo for b in s.blocks} if m.double_width else set()
            for s in combo:
                chosen[s.id] = m.name
            rec(i + 1, chosen, [s for s in free if s.id not in ids and s.id not in blocked])
            for s in combo:
                del chosen[s.id]

    rec(0, {}, slots)
    if not out:
        raise MomentError(f"the inventory ({inventory.describe()}) cannot fit into the free slots of {topo.name!r}")
    return SearchSpace(distinct=out, raw_count=len(out))


def device_kind_counts(inventory: Inventory) -> dict[Kind, int]:
    return {k: inventory.count(k) for k in (Kind.gpu, Kind.ssd, Kind.nic)}
