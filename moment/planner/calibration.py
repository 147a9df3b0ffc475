"""Calibration: fit a few physical efficiency parameters to measurements (`moment calibrate`).

Book link rates overstate what peer-to-peer reads reach on many platforms (through a PCIe switch's
upstream port, forwarded by a root complex, across the socket link), and a measured epoch holds
more than reads. A calibration is data: named, bounded parameters, applied to a profile before the
capacity graph is built (`apply_calibration`), so plan, compare and simulate honour it. The
parameters name link *classes*, not links, so a calibration fitted on one machine applies to another
of the same platform.

Fit: bounded least squares (scipy `least_squares`, trf) on relative residuals
(predicted - measured) / measured, from a few deterministic starting points; the predicted epoch is
the realisable LP's read time + `overhead_s`. Leave-one-out: each measurement refitted without
itself and predicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from moment.documents import mistaken
from moment.errors import MomentError, validation_error
from moment.planner.calibration_file import DEFAULT_FIT, EFFICIENCY, PARAMS, Calibration, Param, Residual, defaults  # noqa: F401 (theirs, here as well)
from moment.planner.contracts import DataPlacement
from moment.topology.bandwidth import GB
from moment.topology.devices import Inventory, check_placement, strip
from moment.topology.model import Kind, Topology
from moment.topology.profiles import read_yaml
from moment.workload.spec import WorkloadSpec

# Imports inside functions: a solver's or renderer's library (networkx, OR-Tools, SciPy, matplotlib) loads
# only when it is used.


# ---- applying a calibration ------------------------------------------------------------------------
def link_class(topo: Topology, node_id: str) -> str | None:
    """The calibration parameter that scales a node's uplink, or None (device card links, internal)."""
    n = topo.node(node_id)
    if n.link is None or n.parent is None or n.link.kind != "pcie":
        return None
    parent = topo.node(n.parent).kind
    if n.kind == Kind.switch:
        return "switch_uplink"
    if n.kind == Kind.slot and parent == Kind.switch:
        return "switch_port"
    if n.kind == Kind.slot and parent == Kind.root_complex:
        return "rc_port"
    return None


def apply_calibration(topo: Topology, params: dict[str, float]) -> Topology:
    """A copy of `topo` with each classified link at `book rate x parameter` (as its bandwidth_gbps)
    and the SSD read scale set. Missing parameters keep their defaults (no change)."""
    p = {**defaults(), **params}
    data = topo.model_dump()
    for nd, n in zip(data["nodes"], topo.nodes):
        cls = link_class(topo, n.id)
        if cls is not None and p[cls] != 1.0:
            nd["link"]["bandwidth_gbps"] = n.link.bandwidth() / GB * p[cls]
    for ld, lk in zip(data["links"], topo.links):
        if lk.kind in ("upi", "qpi") and p["socket_link"] != 1.0:
            ld["bandwidth_gbps"] = lk.bandwidth() / GB * p["socket_link"]
    if p["ssd_read"] != 1.0:
        data["ssd_read_scale"] = p["ssd_read"] * (topo.ssd_read_scale or 1.0)
    return Topology.model_validate(data)


