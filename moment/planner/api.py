"""The planner's answers as JSON-ready objects: what `moment plan/compare/simulate/models/profiles --json`
print and what the service returns, assembled in one place so both say the same thing.

Inputs are already-parsed objects (a Topology, an Inventory, a WorkloadSpec, a Calibration); parsing
helpers for the user's spellings (`4xA100,8xP5510`, a GPU count, the workload knobs) are here too.
Messages name the input by `flag(name)`: the CLI's `--gpus` by default, a request field in the service.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moment.errors import Flag, MomentError, cli_flag, validation_error, validation_lines

# Imports inside functions: the heavier stages this one calls (the planner's search, the sampler, a
# profile's readers) load only on the calls that need them.

if TYPE_CHECKING:  # imported where used: the CLI imports this module at start-up, which must stay instant
    from moment.planner.calibration import Calibration
    from moment.planner.contracts import Plan
    from moment.topology.devices import Inventory
    from moment.topology.model import Topology
    from moment.workload.spec import WorkloadSpec

#: --gpus when left out, on a machine whose GPUs go in slots; --ssds, --gpu-model, --ssd-model left out
DEFAULT_GPUS = 4
DEFAULT_SSDS = 8
DEFAULT_GPU_MODEL = "A100-PCIe-40GB"
DEFAULT_SSD_MODEL = "P5510"

#: --data left out: the LP chooses the SSD shares (what `moment place` with DDAK realises)
DEFAULT_DATA = "planned"
DATA_HELP = ("where the rows will be on the SSDs, which the prediction assumes: 'planned' (default: in the shares "
             "the LP chooses, as `moment place` with DDAK writes them) or 'even' (an equal share on every SSD, as "
             "hash or round-robin placement gives)")


# ---- inputs ------------------------------------------------------------------------------------------
def check_data(data: str | None, *, flag: Flag = cli_flag) -> str:
    """The data placement a prediction assumes (None: DEFAULT_DATA); another word is an error naming the input."""
    from moment.planner.contracts import DATA_PLACEMENTS

    if data is None:
        return DEFAULT_DATA
    if data not in DATA_PLACEMENTS:
        raise MomentError(f"{flag('data')} {data!r}: choose {' or '.join(DATA_PLACEMENTS)}",
                          hint="planned: the SSD shares the planner chooses (DDAK); even: equal shares (hash)",
                          field="data")
    return data


def check_one_inventory(inventory: bool, *, flag: Flag = cli_flag, **given: Any) -> None:
    """An inventory names every device, so counts or models given beside it (`gpus=3`, `ssd_model=...`;
    None: not given) would be ignored: refused, naming both."""
    named = [k for k, v in given.items() if v is not None]
    if inventory and named:
        raise MomentError(f"{flag('inventory')} lists every device to place, so {', '.join(map(flag, named))} would "
                          "be ignored: give one or the other",
                          hint=f"e.g. {flag('inventory')} 2xA100,4xP5510 alone, or {flag('gpus')} 2 {flag('ssds')} 4",
                          field=named[0])


def parse_inventory(spec: str | None, gpus: int, ssds: int | None, gpu_model: str | None = None,
                    ssd_model: str | None = None, *, flag: Flag = cli_flag) -> Inventory:
    """`4xA100-PCIe-40GB,8xP5510` (spec), or `gpus` and `ssds` of the two models (None: the defaults)."""
    from moment.topology.devices import Inventory, InventoryItem
    from moment.topology.model import Kind

    if spec is not None:
        if not spec.strip():
            raise MomentError(f"{flag('inventory')} is empty: expected COUNTxMODEL[,COUNTxMODEL...], e.g. 4xA100,8xP5510",
                              hint=f"leave {flag('inventory')} out to use {flag('gpus')}/{flag('ssds')}", field="inventory")
        items = []
        for part in spec.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*[xX*]\s*(\S+)\s*", part)
            if not m:
                raise MomentError(f"{flag('inventory')} {spec!r}: expected COUNTxMODEL[,COUNTxMODEL...], "
                                  "e.g. 4xA100,8xP5510", field="inventory")
            model = _model(m.group(2), "inventory", flag)
            items.append(InventoryItem(model=model.name, count=int(m.group(1))))
        return Inventory(items=items)
    ssds = DEFAULT_SSDS if ssds is None else ssds
    for what, n in (("gpus", gpus), ("ssds", ssds)):
        if n < 0:
            raise MomentError(f"{flag(what)} {n}: must not be negative", field=what)
    gpu = _model(gpu_model or DEFAULT_GPU_MODEL, "gpu_model", flag, Kind.gpu)
    ssd = _model(ssd_model or DEFAULT_SSD_MODEL, "ssd_model", flag, Kind.ssd)
    return Inventory.simple(gpus, ssds, gpu.name, ssd.name)


def _model(name: str, what: str, flag: Flag, kind=None):
    """The catalogue's model; an unknown one, or one of another kind than `kind`, is an error naming the
    input that gave it."""
    from moment.topology.devices import CATALOG, find_model
    from moment.topology.model import A_KIND

    try:
        m = find_model(name)
    except MomentError as e:
        raise MomentError(f"{flag(what)}: unknown device model {name!r}", hint=e.hint, field=what) from None
    if kind is not None and m.kind != kind:
        models = ", ".join(c.name for c in CATALOG if c.kind == kind)
        raise MomentError(f"{flag(what)} {name}: {m.name} is {A_KIND[m.kind]}, not {A_KIND[kind]}",
                          hint=f"{kind.value.upper()} models: {models} (`moment models` lists them all)", field=what)
    return m


def resolve_gpus(topo: Topology, gpus: int | None, *, flag: Flag = cli_flag, model: str | None = None) -> int:
    """How many GPUs to place. Left out: 0 where the machine has built-in GPUs (SXM modules the planner
    never moves), else DEFAULT_GPUS, or fewer where fewer free slots take a GPU of `model` (None:
    DEFAULT_GPU_MODEL; an unknown one is left to `parse_inventory` to name), one fewer where they would take
    every free slot and leave none for an SSD. Given: a number the machine
    cannot take as extra cards is an error, except the built-in count itself, which means "its own GPUs"."""
    from moment.topology.devices import builtin_gpus, find_model, fits, strip
    from moment.topology.model import Kind

    built = builtin_gpus(topo)
    if gpus is None:
        if built:
            return 0
        try:
            card = find_model(model or DEFAULT_GPU_MODEL)
        except MomentError:
            return DEFAULT_GPUS
        slots = strip(topo)[0].empty_slots()
        n = min(DEFAULT_GPUS, sum(fits(sl, card) for sl in slots))
        ssd = find_model(DEFAULT_SSD_MODEL)
        if n > 1 and n == len(slots) and any(fits(sl, ssd) for sl in slots):
            n -= 1  # GPUs in every free slot leave none for an SSD, and a plan without one reads from nothing
        return n
    if not built or gpus == 0:
        return gpus
    bare = strip(topo)[0]
    if any(Kind.gpu in sl.accepts and sl.width >= 16 for sl in bare.empty_slots()):
        return gpus  # extra cards next to the built-in ones
    if gpus == len(built):
        return 0
    model = getattr(built[0], "model", "GPU")
    raise MomentError(
        f"{flag('gpus')} {gpus}: {topo.name!r} has {len(built)} built-in GPUs ({model}) and no free slot for another",
        hint=f"leave out {flag('gpus')} (or {flag('gpus')} 0) to plan the SSDs around its own GPUs", field="gpus")


#: --gb-per-gpu's range, a byte to an exabyte: the planner's LP answers the same per-GPU rates at any size (its
#: time unit follows the epoch, `moment.planner.lp`), but the max-flow check and the replay work in floats, whose
#: range a figure far beyond any epoch leaves (1e-300 GB ended in a division by zero)
GB_PER_GPU_RANGE = (1e-9, 1e9)

#: WorkloadSpec field -> the input that sets it
_WORKLOAD_INPUTS = {"feature_dim": "feature_dim", "bytes_per_gpu_per_epoch": "gb_per_gpu",
                    "gpu_cache_share": "gpu_cache_share", "cpu_cache_share": "cpu_cache_share"}


def workload_spec(feature_dim: int | None = None, gb_per_gpu: float | None = None,
                  gpu_cache_share: float | None = None, cpu_cache_share: float | None = None, *,
                  flag: Flag = cli_flag) -> WorkloadSpec:
    """The planner's workload with the given knobs changed (None: the default)."""
    from pydantic import ValidationError

    from moment.workload.spec import WorkloadSpec

    fields: dict[str, Any] = {}
    if feature_dim is not None:
        fields["feature_dim"] = feature_dim
    low, high = GB_PER_GPU_RANGE
    if gb_per_gpu is not None and not low <= gb_per_gpu <= high:  # (nan too)
        raise MomentError(f"{flag('gb_per_gpu')} {gb_per_gpu:g}: the GB each GPU reads in an epoch must be between "
                          f"{low:g} (a byte) and {high:g} (an exabyte)",
                          hint=f"leave {flag('gb_per_gpu')} out to estimate it from the workload, or give the GB a "
                               "GPU reads an epoch (the dataset's rows it samples, times the row's bytes)",
                          field="gb_per_gpu")
    if gb_per_gpu is not None:
        fields["bytes_per_gpu_per_epoch"] = gb_per_gpu * 1e9
    if gpu_cache_share is not None:
        fields["gpu_cache_share"] = gpu_cache_share
    if cpu_cache_share is not None:
        fields["cpu_cache_share"] = cpu_cache_share
    try:
        return WorkloadSpec(**fields)
    except ValidationError as e:
        def relabel(loc: list) -> list:
            name = _WORKLOAD_INPUTS.get(".".join(map(str, loc)))
            return [flag(name) if name else "workload"]

        # the field of the first error; the model's own check (the shares' sum) blames the share given last
        first = _WORKLOAD_INPUTS.get(".".join(map(str, e.errors()[0]["loc"]))) or (
            "cpu_cache_share" if cpu_cache_share is not None else "gpu_cache_share")
        raise MomentError(f"workload options: {'; '.join(validation_lines(e, relabel=relabel))}", field=first) from None


