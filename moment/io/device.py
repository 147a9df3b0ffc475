"""Pinned host staging for the device copy: the stack reads into page-locked memory, then one
asynchronous copy per batch moves it to the GPU on a side stream, overlapping the next reads.

torch is imported here only, so planning and plain reads never need it.  Device-agnostic: on a
machine without CUDA the staging buffer is ordinary memory and the "copy" is a host clone.
"""

from __future__ import annotations

import numpy as np

from moment.errors import MomentError


class DeviceStaging:
    """A pinned host buffer of `nbytes` (the IOStack destination) and its copy to `device`."""

    def __init__(self, nbytes: int, device="cuda"):
        import torch

        self._torch = torch
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise MomentError(f"device {self.device} requested but CUDA is not available")
        pinned = self.device.type == "cuda"
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        self.stream = torch.cuda.Stream(device=self.device) if pinned else None
        self._event = None

    @property
    def array(self) -> np.ndarray:
        """The staging buffer as a NumPy view: pass it to IOStack.submit as the destination."""
        self.wait_copied()
        return self.host.numpy()

    def to_device(self, nbytes: int | None = None):
        """Start copying the first `nbytes` staged bytes to the device; returns the device tensor.

        The copy runs on the side stream; the current stream is made to wait for it, so kernels
        queued afterwards see the data.  Refill the staging buffer only through `array`, which
        waits for the copy to finish first.
        """
        src = self.host[: self.host.numel() if nbytes is None else nbytes]
        if self.stream is None:
            return src.clone()
        torch = self._torch
        with torch.cuda.stream(self.stream):
            dst = src.to(self.device, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(self.stream)
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        dst.record_stream(torch.cuda.current_stream(self.device))
        return dst

    def wait_copied(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None


class StagingRing:
    """A few pinned staging buffers used in turn, so one batch's rows are assembled on the host while
    the previous batch's copy to the device is still in flight. A buffer grows (re-pinned, 25% spare)
    when a batch is larger than it; reuse waits for that buffer's last copy."""

    def __init__(self, device, slots: int = 2):
        self.device = device
        self.bufs: list[DeviceStaging | None] = [None] * max(1, slots)
        self.next = 0

    def take(self, nbytes: int) -> DeviceStaging:
        i, self.next = self.next, (self.next + 1) % len(self.bufs)
        buf = self.bufs[i]
        if buf is None or buf.host.numel() < nbytes:
            if buf is not None:
                buf.wait_copied()
            buf = self.bufs[i] = DeviceStaging(max(nbytes, 1 << 20) * 5 // 4, self.device)
        return buf

    def nbytes(self) -> int:
        return sum(b.host.numel() for b in self.bufs if b is not None)