# ---- files -----------------------------------------------------------------------------------------
class Measurement(BaseModel):
    """One measured figure: a layout's epoch time, an SSD's read rate or a link's rate."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    layout: str | None = Field(None, description="a layout named in the profile")
    gpu: list[str] | None = Field(None, description="GPU slots, in order (instead of a layout name)")
    ssd: list[str] | None = Field(None, description="SSD slots, in order")
    epoch_s: float | None = Field(None, gt=0)
    device: str | None = Field(None, description="e.g. ssd0")
    read_gbps: float | None = Field(None, gt=0)
    data: DataPlacement | None = Field(None, description="data placement of the measured run: 'planned' (DDAK "
                                       "realises the LP's shares) or 'even' (every SSD holds an equal share, e.g. "
                                       "hash); default: the file's")
    link: str | None = Field(None, description="node id whose uplink was measured, or 'socket_link'")
    gbps: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Measurement:
        kinds = [self.epoch_s is not None, self.read_gbps is not None, self.gbps is not None]
        if sum(kinds) != 1:
            raise ValueError("give exactly one of epoch_s (with layout or gpu/ssd), read_gbps (with device), "
                             "gbps (with link)")
        if self.epoch_s is not None and (self.layout is None) == (self.gpu is None and self.ssd is None):
            raise ValueError("an epoch_s needs a layout name or gpu/ssd slot lists (one of them)")
        if self.read_gbps is not None and not self.device:
            raise ValueError("read_gbps needs a device (e.g. ssd0)")
        if self.data is not None and self.epoch_s is None:
            raise ValueError("data (where the rows were placed) belongs to an epoch_s measurement, not to a "
                             "device's or link's rate")
        if self.gbps is not None and not self.link:
            raise ValueError("gbps needs a link (a node id, or socket_link)")
        return self

    @property
    def label(self) -> str:
        if self.epoch_s is not None:
            return self.layout or f"gpu={','.join(self.gpu or [])};ssd={','.join(self.ssd or [])}"
        return f"{self.device}:read" if self.device else f"{self.link}:rate"

    @property
    def value(self) -> float:
        return float(self.epoch_s or self.read_gbps or self.gbps or 0.0)

    @property
    def unit(self) -> str:
        """`value`'s unit: seconds for an epoch, GB/s for a device's or link's rate."""
        return "s" if self.epoch_s is not None else "GB/s"


class MeasurementFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    machine: str | None = Field(None, description="profile the layouts refer to")
    gpus: int | None = Field(None, ge=0)
    ssds: int | None = Field(None, ge=0)
    data: DataPlacement = Field("planned", description="data placement of the measured runs unless a "
                                "measurement says otherwise")
    measurements: list[Measurement] = Field(min_length=1)
    probe: dict[str, Any] | None = Field(None, description="what `moment probe` measured besides (not fitted)")


def load_measurements(path: str | Path) -> MeasurementFile:
    data = read_yaml(path, "measurement file")
    try:
        return MeasurementFile.model_validate(data)
    except ValidationError as e:
        raise mistaken(data, "measurement file", str(path)) or validation_error(
            e, "not a measurement file", source=str(path)) from None


def load_calibration(path: str | Path) -> Calibration:
    data = read_yaml(path, "calibration")
    try:
        return Calibration.model_validate(data)
    except ValidationError as e:
        raise mistaken(data, "calibration", str(path)) or validation_error(
            e, "not a calibration file (from `moment calibrate --out`)", source=str(path)) from None


def dump_calibration(cal: Calibration) -> str:
    head = "".join(f"# {k}: {PARAMS[k].meaning} [{PARAMS[k].lo}, {PARAMS[k].hi}] {PARAMS[k].unit}\n"
                   for k in PARAMS)
    return ("# Moment calibration: apply with `moment plan|compare|simulate --calibration FILE`\n" + head
            + yaml.safe_dump(cal.model_dump(mode="json"), sort_keys=False, width=110))


