"""`place()`: data placement as one library call (what `moment place` runs, and the benches and service).

    res = place("ds", "L", topology, inventory, plan=None)   # -> PlaceResult
    res.layout, res.policies["ddak"]["mean_rel_error"], res.model_dump()   # the CLI's --json object

The stages, in order: check every input that needs no work (nothing is sampled or written for bad
input); take the layout's lock; verify the dataset's checksums; pre-sample its hotness (or load and
check `hotness`); turn it into the planner's workload; plan (the hardware placement `moment plan`
recommends, or the given `plan`), re-evaluated for that workload; make the bins from the plan's
storage shares; run DDAK and the hash and degree baselines; write the chosen policy's layout; report.

Progress and notices go through the caller's hooks (nothing here prints): `stage(name, label)` returns a
context manager yielding a progress(done, total) callback or None, for the stages "verify",
"presample", "plan" and "write"; `notice(text)` receives one-line warnings.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from moment.errors import MomentError, check_at_least
from moment.inputs import check_dir, exists
from moment.locking import locked
from moment.outputs import LEFTOVER_MARK, check_output, make_partial, mark_leftover, moment_directory, publish_dir
from moment.placement import planning as pl
from moment.placement import split as sp
from moment.placement.assignment import hotness_order
from moment.placement.defaults import DEFAULTS
from moment.placement.knapsack import auto_pool, pool_access
from moment.placement.layout import (
    SplitPart,
    check_layout_out,
    check_ssd_path,
    drop_shard_dirs,
    refuse_existing,
    write_layout,
)
from moment.placement.manifest import PlanRef, RemoteBin, SplitRef, row_format
from moment.placement.planning import RECOMMENDED, epochs_sampled, hardware_record
from moment.placement.reader import load_manifest
from moment.placement.report import ddak_note, policy_report
from moment.planner.contracts import Plan
from moment.topology.devices import Inventory
from moment.topology.model import Topology
from moment.workload.graph import GraphDataset
from moment.workload.hotness import Hotness, heldout_reads, presample
from moment.workload.seeds import check_seed
from moment.workload.spec import DEFAULT_FANOUTS, check_fanouts, default_batch_size

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

#: the options' defaults other than None (moment.placement.requests.PlaceRequest, the request of `moment place`
#: and of the service's place jobs, takes them from here)

#: stage(name, label) -> a context manager yielding progress(done, total) or None
StageHook = Callable[[str, str], AbstractContextManager[Any]]


class PlaceResult(BaseModel):
    """What `place()` did; `model_dump()` is `moment place --json`'s object, key for key."""

    model_config = ConfigDict(extra="forbid")

    layout: str
    policy: str
    dataset_verified: bool
    dataset: str
    hardware: dict[str, Any]
    plan: dict[str, Any]
    workload: dict[str, Any]
    cache: dict[str, Any]
    skew: dict[str, float]
    presample: dict[str, Any]
    timings: dict[str, float]
    notes: list[str]
    policies: dict[str, dict[str, Any]]
    policy_note: str | None


def check_choices(policy: str, pool: int | None) -> None:
    """The checks on the policy and DDAK's pool (the CLI runs them before anything else)."""
    if policy not in pl.POLICIES:
        raise MomentError(f"--policy {policy!r}: choose one of {', '.join(pl.POLICIES)}")
    if pool is not None and pool < 1:
        raise MomentError(f"--pool must be >= 1 (got {pool})")


