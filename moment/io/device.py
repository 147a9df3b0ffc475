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

import contextlib
from typing import Any

import numpy as np

from moment.errors import MomentError


class DeviceLayer:
    """Streams, events and copies for `device`; on CPU every call is a no-op (or returns its input)."""

    def __init__(self, device: Any = "cpu"):
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise MomentError(f"device {self.device} requested but CUDA is not available")
        self.copy_delay = 0  # GPU cycles each staging copy first waits on its stream (`moment doctor`'s race check)

    def delay(self) -> None:
        """Hold the current stream `copy_delay` cycles (CUDA; none on CPU): a copy queued after it runs late,
        so a buffer refilled without waiting for its copy sends the new bytes, and a check can see it."""
        if self.cuda and self.copy_delay:
            self._torch.cuda._sleep(int(self.copy_delay))

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

    def host_buffer(self, nbytes: int) -> Any:
        """A uint8 host buffer the device copies from asynchronously (page-locked on CUDA)."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8, pin_memory=self.cuda)

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
    """A host buffer of `nbytes` (the IOStack destination) and its copy to the device on a side stream,
    overlapping the next reads; on CPU the "copy" is the buffer itself."""

    def __init__(self, nbytes: int, device: Any = "cuda"):
        self.dev = layer(device)
        self.device = self.dev.device
        self.host = self.dev.host_buffer(nbytes)
        self.stream = self.dev.new_stream()
        self._event = None

    @property
    def array(self) -> np.ndarray:
        """The staging buffer as a NumPy view: pass it to IOStack.submit as the destination."""
        self.wait_copied()
        return self.host.numpy()

    def to_device(self, nbytes: int | None = None):
        """Start copying the first `nbytes` staged bytes to the device; returns the device tensor.

        The copy runs on the side stream; the current stream waits for it and is recorded as a user of
        the result, so kernels queued afterwards see the data. Refill the staging buffer only through
        `array`, which waits for the copy to finish first.
        """
        src = self.host[: self.host.numel() if nbytes is None else nbytes]
        with self.dev.on(self.stream):
            self.dev.delay()
            dst = self.dev.to_device(src)
            self._event = self.dev.event(self.stream)
        self.dev.wait_stream(self.stream)
        self.dev.used_here(dst)
        return dst

    def wait_copied(self) -> None:
        self.dev.synchronize(self._event)
        self._event = None


class StagingRing:
    """A few staging buffers used in turn, so one batch's rows are assembled on the host while the
    previous batch's copy to the device is still in flight. A buffer grows (25% spare) when a batch is
    larger than it; reuse waits for that buffer's last copy. Where the device batch is the host buffer
    itself (CPU), a buffer is never reused: every batch gets its own."""

    def __init__(self, device: Any, slots: int = 2):
        self.dev = layer(device)
        self.device = self.dev.device
        self.bufs: list[DeviceStaging | None] = [None] * max(1, slots)
        self.next = 0

    def take(self, nbytes: int) -> DeviceStaging:
        if not self.dev.copies:
            return DeviceStaging(nbytes, self.dev)
        i, self.next = self.next, (self.next + 1) % len(self.bufs)
        buf = self.bufs[i]
        if buf is None or buf.host.numel() < nbytes:
            if buf is not None:
                buf.wait_copied()
            buf = self.bufs[i] = DeviceStaging(max(nbytes, 1 << 20) * 5 // 4, self.dev)
        return buf

    def nbytes(self) -> int:
        return sum(b.host.numel() for b in self.bufs if b is not None)

