"""The searches: plan a machine or a cluster, compare machines, replay an epoch, advise what to buy.

Each takes a place among the service's searches (or 429) and runs under its time limit (or 408); each
calls what the matching `moment` command calls, so `POST /v1/plan` answers what `moment plan --json`
prints for the same inputs.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations

from fastapi import APIRouter

from moment.cost.advisor import AdviseResult
from moment.cost.requests import AdviseRequest as Advice
from moment.cost.requests import advise as advise_one
from moment.errors import MomentError
from moment.planner import api
from moment.planner.cluster import ClusterPlan
from moment.planner.requests import DEFAULT_PROFILE, check_cluster
from moment.planner.requests import ClusterPlanRequest as ClusterRequest
from moment.planner.requests import CompareRequest as Comparison
from moment.planner.requests import PlanRequest as Request
from moment.planner.requests import SimulateRequest as SimulateLibRequest
from moment.planner.requests import compare as compare_many
from moment.planner.requests import plan as plan_one
from moment.requests import narrow
from moment.service.config import MiB
from moment.service.deadline import run_with_deadline
from moment.service.body import JsonRoute
from moment.service.deps import SEARCH_ERRORS, SEARCHING, SearchesDep, SettingsDep
from moment.service.errors import INVENTORY_INPUTS, FieldError, blame, given_beside_inventory, request_field
from moment.service.schemas import (
    UPLOADS,
    AdviseRequest,
    ClusterPlanRequest,
    ClusterPlanResponse,
    CompareMachinesRequest,
    CompareRequest,
    CompareRow,
    PlanRequest,
    PlanResponse,
    SimulateRequest,
    SimulateResponse,
)
from moment.topology.profiles import load_profile

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.

router = APIRouter(tags=["planning"], dependencies=SEARCHING, responses=SEARCH_ERRORS, route_class=JsonRoute)


@router.post("/plan", response_model=PlanResponse, response_model_exclude_unset=True)
def plan(req: PlanRequest, s: SettingsDep, slots: SearchesDep) -> dict:
    """Recommend which slot gets which GPU and SSD (`moment plan --json`); `diagram: true` adds the
    recommended machine's picture as `diagram_svg`."""
    from moment.service.machines import machine

    topo, _ = machine(req, s.max_upload_bytes)
    res = plan_one(narrow(Request, req), topology=topo, calibration=req.calibration, calibration_source="request",
               flag=request_field, guard=lambda: blame("inventory" if req.inventory else None,
                                                       instead_of=INVENTORY_INPUTS),
               solve=lambda work: run_with_deadline(work, s.plan_timeout_s, "the plan search", slots))
    topo, result, out = res.topology, res.plan, res.json
    if req.diagram:
        out["diagram_svg"] = api.plan_svg(topo, result)
    return out


@router.post("/plan/cluster", response_model=ClusterPlanResponse, response_model_exclude_unset=True)
def plan_cluster(req: ClusterPlanRequest, s: SettingsDep, slots: SearchesDep) -> dict:
    """Plan a cluster (`moment plan --cluster FILE --json`): each server's GPUs, SSDs and NICs, and the
    epoch with the network's part; servers name built-in profiles (GET /v1/profiles)."""
    from moment.service.machines import cluster_spec
    from moment.service.worker import plan_cluster_json, run_capped

    spec, load = cluster_spec(req.cluster)
    asked = narrow(ClusterRequest, req, cluster=spec)
    with blame("cluster"):
        check_cluster(asked, flag=request_field)
        # `cluster_plan` in a worker process: the deadline kills it, its memory is capped (moment.service.worker)
        out = run_capped(plan_cluster_json, (asked.model_dump(),), s.plan_timeout_s, "the cluster plan",
                         s.request_max_mib * MiB, slots)
    if req.diagram:
        result = ClusterPlan.model_validate(out)
        svgs: dict[int, str] = {}  # one per server entry: its machines are equal
        for m in result.machines:
            if m.server not in svgs:
                svgs[m.server] = api.plan_svg(load(m.profile), m.plan.model_copy(update={"placement": m.placement}))
        out["diagrams_svg"] = {m.name: svgs[m.server] for m in result.machines}
    return out


