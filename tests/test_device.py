"""The device layer (moment.io.device): its CUDA side where CUDA exists, and the same calls as no-ops on CPU.

The CUDA tests check the stream rules the runtime depends on and no CPU run can see: a batch made on the
pipeline's stream and used on the trainer's must not have its memory handed out again while the trainer's
kernels still read it (`Prepared.wait` records the consumer's stream), and a staging buffer is refilled
only after its copy to the device is done.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fake_device import FakeCudaLayer

from moment.errors import MomentError
from moment.io.device import (DeviceLayer, DeviceStaging, HostBatches, StagingRing, index_rows, ring_bytes, slot_bytes,
                              take_rows)
from moment.runtime.pipeline import Prepared
from moment.workload.sampler import Block

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the device layer's CUDA side)")
SLEEP_CYCLES = 2_000_000_000  # torch.cuda._sleep: about a second of GPU time, far longer than the host's next steps


def _prepared(dev: DeviceLayer, made_on, n: int = 1 << 20) -> Prepared:
    """A batch as the pipeline makes it: its tensors allocated on `made_on`, an event recorded after them."""
    with dev.on(made_on):
        x = torch.ones(n, device=dev.device)
        y = torch.zeros(4, dtype=torch.int64, device=dev.device)
        blocks = [Block(torch.zeros(2, 3, dtype=torch.int64, device=dev.device), 3, 2)]
        ready = dev.event(made_on)
    return Prepared(0, None, x, y, blocks, ready, dev)


# ---------------------------------------------------------------- CPU: the same calls, no-ops


def test_cuda_counts_as_started_once_a_tensor_is_made_there(monkeypatch):
    """What the torchrun agent asks before it forks its ranks: without torch loaded CUDA cannot have started;
    CPU tensors do not start it; a CUDA tensor does (where CUDA exists)."""
    from moment.io.device import cuda_started

    with monkeypatch.context() as m:
        m.delitem(sys.modules, "torch")
        assert cuda_started() is False
    torch.ones(4).sum()
    if not torch.cuda.is_available():
        assert cuda_started() is False
    else:
        torch.ones(4, device="cuda").sum()
        assert cuda_started() is True


def test_cpu_layer_calls_are_no_ops():
    dev = DeviceLayer("cpu")
    assert not dev.cuda and not dev.copies
    assert dev.new_stream() is None and dev.event() is None
    t = torch.arange(5)
    assert dev.to_device(t) is t  # the batch is the host buffer itself
    with dev.on(None):
        dev.wait_event(None)
        dev.wait_stream(None)
        dev.used_here(t)
        dev.synchronize(None)
    assert not dev.host_buffer(16).is_pinned()
    assert dev.memory() is None and dev.peak_reserved() is None  # no device memory to budget or measure
    dev.reset_peak()
    item = _prepared(dev, None)
    item.wait()  # what the trainer calls before every step: nothing to wait for on CPU
    assert item.x.sum() == 1 << 20


def test_cpu_staging_never_hands_out_a_buffer_a_batch_still_uses():
    """On CPU the batch is its staging buffer (no copy), so the ring gives every batch its own buffer."""
    ring = StagingRing("cpu", 64, slots=2)
    batches = []
    for k in range(3):  # one more than the ring's slots
        stage = ring.take(64)
        stage.array[:64] = k
        batches.append(stage.to_device(64))
    assert [int(b[0]) for b in batches] == [0, 1, 2] and all(int(b.sum()) == 64 * k for k, b in enumerate(batches))
    assert ring.nbytes() == 0 and ring.stream is None  # no slots, no copy stream


def test_cpu_batch_buffers_are_reused_only_once_nothing_uses_them():
    """A CPU batch's buffer goes to a later batch once every tensor and view on it is gone, never before; a
    buffer too small for the next batch, and free ones besides the one taken, are given back."""
    ring = StagingRing("cpu", 1 << 20, slots=2)
    first = ring.take(4096).to_device(4096).view(64, 64)
    first[:] = 7
    kept = first[3:5]  # a view outlives the batch tensor
    del first
    second = ring.take(4096).to_device(4096)
    second[:] = 9
    assert int(kept.sum()) == 7 * 128 and ring.batches.reused == 0
    ptr = kept.data_ptr() - 3 * 64
    del kept
    again = ring.take(4000).to_device(4000)
    assert again.data_ptr() == ptr and ring.batches.reused == 1  # the smallest free buffer that holds it
    del again, second
    bigger = ring.take(8192).to_device(8192)  # neither free buffer holds it: a new one made
    assert ring.batches.reused == 1 and bigger.numel() == 8192
    # two batches were alive at once: the free buffers are kept for the next, up to those two and the spare
    assert sorted(b.nbytes for b in ring.batches._bufs) == [4096 + 1024, 4096 + 1024, 8192 + 2048]


def test_cpu_batch_buffers_follow_the_batches_alive_as_they_rise_and_fall():
    """A pipeline's batches alive rise and fall (the trainer frees a few at once): after the first rise every
    batch gets a kept buffer, none a fresh mapping; once fewer are alive for `track` takes, the buffers held
    fall to those and the spare."""
    pool = HostBatches(track=8)
    alive = []
    for i in range(40):
        alive.append(pool.take(1000 + 7 * (i % 5)))  # sizes vary a little, within the quarter more
        if len(alive) == 4:
            del alive[:3]
    assert 40 - pool.reused == 4 and len(pool._bufs) == 4  # four alive at most at once: four made, no more
    alive.clear()
    for _ in range(10):
        pool.take(1000)
    assert len(pool._bufs) == 1 + HostBatches.SPARE and pool.reused == 36 + 10
    ring = StagingRing("cpu", 3000, slots=2)  # a batch's buffer is at most the extent the budget charges
    ring.take(2900)
    assert [b.nbytes for b in ring.batches._bufs] == [3000]

    pool = HostBatches(track=3)
    held = [torch.from_numpy(pool.take(100)) for _ in range(5)]  # a caller keeps every batch
    assert len(pool._bufs) == 3 and len({t.data_ptr() for t in held}) == 5
    assert pool.take(100, most=110).base.nbytes == 110  # a quarter more, at most `most`
    del held
    assert pool.take(100).base.nbytes == 125 and pool.reused == 1


def test_a_slot_is_the_power_of_two_at_or_above_the_extent():
    """What PyTorch's pinned allocator hands out for a request anyway: asking it exactly, the charge is the block."""
    assert [slot_bytes(x) for x in (0, 1, 2, 3, 1000, 1024, 1025, (3 << 20) + 1)] == [1, 1, 2, 4, 1024, 1024, 2048, 4 << 20]
    rng = np.random.default_rng(0)
    for x in rng.integers(1, 1 << 40, 200).tolist():
        s = slot_bytes(x)
        assert s & (s - 1) == 0 and x <= s < 2 * x
    assert ring_bytes(3000) == 2 * 4096 and ring_bytes(3000, slots=3) == 3 * 4096


