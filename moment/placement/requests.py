"""`PlaceRequest`: every option of `moment place`, and `place(req)`, the use case it runs: the whole
dataset on one machine (moment.placement.api.place), or split over `machines` machines of one hardware
or the servers of a `cluster` file (moment.placement.api.place_split). The service's place job is
derived from this model (its dataset and layout are names under its data directory, with its limits:
moment.service.schemas), so every default is declared here once.

    res = place(PlaceRequest(dataset="ds", out="L", gpus=4, fanouts="25,10"))   # -> PlaceResult
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field, field_validator

from moment.errors import MomentError
from moment.placement.defaults import DEFAULTS
from moment.planner.api import DEFAULT_GPU_MODEL, DEFAULT_SSD_MODEL, DEFAULT_SSDS, parse_inventory, resolve_gpus
from moment.planner.contracts import Plan
from moment.planner.requests import DEFAULT_PROFILE, PROFILE_HELP
from moment.requests import Cli, Request, expect
from moment.sizes import parse_size
from moment.workload.spec import DEFAULT_FANOUTS, FANOUTS_HELP, parse_fanouts

if TYPE_CHECKING:
    from moment.placement.api import PlaceResult, SplitResult, StageHook
    from moment.topology.devices import Inventory
    from moment.topology.model import Topology

# Imports inside functions: the requests stay light (every command's options are made from them when the CLI
# starts), so the placement machinery loads only when `place` runs.

CACHE_HELP = ("{what} cache per {per}: GiB (e.g. 8), a size (e.g. 512MiB, 2GB) or a share of the dataset's features "
              "(e.g. 10%); "
              "default {default}% of each {per}'s memory; capped by the dataset size")


class PlaceRequest(Request):
    """Every option of `moment place`; defaults here and nowhere else."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    dataset: Annotated[Path, Cli(("--dataset", "-d"))] = Field(
        description="dataset directory (`moment data synth/import`)")
    out: Annotated[Path, Cli(("--out", "-o"))] = Field(description="layout directory to write (must not exist)")
    profile: Annotated[str, Cli(("--profile", "-p"))] = Field(DEFAULT_PROFILE, description=PROFILE_HELP)
    gpus: Annotated[int | None, Cli(show_default=False)] = Field(
        None, description="number of GPUs (default 4; 0 on machines with built-in GPUs)")
    ssds: int = Field(DEFAULT_SSDS, description="number of NVMe SSDs")
    gpu_model: str = Field(DEFAULT_GPU_MODEL, description="GPU model (see `moment models`)")
    ssd_model: str = Field(DEFAULT_SSD_MODEL, description="SSD model (see `moment models`)")
    plan: Annotated[Plan | Path | None, Cli(type=Path | None)] = Field(
        None, description="`moment plan --json` output: reuse its hardware placement instead of searching (with "
                          "--machines, on every machine)")
    hotness: Annotated[Path | None, Cli()] = Field(
        None, description="reuse `moment data presample` output instead of pre-sampling")
    epochs: int = Field(DEFAULTS["epochs"], description="epochs to pre-sample")
    batches: int | None = Field(None, description="pre-sample only this many batches")
    fanouts: Annotated[list[int] | None, Cli(type=str | None, show_default=False)] = Field(
        None, description=f"{FANOUTS_HELP} (default: 25,10, or --hotness's)")
    batch_size: int | None = Field(
        None, description="training seeds per batch (default: as `moment train`, or --hotness's)")
    gpu_cache: str | None = Field(None, description=CACHE_HELP.format(what="GPU", per="GPU", default=25))
    cpu_cache: str | None = Field(None, description=CACHE_HELP.format(what="CPU", per="socket", default=10))
    ssd_paths: Annotated[list[str], Cli(("--ssd-path",), type=list[str] | None, default=None)] = Field(
        default_factory=list,
        description="ssdN=DIR: write SSD N's shard under DIR (repeatable; with --machines, every machine's); "
                    "default: inside the layout")
    pool: int | None = Field(
        None, description="DDAK: nodes placed per step; default: the largest (<= the paper's 100) whose hottest "
                          "nodes carry <= 1% of the smallest bin's share")
    policy: str = Field(DEFAULTS["policy"], description="which placement is written: ddak, hash or degree")
    report: bool = Field(False, description="print the per-bin table of every policy")
    overwrite: bool = Field(
        DEFAULTS["overwrite"],
        description="replace an existing layout at --out (the old one stays valid until the new one is complete)")
    verify: Annotated[bool, Cli(("--verify/--no-verify",))] = Field(
        DEFAULTS["verify"],
        description="check the dataset's files against its manifest checksums before placing (--no-verify skips "
                    "that full read, and says so; sampled blocks and the graph's structure are still checked)")
    seed: int = Field(DEFAULTS["seed"], description="pre-sampling seed (same seed = same layout)")
    machines: Annotated[int | None, Cli(show_default=False)] = Field(
        None, description="split the rows over N machines of this --profile and inventory: --out gets one layout "
                          "per machine (OUT/m0, OUT/m1, ...) and the cluster manifest")
    cluster: Path | None = Field(
        None, description="split the rows over the servers of a cluster file (`moment plan --cluster`'s): one "
                          "layout per server, named as the file names them")
    replicate: str | None = Field(
        None, description="with --machines/--cluster: the hottest rows every machine holds, GiB or a share of the "
                          "features (default: what the smallest machine's GPU and CPU caches hold)")

    @field_validator("fanouts", mode="before")
    @classmethod
    def _fanouts(cls, v: Any) -> Any:
        """The command line's `25,10` or a list."""
        return parse_fanouts(v) if isinstance(v, str) else v