@router.post("/compare", response_model=list[CompareRow], response_model_exclude_unset=True)
def compare(req: CompareRequest, s: SettingsDep, slots: SearchesDep) -> list[dict]:
    """Plan several built-in machines (or inventories) and put the best layouts side by side
    (`moment compare --json`)."""
    from moment.service.machines import builtin_profile_path

    machines = []
    for i, name in enumerate(req.profiles):
        topo = load_profile(str(builtin_profile_path(name, f"profiles.{i}")), req.overrides, flag=request_field)
        with blame("calibration"):
            machines.append((name, api.calibrated(topo, req.calibration)))

    def flag(name: str) -> str:  # one `inventories` entry is what the CLI calls --inventory
        return "inventories" if name == "inventory" else name

    return compare_many(narrow(Comparison, req), machines=machines, flag=flag,
                        guard=lambda: blame("inventories" if req.inventories else None, instead_of=INVENTORY_INPUTS),
                        solve=lambda work: run_with_deadline(work, s.plan_timeout_s, "the comparison", slots))


@router.post("/simulate", response_model=SimulateResponse, response_model_exclude_unset=True)
def simulate(req: SimulateRequest, s: SettingsDep, slots: SearchesDep) -> dict:
    """Replay an epoch step by step (`moment simulate --json`): a named layout of the profile
    (`placement`, with `gpus`/`ssds`) or a plan's recommended placement (`plan`)."""
    from moment.placement.simulation import simulate as simulate_one
    from moment.service.machines import machine

    if (req.placement is None) == (req.plan is None):
        raise FieldError("placement", "give one of placement (a layout named in the profile) or plan")
    if req.plan is not None and req.profile is None and not any(getattr(req, k) for k in UPLOADS):
        req = req.model_copy(update={"profile": req.plan.machine})
    topo, _ = machine(req, s.max_upload_bytes)
    res = simulate_one(narrow(SimulateLibRequest, req), topology=topo, flag=request_field, guard=blame,
                       solve=lambda work: run_with_deadline(work, s.plan_timeout_s, "the replay", slots))
    return res.json


@router.post("/compare/machines", response_model=list[CompareRow], response_model_exclude_unset=True)
def compare_machines(req: CompareMachinesRequest, s: SettingsDep, slots: SearchesDep) -> list[dict]:
    """Plan several machines, each a built-in name or an upload with its own what-if `set`, and put
    their best layouts side by side (the rows of `moment compare --json`)."""
    from moment.service.machines import machine

    api.check_one_inventory(req.inventory is not None, flag=request_field, **given_beside_inventory(req))
    tops = []
    for i, m in enumerate(req.machines):
        try:  # a machine's own models with an inventory (its own or the request's) would be ignored
            api.check_one_inventory((m.inventory or req.inventory) is not None, flag=request_field,
                                    gpu_model=m.gpu_model, ssd_model=m.ssd_model)
            tops.append((m, *machine(m, s.max_upload_bytes)))
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

    return run_with_deadline(work, s.plan_timeout_s, "the comparison", slots)


@router.post("/advise", response_model=AdviseResult)
def advise(req: AdviseRequest, s: SettingsDep, slots: SearchesDep) -> AdviseResult:
    """What to buy under a budget (`moment advise --json`): inventories of one GPU and one SSD model
    placed on the chassis, best throughput per TCO dollar and best throughput, with runner-ups."""
    from moment.service.machines import machine

    return advise_one(narrow(Advice, req, profile=DEFAULT_PROFILE if req.profile is None else req.profile),
                      machine=lambda: machine(req, s.max_upload_bytes)[0], flag=request_field, blame=blame,
                      solve=lambda label, work: run_with_deadline(work, s.plan_timeout_s, "the buying advice",
                                                                  slots)).result
