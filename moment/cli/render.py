"""Tables for people: a plan as rich output."""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.markup import escape as _e
from rich.table import Table
from rich.text import Text

from moment.planner.contracts import INLET_HELP, Plan
from moment.topology.model import Topology

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


def _bar(u: float, width: int = 12) -> str:
    filled = round(max(0.0, min(1.0, u)) * width)
    colour = "red" if u >= 0.999 else "yellow" if u >= 0.8 else "green"
    return f"[{colour}]{'█' * filled}{'·' * (width - filled)}[/] {u:5.0%}"


def _where(topo: Topology, slot_id: str) -> str:
    if not topo.has(slot_id):
        return ""
    chain = [slot_id, *topo.ancestors(slot_id)]
    labels = []
    for nid in reversed(chain[1:]):
        n = topo.node(nid)
        labels.append(n.label or n.id)
    return " / ".join(labels)


def render_plan(console: Console, plan: Plan, topo: Topology) -> None:
    p = plan.under(plan.data)
    from moment.topology.devices import builtin_gpus_note

    # names, ids, labels and notes are the user's text: escaped, so that `[x16]` in a label is not read as markup
    console.print(f"[bold]Moment plan[/] for [cyan]{_e(plan.machine)}[/] with {_e(plan.inventory)}"
                  + _e(builtin_gpus_note(topo, " and ")))
    w = plan.workload
    console.print(f"workload: {_e(w.name)}, {w.feature_dim}-d features, "
                  f"{p.aggregate_gbps * p.epoch_read_s / max(len(p.gpus), 1):.0f} GB per GPU per epoch, "
                  f"caches serve GPU {w.gpu_cache_share:.0%} / CPU {w.cpu_cache_share:.0%} of reads")

    t = Table(title="recommended placement", title_justify="left")
    for col in ("slot", "where", "link", "device"):
        t.add_column(col)
    for slot_id in sorted(plan.placement, key=lambda s: (plan.devices.get(s, ""), s)):
        slot = topo.node(slot_id) if topo.has(slot_id) else None
        link = slot.link.describe() if slot is not None and slot.link else ""
        dev = plan.devices.get(slot_id, "")
        t.add_row(_e(slot_id), _e(_where(topo, slot_id)), _e(link), _e(f"{dev} {plan.placement[slot_id]}".strip()))
    console.print(t)

    g = Table(title="predicted per-GPU inlet bandwidth", title_justify="left")
    g.add_column("GPU")
    g.add_column("LP (realisable) GB/s" if plan.data == "planned" else "LP, data even GB/s", justify="right")
    if plan.predicted_maxflow:
        g.add_column("max-flow (paper) GB/s", justify="right")
    for i, gpu in enumerate(p.gpus):
        row = [_e(gpu), f"{p.per_gpu_inlet_gbps[i]:.2f}"]
        if plan.predicted_maxflow:
            row.append(f"{plan.predicted_maxflow.per_gpu_inlet_gbps[i]:.2f}")
        g.add_row(*row)
    console.print(g)
    console.print(INLET_HELP, highlight=False)
    mf = plan.predicted_maxflow
    other = plan.predicted_even if plan.data == "planned" else plan.predicted
    console.print(f"epoch read time: [bold]{p.epoch_read_s:.2f} s[/] ({_DATA_NOTE[plan.data]})"
                  + (f", {other.epoch_read_s:.2f} s ({_SECOND[plan.data]})" if other else "")
                  + (f", {mf.epoch_read_s:.2f} s (paper's max-flow, {mf.solver})" if mf else "")
                  + f"; aggregate {p.aggregate_gbps:.1f} GB/s; imbalance {p.imbalance:.1%}")

    links = sorted(plan.links, key=lambda lu: (-lu.utilisation, lu.id))[:12]
    lt = Table(title="busiest links (LP solution)", title_justify="left")
    for col in ("link", "kind", "load GB/s", "capacity GB/s", "utilisation"):
        lt.add_column(col)
    for lu in links:
        name = lu.id + (f" ({lu.label})" if lu.label else "")
        lt.add_row(("[bold red]" if lu.bottleneck else "") + _e(name), lu.kind, f"{lu.load_gbps:.2f}",
                   f"{lu.capacity_gbps:.2f}", _bar(lu.utilisation))
    console.print(lt)
    if plan.bottlenecks:
        console.print("bottlenecks: [red]" + _e(", ".join(plan.bottlenecks)) + "[/]")

    if plan.baselines:
        _render_baselines(console, plan)
    for note in plan.notes:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))
    _render_explanation(console, plan)
    s = plan.search
    if s.method == "branch-and-bound":
        counted = ("too many valid placements to count in time or to list" if s.raw_candidates is None
                   else f"{s.raw_candidates:,} valid placements, too many to list")
        console.print(f"search: {counted}: branch and bound, "
                      f"{s.nodes or 0:,} partial placements bounded by a relaxed LP; {s.seconds_total:.2f} s in all")
    elif s.method == "first-placements":
        console.print(f"search: the time limit stopped the listing of the placements; the {s.solved:,} distinct "
                      f"placements it starts from solved (greedy ones and the usual layouts); {s.seconds_total:.2f} s "
                      "in all")
    else:
        classes = f", {s.capacity_classes:,} distinct capacity graphs" if s.capacity_classes is not None else ""
        console.print(f"search: {s.raw_candidates:,} valid placements, {s.distinct_candidates:,} after symmetry "
                      f"pruning{classes}; {s.solved:,} LPs solved, the rest ruled out by a lower bound; "
                      f"{s.seconds_total:.2f} s in all")
    if not s.proven_optimal and s.lower_bound_s is None:
        console.print("[bold yellow]not proven optimal[/]: the time limit stopped the search before any bound on the "
                      "best placement was known; this is the fastest of the placements it started from")
    elif not s.proven_optimal:
        gap = p.epoch_read_s / s.lower_bound_s - 1 if s.lower_bound_s else float("inf")
        console.print(f"[bold yellow]not proven optimal[/]: the time limit stopped the search; this is the best "
                      f"placement found, and no placement reads an epoch faster than {s.lower_bound_s:.2f} s "
                      f"(this one may be up to {gap:.1%} slower than the best)")