def place(
    dataset: str | Path | GraphDataset,
    out: str | Path,
    topology: Topology,
    inventory: Inventory,
    *,
    plan: Plan | str | Path | None = None,
    hotness: Hotness | str | Path | None = None,
    epochs: int = DEFAULTS["epochs"],
    batches: int | None = None,
    fanouts: Sequence[int] | None = None,
    batch_size: int | None = None,
    gpu_cache: str | None = None,
    cpu_cache: str | None = None,
    ssd_paths: Mapping[str, str] | Sequence[str] | None = None,
    pool: int | None = None,
    policy: str = DEFAULTS["policy"],
    overwrite: bool = DEFAULTS["overwrite"],
    verify: bool = DEFAULTS["verify"],
    seed: int = DEFAULTS["seed"],
    stage: StageHook | None = None,
    notice: Callable[[str], None] | None = None,
) -> PlaceResult:
    """Pre-sample, plan, place (DDAK and baselines) and write the layout at `out`; see the module doc.

    `plan`: a Plan or the path of `moment plan --json` output (its hardware placement is reused);
    None: the recommended one. `fanouts`/`batch_size`: None takes those `hotness` was pre-sampled at
    (given ones must match them), else 25,10 and the training default. `gpu_cache`/`cpu_cache`: GiB
    ("8") or a share of the features ("10%") per GPU / per socket, at most the memory it lives in.
    `ssd_paths`: {"ssdN": DIR} or ["ssdN=DIR", ...]."""
    machine = SplitMachine("", topology, inventory)
    p = _prepare(dataset, out, [machine], split=False, plan=plan, hotness=hotness, epochs=epochs, batches=batches,
                 fanouts=fanouts, batch_size=batch_size, gpu_cache=gpu_cache, cpu_cache=cpu_cache,
                 ssd_paths=ssd_paths, pool=pool, policy=policy, overwrite=overwrite, seed=seed, stage=stage,
                 notice=notice)

    # the lock on `out` is held from here to the end: a second `place` on it is refused at once
    with locked(p.out, "layout"):
        check_layout_out(p.out, overwrite)
        s = _sample(p, verify=verify, epochs=epochs, batches=batches, seed=seed, notice=notice)
        t = time.perf_counter()
        mp = _plan_machine(p, s, 0, machine, {}, "solving candidates")
        s.timings["plan_s"] = time.perf_counter() - t
        w = _write_machine(p, s, mp, p.out, policy=policy, pool=pool, overwrite=overwrite, timings=s.timings,
                           label=f"writing {policy} layout")

        # bytes on the media: the stride the writer chose (its alignment follows the devices)
        stride = w.manifest.row.stride
        gpu_sockets = [b.socket for b in w.bins if b.kind == "gpu"]
        reports = {k: policy_report(a, row_stride=stride, cache_row_bytes=p.ds.row_bytes, gpu_sockets=gpu_sockets,
                                    seconds=w.seconds[k]) for k, a in w.assignments.items()}
        summary = w.summary | {"notes": pl.cache_notes(mp.wl, mp.cache, s.heldout, s.order, mp.n_gpus,
                                                       mp.n_sockets, ssds=bool(w.bins.of_kind("ssd")))}
        return PlaceResult(
            layout=str(w.path), policy=policy, dataset_verified=s.verified, **summary,
            policies={k: r.model_dump(mode="json") for k, r in reports.items()}
            | {k: {"policy": k, "error": e, "bins": []} for k, e in w.errors.items()},
            policy_note=_ddak_note(s.hot.feature_reads, w.bins, s.order, w.assignments, reports))


# ---- the steps `place` and `place_split` share -----------------------------------------------------------


@dataclass(frozen=True)
class SplitMachine:
    """One machine of a split: its name (its layout's directory), hardware and how to name that hardware."""

    name: str
    topology: Topology
    inventory: Inventory


@dataclass
class _Prepared:
    """What the checks made of the inputs (nothing sampled or written yet)."""

    ds: GraphDataset
    out: Path
    fanouts: list[int]
    batch_size: int
    hotness: Hotness | None
    plans: list[Plan | None]  # per machine: the given plan (checked against it), None for the recommended one
    plan_file: Path | str | None  # where the given plan came from
    ssd_paths: dict[str, str]
    gpu_spec: Any
    cpu_spec: Any
    stage: StageHook
    replicate: Any = None  # a split's --replicate, parsed


