"""Request and response bodies of the service (the OpenAPI schema is generated from these).

Field names follow the CLI's options (`gpus`, `ssd_model`, `gb_per_gpu`, `set`); unknown fields are
refused, so a typo is a 422 naming it rather than a silently ignored input.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from moment.cost import requests as cost_requests
from moment.io import probing
from moment.placement import requests as placement_requests
from moment.planner import requests as planner_requests
from moment.planner.calibration_file import Calibration
from moment.planner.cluster import ClusterPlan
from moment.planner.contracts import DataPlacement, Plan
from moment.planner.replay import ReplayReport
from moment.requests import NoTruthValueForANumber, derive
from moment.topology.cluster import ClusterSpec
from moment.topology.model import Topology
from moment.topology.scan import ScanReport
from moment.workload.spec import DEFAULT_FANOUTS

#: a machine's description uploaded as text: the field, and what it holds
UPLOADS = {
    "profile_yaml": "a profile (YAML, as `moment scan --out` writes it)",
    "nccl_xml": "an NCCL/RCCL topology XML (NCCL_TOPO_DUMP_FILE output)",
    "hwloc_xml": "an hwloc XML (`lstopo --of xml`)",
    "lspci": "saved `lspci -tv` output",
    "lspci_vvv": "saved `lspci -vvv` output (link speeds and widths)",
    "dmidecode": "saved `dmidecode -t slot` output",
    "nvidia_smi": "saved `nvidia-smi topo -m` output",
}

_Count = Field(ge=0, le=256)
_COUNT = {"ge": 0, "le": 256}
_NAME200 = {"max_length": 200}
_DATA = ("where the rows will be on the SSDs, which the prediction assumes: 'planned' (the shares the LP "
         "chooses, as `moment place` with DDAK writes them) or 'even' (an equal share per SSD, hash placement)")
_Name = Field(min_length=1, max_length=200)
#: an uploaded machine's name: MachineIn's `name`, and /v1/scan's form field of that name
MACHINE_NAME: dict[str, Any] = {"max_length": 200, "description": "name of an uploaded machine"}


class _Strict(NoTruthValueForANumber):
    """Every request body: an unknown field is refused, and a value is of its field's JSON type (`"gpus": true` and
    `"gpus": "3"` were 1 and 3 GPUs, `"diagram": 1` a diagram): strict, with the library's rule for truth values."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class MachineIn(_Strict):
    """Which machine: a built-in profile by name, or one uploaded description (text), with what-if
    overrides and a calibration. Nothing given: paper-machine-b, the CLI's default."""

    profile: str | None = Field(None, max_length=200, description="built-in profile name (GET /v1/profiles)")
    profile_yaml: str | None = Field(None, description=UPLOADS["profile_yaml"])
    nccl_xml: str | None = Field(None, description=UPLOADS["nccl_xml"])
    hwloc_xml: str | None = Field(None, description=UPLOADS["hwloc_xml"])
    lspci: str | None = Field(None, description=UPLOADS["lspci"])
    lspci_vvv: str | None = Field(None, description=UPLOADS["lspci_vvv"])
    dmidecode: str | None = Field(None, description=UPLOADS["dmidecode"])
    nvidia_smi: str | None = Field(None, description=UPLOADS["nvidia_smi"])
    name: str | None = Field(None, **MACHINE_NAME)
    overrides: list[str] = Field(
        default_factory=list, alias="set", max_length=64,
        description="what-if overrides PATH=VALUE, as `moment plan --set`: `nodes.sw1.link.gen=5`")
    calibration: Calibration | None = Field(
        None, description="a calibration (`moment calibrate --out`, as JSON) applied to the machine")


#: the workload knobs of `moment plan` (its `--feature-dim`, `--gb-per-gpu` and cache shares): the library's
#: (moment.planner.requests.WorkloadKnobs) with the service's limits
WorkloadIn = derive(
    planner_requests.WorkloadKnobs, "WorkloadIn", bases=(_Strict,), module=__name__,
    limits={"feature_dim": {"ge": 1, "le": 1 << 20}, "gb_per_gpu": {"gt": 0, "le": 1e9, "allow_inf_nan": False},
            "gpu_cache_share": {"ge": 0, "le": 1, "allow_inf_nan": False},
            "cpu_cache_share": {"ge": 0, "le": 1, "allow_inf_nan": False}})