#: how the epoch line names the plan's data placement, and then the other one
_DATA_NOTE = {"planned": "LP", "even": "LP, data spread evenly"}
_SECOND = {"planned": "LP, data spread evenly", "even": "LP, planned data"}


def _render_baselines(console: Console, plan: Plan) -> None:
    """The usual layouts under both data placements (planned shares, equal shares), ranked and compared
    under the plan's, and how the gain over the best of them splits into slots and data placement."""
    data = plan.data
    p = plan.under(data)
    both = plan.predicted_even is not None and all(b.predicted_even is not None for b in plan.baselines)
    bt = Table(title="compared with the usual layouts", title_justify="left")
    bt.add_column("layout", no_wrap=True, min_width=max(len(b.name) for b in plan.baselines))
    cols = ["epoch read s\nplanned data", "epoch read s\neven data"] if both else ["epoch read s"]
    for col in cols + ["min GB/s\nper GPU", "mean GB/s\nper GPU", "recommended is"]:
        bt.add_column(col, justify="right" if col != "recommended is" else "left")

    def times(x) -> list[str]:
        return [f"{x.predicted.epoch_read_s:.2f}", f"{x.predicted_even.epoch_read_s:.2f}"] if both \
            else [f"{x.predicted.epoch_read_s:.2f}"]

    bt.add_row("[bold]recommended[/]", *times(plan), f"{min(p.per_gpu_inlet_gbps):.2f}",
               f"{sum(p.per_gpu_inlet_gbps) / len(p.per_gpu_inlet_gbps):.2f}", "")
    for b in sorted(plan.baselines, key=lambda b: (b.under(data).epoch_read_s, b.name)):
        bp = b.under(data)
        ratio = bp.epoch_read_s / p.epoch_read_s if p.epoch_read_s > 0 else 1.0
        bt.add_row(_e(b.name), *times(b), f"{min(bp.per_gpu_inlet_gbps):.2f}",
                   f"{sum(bp.per_gpu_inlet_gbps) / len(bp.per_gpu_inlet_gbps):.2f}",
                   "as fast" if ratio < 1.005 else f"{ratio:.2f}x faster")
    console.print(bt)
    if both:
        best = min(plan.baselines, key=lambda b: (b.predicted_even.epoch_read_s, b.name))
        t_base, t_even, t_planned = (best.predicted_even.epoch_read_s, plan.predicted_even.epoch_read_s,
                                     plan.predicted.epoch_read_s)
        if min(t_even, t_planned) > 0:
            console.print(f"planned data: the SSD shares the LP chooses (`moment place` with DDAK writes them); even "
                          f"data: an equal share per SSD (hash). Against the best usual layout with even data "
                          f"({_e(best.name)}, {t_base:.2f} s): the recommended slots {t_base / t_even:.2f}x, the planned "
                          f"data placement {t_even / t_planned:.2f}x more", highlight=False)