def _prepare(dataset, out, machines: Sequence[SplitMachine], *, split: bool, plan, hotness, epochs, batches, fanouts,
             batch_size, gpu_cache, cpu_cache, ssd_paths, pool, policy, overwrite, seed, stage, notice,
             replicate: str | None = None) -> _Prepared:
    """Every check that needs no work, first: nothing is sampled or written for bad input. Resolves the
    hotness's fan-outs and batch size (with a notice where they override the defaults)."""
    check_choices(policy, pool)
    fanouts = None if fanouts is None else [int(x) for x in fanouts]
    if fanouts is not None:
        check_fanouts(fanouts)  # train's rule: a fan-out no run would take is refused here too
    for flag, value in (("--epochs", epochs), ("--batches", batches), ("--batch-size", batch_size)):
        check_at_least(flag, value)
    check_seed(seed)
    if not machines:
        raise MomentError("a split needs at least one machine, got 0")
    ds = dataset if isinstance(dataset, GraphDataset) else GraphDataset.open(dataset)
    if split:
        from moment.placement import split as sp

        sp.check_machine_count(len(machines), ds.num_nodes, source=str(ds.path))
        sp.check_names([m.name for m in machines])
    plan_file: Path | str | None = None
    plans: list[Plan | None] = [None] * len(machines)
    if isinstance(plan, Plan):
        plan_file, plans = "the given plan", [plan] * len(machines)
    elif plan is not None:  # checked against every machine it is used with
        plan_file, plans = Path(plan), [pl.load_plan(str(plan), m.topology, m.inventory) for m in machines]
    paths = dict(ssd_paths) if isinstance(ssd_paths, Mapping) else pl.parse_ssd_paths(list(ssd_paths or []))
    for name, p in paths.items():
        check_dir(p, f"--ssd-path {name} directory")
    out = Path(out)
    check_output(out, "--out", directory=True)
    for name, p in paths.items():  # before minutes of sampling: write_layout checks it again
        check_ssd_path(name, p, out)
    if not split:
        if (owner := moment_directory(out.absolute().parent)) is not None:  # a split's machine, a layout in a dataset
            raise MomentError(f"is inside {owner[1]} {owner[0]}, which a layout placed there would damage",
                              source=str(out), hint="choose another --out (a split's machines are placed together: "
                                                    "`moment place --machines N --out SPLIT`)")
        check_layout_out(out, overwrite)
    elif exists(out) and not overwrite:
        refuse_existing(out)
    for m in machines:  # every machine's caches must fit its memories
        gpu_spec, cpu_spec = pl.check_caches(ds, m.topology, m.inventory, gpu_cache, cpu_cache, machine=m.name)
    rep_spec = pl.parse_cache(replicate, "--replicate") if split else None
    gpus = sum(max(pl.device_counts(m.topology, m.inventory)[0], 1) for m in machines)
    defaults = (list(DEFAULT_FANOUTS), default_batch_size(len(ds.train_idx), gpus))
    if hotness is not None:  # counts sampled at other fan-outs or batch size would describe another workload
        source = "hotness" if isinstance(hotness, Hotness) else str(hotness)
        hotness = hotness if isinstance(hotness, Hotness) else Hotness.load(hotness)
        hotness.check_dataset(ds, source=source)
        given = (fanouts, batch_size)
        fanouts, batch_size = hotness.sampled_as(fanouts, batch_size, source=source)
        taken = []  # what the hotness decided where the default would have differed
        if given[0] is None and fanouts is not None and fanouts != defaults[0]:
            taken.append("fan-outs " + ",".join(map(str, fanouts)))
        if given[1] is None and batch_size is not None and batch_size != defaults[1]:
            taken.append(f"batch size {batch_size}")
        if notice and taken:
            notice(f"using the hotness's {' and '.join(taken)}, which it was pre-sampled at (not the default)")
    return _Prepared(ds=ds, out=out, fanouts=fanouts or defaults[0],
                     batch_size=batch_size if batch_size is not None else defaults[1], hotness=hotness, plans=plans,
                     plan_file=plan_file, ssd_paths=paths, gpu_spec=gpu_spec, cpu_spec=cpu_spec,
                     stage=stage or (lambda name, label: nullcontext(None)), replicate=rep_spec)