def test_the_ring_allocates_its_slots_once_and_never_again():
    """Batches of every size up to the slot go through the same slots (no slot grows and strands a pinned
    block), what the ring holds is what `ring_bytes` charges, and a batch larger than a slot is refused."""
    dev = FakeCudaLayer()
    ring = StagingRing(dev, 3000, slots=2)
    slots = [b.host for b in ring.bufs]
    assert [t.numel() for t in dev.pinned] == [4096, 4096] and dev.pinned_bytes() == ring.nbytes() == ring_bytes(3000)
    rng = np.random.default_rng(1)
    for i, n in enumerate([100, 3000, 1, 4096, 2500, 7, 4096, 3999]):
        stage = ring.take(n)
        assert stage.host is slots[i % 2]
        data = torch.from_numpy(rng.integers(0, 256, n, dtype=np.uint8))
        stage.array[:n] = data.numpy()
        assert torch.equal(stage.to_device(n), data)
    assert len(dev.pinned) == 2 and [b.host for b in ring.bufs] == slots
    with pytest.raises(MomentError, match=r"a batch of 4,097 B does not fit the staging slots of 4,096 B"):
        ring.take(4097)


def test_one_copy_stream_per_ring_and_batches_allocated_on_the_callers_stream():
    """The slots share the ring's one copy stream (a stream per buffer strands the device blocks freed on it);
    each device batch is allocated on the caller's stream (the pipeline's: its memory returns to that
    stream's pool), the copy stream waits for the caller's work before copying into it, the copy runs on
    the copy stream and the caller waits for it before using the batch."""
    dev = FakeCudaLayer()
    ring = StagingRing(dev, 1 << 12, slots=3)
    assert dev.streams == ["stream 0"] and {b.stream for b in ring.bufs} == {"stream 0"}
    for n in (10, 4096, 5):
        with dev.on("pipeline"):
            stage = ring.take(n)
            stage.array[:n] = 1
            dev.log.clear()
            stage.to_device(n)
        assert dev.log == [("alloc", "pipeline"), ("wait", "stream 0", "pipeline"), ("copy", "stream 0"),
                           ("wait", "pipeline", "stream 0")]
    assert dev.streams == ["stream 0"]


