"""What a machine description claims that its hardware cannot do, said as notes (planned as given or as capped).

A profile of a machine not yet bought is hand-written, and a what-if asks for hardware that may not exist
(the planning page suggests a link's generation + 1, or twice its rate): these are planned, and said. Refused instead is what
the model's validation refuses (`moment.topology.model`); a link above its CPU's PCIe generation is capped
there (`Link.running_gen`) and named here.
"""

from __future__ import annotations

from moment.topology import bandwidth as bw
from moment.topology.model import Kind, Topology, socket_cpu
from moment.topology.readers import _xml_cpu as cpus

#: a measured rate may be this much over the wire rate before it is noted (rounding in a file or a table)
WIRE_SLACK = 1e-6
#: tree nodes whose uplink takes lanes of their CPU: a switch's own lanes fan out below it, so only its
#: uplink counts (chipset functions, `other`, hang off the chipset's own lanes)
_LANE_TAKERS = (Kind.slot, Kind.switch, Kind.gpu, Kind.ssd, Kind.nic)


def notes(topo: Topology) -> list[str]:
    """Everything below, for a plan's notes."""
    return [*capped_links(topo), *lanes_over(topo), *rates_over_wire(topo)]


def capped_links(topo: Topology) -> list[str]:
    """One note per socket whose CPU holds root-port links below the PCIe generation written for them."""
    by_cpu: dict[str, list] = {}
    for n in topo.nodes:
        if n.link is not None and n.link.capped_by is not None and n.link.bandwidth_gbps is None:  # (measured wins)
            by_cpu.setdefault(n.link.capped_by, []).append(n)
    out = []
    for cpu, held in by_cpu.items():
        gens = sorted({n.link.gen for n in held})
        run = held[0].link.running_gen
        out.append(f"{cpu} drives PCIe {run}.0: the PCIe {'/'.join(f'{g}.0' for g in gens)} link"
                   f"{'s' if len(held) > 1 else ''} of {_ids(held)} {'are' if len(held) > 1 else 'is'} planned at "
                   f"PCIe {run}.0 (a link trains at the lower generation of its ends); to plan another CPU, change the "
                   "socket's model")
    return out


def lanes_over(topo: Topology) -> list[str]:
    """A socket whose root complexes' links take more PCIe lanes than its CPU has (a board shares lanes between
    slots, or puts a PCIe switch in front of them: a switch's slots count only by its uplink)."""
    out = []
    for s in topo.of_kind(Kind.socket):
        lanes = cpus.pcie_lanes(socket_cpu(s))
        if lanes is None:
            continue
        widths: dict[int, int] = {}
        for rc in topo.children(s.id):
            for c in topo.children(rc):
                n = topo.node(c)
                if n.kind not in _LANE_TAKERS or n.link is None or n.link.kind != "pcie":
                    continue
                w = n.link.width if n.link.width is not None else getattr(n, "width", None)
                if w:
                    widths[w] = widths.get(w, 0) + 1
        used = sum(w * k for w, k in widths.items())
        if used > lanes:
            parts = ", ".join(f"{k} x{w}" for w, k in sorted(widths.items(), reverse=True))
            out.append(f"socket {s.id!r} ({s.model}) has {lanes} PCIe lanes, but the links at its root complexes "
                       f"take {used} ({parts}): planned as given; a board with more slots than lanes shares them "
                       "(write the widths each slot gets) or puts a PCIe switch in front (a kind: switch node, whose "
                       "uplink is what reaches the CPU)")
    return out


def rates_over_wire(topo: Topology) -> list[str]:
    """A `bandwidth_gbps` above what its link carries on the wire (gen x width, or a peer link's kind, count
    and rate): a measurement cannot beat the wire, so it is a what-if (the planning page suggests twice a
    link's rate) or a mistake; planned as given."""
    out = []
    for n in topo.nodes:
        link = n.link
        if link is None or link.bandwidth_gbps is None or link.kind != "pcie" or not (link.gen and link.width):
            continue
        wire = bw.pcie_wire_bytes(link.running_gen, link.width)
        if link.bandwidth_gbps * bw.GB > wire * (1 + WIRE_SLACK):
            out.append(_over(f"the link of {n.kind.value} {n.id!r}", link.bandwidth_gbps, wire,
                             f"PCIe {link.running_gen}.0 x{link.width}"))
    for i, pl in enumerate(topo.links):
        if pl.bandwidth_gbps is None:
            continue
        wire = pl.wire_bytes()
        if pl.bandwidth_gbps * bw.GB > wire * (1 + WIRE_SLACK):
            out.append(_over(f"links[{i}] ({pl.a}-{pl.b})", pl.bandwidth_gbps, wire, pl.describe()))
    return out


def _over(what: str, gbps: float, wire: float, link: str) -> str:
    return (f"{what}: bandwidth_gbps {gbps:g} is above the {bw.gbps(wire):.3g} GB/s a {link} link carries on the "
            "wire; planned at bandwidth_gbps as given (a what-if, or a figure to check)")


def _ids(nodes: list) -> str:
    ids = [n.id for n in nodes]
    return ", ".join(ids) if len(ids) <= 6 else f"{', '.join(ids[:5])} and {len(ids) - 5} more"