# ---- the model the fit calls ---------------------------------------------------------------------------
class Model:
    """Predicts every measurement of one machine for a parameter vector (one HiGHS call per vector)."""

    def __init__(self, topo: Topology, inventory: Inventory, measurements: list[Measurement],
                 workload: WorkloadSpec | None = None, data: str = "planned"):
        self.bare, _ = strip(topo)
        self.inventory = inventory
        self.workload = workload or WorkloadSpec()
        self.ms = measurements
        self.even = [(m.data or data) == "even" for m in measurements]
        self.placements = [self._placement(m) if m.epoch_s is not None else None for m in measurements]
        ssd_models = [m for m, _ in inventory.models() if m.kind == Kind.ssd]
        self.rated_ssd = ssd_models[0].read_gbps if ssd_models else None
        for m in measurements:
            if m.read_gbps is not None and self.rated_ssd is None:
                raise MomentError(f"measurement {m.label}: the inventory has no SSD to compare a read rate with")
            if m.gbps is not None:
                self._link_book(m.link or "")

    def _placement(self, m: Measurement) -> dict[str, str]:
        gpus = [x for x, c in self.inventory.models() if x.kind == Kind.gpu for _ in range(c)]
        ssds = [x for x, c in self.inventory.models() if x.kind == Kind.ssd for _ in range(c)]
        if m.layout is not None:
            if m.layout not in self.bare.layouts:
                raise MomentError(f"layout {m.layout!r} is not in profile {self.bare.name!r}",
                                  hint=f"its layouts: {', '.join(self.bare.layouts) or 'none'}")
            lay = self.bare.layouts[m.layout]
            gslots, sslots = lay.gpu[:len(gpus)], lay.ssd[:len(ssds)]
        else:
            gslots, sslots = m.gpu or [], m.ssd or []
        if len(gslots) != len(gpus) or len(sslots) != len(ssds):
            raise MomentError(f"measurement {m.label}: {len(gslots)} GPU and {len(sslots)} SSD slots for an "
                              f"inventory of {len(gpus)} GPUs and {len(ssds)} SSDs")
        placement = {s: d.name for s, d in zip(gslots + sslots, gpus + ssds)}
        if len(placement) != len(gslots) + len(sslots):
            raise MomentError(f"measurement {m.label}: a slot is named twice")
        try:
            check_placement(self.bare, placement)
        except MomentError as e:
            raise MomentError(f"measurement {m.label}: {e}") from None
        return placement

    def _link_book(self, link: str) -> tuple[float, str]:
        if link == "socket_link":
            peers = [lk for lk in self.bare.links if lk.kind in ("upi", "qpi")]
            if not peers:
                raise MomentError(f"profile {self.bare.name!r} has no socket link to compare with")
            return peers[0].bandwidth() / GB, "socket_link"
        if not self.bare.has(link):
            raise MomentError(f"measured link {link!r} is not a node of {self.bare.name!r}")
        cls = link_class(self.bare, link)
        if cls is None:
            raise MomentError(f"measured link {link!r}: its uplink is not one a calibration scales",
                              hint="measure a switch uplink, a slot's link or socket_link")
        return self.bare.node(link).link.bandwidth() / GB, cls

    def predict(self, params: dict[str, float]) -> np.ndarray:
        from moment.planner.network import ChassisTemplate

        p = {**defaults(), **params}
        out = np.zeros(len(self.ms))
        idx = [i for i, pl in enumerate(self.placements) if pl is not None]
        if idx:
            tpl = ChassisTemplate(apply_calibration(self.bare, p))
            times = epoch_read_times([tpl.network(self.placements[i], self.workload) for i in idx],
                                     [self.even[i] for i in idx])
            for i, t in zip(idx, times):
                out[i] = t + p["overhead_s"]
        for i, m in enumerate(self.ms):
            if m.read_gbps is not None:
                out[i] = (self.rated_ssd or 0.0) * p["ssd_read"]
            elif m.gbps is not None:
                book, cls = self._link_book(m.link or "")
                out[i] = book * p[cls]
        return out


def epoch_read_times(nets: list, even: list[bool]) -> list[float]:
    """The realisable LP's epoch read time of each network (one HiGHS call); where `even`, the SSD
    shares are not chosen by the LP but fixed equal (`lp._fix_even`)."""
    from moment.planner.highs import linprog
    from moment.planner.lp import _parts, _stack

    parts = [_parts(n, "auto", "even" if ev else "planned") for n, ev in zip(nets, even)]
    lp = _stack(parts)
    col0 = lp.pop("col0")
    res = linprog(**lp)
    if not res.ok:
        raise MomentError(f"the calibration's LP has no solution ({res.message.strip()})")
    return [float(res.x[c + len(n.storage)]) for n, c in zip(nets, col0[:-1])]


