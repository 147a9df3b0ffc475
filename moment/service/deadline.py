"""Run a search under a time limit: past it the caller gets TimedOut at once, and the search itself
stops at its next progress report (the planner reports after every batch of LPs). A semaphore bounds
the searches running at once (an abandoned one keeps its slot until it has stopped), so a burst of
requests queues for the CPU instead of overloading it; one that finds no slot within its time limit
gets Busy."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from moment.service.errors import Busy, TimedOut

T = TypeVar("T")


class _Abandoned(Exception):
    """Raised inside an abandoned search to unwind it."""


def run_with_deadline(work: Callable[[Callable[[int, int], None]], T], seconds: float, what: str,
                      slots: threading.Semaphore | None = None) -> T:
    """`work(progress)` in a worker thread holding one of `slots`; TimedOut after `seconds` (the thread is
    told to stop), Busy when no slot frees up within them."""
    import time

    stop = threading.Event()
    box: dict[str, Any] = {}
    t0 = time.monotonic()
    if slots is not None and not slots.acquire(timeout=seconds):
        raise Busy(f"the service is busy with other searches; {what} found no free slot within {seconds:g} s, "
                   "try again later")

    def progress(done: int, total: int) -> None:
        if stop.is_set():
            raise _Abandoned

    def run() -> None:
        try:
            box["value"] = work(progress)
        except _Abandoned:
            pass
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e
        finally:
            if slots is not None:
                slots.release()

    t = threading.Thread(target=run, name=f"moment-{what}", daemon=True)
    t.start()
    t.join(max(0.0, seconds - (time.monotonic() - t0)))
    if t.is_alive():
        stop.set()
        raise TimedOut(f"{what} did not finish within the service's limit of {seconds:g} s; ask for fewer "
                       "devices or a smaller machine, or run `moment` on the command line for long searches")
    if "error" in box:
        raise box["error"]
    return box["value"]
