"""What the jobs run: `place` (moment.placement.requests.place, as `moment place`) and `probe`
(moment.io.probing.probe, as `moment probe`). Each checks its request up front (`check_*`, run
when the job is submitted, so bad input is a 422 and not a failed job) and again when it runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from moment.placement.api import check_choices
from moment.placement.planning import check_caches
from moment.placement.requests import PlaceRequest, place
from moment.planner import api
from moment.requests import narrow
from moment.service.errors import FieldError, blame, request_field
from moment.service.jobs import JobContext
from moment.service.machines import builtin_profile_path
from moment.service.paths import inside
from moment.service.schemas import PlaceJobRequest, ProbeJobRequest
from moment.topology.profiles import load_profile
from moment.workload.graph import GraphDataset

# Imports inside functions: a route loads the planner, the readers and a job's work when it runs: the
# service starts fast, without torch.


def check_place(req: PlaceJobRequest, data_dir: Path):
    """(dataset dir, layout dir, topology, inventory) of a place request; FieldError when wrong."""
    check_choices(req.policy, req.pool)
    if any(f < 1 or f > 1000 for f in req.fanouts):
        raise FieldError("fanouts", f"each fan-out must be between 1 and 1000 (got {req.fanouts})")
    ds = inside(data_dir, "datasets", req.dataset, "dataset", must_exist=True)
    out = inside(data_dir, "layouts", req.layout, "layout")
    if out.exists() and not req.overwrite:
        raise FieldError("layout", f"{req.layout!r} already exists (set overwrite to replace it)")
    topo = load_profile(str(builtin_profile_path(req.profile)))
    inv = api.parse_inventory(None, api.resolve_gpus(topo, req.gpus, flag=request_field, model=req.gpu_model), req.ssds, req.gpu_model,
                              req.ssd_model, flag=request_field)
    with blame("dataset"):  # the caches' sizes at submit: a job would refuse them only once it ran
        check_caches(GraphDataset.open(ds), topo, inv, req.gpu_cache, req.cpu_cache, flag=request_field)
    return ds, out, topo, inv


def run_place(request: dict[str, Any], ctx: JobContext, data_dir: Path) -> dict[str, Any]:
    req = PlaceJobRequest.model_validate(request)
    ds, out, topo, inv = check_place(req, data_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = place(narrow(PlaceRequest, req, dataset=ds, out=out), machine=(topo, inv), stage=ctx.stage,
                notice=ctx.notice)
    return res.model_dump()


def check_probe(req: ProbeJobRequest, data_dir: Path, max_mib: int, max_job_mib: int) -> dict[str, Path]:
    """SSD id -> directory under DATA_DIR/probe/; FieldError (or the probe's own MomentError naming the
    field) when wrong."""
    from moment.io.probe import check_probe as probe_bounds

    probe_bounds(req.size_mib << 20, req.queue_depth, flag=probe_field)
    if req.size_mib > max_mib:
        raise FieldError("size_mib", f"{req.size_mib} is above the service's limit of {max_mib} MiB")
    if not req.ssd_dirs:
        raise FieldError("ssd_dirs", "name at least one SSD directory")
    total = req.size_mib * len(req.ssd_dirs)
    if total > max_job_mib:
        raise FieldError("size_mib", f"{len(req.ssd_dirs)} directories x {req.size_mib} MiB = {total:,} MiB of scratch "
                                     f"files, above the service's limit of {max_job_mib:,} MiB per job")
    if (data_dir / "probe").exists() and not (data_dir / "probe").is_dir():
        raise FieldError("ssd_dirs", "probe/ of the data directory is not a directory")
    out = {}
    for ssd, name in req.ssd_dirs.items():
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", ssd):
            raise FieldError("ssd_dirs", f"{ssd!r} is not an SSD id like ssd0")
        out[ssd] = inside(data_dir, "probe", name, f"ssd_dirs.{ssd}")
    return out


def run_probe(request: dict[str, Any], ctx: JobContext, data_dir: Path, max_mib: int,
              max_job_mib: int) -> dict[str, Any]:
    from moment.io.probing import ProbeRequest, probe

    req = ProbeJobRequest.model_validate(request)
    dirs = check_probe(req, data_dir, max_mib, max_job_mib)
    for ssd, d in dirs.items():
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FieldError(f"ssd_dirs.{ssd}", f"cannot create the directory: {e.strerror}") from None
    return probe(narrow(ProbeRequest, req, size_mib=req.size_mib), targets={k: str(v) for k, v in dirs.items()},
                 flag=probe_field, before=lambda what, i, n: ctx.report(what, i, n, force=True))


def probe_field(name: str) -> str:
    """How the library's probe messages name an input here: its SSD paths (`--ssd-path`) are `ssd_dirs`."""
    return "ssd_dirs" if name == "ssd_paths" else request_field(name)
