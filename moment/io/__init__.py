"""Per-rank asynchronous read stack for shard files (see stack.py); native engines in native/.

The names below load their modules when first used, so a light module of the package (the probe's request,
which the CLI reads at start) loads no numpy and no engine.
"""

from moment.lazy import exports

#: name -> the module that defines it
EXPORTS = {
    "aligned_buffer": "moment.io.buffers", "huge_page_buffer": "moment.io.buffers",
    "BACKENDS": "moment.io.engines", "available_backends": "moment.io.engines",
    "ReadBatch": "moment.io.requests", "Completion": "moment.io.stack", "IOStack": "moment.io.stack",
    "IOStats": "moment.io.stack", "Ticket": "moment.io.stack",
}
__all__ = sorted(EXPORTS)

__getattr__ = exports(__name__, EXPORTS)
