"""Routes the planning page needs beyond plan/compare: the links a what-if can change, and buying advice.

- `POST /v1/whatif/targets`: the page cannot read YAML, so the service lists a machine's changeable
  links (switch and slot uplinks, socket and NVLink peer links) with their current figures and the
  `set` path of each, e.g. `nodes.sw1.link` (+ `.gen=5`) or `links.0` (+ `.bandwidth_gbps=40`): the
  override syntax of `moment plan --set`; and what the machine holds (`machine`: built-in GPUs, the
  cards now in slots that a plan replaces, the slots a plan fills), which the page describes.
- `POST /v1/compare/machines`: `moment compare --json` rows for any machines, uploaded ones and
  what-ifs (`set`) included; `/v1/compare` takes built-in names only.
- `POST /v1/advise`: `moment advise --json` (moment.cost.advise) under the service's time limit.

`router(settings, slots)` is included into the app's /v1 router, so these routes share its prefix, its
token check, its error answers and its bound on concurrent searches.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from moment.cost.advisor import AdviseResult
from moment.planner.contracts import DataPlacement
from moment.service.deadline import Searches
from moment.service.schemas import CompareRow, MachineIn


class Target(BaseModel):
    target: str = Field(description="`set` path of the link; append `.gen=5`, `.bandwidth_gbps=40`, ...")
    label: str
    group: str
    kind: str
    props: list[str] = Field(description="fields a what-if may set on this link, the most useful first")
    current: dict[str, Any] = Field(description="the link's fields as the profile gives them")
    bandwidth_gbps: float | None = Field(description="one-direction GB/s the planner uses now (null: unlimited)")
    nodes: list[str] = Field(description="the node ids the link joins")


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


class CompareMachine(MachineIn):
    """One machine to compare; its own inventory or models, when given, replace the request's (a
    what-if's devices)."""

    gpu_model: str | None = Field(None, max_length=200)
    ssd_model: str | None = Field(None, max_length=200)
    inventory: str | None = Field(None, max_length=1000, description="this machine's own mixed inventory")


class CompareMachinesRequest(BaseModel):
    """`moment compare` over machines given as in /v1/plan: built-in names, uploads, what-if `set`s."""

    model_config = {"extra": "forbid"}

    machines: list[CompareMachine] = Field(min_length=1, max_length=16)
    gpus: int | None = Field(None, ge=0, le=256, description="GPUs to place (default 4; 0 on machines with "
                                                               "built-in GPUs)")
    ssds: int = Field(8, ge=0, le=256)
    gpu_model: str = Field("A100-PCIe-40GB", max_length=200)
    ssd_model: str = Field("P5510", max_length=200)
    inventory: str | None = Field(None, max_length=1000, description="mixed inventory, e.g. '2xA100,8xP5510'")
    data: DataPlacement = Field("planned", description="where the rows will be on the SSDs: 'planned' (the LP's "
                                "shares, DDAK) or 'even' (an equal share per SSD, hash)")


class AdviseRequest(MachineIn):
    """`moment advise`: what to buy for the machine's chassis under a budget."""

    budget: float = Field(gt=0, le=1e9, allow_inf_nan=False, description="most USD to spend: server + GPUs + SSDs")
    models: list[str] = Field(default_factory=list, max_length=32,
                              description="GPU and SSD models to consider; a kind listed none of: every priced model")
    max_gpus: int | None = Field(None, ge=0, le=256, description="at most this many GPUs (default: as many as fit)")
    max_ssds: int | None = Field(None, ge=0, le=256, description="at most this many SSDs (default: as many as fit)")
    top: int = Field(3, ge=1, le=20, description="best inventories kept per ranking")
    years: float = Field(5.0, gt=0, le=100, allow_inf_nan=False, description="TCO horizon in years")
    pue: float = Field(1.0, ge=1, le=10, allow_inf_nan=False, description="power usage effectiveness")
    utilisation: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="share of the horizon at full power")
    machine_watts: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                        description="flat machine power instead of server + device TDPs")
    feature_dim: int | None = Field(None, ge=1, le=1 << 20, description="node feature dimension (default 1024)")
    gb_per_gpu: float | None = Field(None, gt=0, le=1e9, allow_inf_nan=False)
    gpu_cache_share: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    cpu_cache_share: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    data: DataPlacement = Field("planned", description="where the rows will be on the SSDs, which each epoch "
                                "assumes: 'planned' (the LP's shares, DDAK) or 'even' (an equal share per SSD, hash)")
    prices: dict[str, Any] | None = Field(
        None, description="prices merged over the shipped table, as `moment advise --prices FILE` holds them: "
                          "{devices: {H100-PCIe-80GB: {price_usd: 27500, date: '2025-03', source: 'our quote'}}}")


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
        out.append(Target(
            target=f"nodes.{_path_key(node.id, i)}.link", label=label, group=_GROUPS.get(kind, "Devices"),
            kind=f"{kind} uplink", props=props,
            current={k: v for k, v in link.model_dump().items() if v is not None and k not in ("label", "kind")},
            bandwidth_gbps=None if cap == float("inf") else round(bw.gbps(cap), 3), nodes=[node.id, node.parent]))
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


