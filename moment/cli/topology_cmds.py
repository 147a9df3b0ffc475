"""`moment plan`, `moment compare`, `moment scan`, `moment schema`, `moment profiles`."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from moment.cli import app, console
from moment.cli.common import FRESH_HELP, solver_bar
from moment.cli.requests import given, request_options
from moment.errors import MomentError
from moment.outputs import atomic_write, check_output
from moment.planner import api

# the inputs are parsed with the planner's JSON (the service parses the same way)
from moment.planner.api import models_json, profiles_json
from moment.planner.requests import (
    ClusterPlanRequest,
    CompareRequest,
    PlanRequest,
    check,
    check_cluster,
    cluster_plan,
    compare,
    plan,
)
from moment.workload.spec import WorkloadSpec

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


def _emit_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False))


def _overrides_line(overrides: list[str]) -> str:
    return "what-if overrides (--set): " + escape(", ".join(overrides))  # `accepts=[gpu]` is no markup


#: the options of the cluster form only (`moment plan --cluster FILE`); its workload knobs are PlanRequest's
_CLUSTER_ONLY = tuple(n for n in ClusterPlanRequest.model_fields if n not in PlanRequest.model_fields)


@app.command("plan")
@request_options(PlanRequest, ClusterPlanRequest, order=(
    "profile", "gpus", "ssds", "gpu_model", "ssd_model", "inventory", "overrides", "feature_dim", "gb_per_gpu",
    "gpu_cache_share", "cpu_cache_share", "maxflow_backend", "diagram", "calibration", "replay", "data", "timeout"))
def plan_cmd(
    diagram: Path | None = typer.Option(None, "--diagram", help="also draw the recommended machine to FILE.svg or FILE.png"),
    calibration: Path | None = typer.Option(None, "--calibration", help="calibration from `moment calibrate --out`, applied to the profile"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object (for scripts) instead of tables"),
    fresh: bool = typer.Option(False, "--fresh", help=FRESH_HELP),
    **options,
) -> None:
    """Recommend which slot gets which GPU and SSD, with predicted bandwidth and bottlenecks.

    Every distinct placement of the inventory (symmetric ones pruned) is solved with the realisable
    LP; the winner and the usual layouts are then shown with both the LP and the paper's max-flow.
    On a machine whose distinct placements are too many to list (many slots of mixed widths and
    generations) a branch and bound finds the optimum instead, with a progress bar on stderr.
    With --cluster FILE, every server of a cluster is planned and its NICs placed (--json, tables,
    --diagram FILE.svg draws one picture per machine: FILE-NAME.svg).
    A question answered before (the same options, input files, terminal and code) prints the kept
    answer at once, with the first run's search statistics: --fresh solves again.
    Example: moment plan --profile paper-machine-b --gpus 4 --ssds 8 --diagram plan.svg
    """
    del fresh  # read before the command runs (moment.cli.answers)
    cluster_only = {k: options.pop(k) for k in _CLUSTER_ONLY}
    req = PlanRequest(**given(options))
    if cluster_only["cluster"] is not None:
        _cluster_alone(req, calibration)
        knobs = {k: options[k] for k in ClusterPlanRequest.model_fields if k in options}
        _plan_cluster(ClusterPlanRequest(**given(knobs | cluster_only)), diagram, json_out)
        return
    if cluster_only["remote_fraction"] is not None:
        raise MomentError("--remote-fraction: only with --cluster (one server reads nothing over the network)")
    check(req)  # the options' own checks first, as before the diagram's
    if diagram is not None:
        from moment.planner.diagram import check_diagram_path

        check_diagram_path(diagram)
    with solver_bar() as cb:  # on stderr: --json keeps stdout clean
        res = plan(req, calibration=calibration, progress=cb)
    if diagram is not None:
        from moment.planner.diagram import write_plan_diagram

        write_plan_diagram(res.topology, res.plan, diagram)
    out = res.json
    extra = {k: out[k] for k in ("calibration", "replay") if k in out}
    if json_out:
        _emit_json(out)
        return
    from moment.cli.render import render_extra, render_plan

    if req.overrides:
        console.print(_overrides_line(req.overrides), highlight=False)
    render_plan(console, res.plan, res.topology)
    render_extra(console, extra)
    if diagram is not None:
        console.print(f"diagram written to [bold]{escape(str(diagram))}[/]")


def _cluster_alone(req: PlanRequest, calibration: Path | None) -> None:
    """--cluster FILE names each server's profile and inventory: the flags of one server are refused."""
    given = {k: getattr(req, k) if k in req.model_fields_set else None
             for k in ("profile", "gpus", "ssds", "gpu_model", "ssd_model", "inventory")}
    given |= dict(set=req.overrides or None, calibration=calibration, replay=req.replay or None, timeout=req.timeout,
                  maxflow_backend=None if req.maxflow_backend == PlanRequest.model_fields["maxflow_backend"].default
                  else req.maxflow_backend)
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    hardware = {"--profile", "--gpus", "--ssds", "--gpu-model", "--ssd-model", "--inventory"}
    if named:
        # only the hardware flags have a place in the cluster file (servers[].profile and .inventory)
        hint = ("give each server's profile and inventory in the cluster file (servers[].profile, "
                "servers[].inventory), or leave out --cluster" if set(named) <= hardware else
                f"a cluster plan takes no {', '.join(n for n in named if n not in hardware)}: plan one "
                "server with them (leave out --cluster)")
        raise MomentError(f"--cluster: the cluster file names each server's profile and inventory, so "
                          f"{', '.join(named)} would be ignored", hint=hint)