def load_topology(profile: str, calibration: Path | None, overrides: list[str] | None = None):
    """The profile (name or YAML file), with the calibration file applied when one is given:
    (topology, calibration or None)."""
    from moment.topology.profiles import load_profile

    topo = load_profile(profile, overrides)
    if calibration is None:
        return topo, None
    from moment.planner.calibration import load_calibration

    cal = load_calibration(calibration)
    return calibrated(topo, cal), cal


def read_plan(path: str | Path) -> Plan:
    """A `moment plan --json` file (another kind of document given instead is named as such)."""
    from pydantic import ValidationError

    from moment.documents import mistaken
    from moment.inputs import read_text
    from moment.planner.contracts import Plan
    from moment.topology.profiles import parse_yaml

    text = read_text(path, "plan")
    try:
        return Plan.model_validate_json(text)
    except ValidationError as e:
        try:
            data = parse_yaml(text, str(path))  # JSON is YAML: a profile or calibration given as --plan too
        except MomentError:
            data = None
        raise mistaken(data, "plan", str(path)) or validation_error(
            e, "not a plan (output of `moment plan --json`)", source=str(path)) from None


def check_plan_placement(plan: Plan, topo: Topology, source: str | None) -> None:
    """Refuse a plan's placement that `topo` cannot hold (a hand-edited plan: a GPU in an SSD bay, a slot the
    machine lacks), naming the plan file as its other faults are named."""
    from moment.topology.devices import check_placement, strip

    try:
        check_placement(strip(topo)[0], plan.placement)
    except MomentError as e:
        raise MomentError(e.message, source=source or e.source, hint=e.hint, field=e.field) from None