def place(req: PlaceRequest, *, machine: tuple[Topology, Inventory] | None = None, stage: StageHook | None = None,
          notice: Callable[[str], None] | None = None) -> PlaceResult | SplitResult:
    """Place `req.dataset` at `req.out`: on one machine (`req.profile` and its inventory, or `machine`'s
    topology and inventory), or split over `req.machines` machines or the servers of `req.cluster`.
    Progress and notices go through `stage` and `notice` (moment.placement.api)."""
    expect(req, PlaceRequest, "moment.place")
    from moment.placement import api

    api.check_choices(req.policy, req.pool)  # before any work, as every other check that needs none
    if req.machines is not None or req.cluster is not None:
        return _place_split(req, stage, notice)
    if req.replicate is not None:
        raise MomentError("--replicate goes with --machines N or --cluster FILE (it sizes the rows every machine "
                          "holds)")
    topo, inv = machine or _machine(req)
    return api.place(req.dataset, req.out, topo, inv, **_options(req), stage=stage, notice=notice)


def _options(req: PlaceRequest) -> dict[str, Any]:
    """The request's options as moment.placement.api's keywords (the machines and the split's own aside)."""
    return dict(plan=req.plan, hotness=req.hotness, epochs=req.epochs, batches=req.batches, fanouts=req.fanouts,
                batch_size=req.batch_size, gpu_cache=req.gpu_cache, cpu_cache=req.cpu_cache, ssd_paths=req.ssd_paths,
                pool=req.pool, policy=req.policy, overwrite=req.overwrite, verify=req.verify, seed=req.seed)


def _machine(req: PlaceRequest) -> tuple[Topology, Inventory]:
    from moment.topology.profiles import load_profile

    topo = load_profile(req.profile)
    return topo, parse_inventory(None, resolve_gpus(topo, req.gpus, model=req.gpu_model), req.ssds, req.gpu_model, req.ssd_model)