def render_cluster(console: Console, cp) -> None:
    """`moment plan --cluster`: per machine, where its devices go and its epoch; then the cluster's."""
    net = cp.network
    console.print(f"[bold]Moment cluster plan[/] [cyan]{_e(cp.cluster)}[/]: {len(cp.machines)} machines, {cp.gpus} GPUs, "
                  f"{_e(net['nic'])} x {net['ports']} port(s) per NIC into a {net['switch_gbit']:g} Gb/s switch")
    console.print(f"each GPU reads {cp.bytes_per_gpu_per_epoch / 1e9:.1f} GB per epoch; a machine reads "
                  f"{cp.remote_fraction:.0%} of the non-replicated rows from the others ({cp.remote_fraction_source}); "
                  f"all-reduce of {cp.model_bytes / 1e6:.2f} MB x {cp.steps_per_epoch} steps", highlight=False)
    kinds: dict[int, list[str]] = {}  # machines of one server entry are equal: one block for them all
    for m in cp.machines:
        kinds.setdefault(m.server, []).append(m.name)
    shown: set[int] = set()
    for m in cp.machines:
        if m.server in shown:
            continue
        shown.add(m.server)
        names = kinds[m.server]
        who = (m.name if len(names) == 1 else f"{', '.join(names)} (each)" if len(names) <= 3 else
               f"{names[0]} ... {names[-1]} ({len(names)} machines, each)")
        t = Table(title=_e(f"{who} ({m.profile}): {m.plan.inventory} + {len(m.nics)} x {net['nic']}"),
                  title_justify="left")
        for col in ("slot", "device", "NIC path"):
            t.add_column(col)
        for slot in sorted(m.placement, key=lambda s: (_device_key(m.devices.get(s, "")), s)):
            dev = m.devices.get(slot, "")
            t.add_row(_e(slot), _e(f"{dev} {m.placement[slot]}".strip()), _e(m.gpu_paths.get(dev, "")))
        console.print(t)
        for n in m.nics:
            console.print(_e(f"  {n.nic} in {n.slot}: {n.rate_gbps:.1f} GB/s, serves {', '.join(n.gpus) or 'no GPU'}; "
                             f"GPUDirect RDMA (same PCIe switch): {', '.join(n.gdr_gpus) or 'none'}"), highlight=False)
        console.print(f"  epoch [bold]{m.epoch_s:.2f} s[/] = read {m.read_s:.2f} s + remote features "
                      f"{m.remote_feature_s:.2f} s ({m.remote_feature_gb:.1f} GB in) + all-reduce {m.allreduce_s:.3f} s; "
                      f"network {m.network_share:.0%} of the epoch; {m.gdr_paths} GPUDirect RDMA path(s)")
    console.print(f"cluster epoch: [bold]{cp.epoch_s:.2f} s[/] (slowest machine {_e(cp.slowest)}); the network is "
                  f"{cp.network_share:.0%} of it ({cp.network_s:.2f} s); times add up, no overlap assumed")


def render_hardware(console: Console, hardware: dict, title: str = "hardware placement") -> None:
    """The slot each device goes in, as a layout assumed it (`moment place`, `moment layout info`):
    one line per model, devices in order."""
    devices = hardware.get("devices") or {}
    by_model: dict[str, list[tuple[str, str]]] = {}
    for slot, model in hardware.get("placement", {}).items():
        by_model.setdefault(model, []).append((devices.get(slot, ""), slot))
    console.print(_e(f"{title} ({hardware.get('source', 'source not recorded')}):"), highlight=False)
    for model, items in sorted(by_model.items(), key=lambda kv: _device_key(min(kv[1])[0])):
        slots = ", ".join(f"{d} in {s}" if d else s for d, s in sorted(items, key=lambda x: (_device_key(x[0]), x[1])))
        console.print(_e(f"  {len(items)} x {model}: {slots}"), highlight=False)


def _device_key(dev: str) -> tuple[str, int]:
    """gpu0 < gpu1 < ... < gpu10 < ssd0 ..."""
    head = dev.rstrip("0123456789")
    tail = dev[len(head):]
    return head, int(tail) if tail else -1


def _render_explanation(console: Console, plan: Plan) -> None:
    """Why the recommendation wins, one paragraph per layout, slowest last."""
    if not plan.explanation:
        return


    console.print("why the recommended layout wins", style="bold", highlight=False)
    rec, *others = plan.explanation
    width = max(40, console.width - 1)
    for e in [rec, *sorted(others, key=lambda e: (e.slower_by, e.layout))]:
        para = textwrap.fill(f"{e.text}.", width, initial_indent="  - ", subsequent_indent="    ")
        console.print(Text(para), soft_wrap=True, highlight=False)


def render_extra(console: Console, extra: dict) -> None:
    """The calibrated epochs and replayed epochs under `moment plan`'s tables."""
    if "calibration" in extra:
        c = extra["calibration"]
        console.print(_e(f"calibrated ({c['file']}): predicted epoch " + ", ".join(
            f"{k} {v:.2f} s" for k, v in c["predicted_epoch_s"].items())))
        if c["other_machine"]:
            loo = "" if c["loo_max_rel_err"] is None else f" (leave-one-out error there up to {c['loo_max_rel_err']:.0%})"
            console.print(_e(f"note: the calibration was fitted on {c['fitted_on']}{loo} and is applied here by link "
                             "class only; a few measured layouts of this machine are the check"))
    if "replay" in extra:
        t = Table(title="per-step replay (synthetic trace from the LP's shares) vs the aggregate LP")
        for col in ("layout", "LP epoch read s", "replayed s", "difference", "limits most steps"):
            t.add_column(col)
        for name, r in extra["replay"].items():
            top = r["limiting_links"][0]["id"] if r["limiting_links"] else "-"
            t.add_row(_e(name), f"{r['lp_epoch_s']:.2f}", f"{r['epoch_s']:.2f}", f"{r['replay_vs_lp']:+.2%}", _e(top))
        console.print(t)
