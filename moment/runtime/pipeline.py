"""Per-rank pipeline: sample batch i+2 | look up and submit reads of i+1, complete i | train i-1.

Why threads (Moment §3.1, Hyperion Fig. 6): the stages use different resources (sampling: CPU; reads:
the SSDs through the rank's I/O stack, which waits without the GIL; training: the GPU, or torch's
GIL-free kernels on CPU), so overlapping them makes the slowest stage set the pace. Bounded queues
between the stages keep memory flat. On CUDA the gather thread copies to the device on its own stream
and the trainer waits on an event (`Prepared.wait`, through moment.io.device), so copies overlap kernels
too; on CPU the same calls are no-ops.

Determinism: batches come out in the order given, and batch i is sampled with a generator seeded
from (key, i) — never from a shared stream — so thread timing cannot change any result.
`StageTimes` says where the time goes: seconds spent in each stage (busy, not blocked on a queue).
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch

from moment.io.device import DeviceLayer
from moment.runtime.sources import FeatureSource
from moment.workload.sampler import CSRGraph, MiniBatch, NeighborSampler
from moment.workload.seeds import mix

_DONE = object()


@dataclass
class StageTimes:
    sample: float = 0.0
    gather_submit: float = 0.0
    gather_wait: float = 0.0
    train: float = 0.0
    wall: float = 0.0

    def add(self, other: StageTimes) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def limiting(self) -> str:
        """The busiest stage: the one that sets the pace at steady state."""
        d = self.as_dict()
        d.pop("wall")
        d["gather"] = d.pop("gather_submit") + d.pop("gather_wait")
        return max(d, key=d.__getitem__)


@dataclass
class Prepared:
    index: int
    batch: MiniBatch
    x: torch.Tensor
    y: torch.Tensor
    blocks: list
    ready: object | None = None  # CUDA event the consumer waits on
    dev: DeviceLayer | None = None

    def wait(self) -> None:
        """Call before using the batch, on the stream that uses it: it waits for the batch's copies and
        records that stream on its tensors (they were made on the pipeline's stream; without the record
        the allocator could give their memory to the next batch while this one's kernels still read it)."""
        if self.dev is not None:
            self.dev.consume(self.ready, self.x, self.y, *(b.edge_index for b in self.blocks))


class Pipeline:
    """Turns seed batches into `Prepared` batches (features and labels on `device`).

    `run(batches, key)` yields batch i for i = start, start + 1, ... in order; the caller's time
    between items is counted as `train`.
    """

    @staticmethod
    def held_batches(depth: int) -> int:
        """Batches a pipeline of this `depth` holds besides those its source has submitted (`lookahead`):
        the queued ones, one being assembled and one being trained (the memory budget charges this)."""
        return max(1, depth) + 2

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int], source: FeatureSource, labels: torch.Tensor,
                 device: torch.device, *, depth: int = 2, pipelined: bool = True):
        self.graph, self.fanouts, self.source = graph, list(fanouts), source
        self.labels, self.device = labels, torch.device(device)
        self.depth, self.pipelined = max(1, depth), pipelined
        self.times = StageTimes()
        self.dev = DeviceLayer(self.device)
        self._stream = self.dev.new_stream()

    def run(self, batches: Sequence[torch.Tensor], key: Sequence[int], start: int = 0) -> Iterator[Prepared]:
        t0 = time.perf_counter()
        it = self._threaded(batches, key, start) if self.pipelined else self._serial(batches, key, start)
        last = time.perf_counter()
        try:
            for item in it:
                now = time.perf_counter()
                yield item
                last = time.perf_counter()
                self.times.train += last - now
        finally:
            if hasattr(it, "close"):
                it.close()
            self.times.wall += time.perf_counter() - t0

    # -- stages

    def _sample(self, sampler: NeighborSampler, seeds: torch.Tensor, key: Sequence[int], i: int) -> MiniBatch:
        t = time.perf_counter()
        sampler.generator.manual_seed(mix(*key, i))
        mb = sampler.sample(seeds)
        self.times.sample += time.perf_counter() - t
        return mb

    def _submit(self, mb: MiniBatch, tag: tuple):
        t = time.perf_counter()
        p = self.source.submit(mb.n_id, tag=tag)
        self.times.gather_submit += time.perf_counter() - t
        return p

    def _complete(self, i: int, mb: MiniBatch, pending) -> Prepared:
        t = time.perf_counter()
        with self.dev.on(self._stream):
            x, y, blocks = self._assemble(mb, pending)
            ev = self.dev.event(self._stream)
        self.times.gather_wait += time.perf_counter() - t
        return Prepared(i, mb, x, y, blocks, ev, self.dev)

    def _assemble(self, mb: MiniBatch, pending):
        to = self.dev.to_device
        x = to(self.source.complete(pending))
        y = to(self.labels[mb.seeds].to(torch.int64))
        blocks = [type(b)(to(b.edge_index), b.num_src, b.num_dst) for b in mb.blocks()]
        return x, y, blocks

    def _finish(self) -> None:
        """Every batch is completed: the source takes part in the other ranks' last exchanges (a
        collective source is keyed to each rank's batch sequence, whatever its length)."""
        t = time.perf_counter()
        with self.dev.on(self._stream):
            self.source.finish()
        self.times.gather_wait += time.perf_counter() - t

    def _drain(self, pending) -> None:
        """The consumer stopped early: finish the reads still in flight so the source is clean for reuse."""
        for item in pending:
            with contextlib.suppress(Exception):  # the consumer is already unwinding with its own error
                self.source.cancel(item[2])

    # -- drivers

    def _serial(self, batches, key, start) -> Iterator[Prepared]:
        sampler = NeighborSampler(self.graph, self.fanouts)
        for i in range(start, len(batches)):
            mb = self._sample(sampler, batches[i], key, i)
            yield self._complete(i, mb, self._submit(mb, (tuple(key), i)))
        self._finish()

    def _threaded(self, batches, key, start) -> Iterator[Prepared]:
        stop = threading.Event()
        q_sampled: queue.Queue = queue.Queue(self.depth)
        q_ready: queue.Queue = queue.Queue(self.depth)

        def put(q: queue.Queue, item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def get(q: queue.Queue):
            while not stop.is_set():
                try:
                    return q.get(timeout=0.1)
                except queue.Empty:
                    continue
            return _DONE

        def sampler_loop() -> None:
            try:
                sampler = NeighborSampler(self.graph, self.fanouts)
                for i in range(start, len(batches)):
                    if not put(q_sampled, (i, self._sample(sampler, batches[i], key, i))):
                        return
                put(q_sampled, _DONE)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                put(q_sampled, e)

        def gather_loop() -> None:
            # reads of later batches go out before earlier ones are completed: up to `lookahead` ahead
            pending: collections.deque = collections.deque()
            item = None
            try:
                ahead = max(1, int(self.source.lookahead))
                while True:
                    item = get(q_sampled)
                    if item is _DONE or isinstance(item, BaseException):
                        break
                    i, mb = item
                    pending.append((i, mb, self._submit(mb, (tuple(key), i))))
                    while len(pending) > ahead:
                        if not put(q_ready, self._complete(*pending.popleft())):
                            break
                    if stop.is_set():
                        break
                if stop.is_set():
                    self._drain(pending)
                    return
                if not isinstance(item, BaseException):
                    while pending:
                        if not put(q_ready, self._complete(*pending.popleft())):
                            self._drain(pending)
                            return
                    self._finish()
                put(q_ready, item)
            except BaseException as e:  # noqa: BLE001 - re-raised by the consumer
                self._drain(pending)
                put(q_ready, e)

        threads = [threading.Thread(target=f, name=f"moment-{f.__name__}", daemon=True)
                   for f in (sampler_loop, gather_loop)]
        for t in threads:
            t.start()
        try:
            while True:
                item = get(q_ready)
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            for t in threads:
                t.join()
