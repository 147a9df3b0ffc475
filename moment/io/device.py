"""The one place the runtime talks to CUDA: streams, events, pinned staging buffers and `record_stream`.

Why one module: a GPU run's correctness depends on a few stream rules (a tensor made on one stream and
used on another must be recorded on the user's stream before it is freed, or the caching allocator
hands its memory out again while kernels still read it), and CPU runs never execute them. Here every
such call is a thin layer over torch's own API, and on CPU the same call is a no-op or the identity,
so the runtime has one code path and CPU tests run it (tests/test_device.py; the CUDA side runs there
where CUDA exists).

torch is imported here only when a `DeviceLayer` is made, so planning and plain reads never need it.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import sys
from typing import Any, NamedTuple

import numpy as np

from moment.errors import MomentError
from moment.io.rows import copy_rows

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

#: what a driver that can give CUDA a device makes: NVIDIA's control node and its /proc entry, WSL2's GPU
#: paravirtualisation node (CUDA there has no /dev/nvidia*), and ROCm's kernel driver (a ROCm torch answers
#: torch.cuda too)
GPU_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")


def index_rows(out: Any, pos: np.ndarray | None, table: Any, idx: np.ndarray | None) -> None:
    """out[pos] = table[idx] for row tensors (pos None: out's first rows; idx None: all of table's rows, in
    order): both on the host, each row copied once without the GIL (`copy_rows` over their bytes; torch's
    indexing of byte rows goes element by element, ~18x slower); else by torch's indexing on each one's
    device."""
    if out.device.type == "cpu" and table.device.type == "cpu" and out.is_contiguous() and table.is_contiguous():
        k = table.shape[0] if idx is None else idx.shape[0]
        if k:
            copy_rows(_row_bytes(out), pos, _row_bytes(table), np.arange(k) if idx is None else idx)
        return
    import torch

    rows = table if idx is None else table[torch.from_numpy(idx).to(table.device)]
    if pos is None:
        out[: rows.shape[0]] = rows.to(out.device)
    else:
        out[torch.from_numpy(pos).to(out.device)] = rows.to(out.device)


def take_rows(table: Any, idx: Any) -> Any:
    """table[idx] (idx: an int64 tensor) as a new tensor on the table's device: on the host each row copied
    once without the GIL, as `index_rows` does."""
    if table.device.type == "cpu":
        out = table.new_empty((idx.shape[0], *table.shape[1:]))
        index_rows(out, None, table, idx.cpu().numpy())
        return out
    return table[idx.to(table.device)]


def _row_bytes(t: Any) -> np.ndarray:
    """A contiguous host tensor's rows as a uint8 [rows, row bytes] array over its memory."""
    import torch

    return t.view(torch.uint8).numpy().reshape(t.shape[0], math.prod(t.shape[1:]) * t.element_size())


def no_gpu_driver() -> bool:
    """True when this machine clearly has no GPU driver (none of GPU_DRIVER_PATHS exists): CUDA sees no device.

    Why: importing torch only to hear `torch.cuda.is_available()` say False costs seconds of start-up in
    every process that asks (the probe, the train launcher, the GPU checks). Every check of whether CUDA
    exists that can run before torch is loaded asks this first; where a driver may be there, torch decides
    exactly as before."""
    return not any(os.path.exists(p) for p in GPU_DRIVER_PATHS)


def cuda_started() -> bool:
    """Whether this process has initialized CUDA, after which a child it forks cannot use CUDA (the torchrun agent
    forks its ranks only before); False where torch is not loaded, as nothing can have initialized it then."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


#: staging slots of a ring: one batch is assembled on the host while the previous one's copy is in flight
RING_SLOTS = 2
#: a table goes to the device in chunks of about this many bytes through one reused pinned host buffer, so no
#: process holds the whole table in host memory (moment.runtime.gpu_tier.load_gpu_table)
UPLOAD_CHUNK_BYTES = 16 << 20


class DeviceMemory(NamedTuple):
    """A device's memory as CUDA reports it (`torch.cuda.mem_get_info`), in bytes."""

    free: int
    total: int


