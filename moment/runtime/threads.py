"""The one way the runtime starts a thread: bound to the rank's device first.

Why: CUDA's current device is per thread, and a new thread's is device 0. A runtime thread that touches
CUDA unbound (a stream's context manager restores the thread's current stream and device on exit, an
allocation, a copy) creates a context on GPU 0 (0.3-0.5 GiB) in every rank but rank 0's, and its work
lands on the wrong device. Binding costs nothing on CPU, so every runtime thread is started here
(tests/test_codebase.py refuses a bare `threading.Thread` anywhere else in moment/runtime/).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from moment.errors import MomentError
from moment.io.device import DeviceLayer
from moment.runtime.lifetime import name_this_thread


def start_thread(target: Callable[[], None], name: str, device: Any) -> threading.Thread:
    """Start daemon thread `name` running `target`, bound to `device` (a torch device or its name) before
    anything else runs in it. Returns once it is bound; a bind that fails is raised here, in the caller: a
    thread that died before its loop began would leave whoever waits on it waiting for ever (a store for a
    bare "cuda" hung so on the first GPU run)."""
    dev = DeviceLayer(device)
    bound = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            dev.bind()
        except BaseException as e:  # noqa: BLE001 - raised in the starting thread
            failed.append(e)
            return
        finally:
            bound.set()
        # the kernel's name for it (perf, top -H): the prefix every runtime thread shares left out, to fit
        name_this_thread(name.removeprefix("moment-"))
        target()

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    bound.wait()
    if failed:
        raise MomentError(f"thread {name} could not take device {dev.device}: {failed[0]}") from failed[0]
    return t
