"""A rank's sequences reuse one sampler (its node map filled once per run), draw exactly what fresh samplers
draw, never share one between two sequences at once, and never reuse one whose batch raised; the next train
sequence's first batches, sampled ahead by the sequence before it as it ends, are the same draws."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moment.runtime.pipeline import Pipeline
from moment.runtime.sampler_pool import SamplerPool
from moment.runtime.sources import InMemoryFeatures
from moment.workload.sampler import CSRGraph, NeighborSampler

BATCHES = 6
REPO = Path(__file__).resolve().parents[1]


class Counting:
    """A sampler factory that counts what it made; `fail_at`: the batch index whose sampling raises (once)."""

    def __init__(self, fail_at: int | None = None):
        self.made: list[NeighborSampler] = []
        self.fail_at = fail_at

    def __call__(self, graph, fanouts):
        s = NeighborSampler(graph, fanouts)
        self.made.append(s)
        if self.fail_at is not None:
            real, owner = s.sample, self

            def sample(seeds):
                if owner.fail_at is not None and int(seeds[0]) == owner.fail_at * 48:
                    owner.fail_at = None
                    s._map.local[int(seeds[0])] = 7  # a half-sampled batch's entry left in its map
                    raise RuntimeError("sampling failed")
                return real(seeds)

            s.sample = sample
        return s


def _setup(ds):
    graph = CSRGraph.from_dataset(ds)
    return graph, torch.from_numpy(np.array(ds.labels)), InMemoryFeatures(ds.file("features"))


def _seeds():
    return [torch.arange(i, i + 48) for i in range(0, 48 * BATCHES, 48)]


def _two_sharing(graph, labels, src, pipelined, pool):
    """A run's train and evaluation pipelines, lent samplers by one pool."""
    return [Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), pipelined=pipelined, sampler=pool)
            for _ in range(2)]


def _batches(pipe, key):
    return [(p.batch.n_id.clone(), p.batch.edge_index.clone()) for p in pipe.run(_seeds(), key)]


def test_the_pool_lends_its_idle_sampler_once_and_makes_another_for_a_second_taker(runtime_dataset):
    graph, _, _ = _setup(runtime_dataset)
    make = Counting()
    pool = SamplerPool(make)
    a = pool.take(graph, [5, 3])
    b = pool.take(graph, [5, 3])  # `a` is lent: a second sequence at once gets its own
    assert a is not b and len(make.made) == 2
    pool.give(graph, [5, 3], a)
    assert pool.take(graph, [5, 3]) is a
    pool.give(graph, [5, 3], a)
    assert pool.take(graph, [4, 3]) is not a  # other fan-outs: another sampler
    assert pool.made == len(make.made) == 3


@pytest.mark.parametrize("pipelined", [True, False])
def test_sequences_reuse_one_sampler_and_draw_what_fresh_ones_draw(runtime_dataset, pipelined):
    graph, labels, src = _setup(runtime_dataset)
    make = Counting()
    train, evals = _two_sharing(graph, labels, src, pipelined, SamplerPool(make))
    got = [_batches(train, (1, 0, 0)), _batches(evals, (1, 0, 0, 9)), _batches(train, (1, 1, 0))]
    assert len(make.made) == 1, "every sequence after the first reuses the run's sampler"
    assert int((make.made[0]._map.local >= 0).sum()) == 0, "its node map is clear between batches"
    for key, seq in zip([(1, 0, 0), (1, 0, 0, 9), (1, 1, 0)], got, strict=True):
        fresh = _batches(Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), pipelined=pipelined), key)
        assert len(seq) == len(fresh) == BATCHES
        for (n, e), (fn, fe) in zip(seq, fresh, strict=True):
            assert torch.equal(n, fn) and torch.equal(e, fe)


