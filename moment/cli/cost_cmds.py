"""`moment advise`: what to buy for a chassis under a budget (thin: `moment.cost.advise` does the work)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.table import Table

from moment.cli import app, console
from moment.cli.common import solver_bar
from moment.errors import MomentError, validation_lines
from moment.topology.cluster import DEFAULT_NIC

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

_PROFILE_HELP = "built-in profile name (see `moment profiles`) or a YAML file describing the chassis"
_MODELS_HELP = ("comma-separated GPU and SSD models to consider, e.g. A100-PCIe-40GB,H100-PCIe,P5510 "
                "(see `moment models`); a kind you list none of: every priced model of that kind")
_PRICES_HELP = ("YAML price file merged over the shipped table, entry by entry: "
                "`devices: {H100-PCIe-80GB: {price_usd: 27500, date: 2025-03, source: our quote}}`, "
                "`server: {price_usd: ..., power_w: ...}`, `electricity: {usd_per_kwh: ...}`")


def _models(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise MomentError(f"--models {text!r}: expected comma-separated model names, e.g. A100-PCIe-40GB,P5510")
    return names


@app.command("advise")
def advise_cmd(
    profile: str = typer.Option(..., "--profile", "-p", help=_PROFILE_HELP),
    budget: float = typer.Option(..., "--budget", help="most USD to spend on the machine: server + GPUs + SSDs"),
    models: str | None = typer.Option(None, "--models", help=_MODELS_HELP),
    max_gpus: int | None = typer.Option(None, "--max-gpus", help="at most this many GPUs (default: as many as fit)"),
    max_ssds: int | None = typer.Option(None, "--max-ssds", help="at most this many SSDs (default: as many as fit)"),
    prices: Path | None = typer.Option(None, "--prices", help=_PRICES_HELP),
    top: int = typer.Option(3, "--top", help="rank this many inventories per ranking: the best and its runner-ups"),
    years: float = typer.Option(5.0, "--years", help="TCO horizon in years (Hyperion: 5)"),
    pue: float = typer.Option(1.0, "--pue", help="power usage effectiveness of the room (Hyperion: 1.0; a data centre ~1.4)"),
    utilisation: float = typer.Option(1.0, "--utilisation", help="share of the horizon the machine runs flat out (Hyperion: 1.0)"),
    machine_power: float | None = typer.Option(None, "--machine-watts", help="flat machine power for the electricity instead of server + TDPs (Hyperion: 4000)"),
    overrides: list[str] = typer.Option([], "--set", help="what-if override PATH=VALUE on the profile, as in `moment plan`"),
    data: str | None = typer.Option(None, "--data", help=(
        "where the rows will be on the SSDs, which each inventory's epoch assumes: 'planned' (default: the "
        "shares the planner chooses, as `moment place` with DDAK writes them) or 'even' (an equal share per SSD, "
        "as hash placement gives)"), metavar="planned|even", show_default=False),
    machines_max: int | None = typer.Option(None, "--machines-max", help=(
        "also compare 1..K servers of this chassis under the same budget (each with the advice for its share, "
        "joined by --nic NICs and switch ports, planned as `moment plan --cluster`) by samples/s per TCO dollar; "
        "JSON: `machines`"), metavar="K", show_default=False),
    nic: str | None = typer.Option(None, "--nic", help=f"with --machines-max: the NIC model of each server (default: "
                                                        f"{DEFAULT_NIC})", show_default=False),
    nics: int | None = typer.Option(None, "--nics", help="with --machines-max: NICs per server (default: 1)",
                                    show_default=False),
    switch_gbit: float | None = typer.Option(None, "--switch-gbit", help=(
        "with --machines-max: the switch's port rate in Gb/s (default: the NIC's port rate)"), show_default=False),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object (for scripts) instead of tables"),
) -> None:
    """Recommend what to buy: how many of which GPU and SSD, and where they go, for the best throughput
    per dollar and the best throughput under a budget.

    Every inventory of one GPU model and one SSD model that fits the chassis is priced (shipped price
    table, dated and sourced, or --prices); those over the budget are dropped, the rest are placed by
    the planner (same search as `moment plan`) unless a cheap optimistic bound shows they cannot make
    a top list. Throughput is training samples per second from the predicted epoch time; per dollar
    means per dollar of the 5-year TCO (hardware + electricity, Hyperion's model). The search grows
    with the slots and models (paper-machine-b, 21 slots, every priced model: about ten seconds on
    two cores); narrow it with --models, --max-gpus and --max-ssds.
    Example: moment advise --profile paper-machine-b --budget 60000 --models A100-PCIe-40GB,P5510
    """
    from moment.cost import CostParams, advise, load_prices
    from moment.cost.advisor import check_inputs
    from moment.cost.machines import check_network
    from moment.planner.api import check_data
    from moment.topology.profiles import load_profile

    check_inputs(budget, top, max_gpus, max_ssds)
    data = check_data(data)
    check_network(machines_max, nic, nics, switch_gbit)
    try:
        params = CostParams(years=years, pue=pue, utilisation=utilisation, machine_power_w=machine_power)
    except ValidationError as e:
        flags = {"years": "--years", "pue": "--pue", "utilisation": "--utilisation", "machine_power_w": "--machine-watts"}
        lines = validation_lines(e, limit=1, relabel=lambda loc: [flags.get(str(loc[0]), loc[0])] if loc else loc)
        raise MomentError(lines[0]) from None
    table = load_prices(prices)
    topo = load_profile(profile, overrides)
    with solver_bar(not json_out, label="solving inventories") as cb:
        result = advise(topo, budget, models=_models(models), max_gpus=max_gpus, max_ssds=max_ssds,
                        prices=table, params=params, top_k=top, progress=cb, data=data)
    options = None
    if machines_max is not None:
        from moment.cost.machines import compare_machines

        with solver_bar(not json_out, label="planning clusters") as cb:
            options = compare_machines(topo, budget, machines_max, result, nic=nic or DEFAULT_NIC, nics=nics or 1,
                                       switch_gbit=switch_gbit,
                                       prices=table, params=params, progress=cb,
                                       advise_args=dict(models=_models(models), max_gpus=max_gpus, max_ssds=max_ssds,
                                                        top_k=top, data=data))
    if json_out:
        out = result.model_dump(mode="json")
        if options is not None:
            out["machines"] = [o.model_dump(mode="json") for o in options]
        print(json.dumps(out, indent=2))
        return
    _render(result)
    if options is not None:
        _render_machines(options, budget)


def _render(r) -> None:
    console.print(f"[bold]Buying advice[/] for [cyan]{r.machine}[/] under {r.budget_usd:,.0f} USD "
                  f"(workload {r.workload}{'; data spread evenly over the SSDs' if r.data == 'even' else ''}; "
                  f"TCO over {r.params.years:g} years)")
    t = Table(title="best inventories (#per $: rank by samples/s per TCO dollar, #thr: by samples/s)",
              title_justify="left")
    for col in ("#per $", "#thr", "inventory", "epoch s", "samples/s", "hardware $", "TCO $", "samples/s/TCO $"):
        t.add_column(col, justify="left" if col == "inventory" else "right", no_wrap=col == "inventory")
    shown = [r.best_throughput_per_dollar, r.best_throughput, *r.runner_ups]
    seen = set()
    for c in shown:
        if c.inventory in seen:
            continue
        seen.add(c.inventory)
        t.add_row(str(c.rank_per_dollar or "-"), str(c.rank_throughput or "-"), c.inventory, f"{c.epoch_s:.2f}", f"{c.throughput_samples_per_s:,.0f}",
                  f"{c.hardware_usd:,.0f}", f"{c.tco_usd:,.0f}", f"{c.tpc:.3f}")
    console.print(t)
    for title, c in (("best throughput per dollar", r.best_throughput_per_dollar),
                     ("best throughput", r.best_throughput)):
        console.print(f"[bold]{title}[/]: {c.inventory}, {c.epoch_s:.2f} s per epoch, "
                      f"{c.hardware_usd:,.0f} USD", highlight=False)
        p = Table()
        p.add_column("slot")
        p.add_column("device")
        for slot, model in c.placement.items():
            p.add_row(slot, model)
        console.print(p)
    console.print(f"searched {r.searched} inventories: {r.over_budget} over budget, {r.pruned} pruned by the "
                  f"throughput bound, {r.solved} solved by the planner ({r.unplaceable} with no valid placement) "
                  f"in {r.elapsed_s:.1f} s", highlight=False)
    dates = sorted({e["date"] for e in [r.prices["server"], *r.prices["devices"].values()]})
    console.print(f"prices: {r.prices['origin']} table, dated {', '.join(dates)} "
                  "(`--json` gives each price's date and source)", highlight=False)


def _render_machines(options, budget: float) -> None:
    t = Table(title=f"one server or several, {budget:,.0f} USD in all (best by samples/s per TCO dollar marked *)",
              title_justify="left")
    for col in ("servers", "each server", "epoch s", "network", "samples/s", "hardware $", "of it network $",
                "TCO $", "samples/s/TCO $"):
        t.add_column(col, justify="left" if col == "each server" else "right")
    for o in options:
        if o.inventory is None:
            t.add_row(str(o.machines), o.note, *["-"] * 7)
            continue
        nic = f"\n+ {o.nics_per_server} x {o.nic}" if o.nic else ""
        t.add_row(f"{o.machines}{' *' if o.best else ''}", o.inventory + nic, f"{o.epoch_s:.2f}",
                  f"{o.network_share:.0%}", f"{o.throughput_samples_per_s:,.0f}", f"{o.hardware_usd:,.0f}",
                  f"{o.network_usd:,.0f}", f"{o.tco_usd:,.0f}", f"{o.tpc:.3f}")
    console.print(t)