def calibrated(topo: Topology, cal: Calibration | None) -> Topology:
    """`topo` with the calibration's link efficiencies and SSD read scale applied."""
    from moment.planner.calibration import apply_calibration

    return topo if cal is None else apply_calibration(topo, cal.params)


# ---- plan --------------------------------------------------------------------------------------------
def calibration_block(cal: Calibration, source: str, plan: Plan) -> dict:
    """`calibration` of `plan --calibration --json`: the source, its parameters, the calibrated epochs."""
    from moment.planner.calibration import calibrated_epoch
    from moment.planner.calibration_file import LINK_CLASSES

    epochs = {"recommended": calibrated_epoch(plan.under(plan.data).epoch_read_s, cal)}
    epochs.update({b.name: calibrated_epoch(b.under(plan.data).epoch_read_s, cal) for b in plan.baselines})
    # a fit carries to another machine by link class only: say when it does, and how well it fitted at home
    return {"file": source, "params": cal.params, "predicted_epoch_s": epochs, "fitted_on": cal.fitted_on,
            "other_machine": cal.fitted_on != plan.machine and any(n in LINK_CLASSES for n in cal.fitted),
            "loo_max_rel_err": cal.loo_max_rel_err}


def calibrated_row(cal: Calibration | None, plan: Plan) -> dict:
    """Extra keys of a `compare --calibration` row."""
    from moment.planner.calibration import calibrated_epoch

    if cal is None:
        return {}
    return {"calibrated_epoch_s": calibrated_epoch(plan.under(plan.data).epoch_read_s, cal), "calibration": cal.params}


