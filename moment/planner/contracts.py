"""The planner's output contract (what `moment plan --json` prints and scripts rely on)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from moment.workload.spec import WorkloadSpec

#: how the rows are spread over the SSDs: 'planned' in the shares the LP chooses (what `moment place`
#: with DDAK realises), 'even' in equal shares (hash or round-robin placement)
DATA_PLACEMENTS = ("planned", "even")
DataPlacement = Literal["planned", "even"]
_EVEN_HELP = ("the realisable LP with the data spread evenly over the SSDs (hash or round-robin placement: "
              "equal SSD shares); `predicted` lets the LP choose the shares (DDAK)")
#: what a GPU's inlet bandwidth counts (the plan's table says it under the figures; docs/planning.md)
INLET_HELP = ("per-GPU inlet bandwidth: the feature bytes a GPU receives per second over the epoch, from every "
              "source, its own GPU cache's hits included, so it can exceed the capacity of the GPU's link")


class LinkUse(BaseModel):
    """Load on one direction of one physical link at the predicted steady state."""

    id: str = Field(description="stable id, e.g. 'sw0->sw1' (direction of the data)")
    src: str
    dst: str
    kind: str = Field(description="pcie, upi, qpi, nvlink, xgmi, memory, hbm, ssd, internal")
    label: str | None = None
    capacity_gbps: float
    load_gbps: float
    utilisation: float = Field(description="load / capacity, 0..1")
    bottleneck: bool = False


class Prediction(BaseModel):
    solver: str = Field(description="'lp' (realisable, default) or 'maxflow-<backend>' (the paper's)")
    gpus: list[str] = Field(description="GPU ids, in the order of per_gpu_inlet_gbps")
    per_gpu_inlet_gbps: list[float] = Field(description=INLET_HELP)
    aggregate_gbps: float
    epoch_read_s: float = Field(description="time for every GPU to receive its epoch's bytes")
    imbalance: float = Field(0.0, description="max/min per-GPU inlet bandwidth - 1")
    storage_shares: dict[str, float] = Field(
        default_factory=dict, description="share of all accesses served by each storage node"
    )


class _Under:
    """`under(data)` for a model with `predicted` and `predicted_even`."""

    def under(self, data: str) -> Prediction:
        """The prediction under the data placement `data` ('planned' or 'even')."""
        if data == "even":
            if self.predicted_even is None:  # type: ignore[attr-defined]
                raise ValueError("no prediction with the data spread evenly was made")
            return self.predicted_even  # type: ignore[attr-defined]
        return self.predicted  # type: ignore[attr-defined]


class Evaluation(BaseModel, _Under):
    placement: dict[str, str] = Field(description="slot id -> device model")
    devices: dict[str, str] = Field(default_factory=dict, description="slot id -> device id (gpu0, ssd3, ...)")
    predicted: Prediction
    predicted_even: Prediction | None = Field(None, description=_EVEN_HELP)
    predicted_maxflow: Prediction | None = None
    links: list[LinkUse] = Field(default_factory=list)


class Baseline(BaseModel, _Under):
    name: str
    description: str = ""
    placement: dict[str, str]
    predicted: Prediction
    predicted_even: Prediction | None = Field(None, description=_EVEN_HELP)
    predicted_maxflow: Prediction | None = None
    bottlenecks: list[str] = Field(default_factory=list, description="ids of its saturated links (LP)")


class Limit(BaseModel):
    """One saturated link or device of a layout, and whom it holds back."""

    link: str = Field(description="link id as in `links` (e.g. 'sw0->sw1', 'ssd3:read'); a group's first")
    kind: str
    count: int = Field(1, description="links or devices of this kind grouped here (e.g. 8 SSD reads)")
    capacity_gbps: float = Field(description="capacity of one of them")
    gpus: list[str] = Field(default_factory=list, description="GPUs whose reads cross it (slot, or id)")
    gpu_gbps: float | None = Field(None, description="the least those GPUs receive in this layout")
    recommended_utilisation: float | None = Field(
        None, description="the same link in the recommended layout (None: carries no reads there)")
    text: str


class Explanation(BaseModel):
    """Why a layout is as fast as it is, and for a usual layout, why the recommended one beats it."""

    layout: str = Field(description="'recommended' or a baseline's name")
    epoch_read_s: float
    slower_by: float = Field(description="its epoch time / the recommended one's (1.0 = as fast)")
    limits: list[Limit] = Field(
        default_factory=list,
        description="for the recommended layout everything saturated; for a baseline what saturates there "
                    "and not in the recommended layout (else all it has saturated)")
    text: str


class SearchStats(BaseModel):
    method: str = Field("exhaustive", description=(
        "'exhaustive': every placement listed once per symmetry class, then solved in lower-bound order; "
        "'branch-and-bound': too many classes to list (a large machine of mixed slots), so devices are placed "
        "one at a time and each partial placement is bounded by the LP of a relaxation; 'first-placements': the "
        "time limit stopped the listing where no branch and bound could take over (NVLink bridges on slots), so "
        "the fastest of the greedy placements and the usual layouts, with no bound"))
    raw_candidates: int | None = Field(description=(
        "placements before symmetry pruning (physically valid); null: the time limit stopped their count"))
    distinct_candidates: int | None = Field(
        description="placements left after slot-symmetry pruning (null: not listed, branch and bound)")
    capacity_classes: int | None = Field(
        None, description="distinct capacity graphs among them (one LP each at most)")
    nodes: int | None = Field(None, description="partial placements bounded (branch and bound)")
    solved: int = Field(description="LPs solved; the other classes were ruled out by a lower bound")
    proven_optimal: bool = Field(True, description=(
        "false when the time limit stopped the search: the recommendation is the best placement found"))
    lower_bound_s: float | None = Field(None, description=(
        "when not proven optimal: no placement reads an epoch faster than this (null: no bound is known)"))
    seconds_total: float
    seconds_per_solve: float


class Plan(BaseModel, _Under):
    machine: str
    inventory: str
    workload: WorkloadSpec
    data: DataPlacement = Field("planned", description=(
        "the data placement the recommendation is chosen for, which sets its links, bottlenecks, gain and "
        "explanation: 'planned' (the LP's shares, `predicted`) or 'even' (equal SSD shares, `predicted_even`)"))
    placement: dict[str, str]
    devices: dict[str, str] = Field(default_factory=dict)
    predicted: Prediction
    predicted_even: Prediction | None = Field(None, description=_EVEN_HELP)
    predicted_maxflow: Prediction | None = None
    links: list[LinkUse]
    bottlenecks: list[str] = Field(default_factory=list, description="ids of saturated links")
    search: SearchStats
    baselines: list[Baseline] = Field(default_factory=list)
    gain_vs_best_baseline: float | None = Field(
        None, description="best baseline epoch time / recommended epoch time, both under `data`"
    )
    overrides: list[str] = Field(default_factory=list, description="--set what-if overrides applied to the profile")
    explanation: list[Explanation] = Field(
        default_factory=list, description="the recommended layout's limits, then why it beats each baseline")
    notes: list[str] = Field(default_factory=list, description=(
        "what the comparison left out: each of the profile's layouts that cannot hold this inventory, and why"))
