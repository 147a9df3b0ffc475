"""Per-rank asynchronous read stack for shard files (see stack.py); native engines in native/."""

from moment.io.buffers import aligned_buffer
from moment.io.engines import BACKENDS, available_backends
from moment.io.requests import ReadBatch
from moment.io.stack import Completion, IOStack, IOStats, Ticket

__all__ = ["BACKENDS", "Completion", "IOStack", "IOStats", "ReadBatch", "Ticket", "aligned_buffer", "available_backends"]
