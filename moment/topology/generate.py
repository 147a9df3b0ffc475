"""Seeded synthetic chassis: many slots of mixed widths and PCIe generations, for scale tests and
benchmarks of the planner's search (`bench/plan_time.py --mixed`).

Real large servers are rarely as regular as the built-in profiles: root ports of several
generations, switches of another, x16/x8/x4 slots side by side, U.2 bays that take only SSDs,
double-width GPU slots that cover a neighbour. Such a machine has few interchangeable slots, which is
what makes a placement search hard, so the planner is measured and tested on these.
"""

from __future__ import annotations

import random

from moment.topology.model import Topology

#: (mechanical width, electrical width, accepted kinds) of the slot shapes drawn, in draw order
_SHAPES = (
    (16, 16, ["gpu", "ssd", "nic"]),
    (16, 8, ["gpu", "ssd", "nic"]),
    (8, 8, ["ssd", "nic"]),
    (4, 4, ["ssd"]),
    (4, 4, ["ssd"]),
)


def mixed_chassis(slots: int = 64, *, seed: int = 0, sockets: int = 2, root_complexes: int = 4,
                  gens: tuple[int, ...] = (3, 4, 5), name: str | None = None) -> Topology:
    """A machine with `slots` empty slots spread over `sockets` x `root_complexes` root complexes, some
    behind a PCIe switch (some of those behind a second one), of widths x4-x16 and generations `gens`.

    Every x16 slot accepts a double-width GPU; about one in three blocks the slot after it. The same
    arguments always give the same machine.
    """
    if slots < 1 or sockets < 1 or root_complexes < 1:
        raise ValueError("slots, sockets and root complexes must be at least 1")
    rng = random.Random(seed)
    nodes: list[dict] = []
    for c in range(sockets):
        nodes.append({"id": f"cpu{c}", "kind": "socket", "memory_gib": 256, "memory_bandwidth_gbps": 150})
    parents: list[str] = []
    for c in range(sockets):
        for r in range(root_complexes):
            rc = f"rc{c}{r}"
            nodes.append({"id": rc, "kind": "root_complex", "parent": f"cpu{c}"})
            parents.append(rc)
            if rng.random() < 0.6:
                sw = f"sw{c}{r}"
                nodes.append({"id": sw, "kind": "switch", "parent": rc,
                              "link": {"gen": rng.choice(gens), "width": 16}})
                parents.append(sw)
                if rng.random() < 0.4:
                    nodes.append({"id": f"{sw}b", "kind": "switch", "parent": sw,
                                  "link": {"gen": rng.choice(gens), "width": 16}})
                    parents.append(f"{sw}b")
    per_parent = [slots // len(parents) + (i < slots % len(parents)) for i in range(len(parents))]
    for parent, count in zip(parents, per_parent):
        made: list[dict] = []
        for k in range(count):
            width, lanes, accepts = rng.choice(_SHAPES)
            made.append({"id": f"{parent}-s{k}", "kind": "slot", "parent": parent, "width": width,
                         "accepts": accepts, "link": {"gen": rng.choice(gens), "width": lanes}})
        for a, b in zip(made, made[1:]):
            if a["width"] == 16 and rng.random() < 1 / 3:
                a["blocks"] = [b["id"]]
        nodes.extend(made)
    links = [{"a": f"cpu{c}", "b": f"cpu{c + 1}", "kind": "upi", "count": 2} for c in range(sockets - 1)]
    return Topology.model_validate({
        "name": name or f"mixed-{slots}-seed{seed}",
        "description": f"synthetic: {slots} slots of mixed widths and PCIe generations (seed {seed})",
        "source": "moment.topology.generate.mixed_chassis",
        "nodes": nodes, "links": links,
    })
