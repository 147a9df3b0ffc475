"""`moment plan`, `moment compare`, `moment scan`, `moment schema`, `moment profiles`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer
from rich.table import Table

from moment.cli import app, console, err_console
from moment.errors import MomentError

_PROFILE_HELP = "built-in profile name (see `moment profiles`) or a YAML file describing the machine"
_SET_HELP = ("what-if override PATH=VALUE on the profile, repeatable: `nodes.sw1.link.gen=5`, "
             "`links.0.bandwidth_gbps=40`, `links+={a: s1, b: s2, kind: nvlink, count: 4}`")


def _emit_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def parse_inventory(spec: str | None, gpus: int, ssds: int, gpu_model: str, ssd_model: str):
    """`--inventory "4xA100-PCIe-40GB,8xP5510"` or --gpus/--ssds with their models."""
    from moment.topology.devices import Inventory, InventoryItem, find_model

    if spec:
        items = []
        for part in spec.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\S+)\s*", part)
            if not m:
                raise MomentError(f"--inventory {spec!r}: expected COUNTxMODEL[,COUNTxMODEL...], e.g. 4xA100,8xP5510")
            model = find_model(m.group(2))
            items.append(InventoryItem(model=model.name, count=int(m.group(1))))
        return Inventory(items=items)
    if gpus < 0 or ssds < 0:
        raise MomentError("--gpus and --ssds must not be negative")
    find_model(gpu_model), find_model(ssd_model)
    return Inventory.simple(gpus, ssds, gpu_model, ssd_model)


def _workload(feature_dim: int | None, bytes_per_gpu_gb: float | None, gpu_share: float | None,
              cpu_share: float | None):
    from pydantic import ValidationError

    from moment.workload.spec import WorkloadSpec

    fields = {}
    if feature_dim is not None:
        fields["feature_dim"] = feature_dim
    if bytes_per_gpu_gb is not None:
        fields["bytes_per_gpu_per_epoch"] = bytes_per_gpu_gb * 1e9
    if gpu_share is not None:
        fields["gpu_cache_share"] = gpu_share
    if cpu_share is not None:
        fields["cpu_cache_share"] = cpu_share
    try:
        return WorkloadSpec(**fields)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'workload'}: {x['msg']}" for x in e.errors())
        raise MomentError(f"workload options: {msgs}") from None


def _progress_bar(enabled: bool):
    """A rich progress bar driven by the planner's progress(done, total) callback."""
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def cm():
        if not enabled:
            yield None
            return
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True) as prog:
            task = prog.add_task("solving candidates", total=None)

            def cb(done: int, total: int) -> None:
                prog.update(task, completed=done, total=total)

            yield cb

    return cm()


