"""Samplers lent to a rank's sequences (epochs, evaluations) and taken back, so that one is made once per run.

Why: a sampler's node map (`moment.workload.sampler._DenseMap`, 4 B per node) was made afresh by every
sequence's sampling thread, and its first batch paid for filling it: on the bench's 16M graph a 64 MB fill,
54 ms for an epoch's first batch against 20 ms for the others (an instrumented run, `bench/epoch.py`'s
16M data-only case), while the rank's reader waited for that batch's reads, at every epoch and evaluation.
A sampler is reseeded per batch from (key, batch), so the one reused draws exactly what a fresh one would.

A sampler is lent to one sequence at a time: one taken while another sequence holds the idle one (a user's
loop that evaluates inside an epoch) is made afresh, as before, and at most one idle sampler is kept (the
memory budget charges one node map). One whose batch raised is dropped, never lent again: its map may hold a
half-sampled batch's entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


class SamplerPool:
    """Makes samplers with `make(graph, fanouts)` and keeps the last one given back for the next `take`."""

    def __init__(self, make: Callable[[Any, list[int]], Any]):
        self.make = make
        self._idle: tuple[tuple, Any] | None = None  # ((id(graph), fanouts), sampler)
        self._lock = threading.Lock()
        self.made = 0

    @staticmethod
    def _key(graph: Any, fanouts: Sequence[int]) -> tuple:
        return id(graph), tuple(int(f) for f in fanouts)  # the pooled sampler holds `graph`: its id stays its own

    def take(self, graph: Any, fanouts: Sequence[int]) -> Any:
        with self._lock:
            idle, self._idle = self._idle, None
        if idle is not None and idle[0] == self._key(graph, fanouts):
            return idle[1]
        self.made += 1
        return self.make(graph, list(fanouts))

    def give(self, graph: Any, fanouts: Sequence[int], sampler: Any) -> None:
        """Keep `sampler` (between its batches, never mid-batch) for the next sequence."""
        with self._lock:
            self._idle = (self._key(graph, fanouts), sampler)
