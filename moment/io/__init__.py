"""Per-rank asynchronous read stack for shard files (see stack.py); native engines in native/.

The names below load their modules when first used, so a light module of the package (the probe's request,
which the CLI reads at start) loads no numpy and no engine.
"""

from importlib import import_module
from typing import Any

#: name -> the module that defines it
EXPORTS = {
    "aligned_buffer": "moment.io.buffers", "BACKENDS": "moment.io.engines", "available_backends": "moment.io.engines",
    "ReadBatch": "moment.io.requests", "Completion": "moment.io.stack", "IOStack": "moment.io.stack",
    "IOStats": "moment.io.stack", "Ticket": "moment.io.stack",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name in EXPORTS:
        return getattr(import_module(EXPORTS[name]), name)
    raise AttributeError(f"module 'moment.io' has no attribute {name!r}")
