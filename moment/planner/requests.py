"""`PlanRequest`: every input of planning one machine, and `plan(req)`, the use case `moment plan` and
the service's `POST /v1/plan` both run; `ClusterPlanRequest` and `cluster_plan(req)`, the same for a
cluster (`moment plan --cluster FILE` and `POST /v1/plan/cluster`); `CompareRequest` and `compare(req)`
(`moment compare`, `POST /v1/compare`); `SimulateRequest` (`moment simulate` and `POST /v1/simulate`; its
use case, which may replay a layout, is moment.placement.simulation.simulate) and `CalibrateRequest` with
`calibrate(req)` (`moment calibrate`). The service's bodies are derived from these models, adding its uploads
and limits (moment.service.schemas).

    res = plan(PlanRequest(profile="paper-machine-b", gpus=4, ssds=8))   # -> PlanResult
    res.plan, res.json   # the Plan and `moment plan --json`'s object
    cluster_plan(ClusterPlanRequest(cluster=Path("cluster.yaml")))    # -> ClusterPlan
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field

from moment.errors import Flag, MomentError, cli_flag
from moment.outputs import atomic_write, check_output
from moment.planner import api
from moment.planner.api import (
    DATA_HELP,
    DEFAULT_DATA,
    DEFAULT_GPU_MODEL,
    DEFAULT_GPUS,
    DEFAULT_SSD_MODEL,
    DEFAULT_SSDS,
)
from moment.planner.calibration_file import UNNAMED_MACHINE, Calibration
from moment.planner.contracts import Plan
from moment.requests import Cli, Request, expect, given_fields
from moment.topology.cluster import ClusterSpec, load_cluster
from moment.workload.spec import DEFAULT_FANOUTS, FANOUTS_HELP

if TYPE_CHECKING:
    from moment.planner.cluster import ClusterPlan
    from moment.topology.model import Topology
    from moment.workload.spec import WorkloadSpec

# Imports inside functions: the requests stay light (every command's options are made from them when the CLI
# starts): a cluster's planner and the calibration's fit (SciPy) load only when their use case runs.


#: --profile left out
DEFAULT_PROFILE = "paper-machine-b"
PROFILE_HELP = "built-in profile name (see `moment profiles`) or a YAML file describing the machine"
SET_HELP = ("what-if override PATH=VALUE on the profile, repeatable: `nodes.sw1.link.gen=5`, "
            "`links.0.bandwidth_gbps=40`, `links+={a: s1, b: s2, kind: nvlink, count: 4}`; in a list, an element's "
            "id wins over an index (`nodes.3` is the node with id 3 where there is one); `nodes[sw.0]` names an id "
            "with a dot")
GPUS_HELP = (f"number of GPUs to place (default {DEFAULT_GPUS}, or as many as the free slots take where fewer, leaving one for an SSD; on "
             "machines with built-in GPUs, e.g. dgx2 or hgx-a100-8gpu, default 0: the planner places the SSDs around "
             "them)")
SSDS_HELP = f"number of NVMe SSDs to place (default {DEFAULT_SSDS})"
GPU_MODEL_HELP = f"GPU model (see `moment models`; default {DEFAULT_GPU_MODEL})"
SSD_MODEL_HELP = f"SSD model (see `moment models`; default {DEFAULT_SSD_MODEL})"
INVENTORY_HELP = ("mixed inventory, e.g. '2xA100,2xH100,8xP5510' (instead of --gpus/--ssds/--gpu-model/--ssd-model, "
                  "not with them)")
#: the inputs an inventory replaces
INVENTORY_INPUTS = ("gpus", "ssds", "gpu_model", "ssd_model")
MAXFLOW_BACKENDS = ("networkx", "ortools")
CLUSTER_HELP = ("plan a cluster from a YAML file instead of one server: servers (profile, inventory, nics, count) "
                "and the network (nic, ports, switch_gbit); each server's GPUs and SSDs as `moment plan` places "
                "them, its NICs beside the GPUs they serve, and the epoch with remote feature reads and the "
                "gradient all-reduce added (docs/cluster.md)")
REMOTE_HELP = ("with --cluster: share of the non-replicated (SSD-served) rows a machine reads from the others, 0-1 "
               "(default: the cluster file's remote_fraction, else (N-1)/N: the rows split evenly over N machines)")

_NO_DEFAULT = {"show_default": False, "default": None}  # the CLI leaves it out: the model's default
#: the counts and models of an inventory, as plan and compare both take them (the defaults: DEFAULT_* of api)
Gpus = Annotated[int | None, Cli(help=GPUS_HELP, show_default=False), Field(
    description=f"GPUs to place (default {DEFAULT_GPUS}, or as many as the free slots take where fewer, leaving one for an SSD; 0 on "
                "machines with built-in GPUs)")]
Ssds = Annotated[int, Cli(help=SSDS_HELP, **_NO_DEFAULT), Field(description="NVMe SSDs to place")]
GpuModel = Annotated[str, Cli(help=GPU_MODEL_HELP, **_NO_DEFAULT), Field(description="GPU model (GET /v1/models)")]
SsdModel = Annotated[str, Cli(help=SSD_MODEL_HELP, **_NO_DEFAULT), Field(description="SSD model (GET /v1/models)")]


class WorkloadKnobs(Request):
    """The workload knobs of `moment plan`, for one machine and for a cluster (None: the default workload)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    feature_dim: Annotated[int | None, Cli()] = Field(None, description="node feature dimension (default 1024)")
    gb_per_gpu: Annotated[float | None, Cli()] = Field(None, description="GB each GPU reads per epoch")
    gpu_cache_share: Annotated[float | None, Cli()] = Field(None, description="share of reads served by GPU caches")
    cpu_cache_share: Annotated[float | None, Cli()] = Field(None,
                                                           description="share of reads served by CPU memory")


