"""Long work (`place`, `probe`) as jobs: an id, a state, progress, cancellation and a result, kept in
one SQLite file so a restart loses no finished result.

Each service process runs the jobs it accepted in its own worker threads; state, progress and the
cancel flag go through the database, so with several workers sharing the file any of them can show
or cancel any job. A process that starts marks the jobs of processes that are gone: a job that was
running becomes `interrupted` (its side effects are unknown; submit it again), a queued one is taken
over and run.

A worker outlives its database: when the file cannot be read or written (a full disk), the routes answer
503, the worker logs it once and looks again after a pause (RETRY_S, doubling up to RETRY_MAX_S), a job's
end is written once the file takes it, and /v1/health says why jobs are not running (JobRunner.problem).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from moment.errors import MomentError
from moment.locking import pid_alive
from moment.service.errors import Busy, Unavailable, log
from moment.service.schemas import Job

FINAL = ("done", "failed", "cancelled", "interrupted")
#: seconds between progress writes of one job (and cancel-flag reads)
PROGRESS_EVERY = 0.25
#: seconds a worker waits before it tries a failing job database again, doubling up to RETRY_MAX_S
RETRY_S, RETRY_MAX_S = 1.0, 30.0
#: an idle worker that has not looked for work for this long is stuck (it looks every RETRY_MAX_S at most)
STUCK_S = 120.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, request TEXT NOT NULL,
  progress TEXT NOT NULL DEFAULT '{}', result TEXT, error TEXT, cancel INTEGER NOT NULL DEFAULT 0,
  owner TEXT NOT NULL, created REAL NOT NULL, started REAL, finished REAL)
"""

#: runners alive in this process (an owner id of this pid that is not here belongs to a dead app)
_LIVE: set[str] = set()
_HOST = socket.gethostname()


class Cancelled(Exception):
    """Raised inside a job whose cancellation was asked for."""



def owner_alive(owner: str) -> bool:
    """Whether the process (and, in this process, the app) that owns a job still runs."""
    host, _, rest = owner.partition(":")
    pid_text, _, _ = rest.partition(":")
    if host != _HOST or not pid_text.isdigit():
        return True  # another machine's: not ours to judge
    pid = int(pid_text)
    if pid == os.getpid():
        return owner in _LIVE
    return pid_alive(pid)


