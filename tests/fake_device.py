"""A device layer that makes the calls a CUDA run makes and records them, on CPU tensors.

Why: the staging ring's and the GPU table upload's rules on CUDA (slots allocated once, one copy stream per
ring, device batches allocated on the caller's stream, copies on the copy stream, the table through one pinned
chunk) are logic, and CI has no GPU. `moment.io.device.DeviceLayer` is the one place those calls go through, so
a layer that says `copies` (as CUDA does) and records each call shows the structure on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from moment.io.device import DeviceLayer


class FakeCudaLayer(DeviceLayer):
    """`copies` like CUDA; streams are names, the current one a stack (`on`, starting with "caller"); every
    stream made and pinned buffer allocated is kept, and `log` records in order each device allocation
    ("alloc", current stream), async copy ("copy", its stream) and wait ("wait", waiting stream, waited)."""

    def __init__(self) -> None:  # no super(): nothing of torch.cuda is touched
        self._torch = torch
        self.device = torch.device("cpu")
        self.cuda = False
        self.streams: list[str] = []
        self.pinned: list[torch.Tensor] = []
        self.log: list[tuple[str, ...]] = []
        self.current = ["caller"]

    @property
    def copies(self) -> bool:
        return True

    def new_stream(self) -> str:
        self.streams.append(f"stream {len(self.streams)}")
        return self.streams[-1]

    @contextlib.contextmanager
    def on(self, stream: Any) -> Iterator[None]:
        self.current.append(stream if stream is not None else self.current[-1])
        try:
            yield
        finally:
            self.current.pop()

    def event(self, stream: Any = None) -> Any:
        return ("event", stream if stream is not None else self.current[-1])

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        t = torch.zeros(nbytes, dtype=torch.uint8)
        self.pinned.append(t)
        return t

    def empty(self, nbytes: int) -> torch.Tensor:
        self.log.append(("alloc", self.current[-1]))
        return torch.empty(nbytes, dtype=torch.uint8)

    def copy_async(self, dst: Any, src: Any) -> None:
        self.log.append(("copy", self.current[-1]))
        dst.copy_(src)

    def follow(self, stream: Any) -> None:
        self.log.append(("wait", stream, self.current[-1]))

    def wait_stream(self, stream: Any) -> None:
        self.log.append(("wait", self.current[-1], stream))

    def wait_event(self, event: Any) -> None:
        if event is not None:
            self.log.append(("wait", self.current[-1], event[1]))

    def synchronize(self, event: Any) -> None:
        pass

    def used_here(self, *tensors: Any) -> None:
        self.log.append(("record", self.current[-1]))

    def pinned_bytes(self) -> int:
        return sum(t.numel() for t in self.pinned)
