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

Work ahead (`ahead`): a sequence that knows what comes after the next one (a train epoch's end: the next train
epoch follows the validation pass) leaves a job for the sampler, run by whichever sequence gives it back next,
on its own thread, between its last batch and its end. Why: each train epoch began with the disk idle while
its first batch was sampled (6-7 ms of a 0.37 s epoch on the bench's 8M data-only run, both ranks at once,
then the second batch's sampling holding the GIL while the first's reads were planned: 12-13 ms with no read
in flight), and the validation pass's last batches are still being read when its sampler is done. The job
uses the one sampler the budget charges, never a second one.
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
        self._ahead: tuple[tuple, Callable[[Any], None]] | None = None  # ((id(graph), fanouts), job)
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
        """Keep `sampler` (between its batches, never mid-batch) for the next sequence, after the job left by
        `ahead` for a sampler of its kind, if any (run here, on the giver's thread; one that raises drops the
        sampler, as a failed batch does)."""
        key = self._key(graph, fanouts)
        with self._lock:
            job = None
            if self._ahead is not None and self._ahead[0] == key:
                job, self._ahead = self._ahead[1], None
        if job is not None:
            try:
                job(sampler)
            except Exception:  # noqa: BLE001 - work ahead only: the sequence it was for samples its batches itself
                return
        with self._lock:
            self._idle = (key, sampler)

    def ahead(self, graph: Any, fanouts: Sequence[int], job: Callable[[Any], None]) -> None:
        """Leave `job(sampler)` for the next `give` of a sampler for (graph, fanouts), in place of any left before."""
        with self._lock:
            self._ahead = (self._key(graph, fanouts), job)

    def drop(self, job: Callable[[Any], None]) -> None:
        """Take back `job` if no sampler ran it yet (the sequence it was for started without it)."""
        with self._lock:
            if self._ahead is not None and self._ahead[1] is job:
                self._ahead = None
