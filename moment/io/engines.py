"""Read engines behind IOStack and how one is chosen.

An engine is a pair of queues: `submit` enqueues a whole batch and returns its id at once; `reap`
hands back finished batches as `(id, bytes_read, err_index, errno, bytes_got)` tuples (err_index -1:
no error; errno 0 with err_index >= 0: short read).  The native engines ("io_uring", "pthreads")
live in moment.io._native; "python" is the portable fallback.  A future GPU-initiated (BaM-style)
engine plugs in through the same two calls, with device addresses as the destination.
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol

from moment.errors import MomentError
from moment.io.pyengine import PyEngine

BACKENDS = ("io_uring", "pthreads", "python")

try:  # optional: absent when the C extension could not be built
    _native = importlib.import_module("moment.io._native")
except ImportError as _e:  # pragma: no cover - depends on the build
    _native = None
    _NATIVE_ERROR = str(_e)
else:
    _NATIVE_ERROR = ""


class Engine(Protocol):
    kind: str

    def submit(self, fds, offsets, lengths, dest_offsets, dest, align: int) -> int: ...

    def reap(self, batch_id: int, min_count: int, timeout: float) -> list[tuple[int, int, int, int, int]]: ...

    def close(self) -> None: ...


#: most reads one engine keeps in flight (the rings and thread pools are sized by it)
MAX_QUEUE_DEPTH = 4096


def available_backends() -> dict[str, str]:
    """Backend name → "" if usable here, else the reason it is not."""
    out = {"io_uring": "", "pthreads": "", "python": ""}
    if _native is None:
        out["io_uring"] = out["pthreads"] = f"native extension not built ({_NATIVE_ERROR})"
        return out
    ok, why = _native.io_uring_usable()
    if not ok:
        out["io_uring"] = f"io_uring unavailable: {why}"
    return out


def make_engine(backend: str | None, queue_depth: int, threads: int | None) -> Engine:
    """Build the requested engine; "auto" (default, or $MOMENT_IO_BACKEND) takes the fastest usable."""
    where = "--io-backend" if backend else "MOMENT_IO_BACKEND"
    backend = backend or os.environ.get("MOMENT_IO_BACKEND") or "auto"
    if not 1 <= queue_depth <= MAX_QUEUE_DEPTH:
        raise MomentError(f"I/O queue depth must be between 1 and {MAX_QUEUE_DEPTH}, got {queue_depth}")
    avail = available_backends()
    if backend == "auto":
        order = [b for b in BACKENDS if not avail[b]]
    elif backend in BACKENDS:
        if avail[backend]:
            usable = [b for b in BACKENDS if not avail[b]]
            flag = where == "--io-backend"
            other = (f", or give --io-backend {usable[0]}" if flag else f", or set MOMENT_IO_BACKEND={usable[0]}"
                     ) if usable else ""
            raise MomentError(f"{where} {backend}: not usable here: {avail[backend]}",
                              hint=f"{'leave --io-backend out' if flag else 'unset MOMENT_IO_BACKEND'} to take "
                                   f"the fastest one that works{other}")
        order = [backend]
    else:
        raise MomentError(f"{where} {backend}: unknown I/O backend", hint=f"choose one of auto, {', '.join(BACKENDS)}")
    last = ""
    for name in order:
        try:
            if name == "python":
                return PyEngine(queue_depth, threads)
            return _native.Engine(name, queue_depth, threads or 0)
        except OSError as e:  # e.g. seccomp allows the probe ring but not a ring this deep
            last = f"{name}: {e}"
    raise MomentError(f"no I/O backend could start ({last})")
