"""Fan-outs above the graph's degrees: sampled as the largest degree, planned without sampling what would be
too large to sample, refused beyond any graph's bound, and said once."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import torch

from moment.errors import MomentError
from moment.runtime import sizing
from moment.runtime.config import TrainConfig, effective_fanouts, make_config, parse_args
from moment.workload import sampler as sampler_mod
from moment.workload.sampler import CSRGraph, NeighborSampler, SeedBatches
from moment.workload.spec import FANOUT_LIMIT, parse_fanouts


def _graph(n: int = 300, seed: int = 0) -> CSRGraph:
    """A small graph with one hub (every node its neighbour) and some isolated nodes."""
    rng = np.random.default_rng(seed)
    deg = rng.integers(0, 12, n)
    deg[5] = n - 1
    deg[7:10] = 0
    rows = [np.sort(rng.choice(n, d, replace=False)) for d in deg]
    indptr = np.concatenate([[0], np.cumsum(deg)]).astype(np.int64)
    return CSRGraph.from_arrays(indptr, np.concatenate(rows).astype(np.int64))


def _same(a, b) -> None:
    assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
    assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fanout_above_max_degree_samples_as_max_degree(seed: int) -> None:
    g = _graph(seed=seed)
    top = g.max_degree()
    assert top == int(np.diff(g.indptr.numpy()).max())
    seeds = torch.tensor([5, 3, 7, 100, 250])
    huge = NeighborSampler(g, [10**6, 10**5], seed=seed).sample(seeds)  # would be a [targets, 10**6] matrix
    _same(huge, NeighborSampler(g, [top, top], seed=seed).sample(seeds))
    # below the largest degree nothing changes: the hub's row is still a random subset
    _same(NeighborSampler(g, [top - 1, 4], seed=seed).sample(seeds),
          NeighborSampler(g, [top - 1, 4], seed=seed).sample(seeds))


def test_degree_histogram_in_chunks(monkeypatch) -> None:
    g = _graph()
    whole = np.bincount(np.diff(g.indptr.numpy()))
    monkeypatch.setattr(sampler_mod, "DEGREE_CHUNK", 7)
    assert np.array_equal(g.degree_histogram(), whole)
    empty = CSRGraph.from_arrays(np.zeros(4, np.int64), np.zeros(0, np.int64))
    assert empty.max_degree() == 0


def test_effective_fanouts_note() -> None:
    eff, note = effective_fanouts([1000000, 1000000], 57)
    assert eff == [57, 57]
    assert note == ("--fanouts 1000000,1000000: hops 1, 2 sample at most 57 neighbours (the graph's largest "
                    "degree); using 57,57")
    eff, note = effective_fanouts([100, 10], 57)
    assert eff == [57, 10] and note.startswith("--fanouts 100,10: hop 1 samples at most 57 neighbours")
    assert effective_fanouts([25, 10], 57) == ([25, 10], None)
    assert effective_fanouts([25, 10], 5, given=False) == ([5, 5], None)  # the defaults: nothing to say


def test_fanout_beyond_any_graph_refused() -> None:
    with pytest.raises(MomentError) as e:
        parse_args(["--fanouts", f"{FANOUT_LIMIT + 1},5"], check=False)
    msg = str(e.value)
    assert "--fanouts" in msg and f"at most {FANOUT_LIMIT}" in msg and "\n" not in msg.split("hint")[0].strip()
    with pytest.raises(MomentError, match="fanouts="):
        make_config(keywords=True, fanouts=[2**40])
    assert TrainConfig(fanouts=[FANOUT_LIMIT]).fanouts == [FANOUT_LIMIT]


@pytest.mark.parametrize("given, words", [([0, 5], "each must be a positive integer"),
                                          ([-1, 10], "for every neighbour, PyG's -1, give the graph's largest degree"),
                                          ("25,10", "must be a list of positive integers, one per layer (e.g. [25, 10])")])
def test_a_scripts_fanouts_are_refused_as_the_command_lines_are(given, words) -> None:
    """`open_run(fanouts=...)` takes the rule `--fanouts` does, as one MomentError naming the keyword (a zero
    once reached the sampler as a bare ValueError); PyG's -1 for every neighbour is answered with what does it."""
    with pytest.raises(MomentError) as e:
        make_config(keywords=True, fanouts=given)
    assert str(e.value).startswith(f"fanouts={given!r}: ") and words in str(e.value)
    if not isinstance(given, str):
        with pytest.raises(MomentError, match=f"--fanouts {','.join(map(str, given))}: .*{words[:20]}"):
            parse_args(["--fanouts", ",".join(map(str, given))], check=False)


