"""`moment simulate`, `moment calibrate`, `moment probe`: how far the planner's predictions can be trusted."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from moment.cli import app, console
from moment.errors import MomentError
from moment.outputs import atomic_write, check_output
from moment.workload.spec import FANOUTS_HELP, WorkloadSpec

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

_CAL_HELP = "calibration file from `moment calibrate --out` (link efficiencies, SSD read scale, overhead)"


def _emit_json(obj) -> None:
    print(json.dumps(obj, indent=2))


def load_topology(profile: str, calibration: Path | None, overrides: list[str] | None = None):
    """The profile, with the calibration applied when one is given: (topology, calibration or None)."""
    from moment.planner.api import load_topology as load

    return load(profile, calibration, overrides)


# ---- simulate ----------------------------------------------------------------------------------------
def _layout_replay(layout: Path, topo, dataset: Path | None, fanouts: str, batch_size: int | None, seed: int):
    """Replay a real layout: each rank's batches sampled as training samples them, looked up in the
    layout's index. Needs torch (the sampler)."""
    import numpy as np

    from moment.cli.common import parse_fanouts
    from moment.placement.opened import Layout
    from moment.planner.lp import solve_lp
    from moment.planner.network import build_network
    from moment.planner.replay import Replayer, layout_demands
    from moment.topology.devices import populate, strip
    from moment.topology.model import Kind
    from moment.workload.graph import GraphDataset
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