@app.command("plan")
def plan_cmd(
    profile: str = typer.Option("paper-machine-b", "--profile", "-p", help=_PROFILE_HELP),
    gpus: int = typer.Option(4, "--gpus", help="number of GPUs to place"),
    ssds: int = typer.Option(8, "--ssds", help="number of NVMe SSDs to place"),
    gpu_model: str = typer.Option("A100-PCIe-40GB", "--gpu-model", help="GPU model (see `moment models`)"),
    ssd_model: str = typer.Option("P5510", "--ssd-model", help="SSD model (see `moment models`)"),
    inventory: str | None = typer.Option(None, "--inventory", help="mixed inventory, e.g. '2xA100,2xH100,8xP5510'"),
    overrides: list[str] = typer.Option([], "--set", help=_SET_HELP),
    feature_dim: int | None = typer.Option(None, "--feature-dim", help="node feature dimension (default 1024)"),
    bytes_per_gpu: float | None = typer.Option(None, "--gb-per-gpu", help="GB each GPU reads per epoch"),
    gpu_cache_share: float | None = typer.Option(None, "--gpu-cache-share", help="share of reads served by GPU caches"),
    cpu_cache_share: float | None = typer.Option(None, "--cpu-cache-share", help="share of reads served by CPU memory"),
    backend: str = typer.Option("ortools", "--maxflow-backend", help="max-flow backend for the paper's solver: networkx or ortools"),
    diagram: Path | None = typer.Option(None, "--diagram", help="also draw the recommended machine to FILE.svg or FILE.png"),
    calibration: Path | None = typer.Option(None, "--calibration", help="calibration from `moment calibrate --out`, applied to the profile"),
    replay: bool = typer.Option(False, "--replay", help="also replay each layout's epoch step by step (`moment simulate`) next to the LP"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object (for scripts) instead of tables"),
) -> None:
    """Recommend which slot gets which GPU and SSD, with predicted bandwidth and bottlenecks.

    Every distinct placement of the inventory (symmetric ones pruned) is solved with the realisable
    LP; the winner and the usual layouts are then shown with both the LP and the paper's max-flow.
    Example: moment plan --profile paper-machine-b --gpus 4 --ssds 8 --diagram plan.svg
    """
    from moment.cli import fidelity_cmds as fid
    from moment.planner.plan import make_plan

    if backend not in ("networkx", "ortools"):
        raise MomentError(f"--maxflow-backend {backend!r}: choose networkx or ortools")
    topo, cal = fid.load_topology(profile, calibration, overrides)
    inv = parse_inventory(inventory, gpus, ssds, gpu_model, ssd_model)
    wl = _workload(feature_dim, bytes_per_gpu, gpu_cache_share, cpu_cache_share)
    with _progress_bar(not json_out) as cb:
        plan = make_plan(topo, inv, wl, maxflow_backend=backend, progress=cb)
    if diagram is not None:
        from moment.planner.diagram import write_diagram
        from moment.topology.devices import populate, strip

        title = (f"{plan.machine}: {plan.inventory} - epoch read {plan.predicted.epoch_read_s:.1f} s, "
                 f"min per-GPU {min(plan.predicted.per_gpu_inlet_gbps):.1f} GB/s")
        write_diagram(populate(strip(topo)[0], plan.placement), plan.links, diagram, title)
    extra = {"calibration": fid.calibration_block(cal, calibration, plan)} if cal is not None else {}
    if replay:
        extra["replay"] = fid.replay_rows(plan, topo)
    if json_out:
        _emit_json({**plan.model_dump(mode="json"), **extra})
        return
    from moment.cli.render import render_plan

    render_plan(console, plan, topo)
    fid.render_extra(extra)
    if diagram is not None:
        console.print(f"diagram written to [bold]{diagram}[/]")


@app.command("compare")
def compare_cmd(
    profiles: list[str] = typer.Argument(..., help="profiles (names or YAML files) to put side by side"),
    gpus: int = typer.Option(4, "--gpus", help="number of GPUs"),
    ssds: int = typer.Option(8, "--ssds", help="number of SSDs"),
    gpu_model: str = typer.Option("A100-PCIe-40GB", "--gpu-model"),
    ssd_model: str = typer.Option("P5510", "--ssd-model"),
    inventories: list[str] = typer.Option([], "--inventory", help="repeatable: compare several inventories, e.g. '4xA100,8xP5510'"),
    overrides: list[str] = typer.Option([], "--set", help=_SET_HELP + " (applied to every profile)"),
    calibration: Path | None = typer.Option(None, "--calibration", help="calibration from `moment calibrate --out`, applied to every profile"),
    json_out: bool = typer.Option(False, "--json", help="print a JSON list"),
) -> None:
    """Plan several machines (or inventories) and put the best layouts side by side (what-if)."""
    from moment.cli.fidelity_cmds import calibrated_row, load_topology
    from moment.planner.plan import make_plan
    from moment.workload.spec import WorkloadSpec

    invs = [parse_inventory(s, 0, 0, gpu_model, ssd_model) for s in inventories] or \
        [parse_inventory(None, gpus, ssds, gpu_model, ssd_model)]
    rows = []
    for prof in profiles:
        topo, cal = load_topology(prof, calibration, overrides)
        for inv in invs:
            plan = make_plan(topo, inv, WorkloadSpec())
            best_base = min(plan.baselines, key=lambda b: b.predicted.epoch_read_s, default=None)
            rows.append({
                "profile": prof, "inventory": plan.inventory,
                "epoch_read_s": plan.predicted.epoch_read_s,
                "per_gpu_inlet_gbps": plan.predicted.per_gpu_inlet_gbps,
                "aggregate_gbps": plan.predicted.aggregate_gbps,
                "bottlenecks": plan.bottlenecks,
                "best_baseline": best_base.name if best_base else None,
                "gain_vs_best_baseline": plan.gain_vs_best_baseline,
                "placement": plan.placement,
                **calibrated_row(cal, plan),
            })
    if json_out:
        _emit_json(rows)
        return
    table = Table(title="best layout per machine and inventory")
    for col in ("profile", "inventory", "epoch read s", "min GB/s per GPU", "aggregate GB/s", "bottlenecks", "vs best usual layout"):
        table.add_column(col)
    for r in rows:
        gain = r["gain_vs_best_baseline"]
        table.add_row(r["profile"], r["inventory"], f"{r['epoch_read_s']:.2f}", f"{min(r['per_gpu_inlet_gbps']):.2f}",
                      f"{r['aggregate_gbps']:.1f}", ", ".join(r["bottlenecks"][:3]) or "-",
                      f"{gain:.2f}x ({r['best_baseline']})" if gain else "-")
    console.print(table)


@app.command("schema")
def schema_cmd(
    what: str = typer.Argument("topology", help="topology, plan or workload"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write to this file instead of stdout"),
) -> None:
    """Print the JSON Schema of a profile (topology), of `plan --json` output, or of the workload."""
    from moment.planner.contracts import Plan
    from moment.topology.model import Topology
    from moment.topology.profiles import atomic_write
    from moment.workload.spec import WorkloadSpec

    models = {"topology": Topology, "plan": Plan, "workload": WorkloadSpec}
    if what not in models:
        raise MomentError(f"schema {what!r}: choose one of {', '.join(models)}")
    text = json.dumps(models[what].model_json_schema(), indent=2)
    if out:
        atomic_write(out, text + "\n")
        console.print(f"schema written to {out}")
    else:
        print(text)


@app.command("models")
def models_cmd(json_out: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the GPU, SSD and NIC models the planner knows (use with --gpu-model/--ssd-model)."""
    from moment.topology.devices import CATALOG

    if json_out:
        _emit_json([m.model_dump(mode="json") for m in CATALOG])
        return
    table = Table(title="device models")
    for col in ("name", "kind", "PCIe", "double width", "memory GiB", "read GB/s", "capacity GB"):
        table.add_column(col)
    for m in CATALOG:
        table.add_row(m.name, m.kind.value, f"{m.gen}.0 x{m.lanes}", "yes" if m.double_width else "",
                      f"{m.memory_gib:g}" if m.memory_gib else "", f"{m.read_gbps:g}" if m.read_gbps else "",
                      f"{m.capacity_gb:g}" if m.capacity_gb else "")
    console.print(table)


@app.command("profiles")
def profiles_cmd(json_out: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the built-in machine profiles (use them with --profile NAME)."""
    from moment.topology.profiles import builtin_names, load_profile

    rows = []
    for name in builtin_names():
        t = load_profile(name)
        rows.append({"name": name, "description": t.description or "", "counts": t.counts(),
                     "empty_slots": len(t.empty_slots())})
    if json_out:
        _emit_json(rows)
        return
    table = Table(title="built-in profiles")
    for col in ("name", "description", "empty slots", "devices"):
        table.add_column(col)
    for r in rows:
        devs = ", ".join(f"{v} {k}" for k, v in r["counts"].items() if k in ("gpu", "ssd", "nic"))
        table.add_row(r["name"], r["description"], str(r["empty_slots"]), devs or "-")
    console.print(table)
