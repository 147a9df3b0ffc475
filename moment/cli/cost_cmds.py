"""`moment advise`: what to buy for a chassis under a budget (thin: `moment.cost.advise` does the work)."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from moment.cli import app, console
from moment.cli.common import FRESH_HELP, solver_bar
from moment.cli.requests import given, request_options
from moment.cost.requests import AdviseRequest, advise

@app.command("advise")
@request_options(AdviseRequest, order=(
    "profile", "budget", "models", "max_gpus", "max_ssds", "prices", "top", "years", "pue", "utilisation",
    "machine_watts", "overrides", "data", "machines_max", "nic", "nics", "switch_gbit"))
def advise_cmd(
    json_out: bool = typer.Option(False, "--json", help="print one JSON object (for scripts) instead of tables"),
    jobs: int = typer.Option(0, "--jobs", help="processes solving inventories, at most one per core this process "
                             "may use (0: one per core, up to 4); the advice is the same for any"),
    fresh: bool = typer.Option(False, "--fresh", help=FRESH_HELP),
    **options,
) -> None:
    """Recommend what to buy: how many of which GPU and SSD, and where they go, for the best throughput
    per dollar and the best throughput under a budget.

    Every inventory of one GPU model and one SSD model that fits the chassis is priced (shipped price
    table, dated and sourced, or --prices); those over the budget are dropped, the rest are placed by
    the planner (same search as `moment plan`) unless a cheap optimistic bound shows they cannot make
    a top list. Throughput is training samples per second from the predicted epoch time; per dollar
    means per dollar of the 5-year TCO (hardware + electricity, Hyperion's model). The search grows
    with the slots and models (asus-esc8000a-e12, every priced model: 8-10 s on two cores, solving
    ahead on the second, --jobs); narrow it with --models, --max-gpus and --max-ssds.
    Advice given before (the same options, input files, terminal and code) prints at once: --fresh
    solves again.
    Example: moment advise --profile paper-machine-b --budget 60000 --models A100-PCIe-40GB,P5510
    """
    del fresh  # read before the command runs (moment.cli.answers)
    req = AdviseRequest(**given(options))

    def solve(label, work):
        with solver_bar(not json_out, label=label) as cb:
            return work(cb)

    res = advise(req, solve=solve, jobs=jobs)
    if json_out:
        print(json.dumps(res.json, indent=2))
        return
    _render(res.result)
    if res.machines is not None:
        _render_machines(res.machines, req.budget)


def _render(r) -> None:
    console.print(f"[bold]Buying advice[/] for [cyan]{escape(r.machine)}[/] under {r.budget_usd:,.0f} USD "
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
    for note in r.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


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