def replay_placement(topo_bare: Topology, placement: dict[str, str], workload: WorkloadSpec, *,
                     steps: int | None, seed: int, uniform: bool, flag: Flag = cli_flag, data: str = "planned"):
    """Replay a placement on a synthetic trace: the LP's shares under `data` (equal SSD shares with
    'even'), `steps` DDP steps (default: the workload's seeds / batch / GPUs), rows of the workload's
    row size."""
    from moment.planner.lp import solve_lp
    from moment.planner.network import build_network
    from moment.planner.replay import Replayer, check_steps, steps_per_epoch, synthetic_demands
    from moment.topology.devices import populate

    check_replay_inputs(steps, seed, flag=flag)
    net = build_network(populate(topo_bare, placement), workload)
    if steps is not None:
        check_steps(net, steps, what=f"{flag('steps')} {steps}", hint=f"leave {flag('steps')} out to replay one epoch")
    sol = solve_lp(net, data=data)
    n = steps or steps_per_epoch(workload.num_nodes * workload.train_fraction, workload.batch_size, len(net.gpus))
    B = synthetic_demands(net, sol.storage_shares(), n, workload.row_bytes, seed=seed, uniform=uniform)
    return Replayer(net).run(B, sol.epoch_read_s, "uniform" if uniform else "synthetic")


def check_replay_inputs(steps: int | None, seed: int, *, flag: Flag = cli_flag) -> None:
    """A replay's step count is positive and its seed is not negative (numpy takes none)."""
    if steps is not None and steps <= 0:
        raise MomentError(f"{flag('steps')} {steps}: must be positive")
    if seed < 0:
        raise MomentError(f"{flag('seed')} {seed}: must be 0 or more")


def replay_rows(plan: Plan, topo: Topology, steps: int | None = None, seed: int = 0) -> dict:
    """`plan --replay`: replayed epoch next to the LP's for the recommended layout and each baseline."""
    from moment.topology.devices import strip

    bare, _ = strip(topo)
    out = {"recommended": replay_placement(bare, plan.placement, plan.workload, steps=steps, seed=seed,
                                           uniform=False, data=plan.data).model_dump(mode="json")}
    for b in plan.baselines:
        out[b.name] = replay_placement(bare, b.placement, plan.workload, steps=steps, seed=seed,
                                       uniform=False, data=plan.data).model_dump(mode="json")
    return out


