"""Tiered feature store: bit-exact on every tier, PyG FeatureStore interface, damaged layouts."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import oscheck
import pytest
import torch
from runtime_data import make_dataset, make_layout

from moment.errors import MomentError
from moment.placement import verify_layout
from moment.placement.reader import load_manifest, shard_path
from moment.runtime.sources import InMemoryFeatures, MemmapFeatures
from moment.runtime.cpu_tier import CpuTier
from moment.runtime.disk_tier import DiskTier
from moment.runtime.gpu_tier import GpuTier
from moment.runtime.run_plan import plan_store
from moment.runtime.store import TIERS, RankPlace, StoreOptions, open_tiers
from moment.sizes import parse_size

ONE = RankPlace(local_world_size=1)  # a single process on its node


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    ds = make_dataset(root)
    feats = np.load(ds.file("features"))
    packed = make_layout(ds, root / "packed")  # 128-B rows packed 32 to a 4-KiB block
    padded = make_layout(ds, root / "padded", align=512, row_mode="pad")  # one 512-B slot per row
    return root, ds, feats, {"pack": packed, "pad": padded}


POLICIES = ("static", "lru", "belady-superbatch")


@pytest.mark.parametrize("mode", ["pack", "pad"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape,superbatch", [("rows", 1), ("block", 4), ("rows", 3)])
def test_every_tier_policy_and_shape_bit_exact(data, mode, policy, shape, superbatch):
    _, ds, feats, layouts = data
    n = ds.num_nodes
    # local rank 0 of 2 owns gpu0 (capped), a small CPU cache, the rest from disk; batches submitted
    # ahead of their completion, as the pipeline does
    store = open_tiers(layouts[mode], RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=n // 20, gpu_rows=n // 50, policy=policy, shape=shape,
                                    superbatch=superbatch, buffer_bytes=64 << 10))
    rng = np.random.default_rng(7)
    batches = [rng.choice(n, size=int(rng.integers(50, 700)), replace=False) for _ in range(12)]
    batches.append(np.arange(n)[::-1].copy())  # every node once, in reverse
    batches.append(rng.integers(0, n, 900))  # repeats inside a batch
    pend = []
    for b in batches:
        pend.append((b, store.submit(torch.from_numpy(b))))
        if len(pend) > store.lookahead:
            b0, p0 = pend.pop(0)
            assert torch.equal(store.complete(p0), torch.from_numpy(feats[b0]))
    for b0, p0 in pend:
        assert torch.equal(store.complete(p0), torch.from_numpy(feats[b0]))
    st = store.tier_stats()
    assert all(st["rows"][t] > 0 for t in TIERS if t not in ("peer", "remote")), st["rows"]
    assert st["rows"]["peer"] == 0  # no process group: no peers (tests/test_peers.py has them)
    assert sum(st["rows"].values()) == sum(b.size for b in batches)
    assert st["bytes"]["ssd"] == st["rows"]["ssd"] * ds.row_bytes and st["ssd_bytes_read"] > 0
    if policy == "lru" or (policy != "static" and superbatch > 1):  # Belady admits what it knows is reused
        assert st["cpu_admitted_rows"] > 0
    assert store.find(DiskTier).pool.used == 0  # every read buffer went back
    store.close()


def test_submit_complete_interleaved(data):
    _, ds, feats, layouts = data
    store = open_tiers(layouts["pack"], ONE)
    rng = np.random.default_rng(5)
    a, b = rng.permutation(ds.num_nodes)[:700], rng.permutation(ds.num_nodes)[:900]
    pa, pb = store.submit(a), store.submit(b)
    assert torch.equal(store.complete(pb), torch.from_numpy(feats[b]))
    assert torch.equal(store.complete(pa), torch.from_numpy(feats[a]))
    assert store.gather(np.array([], dtype=np.int64)).shape == (0, ds.feature_dim)
    with pytest.raises(MomentError, match="node ids"):
        store.gather([ds.num_nodes])
    store.close()


def test_baseline_sources_match(data):
    _, ds, feats, _ = data
    ids = torch.from_numpy(np.random.default_rng(1).permutation(ds.num_nodes)[:500])
    other = torch.from_numpy(np.random.default_rng(2).permutation(ds.num_nodes)[:500])
    for src in (InMemoryFeatures(ds.file("features")), MemmapFeatures(ds.file("features"), drop_cache=True)):
        src.epoch_start(0)
        x = src.gather(ids)
        assert torch.equal(x, torch.from_numpy(feats[ids.numpy()]))
        y = src.gather(other)  # while x is held, its buffer is not the next batch's
        assert torch.equal(x, torch.from_numpy(feats[ids.numpy()])) and torch.equal(y, torch.from_numpy(feats[other.numpy()]))
        ptr = x.data_ptr()
        del x, y
        assert src.gather(ids[:400]).data_ptr() == ptr  # then it is reused (moment.io.device.HostBatches)


@pytest.mark.parametrize("kind", ["tiered", "memory"])
def test_pyg_feature_store_interface(data, kind):
    """Any feature source behind PyG's FeatureStore, through the pipeline's submit/complete calls."""
    from torch_geometric.data import FeatureStore, TensorAttr

    from moment.runtime.pyg import PygFeatureStore

    _, ds, feats, layouts = data
    source = (open_tiers(layouts["pad"], ONE) if kind == "tiered"
              else InMemoryFeatures(ds.file("features")))
    store = PygFeatureStore(source)
    assert isinstance(store, FeatureStore)
    idx = torch.tensor([5, 17, 3999, 0])
    assert torch.equal(store["node", "x", idx], torch.from_numpy(feats[idx.numpy()]))
    assert torch.equal(store.get_tensor(group_name="node", attr_name="x", index=idx), store["node", "x", idx])
    assert torch.equal(store["node"].x[idx], store["node", "x", idx])  # partial key -> view
    assert torch.equal(store["node", "x", 2:6], torch.from_numpy(feats[2:6]))
    assert store.get_tensor_size(TensorAttr("node", "x")) == (ds.num_nodes, ds.feature_dim)
    assert store.get_all_tensor_attrs() == [TensorAttr("node", "x")]
    with pytest.raises(MomentError, match="read-only"):
        store["node", "x", idx] = torch.zeros(4, ds.feature_dim)
    with pytest.raises(MomentError, match="read-only"):
        store.remove_tensor(TensorAttr("node", "x", idx))
    with pytest.raises(KeyError):
        store["paper", "x", idx]
    with pytest.raises(MomentError, match="node ids"):
        store["node", "x", torch.tensor([ds.num_nodes])]
    source.close()


def test_missing_and_truncated_shards(data, tmp_path):
    _, ds, _, _ = data
    ssd = [str(tmp_path / "ssd0"), str(tmp_path / "ssd1")]
    for p in ssd:
        os.mkdir(p)
    path = make_layout(ds, tmp_path / "L", ssd_paths=ssd)
    shards = [shard_path(path, s) for s in load_manifest(path).shards if s.kind == "ssd"]
    # short read: the shard shrinks under a running store
    store = open_tiers(path, ONE, StoreOptions(cpu_rows=0))
    ids = np.arange(ds.num_nodes)
    rows = store.layout_rows
    on = rows.bin == next(i for i, s in enumerate(rows.manifest.shards) if s.kind == "ssd")
    os.truncate(shards[0], 4096)
    with pytest.raises(MomentError, match="short read"):
        store.gather(ids[on])
    store.close()
    with pytest.raises(MomentError, match="size"):  # refused at open
        open_tiers(path, ONE)
    shards[1].unlink()
    with pytest.raises(MomentError, match="missing"):
        open_tiers(path, ONE)


def test_checksum_mismatch_is_caught(data, tmp_path):
    _, ds, feats, _ = data
    path = make_layout(ds, tmp_path / "L")
    probe = open_tiers(path, ONE, StoreOptions(cpu_rows=0))
    ids = np.arange(ds.num_nodes)
    rows = probe.layout_rows
    kinds = np.array([sh.kind for sh in rows.manifest.shards])
    victim = int(np.flatnonzero(kinds[rows.bin] == "ssd")[7])
    s = rows.manifest.shards[int(rows.bin[victim])]
    off = int(rows.slot[victim]) * s.stride + 5
    probe.close()
    with open(shard_path(path, s), "r+b") as f:
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0x40]))
    assert not verify_layout(path).ok
    plain = open_tiers(path, ONE, StoreOptions(cpu_rows=0))
    assert not torch.equal(plain.gather([victim]), torch.from_numpy(feats[[victim]]))  # verify off: raw bytes
    plain.close()
    checked = open_tiers(path, ONE, StoreOptions(verify=True, cpu_rows=0))
    good = np.setdiff1d(ids, [victim])[:10]
    with pytest.raises(MomentError, match=f"bin {s.bin}: checksum mismatch in chunk {off // s.chunk_bytes}"):
        checked.gather(np.concatenate([good, [victim]]))
    checked.close()


def test_parse_size():
    assert parse_size("10%", 1000) == 100
    assert parse_size("2KiB", 0) == 2048 and parse_size("3MB", 0) == 3_000_000 and parse_size("77", 0) == 77
    assert parse_size(None, 5) is None
    with pytest.raises(MomentError):
        parse_size("lots", 1)
    # an exponent, as place's --gpu-cache reads one; past a float's range the largest float, never an OverflowError
    assert parse_size("1e3", 0) == 1000 and parse_size("1.5e1KiB", 0) == 15 * 1024 and parse_size("5e1%", 10) == 5
    assert parse_size("9" * 400, 0) == parse_size("1e400GiB", 0) == int(sys.float_info.max)
    for bad in ("1e", "e3", "nan", "inf", "1.2.3"):
        with pytest.raises(MomentError):
            parse_size(bad, 1)


def test_o_direct_is_used(data, tmp_path):
    """Where the filesystem takes O_DIRECT, every shard descriptor the reader opened carries the flag
    (the kernel's fdinfo, not the stack's own `direct` attribute) and reading every SSD row leaves none
    of the shards' pages in the page cache."""
    _, ds, feats, _ = data
    if why := oscheck.direct_refused(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT ({why}): the reader falls back to buffered reads")
    path = make_layout(ds, tmp_path / "L")
    store = open_tiers(path, ONE, StoreOptions(cpu_rows=0))  # no CPU cache: SSD rows come from disk
    try:
        disk = store.find(DiskTier)
        kinds = [s.kind for s in disk.manifest.shards]
        ssd_files = [p for p, k in zip(disk.paths, kinds) if k == "ssd"]
        for f in ssd_files:
            oscheck.drop_cached(f)
        droppable = all(oscheck.cached_pages(f) == 0 for f in ssd_files)  # not on a memory filesystem
        on_ssd = np.flatnonzero(np.array(kinds)[store.layout_rows.bin] == "ssd")
        assert torch.equal(store.gather(on_ssd), torch.from_numpy(feats[on_ssd]))
        assert store.tier_stats()["rows"]["ssd"] == on_ssd.size
        files = disk.stack.files
        opened = [int(fd) for fd, k in zip(files.fds, kinds) if k == "ssd" and fd >= 0]
        assert len(opened) == len(ssd_files), files.fds
        assert disk.stack.direct, files.fallback_reason
        assert all(oscheck.open_flags(fd) & oscheck.O_DIRECT for fd in opened), \
            [oct(oscheck.open_flags(fd)) for fd in opened]
        if droppable:
            assert [oscheck.cached_pages(f) for f in ssd_files] == [0] * len(ssd_files)
    finally:
        store.close()


def test_shared_segment_is_unlinked_and_stale_ones_are_removed(tmp_path):
    import subprocess
    import sys

    from moment.runtime import hostcache

    if hostcache.shm_room(1 << 20):
        pytest.skip(hostcache.shm_room(1 << 20))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = hostcache.SHM / f"{hostcache.PREFIX}testkey-{dead}"
    stale.write_bytes(b"x")  # left by a creator that died before unlinking
    filled = []
    c = hostcache.HostCache.shared_segment("unit", 10, 16, creator=True,
                                           fill=lambda rows: (rows.fill(7), filled.append(1)), barrier=lambda: None)
    assert not stale.exists() and filled and (c.rows == 7).all()
    assert not list(hostcache.SHM.glob(f"{hostcache.PREFIX}unit-*"))  # unlinked once mapped
    c.close()


def _mapped_kib(path_part: str, perms: str) -> int:
    """Resident KiB of this process's mapping whose file name contains `path_part` and whose permissions are
    `perms` (/proc/self/smaps)."""
    from pathlib import Path

    header = re.compile(r"[0-9a-f]+-[0-9a-f]+ ")  # every mapping's first line, anonymous ones (5 fields) too
    found, rss = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if header.match(line):
            found = path_part in line and head[1] == perms
        elif found and line.startswith("Rss:"):
            rss += int(head[1])
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps (Linux)")
def test_every_rank_maps_the_shared_segment_with_its_pages_present():
    """A rank that maps the segment has every page in its page tables before it reads a row: a random row's copy
    that faults its page in cost 2.5x one that does not, for the whole first epoch (the 8M bench)."""
    from moment.runtime import hostcache

    size = 4 << 20
    if hostcache.shm_room(size):
        pytest.skip(hostcache.shm_room(size))
    other: list = []

    def barrier():  # the other local rank maps it once the creator has published it
        if not other:
            other.append(hostcache.HostCache.shared_segment("populate", size // 64, 64, creator=False,
                                                            fill=lambda rows: None, barrier=lambda: None))

    c = hostcache.HostCache.shared_segment("populate", size // 64, 64, creator=True, fill=lambda rows: rows.fill(3),
                                           barrier=barrier)
    try:
        assert _mapped_kib(f"{hostcache.PREFIX}populate-", "r--s") == size // 1024  # present, none of it read yet
        assert (other[0].rows == 3).all()
    finally:
        other[0].close()
        c.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the pinned staging path)")