#: `moment plan`: the library's request (moment.planner.requests), its defaults and descriptions, with the
#: machine's uploads, the service's limits and the diagram; the CLI's --timeout is the service's own limit
PlanRequest = derive(
    planner_requests.PlanRequest, "PlanRequest", bases=(MachineIn, WorkloadIn), module=__name__,
    only=("gpus", "ssds", "gpu_model", "ssd_model", "inventory", "maxflow_backend", "data", "replay"),
    types={"maxflow_backend": Literal["ortools", "networkx"], "data": DataPlacement},
    limits={"gpus": _COUNT, "ssds": _COUNT, "gpu_model": _NAME200, "ssd_model": _NAME200,
            "inventory": {"max_length": 1000}},
    extra={"diagram": (bool, Field(False, description="also return the recommended machine's diagram as "
                                                      "`diagram_svg`"))})


#: `moment plan --cluster`: the library's request (moment.planner.requests), the cluster given as the file's
#: content, with the service's limits and the diagrams
ClusterPlanRequest = derive(
    planner_requests.ClusterPlanRequest, "ClusterPlanRequest", bases=(WorkloadIn,), module=__name__,
    doc="""`moment plan --cluster`: a cluster file's content (servers name built-in profiles here) and the
    workload knobs of /v1/plan.""",
    only=("cluster", "remote_fraction"), types={"cluster": ClusterSpec},
    limits={"remote_fraction": {"ge": 0, "le": 1, "allow_inf_nan": False}},
    extra={"diagram": (bool, Field(False, description="also return each machine's diagram in `diagrams_svg` "
                                                      "(name -> SVG)"))})


class ClusterPlanResponse(ClusterPlan):
    """`moment plan --cluster --json`'s object, plus the machines' diagrams when asked."""

    diagrams_svg: dict[str, str] | None = None


class PlanResponse(Plan):
    """`moment plan --json`'s object, plus the diagram when asked."""

    calibration: dict[str, Any] | None = Field(None, description="with a calibration: its parameters and epochs")
    replay: dict[str, Any] | None = Field(None, description="with replay: each layout's replayed epoch")
    diagram_svg: str | None = Field(None, description="with diagram: the SVG text of the recommended machine")


class SimulateResponse(ReplayReport):
    """`moment simulate --json`'s object."""

    calibrated_epoch_s: float | None = Field(None, description="with a calibration: the calibrated epoch")
    data: DataPlacement | None = Field(None, description="the data placement the replayed reads follow")


class ScanResponse(Topology):
    """`moment scan --json`'s object: the machine (usable as `profile_yaml`) and what the scan read."""

    scan_report: ScanReport | None = Field(None, description="from command outputs: the sources used and missing")


#: `moment compare`: the library's request (moment.planner.requests), its defaults, with the service's limits;
#: its profiles are built-in names, its calibration is given as JSON
CompareRequest = derive(
    planner_requests.CompareRequest, "CompareRequest", bases=(_Strict,), module=__name__,
    types={"calibration": Calibration | None, "data": DataPlacement},
    limits={"profiles": {"min_length": 1, "max_length": 16}, "gpus": _COUNT, "ssds": _COUNT,
            "gpu_model": _NAME200, "ssd_model": _NAME200, "inventories": {"max_length": 16},
            "overrides": {"max_length": 64}},
    describe={"gpus": None, "ssds": None, "gpu_model": None, "ssd_model": None, "calibration": None,
              "data": _DATA})


class CompareRow(BaseModel):
    profile: str
    inventory: str
    built_in: str
    overrides: list[str]
    data: DataPlacement = Field("planned", description="the data placement the row's figures assume")
    epoch_read_s: float
    per_gpu_inlet_gbps: list[float]
    aggregate_gbps: float
    bottlenecks: list[str]
    bottleneck_summary: str
    best_baseline: str | None
    gain_vs_best_baseline: float | None
    placement: dict[str, str]
    notes: list[str] = Field(default_factory=list, description="what the row's plan says beside its figures (a "
                             "plan's `notes`: a link its CPU caps, a rate above its wire rate, ...)")
    calibrated_epoch_s: float | None = None
    calibration: dict[str, float] | None = None


