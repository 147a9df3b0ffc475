"""Run a search under a time limit: past it the caller gets TimedOut at once, and the search itself
stops at its next progress report (the planner reports after every batch of LPs)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from moment.service.errors import TimedOut

T = TypeVar("T")


class _Abandoned(Exception):
    """Raised inside an abandoned search to unwind it."""


def run_with_deadline(work: Callable[[Callable[[int, int], None]], T], seconds: float, what: str) -> T:
    """`work(progress)` in a worker thread; TimedOut after `seconds` (the thread is told to stop)."""
    stop = threading.Event()
    box: dict[str, Any] = {}

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

    t = threading.Thread(target=run, name=f"moment-{what}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        stop.set()
        raise TimedOut(f"{what} did not finish within the service's limit of {seconds:g} s; ask for fewer "
                       "devices or a smaller machine, or run `moment` on the command line for long searches")
    if "error" in box:
        raise box["error"]
    return box["value"]