@dataclass
class _Sampled:
    """The dataset checked, its hotness (pre-sampled or given) and a held-out sample to judge choices on."""

    verified: bool
    hot: Hotness
    order: np.ndarray  # node ids, hottest first
    heldout: np.ndarray
    timings: dict[str, float]


def _sample(p: _Prepared, *, verify: bool, epochs, batches, seed, notice) -> _Sampled:
    """Under the layout's lock: verify the dataset, pre-sample (or take the hotness), the held-out sample."""
    timings: dict[str, float] = {}
    verified = _verify_dataset(p.ds, verify, p.stage, notice, timings)
    hot = _hotness(p.ds, p.hotness, p.fanouts, p.batch_size, epochs, batches, seed, p.stage, timings)
    order = hotness_order(hot.feature_reads)
    heldout = _heldout(p.ds, hot, p.fanouts, p.batch_size, seed, p.stage, timings)
    return _Sampled(verified, hot, order, heldout, timings)


@dataclass
class _MachinePlan:
    """One machine's caches, the measured workload on it, and its plan re-evaluated for that workload."""

    machine: SplitMachine
    cache: pl.CacheRows
    n_gpus: int
    n_sockets: int
    wl: Any
    plan: Plan


def _plan_machine(p: _Prepared, s: _Sampled, k: int, m: SplitMachine, solved: dict, label: str) -> _MachinePlan:
    """Cache rows -> workload -> plan for machine `k`: the given plan, else the one `moment plan` recommends
    (equal machines are solved once, through `solved`), re-evaluated for this workload."""
    gpu_gib, cpu_gib = pl.default_cache_gib(m.topology, m.inventory)
    cache = pl.CacheRows(gpu=pl.cache_rows(p.gpu_spec, gpu_gib, p.ds), cpu=pl.cache_rows(p.cpu_spec, cpu_gib, p.ds))
    n_gpus, n_sockets = pl.device_counts(m.topology, m.inventory)
    wl = pl.workload_from_hotness(p.ds, s.hot, cache.gpu, cache.cpu, n_gpus, n_sockets, p.fanouts, p.batch_size,
                                  order=s.order, heldout=s.heldout)
    plan = p.plans[k]
    if plan is None:  # the hardware placement `moment plan` recommends, re-evaluated for this workload
        key = (m.topology.model_dump_json(), m.inventory.describe())
        if key not in solved:
            with p.stage("plan", label) as cb:
                solved[key] = pl.recommended_plan(m.topology, m.inventory, progress=cb)
        plan = solved[key]
    return _MachinePlan(m, cache, n_gpus, n_sockets, wl, pl.replan(plan, m.topology, wl))


@dataclass
class _Written:
    path: Path
    manifest: Any  # the LayoutManifest as written
    bins: Any
    assignments: dict[str, Any]
    errors: dict[str, str]
    seconds: dict[str, float]
    summary: dict[str, Any]


