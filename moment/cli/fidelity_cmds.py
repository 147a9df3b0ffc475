"""`moment simulate`, `moment calibrate`, `moment probe`: how far the planner's predictions can be trusted."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from moment.cli import app, console
from moment.cli.requests import given, request_options
from moment.io.probing import ProbeRequest
from moment.planner.requests import CalibrateRequest, SimulateRequest, calibrate

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


def _emit_json(obj) -> None:
    print(json.dumps(obj, indent=2))


# ---- simulate ----------------------------------------------------------------------------------------
@app.command("simulate")
@request_options(SimulateRequest, order=(
    "plan", "profile", "placement", "gpus", "ssds", "layout", "dataset", "fanouts", "batch_size", "steps", "uniform",
    "seed", "calibration", "data"))
def simulate_cmd(
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    **options,
) -> None:
    """Replay an epoch step by step on the capacity graph and compare it with the aggregate LP.

    Each DDP step: every GPU's reads per storage node (synthetic from the plan's shares, or the real
    sampled batches of a layout), the link sharing of that step, and the step barrier (the slowest
    GPU sets the pace). Reports the epoch, per-GPU busy/idle time, the links that limit most steps and
    why the replay differs from the LP. Example: moment simulate --profile paper-machine-b --placement paper-c
    """
    from moment.placement.simulation import simulate

    res = simulate(SimulateRequest(**given(options)))
    if json_out:
        _emit_json(res.json)
        return
    _render_replay(res.report, res.json.get("calibrated_epoch_s"))
    for note in res.json.get("notes", []):
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))


def _render_replay(rep, calibrated: float | None) -> None:
    t = Table(title=escape(f"per-step replay ({rep.source} trace, {rep.steps} steps)"))
    for c in ("GPU", "GB read", "busy s", "idle s", "mean GB/s"):
        t.add_column(c)
    for g in rep.per_gpu:
        t.add_row(escape(g.gpu), f"{g.bytes / 1e9:.1f}", f"{g.busy_s:.2f}", f"{g.idle_s:.2f}", f"{g.mean_gbps:.2f}")
    console.print(t)
    console.print(f"epoch read time: {rep.epoch_s:.2f} s replayed, {rep.lp_epoch_s:.2f} s LP "
                  f"({rep.replay_vs_lp:+.2%})" + (f"; calibrated epoch {calibrated:.2f} s" if calibrated else ""))
    console.print(escape(rep.why))
    if rep.limiting_links:
        console.print("links that limit steps: " + escape(", ".join(
            f"{x.id} ({x.share_of_steps:.0%})" for x in rep.limiting_links[:6])))


def _figure(v: float) -> str:
    """A measured or predicted figure: 2 decimals, or 3 digits where that would print hundreds of them."""
    return f"{v:.2f}" if abs(v) < 1e6 else f"{v:.3g}"


# ---- calibrate ---------------------------------------------------------------------------------------
@app.command("calibrate")
@request_options(CalibrateRequest)
def calibrate_cmd(
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    **options,
) -> None:
    """Fit link efficiencies and a per-epoch overhead to measured epoch times by bounded least squares.

    Prints each parameter (with its meaning and bounds), each measurement's residual and the
    leave-one-out error (each measurement predicted by a fit without it). Apply the result with
    `moment plan|compare|simulate --calibration CAL.yaml`. SSD read rates alone (`moment probe --out`)
    fit the SSD read scale (rate / rated rate of --ssd-model) and need no --profile, --gpus or --ssds.
    A named parameter no measurement depends on is refused.
    """
    from moment.planner.calibration import PARAMS

    req = CalibrateRequest(**given(options))
    cal = calibrate(req)
    out = req.out
    if json_out:
        _emit_json({"params": cal.params, "fitted": cal.fitted,
                    "residuals": [r.model_dump(mode="json") for r in cal.residuals],
                    "loo_max_rel_err": cal.loo_max_rel_err, "notes": cal.notes})
        return
    t = Table(title=escape(f"calibration fitted on {cal.fitted_on} ({cal.inventory})"))
    for c in ("parameter", "value", "bounds", "fitted", "meaning"):
        t.add_column(c)
    for k, p in PARAMS.items():
        t.add_row(k, f"{cal.params[k]:.3f} {p.unit}", f"[{p.lo:g}, {p.hi:g}]", "yes" if k in cal.fitted else "",
                  p.meaning)
    console.print(t)
    r = Table(title="measurements")
    for c in ("measured", "value", "predicted", "error", "leave-one-out predicted", "LOO error"):
        r.add_column(c)
    for x in cal.residuals:
        unit = f" {x.unit}" if x.unit else ""
        r.add_row(escape(x.layout), f"{_figure(x.measured_s)}{unit}", f"{_figure(x.predicted_s)}{unit}", f"{x.rel_err:+.1%}",
                  f"{_figure(x.loo_predicted)}{unit}" if x.loo_predicted is not None else "-",
                  f"{x.loo_rel_err:+.1%}" if x.loo_rel_err is not None else "-")
    console.print(r)
    if cal.loo_max_rel_err is not None:
        console.print(f"largest leave-one-out error: {cal.loo_max_rel_err:.1%}")
    for note in cal.notes:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))
    if out is not None:
        console.print(f"calibration written to [bold]{escape(str(out))}[/]")


# ---- probe -------------------------------------------------------------------------------------------
@app.command("probe")
@request_options(ProbeRequest)
def probe_cmd(
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
    **options,
) -> None:
    """Measure this machine through Moment's own I/O stack: each SSD's direct-I/O read rate and
    random 4 KiB IOPS, memory copy bandwidth, and (only where CUDA is present) host<->GPU and
    GPU<->GPU copy rates. Example: moment probe --ssd-path ssd0=/mnt/nvme0 --out measured.yaml"""
    from moment.io.probing import probe

    result = probe(ProbeRequest(**given(options)))
    ssd = result["ssd"]
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