@pytest.mark.parametrize("shape", ["rows", "block"])
def test_cuda_rows_arrive_bit_exact_through_pinned_staging(data, shape):
    """On CUDA the store assembles rows in pinned buffers and copies them on a side stream; the GPU
    stand-in tier lives on the device. Batches completed out of order must still be exact."""
    _, ds, feats, layouts = data
    n = ds.num_nodes
    store = open_tiers(layouts["pack"], RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2,
                                                  device="cuda"),
                       StoreOptions(cpu_rows=n // 20, shape=shape, superbatch=4))
    try:
        rng = np.random.default_rng(11)
        batches = [rng.choice(n, size=int(rng.integers(50, 900)), replace=False) for _ in range(8)]
        pend = [(b, store.submit(torch.from_numpy(b))) for b in batches[: store.lookahead]]
        outs = [(b, store.complete(p)) for b, p in reversed(pend)]
        for b in batches[store.lookahead:]:
            outs.append((b, store.gather(b)))
        torch.cuda.synchronize()
        for b, t in outs:
            assert t.device.type == "cuda"
            assert torch.equal(t.cpu(), torch.from_numpy(feats[b]))
    finally:
        store.close()


def test_options_refuse_unknown_shape_and_policy():
    with pytest.raises(MomentError, match=r"I/O shape 'bogus': choose one of rows, block"):
        StoreOptions(shape="bogus")
    with pytest.raises(MomentError, match=r"unknown cache policy 'mru': choose one of static, lru"):
        StoreOptions(policy="mru")


def test_a_dist_context_places_the_store(data):
    from moment.runtime.dist import DistContext

    _, ds, feats, layouts = data
    ctx = DistContext(rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"),
                      backend=None)
    store = open_tiers(layouts["pack"], ctx, StoreOptions(cpu_rows=ds.num_nodes // 10))
    try:
        ids = np.arange(0, ds.num_nodes, 7)
        assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))
        assert store.find(DiskTier).rank == 0 and not store.find(CpuTier).shared
    finally:
        store.close()


def test_a_store_given_no_sizes_is_out_of_core_as_the_layout_planned(data):
    """`open_tiers(layout)` holds the layout's CPU bins in RAM (here a tenth of the rows), never every row:
    one pass over every node finds each of them once on its planned tier, the rest on the SSDs."""
    from moment.placement.opened import Layout

    _, ds, feats, layouts = data
    n, lay = ds.num_nodes, Layout.open(layouts["pack"])
    assert 0 < lay.cpu_bin_rows == n // 10
    store = open_tiers(lay)  # one process: both GPU bins on its GPU tier
    try:
        cpu, gpu = store.find(CpuTier), store.find(GpuTier)
        assert cpu.capacity == lay.cpu_bin_rows and store.memory()["cpu_cache"] == lay.cpu_bin_rows * lay.row_bytes
        ids = np.random.default_rng(3).permutation(n)
        assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))
        rows = store.tier_stats()["rows"]
        assert (rows["gpu"], rows["cpu"], rows["ssd"]) == (gpu.rows, lay.cpu_bin_rows, n - gpu.rows - lay.cpu_bin_rows)
    finally:
        store.close()
    assert plan_store(lay, ONE, StoreOptions(), None).tiers.cpu_rows == lay.cpu_bin_rows
    assert plan_store(lay, ONE, StoreOptions(cpu_rows=n), None).tiers.cpu_rows == n  # every row, when asked


