"""What a what-if can change on a machine, for the planning page (`POST /v1/whatif/targets`).

The page cannot read YAML, so the service lists a machine's changeable links (switch and slot uplinks,
socket and NVLink peer links) with their current figures and the `set` path of each, e.g.
`nodes.sw1.link` (+ `.gen=5`) or `links.0` (+ `.bandwidth_gbps=40`): the override syntax of
`moment plan --set`; and what the machine holds (`machine`: built-in GPUs, the cards now in slots that
a plan replaces, the slots a plan fills), which the page describes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.


class GenCapOut(BaseModel):
    """What holds a link at a root port to its CPU's PCIe generation (`moment.topology.model.gen_caps`)."""

    gen: int = Field(description="the highest PCIe generation the link runs at: a higher `gen` is planned at this one")
    cpu: str = Field(description="the CPU that drives no more, as its socket's `model` names it")
    socket: str


class Target(BaseModel):
    target: str = Field(description="`set` path of the link; append `.gen=5`, `.bandwidth_gbps=40`, ...")
    label: str
    group: str
    kind: str
    props: list[str] = Field(description="fields a what-if may set on this link, the most useful first")
    current: dict[str, Any] = Field(description="the link's fields as the profile gives them")
    bandwidth_gbps: float | None = Field(description="one-direction GB/s the planner uses now (null: unlimited)")
    nodes: list[str] = Field(description="the node ids the link joins")
    gen_cap: GenCapOut | None = Field(None, description="the link's CPU and the PCIe generation it drives at most "
                                                        "(null: no CPU caps this link, or its CPU is not known)")
    max_width: int | None = Field(None, description="the most lanes the link may have: its slot's `width` for a "
                                                    "slot's link or its card's, else the widest PCIe link (null: "
                                                    "a link without lanes)")
    max_width_slot: str | None = Field(None, description="the slot whose `width` is `max_width` (null: no slot's)")
    widths: list[int] | None = Field(None, description="the lanes a what-if may set: the PCIe widths up to "
                                                      "`max_width`, narrowest first (null: a link without lanes)")


class MachineSummary(BaseModel):
    """What a machine holds before planning: a plan keeps its built-in GPUs and replaces the cards in
    its slots with the inventory."""

    built_in_gpus: int = Field(description="GPUs that are part of the machine (SXM modules, never moved)")
    built_in_models: list[str]
    in_slots: dict[str, int] = Field(description="GPUs and SSDs now in slots, by kind: the plan's inventory "
                                                 "replaces them (they become the `current` usual layout)")
    free_slots: int = Field(description="slots a plan fills, the ones emptied of GPUs and SSDs included")
    take_gpu: int = Field(description="of those, the slots that take a GPU")
    take_ssd: int = Field(description="of those, the slots that take an SSD")
    default_gpus: int = Field(description="GPUs a plan places when the request leaves `gpus` out")


class TargetsResponse(BaseModel):
    profile: str
    links: list[Target]
    machine: MachineSummary


_GROUPS = {"switch": "Switch uplinks", "root_complex": "Root complexes", "slot": "Slots and bays"}
_GROUP_ORDER = ["Switch uplinks", "Socket and peer links", "Root complexes", "Slots and bays", "Devices"]


def _path_key(node_id: str, index: int) -> str:
    """How a `set` path names a node: its id, or its list position when the id would not parse."""
    if node_id.lstrip("-").isdigit() or any(c in node_id for c in ".[]=+ "):
        return str(index)
    return node_id


def machine_summary(topo) -> MachineSummary:
    """What `topo` holds as the planner sees it: `strip` empties the slots it will fill, and what it took
    out is what a plan replaces."""
    from moment.planner.api import resolve_gpus
    from moment.topology.devices import builtin_gpus, strip
    from moment.topology.model import Kind

    bare, removed = strip(topo)
    in_slots: dict[str, int] = {}
    for slot in removed:
        for kind in {topo.node(c).kind for c in topo.children(slot)} & {Kind.gpu, Kind.ssd}:
            in_slots[kind.value] = in_slots.get(kind.value, 0) + 1
    built = builtin_gpus(topo)
    free = bare.empty_slots()
    return MachineSummary(
        built_in_gpus=len(built), built_in_models=sorted({getattr(g, "model", "GPU") for g in built}),
        in_slots=in_slots, free_slots=len(free), take_gpu=sum(Kind.gpu in s.accepts for s in free),
        take_ssd=sum(Kind.ssd in s.accepts for s in free), default_gpus=resolve_gpus(topo, None))


def whatif_targets(topo) -> TargetsResponse:
    """The links of `topo` a what-if can change, switch uplinks and socket links first."""
    from moment.topology import bandwidth as bw
    from moment.topology.model import gen_caps, widest_uplink

    caps = gen_caps(topo)
    out: list[Target] = []
    for i, node in enumerate(topo.nodes):
        link = node.link
        if link is None or node.parent is None:
            continue
        kind = node.kind.value
        name = node.label if node.label and node.label != node.id else None
        label = f"{node.id} → {node.parent}" + (f" ({name})" if name else "")  # ids first: a cut label keeps them
        if link.label:
            label += f", {link.label}"
        props = ["gen", "width", "bandwidth_gbps"] if link.kind == "pcie" else ["bandwidth_gbps"]
        if link.bandwidth_gbps is not None:  # a measured figure wins over gen x width: change it first
            props = ["bandwidth_gbps"] + [p for p in props if p != "bandwidth_gbps"]
        cap = link.bandwidth()
        most, slot = widest_uplink(node, topo.node(node.parent)) if link.kind == "pcie" else (None, None)
        out.append(Target(
            target=f"nodes.{_path_key(node.id, i)}.link", label=label, group=_GROUPS.get(kind, "Devices"),
            kind=f"{kind} uplink", props=props,
            current={k: v for k, v in link.model_dump().items() if v is not None and k not in ("label", "kind")},
            bandwidth_gbps=None if cap == float("inf") else round(bw.gbps(cap), 3), nodes=[node.id, node.parent],
            gen_cap=GenCapOut(gen=c.gen, cpu=c.model, socket=c.socket) if (c := caps.get(node.id)) else None,
            max_width=most, max_width_slot=slot, widths=[w for w in bw.PCIE_WIDTHS if w <= most] if most else None))
    for i, pl in enumerate(topo.links):
        props = ["bandwidth_gbps", "count"] + (["gts"] if pl.kind in ("upi", "qpi") else ["gen"])
        out.append(Target(
            target=f"links.{i}", label=f"{pl.a} ↔ {pl.b}, {pl.label or pl.kind.upper()}",
            group="Socket and peer links", kind=pl.kind, props=props,
            current={k: v for k, v in pl.model_dump().items()
                     if v is not None and k not in ("a", "b", "label", "kind")},
            bandwidth_gbps=round(bw.gbps(pl.bandwidth()), 3), nodes=[pl.a, pl.b]))
    out.sort(key=lambda t: _GROUP_ORDER.index(t.group))  # stable: the profile's order within a group
    return TargetsResponse(profile=topo.name, links=out, machine=machine_summary(topo))