@dataclass
class FitResult:
    params: dict[str, float]
    predicted: np.ndarray
    cost: float


#: grid levels per efficiency parameter for the starting point (the LP time is piecewise smooth in the
#: efficiencies, so a local fit from one start can stop at a kink)
GRID_LEVELS = 5


def _grid(model: Model, names: list[str], base: dict[str, float]) -> list[tuple[dict[str, float], np.ndarray]]:
    """Predictions on a grid over the fitted efficiencies (overhead 0): computed once per fit set,
    reused by every leave-one-out fit (predictions do not depend on which measurements are kept)."""
    key = (tuple(names), tuple(sorted(base.items())))
    cache = model.__dict__.setdefault("_grid_cache", {})
    if key not in cache:
        import itertools

        eff = [n for n in names if n != "overhead_s"]
        levels = [np.linspace(PARAMS[n].lo, PARAMS[n].hi, GRID_LEVELS) for n in eff]
        pts = []
        for combo in itertools.product(*levels):
            q = {**base, **dict(zip(eff, (float(v) for v in combo)))}
            if "overhead_s" in names:
                q["overhead_s"] = 0.0
            pts.append((q, model.predict(q)))
        cache[key] = pts
    return cache[key]


def _best_overhead(pred: np.ndarray, meas: np.ndarray) -> float:
    """The overhead minimising the relative squared residuals of pred + o (closed form), in bounds."""
    w = 1.0 / meas**2
    o = float(np.sum(w * (meas - pred)) / np.sum(w))
    return min(max(o, PARAMS["overhead_s"].lo), PARAMS["overhead_s"].hi)


def fit(model: Model, names: list[str], keep: np.ndarray | None = None,
        fixed: dict[str, float] | None = None) -> FitResult:
    """Bounded least squares on relative residuals over the measurements in `keep` (all by default),
    started from the best point of a coarse grid."""
    from scipy.optimize import least_squares

    meas = np.array([m.value for m in model.ms])
    keep = np.ones(len(meas), dtype=bool) if keep is None else keep
    base = {**defaults(), **(fixed or {})}
    lo = np.array([PARAMS[n].lo for n in names])
    hi = np.array([PARAMS[n].hi for n in names])
    is_epoch = np.array([m.epoch_s is not None for m in model.ms])

    def params_of(x: np.ndarray) -> dict[str, float]:
        return {**base, **dict(zip(names, (float(v) for v in x)))}

    def resid(x: np.ndarray) -> np.ndarray:
        return (model.predict(params_of(x))[keep] - meas[keep]) / meas[keep]

    best_start, best_cost = None, np.inf
    for q, pred in _grid(model, names, base):
        q = dict(q)
        if "overhead_s" in names and (keep & is_epoch).any():
            o = _best_overhead(pred[keep & is_epoch], meas[keep & is_epoch])
            q["overhead_s"] = o
            pred = pred + np.where(is_epoch, o, 0.0)
        cost = float(np.sum(((pred[keep] - meas[keep]) / meas[keep]) ** 2))
        if cost < best_cost - 1e-15:
            best_start, best_cost = q, cost
    assert best_start is not None
    x0 = np.clip([best_start[n] for n in names], lo, hi)
    res = least_squares(resid, x0, bounds=(lo, hi), method="trf", diff_step=1e-3, x_scale=hi - lo, max_nfev=200)
    p = params_of(res.x)
    return FitResult(p, model.predict(p), float(res.cost))


def check_fit_names(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in PARAMS]
    if unknown or not names:
        raise MomentError(f"--fit {','.join(names) or '(empty)'}: unknown parameter(s) {unknown or '(none)'}",
                          hint=f"choose from {', '.join(PARAMS)}")
    return sorted(set(names), key=list(PARAMS).index)


