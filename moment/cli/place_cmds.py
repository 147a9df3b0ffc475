"""`moment place` (pre-sample, plan, DDAK vs baselines, write the layout) and `moment layout …`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from moment.cli import app, console, err_console
from moment.cli.data_cmds import _bar, _parse_fanouts
from moment.errors import MomentError
from moment.outputs import check_output

layout_app = typer.Typer(help="Inspect and check written layouts (the output of `moment place`).",
                         no_args_is_help=True)
app.add_typer(layout_app, name="layout", help="Layouts: verify checksums, show what is where, remove.")

_PROFILE_HELP = "built-in profile name (see `moment profiles`) or a YAML file describing the machine"
_CACHE_HELP = ("{what} cache per {per}: GiB (e.g. 8) or a share of the dataset's features (e.g. 10%); "
               "default {default}% of each {per}'s memory; capped by the dataset size")


def _emit(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


@app.command("place")
def place_cmd(
    dataset: Annotated[Path, typer.Option("--dataset", "-d", help="dataset directory (`moment data synth/import`)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="layout directory to write (must not exist)")],
    profile: Annotated[str, typer.Option("--profile", "-p", help=_PROFILE_HELP)] = "paper-machine-b",
    gpus: Annotated[int | None, typer.Option(
        "--gpus", help="number of GPUs (default 4; 0 on machines with built-in GPUs)", show_default=False)] = None,
    ssds: Annotated[int, typer.Option("--ssds", help="number of NVMe SSDs")] = 8,
    gpu_model: Annotated[str, typer.Option("--gpu-model", help="GPU model (see `moment models`)")] = "A100-PCIe-40GB",
    ssd_model: Annotated[str, typer.Option("--ssd-model", help="SSD model (see `moment models`)")] = "P5510",
    plan_file: Annotated[Path | None, typer.Option(
        "--plan", help="`moment plan --json` output: reuse its hardware placement instead of searching")] = None,
    hotness_dir: Annotated[Path | None, typer.Option(
        "--hotness", help="reuse `moment data presample` output instead of pre-sampling")] = None,
    epochs: Annotated[int, typer.Option("--epochs", help="epochs to pre-sample")] = 1,
    batches: Annotated[int | None, typer.Option("--batches", help="pre-sample only this many batches")] = None,
    fanouts: Annotated[str, typer.Option("--fanouts", help="neighbours sampled per layer, first hop first")] = "25,10",
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", help="training seeds per batch (default: as `moment train`)")] = None,
    gpu_cache: Annotated[str | None, typer.Option(
        "--gpu-cache", help=_CACHE_HELP.format(what="GPU", per="GPU", default=25))] = None,
    cpu_cache: Annotated[str | None, typer.Option(
        "--cpu-cache", help=_CACHE_HELP.format(what="CPU", per="socket", default=10))] = None,
    ssd_path: Annotated[list[str] | None, typer.Option(
        "--ssd-path", help="ssdN=DIR: write SSD N's shard under DIR (repeatable); default: inside the layout")] = None,
    pool: Annotated[int | None, typer.Option(
        "--pool", help="DDAK: nodes placed per step; default: the largest (<= the paper's 100) whose hottest "
                       "nodes carry <= 1% of the smallest bin's share")] = None,
    policy: Annotated[str, typer.Option("--policy", help="which placement is written: ddak, hash or degree")] = "ddak",
    report: Annotated[bool, typer.Option("--report", help="print the per-bin table of every policy")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="replace an existing layout at --out (the old one stays valid until the new one is "
                            "complete)")] = False,
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", help="check the dataset's files against its manifest checksums before placing "
                                     "(--no-verify skips it, and says so)")] = True,
    seed: Annotated[int, typer.Option("--seed", help="pre-sampling seed (same seed = same layout)")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead of tables")] = False,
) -> None:
    """Place every node embedding in a GPU cache, CPU memory or SSD (DDAK) and write the layout.

    Pre-samples to measure which features training reads, plans the machine for that workload (or
    re-evaluates --plan's hardware placement), runs DDAK and the hash and degree baselines on the
    plan's storage shares, and writes the chosen placement as a checksummed layout.

    Example: moment place --dataset ds --profile paper-machine-b --gpus 4 --ssds 8 --plan plan.json --out L
    """
    from moment.cli.topology_cmds import parse_inventory, resolve_gpus
    from moment.placement import planning as pl
    from moment.topology.profiles import load_profile
    from moment.workload.graph import GraphDataset

    # -- every check that needs no work comes first: nothing is sampled or written for bad input
    if policy not in pl.POLICIES:
        raise MomentError(f"--policy {policy!r}: choose one of {', '.join(pl.POLICIES)}")
    if pool is not None and pool < 1:
        raise MomentError(f"--pool must be >= 1 (got {pool})")
    topo = load_profile(profile)
    gpus = resolve_gpus(topo, gpus)
    inv = parse_inventory(None, gpus, ssds, gpu_model, ssd_model)
    ds = GraphDataset.open(dataset)
    plan_in = pl.load_plan(str(plan_file), topo, inv) if plan_file is not None else None
    paths = pl.parse_ssd_paths(ssd_path or [])
    for name, p in paths.items():
        if not Path(p).is_dir():
            raise MomentError(f"--ssd-path {name}: not an existing directory", source=p)
    if out.exists() and not overwrite:
        raise MomentError("layout already exists", source=str(out), hint="pass --overwrite to replace it")
    check_output(out, "--out", directory=True)
    f = _parse_fanouts(fanouts)
    gpu_spec, cpu_spec = pl.parse_cache(gpu_cache, "--gpu-cache"), pl.parse_cache(cpu_cache, "--cpu-cache")
    if batch_size is None:
        from moment.runtime.config import TrainConfig

        batch_size = TrainConfig().resolved_batch_size(len(ds.train_idx), max(pl.device_counts(topo, inv)[0], 1))

    from moment.locking import locked

    # the lock on --out is held from here to the end: a second `moment place` on it is refused at once
    with locked(out, "layout"):
        if out.exists() and not overwrite:
            raise MomentError("layout already exists", source=str(out), hint="pass --overwrite to replace it")
        timings: dict[str, float] = {}
        verified = _verify_dataset(ds, verify, json_out, timings)
        hot = _hotness(ds, hotness_dir, f, batch_size, epochs, batches, seed, json_out, timings)

        from moment.placement.assignment import hotness_order
        from moment.placement.manifest import row_format

        order = hotness_order(hot.feature_reads)
        gpu_gib, cpu_gib = pl.default_cache_gib(topo, inv)
        cache = pl.CacheRows(gpu=pl.cache_rows(gpu_spec, gpu_gib, ds), cpu=pl.cache_rows(cpu_spec, cpu_gib, ds))
        n_gpus, n_sockets = pl.device_counts(topo, inv)
        wl = pl.workload_from_hotness(ds, hot, cache.gpu, cache.cpu, n_gpus, n_sockets, f, batch_size, order=order)

        t = time.perf_counter()
        if plan_in is None:  # the hardware placement `moment plan` recommends, re-evaluated for this workload
            from moment.cli.topology_cmds import _progress_bar

            with _progress_bar(not json_out) as cb:
                plan_in = pl.recommended_plan(topo, inv, progress=cb)
        plan = pl.replan(plan_in, topo, wl)
        timings["plan_s"] = time.perf_counter() - t

        fmt = row_format(ds.row_bytes)
        bins = pl.bins_from_plan(plan, topo, cache=cache, row_bytes=ds.row_bytes, ssd_stride=fmt.stride,
                                 ssd_paths=paths)
        assignments, errors, seconds = pl.run_policies(hot.feature_reads, bins, pool=pool, order=order, required=policy)
        timings |= {f"{k}_s": v for k, v in seconds.items()}

        from moment.placement import PlanRef, policy_report, write_layout
        from moment.placement.reader import load_manifest

        summary = _summary(ds, hot, wl, plan, plan_file, cache, timings)
        extra = {k: summary[k] for k in ("workload", "cache", "skew", "presample", "hardware")} | {
            "predicted_epoch_read_s": plan.predicted.epoch_read_s,
            "achieved_shares": dict(zip(bins.names, assignments[policy].achieved_shares().tolist()))}
        t = time.perf_counter()
        with _bar(f"writing {policy} layout", enabled=not json_out) as progress:
            path = write_layout(
                out, ds.file("features"), assignments[policy], overwrite=overwrite, progress=progress,
                plan=PlanRef(machine=plan.machine, placement=plan.placement, policy=policy,
                             pool=assignments[policy].pool if policy == "ddak" else None),
                dataset_checksum=ds.manifest.files["features"].sha256, dataset_id=ds.dataset_id,
                manifest_extra=extra,
            )
        timings["write_s"] = time.perf_counter() - t

        # bytes on the media: the stride the writer chose (its alignment follows the devices)
        stride = load_manifest(path).row.stride
        gpu_sockets = [b.socket for b in bins if b.kind == "gpu"]
        reports = {k: policy_report(a, row_stride=stride, cache_row_bytes=ds.row_bytes, gpu_sockets=gpu_sockets,
                                    seconds=seconds[k]) for k, a in assignments.items()}
        summary["notes"] = pl.cache_notes(wl, cache, hot.feature_reads, order, n_gpus, n_sockets)
        result = {"layout": str(path), "policy": policy, "dataset_verified": verified, **summary,
                  "policies": {k: r.model_dump(mode="json") for k, r in reports.items()}
                  | {k: {"policy": k, "error": e, "bins": []} for k, e in errors.items()},
                  "policy_note": _ddak_note(hot.feature_reads, bins, order, assignments, reports)}
    if json_out:
        _emit(result)
        return
    _render_place(result, report)


def _verify_dataset(ds, verify: bool, quiet: bool, timings: dict[str, float]) -> bool:
    """Re-hash the dataset against its manifest (progress bar) so corrupt data is refused, not placed."""
    if not verify:
        err_console.print("[yellow]dataset not verified[/] (--no-verify): its checksums were not checked",
                          highlight=False)
        return False
    t = time.perf_counter()
    with _bar("verifying dataset", enabled=not quiet) as progress:
        ds.verify_checksums(progress=progress)
    timings["verify_s"] = time.perf_counter() - t
    return True


def _ddak_note(hotness, bins, order, assignments, reports) -> str | None:
    """Why a baseline beats DDAK on the share error, when it does (see placement.report.ddak_note)."""
    from moment.placement.ddak import auto_pool, pool_access
    from moment.placement.report import ddak_note

    if "ddak" not in assignments:
        return None
    pool = assignments["ddak"].pool or 1
    return ddak_note(reports, pool, pool_access(hotness, pool, order), auto_pool(hotness, bins, order))


def _hotness(ds, hotness_dir, fanouts, batch_size, epochs, batches, seed, quiet, timings):
    """Pre-sample (progress bar), or load and check a saved hotness directory."""
    from moment.workload.hotness import Hotness, presample

    t = time.perf_counter()
    if hotness_dir is not None:
        hot = Hotness.load(hotness_dir)
        want = ds.manifest.files["indptr"].sha256
        if hot.num_nodes != ds.num_nodes or hot.meta.get("dataset_indptr_sha256", want) != want:
            raise MomentError("this hotness was measured on another dataset", source=str(hotness_dir),
                              hint="pre-sample this dataset, or leave out --hotness")
    else:
        with _bar("pre-sampling", enabled=not quiet) as progress:
            hot = presample(ds, fanouts, batch_size, epochs=epochs, num_batches=batches, seed=seed,
                            progress=progress)
    timings["presample_s"] = time.perf_counter() - t
    return hot


def _summary(ds, hot, wl, plan, plan_file, cache, timings) -> dict[str, Any]:
    from moment.placement.planning import RECOMMENDED, epochs_sampled, hardware_record

    source = f"from {plan_file}" if plan_file is not None else RECOMMENDED
    return {
        "dataset": str(ds.path),
        "hardware": hardware_record(plan, source),
        "plan": {
            "source": str(plan_file) if plan_file is not None else "moment plan",
            "machine": plan.machine, "inventory": plan.inventory,
            "placement": plan.placement, "devices": plan.devices,
            "epoch_read_s": plan.predicted.epoch_read_s,
            "predicted": plan.predicted.model_dump(mode="json"),
            "bottlenecks": plan.bottlenecks,
        },
        "workload": wl.model_dump(mode="json"),
        "cache": {"gpu_rows_per_gpu": cache.gpu, "cpu_rows_per_socket": cache.cpu,
                  "gpu_bytes_per_gpu": cache.gpu * ds.row_bytes, "cpu_bytes_per_socket": cache.cpu * ds.row_bytes},
        "skew": {f"top_{k:g}": v for k, v in hot.skew().items()},
        "presample": {"batches": hot.num_batches, "epochs": epochs_sampled(hot), "unique_ratio": hot.unique_ratio,
                      "feature_reads": hot.total_feature_reads,
                      "batch_size": hot.meta.get("batch_size"), "fanouts": hot.meta.get("fanouts"),
                      "seed": hot.meta.get("seed")},
        "timings": timings,
    }


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
    """Recompute every checksum (index, cache lists, each shard chunk).

    Exit 0 when all match; 1, naming the first damaged shard and byte offset, otherwise.
    """
    from moment.placement import verify_layout

    with _bar("verifying", enabled=not json_out) as progress:
        rep = verify_layout(layout, progress=progress)
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
    if not rep.ok:
        raise typer.Exit(1)


@layout_app.command("rm")
def rm_cmd(
    layout: Annotated[Path, typer.Argument(help="layout directory (written by `moment place`)")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Remove a layout: its directory and every shard directory it has on --ssd-path mounts.

    Removes exactly what the layout's manifest records, and refuses anything it does not own: a
    directory that is not a Moment layout, a file the manifest does not name (in the layout or in a
    shard directory), or a shard directory written for a layout at another path (a copied or moved
    layout: remove it where it was written). A layout being written by `moment place` is refused.
    Nothing is deleted unless every check passes.

    Example: moment layout rm layouts/synth1m
    """
    from moment.placement.layout import remove_layout

    rep = remove_layout(layout)
    if json_out:
        _emit(rep.model_dump(mode="json"))
        return
    shards = rep.removed_dirs[1:]
    where = f"; shard directories: {', '.join(shards)}" if shards else ""
    console.print(f"removed layout [bold]{rep.layout}[/]: {rep.files} files, {_size(rep.bytes)}{where}",
                  highlight=False)


@layout_app.command("info")
def info_cmd(
    layout: Annotated[Path, typer.Argument(help="layout directory")],
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Show where a layout came from (machine, plan, policy, dataset) and what each bin holds."""
    from moment.placement.reader import load_manifest, shard_path

    m = load_manifest(layout)
    shards = {s.bin: s for s in m.shards}
    bins = [{"name": b.name, "kind": b.kind, "socket": b.socket, "rows": shards[b.name].rows,
             "capacity_rows": b.capacity_rows, "bytes": shards[b.name].bytes, "target_share": b.target_share,
             "achieved_share": _achieved(m, b.name), "path": str(shard_path(layout, shards[b.name]))}
            for b in m.bins]
    info = {"layout": str(layout), "created_by": m.created_by, "plan": m.plan.model_dump(mode="json"),
            "dataset": m.dataset.model_dump(mode="json"), "row": m.row.model_dump(mode="json"),
            "bins": bins, "bytes": sum(s.bytes for s in m.shards),
            "predicted_epoch_read_s": m.extra.get("predicted_epoch_read_s"), "skew": m.extra.get("skew"),
            "hardware": m.extra.get("hardware") or {"source": "not recorded", "placement": m.plan.placement}}
    if json_out:
        _emit(info)
        return
    from rich.table import Table

    console.print(f"[bold]layout[/] {layout}: {m.plan.policy} placement for [cyan]{m.plan.machine}[/], "
                  f"{m.dataset.num_nodes:,} nodes x {m.row.row_bytes} B ({m.row.mode} to {m.row.stride} B on SSDs), "
                  f"{_size(info['bytes'])}, {m.created_by}")
    t = Table(title="bins", title_justify="left")
    for col in ("bin", "kind", "socket", "rows", "stored", "target", "achieved", "file"):
        t.add_column(col, justify="right" if col in ("rows", "stored", "target", "achieved") else "left")
    for b in bins:
        ach = "" if b["achieved_share"] is None else f"{b['achieved_share']:.4f}"
        t.add_row(b["name"], b["kind"], b["socket"] or "", f"{b['rows']:,}", _size(b["bytes"]),
                  f"{b['target_share']:.4f}", ach, b["path"])
    console.print(t)
    from moment.cli.render import render_hardware

    render_hardware(console, info["hardware"])


def _achieved(m, name: str) -> float | None:
    return (m.extra.get("achieved_shares") or {}).get(name)