def plan_machine(topo: Topology, inventory: Inventory, workload: WorkloadSpec, *,
                 overrides: list[str] | None = None, calibration: Calibration | None = None,
                 calibration_source: str = "", replay: bool = False, maxflow_backend: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 timeout: float | None = None, data: str = DEFAULT_DATA) -> tuple[Plan, dict]:
    """Plan `inventory` on `topo` (calibration already applied): the Plan and `moment plan --json`'s object
    (the plan, plus `calibration` and `replay` when asked). `timeout`: seconds for the search (`make_plan`);
    `data`: the data placement the search ranks by (`make_plan`); `maxflow_backend` None: the planner's default."""
    from moment.planner.maxflow import BACKENDS, DEFAULT_BACKEND
    from moment.planner.plan import make_plan

    maxflow_backend = maxflow_backend or DEFAULT_BACKEND
    if maxflow_backend not in BACKENDS:
        raise MomentError(f"maxflow backend {maxflow_backend!r}: choose {' or '.join(BACKENDS)}")
    plan = make_plan(topo, inventory, workload, maxflow_backend=maxflow_backend, progress=progress, timeout=timeout,
                     data=data)
    plan = plan.model_copy(update={"overrides": list(overrides or [])})
    extra: dict[str, Any] = {}
    if calibration is not None:
        extra["calibration"] = calibration_block(calibration, calibration_source, plan)
    if replay:
        extra["replay"] = replay_rows(plan, topo)
    return plan, {**plan.model_dump(mode="json"), **extra}


def plan_svg(topo: Topology, plan: Plan) -> str:
    """The plan's diagram as SVG text (what `moment plan --diagram FILE.svg` writes)."""
    from moment.planner.diagram import plan_svg as svg

    return svg(topo, plan)


# ---- compare -----------------------------------------------------------------------------------------
def compare_row(profile: str, topo: Topology, inventory: Inventory, *, overrides: list[str] | None = None,
                calibration: Calibration | None = None,
                progress: Callable[[int, int], None] | None = None, data: str = DEFAULT_DATA) -> dict:
    """One row of `moment compare --json`: the best layout of `inventory` on `topo` (default workload),
    its figures under the data placement `data`."""
    from moment.planner.explain import bottleneck_summary
    from moment.planner.plan import make_plan
    from moment.topology.devices import builtin_gpus_note
    from moment.workload.spec import WorkloadSpec

    plan = make_plan(topo, inventory, WorkloadSpec(), progress=progress, data=data)
    best_base = min(plan.baselines, key=lambda b: b.under(data).epoch_read_s, default=None)
    p = plan.under(data)
    return {
        "profile": profile, "inventory": plan.inventory, "built_in": builtin_gpus_note(topo, "").strip(),
        "overrides": list(overrides or []), "data": data,
        "epoch_read_s": p.epoch_read_s,
        "per_gpu_inlet_gbps": p.per_gpu_inlet_gbps,
        "aggregate_gbps": p.aggregate_gbps,
        "bottlenecks": plan.bottlenecks,
        "bottleneck_summary": bottleneck_summary(plan),
        "best_baseline": best_base.name if best_base else None,
        "gain_vs_best_baseline": plan.gain_vs_best_baseline,
        "placement": plan.placement,
        "notes": plan.notes,  # (a link its CPU caps, a rate above its wire, a layout the inventory does not fit)
        **calibrated_row(calibration, plan),
    }


