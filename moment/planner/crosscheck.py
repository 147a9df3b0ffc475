"""Carrying a calibration to another machine: does it rank that machine's measured layouts as measured?

A calibration's parameters name link classes, so one fitted on machine A applies to machine B; what
it should get right there is what a user decides with: which layout is faster, and by how much
relative to the fastest. Two tests of that, on every layout of the other machine's measurement file
(each predicted under the data placement it was measured with):

- order: every pair whose measured times differ by more than `RANK_MARGIN` is predicted in the same
  order (closer pairs are within the noise of a measured epoch and may go either way);
- ratio: each layout's time over the machine's fastest, predicted vs measured, within `RATIO_TOLERANCE`
  (ratios, not seconds: what carries over is a layout's place among that machine's layouts, not the
  machine's absolute speed, which its CPUs and clocks also set).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moment.errors import MomentError
from moment.planner.calibration import DEFAULT_FIT, Calibration, MeasurementFile, Model
from moment.topology.devices import Inventory
from moment.topology.model import Topology
from moment.workload.spec import WorkloadSpec

#: pairs whose measured times differ by more than this (relative to the faster) must keep their order
RANK_MARGIN = 0.10
#: most relative error of a layout's time over the fastest's, predicted against measured
RATIO_TOLERANCE = 0.25
#: the paper's two machines are checked with the fit `moment calibrate` makes by default
CROSS_FIT = DEFAULT_FIT


@dataclass
class Row:
    layout: str
    data: str
    measured_s: float
    predicted_s: float
    measured_ratio: float
    predicted_ratio: float

    @property
    def ratio_err(self) -> float:
        return self.predicted_ratio / self.measured_ratio - 1.0


@dataclass
class CrossCheck:
    fitted_on: str
    applied_to: str
    rows: list[Row]
    misranked: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ratio_misses(self) -> list[Row]:
        return [r for r in self.rows if abs(r.ratio_err) > RATIO_TOLERANCE]

    @property
    def ok(self) -> bool:
        return not self.misranked and not self.ratio_misses


def cross_check(cal: Calibration, topo: Topology, inventory: Inventory, mfile: MeasurementFile,
                workload: WorkloadSpec | None = None) -> CrossCheck:
    """`cal` applied to `topo`, whose epoch measurements are `mfile`'s (device and link rates are
    not layouts, and are left out)."""
    ms = [m for m in mfile.measurements if m.epoch_s is not None]
    if not ms:
        raise MomentError(f"the measurements of {topo.name} hold no layout's epoch time to rank",
                          hint="measure epochs (layout and epoch_s), not only device or link rates")
    model = Model(topo, inventory, ms, workload, mfile.data)
    pred = model.predict(cal.params)
    meas = np.array([m.value for m in ms])
    rows = [Row(m.label, "even" if ev else "planned", float(y), float(p), float(y / meas.min()), float(p / pred.min()))
            for m, ev, y, p in zip(ms, model.even, meas, pred)]
    misranked = []
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            a, b = rows[i], rows[j]
            apart = max(a.measured_s, b.measured_s) / min(a.measured_s, b.measured_s) - 1.0
            if apart > RANK_MARGIN and (a.measured_s < b.measured_s) != (a.predicted_s < b.predicted_s):
                misranked.append((a.layout, b.layout))
    return CrossCheck(cal.fitted_on, topo.name, rows, misranked)
