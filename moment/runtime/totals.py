"""What every rank counts in a run and the metrics sum over the ranks, in one all-reduce.

Why a dataclass: the sum travels as one flat vector (one collective, not one per number), and reading such a
vector back by position breaks silently when a counter is added. Here the vector is made and read by the same
walk over the named fields (a dict field in its sorted keys, the same on every rank), so a field is a name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from moment.io.merge import SIZE_BUCKETS
from moment.runtime.pipeline import StageTimes


@dataclass
class Totals:
    """One rank's counts (or, from `summed`, the run's)."""

    seeds: float
    ssd_bytes: float
    ssd_requests: float
    packed_rows: float
    segment_batches: float  # batches read as their pack segment, whole (DiskTier._issue_segments, take_whole)
    whole_batches: float  # of those, read straight into the batch's own buffer (DiskTier.take_whole)
    pack_left_out_rows: float  # rows the pack took as cached that this run's caches do not hold: read from the layout
    direct_rows: float  # SSD rows read straight into their destination, not staged and copied
    tier_bytes: dict[str, float]  # by tier name: every rank has the same tiers
    train_tier_bytes: dict[str, float]  # the same, in the train epochs alone (the feed rate's bytes)
    tier_rows: dict[str, float]
    stage_seconds: dict[str, float]  # StageTimes' fields, `wall` among them
    request_sizes: dict[str, float]  # "n07"/"b07": SSD reads and their bytes of [2**7, 2**8) bytes (merge.SIZE_BUCKETS)

    @classmethod
    def of(cls, seeds: int, tiers: dict[str, Any], stages: StageTimes, train_bytes: dict[str, int]) -> Totals:
        """From a rank's seeds trained, its store's `tier_stats()`, its training loop's stage times and what each
        tier served in the train epochs (`Run.train_tier_bytes`)."""
        sizes = tiers.get("ssd_request_sizes")
        sizes = np.zeros((2, SIZE_BUCKETS)) if sizes is None else np.asarray(sizes)
        return cls(seeds=seeds, ssd_bytes=tiers["ssd_bytes_read"], ssd_requests=tiers["ssd_requests"],
                   packed_rows=tiers.get("packed_rows", 0),
                   segment_batches=tiers.get("segment_batches", 0), whole_batches=tiers.get("whole_batches", 0),
                   pack_left_out_rows=tiers.get("pack_left_out_rows", 0), direct_rows=tiers.get("direct_rows", 0),
                   tier_bytes=dict(tiers["bytes"]), train_tier_bytes={n: train_bytes.get(n, 0) for n in tiers["bytes"]},
                   tier_rows=dict(tiers["rows"]), stage_seconds=stages.as_dict(),
                   request_sizes={f"{kind}{k:02d}": float(sizes[i, k]) for i, kind in enumerate("nb")
                                  for k in range(SIZE_BUCKETS)})

    def ssd_request_sizes(self) -> list[dict[str, int]]:
        """The SSD reads by power-of-two size: from_bytes (2**k), requests, bytes; sizes never read left out."""
        return [{"from_bytes": 2**k, "requests": int(self.request_sizes[f"n{k:02d}"]),
                 "bytes": int(self.request_sizes[f"b{k:02d}"])}
                for k in range(SIZE_BUCKETS) if self.request_sizes[f"n{k:02d}"]]

    def _values(self) -> Iterator[float]:
        for f in fields(self):
            v = getattr(self, f.name)
            yield from (v[k] for k in sorted(v)) if isinstance(v, dict) else (v,)

    def _read(self, values: list[float]) -> Totals:
        it = iter(values)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = {k: next(it) for k in sorted(v)} if isinstance(v, dict) else next(it)
        return Totals(**out)

    def summed(self, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> Totals:
        """Collective: the sum over the ranks (every rank calls it at the same point)."""
        return self._read(all_reduce(torch.tensor(list(self._values()), dtype=torch.float64)).tolist())

    def mean_stages(self, ranks: int) -> StageTimes:
        """Each stage's seconds per rank, from the run's sum."""
        return StageTimes(**{k: v / ranks for k, v in self.stage_seconds.items()})