@app.command("simulate")
def simulate_cmd(
    plan_file: Path | None = typer.Option(None, "--plan", help="a `moment plan --json` file: replay its recommended placement"),
    profile: str | None = typer.Option(None, "--profile", "-p", help="profile (default: the plan's or layout's machine)"),
    placement: str | None = typer.Option(None, "--placement", help="a layout named in the profile (e.g. paper-c) instead of --plan"),
    gpus: int = typer.Option(4, "--gpus", help="GPUs, with --placement"),
    ssds: int = typer.Option(8, "--ssds", help="SSDs, with --placement"),
    layout: Path | None = typer.Option(None, "--layout", help="a layout from `moment place`: replay the real trace of its dataset"),
    dataset: Path | None = typer.Option(None, "--dataset", help="with --layout: dataset directory (default: the layout's)"),
    fanouts: str = typer.Option("25,10", "--fanouts", help=f"with --layout: {FANOUTS_HELP}"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="with --layout: seeds per rank and step (default: as `moment train`)"),
    steps: int | None = typer.Option(None, "--steps", help="synthetic trace: DDP steps per epoch (default: the workload's seeds / batch / GPUs)"),
    uniform: bool = typer.Option(False, "--uniform", help="synthetic trace with every step reading exactly the planned shares (no sampling noise)"),
    seed: int = typer.Option(0, "--seed", help="seed of the synthetic trace or of the sampler"),
    calibration: Path | None = typer.Option(None, "--calibration", help=_CAL_HELP),
    data: str | None = typer.Option(None, "--data", help=(
        "with --placement or --plan, where the rows are on the SSDs: 'planned' (the LP's shares, as DDAK writes "
        "them) or 'even' (an equal share per SSD, as hash placement gives); default: planned, with --plan the "
        "plan's (a --layout's rows are where the layout put them)"), metavar="planned|even", show_default=False),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Replay an epoch step by step on the capacity graph and compare it with the aggregate LP.

    Each DDP step: every GPU's reads per storage node (synthetic from the plan's shares, or the real
    sampled batches of a layout), the link sharing of that step, and the step barrier (the slowest
    GPU sets the pace). Reports the epoch, per-GPU busy/idle time, the links that limit most steps and
    why the replay differs from the LP. Example: moment simulate --profile paper-machine-b --placement paper-c
    """
    from moment.planner import api

    if sum(x is not None for x in (plan_file, placement, layout)) != 1:
        raise MomentError("give one of --plan FILE, --placement NAME (with --profile) or --layout DIR")
    api.check_replay_inputs(steps, seed)
    if data is not None:
        api.check_data(data)
        if layout is not None:
            raise MomentError("--data does not go with --layout: the layout's rows are where `moment place` put "
                              "them", hint="leave --data out, or replay --placement NAME / --plan FILE instead")
    if batch_size is not None and batch_size <= 0:
        raise MomentError(f"--batch-size {batch_size}: must be positive")
    if layout is not None:
        from moment.placement.reader import load_manifest

        machine = profile or load_manifest(layout).plan.machine
        if not machine:
            raise MomentError("the layout names no machine", source=str(layout), hint="pass --profile")
        topo, cal = load_topology(machine, calibration)
        rep = _layout_replay(layout, topo, dataset, fanouts, batch_size, seed)
    elif plan_file is not None:
        plan = api.read_plan(plan_file)
        data = data or plan.data
        topo, cal = load_topology(profile or plan.machine, calibration)
        rep = api.simulate_plan(topo, plan, steps=steps, seed=seed, uniform=uniform, data=data)
    else:
        if profile is None:
            raise MomentError("--placement needs --profile")
        data = api.check_data(data)
        topo, cal = load_topology(profile, calibration)
        rep = api.simulate_named(topo, placement, gpus, ssds, steps=steps, seed=seed, uniform=uniform, data=data)
    out = api.replay_json(rep, cal, data)
    if json_out:
        _emit_json(out)
        return
    _render_replay(rep, out.get("calibrated_epoch_s"))


def _render_replay(rep, calibrated: float | None) -> None:
    t = Table(title=f"per-step replay ({rep.source} trace, {rep.steps} steps)")
    for c in ("GPU", "GB read", "busy s", "idle s", "mean GB/s"):
        t.add_column(c)
    for g in rep.per_gpu:
        t.add_row(g.gpu, f"{g.bytes / 1e9:.1f}", f"{g.busy_s:.2f}", f"{g.idle_s:.2f}", f"{g.mean_gbps:.2f}")
    console.print(t)
    console.print(f"epoch read time: {rep.epoch_s:.2f} s replayed, {rep.lp_epoch_s:.2f} s LP "
                  f"({rep.replay_vs_lp:+.2%})" + (f"; calibrated epoch {calibrated:.2f} s" if calibrated else ""))
    console.print(rep.why)
    if rep.limiting_links:
        console.print("links that limit steps: " + ", ".join(
            f"{x.id} ({x.share_of_steps:.0%})" for x in rep.limiting_links[:6]))


# ---- calibrate ---------------------------------------------------------------------------------------
@app.command("calibrate")
def calibrate_cmd(
    measured: Path = typer.Option(..., "--measured", "-m", help="measurement file (YAML): layouts' epoch times, device and link rates"),
    profile: str | None = typer.Option(None, "--profile", "-p", help="profile the layouts refer to (default: the file's machine)"),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs in the measured runs (default: the file's)"),
    ssds: int | None = typer.Option(None, "--ssds", help="SSDs in the measured runs (default: the file's)"),
    gpu_model: str = typer.Option("A100-PCIe-40GB", "--gpu-model"),
    ssd_model: str = typer.Option("P5510", "--ssd-model"),
    fit_names: str | None = typer.Option(None, "--fit",
                                         help="parameters to fit (comma-separated): switch_uplink, switch_port, "
                                              "rc_port, socket_link, ssd_read, overhead_s; the others keep their "
                                              "defaults (default: switch_uplink,socket_link)"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write the calibration (YAML) here"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Fit link efficiencies and a per-epoch overhead to measured epoch times by bounded least squares.

    Prints each parameter (with its meaning and bounds), each measurement's residual and the
    leave-one-out error (each measurement predicted by a fit without it). Apply the result with
    `moment plan|compare|simulate --calibration CAL.yaml`.
    """
    from moment.planner.api import parse_inventory
    from moment.planner.calibration import DEFAULT_FIT, PARAMS, calibrate, dump_calibration, load_measurements
    from moment.topology.profiles import load_profile

    if out is not None:
        check_output(out, "--out")  # before the fit
    mf = load_measurements(measured)
    machine = profile or mf.machine
    if machine is None:
        raise MomentError("no machine: pass --profile or put `machine:` in the measurement file", source=str(measured))
    topo = load_profile(machine)  # a file's name is its `name:`, not its path
    if profile and mf.machine and mf.machine not in (profile, topo.name):
        raise MomentError(f"the measurements are of {mf.machine!r}, not {topo.name!r} (--profile {profile})",
                          source=str(measured))
    g = gpus if gpus is not None else mf.gpus
    s = ssds if ssds is not None else mf.ssds
    if g is None or s is None:
        raise MomentError("how many GPUs and SSDs were measured? pass --gpus/--ssds or put them in the file",
                          source=str(measured))
    inv = parse_inventory(None, g, s, gpu_model, ssd_model)
    cal = calibrate(topo, inv, mf, list(DEFAULT_FIT) if fit_names is None else
                    [x.strip() for x in fit_names.split(",") if x.strip()])
    if out is not None:
        atomic_write(out, dump_calibration(cal), "--out")
    if json_out:
        _emit_json({"params": cal.params, "fitted": cal.fitted,
                    "residuals": [r.model_dump(mode="json") for r in cal.residuals],
                    "loo_max_rel_err": cal.loo_max_rel_err})
        return
    t = Table(title=f"calibration fitted on {cal.fitted_on} ({cal.inventory})")
    for c in ("parameter", "value", "bounds", "fitted", "meaning"):
        t.add_column(c)
    for k, p in PARAMS.items():
        t.add_row(k, f"{cal.params[k]:.3f} {p.unit}", f"[{p.lo:g}, {p.hi:g}]", "yes" if k in cal.fitted else "",
                  p.meaning)
    console.print(t)
    r = Table(title="measurements")
    for c in ("measured", "value", "predicted", "error", "left-one-out predicted", "LOO error"):
        r.add_column(c)
    for x in cal.residuals:
        r.add_row(x.layout, f"{x.measured_s:.2f}", f"{x.predicted_s:.2f}", f"{x.rel_err:+.1%}",
                  f"{x.loo_predicted:.2f}" if x.loo_predicted is not None else "-",
                  f"{x.loo_rel_err:+.1%}" if x.loo_rel_err is not None else "-")
    console.print(r)
    if cal.loo_max_rel_err is not None:
        console.print(f"largest leave-one-out error: {cal.loo_max_rel_err:.1%}")
    if out is not None:
        console.print(f"calibration written to [bold]{out}[/]")


