"""`moment plan`, `moment compare`, `moment scan`, `moment schema`, `moment profiles`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from moment.cli import app, console
from moment.cli.common import solver_bar
from moment.errors import MomentError, validation_lines

_PROFILE_HELP = "built-in profile name (see `moment profiles`) or a YAML file describing the machine"
_SET_HELP = ("what-if override PATH=VALUE on the profile, repeatable: `nodes.sw1.link.gen=5`, "
             "`links.0.bandwidth_gbps=40`, `links+={a: s1, b: s2, kind: nvlink, count: 4}`")


def _emit_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def parse_inventory(spec: str | None, gpus: int, ssds: int, gpu_model: str, ssd_model: str):
    """`--inventory "4xA100-PCIe-40GB,8xP5510"` or --gpus/--ssds with their models."""
    from moment.topology.devices import Inventory, InventoryItem, find_model

    if spec is not None:
        if not spec.strip():
            raise MomentError("--inventory is empty: expected COUNTxMODEL[,COUNTxMODEL...], e.g. 4xA100,8xP5510",
                              hint="leave --inventory out to use --gpus/--ssds")
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


#: --gpus when left out, on a machine whose GPUs go in slots
DEFAULT_GPUS = 4
_GPUS_HELP = (f"number of GPUs to place (default {DEFAULT_GPUS}; on machines with built-in GPUs, e.g. dgx2 or "
              "hgx-a100-8gpu, default 0: the planner places the SSDs around them)")


def resolve_gpus(topo, gpus: int | None) -> int:
    """How many GPUs to place. Left out: 0 where the machine has built-in GPUs (SXM modules the planner
    never moves), else DEFAULT_GPUS. Given: a number the machine cannot take as extra cards is an
    error, except the built-in count itself, which means "its own GPUs"."""
    from moment.topology.devices import builtin_gpus, strip
    from moment.topology.model import Kind

    built = builtin_gpus(topo)
    if gpus is None:
        return 0 if built else DEFAULT_GPUS
    if not built or gpus == 0:
        return gpus
    bare = strip(topo)[0]
    if any(Kind.gpu in sl.accepts and sl.width >= 16 for sl in bare.empty_slots()):
        return gpus  # extra cards next to the built-in ones
    if gpus == len(built):
        return 0
    model = getattr(built[0], "model", "GPU")
    raise MomentError(
        f"--gpus {gpus}: {topo.name!r} has {len(built)} built-in GPUs ({model}) and no free slot for another",
        hint="leave out --gpus (or --gpus 0) to plan the SSDs around its own GPUs")


def _overrides_line(overrides: list[str]) -> str:
    return "what-if overrides (--set): " + ", ".join(overrides)


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
        lines = validation_lines(e, relabel=lambda loc: [_WORKLOAD_OPTIONS.get(".".join(map(str, loc)), "workload")])
        raise MomentError(f"workload options: {'; '.join(lines)}") from None


_WORKLOAD_OPTIONS = {"feature_dim": "--feature-dim", "bytes_per_gpu_per_epoch": "--gb-per-gpu",
                     "gpu_cache_share": "--gpu-cache-share", "cpu_cache_share": "--cpu-cache-share"}


@app.command("plan")
def plan_cmd(
    profile: str = typer.Option("paper-machine-b", "--profile", "-p", help=_PROFILE_HELP),
    gpus: int | None = typer.Option(None, "--gpus", help=_GPUS_HELP, show_default=False),
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
    if diagram is not None:
        from moment.planner.diagram import check_diagram_path

        check_diagram_path(diagram)
    topo, cal = fid.load_topology(profile, calibration, overrides)
    inv = parse_inventory(inventory, resolve_gpus(topo, gpus) if not inventory else 0, ssds, gpu_model, ssd_model)
    wl = _workload(feature_dim, bytes_per_gpu, gpu_cache_share, cpu_cache_share)
    with solver_bar(not json_out) as cb:
        plan = make_plan(topo, inv, wl, maxflow_backend=backend, progress=cb)
    plan = plan.model_copy(update={"overrides": list(overrides)})
    if diagram is not None:
        from moment.planner.diagram import write_plan_diagram

        write_plan_diagram(topo, plan, diagram)
    extra = {"calibration": fid.calibration_block(cal, calibration, plan)} if cal is not None else {}
    if replay:
        extra["replay"] = fid.replay_rows(plan, topo)
    if json_out:
        _emit_json({**plan.model_dump(mode="json"), **extra})
        return
    from moment.cli.render import render_plan

    if overrides:
        console.print(_overrides_line(overrides), highlight=False)
    render_plan(console, plan, topo)
    fid.render_extra(extra)
    if diagram is not None:
        console.print(f"diagram written to [bold]{diagram}[/]")


@app.command("compare")
def compare_cmd(
    profiles: list[str] = typer.Argument(..., help="profiles (names or YAML files) to put side by side"),
    gpus: int | None = typer.Option(None, "--gpus", help=_GPUS_HELP, show_default=False),
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
    from moment.planner.explain import bottleneck_summary
    from moment.planner.plan import make_plan
    from moment.topology.devices import builtin_gpus_note
    from moment.workload.spec import WorkloadSpec

    rows = []
    for prof in profiles:
        topo, cal = load_topology(prof, calibration, overrides)
        invs = [parse_inventory(s, 0, 0, gpu_model, ssd_model) for s in inventories] or \
            [parse_inventory(None, resolve_gpus(topo, gpus), ssds, gpu_model, ssd_model)]
        for inv in invs:
            plan = make_plan(topo, inv, WorkloadSpec())
            best_base = min(plan.baselines, key=lambda b: b.predicted.epoch_read_s, default=None)
            rows.append({
                "profile": prof, "inventory": plan.inventory, "built_in": builtin_gpus_note(topo, "").strip(),
                "overrides": list(overrides),
                "epoch_read_s": plan.predicted.epoch_read_s,
                "per_gpu_inlet_gbps": plan.predicted.per_gpu_inlet_gbps,
                "aggregate_gbps": plan.predicted.aggregate_gbps,
                "bottlenecks": plan.bottlenecks,
                "bottleneck_summary": bottleneck_summary(plan),
                "best_baseline": best_base.name if best_base else None,
                "gain_vs_best_baseline": plan.gain_vs_best_baseline,
                "placement": plan.placement,
                **calibrated_row(cal, plan),
            })
    if json_out:
        _emit_json(rows)
        return
    if overrides:
        console.print(_overrides_line(overrides) + " (applied to every profile)", highlight=False)
    _render_compare(rows)


def _compare_cells(r: dict) -> dict[str, str]:
    gain = r["gain_vs_best_baseline"]
    built = r["built_in"].split(" built-in ")[0] + " built-in GPUs" if r["built_in"] else ""
    inv = r["inventory"].replace(", ", "\n") + (f"\n+ {built}" if built else "")
    return {"profile": r["profile"], "inventory": inv, "epoch read s": f"{r['epoch_read_s']:.2f}",
            "min GB/s per GPU": f"{min(r['per_gpu_inlet_gbps']):.2f}" if r["per_gpu_inlet_gbps"] else "-",
            "aggregate GB/s": f"{r['aggregate_gbps']:.1f}", "bottlenecks": r["bottleneck_summary"] or "-",
            "vs best usual layout": f"{gain:.2f}x ({r['best_baseline']})" if gain else "-"}


#: columns that wrap between words; the others keep each line whole (names are never cut)
_WRAP = ("bottlenecks", "vs best usual layout")
#: headers of the columns that do not wrap, broken by hand
_HEAD = {"epoch read s": "epoch\nread s", "min GB/s per GPU": "min GB/s\nper GPU", "aggregate GB/s": "aggregate\nGB/s"}


def _render_compare(rows: list[dict]) -> None:
    """A table when it fits the terminal with every name whole; else one block per machine."""
    import textwrap

    cells = [_compare_cells(r) for r in rows]
    cols = list(cells[0])

    def need(col: str) -> int:
        if col in _WRAP:
            return max(len(w) for w in [x for c in cells for x in c[col].split()] + col.split())
        return max(len(line) for line in [x for c in cells for x in c[col].splitlines()]
                   + _HEAD.get(col, col).splitlines())

    widths = {c: need(c) for c in cols}
    if sum(widths.values()) + 3 * len(cols) + 1 <= console.width:
        table = Table(title="best layout per machine and inventory")
        for col in cols:
            table.add_column(_HEAD.get(col, col), no_wrap=col not in _WRAP, min_width=widths[col],
                             justify="right" if "GB/s" in col or col == "epoch read s" else "left")
        for c in cells:
            table.add_row(*c.values())
        console.print(table)
        return
    console.print("best layout per machine and inventory", style="italic", highlight=False)
    width = max(40, console.width - 1)
    for c in cells:
        console.print(Text(f"{c['profile']}: {c['inventory'].replace(chr(10), ', ')}", style="bold"),
                      soft_wrap=True, highlight=False)
        for key in cols[2:]:
            line = textwrap.fill(f"{key}: {c[key]}", width, initial_indent="  ", subsequent_indent="    ",
                                 break_long_words=False, break_on_hyphens=False)
            console.print(Text(line), soft_wrap=True, highlight=False)


@app.command("schema")
def schema_cmd(
    what: str = typer.Argument("topology", help="topology, plan or workload"),
    out: Path | None = typer.Option(None, "--out", "-o", help="write to this file instead of stdout"),
) -> None:
    """Print the JSON Schema of a profile (topology), of `plan --json` output, or of the workload."""
    from moment.outputs import atomic_write, check_output
    from moment.planner.contracts import Plan
    from moment.topology.model import Topology
    from moment.workload.spec import WorkloadSpec

    models = {"topology": Topology, "plan": Plan, "workload": WorkloadSpec}
    if what not in models:
        raise MomentError(f"schema {what!r}: choose one of {', '.join(models)}")
    if out:
        check_output(out, "--out")
    text = json.dumps(models[what].model_json_schema(), indent=2)
    if out:
        atomic_write(out, text + "\n", "--out")
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
