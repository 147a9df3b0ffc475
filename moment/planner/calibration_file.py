"""What a calibration file holds (`moment calibrate --out`): the bounded parameters of the model and the
fitted values, as pydantic models with no fitting machinery, so that a request which may carry a calibration
(moment.planner.requests, read by the CLI at start) loads no numpy. The fit is moment.planner.calibration's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator


@dataclass(frozen=True)
class Param:
    default: float
    lo: float
    hi: float
    unit: str
    meaning: str


PARAMS: dict[str, Param] = {
    "switch_uplink": Param(1.0, 0.2, 1.0, "x book rate",
                           "rate reached through a PCIe switch's upstream port (peer-to-peer between the "
                           "switch and the rest of the tree), as a share of the link's book rate"),
    "switch_port": Param(1.0, 0.2, 1.0, "x book rate",
                         "rate reached on a switch's downstream slot links (peer-to-peer inside a switch)"),
    "rc_port": Param(1.0, 0.2, 1.0, "x book rate",
                     "rate reached on a root complex's slot links (traffic the root complex forwards)"),
    "socket_link": Param(1.0, 0.1, 1.0, "x book rate",
                         "rate of PCIe traffic across the socket link (UPI/QPI), as a share of the profile's figure"),
    "ssd_read": Param(1.0, 0.3, 1.0, "x rated", "effective read rate of every SSD as a share of its rated rate"),
    "overhead_s": Param(0.0, 0.0, 120.0, "s",
                        "per-epoch time not hidden behind reads (compute, sampling, start-up) added to the read time"),
}
# What the paper's layouts can tell apart: every layout on a machine is limited by one link, so an overhead
# fitted with them is indistinguishable from a slower switch uplink (A's own fit puts it at 0 s; B's puts
# 5 s on a book-rate switch and misses its planned layout by a third in leave-one-out).
DEFAULT_FIT = ("switch_uplink", "socket_link")
EFFICIENCY = [k for k, p in PARAMS.items() if p.unit != "s"]
#: the parameters that scale links by class (a fit of them carries to another machine by class only)
LINK_CLASSES = ("switch_uplink", "switch_port", "rc_port", "socket_link")
#: `fitted_on` of a calibration fitted on SSD read rates that name no machine (`moment probe --out` without --profile)
UNNAMED_MACHINE = "an unnamed machine (SSD read rates)"


def defaults() -> dict[str, float]:
    return {k: p.default for k, p in PARAMS.items()}


class Residual(BaseModel):
    layout: str = Field(description="what was measured (layout name, slots, device or link)")
    unit: str | None = Field(None, description=(
        "the unit of measured_s, predicted_s and loo_predicted: 's' for an epoch, 'GB/s' for a device's or link's "
        "rate (null in a file written before it was said; the fields keep their names for those files)"))
    measured_s: float = Field(description="the measured figure, in `unit` (seconds for epochs, GB/s for rates)")
    predicted_s: float = Field(description="the calibrated model's figure, in `unit`")
    rel_err: float
    loo_predicted: float | None = Field(None, description="predicted by a fit without this measurement")
    loo_rel_err: float | None = None


class Calibration(BaseModel):
    """A calibration file (`moment calibrate --out`)."""

    model_config = ConfigDict(extra="forbid")

    format: str = "moment-calibration"
    fitted_on: str = Field(description="the profile the measurements came from")
    inventory: str = ""
    params: dict[str, float]
    fitted: list[str] = Field(description="parameters fitted; the others kept their defaults")
    meaning: dict[str, str] = Field(default_factory=dict)
    residuals: list[Residual] = Field(default_factory=list)
    loo_max_rel_err: float | None = None
    notes: list[str] = Field(default_factory=list, exclude=True, description=(
        "what the fit could not do (said by `moment calibrate`, not written to the file)"))

    @model_validator(mode="after")
    def _known(self) -> Calibration:
        for k, v in self.params.items():
            if k not in PARAMS:
                raise ValueError(f"unknown parameter {k!r} (known: {', '.join(PARAMS)})")
            if not PARAMS[k].lo <= v <= PARAMS[k].hi:
                raise ValueError(f"{k} = {v} is outside its bounds [{PARAMS[k].lo}, {PARAMS[k].hi}]")
        return self
