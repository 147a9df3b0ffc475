"""The SSD-read prediction (moment.runtime.ssd_model) reads what the store reads, and its disk model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runtime_data import make_dataset, make_layout

from moment.io.merge import plan_runs
from moment.placement.opened import Layout
from moment.runtime.run_plan import plan_store
from moment.runtime.ssd_model import Disk, TierModel, shared
from moment.runtime.store import RankPlace, StoreOptions, open_tiers
from moment.workload.trace import sample_trace


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fidelity")
    ds = make_dataset(root)
    return ds, {"pack": make_layout(ds, root / "packed"), "pad": make_layout(ds, root / "padded", align=512,
                                                                               row_mode="pad")}


@pytest.mark.parametrize("mode", ["pack", "pad"])
@pytest.mark.parametrize("shape", ["rows", "block"])
@pytest.mark.parametrize("local_rank", [0, 1])
def test_predicted_reads_are_the_stores(data, mode, shape, local_rank):
    ds, layouts = data
    n = ds.num_nodes
    where = RankPlace(rank=local_rank, local_rank=local_rank, world_size=2, local_world_size=2)
    options = StoreOptions(policy="static", shape=shape, superbatch=1, cpu_rows=n // 20, gpu_rows=n // 50)
    layout = Layout.open(layouts[mode])
    tm = TierModel(layout, plan_store(layout, where, options, None))  # the model asks the store's plan
    store = open_tiers(layout, where, options)
    try:
        tr = sample_trace(ds, (10, 5), 64, seed=0, rank=local_rank, world_size=2)
        want_bytes = want_req = 0
        for b in tr.batches():
            p = tm.batch_plan(b)
            want_bytes += p.bytes
            want_req += len(p)
            before = store.tier_stats()["rows"]["ssd"]
            store.gather(torch.from_numpy(b))
            assert store.tier_stats()["rows"]["ssd"] - before == np.isin(b, tm.misses(b)).sum()
        st = store.tier_stats()
        assert want_bytes > 0 and st["rows"]["gpu"] > 0 and st["rows"]["cpu"] > 0
        assert (st["ssd_bytes_read"], st["ssd_requests"]) == (want_bytes, want_req)
    finally:
        store.close()


def test_disk_model_reproduces_the_probe_and_shares_fairly():
    d = Disk(seq_bps=1e9, iops=50_000, small=4096)
    rnd = plan_runs(np.zeros(100, np.int32), np.arange(100, dtype=np.int64) * 8192, 4096, 4096, 0, 1 << 20)
    assert len(rnd) == 100 and d.seconds(rnd) == pytest.approx(100 / 50_000)  # small random reads: 1 / IOPS each
    seq = plan_runs(np.zeros(256, np.int32), np.arange(256, dtype=np.int64) * 4096, 4096, 4096, 0, 1 << 20)
    assert len(seq) == 1 and d.seconds(seq) == pytest.approx(1 / 50_000 + ((1 << 20) - 4096) / 1e9)
    assert shared([1.0, 1.0]) == [2.0, 2.0]
    assert shared([1.0, 3.0]) == [2.0, 4.0]  # the short job shares half the disk, then the long one has it