# ---- probe -------------------------------------------------------------------------------------------
@app.command("probe")
def probe_cmd(
    ssd_paths: list[str] = typer.Option([], "--ssd-path", help="SSDID=DIRECTORY on that SSD's file system, repeatable (default: ssd0=.)"),
    size_mib: int = typer.Option(1024, "--size-mib", help="scratch file per SSD, MiB (removed afterwards unless --keep-scratch)"),
    keep_scratch: bool = typer.Option(False, "--keep-scratch", help="leave the scratch files for the next probe of the same size"),
    queue_depth: int = typer.Option(32, "--queue-depth", help="reads in flight (as fio's iodepth)"),
    profile: str | None = typer.Option(None, "--profile", "-p", help="profile (e.g. a `moment scan` output) to write measured overrides into"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write a measurement file (`moment calibrate --measured`)"),
    profile_out: Path | None = typer.Option(None, "--profile-out", help="write --profile with the measured SSD read rates and memory bandwidth"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Measure this machine through Moment's own I/O stack: each SSD's direct-I/O read rate and
    random 4 KiB IOPS, memory copy bandwidth, and (only where CUDA is present) host<->GPU and
    GPU<->GPU copy rates. Example: moment probe --ssd-path ssd0=/mnt/nvme0 --out measured.yaml"""
    import yaml

    from moment.io.probe import check_probe, probe_machine
    from moment.placement.planning import parse_ssd_paths
    from moment.topology.profiles import dump_yaml, load_profile

    targets = parse_ssd_paths(ssd_paths) if ssd_paths else {"ssd0": "."}
    check_probe(size_mib << 20, queue_depth)
    if profile_out is not None and profile is None:
        raise MomentError("--profile-out needs --profile (the profile to write the measurements into)")
    for path, flag in ((out, "--out"), (profile_out, "--profile-out")):  # before minutes of measuring
        if path is not None:
            check_output(path, flag)
    topo = load_profile(profile) if profile_out is not None else None
    result = probe_machine(targets, file_bytes=size_mib << 20, queue_depth=queue_depth, keep=keep_scratch)
    ssd = result["ssd"]
    if out is not None:
        doc = {"machine": profile, "measurements": [{"device": k, "read_gbps": round(v["seq_read_gbps"], 4)}
                                                    for k, v in ssd.items()], "probe": result}
        atomic_write(out, yaml.safe_dump(doc, sort_keys=False), "--out")
    if topo is not None:
        data = topo.model_dump()
        for n in data["nodes"]:
            if n["id"] in ssd and n["kind"] == "ssd":
                n["read_gbps"] = ssd[n["id"]]["seq_read_gbps"]
            if n["kind"] == "socket":
                n["memory_bandwidth_gbps"] = result["memory_copy_gbps"] / 2  # copy = read + write
        from moment.topology.model import Topology

        atomic_write(profile_out, dump_yaml(Topology.model_validate(data), "measured by `moment probe`"),
                     "--profile-out")
    if json_out:
        _emit_json(result)
        return
    t = Table(title="probe (direct I/O through Moment's I/O stack)")
    for c in ("SSD", "read GB/s", "random 4 KiB IOPS", "direct", "engine"):
        t.add_column(c)
    for k, v in ssd.items():
        t.add_row(k, f"{v['seq_read_gbps']:.2f}", f"{v['rand_read_iops']:,.0f}", str(v["direct"]), v["backend"])
    console.print(t)
    console.print(f"memory copy: {result['memory_copy_gbps']:.1f} GB/s; CUDA: "
                  + ("not present" if result["cuda"] is None else json.dumps(result["cuda"])))