class PlanRequest(WorkloadKnobs):
    """`moment plan`: where the inventory's GPUs and SSDs go."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    profile: Annotated[str | None, Cli(("--profile", "-p"), help=PROFILE_HELP + f" (default {DEFAULT_PROFILE})",
                                       show_default=False)] = Field(
        None, description="built-in profile name (GET /v1/profiles)")
    gpus: Gpus = None
    ssds: Ssds = DEFAULT_SSDS
    gpu_model: GpuModel = DEFAULT_GPU_MODEL
    ssd_model: SsdModel = DEFAULT_SSD_MODEL
    inventory: Annotated[str | None, Cli(help=INVENTORY_HELP)] = Field(
        None, description="mixed inventory, e.g. '2xA100,2xH100,8xP5510'")
    overrides: Annotated[list[str], Cli(("--set",), help=SET_HELP)] = Field(
        default_factory=list, alias="set",
        description="what-if overrides PATH=VALUE, as `moment plan --set`: `nodes.sw1.link.gen=5`")
    maxflow_backend: Annotated[str, Cli(help="max-flow backend for the paper's solver: networkx or ortools")] = Field(
        "ortools", description="the paper's max-flow solver")
    data: Annotated[str, Cli(help=f"{DATA_HELP}. The search ranks the placements under it; every layout is shown "
                                  "under both", metavar="planned|even", **_NO_DEFAULT)] = Field(
        DEFAULT_DATA, description=(
            "where the rows will be on the SSDs, which the prediction assumes: 'planned' (the shares the LP "
            "chooses, as `moment place` with DDAK writes them) or 'even' (an equal share per SSD, hash "
            "placement); the search ranks the placements under it, every layout is predicted under both "
            "(`predicted`, `predicted_even`)"))
    replay: Annotated[bool, Cli(help="also replay each layout's epoch step by step (`moment simulate`) next to "
                                     "the LP")] = Field(
        False, description="also replay each layout's epoch step by step")
    timeout: Annotated[float | None, Cli(
        help="stop the search after SECONDS and recommend the best placement found so far, marked 'not proven "
             "optimal' with the least epoch time any placement could reach (JSON: search.proven_optimal, "
             "search.lower_bound_s); counting and listing the placements take half of it at most, then the "
             "branch and bound searches with the rest; default: search to the end", metavar="SECONDS", show_default=False)] = Field(
        None, description="seconds for the search; default: search to the end")


@dataclass
class PlanResult:
    """What `plan()` made: the machine, the Plan, and `moment plan --json`'s object."""

    topology: Topology
    plan: Plan
    json: dict[str, Any]