def _plan_cluster(req: ClusterPlanRequest, diagram: Path | None, json_out: bool) -> None:
    check_cluster(req)  # the options' own checks first, as before the diagram's
    if diagram is not None:
        from moment.planner.diagram import check_diagram_path

        check_diagram_path(diagram)
    result = cluster_plan(req)
    written = []
    if diagram is not None:
        from moment.planner.diagram import check_diagram_path, write_plan_diagram
        from moment.topology.profiles import load_profile

        outs = [diagram.with_name(f"{diagram.stem}-{m.name}{diagram.suffix}") for m in result.machines]
        for out in outs:  # every picture's name before the first is drawn: none or all are written
            check_diagram_path(out)
        first: dict[int, Path] = {}  # machines of one server entry are equal: drawn once, copied
        for m, out in zip(result.machines, outs):
            if m.server in first:
                shutil.copyfile(first[m.server], out)
            else:
                write_plan_diagram(load_profile(m.profile), m.plan.model_copy(update={"placement": m.placement}), out)
                first[m.server] = out
            written.append(out)
    if json_out:
        _emit_json(result.model_dump(mode="json"))
        return
    from moment.cli.render import render_cluster

    render_cluster(console, result)
    for out in written:
        console.print(f"diagram written to [bold]{escape(str(out))}[/]")


@app.command("compare")
@request_options(CompareRequest)
def compare_cmd(
    json_out: bool = typer.Option(False, "--json", help="print a JSON list"),
    fresh: bool = typer.Option(False, "--fresh", help=FRESH_HELP),
    **options,
) -> None:
    """Plan several machines (or inventories) and put the best layouts side by side (what-if).

    A comparison made before (the same options, input files, terminal and code) prints the kept answer at
    once: --fresh plans again.
    """
    del fresh  # read before the command runs (moment.cli.answers)
    req = CompareRequest(**given(options))
    rows = compare(req)
    if json_out:
        _emit_json(rows)
        return
    if req.overrides:
        console.print(_overrides_line(req.overrides) + " (applied to every profile)", highlight=False)
    if req.data != api.DEFAULT_DATA:
        console.print("predicted with the data spread evenly over the SSDs (--data even)", highlight=False)
    _render_compare(rows)
    for r in rows:  # (what each plan says beside its figures, as `moment plan` prints it)
        for note in r["notes"]:
            console.print(Text.assemble(("note:", "yellow"), f" {r['profile']} ({r['inventory']}): {note}"))


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
            table.add_row(*(escape(v) for v in c.values()))
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
    from moment.planner.contracts import Plan
    from moment.topology.model import Topology

    models = {"topology": Topology, "plan": Plan, "workload": WorkloadSpec}
    if what not in models:
        raise MomentError(f"schema {what!r}: choose one of {', '.join(models)}")
    if out:
        check_output(out, "--out")
    text = json.dumps(models[what].model_json_schema(), indent=2)
    if out:
        atomic_write(out, text + "\n", "--out")
        console.print(f"schema written to {escape(str(out))}")
    else:
        print(text)


@app.command("models")
def models_cmd(json_out: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the GPU, SSD and NIC models the planner knows (use with --gpu-model/--ssd-model)."""
    from moment.topology.devices import CATALOG

    if json_out:
        _emit_json(models_json())
        return
    table = Table(title="device models")
    for col in ("name", "kind", "PCIe", "double width", "memory GiB", "read GB/s", "capacity GB", "network ports"):
        table.add_column(col)
    for m in CATALOG:
        table.add_row(m.name, m.kind.value, f"{m.gen}.0 x{m.lanes}", "yes" if m.double_width else "",
                      f"{m.memory_gib:g}" if m.memory_gib else "", f"{m.read_gbps:g}" if m.read_gbps else "",
                      f"{m.capacity_gb:g}" if m.capacity_gb else "",
                      f"{m.ports} x {m.port_gbit:g} Gb/s" if m.ports else "")
    console.print(table)


@app.command("profiles")
def profiles_cmd(json_out: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the built-in machine profiles (use them with --profile NAME)."""
    rows = profiles_json()
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
