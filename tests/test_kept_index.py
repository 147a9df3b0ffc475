"""The layout's node index loaded once per machine: torchrun's agent keeps it before forking the ranks, each rank
reads that copy instead of the file, and the budget charges it once. The index and the hotness order are read
into the arrays a process keeps, not mapped (a mapping's pages count in its memory beside the copy)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_data import TRAIN_ARGS

from moment.errors import MomentError
from moment.placement import opened
from moment.placement.opened import Layout
from moment.runtime.budget import RunShape, split_budget

MiB = 2**20


@pytest.fixture
def kept(monkeypatch):
    """This process's kept indexes, emptied for the test and restored after it."""
    monkeypatch.setattr(opened, "_KEPT", {})
    return opened._KEPT


@pytest.fixture
def own_layout(runtime_layout, tmp_path) -> Path:
    """A copy of the session's layout this test may rewrite."""
    out = tmp_path / "L"
    shutil.copytree(runtime_layout, out)
    return out


def _no_reads(monkeypatch) -> None:
    def fail(self):
        raise AssertionError("the index file was read")

    monkeypatch.setattr(Layout, "_read_index", fail)


def test_a_kept_index_is_what_the_layout_gives_without_reading_its_file(own_layout, kept, monkeypatch):
    lay = Layout.open(own_layout)
    fresh = lay.load_index()
    assert not lay.index_kept and not kept
    lay.keep_index()
    bins, slots = kept_pair = next(iter(kept.values()))
    assert np.array_equal(bins, fresh[0]) and np.array_equal(slots, fresh[1])
    assert not bins.flags.writeable and not slots.flags.writeable  # a write would copy a shared page
    _no_reads(monkeypatch)
    again = Layout.open(own_layout)  # as a rank opens it: another object, the same file
    assert again.index_kept and again.load_index() is kept_pair
    again.keep_index()  # kept once
    assert len(kept) == 1


def test_an_index_placed_again_is_read_again_not_taken_from_the_kept_copy(own_layout, kept):
    lay = Layout.open(own_layout)
    lay.keep_index()
    path = own_layout / lay.manifest.index.path
    tmp = path.with_name("index.tmp.npy")
    shutil.copyfile(path, tmp)
    os.replace(tmp, path)  # the same bytes in a new file, as a write's rename leaves it
    again = Layout.open(own_layout)
    assert not again.index_kept
    got = again.load_index()
    assert got is not next(iter(kept.values())) and np.array_equal(got[0], lay.load_index()[0])
    path.unlink()
    assert not Layout.open(own_layout).index_kept


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), r"the file ends after \d+ of its \d+ nodes"),
    (lambda p: np.save(p, np.asfortranarray(np.load(p))), r"got int64 \(\d+, 2\) in Fortran order"),
    (lambda p: p.write_bytes(b"not an array" * 100), "not a numpy array file"),
    (lambda p: np.save(p, np.load(p)[:-1]), r"expected an integer \(\d+, 2\) array, got int64 \(\d+, 2\)"),
], ids=["truncated", "fortran", "garbage", "short"])
def test_a_damaged_index_file_is_one_clear_error_kept_or_not(own_layout, kept, damage, says):
    lay = Layout.open(own_layout)
    path = own_layout / lay.manifest.index.path
    damage(path)
    for load in (lay.load_index, lay.keep_index):
        with pytest.raises(MomentError, match=says) as e:
            load()
        assert str(path) in str(e.value) and "layout index is malformed" in str(e.value)
    assert not kept


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "unreadable"),
    (lambda p: np.save(p, np.load(p).astype(np.float32)), r"expected \d+ integer node ids, got float32"),
    (lambda p: np.save(p, np.zeros_like(np.load(p))), "node ids are missing"),
], ids=["truncated", "float", "repeated"])
def test_the_hotness_order_is_read_whole_and_a_damaged_one_is_one_clear_error(own_layout, damage, says):
    lay = Layout.open(own_layout)
    path = own_layout / lay.manifest.order_file.path
    good = np.load(path)
    assert np.array_equal(lay.hot_order(), good) and np.array_equal(lay.hot_order(5), good[:5])
    damage(path)
    with pytest.raises(MomentError, match=says) as e:
        Layout.open(own_layout).hot_order()
    assert str(path) in str(e.value) and "hotness order is malformed" in str(e.value)