def _solve_here(progress):
    return lambda work: work(progress)


def check(req: PlanRequest, *, flag: Flag = cli_flag) -> str:
    """The request's own checks (the max-flow backend, the timeout, the data placement, which it returns),
    which need no machine: `plan` runs them first."""
    if req.maxflow_backend not in MAXFLOW_BACKENDS:
        raise MomentError(f"{flag('maxflow_backend')} {req.maxflow_backend!r}: choose networkx or ortools")
    if req.timeout is not None and not (req.timeout > 0 and req.timeout < float("inf")):
        raise MomentError(f"{flag('timeout')} {req.timeout:g}: give a positive number of seconds")
    return api.check_data(req.data, flag=flag)


def plan(req: PlanRequest, *, topology: Topology | None = None, calibration: Calibration | Path | None = None,
         calibration_source: str | None = None, progress: Callable[[int, int], None] | None = None,
         flag: Flag = cli_flag, guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
         solve: Callable[[Callable[[Callable[[int, int], None] | None], Any]], Any] | None = None) -> PlanResult:
    """Plan one machine: the checks of the request, the machine, its inventory and workload, the search.

    `topology`: the machine already loaded (its `calibration` object applied); None: `req.profile` (with
    `req.overrides`) and the calibration file `calibration`. Inputs the request set beside its inventory
    are refused. `guard()` wraps the steps after those checks (the service names the field a message is
    about), `solve(work)` runs `work(progress)`, the search (the service under its time limit); messages
    spell inputs as `flag` does."""
    expect(req, PlanRequest, "moment.plan")
    data = check(req, flag=flag)
    api.check_one_inventory(req.inventory is not None, flag=flag, **given_fields(req, INVENTORY_INPUTS))
    cal = calibration
    if topology is None:
        topology, cal = api.load_topology(DEFAULT_PROFILE if req.profile is None else req.profile, calibration, req.overrides)
    if calibration_source is None:
        calibration_source = str(calibration)
    with guard():
        gpus = api.resolve_gpus(topology, req.gpus, flag=flag, model=req.gpu_model) if not req.inventory else 0
        inv = api.parse_inventory(req.inventory, gpus, req.ssds, req.gpu_model, req.ssd_model, flag=flag)
        wl = api.workload_spec(req.feature_dim, req.gb_per_gpu, req.gpu_cache_share, req.cpu_cache_share, flag=flag)
        result, out = (solve or _solve_here(progress))(
            lambda cb: api.plan_machine(topology, inv, wl, overrides=req.overrides, calibration=cal,
                                        calibration_source=calibration_source, replay=req.replay,
                                        maxflow_backend=req.maxflow_backend, progress=cb, timeout=req.timeout,
                                        data=data))
    return PlanResult(topology, result, out)


class ClusterPlanRequest(WorkloadKnobs):
    """`moment plan --cluster FILE`: every server of a cluster file planned, its NICs placed, and the epoch
    with the network's part; the workload knobs as for one machine."""

    cluster: Annotated[ClusterSpec | Path, Cli(help=CLUSTER_HELP, type=Path | None, default=None,
                                                show_default=False)] = Field(
        description="as the cluster YAML file: servers (profile, inventory, nics, count), network (nic, ports, "
                    "switch_gbit), remote_fraction, model_mb")
    remote_fraction: Annotated[float | None, Cli(help=REMOTE_HELP, show_default=False)] = Field(
        None, description="overrides the cluster's remote_fraction")


