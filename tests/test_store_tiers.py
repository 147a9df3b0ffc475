"""Tiers that compose: each tier alone over its next, chains without GPU or CPU tiers, callers that use only
the feature-source contract, and the budget's charge for the peer exchange."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fake_device import FakeCudaLayer
from runtime_data import make_dataset, make_layout

from moment.placement.opened import Layout
from moment.placement.reader import open_layout
from moment.runtime.config import TrainConfig
from moment.runtime.cpu_tier import open_cpu_tier
from moment.runtime.disk_tier import DiskTier
from moment.runtime.exchange import RowExchange
from moment.runtime.gpu_tier import GpuTier, load_gpu_table
from moment.runtime.pipeline import Pipeline
from moment.runtime.run_plan import RunInputs, plan_store, resolve_run
from moment.runtime.sources import FeatureSource
from moment.runtime.store import RankPlace, StoreInfo, StoreOptions, open_tiers
from moment.runtime.tier import LayoutRows, Tier
from moment.workload.graph import GraphDataset
from moment.workload.sampler import CSRGraph

RANK0 = RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2)  # owns gpu0's bin
POLICIES = ("static", "lru", "belady-superbatch")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiers")
    ds = make_dataset(root)
    path = make_layout(ds, root / "L")
    return ds, path, open_layout(path)


def _want(reader, ids: np.ndarray) -> torch.Tensor:
    """The layout's own rows of `ids` (the placement reader, not the runtime's), as the dataset's dtype."""
    m = reader.manifest
    dt = torch.from_numpy(np.zeros(1, m.dataset.dtype)).dtype
    return torch.from_numpy(reader.rows(ids)).view(dt).reshape(len(ids), *m.dataset.row_shape)


