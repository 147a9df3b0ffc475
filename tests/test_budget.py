"""Memory budget: the split is stated, fixed needs are charged, too small a budget is refused."""

from __future__ import annotations

import pytest

from moment.caching.tiers import cache_state_bytes
from moment.errors import MomentError
from moment.runtime.budget import REUSE_SHARE, MemoryBudget, RunShape, heap_reuse_want, resolve_budget, split_budget

MiB = 2**20


def _shape(**kw) -> RunShape:
    base = dict(num_nodes=1_000_000, row_bytes=512, graph_bytes=64 * MiB, labels_bytes=MiB, rows_max=50_000,
                training_bytes=40 * MiB, held_batches=4, lookahead=16, sampler_map_bytes=8_000_000,
                batch_ids_bytes=50_000 * 8 + 100_000 * 16, index_bytes=5_000_000, own_gpu_rows=5_000,
                layout_cpu_rows=100_000, cpu_limit_rows=None, policy="static", shape="block",
                staging_bytes=32 * MiB, process_bytes=300 * MiB, agent_bytes=96 * MiB)
    base.update(kw)
    return RunShape(**base)


def test_split_fits_the_budget_and_fills_it():
    total = 2048 * MiB
    s = split_budget(total, "given", 2, _shape())
    b = s.budget
    assert b.used + b.margin <= total  # nothing over the budget
    assert b.free < 2 * MiB or s.cpu_rows == 1_000_000  # the CPU cache took what was left (or everything)
    assert s.cpu_rows > 0 and s.shared_cache and s.buffer_bytes >= 2 * 50_000 * 512
    names = [it.name for it in b.items]
    for need in ("process", "graph structure", "layout index", "sampler", "read buffers", "cpu cache"):
        assert need in names
    assert "memory budget: 2.00 GiB" in b.lines()[0]


def test_on_cuda_the_gpu_tier_the_batches_and_the_step_are_not_charged_to_the_host():
    """They are in device memory (moment.runtime.device_budget); the host holds the pinned ring and upload chunk."""
    cpu = split_budget(2048 * MiB, "given", 2, _shape())
    cuda = split_budget(2048 * MiB, "given", 2, _shape(device="cuda", ring_bytes=64 * MiB, upload_bytes=24 * MiB))
    on_cpu, on_cuda = ({it.name: it.bytes for it in s.budget.items} for s in (cpu, cuda))
    assert cpu.gpu_rows > 0 and on_cpu["gpu cache stand-in"] == cpu.gpu_rows * 512
    assert cuda.gpu_rows == 0 and not {"gpu cache stand-in", "batch features", "training"} & set(on_cuda)
    assert on_cuda["staging ring"] == 64 * MiB and on_cuda["gpu table upload"] == 24 * MiB
    assert cuda.cpu_rows > cpu.cpu_rows  # what they took goes to the CPU cache


def test_packed_reads_keep_freed_memory_before_the_cache_takes_the_rest_but_at_most_half_of_it():
    """Measured (moment.runtime.heap): there keeping freed arrays saved more CPU than the cache's rows it took."""
    want = heap_reuse_want(_shape())
    assert want == 2 * (50_000 * 512 + 40 * MiB)  # two batches' rows and steps
    assert heap_reuse_want(_shape(device="cuda")) == 2 * 50_000 * 512  # the step is on the device
    names = [it.name for it in split_budget(2048 * MiB, "given", 2, _shape(shape="packed")).budget.items]
    assert names.index("read buffers") < names.index("heap reuse") < names.index("cpu cache")
    assert split_budget(4096 * MiB, "given", 2, _shape(shape="packed")).heap_reuse_bytes == want  # where there is room
    least = split_budget(1500 * MiB, "given", 2, _shape(shape="packed"))  # half would not hold a batch's rows
    assert least.heap_reuse_bytes == 0 and any(it.name == "heap reuse" and "too little" in it.note
                                               for it in least.budget.items)
    for total in (1700, 1850, 2048):  # tight: half of what the read buffers leave, the cache the rest
        s = split_budget(total * MiB, "given", 2, _shape(shape="packed"))
        assert 0 < s.heap_reuse_bytes < want and s.cpu_rows > 0
        b = s.budget
        at = [it.name for it in b.items].index("heap reuse")
        # what was charged before it (the policy's state as it was then: for no cached row; the cache adds its rows')
        before = sum(b._machine(it) for it in b.items[:at] if it.name != "cache policy state")
        left = total * MiB - b.margin - before - 2 * cache_state_bytes("static", 1_000_000, 0)
        assert b._machine(b.items[at]) == pytest.approx(REUSE_SHARE * left, abs=MiB)
        assert b.used + b.margin <= total * MiB
    assert split_budget(None, "none", 2, _shape(shape="packed")).heap_reuse_bytes == want  # unbounded: accounted


@pytest.mark.parametrize("how", [dict(shape="block"), dict(shape="rows"), dict(shape="packed", model_step=False),
                                 dict(shape="packed", device="cuda")], ids=["block", "rows", "data-only", "cuda"])
def test_other_runs_keep_freed_memory_only_where_the_cache_leaves_room(how):
    """Rows and block reads pay per request for each row the cache does not hold; without a step on the CPU
    (data only, or on a GPU) the cores are the reads': the cache comes first."""
    want = heap_reuse_want(_shape(**how))
    assert want == 2 * 50_000 * 512 + (2 * 40 * MiB if how.get("shape") != "packed" else 0)
    tight = split_budget(1800 * MiB, "given", 2, _shape(**how))
    names = [it.name for it in tight.budget.items]
    assert names.index("cpu cache") < names.index("heap reuse") and tight.heap_reuse_bytes == 0
    capped = split_budget(1800 * MiB, "given", 2, _shape(**how, cpu_limit_rows=10_000))  # the cache is satisfied
    assert capped.cpu_rows == 10_000 and capped.heap_reuse_bytes == want
    assert split_budget(None, "none", 2, _shape(**how)).heap_reuse_bytes == want


