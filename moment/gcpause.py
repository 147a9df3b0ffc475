"""The cyclic garbage collector paused while bounded work runs (`paused`), for the planner's search and the
short commands around it; paused while a long-lived process of ours loads its libraries, which are then frozen
(`loading`); and frozen when a process ends (`freeze_for_exit`).

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
def paused() -> Iterator[None]:
    """The collector off inside; back as it was when the last pause under way ends (safe across threads)."""
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
            if not _depth and _was_enabled:
                gc.enable()


@contextmanager
def loading() -> Iterator[None]:
    """Imports made by a process of ours that then runs long (torchrun's agent, a rank started fresh): the
    collector paused while they run, and what the process holds then frozen (`gc.freeze`), so no collection ever
    passes over it. Loading torch, torch._dynamo and the runtime with the collector on spent 0.3-0.6 of 2.1-2.9
    CPU-s in its collections, each passing over all that was loaded so far; one collection at the end would cost as
    much. What they leave as garbage (cycles, ~6 MiB: never written again, so forked ranks share its pages) is
    frozen with the rest. Only for processes Moment owns: a user's script keeps its own collector as it was."""
    with paused():
        yield
        gc.freeze()  # before the collector is back: its first allocation would pass over all that was loaded


def freeze_for_exit() -> None:
    """The process ends now (a command line's run, a rank's): what it made moves to the collector's permanent
    generation, so the interpreter's exit does not pass over every object once more. That pass cost `moment
    plan` ~100 ms, and with torch loaded it is most of the exit: 0.82 s after the exit handlers with torch and
    torch._dynamo imported, 0.14 s frozen, paid by every rank and by `moment train` at each end. Exit handlers,
    module clean-up and reference counting still run; only cycles are left, which the system frees."""
    gc.freeze()