class JobStore:
    """The jobs table. One short connection per call: safe across threads and processes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._db() as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(_SCHEMA)
        except (OSError, Unavailable) as e:
            raise MomentError(f"cannot open the job database: {e.__cause__ or e}", source=str(self.path)) from None

    @contextmanager
    def _db(self):
        """A connection; any SQLite error (a full disk, a damaged file, a lock held past the timeout) is
        Unavailable, which the routes answer 503 and the workers wait out."""
        try:
            with closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as db:
                db.row_factory = sqlite3.Row
                yield db
        except sqlite3.Error as e:
            raise Unavailable(f"the job database cannot be read or written: {e}") from e

    @staticmethod
    def _job(row: sqlite3.Row) -> Job:
        return Job(id=row["id"], kind=row["kind"], state=row["state"], progress=json.loads(row["progress"]),
                   request=json.loads(row["request"]), result=json.loads(row["result"]) if row["result"] else None,
                   error=row["error"], created=row["created"], started=row["started"], finished=row["finished"])

    def create(self, kind: str, request: dict[str, Any], owner: str, max_queued: int | None = None) -> Job:
        """A new queued job; Busy when `max_queued` jobs (of any process) are already waiting."""
        jid = uuid.uuid4().hex
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")  # the count and the insert as one step for every process
            try:
                waiting = db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
                if max_queued is not None and waiting >= max_queued:
                    raise Busy(f"{waiting} jobs are waiting to start, the service's limit; try again when one has "
                               "started (GET /v1/jobs)")
                db.execute("INSERT INTO jobs (id, kind, state, request, owner, created) VALUES (?, ?, 'queued', ?, ?, ?)",
                           (jid, kind, json.dumps(request), owner, time.time()))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        job = self.get(jid)
        assert job is not None
        return job

    def get(self, jid: str) -> Job | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (jid,)).fetchone()
        return self._job(row) if row else None

    def list(self, limit: int = 100) -> list[Job]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY created DESC, id LIMIT ?", (limit,)).fetchall()
        return [self._job(r) for r in rows]

    def claim(self, owner: str) -> Job | None:
        """The oldest queued job of `owner`, now running."""
        with self._db() as db:
            row = db.execute(
                "UPDATE jobs SET state = 'running', started = ? WHERE id = (SELECT id FROM jobs WHERE state = 'queued' "
                "AND owner = ? ORDER BY created, id LIMIT 1) RETURNING *", (time.time(), owner)).fetchone()
        return self._job(row) if row else None

    def progress(self, jid: str, stage: str, done: int, total: int | None) -> bool:
        """Record progress; whether cancellation was asked for."""
        with self._db() as db:
            db.execute("UPDATE jobs SET progress = ? WHERE id = ? AND state = 'running'",
                       (json.dumps({"stage": stage, "done": done, "total": total}), jid))
            row = db.execute("SELECT cancel FROM jobs WHERE id = ?", (jid,)).fetchone()
        return bool(row and row["cancel"])

    def end(self, jid: str, state: str, *, result: dict | None = None, error: str | None = None) -> None:
        assert state in FINAL
        with self._db() as db:
            db.execute("UPDATE jobs SET state = ?, result = ?, error = ?, finished = ? WHERE id = ? "
                       "AND state IN ('queued', 'running')",
                       (state, json.dumps(result) if result is not None else None, error, time.time(), jid))

    def cancel(self, jid: str) -> Job | None:
        """A queued job is cancelled at once; a running one is told to stop (it ends `cancelled` at its next
        progress report); a finished one is left as it is."""
        with self._db() as db:
            db.execute("UPDATE jobs SET state = 'cancelled', finished = ?, error = 'cancelled before it started' "
                       "WHERE id = ? AND state = 'queued'", (time.time(), jid))
            db.execute("UPDATE jobs SET cancel = 1 WHERE id = ? AND state = 'running'", (jid,))
        return self.get(jid)

    def recover(self, owner: str) -> tuple[int, int]:
        """Jobs of owners that are gone: running -> interrupted, queued -> taken over by `owner`.
        (interrupted, adopted)."""
        with self._db() as db:
            rows = db.execute("SELECT id, state, owner FROM jobs WHERE state IN ('queued', 'running')").fetchall()
            dead = [r for r in rows if r["owner"] != owner and not owner_alive(r["owner"])]
            now = time.time()
            for r in dead:
                if r["state"] == "running":
                    db.execute("UPDATE jobs SET state = 'interrupted', finished = ?, error = ? WHERE id = ? "
                               "AND state = 'running'",
                               (now, "the service stopped while this job ran; submit it again", r["id"]))
                else:
                    db.execute("UPDATE jobs SET owner = ? WHERE id = ? AND state = 'queued'", (owner, r["id"]))
        return sum(r["state"] == "running" for r in dead), sum(r["state"] == "queued" for r in dead)


class JobContext:
    """What a running job sees: progress reports that also carry the cancel check, and its notices."""

    def __init__(self, store: JobStore, jid: str, storage: Callable[[Exception | None], None] = lambda e: None):
        """`storage` hears how each progress write went (its error, or None): the runner's health."""
        self.store, self.id, self.storage = store, jid, storage
        self.notes: list[str] = []
        self._last = 0.0
        self._stage = ""

    def report(self, stage: str, done: int, total: int | None, *, force: bool = False) -> None:
        """Progress (written at most every PROGRESS_EVERY s unless forced); raises Cancelled when asked to stop."""
        self._stage = stage
        now = time.monotonic()
        if not force and now - self._last < PROGRESS_EVERY:
            return
        self._last = now
        try:
            cancel = self.store.progress(self.id, stage, done, total)
        except Unavailable as e:  # this report is lost, not the job: the next one tries again
            self.storage(e)
            return
        self.storage(None)
        if cancel:
            raise Cancelled

    @contextmanager
    def stage(self, name: str, label: str):
        """placement.api.place()'s stage hook: a progress(done, total) callback per stage."""
        self.report(name, 0, None, force=True)
        yield lambda done, total: self.report(name, done, total)

    def notice(self, text: str) -> None:
        self.notes.append(text)


Executor = Callable[[dict[str, Any], JobContext], dict[str, Any]]