#: a measurement this many times faster than the model at its fastest (every efficiency at its book rate, no
#: overhead) is refused: no calibration reaches it, and a fit would sit on its bounds, i.e. be the book rates
#: with residuals in the thousands of percent; a time in ms or per step, or a rate in MB/s, is the usual cause
UNREACHABLE = 2.0
#: a fit resting on a parameter's fast bound that still predicts a measurement this much slower is noted
BOUND_MISS = 0.10
_UNITS_HINT = ("epoch_s is the seconds of one whole epoch of the workload `moment plan` assumes (igb-hom-graphsage, "
               "1024-d features), read_gbps and gbps are GB/s: a time in milliseconds or of one training step, a "
               "rate in MB/s, or a run that read far less than that workload is the usual cause")


def fastest(model: Model) -> np.ndarray:
    """Each measurement as the model predicts it at its fastest: every efficiency at its upper bound, no
    overhead (the parameters' defaults)."""
    return model.predict({k: p.lo if p.unit == "s" else p.hi for k, p in PARAMS.items()})


def _faster(m: Measurement, measured: float, best: float) -> float:
    """How many times faster `measured` is than the model's fastest `best` (epochs: less is faster)."""
    return best / measured if m.epoch_s is not None else measured / best if best > 0 else np.inf


def _check_reachable(model: Model, source: str | None) -> None:
    """Refuse measurements far faster than any calibration can make the machine (`UNREACHABLE`)."""
    best = fastest(model)
    far = [(m, m.value, float(best[i])) for i, m in enumerate(model.ms)
           if _faster(m, m.value, float(best[i])) > UNREACHABLE]
    if not far:
        return
    each = "; ".join(f"{m.label} {v:.3g} {m.unit} measured, at best {b:.3g} {m.unit} ({_faster(m, v, b):.0f}x)"
                     for m, v, b in far[:4])
    more = f"; and {len(far) - 4} more" if len(far) > 4 else ""
    raise MomentError(f"{len(far)} of the {len(model.ms)} measurements are more than {UNREACHABLE:g}x faster than "
                      f"{model.bare.name} ({model.inventory.describe()}) can be at its book rates with no overhead, "
                      f"so no calibration fits them: {each}{more}", source=source, hint=_UNITS_HINT)


def _slow_notes(model: Model) -> list[str]:
    """A note naming measurements more than `UNREACHABLE` times slower than the model can be with every parameter
    at its slow bound (the most overhead included): no calibration reaches them, and the fit misses them."""
    worst = model.predict({k: p.hi if p.unit == "s" else p.lo for k, p in PARAMS.items()})
    far = [(m, m.value, float(worst[i])) for i, m in enumerate(model.ms)
           if (m.value / worst[i] if m.epoch_s is not None else worst[i] / m.value if m.value > 0 else 0.0)
           > UNREACHABLE]
    if not far:
        return []
    each = ", ".join(f"{m.label} {v:.3g} {m.unit} measured, at worst {w:.3g} {m.unit}" for m, v, w in far[:4])
    more = f", and {len(far) - 4} more" if len(far) > 4 else ""
    return [f"{len(far)} of the {len(model.ms)} measurements are more than {UNREACHABLE:g}x slower than "
            f"{model.bare.name} can be with every parameter at its slow bound ({each}{more}): no calibration reaches "
            "them and the fit misses them; a time not in seconds per epoch, a run much larger than the workload "
            "`moment plan` assumes, or one slowed by other work is the usual cause"]


