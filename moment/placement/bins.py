"""Bins: the storage nodes DDAK fills (each GPU's cache, each socket's CPU cache, each SSD).

A bin's `target_share` is the planner's share of all feature accesses that storage node should serve
(`Plan.predicted.storage_shares`); its capacity is in rows (node embeddings), because the placement
works on nodes. `Bin.from_bytes` converts a byte budget using the on-disk row stride.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from moment.errors import MomentError

Kind = Literal["gpu", "cpu", "ssd"]

#: Storage hierarchy: lower tier is filled with hotter nodes first (paper 3.3: GPU > CPU > SSD).
TIER: dict[str, int] = {"gpu": 0, "cpu": 1, "ssd": 2}


class Bin(BaseModel):
    """One storage node of the plan."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="storage node id from the plan, e.g. 'gpu0', 'cpu-socket0', 'ssd3'")
    kind: Kind
    capacity_rows: int = Field(ge=0, description="node embeddings the bin may hold")
    target_share: float = Field(ge=0, description="planner's share of all accesses this bin should serve")
    socket: str | None = Field(None, description="CPU socket the device hangs under (cross-socket traffic)")
    path: str | None = Field(
        None, description="SSD mount path where its shard is written; None = inside the layout directory"
    )
    device: str | None = Field(None, description="the plan's GPU or SSD this bin lives on, e.g. 'gpu1', 'ssd3'")
    slot: str | None = Field(None, description="the slot the plan put that device in (None: built in, or unplanned)")
    pci: str | None = Field(None, description="the device's PCI bus address where the topology has it; "
                                              "ranks find their GPU by it")

    @property
    def tier(self) -> int:
        return TIER[self.kind]

    @property
    def is_cache(self) -> bool:
        return self.kind != "ssd"

    @classmethod
    def from_bytes(cls, *, capacity_bytes: int, row_stride: int, **kw: object) -> Bin:
        """A bin whose capacity is a byte budget (cache size, SSD size) at `row_stride` bytes a row."""
        if row_stride <= 0:
            raise MomentError(f"row stride must be positive, got {row_stride}")
        return cls(capacity_rows=int(capacity_bytes) // int(row_stride), **kw)  # type: ignore[arg-type]


class BinSet(BaseModel):
    """The ordered bins of one placement. Bin order is the stable tie-break everywhere."""

    model_config = ConfigDict(extra="forbid")

    bins: list[Bin]

    @model_validator(mode="after")
    def _check(self) -> BinSet:
        if not self.bins:
            raise ValueError("a bin set needs at least one bin")
        names = [b.name for b in self.bins]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate bin names: {dup}")
        if len(self.bins) > 32767:
            raise ValueError("too many bins for an int16 assignment")
        return self

    def __len__(self) -> int:
        return len(self.bins)

    def __iter__(self):  # type: ignore[override]
        return iter(self.bins)

    def __getitem__(self, i: int) -> Bin:
        return self.bins[i]

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.bins]

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise MomentError(f"no bin named {name!r}; bins are {self.names}") from None

    def of_kind(self, kind: Kind) -> list[int]:
        return [i for i, b in enumerate(self.bins) if b.kind == kind]

    def target_shares(self) -> list[float]:
        """Targets normalised to sum to 1 (the planner's shares may carry rounding)."""
        s = sum(b.target_share for b in self.bins)
        return [b.target_share / s if s > 0 else 0.0 for b in self.bins]

    @classmethod
    def uniform(
        cls,
        *,
        gpus: int,
        cpus: int,
        ssds: int,
        gpu_rows: int,
        cpu_rows: int,
        ssd_rows: int,
        gpu_share: float,
        cpu_share: float,
        sockets: int = 2,
        ssd_paths: list[str] | None = None,
    ) -> BinSet:
        """A symmetric machine: devices spread evenly over sockets, each tier's share split evenly.

        Handy for tests, benchmarks and `moment place` without a plan.
        """
        if ssd_paths is not None and len(ssd_paths) != ssds:
            raise MomentError(f"{len(ssd_paths)} SSD paths given for {ssds} SSDs")
        ssd_share = 1.0 - gpu_share - cpu_share
        if ssd_share < 0:
            raise MomentError("gpu_share + cpu_share must not exceed 1")

        def sock(i: int, n: int) -> str:
            return f"socket{(i * sockets) // max(n, 1)}"

        out = [
            Bin(name=f"gpu{i}", kind="gpu", capacity_rows=gpu_rows, target_share=gpu_share / gpus,
                socket=sock(i, gpus))
            for i in range(gpus)
        ]
        out += [
            Bin(name=f"cpu{i}", kind="cpu", capacity_rows=cpu_rows, target_share=cpu_share / cpus,
                socket=sock(i, cpus))
            for i in range(cpus)
        ]
        out += [
            Bin(name=f"ssd{i}", kind="ssd", capacity_rows=ssd_rows, target_share=ssd_share / ssds,
                socket=sock(i, ssds), path=ssd_paths[i] if ssd_paths else None)
            for i in range(ssds)
        ]
        return cls(bins=out)