class JobRunner:
    """Worker threads running this process's queued jobs, oldest first."""

    def __init__(self, store: JobStore, executors: dict[str, Executor], workers: int = 1,
                 max_queued: int | None = None, shown: Callable[[Any], Any] = lambda v: v):
        """`shown` rewrites what a job reports (result, error, notices) before it is stored, e.g. to cut
        the server's own paths out of it."""
        self.store, self.executors, self.max_queued, self.shown = store, executors, max_queued, shown
        self.owner = f"{_HOST}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        try:
            self.store.recover(self.owner)
        except Unavailable as e:
            raise MomentError(str(e), source=str(store.path)) from None
        _LIVE.add(self.owner)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._running: set[str] = set()
        self._lock = threading.Lock()
        #: the database error the workers last met (None once a read or write worked again), and since when
        self._fault: str | None = None
        self._fault_since = 0.0
        #: when each idle worker last looked for work (None while it runs a job)
        self._looked: dict[str, float | None] = {}
        self._threads = [threading.Thread(target=self._loop, name=f"moment-jobs-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            self._looked[t.name] = time.monotonic()
            t.start()

    def submit(self, kind: str, request: dict[str, Any]) -> Job:
        job = self.store.create(kind, request, self.owner, self.max_queued)
        self._wake.set()
        return job

    def problem(self) -> str | None:
        """Why this process's queued jobs would not start (a worker gone, stuck, or its database failing),
        for /v1/health; None when every worker is looking for work or running a job. Memory only: it
        never waits for the database."""
        if self._stop.is_set():
            return "the service is stopping: no job starts"
        now = time.monotonic()
        with self._lock:
            fault, since, looked = self._fault, self._fault_since, dict(self._looked)
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead:
            return f"job worker {', '.join(dead)} stopped: queued jobs start only after a restart of the service"
        if fault is not None:
            return f"{fault} (for {now - since:.0f} s): no job starts or ends until it works again; the workers retry"
        stuck = sorted(name for name, t in looked.items() if t is not None and now - t > STUCK_S)
        if stuck:
            return f"job worker {', '.join(stuck)} has not looked for work for over {STUCK_S:g} s"
        return None

    def _storage(self, e: Exception | None) -> None:
        """How a database read or write went: the first failure of a run of them is logged, and so is
        the first success after it."""
        with self._lock:
            was = self._fault
            if e is None:
                self._fault = None
            elif was is None:
                self._fault, self._fault_since = str(e) if isinstance(e, Unavailable) else \
                    f"the job worker failed: {type(e).__name__}: {e}", time.monotonic()
        if e is None and was is not None:
            log.warning("moment: the job database works again; jobs start and end again")
        elif e is not None and was is None:
            log.error("moment: %s; jobs wait, and the workers retry every %g-%g s", self._fault, RETRY_S,
                      RETRY_MAX_S, exc_info=not isinstance(e, Unavailable))

    def _loop(self) -> None:
        name = threading.current_thread().name
        pause = RETRY_S
        while not self._stop.is_set():
            with self._lock:
                self._looked[name] = time.monotonic()
            try:
                job = self.store.claim(self.owner)
            except Exception as e:  # noqa: BLE001 - the worker outlives any error: it waits and looks again
                self._storage(e)
                self._stop.wait(pause)
                pause = min(2 * pause, RETRY_MAX_S)
                continue
            self._storage(None)
            pause = RETRY_S
            if job is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            with self._lock:
                self._running.add(job.id)
                self._looked[name] = None
            try:
                self._run(job)
            except Exception as e:  # noqa: BLE001 - a bug in the bookkeeping around a job: it fails, the worker lives
                log.exception("moment: job %s", job.id)
                self._end(job.id, "failed", error=f"internal error: {type(e).__name__}: {e}")
            finally:
                with self._lock:
                    self._running.discard(job.id)

    def _run(self, job: Job) -> None:
        ctx = JobContext(self.store, job.id, self._storage)
        try:
            result = self.executors[job.kind](job.request, ctx)
        except Cancelled:
            if self._stop.is_set():
                self._end(job.id, "interrupted", error="the service stopped while this job ran; submit it again")
            else:
                self._end(job.id, "cancelled", error="cancelled while running")
        except MomentError as e:
            self._end(job.id, "failed", error=self.shown(str(e)))
        except Exception as e:  # noqa: BLE001 - a job's crash is its result, not the service's
            self._end(job.id, "failed", error=self.shown(f"internal error: {type(e).__name__}: {e}"))
        else:
            if ctx.notes:
                result = {**result, "notices": ctx.notes}
            self._end(job.id, "done", result=self.shown(result))

    def _end(self, jid: str, state: str, **outcome: Any) -> None:
        """Write a job's end, waiting for a failing database (a job whose end is lost would stay `running`);
        when the service stops first, its next start marks the job interrupted (JobStore.recover)."""
        pause = RETRY_S
        while True:
            try:
                self.store.end(jid, state, **outcome)
            except Unavailable as e:
                self._storage(e)
                if self._stop.wait(pause):
                    return
                pause = min(2 * pause, RETRY_MAX_S)
            else:
                self._storage(None)
                return

    def close(self, wait_s: float = 5.0) -> None:
        """Stop taking jobs; ask the running ones to stop; what is still running after `wait_s` is
        marked interrupted (queued jobs stay queued for the next start). A database that fails now
        leaves that to the next start (JobStore.recover)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            running = list(self._running)
        for jid in running:
            with _logged():
                self.store.cancel(jid)
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left = list(self._running)
        for jid in left:
            with _logged():
                self.store.end(jid, "interrupted", error="the service stopped while this job ran; submit it again")
        _LIVE.discard(self.owner)


@contextmanager
def _logged():
    """An Unavailable database, logged rather than raised (the service is stopping)."""
    try:
        yield
    except Unavailable as e:
        log.error("moment: %s", e)