def test_a_memory_budget_sizes_the_store_as_a_run_sizes_its_cache(data, monkeypatch):
    """`StoreOptions(memory_budget=...)` is split by the trainer's rule: this process (measured; fixed here)
    and the store's fixed needs first, the GPU stand-in at most a tenth of the rest, the CPU cache what is
    left; a larger budget caches more, up to every row, and one below the fixed needs is refused."""
    import moment.runtime.run_plan as rp
    from moment.placement.opened import Layout
    from moment.io.device import HostBatches
    from moment.runtime.gather import staging_bytes

    _, ds, feats, layouts = data
    n, lay = ds.num_nodes, Layout.open(layouts["pack"])
    budget = 512 << 20  # its margin is 64 MiB
    # the staging, the least read buffers (two batches), the spare batch buffer a CPU store keeps, the index
    batches = 2 + HostBatches.SPARE
    fixed = staging_bytes(lay.manifest.row.align) + batches * rp.default_batch_rows(n) * lay.row_bytes + lay.index_bytes
    monkeypatch.setattr(rp, "process_sizes", lambda: (budget - (64 << 20) - fixed - (200 << 10), 0))  # ~200 KiB left
    tight = plan_store(lay, ONE, StoreOptions(memory_budget=budget), None)
    mem = tight.memory
    assert mem.budget_bytes == budget and mem.predicted_peak_bytes <= budget - mem.margin
    assert 0 < tight.tiers.cpu_rows == mem.cpu_rows < n and tight.rank.gpu_rows == mem.gpu_rows
    assert tight.tiers.buffer_bytes == mem.buffer_bytes
    store = open_tiers(lay, ONE, tight)
    try:
        assert store.find(CpuTier).capacity == tight.tiers.cpu_rows
        ids = np.arange(n)
        assert torch.equal(store.gather(ids), torch.from_numpy(feats[ids]))
        assert store.tier_stats()["rows"]["ssd"] == n - tight.tiers.cpu_rows - tight.rank.gpu_rows
    finally:
        store.close()
    roomy = plan_store(lay, ONE, StoreOptions(memory_budget=budget + (1 << 20)), None)
    assert roomy.tiers.cpu_rows > tight.tiers.cpu_rows
    capped = plan_store(lay, ONE, StoreOptions(memory_budget=budget + (1 << 20), cpu_rows=100), None)
    assert capped.tiers.cpu_rows == 100  # cpu_rows: the most the budget may grant
    monkeypatch.setattr(rp, "process_sizes", lambda: (100 << 20, 0))
    assert plan_store(lay, ONE, StoreOptions(memory_budget=budget), None).tiers.cpu_rows == n
    with pytest.raises(MomentError, match="is below the minimum .* this store needs"):
        open_tiers(lay, ONE, StoreOptions(memory_budget=budget // 4))
    with pytest.raises(MomentError, match="--memory-budget lots"):
        open_tiers(lay, ONE, StoreOptions(memory_budget="lots"))
