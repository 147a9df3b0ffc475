"""Per-rank pipeline: sample batch i+2 | look up and submit reads of i+1, complete i | train i-1.

Why threads (Moment §3.1, Hyperion Fig. 6): the stages use different resources (sampling: CPU; reads:
the SSDs through the rank's I/O stack, which waits without the GIL; training: the GPU, or torch's
GIL-free kernels on CPU), so overlapping them makes the slowest stage set the pace. Bounded queues
between the stages keep memory flat. On CUDA the gather thread copies to the device on its own stream
and the trainer waits on an event (`Prepared.wait`, through moment.io.device), so copies overlap kernels
too; on CPU the same calls are no-ops. Every thread is started bound to the rank's device
(moment.runtime.threads).

Collectives from one thread: the rows other ranks serve (the peer and remote tiers' exchange rounds) are
collectives, and a rank issues every collective from its training thread, in the same order on every
rank (NCCL deadlocks when two threads of a rank issue them). So the gather thread completes a batch only
as far as the rank alone can (`complete_local`), and the training thread, before it hands out batch i,
finishes batch i's rounds and starts batch i+1's (`Staged.start`): i+1's last chunk of rows moves while
step i computes, and its collectives come before step i's on every rank (a chain without exchanging tiers
hands batch i out as soon as it is complete: no step waits for the next batch). At the end of a sequence the
training thread serves the other ranks until every one is done (the source's idle rounds), and so it does
when the consumer stops early (it breaks out of the loop): the round started for the next batch is finished
first, so a rank that stops is never a rank the others wait for.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from moment.caching.tiers import SAMPLED_AHEAD, ahead_after
from moment.io.device import DeviceLayer
from moment.runtime.footprint import held_batches
from moment.runtime.lost import LeftRun, PeerLeft
from moment.runtime.sampler_pool import SamplerPool
from moment.runtime.sources import FeatureSource, Staged, in_step
from moment.runtime.threads import start_thread
from moment.workload.sampler import CSRGraph, MiniBatch, NeighborSampler
from moment.workload.seeds import mix

_DONE = object()


@dataclass
class StageTimes:
    sample: float = 0.0
    gather_submit: float = 0.0
    gather_wait: float = 0.0
    train: float = 0.0
    exchange: float = 0.0  # the training thread starting batches' exchange rounds and serving at the end
    exchange_wait: float = 0.0  # the training thread finishing a round started a batch earlier (its rows' wait)
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
        d["exchange"] += d.pop("exchange_wait")
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
    staged: Staged | None = None  # its exchange rounds, run by the training thread before it is handed out
    edge_label_index: torch.Tensor | None = None  # a link batch's label edges and labels, on the device
    edge_label: torch.Tensor | None = None

    def wait(self) -> None:
        """Call before using the batch, on the stream that uses it: it waits for the batch's copies and
        records that stream on its tensors (they were made on the pipeline's stream; without the record
        the allocator could give their memory to the next batch while this one's kernels still read it)."""
        if self.dev is not None:
            links = [t for t in (self.edge_label_index, self.edge_label) if t is not None]
            self.dev.consume(self.ready, self.x, self.y, *(b.edge_index for b in self.blocks), *links)


def seed_labels(labels: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """The seeds' labels as a loss takes them: int64 classes, or a multi-label dataset's float 0/1 targets [B, C]."""
    y = labels[seeds]
    return y.to(torch.float32) if y.dim() == 2 else y.to(torch.int64)


def link_labels(mb: MiniBatch, to: Callable[[torch.Tensor], torch.Tensor]) -> tuple:
    """A link batch's (edge_label_index, edge_label) moved by `to` (the device copy); (None, None) for a node batch."""
    if mb.edge_label_index is None:
        return None, None
    return to(mb.edge_label_index), to(mb.edge_label)


class Pipeline:
    """Turns seed batches into `Prepared` batches (features and labels on `device`).

    `run(batches, key)` yields batch i for i = start, start + 1, ... in order; the caller's time
    between items is counted as `train`.
    """

    @staticmethod
    def held_batches(depth: int) -> int:
        """Batches a pipeline of this `depth` holds besides those its source has submitted
        (`footprint.held_batches`, which the memory budget charges)."""
        return held_batches(depth)

    def __init__(self, graph: CSRGraph, fanouts: Sequence[int], source: FeatureSource, labels: torch.Tensor,
                 device: torch.device, *, depth: int = 2, pipelined: bool = True,
                 sampler: Callable[[CSRGraph, list[int]], Any] | SamplerPool = NeighborSampler):
        """`sampler(graph, fanouts)` makes a sampler: NeighborSampler's node batches, or link prediction's
        (moment.runtime.link_task.sampler_for); a `SamplerPool` lends them (pipelines of one run share one, so
        its sequences reuse one sampler's node map)."""
        self.graph, self.fanouts, self.source = graph, list(fanouts), source
        self.samplers = sampler if isinstance(sampler, SamplerPool) else SamplerPool(sampler)
        self.labels, self.device = labels, torch.device(device)
        self.depth, self.pipelined = max(1, depth), pipelined
        self.times = StageTimes()
        self.dev = DeviceLayer(self.device)
        self._stream = self.dev.new_stream()  # the gather thread's copies and assembly
        self._xstream = self.dev.new_stream()  # the training thread's exchange rounds
        self._lock = threading.Lock()
        self._job: Callable[[Any], None] | None = None  # left with the sampler pool by `prepare`
        self._early: tuple[tuple, dict[int, tuple[torch.Tensor, MiniBatch]]] | None = None  # what it sampled
        self.sampled_ahead = 0  # batches a `run` took from `prepare`'s work

    def prepare(self, batches: Sequence[torch.Tensor], key: Sequence[int], start: int = 0) -> None:
        """Have the sequence `run(batches, key, start)` will next be asked for begin with its first batches
        sampled (those it submits before it completes the first: the source's `first_ahead` + 1, at most
        `caching.tiers.SAMPLED_AHEAD`, which the budget charges), by the
        sampler's next holder as it gives it back (`SamplerPool.ahead`: a train epoch's next comes after the
        validation pass, whose last batches are still being read when its sampler is done). The same draws
        `run` makes (batch i seeded from (key, i)); a `run` of anything else drops them."""
        n = min(int(self.source.first_ahead) + 1, SAMPLED_AHEAD)
        want = [(i, batches[i]) for i in range(start, min(len(batches), start + n))]
        k = tuple(key)

        def job(sampler: Any) -> None:
            got = {i: (seeds, self._sample(sampler, seeds, k, i)) for i, seeds in want}
            with self._lock:
                if self._job is job:
                    self._early = (k, got)

        with self._lock:
            self._job, self._early = (job if want else None), None
        if want:
            self.samplers.ahead(self.graph, self.fanouts, job)

    def _claim(self, batches: Sequence[torch.Tensor], key: Sequence[int]) -> dict[int, MiniBatch]:
        """The batches `prepare` sampled for this sequence (each seed batch the same), by index; its job
        taken back if no sampler ran it yet."""
        with self._lock:
            job, early, self._job, self._early = self._job, self._early, None, None
        if job is not None:
            self.samplers.drop(job)
        if early is None or early[0] != tuple(key):
            return {}
        return {i: mb for i, (seeds, mb) in early[1].items() if i < len(batches) and torch.equal(seeds, batches[i])}

    def run(self, batches: Sequence[torch.Tensor], key: Sequence[int], start: int = 0) -> Iterator[Prepared]:
        t0 = time.perf_counter()
        early = self._claim(batches, key)
        local = (self._threaded(batches, key, start, early) if self.pipelined
                 else self._serial(batches, key, start, early))
        it = self._exchanged(local, in_step((tuple(key), start)))
        try:
            for item in it:
                now = time.perf_counter()
                yield item
                self.times.train += time.perf_counter() - now
        finally:
            try:
                it.close()
            finally:  # the threads end whatever the rounds did
                local.close()
                self.times.wall += time.perf_counter() - t0

    # -- stages

    def _sample(self, sampler: Any, seeds: torch.Tensor, key: Sequence[int], i: int) -> MiniBatch:
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
            staged = self.source.complete_local(pending)
            to = self.dev.to_device
            y = to(seed_labels(self.labels, mb.seeds))
            blocks = [type(b)(to(b.edge_index), b.num_src, b.num_dst) for b in mb.blocks()]
            links = link_labels(mb, to)
            ev = self.dev.event(self._stream)
        self.times.gather_wait += time.perf_counter() - t
        x = staged.x if staged.fetches else to(staged.x)  # a round writes into staged.x: never a copy of it
        return Prepared(i, mb, x, y, blocks, ev, self.dev, staged if staged.fetches else None, *links)

    def _drain(self, pending) -> None:
        """The consumer stopped early: finish the reads still in flight so the source is clean for reuse."""
        for item in pending:
            with contextlib.suppress(Exception):  # the consumer is already unwinding with its own error
                self.source.cancel(item[2])

    # -- the training thread's exchange rounds

    def _exchanged(self, local: Iterator[Prepared], stepped: bool) -> Iterator[Prepared]:
        """`local`'s batches with the rows other ranks serve: batch i is handed out once its rounds are
        finished and the next rounds started (batch i+1's, or after the last batch rounds that serve the
        others): one round ahead, in the same order on every rank, whatever their numbers of batches; a
        rank's collectives all come from this thread. At the end, serve until every rank is done (in the rounds
        of the exchanges this sequence's batches took part in: all where they are `stepped`, sources.in_step)."""
        ahead = next(local, None)
        rounds = self._start(ahead, stepped)
        failed = stopped = False
        try:
            while ahead is not None:
                item = ahead
                self._finish(item.staged, item)
                if item.staged is None:  # a chain without exchanging tiers: the step need not wait for the next
                    yield item           # batch (which, at an epoch's start, is still being read)
                ahead = next(local, None)
                rounds = self._start(ahead, stepped)
                if item.staged is not None:
                    yield item
        except GeneratorExit:  # the consumer stopped early: it broke out (every rank alike, or DDP's own steps would
            # not match), or its step failed and its loop was unwound (`_serve`)
            stopped = True
        except BaseException:  # this rank's own failure: no more collectives, its peers learn it from its exit
            failed = True
            raise
        finally:
            if not failed:  # the round started ahead is finished, then the others are served until all are done
                self._serve(rounds, stepped, stopped)

    def _serve(self, rounds: Staged | None, stepped: bool, stopped: bool) -> None:
        """Finish `rounds`, then serve the other ranks until every one is done. `stopped`: the consumer let go
        of the sequence early: it broke out of its loop, or its step failed (a DDP all-reduce that met a rank's
        loss) and Python closes the sequence as it unwinds the loop, or later from the garbage collector. A rank
        found gone then ends the serving quietly: raised from a generator's close, the error never reaches the
        consumer, Python prints it as an "Exception ignored in" traceback; the loss is said once, by the
        consumer's own error or by its next collective (the next loader's rounds, `run.close()`)."""
        try:
            while self._finish(rounds, None):
                rounds = self._start(None, stepped)
        except (PeerLeft, LeftRun):  # LeftRun: this rank abandoned the run inside its loop, then let go of it
            if not stopped:
                raise

    def _start(self, item: Prepared | None, stepped: bool) -> Staged | None:
        """Start `item`'s rounds (None: the source's idle rounds, of a `stepped` sequence or not), on the
        exchange stream after the batch's rows were copied (CUDA)."""
        rounds = item.staged if item is not None else self.source.idle(stepped)
        if rounds is None or not rounds.fetches:
            return rounds
        t = time.perf_counter()
        with self.dev.on(self._xstream):
            if item is not None:
                self.dev.consume(item.ready, item.x)
            rounds.start()
        self.times.exchange += time.perf_counter() - t
        return rounds

    def _finish(self, rounds: Staged | None, item: Prepared | None) -> bool:
        """Finish rounds started a batch earlier; `item` is ready for the training stream once the rows they
        wrote are. Returns whether any rank was still active (idle rounds: whether to serve on)."""
        if rounds is None or not rounds.fetches:
            return False
        t = time.perf_counter()
        with self.dev.on(self._xstream):
            rounds.finish()
            if item is not None:
                item.ready = self.dev.event(self._xstream)
        self.times.exchange_wait += time.perf_counter() - t
        return rounds.running

    # -- drivers: batches completed as far as this rank alone can, in order

    def _early_or_sample(self, early: dict[int, MiniBatch], sampler: Any, batches, key, i: int) -> MiniBatch:
        mb = early.pop(i, None)
        if mb is None:
            return self._sample(sampler, batches[i], key, i)
        self.sampled_ahead += 1
        return mb

    def _serial(self, batches, key, start, early) -> Iterator[Prepared]:
        sampler, clear = self.samplers.take(self.graph, self.fanouts), True
        try:
            for i in range(start, len(batches)):
                clear = False
                mb = self._early_or_sample(early, sampler, batches, key, i)
                clear = True
                yield self._complete(i, mb, self._submit(mb, (tuple(key), i)))
        finally:
            if clear:  # not mid-batch: its map holds nothing
                self.samplers.give(self.graph, self.fanouts, sampler)

    def _threaded(self, batches, key, start, early) -> Iterator[Prepared]:
        stop = threading.Event()
        q_sampled: queue.Queue = queue.Queue(self.depth)
        q_ready: queue.Queue = queue.Queue(max(1, self.depth - 1))  # and one ahead in the training thread

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

        # the sequence's first batch submitted (its reads asked for): until then the sampler samples nothing beyond
        # the first batch it hands over, so the gather thread and the reader have the cores to themselves at a
        # sequence's start, where the disk has nothing else to read (the batches sampled ahead go out first)
        first_out = threading.Event()

        def held() -> bool:
            while not first_out.wait(0.1):
                if stop.is_set():
                    return False
            return True

        def sampler_loop() -> None:
            try:
                sampler = self.samplers.take(self.graph, self.fanouts)
                for i in range(start, len(batches)):
                    if i > start and i not in early and not held():
                        break
                    if not put(q_sampled, (i, self._early_or_sample(early, sampler, batches, key, i))):
                        break
                else:
                    put(q_sampled, _DONE)
                self.samplers.give(self.graph, self.fanouts, sampler)  # between batches: its map is clear
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                put(q_sampled, e)

        def gather_loop() -> None:
            # reads of later batches go out before earlier ones are completed: up to `lookahead` ahead, fewer
            # at the start (`ahead_after`)
            pending: collections.deque = collections.deque()
            item = None
            try:
                ahead, first, done = max(1, int(self.source.lookahead)), int(self.source.first_ahead), 0
                while True:
                    item = get(q_sampled)
                    if item is _DONE or isinstance(item, BaseException):
                        break
                    i, mb = item
                    pending.append((i, mb, self._submit(mb, (tuple(key), i))))
                    first_out.set()
                    while len(pending) > ahead_after(ahead, first, done):
                        if not put(q_ready, self._complete(*pending.popleft())):
                            break
                        done += 1
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
                put(q_ready, item)
            except BaseException as e:  # noqa: BLE001 - re-raised by the consumer
                self._drain(pending)
                put(q_ready, e)

        threads = [start_thread(f, f"moment-{f.__name__}", self.device) for f in (sampler_loop, gather_loop)]
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