def check_cluster(req: ClusterPlanRequest, *, flag: Flag = cli_flag) -> WorkloadSpec:
    """The request's own checks (the workload, which it returns, and the remote fraction), which need no
    cluster: `cluster_plan` runs them first."""
    from moment.planner.cluster import check_remote_fraction

    wl = api.workload_spec(req.feature_dim, req.gb_per_gpu, req.gpu_cache_share, req.cpu_cache_share, flag=flag)
    check_remote_fraction(req.remote_fraction, flag("remote_fraction"))
    return wl


def cluster_plan(req: ClusterPlanRequest, *, load: Callable[[str], Topology] | None = None, flag: Flag = cli_flag,
                 progress: Callable[[int, int], None] | None = None) -> ClusterPlan:
    """Plan a cluster: the checks of the request, the cluster (`req.cluster`, a file read and checked as
    `moment plan --cluster` reads it, or a spec already checked), every server and the network
    (moment.planner.cluster.plan_cluster). `load` reads a server's profile (default: load_profile; the
    service reads built-in ones only); messages spell inputs as `flag` does."""
    expect(req, ClusterPlanRequest, "moment.cluster_plan")
    wl = check_cluster(req, flag=flag)
    spec = req.cluster if isinstance(req.cluster, ClusterSpec) else load_cluster(req.cluster)
    from moment.planner.cluster import plan_cluster

    return plan_cluster(spec, wl, remote_fraction=req.remote_fraction, remote_source=flag("remote_fraction"),
                        load=load, progress=progress)


INVENTORIES_HELP = ("repeatable: compare several inventories, e.g. '4xA100,8xP5510' (instead of "
                    "--gpus/--ssds/--gpu-model/--ssd-model)")
#: the inputs `inventories` replaces (beside it they would be ignored)
COMPARE_INVENTORY_INPUTS = ("gpus", "ssds", "gpu_model", "ssd_model")


class CompareRequest(Request):
    """`moment compare`: several built-in machines (or inventories) side by side, one what-if for all."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    profiles: Annotated[list[str], Cli(argument=True, help="profiles (names or YAML files) to put side by side")] = \
        Field(description="built-in profile names")
    gpus: Gpus = None
    ssds: Ssds = DEFAULT_SSDS
    gpu_model: GpuModel = DEFAULT_GPU_MODEL
    ssd_model: SsdModel = DEFAULT_SSD_MODEL
    inventories: Annotated[list[str], Cli(("--inventory",), help=INVENTORIES_HELP)] = Field(
        default_factory=list, description="compare several inventories, e.g. ['4xA100,8xP5510']")
    overrides: Annotated[list[str], Cli(("--set",), help=SET_HELP + " (applied to every profile)")] = Field(
        default_factory=list, alias="set", description="what-if overrides applied to every profile")
    calibration: Annotated[Path | Calibration | None, Cli(
        help="calibration from `moment calibrate --out`, applied to every profile", type=Path | None)] = Field(
        None, description="a calibration (`moment calibrate --out`, as JSON) applied to every machine")
    data: Annotated[str, Cli(help=f"{DATA_HELP}; each machine's best layout is found and shown under it",
                             metavar="planned|even", **_NO_DEFAULT)] = Field(
        DEFAULT_DATA, description=(
            "where the rows will be on the SSDs, which the prediction assumes: 'planned' (the shares the LP "
            "chooses, as `moment place` with DDAK writes them) or 'even' (an equal share per SSD, hash placement)"))


def compare(req: CompareRequest, *, machines: list[tuple[str, Topology]] | None = None, flag: Flag = cli_flag,
            guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
            solve: Callable[[Callable[[Callable[[int, int], None] | None], Any]], Any] | None = None,
            progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Plan several machines (or inventories) and put the best layouts side by side: the rows of
    `moment compare --json`.

    `machines`: (name, calibrated topology) already loaded (the service's); None: each of `req.profiles`
    with `req.overrides` and the calibration file `req.calibration`. `guard()` wraps the search (the service
    names the field a message is about), `solve(work)` runs `work(progress)` (the service under its time
    limit); messages spell inputs as `flag` does."""
    expect(req, CompareRequest, "moment.compare")
    data = api.check_data(req.data, flag=flag)
    api.check_one_inventory(bool(req.inventories), flag=flag, **given_fields(req, COMPARE_INVENTORY_INPUTS))
    cal = req.calibration if not isinstance(req.calibration, Path) else None
    if machines is None:
        if not req.profiles:  # an empty comparison is a mistake (the command refuses no profile too)
            raise MomentError("nothing to compare: give one or more profiles", hint="e.g. CompareRequest("
                              "profiles=['paper-machine-a', 'paper-machine-b'])", field="profiles")
        machines = []
        for prof in req.profiles:
            topo, cal = api.load_topology(prof, req.calibration if isinstance(req.calibration, Path) else None,
                                          req.overrides)
            machines.append((prof, topo))
    counts = given_fields(req, COMPARE_INVENTORY_INPUTS)
    with guard():
        return (solve or _solve_here(progress))(
            lambda cb: api.compare_rows(machines, inventories=req.inventories, overrides=req.overrides,
                                        calibration=cal, flag=flag, progress=cb, data=data, **counts))


