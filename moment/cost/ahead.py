"""Solving ahead on the other cores: the advisor's search decides one inventory at a time (each answer can
rule others out), but which ones it will ask for next is known a few steps ahead (the next in each ranking's
bound order, and their siblings with one SSD fewer). Helper processes solve those while this process solves
the one it needs; an answer a helper already holds is taken from it, one it is still solving is waited for
only when nothing else is left to solve here.

Why processes: the planner's search is Python, one core per process. Why fresh interpreters: forking would
copy the CLI progress bar's thread state (and the service's worker is threaded), and multiprocessing's spawn
imports the caller's main module again (a script without a `__main__` guard would run twice). Why not always
from the start: a helper's start (its interpreter and the planner's imports, ~0.5 CPU-s) pays only in a long
search, so helpers start once this process has spent START_AFTER_S solving, or at once for a caller that
knows its search is long. Each helper keeps its own search cache (listings, memos), so the work in all grows
(by ~18%, measured with two caches on the asus-esc8000a-e12 catalogue), spread over the cores. The answers are
the ones solving alone gives: an inventory's answer depends on it alone, the cache changes how fast it comes,
not what it is (tests/test_advise_ahead.py compares the two)."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

#: seconds of solving in this process before helpers start (a search shorter than this gains nothing from them)
START_AFTER_S = 0.3
#: inventories handed to a helper at a time: one to solve and more to go on with (it seldom waits for this process)
DEPTH = 3
#: how far down the likely requests a helper's next inventory is looked for
LOOK = 64
#: helpers `jobs=None` starts at most (measured on two cores: more keep more copies of the search cache)
MAX_AUTO_JOBS = 4


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def auto_jobs() -> int:
    """Processes for a search: the cores this process may run on, at most MAX_AUTO_JOBS."""
    return max(1, min(_cores(), MAX_AUTO_JOBS))


@dataclass
class _Helper:
    proc: Any
    conn: Connection
    ready: bool = False
    holds: list[str] = field(default_factory=list)  # the keys it was handed, in order

    @property
    def alive(self) -> bool:
        return self.conn is not None


def _helper_main(fd: int) -> None:
    """A helper (`python -c` of HELPER): its solver from the first message, then solve what it is sent, in order,
    until its pipe closes (the process that started it ended) or it is sent None."""
    conn = Connection(fd)
    try:
        make_solver, setup = pickle.loads(conn.recv_bytes())
        solve = make_solver(setup)
        conn.send(None)  # ready
        while (msg := conn.recv()) is not None:
            key, item = msg
            try:
                out = (key, True, solve(item, key))
            except Exception:  # noqa: BLE001 - the process that asked solves it again, and raises it there
                out = (key, False, None)
            conn.send(out)
    except (EOFError, OSError):
        return


#: a helper's program: the pipe's descriptor is its argument
HELPER = "import sys; from moment.cost.ahead import _helper_main; _helper_main(int(sys.argv[1]))"


class Ahead:
    """`solve(item, key)` with answers solved ahead: `upcoming()` yields the (key, item) pairs the caller will
    likely ask for next, soonest first (set it before the first `solve`). `solve_here(item, key)` solves in
    this process; `make_solver(setup)` (a module-level function: a helper imports it) makes a helper's.
    `jobs`: processes in all, this one included (None or 0: `auto_jobs()`), never more than the cores.
    `start`: start the helpers now, not after START_AFTER_S of solving here (a caller that knows its search
    is long lets them load meanwhile)."""

    def __init__(self, solve_here: Callable[[Any, str], Any], jobs: int | None,
                 make_solver: Callable[[Any], Callable[[Any, str], Any]], setup: Any, start: bool = False):
        self._solve_here = solve_here
        # `jobs` processes in all (None or 0: auto_jobs), no more than cores: each would only wait
        self._wanted = max(0, min(jobs or auto_jobs(), _cores()) - 1)
        self._make_solver, self._setup = make_solver, setup
        self._helpers: list[_Helper] = []
        self._answers: dict[str, Any] = {}
        self._spent = 0.0
        self.upcoming: Callable[[], Iterable[tuple[str, Any]]] = lambda: ()
        self.from_helpers = 0  # answers taken from a helper (what the tests look at)
        if start and self._wanted:
            self._start()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def solve(self, item: Any, key: str) -> Any:
        while True:
            if key in self._answers:
                return self._answers.pop(key)
            self._collect(block=False)
            if key in self._answers:
                continue
            self._hand_out(key)
            if not any(key in h.holds for h in self._helpers):
                return self._here(item, key)
            other = self._next_free(key)  # a helper is solving it: solve the next one meanwhile, or wait
            if other is not None:
                self._answers[other[0]] = self._here(other[1], other[0])
            else:
                self._collect(block=True)

    def close(self) -> None:
        for h in self._helpers:
            h.proc.kill()  # it holds nothing but answers no longer needed
            h.proc.wait()
            if h.conn is not None:
                h.conn.close()
        self._helpers = []

    def _here(self, item: Any, key: str) -> Any:
        t0 = time.perf_counter()
        try:
            return self._solve_here(item, key)
        finally:
            self._spent += time.perf_counter() - t0
            if self._wanted and not self._helpers and self._spent >= START_AFTER_S:
                self._start()

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # where this moment is imported from, first on the path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        for _ in range(self._wanted):
            mine, theirs = Pipe()
            proc = None
            try:
                proc = subprocess.Popen([sys.executable, "-c", HELPER, str(theirs.fileno())], env=env,
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # one that fails leaves its work to this one
                mine.send_bytes(pickle.dumps((self._make_solver, self._setup)))
            except OSError:  # no process to be had, or it died at once: solve alone
                mine.close()
                if proc is not None:
                    proc.kill()
                    proc.wait()
                break
            finally:
                theirs.close()
            self._helpers.append(_Helper(proc, mine))

    def _pending(self, exclude: str) -> Iterator[tuple[str, Any]]:
        """What is likely asked for next that nobody holds or solves (but `exclude`, which the caller solves)."""
        held = {k for h in self._helpers for k in h.holds}
        for key, item in itertools.islice(self.upcoming(), LOOK):
            if key != exclude and key not in self._answers and key not in held:
                yield key, item

    def _next_free(self, exclude: str) -> tuple[str, Any] | None:
        return next(self._pending(exclude), None)

    def _hand_out(self, exclude: str) -> None:
        pending = self._pending(exclude)
        for h in self._helpers:
            while h.alive and h.ready and len(h.holds) < DEPTH and (nxt := next(pending, None)) is not None:
                try:
                    h.conn.send(nxt)
                except OSError:
                    self._lost(h)
                    break
                h.holds.append(nxt[0])

    def _collect(self, block: bool) -> None:
        """Take the answers (and ready signs) the helpers have sent; with `block`, wait for at least one."""
        conns = {h.conn: h for h in self._helpers if h.alive and (not h.ready or h.holds)}
        if not conns:
            return
        for conn in wait(list(conns), timeout=None if block else 0):
            h = conns[conn]
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # it died: what it held is solved here
                self._lost(h)
                continue
            if msg is None:
                h.ready = True
                continue
            key, ok, answer = msg
            h.holds.remove(key)
            if ok:
                self._answers[key] = answer
                self.from_helpers += 1

    def _lost(self, h: _Helper) -> None:
        h.holds = []
        h.conn.close()
        h.conn = None  # type: ignore[assignment]