def test_a_consumer_that_stops_early_gives_the_sampler_back(runtime_dataset):
    graph, labels, src = _setup(runtime_dataset)
    make = Counting()
    pipe = Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), sampler=SamplerPool(make))
    for p in pipe.run(_seeds(), (1, 0, 0)):
        if p.index == 1:
            break
    assert len(_batches(pipe, (1, 1, 0))) == BATCHES
    assert len(make.made) == 1


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_sampler_whose_batch_raised_is_not_lent_again(runtime_dataset, pipelined):
    graph, labels, src = _setup(runtime_dataset)
    make = Counting(fail_at=2)
    pipe = Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), pipelined=pipelined, sampler=SamplerPool(make))
    with pytest.raises(RuntimeError, match="sampling failed"):
        list(pipe.run(_seeds(), (1, 0, 0)))
    again = _batches(pipe, (1, 0, 0))
    assert len(make.made) == 2, "the failed sampler's map may hold a half-sampled batch: a new one is made"
    fresh = _batches(Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), pipelined=pipelined), (1, 0, 0))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(again, fresh, strict=True))


@pytest.mark.parametrize("pipelined", [True, False])
def test_the_next_sequences_first_batches_are_sampled_as_the_one_between_ends(runtime_dataset, pipelined):
    graph, labels, src = _setup(runtime_dataset)
    make = Counting()
    train, evals = _two_sharing(graph, labels, src, pipelined, SamplerPool(make))
    _batches(train, (1, 0, 0))
    calls = []
    real = make.made[0].sample
    make.made[0].sample = lambda seeds: calls.append(seeds) or real(seeds)
    train.prepare(_seeds(), (1, 1, 0))
    assert not calls, "nothing is sampled until a sequence gives the sampler back"
    _batches(evals, (1, 0, 0, 9))
    ahead = int(src.first_ahead) + 1
    assert len(calls) == BATCHES + ahead, "the evaluation's batches, then the next epoch's first ones"
    got = _batches(train, (1, 1, 0))
    assert train.sampled_ahead == ahead and len(calls) == 2 * BATCHES
    assert len(make.made) == 1, "the work ahead uses the run's one sampler"
    fresh = _batches(Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), pipelined=pipelined), (1, 1, 0))
    for (n, e), (fn, fe) in zip(got, fresh, strict=True):
        assert torch.equal(n, fn) and torch.equal(e, fe)


def test_work_ahead_for_another_sequence_is_dropped_and_never_runs(runtime_dataset):
    graph, labels, src = _setup(runtime_dataset)
    pool = SamplerPool(Counting())
    train = Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), sampler=pool)
    train.prepare(_seeds(), (1, 1, 0))
    other = [s + 1 for s in _seeds()]  # another epoch's seeds under the same key: sampled afresh
    assert len(list(train.run(other, (1, 1, 0)))) == BATCHES
    assert train.sampled_ahead == 0 and pool._ahead is None, "the sequence started without it: its job is taken back"
    train.prepare(_seeds(), (1, 2, 0))
    _batches(Pipeline(graph, [5, 3], src, labels, torch.device("cpu"), sampler=pool), (1, 1, 0, 9))
    got = _batches(train, (1, 3, 0))  # asked for another epoch than the one prepared
    assert train.sampled_ahead == 0 and len(got) == BATCHES
    fresh = _batches(Pipeline(graph, [5, 3], src, labels, torch.device("cpu")), (1, 3, 0))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, fresh, strict=True))


def test_the_bench_compares_both_on_the_same_batches():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "sequence_start.py"), "--nodes", "20000",
                          "--sequences", "2", "--batches", "2", "--batch-size", "64"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    got = dict(line.split(": ", 1) for line in out.splitlines()[1:])
    for k in ("first_batch_ratio", "sequence_ratio", "first_batch_ms_made", "first_batch_ms_reused"):
        assert float(got[k].split()[0]) > 0
    assert got["samplers_made_by_the_pool"] == "1"


def test_the_epoch_start_bench_compares_both_ways_on_the_same_pipelines():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "epoch_start.py"), "--nodes", "20000", "--rounds", "2",
                          "--batches", "4", "--batch-size", "64"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    got = dict(line.split(": ", 1) for line in out.splitlines()[1:])
    assert got["batches_sampled_ahead"] == "6", "three batches an epoch taken from the work ahead, in its two epochs"
    for k in ("first_submit_ms_at_start", "first_submit_ms_ahead", "third_submit_ratio"):
        assert float(got[k].split()[0]) > 0
