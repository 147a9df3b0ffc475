"""Run a search under a time limit: past it the caller gets TimedOut at once, and the search itself
stops at its next progress report (the planner reports after every batch of LPs).

`Searches` bounds the searches running at once (an abandoned one keeps its slot until it has stopped),
so a burst queues for the CPU instead of overloading it, and bounds how many more may wait for a
slot: past that a request is Busy (429) at once instead of holding a worker thread for the whole time
limit, so a flood of searches never starves the other routes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from moment.service.errors import Busy, TimedOut

T = TypeVar("T")


class _Abandoned(Exception):
    """Raised inside an abandoned search to unwind it."""


class Searches:
    """`running` searches at once, and at most `waiting` more requests waiting for one of those slots."""

    def __init__(self, running: int, waiting: int):
        self.running, self.waiting = running, waiting
        self.slots = threading.BoundedSemaphore(running)
        self._room = threading.BoundedSemaphore(running + waiting)

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """A place among the running or waiting searches while the block runs, or Busy at once (the routes'
        dependency `moment.service.deps.search_slot` holds it for the whole request)."""
        if not self._room.acquire(blocking=False):
            raise Busy(f"the service is busy: {self.running} searches are running and {self.waiting} more are "
                       "waiting; try again later")
        try:
            yield
        finally:
            self._room.release()


def run_with_deadline(work: Callable[[Callable[[int, int], None]], T], seconds: float, what: str,
                      searches: Searches | None = None) -> T:
    """`work(progress)` in a worker thread holding one of the `searches` slots; TimedOut after `seconds`
    (the thread is told to stop); Busy when no slot frees up within `seconds`."""
    t0 = time.monotonic()
    if searches is not None and not searches.slots.acquire(timeout=seconds):
        raise Busy(f"the service is busy with other searches; {what} found no free slot within {seconds:g} s, "
                   "try again later")
    return _run(work, seconds, what, searches.slots if searches is not None else None, t0)


def _run(work, seconds: float, what: str, slot: threading.Semaphore | None, t0: float):
    """`work` in its own thread, which releases `slot` (already taken) when it ends."""
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
        finally:
            if slot is not None:
                slot.release()

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
