"""An epoch's first step waits for its own batch only: how far ahead the pipeline submits at a sequence's
start (`first_ahead`, `ahead_after`), the superbatches a cache that plans over them still sees whole, and the
hand-out of a batch before the next one is complete where no exchange round needs it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from moment.caching.tiers import ahead_after, first_ahead
from moment.runtime.pipeline import Pipeline
from moment.runtime.sources import InMemoryFeatures
from moment.runtime.store import RankPlace, StoreOptions, open_tiers
from moment.workload.sampler import CSRGraph

SUPERBATCH, BATCHES = 4, 10


def test_the_rule():
    assert first_ahead(4, routed_whole=False) == 0
    assert first_ahead(4, routed_whole=True) == 3  # the first superbatch closed before its first batch
    assert first_ahead(1, routed_whole=True) == 0
    # one more per batch completed, up to the lookahead
    assert [ahead_after(8, 0, c) for c in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8]
    assert [ahead_after(8, 3, c) for c in range(7)] == [3, 4, 5, 6, 7, 8, 8]


class Recording:
    """A source that logs the pipeline's calls ("s3": batch 3 submitted, "c3": completed); `gate(i)` may hold
    batch i's completion back."""

    def __init__(self, source, gate=None):
        self.source, self.gate, self.log = source, gate, []
        self._index: dict[int, int] = {}

    def __getattr__(self, name):
        return getattr(self.source, name)

    def submit(self, ids, tag=None):
        p = self.source.submit(ids, tag=tag)
        self._index[id(p)] = tag[1]
        self.log.append(f"s{tag[1]}")
        return p

    def complete_local(self, p):
        i = self._index.pop(id(p))
        if self.gate is not None:
            self.gate(i)
        self.log.append(f"c{i}")
        return self.source.complete_local(p)


def _graph(ds):
    return CSRGraph.from_dataset(ds), torch.from_numpy(np.array(ds.labels))


def _seeds():
    return [torch.arange(i, i + 48) for i in range(0, 48 * BATCHES, 48)]


@pytest.mark.parametrize("policy,first", [("static", 2), ("belady-superbatch", SUPERBATCH - 1)])
def test_a_sequence_starts_with_as_few_batches_submitted_as_its_cache_allows(runtime_dataset, runtime_layout, policy,
                                                                             first):
    graph, labels = _graph(runtime_dataset)
    store = open_tiers(runtime_layout, RankPlace(), StoreOptions(cpu_rows=300, gpu_rows=0, shape="block",
                                                                 policy=policy, superbatch=SUPERBATCH))
    closed = []  # the superbatches the CPU tier routed, by size
    route = store.router.route
    store.router.route = lambda batches: closed.append(len(batches)) or route(batches)
    try:
        assert (store.first_ahead, store.lookahead) == (first, 2 * SUPERBATCH)
        src = Recording(store)
        want = InMemoryFeatures(runtime_dataset.file("features"))
        for epoch in range(2):  # each epoch is a sequence of its own
            src.log.clear()
            out = list(Pipeline(graph, [5, 3], src, labels, torch.device("cpu")).run(_seeds(), (1, epoch, 0)))
            assert [p.index for p in out] == list(range(BATCHES))
            for p in out:
                assert torch.equal(p.x, want.complete(want.submit(p.batch.n_id)))
            # the first completion comes once `first` more were submitted; then one more per batch completed
            assert src.log[: first + 2] == [*(f"s{i}" for i in range(first + 1)), "c0"]
            for k, e in enumerate(src.log):
                if e.startswith("c"):
                    c = int(e[1:])
                    submitted = sum(x.startswith("s") for x in src.log[:k])
                    assert submitted - c - 1 <= ahead_after(2 * SUPERBATCH, first, c)
        if policy == "static":  # decides batch by batch: a short first superbatch only merges fewer reads
            assert closed[0] < SUPERBATCH
        else:  # told a superbatch's accesses at once: every one whole but an epoch's last
            assert closed == [4, 4, 2, 4, 4, 2]
    finally:
        store.close()


def test_a_batch_without_exchange_rounds_is_handed_out_before_the_next_is_complete(runtime_dataset):
    graph, labels = _graph(runtime_dataset)
    got_first, held = threading.Event(), []

    def gate(i):  # batch 1 completes only once the consumer holds batch 0
        if i == 1:
            held.append(got_first.wait(20))

    src = Recording(InMemoryFeatures(runtime_dataset.file("features")), gate)
    out = []
    for p in Pipeline(graph, [5, 3], src, labels, torch.device("cpu")).run(_seeds(), (1, 0, 0)):
        out.append(p.index)
        got_first.set()
    assert out == list(range(BATCHES))
    assert held == [True], "batch 0 was held back until batch 1 was complete"


def test_the_sampler_waits_for_the_first_batch_to_be_submitted_before_it_samples_more(runtime_dataset):
    """At a sequence's start the disk has nothing to read: the gather thread and the reader get the cores, so
    the sampler samples nothing beyond the first batch until that batch is submitted (its reads asked for)."""
    from moment.workload.sampler import NeighborSampler

    graph, labels = _graph(runtime_dataset)
    log: list[str] = []
    two = threading.Event()

    class Counted(NeighborSampler):
        def sample(self, seeds):
            log.append("x")
            if log.count("x") >= 2:
                two.set()
            return super().sample(seeds)

    class Slow(Recording):
        def submit(self, ids, tag=None):
            if tag[1] == 0:  # a sampler that went on would have sampled the next batch by now
                log.append(f"waited {two.wait(0.5)}")
            return super().submit(ids, tag)

    src = Slow(InMemoryFeatures(runtime_dataset.file("features")))
    src.log = log
    out = [p.index for p in Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), sampler=Counted)
           .run(_seeds(), (1, 0, 0))]
    assert out == list(range(BATCHES))
    assert log[:3] == ["x", "waited False", "s0"] and log.count("x") == BATCHES


def test_a_first_submission_that_fails_ends_the_sequence_with_its_error_and_frees_the_held_sampler(runtime_dataset):
    """The held sampler waits for a submission that never comes: the error reaches the consumer and every
    thread of the sequence ends (the sampler given back, so the next sequence samples)."""
    from moment.errors import MomentError

    graph, labels = _graph(runtime_dataset)

    class Refusing(Recording):
        def submit(self, ids, tag=None):
            if tag[1] == 0:
                raise MomentError("the disk went away")
            return super().submit(ids, tag)

    pipe = Pipeline(graph, [5, 3], Refusing(InMemoryFeatures(runtime_dataset.file("features"))), labels,
                    torch.device("cpu"))
    before = threading.active_count()
    with pytest.raises(MomentError, match="the disk went away"):
        list(pipe.run(_seeds(), (1, 0, 0)))
    assert threading.active_count() == before  # the held sampler and the gather thread are gone
    assert pipe.samplers._idle is not None  # the sampler was given back: the next sequence reuses it
    assert [p.index for p in pipe.run(_seeds()[:2], (1, 1, 0), start=1)] == [1]