def test_a_store_alone_keeps_no_heap():
    """Only a run starts the keeper (moment.runtime.heap): a store's split charges nothing for it."""
    s = split_budget(4096 * MiB, "given", 2, _shape(shape="packed"), what="this store", heap=False)
    assert s.heap_reuse_bytes == 0 and "heap reuse" not in [it.name for it in s.budget.items]


def test_per_rank_items_count_once_per_rank():
    one = split_budget(2048 * MiB, "given", 1, _shape(policy="lru"))
    two = split_budget(2048 * MiB, "given", 2, _shape(policy="lru"))
    assert not two.shared_cache  # a changing cache is per rank
    assert two.cpu_rows < one.cpu_rows
    proc = next(it for it in two.budget.items if it.name == "process")
    assert two.budget._machine(proc) == 2 * proc.bytes


def test_too_small_is_refused_with_the_minimum():
    with pytest.raises(MomentError, match=r"below the minimum .* needs") as e:
        split_budget(512 * MiB, "given", 2, _shape())
    assert "--memory-budget" in str(e.value) and "MiB" in str(e.value)


def test_unbounded_uses_the_layout_cpu_bins_or_the_limit():
    assert split_budget(None, "none", 1, _shape()).cpu_rows == 100_000
    assert split_budget(None, "none", 1, _shape(cpu_limit_rows=7)).cpu_rows == 7
    assert split_budget(3 << 30, "given", 1, _shape(cpu_limit_rows=7)).cpu_rows == 7


def test_resolve_budget():
    assert resolve_budget(None)[0] is None
    assert resolve_budget("3GiB")[0] == 3 << 30
    v, how = resolve_budget("auto")
    assert v > 0 and how.startswith("auto")
    for bad in ("0", "lots", "-1GiB"):
        with pytest.raises(MomentError):
            resolve_budget(bad)


def test_grant_never_exceeds_free():
    b = MemoryBudget(1000 * MiB, 2)
    b.charge("x", 100 * MiB)
    got = b.grant("y", 1 << 40)
    assert got * 2 + 200 * MiB + b.margin <= 1000 * MiB


def test_measured_peak_counts_what_processes_share_once():
    """As a cgroup charges: pages a forked child still shares with its parent (as a rank with torchrun's agent),
    and a /dev/shm segment both map, are held once; each process's own pages and what it held above its end
    are its own; the busiest machine of several."""
    import mmap
    import os
    from pathlib import Path

    from moment.runtime.budget import process_sizes
    from moment.runtime.memory_use import _footprint, machine_peak, rank_sample, reset_peak

    if not Path("/proc/self/smaps_rollup").is_file():
        pytest.skip("no /proc/PID/smaps_rollup (Linux 4.14+) on this machine")
    seg = Path("/dev/shm") / f"moment-test-{os.getpid()}"
    seg.write_bytes(bytes(32 * MiB))
    with open(seg, "r+b") as f:
        m = mmap.mmap(f.fileno(), 32 * MiB)
    seg.unlink()  # mapped and unlinked, as the runtime leaves its segments
    heap = bytearray(64 * MiB)
    for i in range(0, len(heap), 4096):  # resident, written: the parent's heap, which the child shares after fork
        heap[i] = m[i % (32 * MiB)] = 1
    (ready, told), (wait, go) = os.pipe(), os.pipe()
    reset_peak()
    pid = os.fork()
    if pid == 0:  # the child: the shared pages, then 16 MiB of its own
        mine = bytearray(16 * MiB)
        for i in range(0, len(mine), 4096):
            mine[i] = 1
        os.write(told, b"1")
        os.read(wait, 1)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"1"
        parent, child = _footprint("self"), _footprint(pid)
        child_own, child_shared = process_sizes(pid)
        own, shared = process_sizes()
        rss = own + shared
    finally:
        os.write(go, b"x")
        os.waitpid(pid, 0)
        m.close()
        for fd in (ready, told, wait, go):
            os.close(fd)
    assert 14 * MiB <= child_own <= 24 * MiB and child_shared >= 96 * MiB, (child_own >> 20, child_shared >> 20)
    # the child as a rank, the parent as its agent: the heap and the segment once, the child's 16 MiB its own
    got = machine_peak([{"self": child, "agent": parent}], 1)
    assert rss + 14 * MiB <= got["bytes"] <= rss + 24 * MiB + own, (got, rss >> 20)
    assert got["shared"] >= 96 * MiB and got["bytes"] < parent["peak"] + child["peak"] - 96 * MiB
    mine = rank_sample(with_agent=True)
    assert mine["self"]["shared"] <= mine["self"]["peak"] and mine["agent"]["peak"] > 0
    a = {"self": {"peak": 300 * MiB, "shared": 100 * MiB}, "agent": {"peak": 310 * MiB, "shared": 280 * MiB}}
    b = {"self": {"peak": 200 * MiB, "shared": 90 * MiB}, "agent": None, "batches": 40 * MiB}
    assert machine_peak([a, b], 2) == {"bytes": 200 * MiB + 110 * MiB + 30 * MiB + 280 * MiB, "ranks": 310 * MiB,
                                       "agent": 30 * MiB, "shared": 280 * MiB, "batch_buffers": 40 * MiB}
    big = {"self": {"peak": 500 * MiB, "shared": 0}, "agent": None}
    assert machine_peak([a, b, big, big], 2)["bytes"] == 1000 * MiB  # per machine: the busiest one