def _batches(n: int, k: int = 10, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = [rng.choice(n, size=int(rng.integers(40, 600)), replace=False) for _ in range(k)]
    return out + [np.arange(n)[::-1].copy(), rng.integers(0, n, 700), np.zeros(0, np.int64)]


def _run(tier: Tier, reader, batches: list[np.ndarray]) -> None:
    """Submit ahead as the pipeline does, complete in order, every batch bit-exact against the layout."""
    pend = []
    for b in batches:
        pend.append((b, tier.submit(b)))
        if len(pend) > tier.lookahead:
            b0, p0 = pend.pop(0)
            assert torch.equal(tier.complete(p0), _want(reader, b0))
    for b0, p0 in pend:
        assert torch.equal(tier.complete(p0), _want(reader, b0))


def _parts(path, options: StoreOptions):
    lay = Layout.open(path)
    plan = plan_store(lay, RANK0, options, None)
    rows = LayoutRows(lay)
    return lay, plan, rows, DiskTier(lay, rows, "cpu", plan.tiers, planned_shares=plan.rank.ssd_shares)


@pytest.mark.parametrize("shape,superbatch", [("rows", 1), ("block", 3)])
def test_the_disk_tier_alone(data, shape, superbatch):
    ds, path, reader = data
    _, _, _, disk = _parts(path, StoreOptions(shape=shape, superbatch=superbatch, buffer_bytes=64 << 10))
    try:
        batches = _batches(ds.num_nodes)
        _run(disk, reader, batches)
        st = disk.tier_stats()
        assert st["rows"]["ssd"] == sum(b.size for b in batches) and st["ssd_bytes_read"] > 0
        assert disk.pool.used == 0  # every read buffer went back
    finally:
        disk.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cpu_tier_alone_over_the_disk_tier(data, policy):
    ds, path, reader = data
    n = ds.num_nodes
    lay, plan, rows, disk = _parts(path, StoreOptions(cpu_rows=n // 10, policy=policy, shape="block", superbatch=3,
                                                      buffer_bytes=64 << 10))
    cpu = open_cpu_tier(lay, rows, disk, "cpu", plan.tiers, shared=False, held=None, creator=True, barrier=None)
    try:
        assert cpu.next is disk and cpu.capacity == n // 10
        batches = _batches(n)
        _run(cpu, reader, batches)
        st = cpu.tier_stats()
        assert st["rows"]["cpu"] > 0 and st["rows"]["ssd"] > 0 and st["rows"]["gpu"] == 0
        assert st["rows"]["cpu"] + st["rows"]["ssd"] == sum(b.size for b in batches)
        if policy != "static":  # admitted rows come from the reads that fetched them, and serve later hits
            assert st["cpu_admitted_rows"] > 0
    finally:
        cpu.close()


def test_the_gpu_tier_alone_over_the_disk_tier(data):
    ds, path, reader = data
    n = ds.num_nodes
    _, plan, rows, disk = _parts(path, StoreOptions(gpu_rows=n // 50))
    held, table = load_gpu_table(rows, plan.rank.gpu_bins, disk.file_rows, "cpu")
    gpu = GpuTier(rows, disk, "cpu", held, table)
    try:
        assert gpu.rows == n // 50 > 0
        batches = _batches(n)
        _run(gpu, reader, batches)
        st = gpu.tier_stats()
        assert st["rows"]["gpu"] > 0 and st["rows"]["gpu"] + st["rows"]["ssd"] == sum(b.size for b in batches)
    finally:
        gpu.close()


def test_the_gpu_tier_holds_a_bins_first_rows_and_nothing_of_the_other_bins(data):
    """TierMap.holds, which reads a slot only for ids in a bin the tier takes rows of, against the rule itself
    (slot < the bin's carved rows) on every node, in a shuffled order with repeats."""
    ds, path, _ = data
    n = ds.num_nodes
    _, plan, rows, disk = _parts(path, StoreOptions(gpu_rows=n // 50))
    try:
        held, _ = load_gpu_table(rows, plan.rank.gpu_bins, disk.file_rows, "cpu")
        ids = np.random.default_rng(3).permutation(np.concatenate([np.arange(n), np.arange(n // 3)]))
        want = rows.slot[ids] < held.limit[rows.bin[ids]]
        assert 0 < want.sum() < ids.size and held.holds(rows, ids).tolist() == want.tolist()
        assert held.holds(rows, ids[:0]).shape == (0,)
    finally:
        disk.release()


def test_the_gpu_table_goes_to_the_device_a_bounded_chunk_at_a_time(data, monkeypatch):
    """On CUDA (here a layer that copies as CUDA does, recorded) every read of the GPU tier's rows lands in one
    reused pinned buffer of one chunk, never more rows than a chunk holds, so no rank holds its table in
    host memory; the table on the device serves every row bit-exactly."""
    import moment.io.device as device

    ds, path, reader = data
    _, plan, rows, disk = _parts(path, StoreOptions())  # every row of rank 0's GPU bins
    rb = rows.row_bytes
    monkeypatch.setattr(device, "UPLOAD_CHUNK_BYTES", 7 * rb)  # 7 rows a chunk
    dev, reads = FakeCudaLayer(), []

    def read(shard: int, k: int, start: int, out: np.ndarray) -> np.ndarray:
        reads.append((k, start, out.__array_interface__["data"][0]))
        return disk.file_rows(shard, k, start, out)

    held, table = load_gpu_table(rows, plan.rank.gpu_bins, read, dev)
    gpu = GpuTier(rows, disk, "cpu", held, table)
    try:
        total = sum(g.rows for g in plan.rank.gpu_bins)
        assert table.shape == (total, rb) and held.rows == total > 7 * 3
        assert len(dev.pinned) == 1 and dev.pinned_bytes() == device.upload_chunk(rb, total)[1] == device.slot_bytes(7 * rb)
        assert all(k <= 7 and at == dev.pinned[0].data_ptr() for k, _, at in reads)  # the one pinned chunk
        assert sum(k for k, _, _ in reads) == total and max(start for _, start, _ in reads) > 0
        _run(gpu, reader, _batches(ds.num_nodes))
        assert gpu.tier_stats()["rows"]["gpu"] > 0
    finally:
        gpu.close()


def test_a_closed_gpu_tier_keeps_none_of_its_table(data):
    """A `[:0]` view of the table kept all of its memory alive after close; an empty tensor of its own does not."""
    ds, path, _ = data
    _, plan, rows, disk = _parts(path, StoreOptions(gpu_rows=ds.num_nodes // 50))
    gpu = GpuTier(rows, disk, "cpu", *load_gpu_table(rows, plan.rank.gpu_bins, disk.file_rows, "cpu"))
    assert gpu.table.untyped_storage().nbytes() == gpu.rows * rows.row_bytes > 0
    gpu.close()
    assert gpu.rows == 0 and gpu.table.untyped_storage().nbytes() == 0 and gpu.own_memory() == {"gpu_cache": 0}


@pytest.mark.parametrize("options,chain", [
    (StoreOptions(gpu_rows=0, cpu_rows=400), ("cpu", "ssd")),  # no GPU tier
    (StoreOptions(gpu_rows=0, cpu_rows=0), ("ssd",)),  # the disk tier alone
    (StoreOptions(gpu_rows=80, cpu_rows=0, shape="block", superbatch=2), ("gpu", "ssd")),  # no CPU tier
    (StoreOptions(gpu_rows=80, cpu_rows=400, policy="lru"), ("gpu", "cpu", "ssd")),
])
def test_a_tier_the_run_does_not_have_is_not_in_the_chain(data, options, chain):
    ds, path, reader = data
    store = open_tiers(path, RANK0, options)  # no process group: never a peer tier
    try:
        info = StoreInfo.of(store)
        assert info.tiers == chain and [t.name for t in store.chain()] == list(chain)
        assert (info.gpu_rows, info.cpu_rows, info.peers) == (options.gpu_rows, options.cpu_rows, False)
        batches = _batches(ds.num_nodes)
        _run(store, reader, batches)
        rows = store.tier_stats()["rows"]
        assert {k for k, v in rows.items() if v} == set(chain) and sum(rows.values()) == sum(b.size for b in batches)
    finally:
        store.close()


class ContractOnly:
    """A real source seen through the feature-source contract only: any other attribute is an error."""

    NAMES = {"submit", "complete", "complete_local", "idle", "cancel", "finish", "tier_stats", "epoch_start", "close"} | set(
        FeatureSource.__annotations__)

    def __init__(self, source):
        self._source = source

    def __getattr__(self, name: str):
        if name not in self.NAMES:
            raise AssertionError(f"{name!r} is not part of the feature-source contract")
        return getattr(self._source, name)


def test_pyg_and_the_pipeline_use_only_the_contract(data):
    from moment.runtime.pyg import PygFeatureStore

    ds, path, reader = data
    store = open_tiers(path, RANK0, StoreOptions(gpu_rows=80, cpu_rows=400, shape="block", superbatch=2))
    try:
        pyg = PygFeatureStore(ContractOnly(store))
        idx = torch.tensor([5, 17, ds.num_nodes - 1, 0])
        assert torch.equal(pyg["node", "x", idx], _want(reader, idx.numpy()))
        assert torch.equal(pyg["node", "x", 2:6], _want(reader, np.arange(2, 6)))
        g = GraphDataset.open(ds.path)
        graph, labels = CSRGraph.from_dataset(g), torch.from_numpy(np.array(g.labels))
        seeds = [torch.arange(i, i + 32) for i in range(0, 320, 32)]
        pipe = Pipeline(graph, [5, 3], ContractOnly(store), labels, torch.device("cpu"))
        done = 0
        for item in pipe.run(seeds, (1, 0, 0)):
            item.wait()
            assert torch.equal(item.x, _want(reader, item.batch.n_id.numpy()))
            done += 1
        assert done == len(seeds)
    finally:
        store.close()


def _inputs(ds, exchange_bytes: int) -> RunInputs:
    n = ds.num_nodes
    return RunInputs(train_nodes=int(np.asarray(ds.train_idx).size), graph_bytes=1 << 20, labels_bytes=n,
                     rows_max=3000, edges_max=20_000, process_bytes=300 << 20, sampler_map_bytes=8 * n,
                     batch_ids_bytes=3000 * 8 + 20_000 * 16, held_batches=4, training_bytes=16 << 20,
                     exchange_bytes=exchange_bytes)


@pytest.mark.parametrize("ranks,peer_tier,charged", [(2, "on", True), (2, "off", False), (1, "on", False),
                                                     (2, "auto", False)])  # auto: off on CPU (TrainConfig.peer_tier_on)
def test_the_budget_charges_a_round_of_the_peer_exchange(data, ranks, peer_tier, charged):
    ds, path, _ = data
    stated = RowExchange.round_bytes(3000, ds.row_bytes, 2)
    assert stated == 2 * 3000 * (ds.row_bytes + 8)  # asks 3000 rows, serves as many to the other rank
    # no member is asked more than its tier holds: 4 members holding 20 rows each ask 60 and serve 60
    assert RowExchange.round_bytes(100, 10, 4, held=20) == (60 + 60) * 18
    cfg = TrainConfig(layout=path, fanouts=[10, 5], batch_size=96, memory_budget="2GiB", peer_tier=peer_tier)
    plans = [resolve_run(cfg, Layout.open(path), world_size=ranks, local_world_size=ranks,
                         inputs=_inputs(ds, e)) for e in (stated, 0)]
    items = {i.name: i.bytes for i in plans[0].memory.items}
    assert plans[0].tiers.peer_tier is charged
    assert items.get("peer exchange", 0) == (stated if charged else 0)
    used = [p.memory.predicted_peak_bytes for p in plans]
    assert used[0] - used[1] == (stated * ranks if charged else 0)  # every local rank holds its round


def test_the_read_pool_lends_destinations_from_one_arena_first_fit():
    """Every destination is a slice of the pool's one arena (its pages faulted in once, never mapped afresh),
    aligned, at the lowest offset with room and never over bytes still lent; a job waits for room (free bytes
    in pieces too small are not room), a stopped wait gives None, an empty one takes nothing, and one larger
    than the pool runs alone."""
    import threading

    from moment.runtime.gather import BufferPool

    pool = BufferPool(4096 * 10, align=4096)
    a = pool.lend(16, 512)  # two blocks
    b = pool.lend(40, 512)  # five
    c = pool.lend(8, 100)  # 800 bytes: one block
    arena = a.base
    assert a.ctypes.data % 4096 == 0 and c.shape == (8, 100)
    assert [x.ctypes.data - a.ctypes.data for x in (b, c)] == [2 * 4096, 7 * 4096] and pool.used == 8 * 4096
    pool.release(b)
    d = pool.lend(24, 512)  # three blocks: where b was
    assert d.ctypes.data == a.ctypes.data + 2 * 4096 and pool.used == 6 * 4096
    stop = threading.Event()
    stop.set()
    assert pool.lend(32, 512, stop) is None  # four blocks free, but two and two
    got = []
    t = threading.Thread(target=lambda: got.append(pool.lend(32, 512)))
    t.start()
    t.join(0.3)
    assert t.is_alive() and not got
    pool.release(c)
    t.join(5)
    assert got and got[0].ctypes.data == a.ctypes.data + 5 * 4096
    assert all(x.base is arena for x in (a, b, c, d, got[0]))
    for x in (a, d, got[0]):
        pool.release(x)
    assert pool.used == 0 and pool.peak <= pool.capacity
    empty = pool.lend(0, 512)  # a batch with no SSD row: no arena bytes, and its release is no one else's
    assert empty.shape == (0, 512) and pool.used == 0
    pool.release(empty)
    big = pool.lend(100, 512)  # over the whole pool: its own buffer, alone
    assert pool.oversize == 1 and not np.shares_memory(big, arena)
    assert pool.lend(1, 512, stop) is None  # nothing else while it is out
    pool.release(big)
    assert pool.used == 0
