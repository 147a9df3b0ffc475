"""`AdviseRequest`: every input of `moment advise`, and `advise(req)`, the use case `moment advise` and the
service's `POST /v1/advise` both run (the service's body is derived from this model, adding its machine
uploads and limits: moment.service.schemas), so every default is declared here once.

    res = advise(AdviseRequest(profile="paper-machine-b", budget=60000))   # -> AdviseOutcome
    res.result, res.json   # the AdviseResult and `moment advise --json`'s object
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import ConfigDict, Field, ValidationError

from moment.errors import Flag, MomentError, cli_flag
from moment.planner import api
from moment.planner.api import DEFAULT_DATA
from moment.requests import Cli, Request, expect
from moment.topology.cluster import DEFAULT_NIC

if TYPE_CHECKING:
    from moment.cost.advisor import AdviseResult
    from moment.cost.machines import MachinesOption
    from moment.cost.model import CostParams
    from moment.topology.model import Topology

# Imports inside functions: the request stays light (every command's options are made from the requests when
# the CLI starts), so the advisor and its prices load only when `advise` runs.

T = TypeVar("T")

PROFILE_HELP = "built-in profile name (see `moment profiles`) or a YAML file describing the chassis"
MODELS_HELP = ("comma-separated GPU and SSD models to consider, e.g. A100-PCIe-40GB,H100-PCIe,P5510 "
               "(see `moment models`); a kind you list none of: every priced model of that kind")
PRICES_HELP = ("YAML price file merged over the shipped table, entry by entry: "
               "`devices: {H100-PCIe-80GB: {price_usd: 27500, date: 2025-03, source: our quote}}`, "
               "`server: {price_usd: ..., power_w: ...}`, `electricity: {usd_per_kwh: ...}`")
DATA_HELP = ("where the rows will be on the SSDs, which each inventory's epoch assumes: 'planned' (default: the "
             "shares the planner chooses, as `moment place` with DDAK writes them) or 'even' (an equal share per SSD, "
             "as hash placement gives)")
#: the CostParams field each request field sets
COST_FIELDS = {"years": "years", "pue": "pue", "utilisation": "utilisation", "machine_power_w": "machine_watts"}

_NO_DEFAULT = {"show_default": False, "default": None}  # the CLI leaves it out: the model's default
_SERVICE_ONLY = Cli(cli=False)


class AdviseRequest(Request):
    """`moment advise`: what to buy for the machine's chassis under a budget."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    profile: Annotated[str, Cli(("--profile", "-p"), help=PROFILE_HELP)] = Field(
        description="built-in profile name (GET /v1/profiles)")
    budget: Annotated[float, Cli(help="most USD to spend on the machine: server + GPUs + SSDs")] = Field(
        description="most USD to spend: server + GPUs + SSDs")
    models: Annotated[list[str] | str | None, Cli(help=MODELS_HELP, type=str | None)] = Field(
        None, description="GPU and SSD models to consider; a kind listed none of: every priced model")
    max_gpus: int | None = Field(None, description="at most this many GPUs (default: as many as fit)")
    max_ssds: int | None = Field(None, description="at most this many SSDs (default: as many as fit)")
    top: Annotated[int, Cli(help="rank this many inventories per ranking: the best and its runner-ups")] = Field(
        3, description="best inventories kept per ranking")
    years: Annotated[float, Cli(help="TCO horizon in years (Hyperion: 5)")] = Field(
        5.0, description="TCO horizon in years")
    pue: Annotated[float, Cli(help="power usage effectiveness of the room (Hyperion: 1.0; a data centre ~1.4)")] = \
        Field(1.0, description="power usage effectiveness")
    utilisation: Annotated[float, Cli(help="share of the horizon the machine runs flat out (Hyperion: 1.0)")] = Field(
        1.0, description="share of the horizon at full power")
    machine_watts: Annotated[float | None, Cli(
        help="flat machine power for the electricity instead of server + TDPs (Hyperion: 4000)")] = Field(
        None, description="flat machine power instead of server + device TDPs")
    feature_dim: Annotated[int | None, _SERVICE_ONLY] = Field(
        None, description="node feature dimension (default 1024)")
    gb_per_gpu: Annotated[float | None, _SERVICE_ONLY] = Field(None, description="GB each GPU reads per epoch")
    gpu_cache_share: Annotated[float | None, _SERVICE_ONLY] = Field(
        None, description="share of reads served by GPU caches")
    cpu_cache_share: Annotated[float | None, _SERVICE_ONLY] = Field(
        None, description="share of reads served by CPU memory")
    data: Annotated[str, Cli(help=DATA_HELP, metavar="planned|even", **_NO_DEFAULT)] = Field(
        DEFAULT_DATA, description="where the rows will be on the SSDs, which each epoch assumes: 'planned' (the "
                                  "LP's shares, DDAK) or 'even' (an equal share per SSD, hash)")
    prices: Annotated[Path | dict[str, Any] | None, Cli(help=PRICES_HELP, type=Path | None)] = Field(
        None, description="prices merged over the shipped table, as `moment advise --prices FILE` holds them: "
                          "{devices: {H100-PCIe-80GB: {price_usd: 27500, date: '2025-03', source: 'our quote'}}}")
    overrides: Annotated[list[str], Cli(("--set",))] = Field(
        default_factory=list, alias="set", description="what-if override PATH=VALUE on the profile, as in `moment plan`")
    machines_max: Annotated[int | None, Cli(metavar="K", show_default=False)] = Field(None, description=(
        "also compare 1..K servers of this chassis under the same budget (each with the advice for its share, "
        "joined by --nic NICs and switch ports, planned as `moment plan --cluster`) by samples/s per TCO dollar; "
        "JSON: `machines`"))
    nic: Annotated[str | None, Cli(show_default=False)] = Field(
        None, description=f"with --machines-max: the NIC model of each server (default: {DEFAULT_NIC})")
    nics: Annotated[int | None, Cli(show_default=False)] = Field(
        None, description="with --machines-max: NICs per server (default: 1)")
    switch_gbit: Annotated[float | None, Cli(show_default=False)] = Field(
        None, description="with --machines-max: the switch's port rate in Gb/s (default: the NIC's port rate)")