def _place_split(req: PlaceRequest, stage, notice) -> SplitResult:
    """`--machines N` / `--cluster FILE`: the machines, then `place_split`."""
    from moment.placement import api
    from moment.topology.cluster import load_cluster
    from moment.topology.profiles import load_profile

    if req.machines is not None and req.cluster is not None:
        raise MomentError("--machines and --cluster both say how many machines: give one")
    if req.report:
        raise MomentError("--report does not go with --machines/--cluster: each machine's placement is its own")
    cluster = req.cluster
    if cluster is not None:  # --machines N: N machines of one hardware, which one plan and SSD ids fit
        for flag, on in (("--plan", req.plan is not None), ("--ssd-path", bool(req.ssd_paths))):
            if on:
                raise MomentError(f"{flag} does not go with --cluster: each server is planned for its own hardware",
                                  hint=f"{flag} goes with --machines N (machines of one --profile and inventory)")
        spec = load_cluster(cluster)
        topos, invs = {}, {}
        for i, sv in enumerate(spec.servers):
            try:
                topos[id(sv)] = load_profile(sv.profile)
            except MomentError as e:
                raise MomentError(f"servers[{i}].profile: {str(e).splitlines()[0]}", source=str(cluster),
                                  hint=e.hint) from None
            invs[id(sv)] = parse_inventory(sv.inventory, 0, 0, flag=lambda name, w=f"servers[{i}]": f"{w}.{name}")
        group = [api.SplitMachine(name, topos[id(sv)], invs[id(sv)]) for name, sv in spec.machines()]
    else:
        if req.machines < 1:
            raise MomentError(f"--machines {req.machines}: a split needs at least 1 machine",
                              hint="leave --machines out to place the whole dataset on one machine")
        topo, inv = _machine(req)
        group = [api.SplitMachine(f"m{k}", topo, inv) for k in range(req.machines)]
    return api.place_split(req.dataset, req.out, group, replicate=req.replicate, **_options(req), stage=stage,
                       notice=notice)


class PackRequest(Request):
    """Every option of `moment data pack` (the batches `moment train` will read, packed); defaults here and
    nowhere else. The use case that runs it, `pack(req)`, is moment.runtime.packing's: it sizes the batches
    and the caches as the training run will."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    layout: Annotated[Path, Cli(("--layout",))] = Field(description="layout directory written by `moment place`")
    dataset: Path | None = Field(None, description="dataset directory (default: the layout's)")
    ranks: int = Field(1, description="training ranks (torchrun --nproc-per-node x nodes)")
    epochs: int = Field(1, description="epochs to pack; later epochs read the layout")
    fanouts: Annotated[list[int], Cli(type=str, default=",".join(map(str, DEFAULT_FANOUTS)))] = (
        Field(default_factory=lambda: list(DEFAULT_FANOUTS), description=FANOUTS_HELP))
    batch_size: int | None = Field(None, description="seeds per rank and batch (default: the training default)")
    seed: int = Field(0, description="the training run's --seed")
    cached: str | None = Field(
        None, description="hottest rows the caches will hold and the pack leaves out: rows, a share (30%) or bytes "
                          "(2GiB); for a fitted pack (--fitted, or a machine with a GPU driver) the default is the layout's GPU "
                          "and CPU bins, or --memory-budget's CPU cache")
    memory_budget: str | None = Field(
        None, description="the training run's budget: leave out the rows its CPU cache will hold (static policy)")
    whole: Annotated[bool | None, Cli(("--whole/--fitted",), show_default="whole on a machine with no GPU driver")] = (
        Field(None, description="--whole: every row of each batch, none left out for the caches: a run on CPU reads "
                                "each batch straight into its own buffer, no row copied, for about twice the disk "
                                "reads; --fitted: the caches' rows left out (the layout's GPU and CPU bins, or "
                                "--cached / --memory-budget's), half the reads, what a CUDA run's batches suit"))
    overwrite: bool = Field(False, description="replace the layout's pack")

    @field_validator("fanouts", mode="before")
    @classmethod
    def _fanouts(cls, v: Any) -> Any:
        """The command line's `25,10` or a list."""
        return parse_fanouts(v) if isinstance(v, str) else v


def cached_rows(text: str, n: int, row_bytes: int) -> int:
    """--cached: a row count, a share of the rows, or bytes."""
    t = text.strip()
    if t.isdigit():
        rows = int(t)
    else:
        try:
            rows = (parse_size(t, n * row_bytes) or 0) // row_bytes
        except MomentError as e:
            raise MomentError(f"--cached {text!r}: {e}") from None
    if not 0 <= rows <= n:
        raise MomentError(f"--cached {text!r}: must be between 0 and {n} rows")
    return rows