def _bound_notes(full: FitResult, names: list[str], ms: list[Measurement], residuals: list[Residual]) -> list[str]:
    """A note when the fit rests on a parameter's bound and still misses measurements by more than BOUND_MISS
    on that bound's side: at the fast bound predicting slower than measured (the model cannot be as fast as
    they say), at the slow bound predicting faster (the machine measured slower than the bounds allow)."""
    notes = []
    for side in ("fast", "slow"):
        at = {n: (PARAMS[n].lo if (PARAMS[n].unit == "s") == (side == "fast") else PARAMS[n].hi) for n in names}
        pinned = [n for n in names if abs(full.params[n] - at[n]) <= 1e-6 * max(1.0, abs(at[n]))]
        sign = 1.0 if side == "fast" else -1.0  # an epoch predicted longer, or a rate lower, than measured is slower
        miss = [r for m, r in zip(ms, residuals)
                if sign * (r.rel_err if m.epoch_s is not None else -r.rel_err) > BOUND_MISS]
        if not (pinned and miss):
            continue
        stops = f"the fit stops at the {'slow ' if side == 'slow' else ''}bound of " \
            f"{', '.join(f'{n} = {at[n]:g}' for n in pinned)} and still predicts " \
            f"{', '.join(f'{r.layout} {r.rel_err:+.0%}' for r in miss)}"
        notes.append(stops + (": the machine measured faster than the model can be; a run that read less than the "
                              "workload `moment plan` assumes, or times not in seconds per epoch, is the usual cause"
                              if side == "fast" else
                              ": the machine measured slower than the calibration's bounds allow, so plans with it "
                              "are still faster than measured; a busy or throttled device, a directory not on the SSD, "
                              "an SSD of another model than the rated one (--ssd-model names it), or time besides the "
                              "reads (overhead_s fits it) is the usual cause"))
    return notes


def measured_directly(model: Model) -> list[str]:
    """The parameters a measurement gives directly: ssd_read from a device's read rate, a link class from a
    link's rate (the rate over its book or rated figure, exact from one measurement)."""
    got = {"ssd_read"} if any(m.read_gbps is not None for m in model.ms) else set()
    got |= {model._link_book(m.link or "")[1] for m in model.ms if m.gbps is not None}
    return [n for n in PARAMS if n in got]


def identifiable(model: Model, names: list[str]) -> list[str]:
    """Those of `names` that change some prediction somewhere on the fit's starting grid (an overhead: any
    epoch): a parameter no measurement depends on would be set arbitrarily (the grid's first level, its slow
    bound), and then slow every plan the calibration is applied to."""
    eff = [n for n in names if n != "overhead_s"]
    out = set()
    if "overhead_s" in names and any(m.epoch_s is not None for m in model.ms):
        out.add("overhead_s")
    if eff:
        preds = np.array([pred for _, pred in _grid(model, names, defaults())])  # the fit's own grid, cached
        preds = preds.reshape((GRID_LEVELS,) * len(eff) + (len(model.ms),))
        scale = max(1.0, float(np.abs(preds).max()))
        out |= {n for j, n in enumerate(eff) if float(np.ptp(preds, axis=j).max()) > 1e-9 * scale}
    return [n for n in names if n in out]


def default_fit(model: Model) -> tuple[list[str], list[str]]:
    """What `calibrate` fits without --fit: DEFAULT_FIT's parameters the measurements depend on, and those a
    device's or link's rate measures directly; and DEFAULT_FIT's left out (no measurement depends on them)."""
    fits = identifiable(model, list(DEFAULT_FIT))
    fits += [n for n in measured_directly(model) if n not in fits]
    return sorted(fits, key=list(PARAMS).index), [n for n in DEFAULT_FIT if n not in fits]