def _write_machine(p: _Prepared, s: _Sampled, mp: _MachinePlan, out: Path, *, policy: str, pool: int | None,
                   overwrite: bool = False, timings: dict[str, float] | None = None, label: str,
                   split: Any = None, home: Path | None = None) -> _Written:
    """Bins -> policies -> the layout of one machine at `out`: DDAK and the baselines (only `policy` for a
    machine of a split, `split`: its SplitPart, whose held rows it places), `policy`'s assignment written.
    `timings` (if given) gets each policy's and the write's seconds; `home`: where the layout is published
    (a split's machine is written inside the split's partial directory)."""
    ds, plan = p.ds, mp.plan
    reads, order = s.hot.feature_reads, s.order
    if split is not None:  # the machine's rows, in local ids, hottest first
        pos = np.full(ds.num_nodes, -1, np.int64)
        pos[split.held] = np.arange(split.held.shape[0])
        order = pos[order]
        reads, order = reads[split.held], order[order >= 0]
    bins = pl.bins_from_plan(plan, mp.machine.topology, cache=mp.cache, row_bytes=ds.row_bytes,
                             ssd_stride=row_format(ds.row_bytes).stride, ssd_paths=p.ssd_paths)
    assignments, errors, seconds = pl.run_policies(reads, bins, pool=pool, order=order, required=policy,
                                                   only=split is not None)
    if timings is not None:
        timings |= {f"{k}_s": v for k, v in seconds.items()}
    summary = _summary(ds, s.hot, mp.wl, plan, p.plan_file, mp.cache, s.timings)
    extra = {k: summary[k] for k in ("workload", "cache", "skew", "presample", "hardware")} | {
        "predicted_epoch_read_s": plan.predicted.epoch_read_s,
        "achieved_shares": dict(zip(bins.names, assignments[policy].achieved_shares().tolist()))}
    t = time.perf_counter()
    with p.stage("write", label) as progress:
        path = write_layout(
            out, ds.file("features"), assignments[policy], overwrite=overwrite, progress=progress,
            plan=PlanRef(machine=plan.machine, placement=plan.placement, policy=policy,
                         pool=assignments[policy].pool if policy == "ddak" else None),
            dataset_checksum=ds.manifest.files["features"].sha256, dataset_id=ds.dataset_id,
            manifest_extra=extra, split=split, home=home)
    if timings is not None:
        timings["write_s"] = time.perf_counter() - t
    return _Written(path, load_manifest(path), bins, assignments, errors, seconds, summary)


def _verify_dataset(ds: GraphDataset, verify: bool, stage: StageHook, notice, timings: dict[str, float]) -> bool:
    """Re-hash the dataset against its manifest and check its structure, so corrupt data is refused, not
    placed; with --no-verify, only sampled blocks and the structure (cheap) are checked."""
    t = time.perf_counter()
    if not verify:
        notes = ds.check()
        if notice:
            notice("dataset not verified (--no-verify): its checksums were not checked, only sampled blocks and "
                   "its structure")
            for note in notes:
                notice(note)
        return False
    with stage("verify", "verifying dataset") as progress:
        ds.verify_checksums(progress=progress)
    ds.validate()
    timings["verify_s"] = time.perf_counter() - t
    return True


def _ddak_note(hotness, bins, order, assignments, reports) -> str | None:
    """Why a baseline beats DDAK on the share error, when it does (see placement.report.ddak_note)."""
    if "ddak" not in assignments:
        return None
    pool = assignments["ddak"].pool or 1
    return ddak_note(reports, pool, pool_access(hotness, pool, order), auto_pool(hotness, bins, order))


def _hotness(ds, hotness: Hotness | None, fanouts, batch_size, epochs, batches, seed, stage: StageHook,
             timings) -> Hotness:
    """Pre-sample, or take the given Hotness (`place` checked it fits the dataset and the run)."""
    t = time.perf_counter()
    if hotness is not None:
        hot = hotness
    else:
        with stage("presample", "pre-sampling") as progress:
            hot = presample(ds, fanouts, batch_size, epochs=epochs, num_batches=batches, seed=seed,
                            progress=progress)
    timings["presample_s"] = time.perf_counter() - t
    return hot


def _heldout(ds, hot: Hotness, fanouts, batch_size, seed, stage: StageHook, timings) -> np.ndarray:
    """A held-out sample's reads per node, what the choices made from `hot` are judged on
    (moment.workload.hotness.heldout_reads)."""
    t = time.perf_counter()
    with stage("presample", "pre-sampling a held-out sample (the predictions)") as progress:
        got = heldout_reads(ds, fanouts, batch_size, int(hot.meta.get("seed", seed)), progress)
    timings["heldout_s"] = time.perf_counter() - t
    return got