def test_cuda_device_without_cuda_is_one_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(MomentError, match="CUDA is not available"):
        DeviceLayer("cuda")


def test_a_bare_cuda_device_is_the_callers_current_one(monkeypatch):
    """`torch.cuda.set_device` refuses a device without an index, so a thread bound to a bare "cuda" died
    before its loop and a store for it hung (the first GPU run): the layer names the caller's current device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert DeviceLayer("cuda").device == torch.device("cuda", 1)
    assert DeviceLayer("cuda:0").device == torch.device("cuda", 0)


def test_a_thread_that_cannot_take_its_device_fails_where_it_is_started(monkeypatch):
    """Not a hang: the starting thread gets the error, naming the thread and the device, and the target never runs."""
    from moment.runtime.threads import start_thread

    def bind(self):
        raise RuntimeError("CUDA error: invalid device ordinal")

    monkeypatch.setattr(DeviceLayer, "bind", bind)
    ran = []
    with pytest.raises(MomentError, match="moment-reader could not take device cpu: CUDA error: invalid device"):
        start_thread(lambda: ran.append(1), "moment-reader", "cpu")
    assert not ran


# ---------------------------------------------------------------- CUDA


@cuda
def test_cuda_consumer_stream_is_recorded_before_a_batch_is_freed():
    """Freed while the trainer's stream still has work reading it, the batch's memory must not go to the
    next allocation on the pipeline's stream (before the fix, `Prepared.wait` did not record the trainer's
    stream, and the allocator handed the same block out at once)."""
    dev = DeviceLayer("cuda")
    side = dev.new_stream()
    item = _prepared(dev, side)
    ptrs = {item.x.data_ptr(), item.y.data_ptr(), item.blocks[0].edge_index.data_ptr()}
    item.wait()
    torch.cuda._sleep(SLEEP_CYCLES)  # the trainer's stream is busy ...
    total = item.x.sum()  # ... and then reads the batch
    del item  # the trainer drops the batch (the host runs ahead of the GPU)
    with dev.on(side):  # the next batch is allocated on the pipeline's stream
        nxt = [torch.empty(1 << 20, device=dev.device), torch.empty(4, dtype=torch.int64, device=dev.device),
               torch.empty(2, 3, dtype=torch.int64, device=dev.device)]
    assert not ptrs & {t.data_ptr() for t in nxt}, "a batch's memory was reused while the trainer still read it"
    assert float(total) == 1 << 20
    torch.cuda.synchronize()


@cuda
def test_cuda_staging_copies_on_a_side_stream_and_waits_before_refill():
    dev = DeviceLayer("cuda")
    assert dev.copies and dev.host_buffer(16).is_pinned()
    stage = DeviceStaging(1 << 20, dev)
    stage.array[:] = 7
    out = stage.to_device()
    assert out.device.type == "cuda" and stage._event is not None
    host = stage.array  # waits for the copy: the buffer may be refilled now
    assert stage._event is None
    host[:] = 1
    assert int(out.sum()) == 7 * (1 << 20)  # the device copy kept the bytes staged before the refill


@cuda
def test_cuda_staging_ring_alternates_through_fixed_pinned_slots():
    ring = StagingRing("cuda", 3 << 20, slots=2)
    a, b = ring.take(100), ring.take(3 << 20)
    assert a is not b and ring.take(100) is a and ring.take(10) is b
    assert a.host.is_pinned() and a.stream is b.stream is ring.stream is not None
    assert ring.nbytes() == ring_bytes(3 << 20) == 2 * (4 << 20)
    a.array[:5] = np.arange(5, dtype=np.uint8)
    assert torch.equal(a.to_device(5).cpu(), torch.arange(5, dtype=torch.uint8))


@cuda
def test_cuda_device_memory_and_its_peak():
    """What the device budget is resolved against (free and total) and what the metrics measure (the peak)."""
    dev = DeviceLayer("cuda")
    mem = dev.memory()
    assert 0 < mem.free <= mem.total
    dev.reset_peak()
    x = torch.empty(64 << 20, dtype=torch.uint8, device=dev.device)
    assert dev.peak_reserved() >= 64 << 20
    del x


@cuda
def test_cuda_events_order_streams():
    dev = DeviceLayer("cuda")
    side = dev.new_stream()
    with dev.on(side):
        torch.cuda._sleep(SLEEP_CYCLES // 4)
        x = torch.full((1 << 20,), 3.0, device=dev.device)
        ev = dev.event(side)
    dev.wait_event(ev)  # the current stream now sees x filled
    assert float(x.sum()) == 3.0 * (1 << 20)
    dev.synchronize(ev)
    assert ev.query()


@cuda
def test_cuda_delayed_copies_show_a_refill_that_does_not_wait(monkeypatch):
    """With every copy held on its stream and the batches read late, the ring's wait before a refill is all that
    keeps the bytes: the doctor's race check passes with it and fails without it (so it can catch the bug)."""
    from moment.runtime import gpucheck

    assert gpucheck.staging_ring("cuda").status == "ok"
    monkeypatch.setattr(DeviceStaging, "wait_copied", lambda self: None)
    c = gpucheck.staging_ring("cuda")
    assert c.status == "failed" and "arrived changed" in c.detail, c.detail


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (a thread bound to the second)")
def test_cuda_a_runtime_thread_works_on_the_device_it_was_started_for():
    """A new thread's current device is 0; the runtime's helper binds it first, so its work lands on its own."""
    from moment.runtime.threads import start_thread

    seen = []
    start_thread(lambda: seen.append((torch.cuda.current_device(), torch.ones(1, device="cuda").device.index)),
                 "moment-test", torch.device("cuda", 1)).join()
    assert seen == [(1, 1)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's thread names (/proc) are Linux's")
def test_a_runtime_thread_has_its_name_where_top_and_perf_look():
    """A profile of a rank tells its threads apart (perf's comm, top -H): the kernel keeps 15 bytes, so the
    name drops the "moment-" every runtime thread shares."""
    import threading

    from moment.runtime.threads import start_thread

    seen = []

    def comm() -> None:
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    for name in ("moment-gather_loop", "moment-a-name-longer-than-the-kernel-keeps"):
        start_thread(comm, name, "cpu").join()
    assert seen == ["gather_loop", "a-name-longer-t"]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bfloat16])