# ---- simulate ----------------------------------------------------------------------------------------
CAL_HELP = "calibration file from `moment calibrate --out` (link efficiencies, SSD read scale, overhead)"
_SIMULATE_DATA_HELP = (
    "with --placement or --plan, where the rows are on the SSDs: 'planned' (the LP's shares, as DDAK writes "
    "them) or 'even' (an equal share per SSD, as hash placement gives); default: planned, with --plan the "
    "plan's (a --layout's rows are where the layout put them)")


class SimulateRequest(Request):
    """`moment simulate`: replay an epoch step by step, of a named layout (`placement`, with gpus/ssds),
    of a plan's recommended placement (`plan`) or of a real layout (`layout`, from `moment place`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    placement: Annotated[str | None, Cli(help="a layout named in the profile (e.g. paper-c) instead of --plan")] = Field(
        None, description="a layout named in the profile, e.g. paper-c")
    plan: Annotated[Plan | Path | None, Cli(("--plan",), type=Path | None,
                                            help="a `moment plan --json` file: replay its recommended placement")] = Field(
        None, description="a plan (its machine is the default profile)")
    profile: Annotated[str | None, Cli(("--profile", "-p"))] = Field(
        None, description="profile (default: the plan's or layout's machine)")
    gpus: Annotated[int, Cli(help="GPUs, with --placement")] = Field(DEFAULT_GPUS)
    ssds: Annotated[int, Cli(help="SSDs, with --placement")] = Field(DEFAULT_SSDS)
    layout: Annotated[Path | None, Cli()] = Field(
        None, description="a layout from `moment place`: replay the real trace of its dataset")
    dataset: Annotated[Path | None, Cli()] = Field(
        None, description="with --layout: dataset directory (default: the layout's)")
    fanouts: Annotated[str, Cli()] = Field(",".join(map(str, DEFAULT_FANOUTS)),
                                           description=f"with --layout: {FANOUTS_HELP}")
    batch_size: Annotated[int | None, Cli()] = Field(
        None, description="with --layout: seeds per rank and step (default: as `moment train`)")
    steps: Annotated[int | None, Cli(
        help="synthetic trace: DDP steps per epoch (default: the workload's seeds / batch / GPUs)")] = Field(
        None, description="DDP steps per epoch (default: the workload's)")
    uniform: Annotated[bool, Cli(
        help="synthetic trace with every step reading exactly the planned shares (no sampling noise)")] = Field(
        False, description="every step reads exactly the planned shares")
    seed: Annotated[int, Cli(help="seed of the synthetic trace or of the sampler")] = Field(0)
    calibration: Annotated[Calibration | Path | None, Cli(type=Path | None, help=CAL_HELP)] = Field(
        None, description="a calibration (`moment calibrate --out`) applied to the machine")
    data: Annotated[str | None, Cli(help=_SIMULATE_DATA_HELP, metavar="planned|even", show_default=False)] = Field(
        None, description="where the rows are on the SSDs, which the replayed reads follow: 'planned' or 'even'; "
                          "default: planned, with a plan the plan's")


# ---- calibrate ---------------------------------------------------------------------------------------
class CalibrateRequest(Request):
    """`moment calibrate`: fit link efficiencies and a per-epoch overhead to measured epoch times."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    measured: Annotated[Path, Cli(("--measured", "-m"))] = Field(
        description="measurement file (YAML): layouts' epoch times, device and link rates")
    profile: Annotated[str | None, Cli(("--profile", "-p"))] = Field(
        None, description="profile the layouts refer to (default: the file's machine; SSD read rates alone "
                          "need none)")
    gpus: int | None = Field(None, description="GPUs in the measured runs (default: the file's; SSD read rates "
                                               "alone need none)")
    ssds: int | None = Field(None, description="SSDs in the measured runs (default: the file's; SSD read rates "
                                               "alone need none)")
    gpu_model: str = DEFAULT_GPU_MODEL
    ssd_model: str = DEFAULT_SSD_MODEL
    fit: str | None = Field(None, description="parameters to fit (comma-separated): switch_uplink, switch_port, "
                                              "rc_port, socket_link, ssd_read, overhead_s; the others keep their "
                                              "defaults (default: switch_uplink,socket_link where a measurement depends on "
                                              "them, and ssd_read where an SSD's read rate is measured)")
    out: Annotated[Path | None, Cli(("--out", "-o"))] = Field(None, description="write the calibration (YAML) here")


