"""`moment place` (pre-sample, plan, DDAK vs baselines, write the layout) and `moment layout …`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from moment.cli import app, console, err_console
from moment.cli.common import progress_bar, solver_bar
from moment.cli.requests import given, request_options
from moment.errors import MomentError
from moment.placement.requests import PlaceRequest, place

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

layout_app = typer.Typer(help="Inspect and check written layouts (the output of `moment place`).",
                         no_args_is_help=True)
app.add_typer(layout_app, name="layout", help="Layouts: verify checksums, show what is where, remove.")



def _emit(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


@app.command("place")
@request_options(PlaceRequest)
def place_cmd(
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead of tables")] = False,
    **options: Any,
) -> None:
    """Place every node embedding in a GPU cache, CPU memory or SSD (DDAK) and write the layout.

    Pre-samples to measure which features training reads, plans the machine for that workload (or
    re-evaluates --plan's hardware placement), runs DDAK and the hash and degree baselines on the
    plan's storage shares, and writes the chosen placement as a checksummed layout.

    With --machines N (or --cluster FILE) the rows are split over several machines: the hottest
    (--replicate) are on every machine, the others each on one, dealt out by hotness; --out gets one
    layout per machine and the cluster manifest (cluster.json) saying which machine owns which rows.
    Train it with `moment train --nnodes N --node-rank K --layout OUT/<machine K>` on each machine.

    Example: moment place --dataset ds --profile paper-machine-b --gpus 4 --ssds 8 --plan plan.json --out L
    """
    req = PlaceRequest(**given(options))
    res = place(req, stage=_stage_bars(not json_out), notice=_notice)
    from moment.placement.api import SplitResult

    if json_out:
        _emit(res.model_dump())
    elif isinstance(res, SplitResult):
        _render_split(res.model_dump())
    else:
        _render_place(res.model_dump(), req.report)


def _render_split(r: dict[str, Any]) -> None:
    from rich.table import Table

    n = r["num_nodes"]
    console.print(f"[bold]Moment split[/] of {r['dataset']} over {len(r['machines'])} machines: {r['replicated_rows']:,} "
                  f"of {n:,} rows on every machine ({r['replicated_source']}), the others dealt out by hotness")
    console.print("dataset checksums: " + ("verified against its manifest" if r["dataset_verified"]
                                           else "[yellow]not verified[/] (--no-verify)"))
    t = Table(title="machines", title_justify="left")
    for col in ("machine", "hardware", "rows held", "owned", "stored", "reads of other machines' rows", "layout"):
        t.add_column(col, justify="right" if col in ("rows held", "owned", "stored") else "left")
    for m in r["machines"]:
        t.add_row(m["name"], f"{m['machine']} ({m['inventory']})", f"{m['held_rows']:,}", f"{m['owned_rows']:,}",
                  _size(m["bytes"]), f"{m['remote_read_share']:.1%} (held-out sample)", m["layout"])
    console.print(t)
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    first = r["machines"][0]
    tm = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in r["timings"].items())
    console.print(f"split written to [bold]{r['split']}[/] (cluster manifest {r['cluster_manifest']}; {tm}); on "
                  f"machine K: moment train --nnodes {len(r['machines'])} --node-rank K --rdzv-endpoint HOST:PORT "
                  f"--layout {r['split']}/<machine K> (e.g. --node-rank 0 --layout {first['layout']})",
                  highlight=False, soft_wrap=True)


def _stage_bars(enabled: bool):
    """place()'s stage hook: the planner's candidate counter for "plan", a byte bar for the others."""
    def stage(name: str, label: str):
        return solver_bar(enabled, label) if name == "plan" else progress_bar(label, enabled=enabled)

    return stage


def _notice(text: str) -> None:
    head, sep, rest = text.partition(" (")
    err_console.print(f"[yellow]{head}[/]{sep}{rest}", highlight=False)


def _size(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.2f} MB"


def _render_place(r: dict[str, Any], per_bin: bool) -> None:
    from rich.table import Table

    p, wl = r["plan"], r["workload"]
    console.print(f"[bold]Moment placement[/] of {r['dataset']} for [cyan]{p['machine']}[/] ({p['inventory']}), "
                  f"plan from {p['source']}")
    skew = ", ".join(f"{float(k.removeprefix('top_')):.0%}: {v:.1%}" for k, v in r["skew"].items())
    console.print(f"measured: {wl['bytes_per_gpu_per_epoch'] / 1e9:.3f} GB per GPU per epoch, unique ratio "
                  f"{wl['unique_ratio']:.3f}; hottest nodes take {skew} of feature reads; caches serve GPU "
                  f"{wl['gpu_cache_share']:.1%} / CPU {wl['cpu_cache_share']:.1%}")
    console.print(f"predicted epoch read time {p['epoch_read_s']:.4g} s (LP)")
    console.print("dataset checksums: " + ("verified against its manifest" if r["dataset_verified"]
                                           else "[yellow]not verified[/] (--no-verify)"))
    from moment.cli.render import render_hardware

    render_hardware(console, r["hardware"], "hardware placement assumed")
    pols = [k for k in ("ddak", "hash", "degree") if k in r["policies"] and "error" not in r["policies"][k]]
    if per_bin:
        t = Table(title="per bin: share of reads achieved (|achieved - target| / target)", title_justify="left")
        for col in ("bin", "kind", "socket", "target", *pols, f"stored ({r['policy']})"):
            t.add_column(col, justify="left" if col in ("bin", "kind", "socket") else "right")
        for i, b in enumerate(r["policies"][r["policy"]]["bins"]):
            row = [b["name"], b["kind"], b["socket"] or "", f"{b['target_share']:.4f}"]
            for k in pols:
                x = r["policies"][k]["bins"][i]
                err = "" if x["rel_error"] is None else f" ({x['rel_error']:.1%})"
                row.append(f"{x['achieved_share']:.4f}{err}")
            t.add_row(*row, _size(b["bytes"]))
        console.print(t)
    s = Table(title="policies", title_justify="left")
    for col in ("policy", "mean |a-t|/t", "max |a-t|/t", "sum |a-t|", "UPI/QPI share", "time s"):
        s.add_column(col, justify="left" if col == "policy" else "right")
    for k in pols:
        x = r["policies"][k]
        mark = "*" if k == r["policy"] else ""
        s.add_row(k + mark, f"{x['mean_rel_error']:.2%}", f"{x['max_rel_error']:.2%}", f"{x['l1_error']:.4f}",
                  f"{x['cross_socket_share']:.1%}", f"{x['seconds']:.2f}")
    console.print(s)
    console.print("* written; UPI/QPI share = share of GPU reads that cross a socket link; "
                  f"DDAK pool: {r['policies'].get('ddak', {}).get('pool')} nodes")
    if r.get("policy_note"):
        console.print(f"[yellow]note:[/] {r['policy_note']}", highlight=False)
    for k, x in r["policies"].items():
        if "error" in x:
            console.print(f"[yellow]{k} could not place the nodes:[/] {x['error']}")
    for note in r.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    tm = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in r["timings"].items())
    console.print(f"layout written to [bold]{r['layout']}[/] ({tm})")


# ---- moment layout ------------------------------------------------------------------------------------


@layout_app.command("verify")
def verify_cmd(
    layout: Annotated[Path, typer.Argument(help="layout directory (written by `moment place`)")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Recompute every checksum (index, cache lists, each shard chunk, the pack's files) and check the
    structure of the index, the hotness order and the pack, and that the pack was made for this layout.

    A split layout's directory (`moment place --machines`) is checked whole: its cluster manifest's own
    checksum, the owners file, and every machine's layout (present, the one the manifest names, holding
    exactly the rows the owners file gives it, and sound).

    Exit 0 when all is sound; 1, naming the first damaged file (shard and byte offset), otherwise.
    """
    from moment.placement import verify_layout
    from moment.placement.split import is_split, verify_split

    check = verify_split if is_split(layout) else verify_layout
    with progress_bar("verifying", enabled=not json_out) as progress:
        rep = check(layout, progress=progress)
    if json_out:
        _emit(rep.model_dump(mode="json"))
    elif rep.ok:
        console.print(f"[green]layout OK[/]: {rep.files_checked} files, {rep.bytes_checked / 1e9:.3f} GB checked")
    else:
        where = f"shard of bin {rep.first_bad_shard}" if rep.first_bad_shard else "file"
        at = f" at byte offset {rep.first_bad_offset}" if rep.first_bad_offset is not None else ""
        err_console.print(f"[bold red]layout damaged[/]: {where} {rep.first_bad_file}{at}", highlight=False)
        for p in rep.problems:
            err_console.print(f"  {p}", highlight=False)
    if not json_out:
        for note in rep.notes:
            err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    if not rep.ok:
        raise typer.Exit(1)


@layout_app.command("rm")
def rm_cmd(
    layout: Annotated[Path, typer.Argument(help="layout directory (written by `moment place`)")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Remove a layout: its directory, every shard directory it has on --ssd-path mounts, and its training
    runs (LAYOUT.runs: the torchrun logs and checkpoints of `moment train`).

    Removes exactly what the layout's manifest records, and refuses anything it does not own: a
    directory that is not a Moment layout, a file the manifest does not name (in the layout or in a
    shard directory), a file in LAYOUT.runs that no training run wrote, or a shard directory written
    for a layout at another path (a copied or moved layout: remove it where it was written). A layout
    being written by `moment place` is refused. Nothing is deleted unless every check passes.

    A split layout's directory is removed whole (every machine's layout still there, with its runs); one
    machine's layout (SPLIT/NAME) alone, like any layout.

    Example: moment layout rm layouts/synth1m
    """
    from moment.placement.split import is_split
    from moment.runtime.runs import owned_runs, remove_runs

    if is_split(layout):
        _rm_split(layout, json_out)
        return
    from moment.placement.layout import remove_layout
    from moment.placement.reader import load_manifest

    load_manifest(layout, own_checksum=False)  # what is not a layout is refused as such before its runs are looked at
    runs = owned_runs(layout)
    rep = remove_layout(layout)
    remove_runs(runs)
    if runs is not None:
        rep.removed_dirs.append(str(runs))
    if json_out:
        _emit(rep.model_dump(mode="json"))
        return
    shards = rep.removed_dirs[1:]
    where = f"; also removed: {', '.join(shards)}" if shards else ""
    console.print(f"removed layout [bold]{rep.layout}[/]: {rep.files} files, {_size(rep.bytes)}{where}",
                  highlight=False)


def _rm_split(layout: Path, json_out: bool) -> None:
    from moment.placement.split import load_split, remove_split
    from moment.runtime.runs import owned_runs

    try:
        m = load_split(layout)
    except MomentError:
        runs = []  # remove_split names what is wrong (a damaged manifest: what the split owns is unknown)
    else:
        runs = [r for x in m.machines if (r := owned_runs(layout / x.layout)) is not None]
    gone = remove_split(layout, runs)
    if json_out:
        _emit({"layout": str(layout), "split": True, "machines_removed": gone, "runs_removed": [str(r) for r in runs]})
        return
    console.print(f"removed split layout [bold]{layout}[/] (machine layouts: {', '.join(gone) or 'none left'})",
                  highlight=False)


def _info_split(layout: Path, json_out: bool) -> None:
    from moment.placement.split import load_split

    m = load_split(layout)
    _check_owners_size(layout / m.owners.path, m.owners.bytes)
    machines = [x.model_dump(mode="json") | {"present": (layout / x.layout / "manifest.json").is_file(),
                                             "path": str(layout / x.layout)} for x in m.machines]
    info = {"layout": str(layout), "split": True, "id": m.id, "created_by": m.created_by,
            "dataset": m.dataset.model_dump(mode="json"), "replicated_rows": m.replicated_rows, "machines": machines}
    if json_out:
        _emit(info)
        return
    from rich.table import Table

    console.print(f"[bold]split layout[/] {layout}: {m.dataset.num_nodes:,} nodes over {len(m.machines)} machines, "
                  f"{m.replicated_rows:,} hottest rows on every machine, {m.created_by}", highlight=False)
    t = Table(title="machines", title_justify="left")
    for col in ("machine", "hardware", "rows held", "owned", "stored", "remote reads", "layout"):
        t.add_column(col, justify="right" if col in ("rows held", "owned", "stored", "remote reads") else "left")
    for x in machines:
        t.add_row(x["name"], f"{x['machine']} ({x['inventory']})", f"{x['held_rows']:,}", f"{x['owned_rows']:,}",
                  _size(x["bytes"]), f"{x['remote_read_share']:.1%}", x["path"] + ("" if x["present"] else " (missing)"))
    console.print(t)


def _check_owners_size(path: Path, want: int) -> None:
    """`layout info` reads no shard, but a missing or cut owners file is refused here rather than shown as
    a sound split (its checksum is `layout verify`'s)."""
    if not path.is_file():
        raise MomentError("the split's owners file is missing", source=str(path),
                          hint=f"`moment layout verify {path.parent}` checks the rest")
    size = path.stat().st_size
    if size != want:
        raise MomentError(f"the owners file is {'truncated' if size < want else 'damaged'}: {size:,} bytes, the "
                          f"cluster manifest records {want:,}", source=str(path),
                          hint="write the split again with `moment place --machines N --overwrite`")


@layout_app.command("info")
def info_cmd(
    layout: Annotated[Path, typer.Argument(help="layout directory")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Show where a layout came from (machine, plan, policy, dataset) and what each bin holds (a split
    layout's directory: its machines, the rows each holds and owns)."""
    from moment.placement.split import is_split

    if is_split(layout):
        _info_split(layout, json_out)
        return

    from rich.markup import escape
    from rich.text import Text

    from moment.placement.reader import dataset_note, load_manifest, shard_path

    m = load_manifest(layout)
    note = dataset_note(layout, m)
    shards = {s.bin: s for s in m.shards}
    bins = [{"name": b.name, "kind": b.kind, "socket": b.socket, "rows": shards[b.name].rows,
             "capacity_rows": b.capacity_rows, "bytes": shards[b.name].bytes, "target_share": b.target_share,
             "achieved_share": _achieved(m, b.name), "path": str(shard_path(layout, shards[b.name])),
             **_hardware(b)} for b in m.bins]
    info = {"layout": str(layout), "created_by": m.created_by, "plan": m.plan.model_dump(mode="json"),
            "dataset": m.dataset.model_dump(mode="json"), "row": m.row.model_dump(mode="json"),
            "bins": bins, "bytes": sum(s.bytes for s in m.shards),
            "predicted_epoch_read_s": m.extra.get("predicted_epoch_read_s"), "skew": m.extra.get("skew"),
            "hardware": m.extra.get("hardware") or {"source": "not recorded", "placement": m.plan.placement},
            "split": m.split.model_dump(mode="json") if m.split else None, "notes": [note] if note else []}
    if json_out:
        _emit(info)
        return
    from rich.table import Table

    console.print(f"[bold]layout[/] {layout}: {m.plan.policy} placement for [cyan]{m.plan.machine}[/], "
                  f"{m.dataset.num_nodes:,} nodes x {m.row.row_bytes} B ({m.row.mode} to {m.row.stride} B on SSDs), "
                  f"{_size(info['bytes'])}, {m.created_by}")
    console.print(f"dataset {escape(str(Path(m.dataset.features_path).parent))} (id "
                  f"{(m.dataset.id or 'not recorded')[:12]})", highlight=False)
    if m.split is not None:
        sp = m.split
        console.print(f"machine [bold]{sp.name}[/] (node rank {sp.machine}) of a split over {len(sp.machines)} "
                      f"machines ({', '.join(sp.machines)}): {m.dataset.num_nodes - sp.remote_rows:,} rows here "
                      f"({sp.replicated_rows:,} on every machine), "
                      + ", ".join(f"{r.rows:,} on {r.name}" for r in sp.remote), highlight=False)
    t = Table(title="bins", title_justify="left")
    for col in ("bin", "kind", "socket", "slot", "rows", "stored", "target", "achieved", "file"):
        t.add_column(col, justify="right" if col in ("rows", "stored", "target", "achieved") else "left")
    for b in bins:
        ach = "" if b["achieved_share"] is None else f"{b['achieved_share']:.4f}"
        t.add_row(b["name"], b["kind"], b["socket"] or "", b.get("slot") or "", f"{b['rows']:,}", _size(b["bytes"]),
                  f"{b['target_share']:.4f}", ach, b["path"])
    console.print(t)
    from moment.cli.render import render_hardware

    render_hardware(console, info["hardware"])
    if note:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))


def _hardware(b) -> dict:
    """The plan's device a GPU or SSD bin lives on: `plan_gpu`/`plan_ssd`, its `slot` and `pci` address."""
    if b.kind == "cpu":
        return {}
    return {f"plan_{b.kind}": b.device, "slot": b.slot, "pci": b.pci}


def _achieved(m, name: str) -> float | None:
    return (m.extra.get("achieved_shares") or {}).get(name)