def test_host_rows_are_copied_as_torch_indexes_them(dtype):
    """index_rows and take_rows on the host (each row copied once) give what torch's indexing gives: with
    positions or without, all of a table's rows or some, any row dtype, and a non-contiguous destination."""
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, 255, (50, 3, 4), generator=g).to(dtype)
    idx = torch.randint(0, 50, (30,), generator=g)
    assert torch.equal(take_rows(table, idx), table[idx])
    assert take_rows(table, idx[:0]).shape == (0, 3, 4)
    pos = torch.randperm(40, generator=g)[:30]
    for out in (torch.zeros((40, 3, 4), dtype=dtype), torch.zeros((40, 3, 8), dtype=dtype)[:, :, :4]):
        want = out.clone()
        want[pos] = table[idx]
        index_rows(out, pos.numpy(), table, idx.numpy())
        assert torch.equal(out, want)
        want[pos] = table[:30]
        index_rows(out, pos.numpy(), table[:30], None)
        assert torch.equal(out, want)
        want[:30] = table[idx]
        index_rows(out, None, table, idx.numpy())
        assert torch.equal(out, want)


def test_a_batch_buffer_lent_before_its_reads_is_aligned_and_the_batch_it_becomes():
    """On CPU a batch's buffer is lent at submit, aligned for a direct read, and is then its tensor; it is not
    lent again while that tensor lives. A ring whose batches are copies of its slots (CUDA) lends none."""
    ring = StagingRing("cpu", 1 << 20, slots=2)
    lent = ring.lend(5000, 4096)
    assert lent.ctypes.data % 4096 == 0 and lent.nbytes == 5000
    lent[:] = 3
    batch = ring.take(5000, host=lent).to_device(5000)
    del lent
    again = ring.lend(5000, 4096)
    assert again.ctypes.data % 4096 == 0 and again.ctypes.data != batch.data_ptr() and int(batch.sum()) == 3 * 5000
    del batch, again
    reused = ring.batches.reused
    assert ring.lend(4000, 512).ctypes.data % 512 == 0 and ring.batches.reused == reused + 1  # free again: reused
    assert StagingRing(FakeCudaLayer(), 1 << 20, slots=2).lend(5000, 4096) is None
