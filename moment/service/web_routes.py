"""Routes the planning page needs beyond the CLI's: which links of a machine a what-if can change.

The page cannot read YAML, so the service lists a profile's changeable links (switch and slot uplinks,
socket and NVLink peer links) with their current figures and the `set` path of each, e.g.
`nodes.sw1.link` (+ `.gen=5`) or `links.0` (+ `.bandwidth_gbps=40`): the same override syntax as
`moment plan --set`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from moment.errors import MomentError

router = APIRouter(tags=["page"])

MAX_PROFILE_YAML = 1024 * 1024


class TargetsRequest(BaseModel):
    """A built-in profile by name, or a profile's YAML text (the page's upload)."""

    model_config = ConfigDict(extra="forbid")
    profile: str | None = Field(default=None, description="built-in profile name (GET /v1/profiles)")
    profile_yaml: str | None = Field(default=None, max_length=MAX_PROFILE_YAML,
                                     description="a profile in Moment's YAML format")


class Target(BaseModel):
    target: str = Field(description="`set` path of the link; append `.gen=5`, `.bandwidth_gbps=40`, ...")
    label: str
    group: str
    kind: str
    props: list[str] = Field(description="fields a what-if may set on this link, the most useful first")
    current: dict[str, Any] = Field(description="the link's fields as the profile gives them")
    bandwidth_gbps: float | None = Field(description="one-direction GB/s the planner uses now")
    nodes: list[str] = Field(description="the node ids the link joins")


class TargetsResponse(BaseModel):
    profile: str
    links: list[Target]


_GROUPS = {"switch": "Switch uplinks", "root_complex": "Root complexes", "slot": "Slots and bays"}
_GROUP_ORDER = ["Switch uplinks", "Socket and peer links", "Root complexes", "Slots and bays", "Devices"]


def _load(req: TargetsRequest):
    """The profile's raw mapping and its validated Topology; only built-in names or the request's own
    YAML text, never a path the request names."""
    import copy

    import yaml

    from moment.topology.profiles import PROFILE_DIR, builtin_names, topology_from_dict

    if (req.profile is None) == (req.profile_yaml is None):
        raise MomentError("give exactly one of 'profile' (a built-in name) or 'profile_yaml'")
    if req.profile is not None:
        if req.profile not in builtin_names():
            raise MomentError(f"unknown profile {req.profile!r}",
                              hint=f"built-in profiles: {', '.join(builtin_names())}")
        text, source = (PROFILE_DIR / f"{req.profile}.yaml").read_text(), req.profile
    else:
        text, source = req.profile_yaml, "profile_yaml"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise MomentError(f"not valid YAML{where}: {getattr(e, 'problem', e)}", source=source) from None
    topo = topology_from_dict(copy.deepcopy(data), source)
    return data, topo


def _path_key(node_id: str, index: int) -> str:
    """How a `set` path names a node: its id, or its list position when the id would not parse."""
    if node_id.isdigit() or any(c in node_id for c in ".[]=+ "):
        return str(index)
    return node_id


def targets(req: TargetsRequest) -> TargetsResponse:
    from moment.topology import bandwidth as bw

    data, topo = _load(req)
    raw_nodes = data.get("nodes") or []
    index = {n.get("id"): i for i, n in enumerate(raw_nodes) if isinstance(n, dict)}
    out: list[Target] = []
    for node in topo.nodes:
        link = node.link
        if link is None or node.parent is None:
            continue
        kind = node.kind.value
        group = _GROUPS.get(kind, "Devices")
        name = node.label if node.label and node.label != node.id else None
        label = f"{node.id} → {node.parent}"
        if name:
            label = f"{name} ({node.id}) → {node.parent}"
        if link.label:
            label += f", {link.label}"
        props = ["gen", "width", "bandwidth_gbps"] if link.kind == "pcie" else ["bandwidth_gbps"]
        if link.bandwidth_gbps is not None:
            props = ["bandwidth_gbps"] + [p for p in props if p != "bandwidth_gbps"]
        cap = link.bandwidth()
        out.append(Target(
            target=f"nodes.{_path_key(node.id, index.get(node.id, 0))}.link", label=label, group=group,
            kind=f"{kind} uplink", props=props,
            current={k: v for k, v in link.model_dump().items() if v is not None and k not in ("label", "kind")},
            bandwidth_gbps=None if cap == float("inf") else round(bw.gbps(cap), 3),
            nodes=[node.id, node.parent]))
    for i, pl in enumerate(topo.links):
        label = f"{pl.a} ↔ {pl.b}, {pl.label or pl.kind.upper()}"
        props = ["bandwidth_gbps", "count"]
        if pl.kind in ("upi", "qpi"):
            props.append("gts")
        elif pl.kind in ("nvlink", "pcie"):
            props.append("gen")
        out.append(Target(
            target=f"links.{i}", label=label, group="Socket and peer links", kind=pl.kind, props=props,
            current={k: v for k, v in pl.model_dump().items() if v is not None and k not in ("a", "b", "label", "kind")},
            bandwidth_gbps=round(bw.gbps(pl.bandwidth()), 3), nodes=[pl.a, pl.b]))
    out.sort(key=lambda t: _GROUP_ORDER.index(t.group) if t.group in _GROUP_ORDER else len(_GROUP_ORDER))
    return TargetsResponse(profile=topo.name, links=out)


@router.post("/v1/whatif/targets", response_model=TargetsResponse,
             summary="The links of a machine a what-if can change, with their `set` paths")
def whatif_targets(req: TargetsRequest) -> TargetsResponse:
    try:
        return targets(req)
    except MomentError as e:
        raise HTTPException(status_code=422, detail=str(e)) from None
