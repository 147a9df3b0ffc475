"""Per-rank asynchronous read stack for shard files (see stack.py); native engines in native/."""

from moment.io.engines import BACKENDS, available_backends
from moment.io.requests import ReadBatch
from moment.io.stack import Completion, IOStack, IOStats, Ticket

__all__ = ["BACKENDS", "Completion", "IOStack", "IOStats", "ReadBatch", "Ticket", "available_backends"]
