"""The planner's view of a training job: how many bytes each GPU reads per epoch and where from.

No torch here: planning runs on a laptop. `moment place` replaces the cache shares with measured
hotness (Moment (SC'25), section 3.3: DDAK places by pre-sampled access counts).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from moment.errors import MomentError

PAPER_BATCH = 8000  # the paper's mini-batch size (seeds per GPU)


def default_batch_size(train_nodes: int, world_size: int) -> int:
    """The paper's 8000 seeds per GPU, scaled down so a small graph still gives >= 8 steps per epoch."""
    return min(PAPER_BATCH, max(64, train_nodes // (world_size * 8)))


#: --fanouts left out (and the service's place job's default)
DEFAULT_FANOUTS = (25, 10)

#: what --fanouts means, in every command that takes it: the hop from the seeds comes first
FANOUTS_HELP = "neighbours sampled per hop, the seeds' own hop first (25,10: 25 of each seed, 10 of each of those)"


def split_fanouts(text: str) -> list[int]:
    """--fanouts' spelling, `25,10`, as integers (their range is each caller's); ValueError saying why not. One
    left out between commas (`5,,5`, likely `5,10,5` mistyped) is refused, not dropped: it would change the model's
    depth; a trailing comma is not a fan-out left out."""
    parts = text.replace(" ", "").removesuffix(",").split(",")
    if parts == [""]:
        return []
    if "" in parts:
        raise ValueError("one is empty (between two commas, or before the first)")
    try:
        return [int(x) for x in parts]
    except ValueError:
        raise ValueError("each must be an integer") from None


#: the largest fan-out taken: one above a graph's largest degree samples as that degree does (every
#: neighbour, `moment.runtime.config.effective_fanouts`), and no node has 2**31 neighbours, so a larger one is a mistake
FANOUT_LIMIT = 2**31


def fanouts_refused(fanouts: Sequence[int]) -> str | None:
    """Why `fanouts` are refused (None: they are not): the one rule of every command that takes --fanouts (train,
    place, data pack, cache simulate) and of `open_run`. PyG's -1 (every neighbour) is named: here that is any
    fan-out at or above the graph's largest degree."""
    if any(f < 1 for f in fanouts):
        every = " (for every neighbour, PyG's -1, give the graph's largest degree or more)" if -1 in fanouts else ""
        return f"each must be a positive integer{every}"
    if any(f > FANOUT_LIMIT for f in fanouts):
        return (f"each must be at most {FANOUT_LIMIT} (a fan-out above the graph's largest degree samples "
                "every neighbour)")
    return None


def check_fanouts(fanouts: Sequence[int]) -> None:
    """Refuse `fanouts` (`fanouts_refused`) in one line naming --fanouts as they were given."""
    if not fanouts:
        raise MomentError("--fanouts: give one fan-out per hop, e.g. 25,10")
    if why := fanouts_refused(fanouts):
        raise MomentError(f"--fanouts {','.join(map(str, fanouts))}: {why}")


def parse_fanouts(text: str) -> list[int]:
    """--fanouts' spelling, `25,10`, as the fan-outs (a bad one: one line naming the flag)."""
    try:
        f = split_fanouts(text)
    except ValueError as e:
        raise MomentError(f"--fanouts must be comma-separated integers like 25,10 (got {text!r}: {e})") from None
    check_fanouts(f)
    return f


class WorkloadSpec(BaseModel):
    """Defaults follow the paper's IGB-HOM setting: 269M nodes, 1024-d float32 features, 1% training
    seeds, fan-out 25,10, batch 8000. `unique_ratio` is the share of sampled ids left after de-duplicating
    within a batch (our estimate for a power-law graph of that size; pre-sampling measures it): with it
    an epoch reads ~0.76 TB, which at the paper's ~60 GB/s is its ~13 s epoch on Machine B.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = "igb-hom-graphsage"
    num_nodes: int = Field(default=269_000_000, gt=0)
    feature_dim: int = Field(default=1024, gt=0)
    feature_bytes: int = Field(default=4, gt=0, description="bytes per feature value (4 = float32)")
    train_fraction: float = Field(default=0.01, gt=0, le=1)
    batch_size: int = Field(default=8000, gt=0)
    fanouts: list[int] = Field(default_factory=lambda: [25, 10])
    unique_ratio: float = Field(default=0.25, gt=0, le=1)
    gpu_cache_share: float = Field(default=0.15, ge=0, le=1, description="accesses served by all GPU caches together")
    cpu_cache_share: float = Field(default=0.10, ge=0, le=1, description="accesses served by CPU memory caches")
    bytes_per_gpu_per_epoch: float | None = Field(default=None, gt=0, description="overrides the estimate")

    @model_validator(mode="after")
    def _shares(self) -> WorkloadSpec:
        if self.gpu_cache_share + self.cpu_cache_share > 1:
            raise ValueError(f"the GPU caches' share of the reads ({self.gpu_cache_share:g}) and the CPU memory's "
                             f"({self.cpu_cache_share:g}) add up to more than 1: lower one (the defaults are "
                             f"{type(self).model_fields['gpu_cache_share'].default:g} and "
                             f"{type(self).model_fields['cpu_cache_share'].default:g})")
        if any(f <= 0 for f in self.fanouts):
            raise ValueError("fan-outs must be positive")
        return self

    @property
    def row_bytes(self) -> int:
        return self.feature_dim * self.feature_bytes

    def sampled_per_seed(self) -> float:
        total, layer = 1.0, 1.0
        for f in self.fanouts:
            layer *= f
            total += layer
        return total

    def epoch_bytes(self) -> float:
        """Feature bytes all GPUs together read in one epoch."""
        seeds = self.num_nodes * self.train_fraction
        return seeds * self.sampled_per_seed() * self.unique_ratio * self.row_bytes

    def bytes_per_gpu(self, n_gpus: int) -> float:
        if self.bytes_per_gpu_per_epoch is not None:
            return self.bytes_per_gpu_per_epoch
        return self.epoch_bytes() / max(n_gpus, 1)

    @property
    def ssd_share(self) -> float:
        return 1.0 - self.gpu_cache_share - self.cpu_cache_share