@dataclass
class AdviseOutcome:
    """What `advise()` made: the advice, and with machines_max the servers compared."""

    result: AdviseResult
    machines: list[MachinesOption] | None = None

    @property
    def json(self) -> dict[str, Any]:
        """`moment advise --json`'s object."""
        out = self.result.model_dump(mode="json")
        if self.machines is not None:
            out["machines"] = [o.model_dump(mode="json") for o in self.machines]
        return out


def model_names(models: list[str] | str | None, *, flag: Flag = cli_flag) -> list[str] | None:
    """The models to consider: a comma-separated text (the CLI's) or a list; None (or none): every one."""
    if models is None or isinstance(models, list):
        return models or None
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise MomentError(f"{flag('models')} {models!r}: expected comma-separated model names, "
                          "e.g. A100-PCIe-40GB,P5510")
    return names


def cost_params(req: AdviseRequest, *, flag: Flag = cli_flag) -> CostParams:
    """The request's TCO knobs as CostParams; a bad one is one line naming its input as `flag` spells it."""
    from moment.cost.model import CostParams

    try:
        return CostParams(**{k: getattr(req, name) for k, name in COST_FIELDS.items()})
    except ValidationError as e:
        first = e.errors()[0]
        name = COST_FIELDS.get(str(first["loc"][0]), str(first["loc"][0])) if first["loc"] else "body"
        raise MomentError(f"{flag(name)}: {first['msg'].removeprefix('Value error, ')}", field=name) from None


@contextmanager
def _blame_nothing(field: str) -> Iterator[None]:
    yield


def _solve_here(label: str, work: Callable[[Callable[[int, int], None] | None], T]) -> T:
    return work(None)


def advise(req: AdviseRequest, *, machine: Callable[[], Topology] | None = None, flag: Flag = cli_flag,
           blame: Callable[[str], AbstractContextManager[Any]] = _blame_nothing,
           solve: Callable[[str, Callable[[Callable[[int, int], None] | None], Any]], Any] = _solve_here,
           jobs: int | None = 1) -> AdviseOutcome:
    """Advise what to buy: the request's checks, its TCO knobs, the prices, the machine, the advice and,
    with machines_max, the servers compared.

    `machine()` loads the chassis (None: `req.profile` with `req.overrides`); `blame(field)` wraps the steps
    about one input (the service names the field a message is about); `solve(label, work)` runs
    `work(progress)`, a search ("solving inventories", "planning clusters": the CLI's bars, the service's
    time limit); messages spell inputs as `flag` does. `jobs`: processes solving inventories (None or 0: one per core,
    up to 4; moment.cost.ahead), the same answer for any."""
    expect(req, AdviseRequest, "moment.advise")
    from moment.cost.advisor import advise as advise_inventories
    from moment.cost.advisor import check_inputs
    from moment.cost.machines import check_network, compare_machines
    from moment.cost.prices import load_prices, merge_prices
    from moment.topology.profiles import load_profile

    check_inputs(req.budget, req.top, req.max_gpus, req.max_ssds, flag=flag, jobs=jobs)
    data = api.check_data(req.data, flag=flag)
    check_network(req.machines_max, req.nic, req.nics, req.switch_gbit, flag=flag)
    params = cost_params(req, flag=flag)
    with blame("prices"):
        table = merge_prices(req.prices, "prices") if isinstance(req.prices, dict) else load_prices(req.prices)
    topo = machine() if machine is not None else load_profile(req.profile, req.overrides)
    wl = api.workload_spec(req.feature_dim, req.gb_per_gpu, req.gpu_cache_share, req.cpu_cache_share, flag=flag)
    models = model_names(req.models, flag=flag)
    result = solve("solving inventories", lambda progress: advise_inventories(
        topo, req.budget, models=models, max_gpus=req.max_gpus, max_ssds=req.max_ssds, workload=wl, prices=table,
        params=params, top_k=req.top, progress=progress, flag=flag, data=data, jobs=jobs))
    options = None
    if req.machines_max is not None:
        options = solve("planning clusters", lambda progress: compare_machines(
            topo, req.budget, req.machines_max, result, nic=req.nic or DEFAULT_NIC, nics=req.nics or 1,
            switch_gbit=req.switch_gbit, prices=table, params=params, progress=progress,
            advise_args=dict(models=models, max_gpus=req.max_gpus, max_ssds=req.max_ssds, top_k=req.top,
                             data=data, jobs=jobs)))
    return AdviseOutcome(result, options)
