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
first, so a rank that stops is never a rank the others wait for. The sequences of one source (a loop's loaders
and lookups) take turns (`Turns`): one at a time has reads in flight, the others are paused where they stand.

Determinism: batches come out in the order given, and batch i is sampled with a generator seeded
from (key, i) — never from a shared stream — so thread timing cannot change any result.
`StageTimes` says where the time goes: seconds spent in each stage (busy, not blocked on a queue).
"""

from __future__ import annotations

import collections
import contextlib
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

#: a sequence paused within this many batches of its driver's start reads one batch at a time when it resumes (no
#: threads, nothing read ahead, so the next pause drops nothing), until it has taken as many without a pause: a loop
#: that alternates loaders batch by batch (`zip`), where each pause dropped the read-ahead (its reads in flight and
#: its ready batches) only to read it again. On a 30k-node layout (1 rank, 256 a batch) zip(train, val)'s 48
#: batches took 1.06-1.39 s and read 523 MB that way, against 0.35-0.41 s and 281 MB one at a time (the same two
#: passes one after the other: 95 batches in 0.33-0.47 s, 138 MB)
ALTERNATING = 8


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
                 sampler: Callable[[CSRGraph, list[int]], Any] | SamplerPool = NeighborSampler,
                 turns: Turns | None = None):
        """`sampler(graph, fanouts)` makes a sampler: NeighborSampler's node batches, or link prediction's
        (moment.runtime.link_task.sampler_for); a `SamplerPool` lends them (pipelines of one run share one, so
        its sequences reuse one sampler's node map). `turns`: the source's (`Turns`: pipelines of one run share
        it, and so do its lookups; None: this pipeline's own)."""
        self.graph, self.fanouts, self.source = graph, list(fanouts), source
        self.samplers = sampler if isinstance(sampler, SamplerPool) else SamplerPool(sampler)
        self.labels, self.device = labels, torch.device(device)
        self.depth, self.pipelined = max(1, depth), pipelined
        self.times = StageTimes()
        self.turns = turns if turns is not None else Turns()
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
        seq = _Sequence(self, batches, key, start, self._claim(batches, key))
        how = "stopped"  # the consumer let go of it early: it broke out, or its loop was unwound
        try:
            while (item := seq.next()) is not None:
                now = time.perf_counter()
                yield item
                self.times.train += time.perf_counter() - now
            how = "end"
        except GeneratorExit:  # closed at a yield: the consumer stopped early ("stopped")
            raise
        except BaseException:  # this rank's own failure: no more collectives, its peers learn it from its exit
            how = "failed"
            raise
        finally:
            try:
                seq.close(how)
            finally:
                self.times.wall += time.perf_counter() - t0

    def _driver(self, batches, key, start: int, early: dict[int, MiniBatch]) -> Iterator[Prepared]:
        """Batches `start`, `start` + 1, ... completed as far as this rank alone can, in order (threads, or
        one at a time)."""
        return (self._threaded(batches, key, start, early) if self.pipelined
                else self._serial(batches, key, start, early))

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
        ch = _Channels(self.depth, max(1, self.depth - 1))  # and one ahead in the training thread
        q_sampled, q_ready = ch.sampled, ch.ready

        def sampler_loop() -> None:
            try:
                sampler = self.samplers.take(self.graph, self.fanouts)
                for i in range(start, len(batches)):
                    # the sequence's first batch submitted (its reads asked for): until then the sampler samples
                    # nothing beyond the first batch it hands over, so the gather thread and the reader have the
                    # cores to themselves at a sequence's start, where the disk has nothing else to read (the
                    # batches sampled ahead go out first)
                    if i > start and i not in early and not ch.held():
                        break
                    if not ch.put(q_sampled, (i, self._early_or_sample(early, sampler, batches, key, i))):
                        break
                else:
                    ch.put(q_sampled, _DONE)
                self.samplers.give(self.graph, self.fanouts, sampler)  # between batches: its map is clear
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
                ch.put(q_sampled, e)

        def gather_loop() -> None:
            # reads of later batches go out before earlier ones are completed: up to `lookahead` ahead, fewer
            # at the start (`ahead_after`)
            pending: collections.deque = collections.deque()
            item = None
            try:
                ahead, first, done = max(1, int(self.source.lookahead)), int(self.source.first_ahead), 0
                while True:
                    item = ch.get(q_sampled)
                    if item is _DONE or isinstance(item, BaseException):
                        break
                    i, mb = item
                    pending.append((i, mb, self._submit(mb, (tuple(key), i))))
                    ch.submitted()
                    while len(pending) > ahead_after(ahead, first, done):
                        if not ch.put(q_ready, self._complete(*pending.popleft())):
                            break
                        done += 1
                    if ch.stopped:
                        break
                if ch.stopped:
                    self._drain(pending)
                    return
                if not isinstance(item, BaseException):
                    while pending:
                        if not ch.put(q_ready, self._complete(*pending.popleft())):
                            self._drain(pending)
                            return
                ch.put(q_ready, item)
            except BaseException as e:  # noqa: BLE001 - re-raised by the consumer
                self._drain(pending)
                ch.put(q_ready, e)

        threads = [start_thread(f, f"moment-{f.__name__}", self.device) for f in (sampler_loop, gather_loop)]
        try:
            while True:
                item = ch.get(q_ready)
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            ch.stop()  # the threads see it at once (a pause or a consumer's break waits for them)
            for t in threads:
                t.join()


class _Channels:
    """The queues between a sequence's threads (sampled batches, ready ones), the first submission's signal and the
    stop, under one lock: a wait on any ends as soon as the sequence is stopped. Why not `queue.Queue`: its waits
    polled for the stop every 0.1 s, and a sequence paused for another (`Turns`) waited that long for each thread."""

    def __init__(self, sampled: int, ready: int):
        self._cv = threading.Condition()
        self.sampled: tuple[collections.deque, int] = (collections.deque(), max(1, sampled))
        self.ready: tuple[collections.deque, int] = (collections.deque(), max(1, ready))
        self.stopped = False
        self._first_out = False

    def put(self, q: tuple[collections.deque, int], item: Any) -> bool:
        """Queue `item` once there is room; False when the sequence stopped first."""
        items, size = q
        with self._cv:
            while len(items) >= size and not self.stopped:
                self._cv.wait()
            if self.stopped:
                return False
            items.append(item)
            self._cv.notify_all()
            return True

    def get(self, q: tuple[collections.deque, int]) -> Any:
        """The next item, once there is one; `_DONE` when the sequence stopped first."""
        items, _ = q
        with self._cv:
            while not items and not self.stopped:
                self._cv.wait()
            if self.stopped:
                return _DONE
            item = items.popleft()
            self._cv.notify_all()
            return item

    def submitted(self) -> None:
        """The sequence's first batch is submitted: the sampler may sample on."""
        with self._cv:
            if not self._first_out:
                self._first_out = True
                self._cv.notify_all()

    def held(self) -> bool:
        """Wait until the first batch is submitted; False when the sequence stopped first."""
        with self._cv:
            while not self._first_out and not self.stopped:
                self._cv.wait()
            return not self.stopped

    def stop(self) -> None:
        with self._cv:
            self.stopped = True
            self._cv.notify_all()


class Turns:
    """The sequences (loaders) and lookups of one feature source take turns: one at a time has its reads in flight.

    Why: a source's tiers are one chain with one reader, one pool of read buffers, one cache whose policy routes
    batches in the order they are submitted, and one exchange per tier whose rounds must be finished before the
    next is started. A loop of one's own opens a second loader while the first is part-way (validation inside the
    train loop, `zip` over two loaders, a feature-store lookup between steps, a half-used iterator left alive):
    the first's threads went on submitting reads whose finished buffers held the whole pool while its consumer
    was in the second, whose reads then waited for room for ever (and the two gather threads raced in the
    tiers). Now the sequence whose batch is asked for takes the source (`take`, on the consumer's thread); the
    one that had it is paused (`_Sequence.pause`): the rounds it had started are finished, its threads stopped
    and its reads in flight dropped (waited for: the cache's admissions are made in order). It is resumed where
    it stood when its next batch is asked for: its batches are the same (each sampled from (key, index)), read
    again, and no exchange round is run twice (every rank runs as many)."""

    def __init__(self) -> None:
        self.current: _Sequence | None = None
        self.closed = False  # the source is closed: a sequence let go of now serves nothing

    def take(self, seq: _Sequence | None) -> None:
        """Give the source to `seq` (None: a lookup, on the caller's thread), pausing the sequence that had it."""
        cur = self.current
        if cur is not None and cur is not seq:
            self.current = None
            cur.pause()
        self.current = seq

    def done(self, seq: _Sequence) -> None:
        if self.current is seq:
            self.current = None

    def close(self) -> None:
        """The source closes: pause the sequence that has it (its threads end, its rounds are finished)."""
        self.take(None)
        self.closed = True

    def abandon(self) -> None:
        """The source closes on a rank that failed: stop the threads of the sequence that has it, no collective."""
        self.closed = True
        cur, self.current = self.current, None
        if cur is not None:
            cur._stop_driver()


class _Sequence:
    """One `Pipeline.run`: its driver's batches with the rows other ranks serve. Batch i is handed out once its
    rounds are finished and the next rounds started (batch i+1's, or after the last batch rounds that serve the
    others): one round ahead, in the same order on every rank, whatever their numbers of batches; a rank's
    collectives all come from the consumer's thread. A chain without exchanging tiers hands batch i out as soon as
    it is complete (the step need not wait for the next batch, which, at an epoch's start, is still being read).
    Paused while another sequence of the source has it (`Turns`)."""

    def __init__(self, pipe: Pipeline, batches: Sequence[torch.Tensor], key: Sequence[int], start: int,
                 early: dict[int, MiniBatch]):
        self.pipe, self.batches, self.key, self.early = pipe, batches, tuple(key), early
        # whether its batches take part in every exchange's rounds (sources.in_step)
        self.stepped = in_step((self.key, start))
        self.at = start  # the index the driver yields next
        self.driver: Iterator[Prepared] | None = None  # started at the first batch asked for, and at a resume
        self.ahead: Prepared | None = None  # the next batch, taken from the driver, its rounds started
        self.rounds: Staged | None = None  # those rounds (after the last batch: idle ones, which serve the others)
        self.advance = True  # the next batch is still to be taken from the driver
        self.taken = 0  # batches taken from the driver since it started
        self.serial = False  # the driver reads one batch at a time (`ALTERNATING`)

    def next(self) -> Prepared | None:
        """The next batch; None at the end."""
        pipe = self.pipe
        pipe.turns.take(self)
        if self.advance:
            self._advance()
        item = self.ahead
        if item is None:
            return None
        pipe._finish(item.staged, item)
        if item.staged is None:
            self.advance = True
        else:
            self._advance()
        return item

    def _advance(self) -> None:
        pipe = self.pipe
        self.advance = False
        if self.serial and self.taken >= ALTERNATING:  # no pause for a while: read ahead again (nothing in flight)
            self._stop_driver()
            self.serial = False
        if self.driver is None:
            self.driver = (pipe._serial if self.serial else pipe._driver)(self.batches, self.key, self.at, self.early)
            self.early, self.taken = {}, 0
        self.ahead = next(self.driver, None)
        if self.ahead is not None:
            self.at, self.taken = self.ahead.index + 1, self.taken + 1
        self.rounds = pipe._start(self.ahead, self.stepped)

    def pause(self) -> None:
        """Another sequence (or a lookup) takes the source: finish the rounds started (every rank finishes them at
        the same point of its loop: where the consumer asks another loader), stop the driver, whose reads in
        flight are waited for and dropped, and drop the next batch unless rounds ran for it (they are never run
        twice): the driver starts again from there at the next batch asked for."""
        self.serial = self.taken < ALTERNATING
        try:
            self.pipe._finish(self.rounds, None)
        finally:
            self._stop_driver()
        if not self.advance and self.ahead is not None and self.ahead.staged is None:
            self.at, self.ahead, self.advance = self.ahead.index, None, True

    def _stop_driver(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            driver.close()

    def close(self, how: str) -> None:
        """The consumer is done with it: at its `end` (serve the others until every rank's sequence is over),
        `stopped` early (the same, unless another sequence has the source now, or it is closed: then this one was
        left part-way, as every rank leaves it), or `failed` on this rank (no more collectives)."""
        turns = self.pipe.turns
        try:
            serve = how == "end" or (how == "stopped" and not turns.closed and turns.current in (None, self))
            if serve:
                turns.current = self
                self.pipe._serve(self.rounds, self.stepped, how == "stopped")
            elif how == "stopped":  # the rounds it started are finished (their collectives were issued), none started
                with contextlib.suppress(PeerLeft, LeftRun):
                    self.pipe._finish(self.rounds, None)
        finally:
            turns.done(self)
            self._stop_driver()  # the threads end whatever the rounds did