#: the CUDA caching allocator's smallest block: every device allocation is a multiple of it
CUDA_BLOCK = 512


def allocation_bytes(nbytes: int, device: Any) -> int:
    """What a storage of `nbytes` takes on `device` (a device's type or a torch.device): CUDA rounds it up to
    the caching allocator's block; host memory is taken as asked."""
    cuda = getattr(device, "type", device) == "cuda"
    return -(-int(nbytes) // CUDA_BLOCK) * CUDA_BLOCK if cuda else int(nbytes)


def slot_bytes(extent: int) -> int:
    """The size of a staging slot for batches of at most `extent` bytes: the power of two at or above it.

    Why a power of two: PyTorch's pinned host allocator rounds every block up to one and keeps it, so
    that is what a slot costs whatever is asked; asking it exactly makes the charge the allocation."""
    return 1 << max(int(extent) - 1, 0).bit_length()


def ring_bytes(extent: int, slots: int = RING_SLOTS) -> int:
    """Pinned host bytes a ring for batches of at most `extent` bytes holds (what the host budget charges)."""
    return max(1, slots) * slot_bytes(extent)


def upload_chunk(row_bytes: int, rows: int) -> tuple[int, int]:
    """(rows, pinned bytes) of one chunk of the upload of a table of `rows` rows to the device: the rows
    UPLOAD_CHUNK_BYTES holds (at least one, at most the table's), in a buffer of `slot_bytes` of them."""
    k = max(1, min(UPLOAD_CHUNK_BYTES // max(int(row_bytes), 1), int(rows)))
    return k, slot_bytes(k * int(row_bytes))


class DeviceLayer:
    """Streams, events and copies for `device`; on CPU every call is a no-op (or returns its input)."""

    def __init__(self, device: Any = "cpu"):
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise MomentError(f"device {self.device} requested but CUDA is not available")
        if self.cuda and self.device.index is None:  # "cuda" is the caller's current device: named, so that a
            # thread bound to it takes the same one (torch.cuda.set_device refuses a device without an index)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.copy_delay = 0  # GPU cycles each staging copy first waits on its stream (`moment doctor`'s race check)

    def delay(self) -> None:
        """Hold the current stream `copy_delay` cycles (CUDA; none on CPU): a copy queued after it runs late,
        so a buffer refilled without waiting for its copy sends the new bytes, and a check can see it."""
        if self.cuda and self.copy_delay:
            self._torch.cuda._sleep(int(self.copy_delay))

    def fork_rng(self) -> Any:
        """torch's RNG state forked for a block (the host's, and on CUDA the device's): restored after it."""
        return self._torch.random.fork_rng(devices=[self.device] if self.cuda else [])

    def release_cached(self) -> None:
        """Give the caching allocator's free blocks back to the device (CUDA), so that its free memory, which a
        device budget reads, counts them; nothing on CPU."""
        if self.cuda:
            self._torch.cuda.empty_cache()

    def ddp_device_ids(self) -> list[int] | None:
        """What DistributedDataParallel is given as `device_ids`: the rank's CUDA device; None on CPU."""
        return [self.device.index] if self.cuda else None

    def bind(self) -> None:
        """Make the device the calling thread's current CUDA device (each thread has its own, device 0 at
        first): call first in every thread that may touch the device."""
        if self.cuda:
            self._torch.cuda.set_device(self.device)

    @property
    def copies(self) -> bool:
        """Whether a batch on the device is a copy of its host staging (else it *is* the host buffer)."""
        return self.cuda

    def new_stream(self) -> Any:
        """A side stream (None on CPU, where work runs in the calling thread's order)."""
        return self._torch.cuda.Stream(device=self.device) if self.cuda else None

    def on(self, stream: Any) -> contextlib.AbstractContextManager:
        """Queue the enclosed work on `stream` (nothing on CPU or for None)."""
        return self._torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def event(self, stream: Any = None) -> Any:
        """An event recorded on `stream` (the current stream when None); None on CPU."""
        if not self.cuda:
            return None
        ev = self._torch.cuda.Event()
        ev.record(stream if stream is not None else self._torch.cuda.current_stream(self.device))
        return ev

    def wait_event(self, event: Any) -> None:
        """Make the current stream wait for `event` (work queued after this sees what came before it)."""
        if event is not None:
            self._torch.cuda.current_stream(self.device).wait_event(event)

    def wait_stream(self, stream: Any) -> None:
        """Make the current stream wait for everything queued on `stream` so far."""
        if stream is not None:
            self._torch.cuda.current_stream(self.device).wait_stream(stream)

    def synchronize(self, event: Any) -> None:
        """Block this thread until `event` has happened."""
        if event is not None:
            event.synchronize()

    def used_here(self, *tensors: Any) -> None:
        """The current stream uses these tensors, made on another stream: their memory is not given out
        again until the work queued on it so far is done (`Tensor.record_stream`)."""
        if not self.cuda:
            return
        stream = self._torch.cuda.current_stream(self.device)
        for t in tensors:
            t.record_stream(stream)

    def consume(self, ready: Any, *tensors: Any) -> None:
        """The current stream is about to use `tensors`, made on another stream that recorded `ready` after
        them: wait for `ready`, then record this stream on each (`used_here`), so that a tensor freed after
        its use is not handed out again before the kernels queued here have read it."""
        self.wait_event(ready)
        self.used_here(*tensors)

    def follow(self, stream: Any) -> None:
        """Make `stream` wait for everything queued on the current stream so far (memory allocated on the
        current stream may still be read by that work)."""
        if stream is not None:
            stream.wait_stream(self._torch.cuda.current_stream(self.device))

    def host_buffer(self, nbytes: int) -> Any:
        """A uint8 host buffer the device copies from asynchronously (page-locked on CUDA). On CPU it is
        NumPy's: NumPy asks for transparent huge pages on large arrays (torch does not), and a fresh
        batch buffer in 4 KiB pages costs a page fault every 4 KiB the batch's rows are copied into."""
        if self.cuda:
            return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=True)
        return self._torch.from_numpy(np.empty(nbytes, np.uint8))

    def torch_of(self, array: np.ndarray) -> Any:
        """A host NumPy buffer as a tensor over the same memory (its storage keeps the array alive)."""
        return self._torch.from_numpy(array)

    def copy_async(self, dst: Any, src: Any) -> None:
        """Queue the copy of `src` (pinned host memory) into `dst` on the current stream."""
        dst.copy_(src, non_blocking=True)

    def empty(self, nbytes: int) -> Any:
        """A uint8 tensor of `nbytes` on the device, allocated on the current stream."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8, device=self.device)

    def memory(self) -> DeviceMemory | None:
        """The device's free and total bytes (`torch.cuda.mem_get_info`); None on CPU."""
        if not self.cuda:
            return None
        free, total = self._torch.cuda.mem_get_info(self.device)
        return DeviceMemory(int(free), int(total))

    def reset_peak(self) -> None:
        """Start the device's peak (`peak_reserved`) from now."""
        if self.cuda:
            self._torch.cuda.reset_peak_memory_stats(self.device)

    def peak_reserved(self) -> int | None:
        """The most bytes torch's caching allocator has held on the device (`torch.cuda.max_memory_reserved`):
        what the device budget predicts; None on CPU."""
        return int(self._torch.cuda.max_memory_reserved(self.device)) if self.cuda else None

    def to_device(self, t: Any) -> Any:
        """`t` on the device, asynchronously where it can be (the same tensor when already there)."""
        return t.to(self.device, non_blocking=True)


def process_gpus(pid: int) -> list[str] | None:
    """PCI bus ids (as NVML spells them) of the GPUs on which process `pid` holds a context, from NVML
    (nvidia-ml-py); None where NVML cannot tell (not installed, no driver). NVML sees every GPU whatever
    CUDA_VISIBLE_DEVICES says, so a context a stray thread made on another GPU shows here."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            if any(p.pid == pid for p in procs):
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                out.append(bus.decode() if isinstance(bus, bytes) else str(bus))
        return out
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def layer(device: Any) -> DeviceLayer:
    return device if isinstance(device, DeviceLayer) else DeviceLayer(device)


class DeviceStaging:
    """A host buffer of `nbytes` (the IOStack destination) and its copy to the device on `stream` (a ring's
    copy stream; None: its own), overlapping the next reads; on CPU the "copy" is the buffer itself."""

    def __init__(self, nbytes: int, device: Any = "cuda", stream: Any = None, host: Any = None):
        self.dev = layer(device)
        self.device = self.dev.device
        self.host = self.dev.host_buffer(nbytes) if host is None else host
        self.stream = stream if stream is not None else self.dev.new_stream()
        self._event = None

    @property
    def array(self) -> np.ndarray:
        """The staging buffer as a NumPy view: pass it to IOStack.submit as the destination."""
        self.wait_copied()
        return self.host.numpy()

    def to_device(self, nbytes: int | None = None):
        """Start copying the first `nbytes` staged bytes to the device; returns the device tensor.

        The device tensor is allocated on the current stream (the pipeline's), so its memory returns to
        that stream's pool, not to the copy stream's; the copy stream waits for the current stream's work
        so far (that memory may have been freed by it), copies, and the current stream waits for the copy,
        so kernels queued afterwards see the data. Refill the staging buffer only through `array`, which
        waits for the copy to finish first.
        """
        src = self.host[: self.host.numel() if nbytes is None else nbytes]
        if not self.dev.copies:
            return src
        dst = self.dev.empty(src.numel())
        self.dev.follow(self.stream)
        with self.dev.on(self.stream):
            self.dev.delay()
            self.dev.copy_async(dst, src)
            self._event = self.dev.event(self.stream)
        self.dev.wait_stream(self.stream)
        return dst

    def wait_copied(self) -> None:
        self.dev.synchronize(self._event)
        self._event = None


class HostBatches:
    """The host buffers of CPU batches, each reused once nothing uses it any more.

    Why: on CPU a batch's tensor is its host buffer, and a fresh batch-sized buffer is a fresh mapping (above
    glibc's mmap threshold) whose every page the kernel zeroes when the batch's rows are first copied in: 17 ms
    of the 38 ms it took to copy 150,000 random rows of 512 B into a fresh one, on 2 cores. A buffer is free
    when only this object refers to it: the storage `torch.from_numpy` makes keeps a reference to its array
    until the last tensor on it is gone, and a NumPy view keeps its base. Free buffers are kept while the
    buffers held stay within the most batches alive at once over the last `track` takes and `SPARE` more (the
    memory budget charges the pipeline's held batches and `SPARE`), the largest first, the others given back.
    Keeping only one spare was not enough: the batches alive rise and fall by two or three as the training
    thread finishes steps, so a third of the bench's batches (8M x 128, 38 MB each) got a fresh buffer, and
    zeroing its pages was 15-32% of the gather thread's CPU (perf); kept, 3%. Buffers a caller keeps are not
    tracked past `track`."""

    #: buffers held besides those of the most batches alive at once: the one a finished batch leaves for the next
    SPARE = 1

    def __init__(self, track: int = 16):
        self.track = int(track)
        self._bufs: list[np.ndarray] = []
        self._alive: collections.deque[int] = collections.deque(maxlen=self.track)  # batches alive at each take
        self.reused = 0
        self.most_bytes = 0  # the most bytes of buffers held at once, in use or kept (the run's memory report)

    def _free(self) -> list[int]:
        """Indices of the buffers nothing but this list refers to (the list's reference and getrefcount's)."""
        return [i for i in range(len(self._bufs)) if sys.getrefcount(self._bufs[i]) <= 2]

    def take(self, nbytes: int, most: int | None = None, align: int = 1) -> np.ndarray:
        """A uint8 buffer of `nbytes` (a view of bytes of one) starting at a multiple of `align` (a direct read's
        destination): the smallest free buffer that holds them, else a new one of a quarter more (at most `most`,
        the largest batch), so that the next batches, of about the same size, fit it."""
        nbytes, align = int(nbytes), max(1, int(align))
        free = self._free()
        fits = [i for i in free if _room(self._bufs[i], align) >= nbytes]
        take = min(fits, key=lambda k: self._bufs[k].nbytes) if fits else -1
        if take >= 0:
            buf = self._bufs[take]
            self.reused += 1
        else:
            room = nbytes + nbytes // 4
            buf = np.empty(max(nbytes, min(room, int(most)) if most else room) + align - 1, np.uint8)
        alive = len(self._bufs) - len(free) + 1  # with this batch
        self._alive.append(alive)
        spares = sorted((i for i in free if i != take), key=lambda k: -self._bufs[k].nbytes)
        drop = set(spares[max(0, min(self.track, max(self._alive) + self.SPARE) - alive):])
        self._bufs = [b for k, b in enumerate(self._bufs) if k not in drop]
        listed = take >= 0 or len(self._bufs) < self.track
        if take < 0 and listed:
            self._bufs.append(buf)
        self.most_bytes = max(self.most_bytes, sum(b.nbytes for b in self._bufs) + (0 if listed else buf.nbytes))
        at = -buf.ctypes.data % align
        return buf[at: at + nbytes]  # a view: its base is `buf`, which `_free` counts the users of


def _room(buf: np.ndarray, align: int) -> int:
    """The bytes of `buf` from its first multiple of `align` on."""
    return buf.nbytes - (-buf.ctypes.data % align)


class StagingRing:
    """A few staging buffers used in turn, so one batch's rows are assembled on the host while the
    previous batch's copy to the device is still in flight; reuse waits for that buffer's last copy.

    The slots are allocated once, at `slot_bytes(extent)` each (`extent`: the most bytes of rows a batch
    holds, the run plan's batch extent), and share one copy stream: no slot grows (a grown pinned block
    would stay with the allocator, and a block freed on a stream that is gone stays with that stream), so
    the ring holds exactly what the host budget charges (`ring_bytes`). A batch larger than a slot is
    refused, naming both: the extent is a bound on every batch, so it means the bound was wrong (a split
    batch would need a second copy and a second assembly pass for a case that should not occur).
    Where the device batch is the host buffer itself (CPU), there are no slots: every batch gets its own
    buffer (the batch's memory, charged as the batch's: at most `extent` bytes), reused once no tensor uses it
    (`HostBatches`)."""

    def __init__(self, device: Any, extent: int, slots: int = RING_SLOTS):
        self.dev = layer(device)
        self.device = self.dev.device
        self.extent, self.slot = int(extent), slot_bytes(extent)
        self.stream = self.dev.new_stream() if self.dev.copies else None
        self.bufs = ([DeviceStaging(self.slot, self.dev, self.stream) for _ in range(max(1, slots))]
                     if self.dev.copies else [])
        self.batches = None if self.dev.copies else HostBatches()  # on CPU the batch is the host buffer itself
        self.next = 0

    @property
    def lends(self) -> bool:
        """Whether `lend` lends batch buffers (the device batch is the host buffer itself: CPU)."""
        return not self.dev.copies

    def lend(self, nbytes: int, align: int) -> np.ndarray | None:
        """The host buffer a batch of `nbytes` will be, lent before its rows are read (so that a read fills the
        batch itself) and handed back through `take(nbytes, host=)`; None where the device batch is a copy of a
        ring slot (CUDA), which is lent at completion only."""
        return self.batches.take(nbytes, self.extent, align) if self.lends else None

    def take(self, nbytes: int, host: np.ndarray | None = None) -> DeviceStaging:
        """The staging of a batch of `nbytes`: the next ring slot, or on CPU the batch's own host buffer (`host`
        when `lend` lent it already)."""
        if not self.dev.copies:
            buf = self.batches.take(nbytes, self.extent) if host is None else host
            return DeviceStaging(nbytes, self.dev, host=self.dev.torch_of(buf))
        if nbytes > self.slot:
            raise MomentError(f"a batch of {nbytes:,} B does not fit the staging slots of {self.slot:,} B, sized from "
                              "the run plan's batch extent (the most bytes of rows a batch was bounded to at start)",
                              hint="the bound sampled at start was exceeded: please report it with the run's options")
        buf = self.bufs[self.next]
        self.next = (self.next + 1) % len(self.bufs)
        return buf

    def nbytes(self) -> int:
        return sum(b.host.numel() for b in self.bufs)
