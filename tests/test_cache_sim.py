"""The trace is the runtime's access stream; the simulator and `moment cache simulate` on it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from runtime_data import make_dataset

from moment.caching.simulate import simulate
from moment.cli import main
from moment.errors import MomentError
from moment.runtime.pipeline import Pipeline
from moment.runtime.sources import InMemoryFeatures
from moment.workload.sampler import CSRGraph, SeedBatches
from moment.workload.trace import Trace, sample_trace


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("sim"))


def test_trace_is_what_the_pipeline_reads(ds, tmp_path):
    fan, bs = [10, 5], 64
    tr = sample_trace(ds, fan, bs, seed=3, epochs=2, rank=1, world_size=2)
    pipe = Pipeline(CSRGraph.from_dataset(ds), fan, InMemoryFeatures(ds.file("features")),
                    torch.from_numpy(np.array(ds.labels)), torch.device("cpu"), pipelined=False)
    sb = SeedBatches(np.asarray(ds.train_idx), bs, seed=3, rank=1, world_size=2)
    got = [item.batch.n_id.numpy() for e in range(2) for item in pipe.run(list(sb.epoch(e)), (3, e, 1))]
    assert len(got) == len(tr) and all((a == b).all() for a, b in zip(got, tr.batches(), strict=True))
    back = Trace.load(tr.save(tmp_path / "t.npz"))
    assert (back.ids == tr.ids).all() and (back.offsets == tr.offsets).all()
    cut = tmp_path / "cut.npz"  # a cut or foreign file is one clear error, not a zipfile traceback
    cut.write_bytes((tmp_path / "t.npz").read_bytes()[:40])
    with pytest.raises(MomentError, match="not a Moment trace file"):
        Trace.load(cut)


def test_belady_bounds_every_policy(ds):
    tr = sample_trace(ds, [10, 5], 64, epochs=1)
    hot = np.bincount(tr.ids, minlength=ds.num_nodes)[::-1].copy()  # deliberately imperfect hotness
    cap = ds.num_nodes // 10
    r = simulate(tr, cap, hotness=hot, superbatch=4)
    assert set(r) == {"static", "lru", "belady-superbatch", "belady"}
    for name, v in r.items():
        assert v["hit_rate"] <= r["belady"]["hit_rate"] + 1e-12, name
        assert v["accesses"] == tr.ids.size and v["ssd_bytes"] == (v["accesses"] - v["hits"]) * ds.row_bytes
    # static keeps the `cap` hottest rows (stable ties) for good: its hits are the accesses to them
    kept = np.argsort(-hot, kind="stable")[:cap]
    assert r["static"]["hits"] == np.isin(tr.ids, kept).sum() > 0
    # a superbatch of the whole trace knows the future as Belady does, and Belady gains on the others
    whole = simulate(tr, cap, ["belady-superbatch"], hotness=hot, superbatch=len(tr))
    assert whole["belady-superbatch"]["hits"] == r["belady"]["hits"]
    assert r["belady"]["hits"] > max(r["static"]["hits"], r["lru"]["hits"])


def test_cli_json_and_errors(ds, capsys):
    assert main(["cache", "simulate", "--dataset", str(ds.path), "--capacity", "10%", "--capacity", "64KiB",
                 "--fanouts", "10,5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["policies"]) == {"static", "lru", "belady-superbatch"} and len(doc["runs"]) == 2
    assert doc["capacity_rows"] == ds.num_nodes // 10
    for v in doc["policies"].values():
        assert 0 <= v["hit_rate"] <= doc["belady"]["hit_rate"] and v["ssd_bytes"] >= doc["belady"]["ssd_bytes"]
    for bad, words in ((["--capacity", "0"], "--capacity '0'"), (["--capacity", "200%"], "--capacity '200%'"),
                       (["--capacity", "lots"], "--capacity 'lots'"),  # (named no option)
                       (["--capacity", "10%", "--policy", "fifo"], "--policy 'fifo': not a cache policy the "
                        "simulation compares; choose from static, lru, belady-superbatch (belady, the whole-trace "
                        "optimum, is always reported as the bound)"),
                       (["--capacity", "10%", "--rank", "3"], "3")):
        assert main(["cache", "simulate", "--dataset", str(ds.path), *bad]) == 2, bad
        err = capsys.readouterr().err
        assert "error" in err and words in err, err