#: `moment simulate`: the library's request (moment.planner.requests), its defaults, with the machine's
#: uploads and the service's limits; a real layout (`--layout`, a path) is the command line's
SimulateRequest = derive(
    planner_requests.SimulateRequest, "SimulateRequest", bases=(MachineIn,), module=__name__,
    doc="""`moment simulate`: replay an epoch step by step, of a named layout (`placement`, with gpus/ssds)
    or of a plan's recommended placement (`plan`, a `POST /v1/plan` answer).""",
    only=("placement", "plan", "gpus", "ssds", "steps", "uniform", "seed", "data"),
    types={"plan": Plan | None, "data": DataPlacement | None},
    limits={"placement": _NAME200, "gpus": _COUNT, "ssds": _COUNT, "steps": {"ge": 1, "le": 100_000},
            "seed": {"ge": 0, "le": 2**32 - 1}},
    describe={"data": _DATA + "; default: planned, with a plan the plan's"})


class CompareMachine(MachineIn):
    """One machine to compare; its own inventory or models, when given, replace the request's (a
    what-if's devices)."""

    gpu_model: str | None = Field(None, max_length=200)
    ssd_model: str | None = Field(None, max_length=200)
    inventory: str | None = Field(None, max_length=1000, description="this machine's own mixed inventory")


class CompareMachinesRequest(_Strict):
    """`moment compare` over machines given as in /v1/plan: built-in names, uploads, what-if `set`s."""

    machines: list[CompareMachine] = Field(min_length=1, max_length=16)
    gpus: int | None = Field(None, ge=0, le=256, description="GPUs to place (default 4, or as many as a machine's "
                                                               "free slots take where fewer; 0 on machines with "
                                                               "built-in GPUs)")
    ssds: int = Field(8, ge=0, le=256)
    gpu_model: str = Field("A100-PCIe-40GB", max_length=200)
    ssd_model: str = Field("P5510", max_length=200)
    inventory: str | None = Field(None, max_length=1000, description="mixed inventory, e.g. '2xA100,8xP5510'")
    data: DataPlacement = Field("planned", description="where the rows will be on the SSDs: 'planned' (the LP's "
                                "shares, DDAK) or 'even' (an equal share per SSD, hash)")


#: `moment advise`: the library's request (moment.cost.requests), its defaults and descriptions, with the
#: machine's uploads and the service's limits; the CLI's servers comparison (machines_max, nic, nics,
#: switch_gbit) is not offered here
AdviseRequest = derive(
    cost_requests.AdviseRequest, "AdviseRequest", bases=(MachineIn,), module=__name__,
    exclude=("profile", "overrides", "machines_max", "nic", "nics", "switch_gbit"),
    types={"models": list[str], "data": DataPlacement, "prices": dict[str, Any] | None},
    limits={"budget": {"gt": 0, "le": 1e9, "allow_inf_nan": False},
            "models": {"default_factory": list, "max_length": 32},
            "max_gpus": _COUNT, "max_ssds": _COUNT, "top": {"ge": 1, "le": 20},
            "years": {"gt": 0, "le": 100, "allow_inf_nan": False},
            "pue": {"ge": 1, "le": 10, "allow_inf_nan": False},
            "utilisation": {"gt": 0, "le": 1, "allow_inf_nan": False},
            "machine_watts": {"gt": 0, "le": 1e6, "allow_inf_nan": False},
            "feature_dim": {"ge": 1, "le": 1 << 20},
            "gb_per_gpu": {"gt": 0, "le": 1e9, "allow_inf_nan": False},
            "gpu_cache_share": {"ge": 0, "le": 1, "allow_inf_nan": False},
            "cpu_cache_share": {"ge": 0, "le": 1, "allow_inf_nan": False}},
    describe={"gb_per_gpu": None, "gpu_cache_share": None, "cpu_cache_share": None})


class ProfileRow(BaseModel):
    name: str
    description: str
    counts: dict[str, int]
    empty_slots: int


class FieldMessage(BaseModel):
    field: str = Field(description="the request field (dotted into nested ones) the message is about; `body`: "
                                   "the body as a whole")
    message: str


class ErrorBody(BaseModel):
    """Every error answer: `detail` for people; on a 422, `errors` per request field (a page shows each
    beside its field) and a `hint` when there is one."""

    detail: str
    errors: list[FieldMessage] | None = None
    hint: str | None = None
    remedies: list[FieldMessage] | None = Field(
        None, description="the hint's alternatives, each with the request field it changes: a client that "
                          "offers only some of those fields gives the advice it can follow")