def calibrate(req: CalibrateRequest) -> Calibration:
    """Fit the calibration of `req.measured` (its machine and inventory, unless the request names them),
    and write it to `req.out` when given (checked before the fit)."""
    expect(req, CalibrateRequest, "moment.calibrate")
    from moment.planner.calibration import dump_calibration, load_measurements
    from moment.planner.calibration import calibrate as fit
    from moment.topology.profiles import load_profile

    if req.out is not None:
        check_output(req.out, "--out")  # before the fit
    mf = load_measurements(req.measured)
    machine = req.profile or mf.machine
    # SSD read rates alone (`moment probe --out`) are each over the SSD model's rated rate: no machine or
    # count enters that fit, so none is asked for (the machine only names it)
    reads_only = all(m.read_gbps is not None for m in mf.measurements)
    if machine is None and not reads_only:
        raise MomentError("no machine: pass --profile or put `machine:` in the measurement file",
                          source=str(req.measured))
    topo = load_profile(machine or DEFAULT_PROFILE)  # a file's name is its `name:`, not its path
    if req.profile and mf.machine and mf.machine not in (req.profile, topo.name):
        raise MomentError(f"the measurements are of {mf.machine!r}, not {topo.name!r} (--profile {req.profile})",
                          source=str(req.measured))
    g = req.gpus if req.gpus is not None else mf.gpus
    s = req.ssds if req.ssds is not None else mf.ssds
    if reads_only:
        g, s = g or 0, s or len({m.device for m in mf.measurements})
    if g is None or s is None:
        raise MomentError("how many GPUs and SSDs were measured? pass --gpus/--ssds or put them in the file",
                          source=str(req.measured))
    inv = api.parse_inventory(None, g, s, req.gpu_model, req.ssd_model)
    cal = fit(topo, inv, mf, None if req.fit is None else [x.strip() for x in req.fit.split(",") if x.strip()],
              source=str(req.measured))
    if machine is None:
        cal.fitted_on = UNNAMED_MACHINE
    if req.out is not None:
        atomic_write(req.out, dump_calibration(cal), "--out")
    return cal