def compare_rows(machines: list[tuple[str, Topology]], *, inventories: list[str] | None = None,
                 gpus: int | None = None, ssds: int | None = None, gpu_model: str | None = None,
                 ssd_model: str | None = None, overrides: list[str] | None = None,
                 calibration: Calibration | None = None, flag: Flag = cli_flag,
                 progress: Callable[[int, int], None] | None = None, data: str = DEFAULT_DATA) -> list[dict]:
    """`moment compare --json`: each (name, calibrated topology) with each inventory (or gpus/ssds)."""
    rows = []
    for name, topo in machines:
        invs = [parse_inventory(s, 0, 0, gpu_model, ssd_model, flag=flag) for s in inventories or []] or \
            [parse_inventory(None, resolve_gpus(topo, gpus, flag=flag, model=gpu_model), ssds, gpu_model, ssd_model,
                             flag=flag)]
        for inv in invs:
            rows.append(compare_row(name, topo, inv, overrides=overrides, calibration=calibration,
                                    progress=progress, data=data))
    return rows


# ---- simulate ----------------------------------------------------------------------------------------
def simulate_named(topo: Topology, layout: str, gpus: int, ssds: int, *, steps: int | None = None,
                   seed: int = 0, uniform: bool = False, flag: Flag = cli_flag, data: str = DEFAULT_DATA):
    """Replay one of the profile's named layouts (e.g. paper-c) for gpus/ssds of the default models,
    its data placed as `data` says."""
    from moment.planner.baselines import layouts_of
    from moment.topology.devices import strip
    from moment.workload.spec import WorkloadSpec

    bare = strip(topo)[0]
    inv = parse_inventory(None, gpus, ssds, flag=flag)
    found, notes = layouts_of(bare, inv)
    lays = {b.name: b for b in found}
    if layout not in lays:
        raise MomentError(f"{flag('placement')} {layout!r}: not a layout of {bare.name!r} for {inv.describe()}",
                          hint="; ".join([f"its layouts: {', '.join(lays) or 'none'}", *notes]), field="placement")
    return replay_placement(bare, lays[layout].placement, WorkloadSpec(), steps=steps, seed=seed, uniform=uniform,
                            flag=flag, data=data)


def simulate_plan(topo: Topology, plan: Plan, *, steps: int | None = None, seed: int = 0, uniform: bool = False,
                  flag: Flag = cli_flag, data: str | None = None):
    """Replay a plan's recommended placement with the plan's workload, its data placed as `data` says
    (None: as the plan was made for)."""
    from moment.topology.devices import strip

    return replay_placement(strip(topo)[0], plan.placement, plan.workload, steps=steps, seed=seed, uniform=uniform,
                            flag=flag, data=data or plan.data)


def replay_json(rep, cal: Calibration | None, data: str | None = DEFAULT_DATA) -> dict:
    """`moment simulate --json`: the replay (of data placed as `data` says; None: a real layout's), and the
    calibrated epoch when a calibration is applied."""
    from moment.planner.calibration import calibrated_epoch

    out = rep.model_dump(mode="json")
    if data is not None:
        out["data"] = data
    if cal is not None:
        out["calibrated_epoch_s"] = calibrated_epoch(rep.epoch_s, cal)
    return out


# ---- machines and catalogues --------------------------------------------------------------------------------------
def topology_json(topo: Topology, report=None) -> dict:
    """`moment scan --json`: the topology, and the scan's report (sources used and missing) when there is one."""
    from moment.topology.profiles import SCAN_REPORT

    data = topo.model_dump(mode="json", exclude_none=True)
    if report is not None:
        data[SCAN_REPORT] = report.model_dump(mode="json")
    return data


def models_json() -> list[dict]:
    """`moment models --json`: the GPU, SSD and NIC models the planner knows."""
    from moment.topology.devices import CATALOG

    return [m.model_dump(mode="json") for m in CATALOG]


def profiles_json() -> list[dict]:
    """`moment profiles --json`: each built-in profile's name, description, device counts, free slots."""
    from moment.topology.profiles import builtin_names, load_profile

    rows = []
    for name in builtin_names():
        t = load_profile(name)
        rows.append({"name": name, "description": t.description or "", "counts": t.counts(),
                     "empty_slots": len(t.empty_slots())})
    return rows