def test_a_rank_forked_after_the_index_was_kept_reads_the_same_pages(runtime_layout, kept, monkeypatch):
    Layout.open(runtime_layout).keep_index()
    (pair,) = kept.values()
    _no_reads(monkeypatch)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank: it opens the layout itself
        try:
            got = Layout.open(runtime_layout).load_index()
            same = got is pair and got[0].ctypes.data == pair[0].ctypes.data
            os.write(w, b"1" if same else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def test_the_budget_charges_a_kept_index_once_for_the_machine():
    base = dict(num_nodes=10_000_000, row_bytes=512, graph_bytes=64 * MiB, labels_bytes=MiB, rows_max=50_000,
                training_bytes=40 * MiB, held_batches=4, lookahead=16, sampler_map_bytes=8_000_000,
                batch_ids_bytes=2_000_000, index_bytes=60_000_000, own_gpu_rows=5_000, layout_cpu_rows=100_000,
                cpu_limit_rows=None, policy="static", shape="block", staging_bytes=32 * MiB,
                process_bytes=300 * MiB, agent_bytes=96 * MiB)
    each, once = (split_budget(4096 * MiB, "given", 4, RunShape(**base, index_shared=s)) for s in (False, True))
    item = {s: next(i for i in b.budget.items if i.name == "layout index") for s, b in ((False, each), (True, once))}
    assert each.budget._machine(item[False]) == 4 * 60_000_000 and once.budget._machine(item[True]) == 60_000_000
    assert "loaded once by the agent" in item[True].note
    assert once.cpu_rows > each.cpu_rows  # what the ranks do not hold goes to the cache


def test_the_ranks_charge_it_once_only_when_every_one_reads_the_kept_copy(runtime_dataset, runtime_layout, kept):
    """`run_inputs` agrees across the ranks: one rank that reads its own copy (its agent kept none, or another
    file) makes every rank charge one copy each, so that they resolve the same plan."""
    import torch

    from moment.runtime.config import TrainConfig
    from moment.runtime.sizing import run_inputs
    from moment.workload.sampler import CSRGraph, SeedBatches

    class Peer:  # rank 0's side of an all_reduce(max) with a rank 1 whose values were recorded
        other = None

        def all_reduce(self, t, op):
            assert op == "max"
            seen, Peer.other = Peer.other, t.clone()
            return t if seen is None else torch.maximum(t, seen)

    ds, lay = runtime_dataset, Layout.open(runtime_layout)
    graph, batches = CSRGraph.from_dataset(ds), [SeedBatches(np.asarray(ds.train_idx), 64, seed=0)]

    def inputs(ctx=None):
        return run_inputs(TrainConfig(layout=runtime_layout), ds, graph, batches, [10, 5], 0, 0, 2, lay, ctx=ctx)

    assert not inputs().index_shared
    lay.keep_index()
    assert inputs().index_shared
    ctx = Peer()
    kept_pair = dict(kept)
    kept.clear()
    inputs(ctx)  # rank 1, reading its own copy
    kept.update(kept_pair)
    assert not inputs(ctx).index_shared  # rank 0 has the kept copy, rank 1 not
    inputs(ctx)
    assert inputs(ctx).index_shared  # both have it


def test_the_agent_keeps_the_index_of_the_layout_its_ranks_read(runtime_layout, kept, monkeypatch, tmp_path):
    """`moment train`'s ranks (a tiered run's --layout) and a script's `--preload-index LAYOUT`; not a baseline's,
    and not for ranks that are fresh interpreters (a model whose import starts a thread). A --preload-index that
    cannot be loaded is the agent's one-line error; one `moment train` implies is left to the ranks."""
    import gc

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.run import config_from_args, get_args_parser

    from moment.runtime import agent

    from moment.workload.graph import CHECKED_ENV

    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test's process is no agent: nothing to keep
    monkeypatch.setenv(CHECKED_ENV, "")  # restored after the test: --preload-index sets it for the ranks
    monkeypatch.setattr(MultiprocessContext, "_is_done", MultiprocessContext._is_done)  # restored after the test
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "threaded_kept.py").write_text("import threading\nSTOP = threading.Event()\n"
                                               "T = threading.Thread(target=STOP.wait, daemon=True)\nT.start()\n"
                                               "def make(**kw): ...\n")
    config, parse = agent.forked_ranks(config_from_args), agent.with_options(get_args_parser)

    def launch(*argv: str) -> bool:
        kept.clear()
        config(parse().parse_args(["--standalone", "--nproc-per-node=2", *argv]))
        return Layout.open(runtime_layout).index_kept

    rank = ["-m", agent.RANK_MODULE, "--layout", str(runtime_layout), *TRAIN_ARGS]
    assert launch(*rank)
    assert not launch(*rank, "--features-in-memory")
    assert launch(f"--preload-index={runtime_layout}", "train.py", "LAYOUT")
    assert not launch("train.py", "LAYOUT")
    try:
        assert not launch(*rank, "--model", "threaded_kept:make")
    finally:
        mod = sys.modules.pop("threaded_kept")
        mod.STOP.set()
        mod.T.join(10)
    assert not launch("-m", agent.RANK_MODULE, "--layout", str(tmp_path / "nowhere"))  # the ranks say why
    with pytest.raises(MomentError, match=rf"^--preload-index {tmp_path / 'nowhere'}: cannot load the layout's node "
                                          "index: .*layout directory not found"):
        launch(f"--preload-index={tmp_path / 'nowhere'}", "train.py")
    with pytest.raises(MomentError, match="--preload-index L: the ranks of a --no-python launch are not forked"):
        launch("--preload-index=L", "--no-python", "/bin/true")