def test_degree_extent_bounds_the_sampled(runtime_dataset, monkeypatch) -> None:
    """A batch too large to sample is planned from the degrees, never below what sampling states."""
    g = CSRGraph.from_dataset(runtime_dataset)
    train = np.asarray(runtime_dataset.train_idx)
    for fan in ([10, 5], [15, 10, 5], [g.max_degree(), 3]):
        cfg = TrainConfig(fanouts=fan)
        batches = SeedBatches(train, 256, seed=0)
        monkeypatch.setattr(sizing, "_bound", max)  # the sampled batches' largest, without the margin
        sampled = sizing._batch_extent(cfg, g, batches, fan)
        monkeypatch.setattr(sizing, "EXTENT_SAMPLE_SLOTS", 0)
        bound = sizing._batch_extent(cfg, g, batches, fan)
        monkeypatch.undo()
        assert g.num_nodes >= bound.rows >= sampled.rows and g.num_edges >= bound.edges >= sampled.edges
        for b, s in zip(bound.layers, sampled.layers, strict=True):
            assert b.src >= s.src and b.dst >= s.dst and b.edges >= s.edges


def test_normal_fanouts_still_sampled(runtime_dataset) -> None:
    g = CSRGraph.from_dataset(runtime_dataset)
    for fan in ([25, 10], [15, 10, 5]):
        assert sizing.sample_slots(8000, fan, g.degree_histogram()) <= sizing.EXTENT_SAMPLE_SLOTS
    # the paper's batch on a graph of any size: 8000 seeds, 15,10,5
    big = np.zeros(1001, np.int64)
    big[10], big[1000] = 10**8, 10**4
    assert sizing.sample_slots(8000, [15, 10, 5], big) <= sizing.EXTENT_SAMPLE_SLOTS
    assert sizing.sample_slots(8000, [10**6, 10**6], big) > sizing.EXTENT_SAMPLE_SLOTS


def test_dry_run_with_huge_fanouts(runtime_layout, capsys) -> None:
    """Bounded by the graph: quick, the plan of the largest degree's fan-outs, said once."""
    from moment.cli import main

    args = ["--layout", str(runtime_layout), "--batch-size", "1200", "--device", "cpu"]
    t0 = time.monotonic()
    assert main(["train", "--dry-run", "--json", *args, "--fanouts", "10000000,10000000"]) == 0
    took = time.monotonic() - t0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    top = CSRGraph.from_dataset(runtime_layout_dataset(runtime_layout)).max_degree()
    err = " ".join(cap.err.split())
    assert err.count("note: --fanouts 10000000,10000000") == 1
    assert f"hops 1, 2 sample at most {top} neighbours (the graph's largest degree); using {top},{top}" in err
    assert took < 60, took
    assert main(["train", "--dry-run", "--json", *args, "--fanouts", f"{top},{top}"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert doc["memory"]["items"] and [i["name"] for i in doc["memory"]["items"]] == \
        [i["name"] for i in same["memory"]["items"]]
    sizes = {i["name"]: i["bytes"] for i in doc["memory"]["items"]}
    assert {k: v for k, v in sizes.items() if k not in ("process", "torchrun agent")} == \
        {i["name"]: i["bytes"] for i in same["memory"]["items"] if i["name"] not in ("process", "torchrun agent")}


def test_dry_run_fanout_beyond_bound(runtime_layout, capsys) -> None:
    from moment.cli import main

    assert main(["train", "--dry-run", "--layout", str(runtime_layout), "--fanouts", "3000000000,5"]) != 0
    err = capsys.readouterr().err
    assert "--fanouts" in err and "at most 2147483648" in err and "Traceback" not in err
    assert len([ln for ln in err.splitlines() if ln.startswith("error")]) == 1


def runtime_layout_dataset(layout):
    from moment.placement.opened import Layout
    from moment.runtime.run import dataset_dir
    from moment.workload.graph import GraphDataset

    return GraphDataset.open(dataset_dir(TrainConfig(layout=layout), Layout.open(layout)))


@pytest.mark.parametrize("text, why", [("5,,5", "one is empty (between two commas, or before the first)"),
                                       (",5", "one is empty"), ("25,x", "each must be an integer")])
def test_a_fanout_left_out_between_commas_is_refused_by_every_command_not_dropped(text, why) -> None:
    """`5,,5` (likely `5,10,5` mistyped) was read as 5,5: a model a layer shallower than asked for, silently."""
    with pytest.raises(MomentError, match=re.escape(f"--fanouts: fan-outs must be integers like 25,10, got {text!r}: "
                                                    f"{why}")):
        parse_args(["--fanouts", text], check=False)
    with pytest.raises(MomentError, match=re.escape(f"--fanouts must be comma-separated integers like 25,10 (got "
                                                    f"{text!r}: {why}")):
        parse_fanouts(text)
    assert parse_fanouts("25, 10,") == parse_args(["--fanouts", "25, 10,"], check=False).fanouts == [25, 10]