def calibrate(topo: Topology, inventory: Inventory, mfile: MeasurementFile, names: list[str] | None = None, *,
              workload: WorkloadSpec | None = None, loo: bool = True, source: str | None = None) -> Calibration:
    """Fit `names` (None: `default_fit`) to the measurements; `source` (the measurement file) is named when they
    are far faster than the model can be, or when a named parameter changes none of them (refused), and the
    calibration's notes say when the fit rests on a bound or a default parameter was left out."""
    names = None if names is None else check_fit_names(names)
    ms = mfile.measurements
    model = Model(topo, inventory, ms, workload, mfile.data)
    _check_reachable(model, source)
    distinct = _distinct(model)
    notes = []
    if names is None:
        names, left = default_fit(model)
        if left:
            notes.append(f"{', '.join(left)} not fitted (kept at the book rate): no measurement depends on "
                         f"{'it' if len(left) == 1 else 'them'}")
        if not names:
            raise MomentError(f"no measurement depends on the parameters fitted by default ({', '.join(DEFAULT_FIT)})",
                              source=source, hint="name the parameters to fit with --fit")
    else:
        idle = [n for n in names if n not in identifiable(model, names)]
        if idle:
            direct = measured_directly(model)
            raise MomentError(f"--fit {','.join(names)}: no measurement depends on {', '.join(idle)}, so a fit would "
                              f"set {'it' if len(idle) == 1 else 'them'} arbitrarily (at a bound) and every plan "
                              "calibrated with it would inherit that", source=source,
                              hint="leave them out of --fit" + (f" (these measurements measure {', '.join(direct)} "
                                                                 "directly)" if direct else "")
                              + ", or measure layouts whose epochs they change")
    direct = measured_directly(model)
    indirect = [n for n in names if n not in direct]
    epochs = sum(1 for g in distinct if model.ms[g[0]].epoch_s is not None)
    if indirect and epochs <= len(indirect):
        raise MomentError(f"{epochs} distinct epoch measurements cannot test a fit of {len(indirect)} parameters "
                          f"({', '.join(indirect)}): it would match them exactly whatever the parameters mean",
                          source=source,
                          hint="measure more layouts (one more than the parameters at least) or fit fewer "
                               "parameters with --fit (a device's or link's rate fits only its own parameter, "
                               "ssd_read or that link's class)")
    full = fit(model, names)
    meas = np.array([m.value for m in ms])
    residuals = [Residual(layout=m.label, unit=m.unit, measured_s=float(meas[i]),
                          predicted_s=float(full.predicted[i]), rel_err=float(full.predicted[i] / meas[i] - 1.0))
                 for i, m in enumerate(ms)]
    loo_max = None
    if loo and len(ms) > 1:
        errs = []
        for i in range(len(ms)):
            keep = np.ones(len(ms), dtype=bool)
            keep[i] = False
            r = fit(model, names, keep)
            residuals[i].loo_predicted = float(r.predicted[i])
            residuals[i].loo_rel_err = float(r.predicted[i] / meas[i] - 1.0)
            errs.append(abs(residuals[i].loo_rel_err))
        loo_max = float(max(errs))
    return Calibration(fitted_on=topo.name, inventory=inventory.describe(),
                       params={k: round(v, 6) for k, v in full.params.items()}, fitted=names,
                       meaning={k: PARAMS[k].meaning for k in PARAMS}, residuals=residuals,
                       loo_max_rel_err=loo_max,
                       notes=notes + _slow_notes(model) + _bound_notes(full, names, ms, residuals))


def _distinct(model: Model) -> list[list[int]]:
    """The measurements grouped by what they measure: a layout (placements alike by symmetry are one
    layout, and the data placement counts), a device's read rate or a link's rate. A measurement
    listed twice adds nothing a fit can use, so more than one in a group is refused, naming them."""
    from moment.planner.search import canonical_keys

    idx = [i for i, pl in enumerate(model.placements) if pl is not None]
    keys = dict(zip(idx, canonical_keys(model.bare, [model.placements[i] for i in idx])))
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(model.ms):
        what = (("epoch", keys[i], model.even[i]) if i in keys
                else ("read", m.device) if m.read_gbps is not None else ("link", m.link))
        groups.setdefault(what, []).append(i)
    for what, members in groups.items():
        if len(members) > 1:
            labels = ", ".join(f"#{i + 1} ({model.ms[i].label})" for i in members)
            same = {"epoch": "layout", "read": "device's read rate", "link": "link's rate"}[what[0]]
            raise MomentError(f"measurements {labels} measure the same {same}",
                              hint="give each layout, device or link once (the mean of repeated runs)")
    return list(groups.values())


def calibrated_epoch(read_s: float, cal: Calibration | None) -> float:
    """A predicted epoch: the read time plus the calibration's per-epoch overhead."""
    return read_s + (cal.params.get("overhead_s", 0.0) if cal else 0.0)

