"""The one way the runtime starts a thread: bound to the rank's device first.

Why: CUDA's current device is per thread, and a new thread's is device 0. A runtime thread that touches
CUDA unbound (a stream's context manager restores the thread's current stream and device on exit, an
allocation, a copy) creates a context on GPU 0 (0.3-0.5 GiB) in every rank but rank 0's, and its work
lands on the wrong device. Binding costs nothing on CPU, so every runtime thread is started here
(tests/test_codebase.py refuses a bare `threading.Thread` anywhere else in moment/runtime/).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from moment.io.device import DeviceLayer

# Imports inside functions: ctypes, only where a thread is named (Linux).


def start_thread(target: Callable[[], None], name: str, device: Any) -> threading.Thread:
    """Start daemon thread `name` running `target`, bound to `device` (a torch device or its name) before
    anything else runs in it."""
    dev = DeviceLayer(device)

    def run() -> None:
        dev.bind()
        _name_os_thread(name)
        target()

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def _name_os_thread(name: str) -> None:
    """The thread's name as the kernel shows it (top -H, perf, /proc/PID/task/TID/comm): without it every
    thread of a rank is "python", and a profile cannot tell the sampler from the gather or the reader.
    Linux keeps 15 bytes; the shared "moment-" prefix is left out to keep what tells them apart."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.removeprefix("moment-").encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass  # a name is a help to whoever looks, never needed
