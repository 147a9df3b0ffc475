"""`simulate(req)`: the use case `moment simulate` and the service's `POST /v1/simulate` both run (its
request, moment.planner.requests.SimulateRequest, is the planner's; a real layout's replay reads the
layout, so the use case lives here, above the placement it opens).

    res = simulate(SimulateRequest(profile="paper-machine-b", placement="paper-c"))   # -> SimulateResult
    res.report, res.json   # the ReplayReport and `moment simulate --json`'s object
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moment.errors import Flag, MomentError, cli_flag
from moment.planner import api
from moment.planner.calibration_file import Calibration
from moment.planner.requests import SimulateRequest
from moment.requests import expect
from moment.topology import checks
from moment.workload.spec import WorkloadSpec

if TYPE_CHECKING:
    from moment.planner.replay import ReplayReport
    from moment.topology.model import Topology

# Imports inside functions: a layout's replay loads the sampler (torch) and the layout's reader only when it
# runs, so the CLI and the service start fast.


@dataclass
class SimulateResult:
    """What `simulate()` made: the replay and `moment simulate --json`'s object."""

    report: ReplayReport
    json: dict[str, Any]


def _run_here(work):
    return work(None)


def simulate(req: SimulateRequest, *, topology: Topology | None = None, flag: Flag = cli_flag,
             guard: Callable[[str], AbstractContextManager[Any]] = lambda field: nullcontext(),
             solve: Callable[[Callable[[Any], Any]], Any] | None = None) -> SimulateResult:
    """Replay one of `req.plan`, `req.placement` or `req.layout`: the request's checks, the machine
    (`topology` when given, with `req.calibration` applied already; else `req.profile`, or the plan's or
    layout's machine, and the calibration file), the replay. `guard(field)` wraps a plan's replay (the
    service names the field a message is about), `solve(work)` runs `work(progress)`, the replay of a plan
    or a named layout (the service under its time limit); messages spell inputs as `flag` does."""
    expect(req, SimulateRequest, "moment.simulate")
    if sum(x is not None for x in (req.plan, req.placement, req.layout)) != 1:
        raise MomentError("give one of --plan FILE, --placement NAME (with --profile) or --layout DIR")
    api.check_replay_inputs(req.steps, req.seed, flag=flag)
    data = req.data
    if data is not None:
        api.check_data(data, flag=flag)
        if req.layout is not None:
            raise MomentError("--data does not go with --layout: the layout's rows are where `moment place` put "
                              "them", hint="leave --data out, or replay --placement NAME / --plan FILE instead")
    if req.batch_size is not None and req.batch_size <= 0:
        raise MomentError(f"--batch-size {req.batch_size}: must be positive")
    run = solve or _run_here
    cal = req.calibration if isinstance(req.calibration, Calibration) else None
    calibration_file = req.calibration if isinstance(req.calibration, Path) else None
    notes: list[str] = []
    if req.layout is not None:
        from moment.placement.reader import load_manifest

        if topology is None:
            machine = req.profile or load_manifest(req.layout).plan.machine
            if not machine:
                raise MomentError("the layout names no machine", source=str(req.layout), hint="pass --profile")
            topology, cal = api.load_topology(machine, calibration_file)
        rep = replay_layout(req.layout, topology, req.dataset, req.fanouts, req.batch_size, req.seed)
    elif req.plan is not None:
        plan = api.read_plan(req.plan) if isinstance(req.plan, Path) else req.plan
        data = data or plan.data
        if topology is None:
            topology, cal = api.load_topology(req.profile or plan.machine, calibration_file)
        api.check_plan_placement(plan, topology, str(req.plan) if isinstance(req.plan, Path) else None)

        def work(progress):
            with guard("plan"):
                return api.simulate_plan(topology, plan, steps=req.steps, seed=req.seed, uniform=req.uniform,
                                         data=data)

        rep = run(work)
        if (note := _planned_elsewhere(plan, data, rep.lp_epoch_s, topology.name)) is not None:
            notes.append(note)
    else:
        if topology is None and req.profile is None:
            raise MomentError("--placement needs --profile")
        data = api.check_data(data, flag=flag)
        if topology is None:
            topology, cal = api.load_topology(req.profile, calibration_file)
        rep = run(lambda progress: api.simulate_named(topology, req.placement, req.gpus, req.ssds, steps=req.steps,
                                                      seed=req.seed, uniform=req.uniform, flag=flag, data=data))
    notes += checks.notes(topology)  # (a link capped by its CPU, a rate above its wire: the plan says so too)
    out = api.replay_json(rep, cal, data)
    return SimulateResult(rep, {**out, "notes": notes} if notes else out)