class Health(BaseModel):
    status: Literal["ok", "degraded"] = Field(description="`degraded` (answered 503): jobs cannot run, `problem` "
                                                          "says why; the planning routes still answer")
    version: str
    auth: bool = Field(description="whether /v1 routes need a bearer token")
    problem: str | None = Field(None, description="why jobs cannot run: a job worker gone or stuck, or the job "
                                                  "database unreadable or unwritable (a full disk)")


# ---- jobs --------------------------------------------------------------------------------------------
class _PlaceNames(_Strict):
    """`moment place` as a job: a dataset and a layout named inside the service's data directory
    (DATA_DIR/datasets/NAME, DATA_DIR/layouts/NAME), never paths."""

    dataset: str = Field(min_length=1, max_length=100, description="dataset name under DATA_DIR/datasets/")
    layout: str = Field(min_length=1, max_length=100, description="layout name to write under DATA_DIR/layouts/")


#: the library's request (moment.placement.requests), its defaults, with the service's limits; the options
#: that name paths (hotness, SSD paths, a cluster file) and the split are the command line's
PlaceJobRequest = derive(
    placement_requests.PlaceRequest, "PlaceJobRequest", bases=(_PlaceNames,), module=__name__,
    doc=_PlaceNames.__doc__,
    only=("profile", "gpus", "ssds", "gpu_model", "ssd_model", "plan", "epochs", "batches", "fanouts", "batch_size",
          "gpu_cache", "cpu_cache", "pool", "policy", "overwrite", "verify", "seed"),
    types={"plan": Plan | None, "policy": Literal["ddak", "hash", "degree"],
           "fanouts": list[Annotated[int, Field(ge=1, le=1000)]]},
    limits={"profile": _NAME200, "gpus": _COUNT, "ssds": _COUNT, "gpu_model": _NAME200, "ssd_model": _NAME200,
            "epochs": {"ge": 1, "le": 100}, "batches": {"ge": 1, "le": 1_000_000},
            "fanouts": {"default_factory": lambda: list(DEFAULT_FANOUTS), "min_length": 1, "max_length": 4},
            "batch_size": {"ge": 1, "le": 1_000_000}, "gpu_cache": {"max_length": 20},
            "cpu_cache": {"max_length": 20}, "pool": {"ge": 1, "le": 1_000_000}, "seed": {"ge": 0, "le": 2**32 - 1}},
    describe={name: None for name in placement_requests.PlaceRequest.model_fields} | {
        "profile": "built-in profile name", "plan": "reuse this plan's hardware placement instead of searching",
        "gpu_cache": "GiB ('8') or a share of the features ('10%')"})


class _ProbeNames(_Strict):
    """`moment probe` as a job: each SSD's directory named inside DATA_DIR/probe/ (its scratch file is
    removed when the job ends)."""

    ssd_dirs: dict[str, str] = Field(
        default_factory=lambda: {"ssd0": "ssd0"}, max_length=64,
        description="SSD id -> directory name under DATA_DIR/probe/ (created if missing; mount an SSD there to "
                    "measure it)")


#: the library's request (moment.io.probing), its queue depth, with the service's own scratch size; the
#: options that name paths (SSD paths, outputs, a profile to write) are the command line's
ProbeJobRequest = derive(
    probing.ProbeRequest, "ProbeJobRequest", bases=(_ProbeNames,), module=__name__, doc=_ProbeNames.__doc__,
    only=("size_mib", "queue_depth"),
    limits={"size_mib": {"default": 256}},
    describe={"size_mib": "scratch file per SSD, MiB: at least what `moment probe` needs, at most the service's "
                          "limits per directory and per job",
              "queue_depth": "reads in flight, as `moment probe --queue-depth` allows"})


class Progress(BaseModel):
    stage: str = ""
    done: int = 0
    total: int | None = None


class Job(BaseModel):
    id: str
    kind: Literal["place", "probe"]
    state: Literal["queued", "running", "done", "failed", "cancelled", "interrupted"]
    progress: Progress
    request: dict[str, Any]
    result: dict[str, Any] | None = None
    error: str | None = None
    created: float
    started: float | None = None
    finished: float | None = None