def _summary(ds, hot, wl, plan, plan_file, cache, timings) -> dict[str, Any]:
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


# ---- a split across machines ---------------------------------------------------------------------------


class SplitResult(BaseModel):
    """What `place_split()` did; `model_dump()` is `moment place --machines/--cluster --json`'s object."""

    model_config = ConfigDict(extra="forbid")

    split: str  # the split directory
    cluster_manifest: str
    id: str
    policy: str
    dataset: str
    dataset_verified: bool
    num_nodes: int
    replicated_rows: int
    replicated_source: str
    machines: list[dict[str, Any]]
    presample: dict[str, Any]
    timings: dict[str, float]
    notes: list[str]


def place_split(
    dataset: str | Path | GraphDataset,
    out: str | Path,
    machines: Sequence[SplitMachine],
    *,
    replicate: str | None = None,
    plan: Plan | str | Path | None = None,
    hotness: Hotness | str | Path | None = None,
    epochs: int = DEFAULTS["epochs"],
    batches: int | None = None,
    fanouts: Sequence[int] | None = None,
    batch_size: int | None = None,
    gpu_cache: str | None = None,
    cpu_cache: str | None = None,
    ssd_paths: Mapping[str, str] | Sequence[str] | None = None,
    pool: int | None = None,
    policy: str = DEFAULTS["policy"],
    overwrite: bool = DEFAULTS["overwrite"],
    verify: bool = DEFAULTS["verify"],
    seed: int = DEFAULTS["seed"],
    stage: StageHook | None = None,
    notice: Callable[[str], None] | None = None,
) -> SplitResult:
    """Split the dataset's rows over `machines` and write one layout per machine plus the cluster manifest
    at `out` (moment.placement.split). The hottest rows go to every machine: `replicate` of them (GiB or a
    share of the features, as --gpu-cache), by default as many as the smallest machine's GPU and CPU caches
    hold; the rest are dealt out by hotness. Each machine's rows are placed on its own hardware as `place`
    places a whole dataset (the plan `moment plan` recommends for it, or `plan` -- checked against every
    machine --, re-evaluated, and `policy`; `ssd_paths` as `place`'s, for every machine), so a split of one
    machine writes that machine's layout as `place` writes the whole."""
    p = _prepare(dataset, out, machines, split=True, plan=plan, hotness=hotness, epochs=epochs, batches=batches,
                 fanouts=fanouts, batch_size=batch_size, gpu_cache=gpu_cache, cpu_cache=cpu_cache,
                 ssd_paths=ssd_paths, pool=pool, policy=policy, overwrite=overwrite, seed=seed, stage=stage,
                 notice=notice, replicate=replicate)
    rep_spec = p.replicate
    ds, out, names = p.ds, p.out, [m.name for m in machines]
    partial, old_aside = sp.split_paths(out.absolute())

    with locked(out, "layout"):
        sp.recover(out)  # what a killed write left
        if exists(out):
            sp.check_split_replaceable(out)
        s = _sample(p, verify=verify, epochs=epochs, batches=batches, seed=seed, notice=notice)
        n = ds.num_nodes

        t = time.perf_counter()
        solved: dict[tuple[str, str], Plan] = {}  # equal machines are planned once
        per = [_plan_machine(p, s, k, m, solved, f"solving candidates ({m.name})") for k, m in enumerate(machines)]
        s.timings["plan_s"] = time.perf_counter() - t
        if rep_spec is not None:
            replicated, rep_source = pl.cache_rows(rep_spec, 0.0, ds), f"--replicate {replicate}"
        else:
            replicated = min(x.cache.gpu * x.n_gpus + x.cache.cpu * x.n_sockets for x in per)
            rep_source = "the rows the smallest machine's GPU and CPU caches hold"
            if replicated < n:  # leave every machine rows of its own
                replicated = min(replicated, n - len(machines))
        replicated = min(replicated, n)
        if 0 < n - replicated < len(machines):
            raise MomentError(f"--replicate {replicate} leaves {n - replicated:,} rows to split over "
                              f"{len(machines)} machines: every machine must own rows",
                              hint=f"replicate at most {n - len(machines):,} rows, or use fewer machines")
        owners = sp.split_rows(s.order, len(machines), replicated)
        notes = []
        if replicated >= n and len(machines) > 1:
            notes.append("every row is replicated on every machine: no machine reads rows from another "
                         "(a smaller --replicate splits them)")

        partial.parent.mkdir(parents=True, exist_ok=True)
        make_partial(partial, out)  # marked as this write's: the next writer knows it (and only it) as a leftover
        try:
            owners_sum = sp.write_owners(partial / sp.OWNERS, owners)
            sid = sp.split_id(ds.dataset_id, owners_sum.sha256, names)
            parts = []
            t = time.perf_counter()
            for k, (m, mp) in enumerate(zip(machines, per, strict=True)):
                held = sp.held_by(owners, k)
                remote = [(j, np.flatnonzero(owners == j).astype(np.int64)) for j in range(len(machines)) if j != k]
                ref = SplitRef(id=sid, machine=k, machines=names, replicated_rows=replicated,
                               remote=[RemoteBin(machine=j, name=names[j], rows=int(r.shape[0])) for j, r in remote])
                w = _write_machine(p, s, mp, partial / m.name, policy=policy, pool=pool,
                                   label=f"writing {m.name}'s layout", home=out.absolute() / m.name,
                                   split=SplitPart(held, s.order, ref, [r for _, r in remote]))
                lm = w.manifest
                parts.append(sp.MachinePart(
                    index=k, name=m.name, layout=m.name, layout_id=lm.layout_id(), machine=mp.plan.machine,
                    inventory=mp.plan.inventory, owned_rows=int((owners == k).sum()), held_rows=int(held.shape[0]),
                    bytes=sum(x.bytes for x in lm.shards),
                    remote_read_share=sp.remote_read_share(owners, s.heldout, k)))
            s.timings["write_s"] = time.perf_counter() - t
            sp.write_cluster_manifest(partial, sp.ClusterManifest(
                created_by="", id=sid, dataset=lm.dataset, replicated_rows=replicated, machines=parts,
                owners=owners_sum))
            if exists(out):
                mark_leftover(out, out)  # the old split, about to be SPLIT.partial or SPLIT.old: ours to remove
            old = publish_dir(partial, out, "split", aside=old_aside)
            (out / LEFTOVER_MARK).unlink(missing_ok=True)
        except BaseException as e:
            drop_shard_dirs(partial, [x.name for x in machines], out.absolute())  # what SSD mounts got of it
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(e, OSError):  # a full disk: one message, nothing left behind
                from moment.outputs import write_error

                raise write_error(e, out, "--out", doing="cannot write the split") from None
            raise
        if old is not None:
            drop_shard_dirs(old, None, out.absolute())  # the old machines' shard directories on SSD mounts
            shutil.rmtree(old, ignore_errors=True)
    return SplitResult(
        split=str(out), cluster_manifest=str(out / sp.CLUSTER_MANIFEST), id=sid, policy=policy, dataset=str(ds.path),
        dataset_verified=s.verified, num_nodes=n, replicated_rows=replicated, replicated_source=rep_source,
        machines=[x.model_dump(mode="json") | {"layout": str(out / x.layout)} for x in parts],
        presample={"batches": s.hot.num_batches, "unique_ratio": s.hot.unique_ratio, "batch_size": p.batch_size,
                   "fanouts": p.fanouts, "seed": seed},
        timings=s.timings, notes=notes)