def router(settings, slots: Searches | None = None) -> APIRouter:
    """The page's routes for the app configured by `settings` (limits), sharing its search `slots`."""
    from moment.errors import MomentError
    from moment.service.errors import error_responses

    r = APIRouter()

    @r.post("/whatif/targets", response_model=TargetsResponse, tags=["page"])
    def targets(req: MachineIn) -> TargetsResponse:
        """The links of a machine (a built-in profile or an upload) a what-if can change, with the
        `set` path of each: the planning page's link picker."""
        from moment.service.machines import machine

        topo, _ = machine(req, settings.max_upload_bytes)
        return whatif_targets(topo)

    @r.post("/compare/machines", response_model=list[CompareRow], response_model_exclude_unset=True,
            tags=["planning"], responses=error_responses(408, 429),
            dependencies=[Depends(slots.admission)] if slots is not None else [])
    def compare_machines(req: CompareMachinesRequest) -> list[dict]:
        """Plan several machines, each a built-in name or an upload with its own what-if `set`, and put
        their best layouts side by side (the rows of `moment compare --json`)."""
        from moment.planner import api
        from moment.service.deadline import run_with_deadline
        from moment.service.errors import INVENTORY_INPUTS, blame, given_beside_inventory, request_field
        from moment.service.machines import machine

        api.check_one_inventory(req.inventory is not None, flag=request_field, **given_beside_inventory(req))
        tops = []
        for i, m in enumerate(req.machines):
            try:  # a machine's own models with an inventory (its own or the request's) would be ignored
                api.check_one_inventory((m.inventory or req.inventory) is not None, flag=request_field,
                                        gpu_model=m.gpu_model, ssd_model=m.ssd_model)
                tops.append((m, *machine(m, settings.max_upload_bytes)))
            except MomentError as e:  # name the machine in the list: machines.1.profile
                if e.field is not None:
                    e.field = f"machines.{i}.{e.field}"
                raise

        def work(progress):
            rows = []
            for i, (m, topo, label) in enumerate(tops):
                inventory = m.inventory or req.inventory
                with blame(("inventory" if m.inventory is None else f"machines.{i}.inventory") if inventory else None,
                           instead_of=INVENTORY_INPUTS):
                    rows += api.compare_rows([(label, topo)], inventories=[inventory] if inventory else None,
                                             gpus=req.gpus, ssds=req.ssds, gpu_model=m.gpu_model or req.gpu_model,
                                             ssd_model=m.ssd_model or req.ssd_model, overrides=m.overrides,
                                             calibration=m.calibration, flag=request_field, progress=progress,
                                             data=req.data)
            return rows

        return run_with_deadline(work, settings.plan_timeout_s, "the comparison", slots)

    @r.post("/advise", response_model=AdviseResult, tags=["planning"], responses=error_responses(408, 429),
            dependencies=[Depends(slots.admission)] if slots is not None else [])
    def advise(req: AdviseRequest) -> AdviseResult:
        """What to buy under a budget (`moment advise --json`): inventories of one GPU and one SSD model
        placed on the chassis, best throughput per TCO dollar and best throughput, with runner-ups."""
        from pydantic import ValidationError

        from moment.cost import CostParams, advise
        from moment.cost.prices import merge_prices
        from moment.planner import api
        from moment.service.deadline import run_with_deadline
        from moment.service.errors import FieldError, blame, request_field
        from moment.service.machines import machine

        try:
            params = CostParams(years=req.years, pue=req.pue, utilisation=req.utilisation,
                                machine_power_w=req.machine_watts)
        except ValidationError as e:
            first = e.errors()[0]
            field = {"machine_power_w": "machine_watts"}.get(str(first["loc"][0]), str(first["loc"][0]))
            raise FieldError(field, first["msg"]) from None
        with blame("prices"):
            table = merge_prices(req.prices, "prices") if req.prices is not None else None
        topo, _ = machine(req, settings.max_upload_bytes)
        wl = api.workload_spec(req.feature_dim, req.gb_per_gpu, req.gpu_cache_share, req.cpu_cache_share,
                               flag=request_field)
        result = run_with_deadline(
            lambda progress: advise(topo, req.budget, models=req.models or None, max_gpus=req.max_gpus,
                                    max_ssds=req.max_ssds, workload=wl, prices=table, params=params, top_k=req.top,
                                    progress=progress, flag=request_field, data=req.data),
            settings.plan_timeout_s, "the buying advice", slots)
        return result

    return r
