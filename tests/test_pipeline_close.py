"""How a sequence's end serves the other ranks (pipeline._Sequence): to the end, when the consumer breaks out, and
when the consumer's own step fails (its loop unwound closes the sequence late, from Python's finalization): a rank
found gone there ends the serving without Python's "Exception ignored in" traceback."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest
import torch

from moment.runtime.lost import PeerLeft
from moment.runtime.pipeline import Pipeline, Turns
from moment.runtime.sources import InMemoryFeatures, Staged
from moment.workload.sampler import CSRGraph

BATCHES = 6


class Round:
    """One exchange round; `gone`: the other rank left (its finish meets it as the exchange says it)."""

    def __init__(self, log: list[str], name: str, gone: bool = False, running: bool = False):
        self.log, self.name, self.gone, self.running, self.staying = log, name, gone, running, running

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def finish(self) -> None:
        self.log.append(f"finish {self.name}")
        if self.gone:
            raise PeerLeft("another rank left the run while this one was exchanging feature rows with it")


class Exchanging(InMemoryFeatures):
    """Every batch has a round; `idle()` serves `serving` rounds with another rank still active, then one where none
    is (or, `gone`, where the other rank has left)."""

    def __init__(self, path, serving: int = 2, gone: bool = False):
        super().__init__(path)
        self.log: list[str] = []
        self.serving, self.gone = serving, gone

    def complete_local(self, ids):
        return Staged(self.complete(ids), (Round(self.log, "batch", running=True),))

    def idle(self, stepped: bool = True) -> Staged:
        self.serving -= 1
        return Staged(None, (Round(self.log, "idle", gone=self.gone and self.serving < 0, running=self.serving >= 0),))


def _pipe(ds, src) -> Pipeline:
    return Pipeline(CSRGraph.from_dataset(ds), [5, 3], src, torch.from_numpy(np.array(ds.labels)),
                    torch.device("cpu"))


def _seeds():
    return [torch.arange(i, i + 32) for i in range(0, 32 * BATCHES, 32)]


@pytest.fixture
def unraisable(monkeypatch):
    seen: list = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_a_consumer_that_breaks_out_serves_the_others_until_all_are_done(runtime_dataset, unraisable):
    src = Exchanging(runtime_dataset.file("features"))
    for p in _pipe(runtime_dataset, src).run(_seeds(), (1, 0, 0)):
        if p.index == 2:
            break
    gc.collect()
    # the round started for batch 3 is finished, then idle rounds until no rank is active (the third)
    assert src.log[-7:] == ["finish batch", "start idle", "finish idle", "start idle", "finish idle", "start idle",
                            "finish idle"]
    assert not unraisable


def test_a_rank_gone_at_the_sequences_end_is_the_consumers_error(runtime_dataset, unraisable):
    src = Exchanging(runtime_dataset.file("features"), gone=True)
    with pytest.raises(PeerLeft):
        for _ in _pipe(runtime_dataset, src).run(_seeds(), (1, 0, 0)):
            pass
    assert not unraisable


@pytest.mark.parametrize("how", ["break", "step fails"])
def test_a_rank_gone_while_a_stopped_consumers_sequence_serves_is_no_traceback(runtime_dataset, unraisable, how):
    """The hunt's crash-traceback: machine 1's rank killed, machine 0's step (DDP's all-reduce) fails first; the
    sequence, closed as the loop unwinds, met the lost rank in its serving and Python printed the PeerLeft."""
    src = Exchanging(runtime_dataset.file("features"), gone=True)
    pipe = _pipe(runtime_dataset, src)
    before = threading.active_count()

    def consume() -> None:
        for p in pipe.run(_seeds(), (1, 0, 0)):
            if p.index == 2:
                if how == "break":
                    break
                raise RuntimeError("[gloo] Connection reset by peer")  # the step's collective

    if how == "break":
        consume()
    else:
        with pytest.raises(RuntimeError, match="Connection reset"):
            consume()
    gc.collect()
    assert not unraisable, [u.exc_value for u in unraisable]
    assert src.log[-1] == "finish idle"  # it served until it met the loss, then stopped
    assert threading.active_count() == before  # the sequence's threads ended


def test_a_sequence_paused_for_another_finishes_its_round_and_runs_none_twice(runtime_dataset, unraisable):
    """Sequences of one source take turns (pipeline.Turns): asking B for a batch pauses A, whose round started for
    its next batch is finished then (B's rounds must not start before it) and never run again when A resumes; each
    hands out every batch once, in order, and a sequence alternated with another (zip) ends its threads too."""
    src = Exchanging(runtime_dataset.file("features"), serving=0)
    turns = Turns()
    labels = torch.from_numpy(np.array(runtime_dataset.labels))
    a, b = (Pipeline(CSRGraph.from_dataset(runtime_dataset), [5, 3], src, labels, torch.device("cpu"), turns=turns)
            for _ in range(2))
    before = threading.active_count()
    first = a.run(_seeds(), (1, 0, 0))
    got = [next(first).index, next(first).index]
    assert src.log[-1] == "start batch"  # batch 2's round, started before batch 1 was handed out
    n0 = len(src.log)
    inner = [p.index for p in b.run(_seeds(), (1, 1, 0))]
    assert src.log[n0: n0 + 2] == ["finish batch", "start batch"]  # A's round finished, then B's first started
    got += [p.index for p in first]
    assert got == inner == list(range(BATCHES))
    assert src.log.count("start batch") == src.log.count("finish batch") == 2 * BATCHES  # one round a batch
    pairs = [(x.index, y.index) for x, y in zip(a.run(_seeds(), (1, 2, 0)), b.run(_seeds(), (1, 3, 0)))]
    assert pairs == [(i, i) for i in range(BATCHES)] and src.log.count("start batch") == 4 * BATCHES
    gc.collect()
    assert threading.active_count() == before and not unraisable