#: how far the loaded machine's LP of a plan's placement may be from the plan's own prediction (the same LP):
#: further, the plan was made on another machine (an edited copy of a profile of the same name) or calibration
PLAN_DRIFT = 1e-3


def _planned_elsewhere(plan, data: str, lp_s: float, machine: str) -> str | None:
    """What to say when the machine loaded for `plan` gives its placement another LP time than the plan did: a plan
    from an edited copy of a built-in profile (the same name) was replayed on the built-in machine without a word."""
    try:
        planned = plan.under(data).epoch_read_s
    except ValueError:  # (no even-data prediction in it)
        return None
    if planned > 0 and abs(lp_s / planned - 1) <= PLAN_DRIFT:
        return None
    return (f"the plan predicted {planned:.2f} s for this placement, and the machine replayed here ({machine}) gives "
            f"{lp_s:.2f} s by the same LP: the plan was made on another machine (a profile file of the same name?) or "
            "calibration; give its profile with --profile FILE (and its --calibration) to replay what it planned")


def replay_layout(layout: Path, topo: Topology, dataset: Path | None, fanouts: str, batch_size: int | None,
                  seed: int) -> ReplayReport:
    """Replay a real layout: each rank's batches sampled as training samples them, looked up in the
    layout's index. Needs torch (the sampler)."""
    import numpy as np

    from moment.placement.opened import Layout
    from moment.planner.lp import solve_lp
    from moment.planner.network import build_network
    from moment.planner.replay import Replayer, layout_demands
    from moment.topology.devices import populate, strip
    from moment.topology.model import Kind
    from moment.workload.graph import GraphDataset
    from moment.workload.spec import parse_fanouts
    from moment.workload.trace import sample_trace

    opened = Layout.open(layout)
    m = opened.manifest
    bare, _ = strip(topo)
    full = populate(bare, m.plan.placement)
    n_gpu = len(full.of_kind(Kind.gpu))
    ds = GraphDataset.open(dataset) if dataset is not None else opened.dataset
    f = parse_fanouts(fanouts)
    bs = batch_size or min(8000, max(64, len(ds.train_idx) // (n_gpu * 8)))
    bins = np.asarray(np.load(layout / m.index.path, mmap_mode="r")[:, 0])
    batches = [sample_trace(ds, f, bs, seed=seed, rank=r, world_size=n_gpu).batches() for r in range(n_gpu)]
    probe = build_network(full, WorkloadSpec(bytes_per_gpu_per_epoch=1.0))
    B = layout_demands(probe, bins, m.bins.names, batches, ds.row_bytes)
    # the LP for the same bytes and the cache shares the layout realises
    total = B.sum()
    share = {t: B[:, :, [i for i, s in enumerate(probe.storage) if s.tier == t]].sum() / total
             for t in ("gpu-cache", "cpu-mem")}
    wl = WorkloadSpec(bytes_per_gpu_per_epoch=float(B.sum(axis=(0, 2)).mean()), gpu_cache_share=share["gpu-cache"],
                      cpu_cache_share=share["cpu-mem"])
    net = build_network(full, wl)
    sol = solve_lp(net)
    return Replayer(net).run(B, sol.epoch_read_s, "layout")
