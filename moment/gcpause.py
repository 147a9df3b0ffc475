"""The cyclic garbage collector paused while bounded work runs (`paused`), for the planner's search and the
short commands around it.

Python starts a collection every few hundred new containers, and a full one passes over every object the
imported libraries hold (pydantic, numpy, typer, rich: a few hundred thousand). A placement search allocates
tens of thousands of small tuples and lists and makes no reference cycles for a collection to find, so on
`moment plan` the collector cost about a fifth of the process (measured: 110-150 ms of GC in ~0.8 s of CPU).
Reference counting still frees everything; cycles made meanwhile are collected once the collector is back.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # pauses under way (nested or in several threads)
_was_enabled = False  # whether the collector was on when the first of them began


@contextmanager
def paused(*, exiting: bool = False) -> Iterator[None]:
    """The collector off inside; back as it was when the last pause under way ends (safe across threads).

    `exiting`: the process ends right after (a command line's run). What it made is then frozen (`gc.freeze`)
    rather than left to the collector: the interpreter's exit collects every object once more, which cost
    `moment plan` another ~100 ms, and nothing remains to be freed at exit that the system does not free."""
    global _depth, _was_enabled
    with _lock:
        if not _depth:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if not _depth and exiting:
                gc.freeze()
            if not _depth and _was_enabled:
                gc.enable()
