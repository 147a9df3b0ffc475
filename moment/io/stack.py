"""The per-rank I/O stack: submit batches now, reap their completions later.

Submission and completion are separate calls (Hyperion §III-A) so a rank can issue the reads of
mini-batch i+1 and go on sampling or training while the engine keeps `queue_depth` reads in flight;
Moment (§3.1) gives every GPU its own such stack.  Reads are O_DIRECT where the filesystem allows it:
ranges are rounded outward to the block size, the wanted bytes copied out, and the bytes actually
read counted so read amplification is visible.
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np

from moment.errors import MomentError
from moment.io.engines import make_engine
from moment.io.files import ShardFiles
from moment.io.requests import ReadBatch
from moment.io.trace import ReadTrace

Ticket = int
Verifier = Callable[["Completion"], None]


@dataclass(frozen=True)
class Completion:
    """A finished batch: its requests are in `dest`.  Raising from a verifier rejects it."""

    ticket: Ticket
    batch: ReadBatch
    dest: np.ndarray
    bytes_wanted: int
    bytes_read: int


@dataclass
class IOStats:
    batches: int = 0
    requests: int = 0
    bytes_wanted: int = 0
    bytes_read: int = 0

    @property
    def read_amplification(self) -> float:
        """Bytes read from the files per byte asked for (1.0 = no waste from alignment)."""
        return self.bytes_read / self.bytes_wanted if self.bytes_wanted else 1.0


@dataclass
class _Pending:
    batch: ReadBatch
    dest: np.ndarray
    verify: Verifier | None


def _as_dest(dest) -> np.ndarray:
    """A writable, contiguous byte view of the caller's buffer (numpy, bytearray, mmap, CPU tensor)."""
    if not isinstance(dest, np.ndarray):
        try:
            dest = np.frombuffer(memoryview(dest).cast("B"), dtype=np.uint8)
        except TypeError:
            dest = np.asarray(dest)  # e.g. a CPU torch tensor (shares memory)
    if not dest.flags.c_contiguous or not dest.flags.writeable:
        raise MomentError("read destination must be a writable, contiguous buffer")
    return dest.reshape(-1).view(np.uint8)


class IOStack:
    """One rank's reader over a fixed list of shard files (index i in requests = paths[i]).

    Driven by one thread (the rank's); the engine's own threads do the reading.
    """

    def __init__(self, paths: Sequence[str | Path], *, queue_depth: int = 64, backend: str | None = None,
                 direct: bool = True, alignment: int = 4096, threads: int | None = None,
                 verify: Verifier | None = None, trace: str | Path | None = None):
        """`trace`: write every read to this file as an fio iolog when the stack closes (moment.io.trace)."""
        self.files = ShardFiles(paths, direct=direct, alignment=alignment)
        self._trace = None if trace is None else ReadTrace(trace, paths, alignment)
        self.queue_depth = queue_depth
        self._engine = make_engine(backend, queue_depth, threads)
        self._backend: str = self._engine.kind
        self._verify = verify
        self._pending: dict[Ticket, _Pending] = {}
        self._ready: dict[Ticket, Completion] = {}
        self.stats = IOStats()

    @property
    def backend(self) -> str:
        """"io_uring", "pthreads" or "python": which engine serves this stack."""
        return self._backend

    @property
    def direct(self) -> bool:
        """False once a filesystem refused O_DIRECT (see `files.fallback_reason`)."""
        return self.files.direct

    @property
    def in_flight(self) -> int:
        """Submitted batches not yet reaped."""
        return len(self._pending) + len(self._ready)

    @contextmanager
    def setup_reads(self) -> Iterator[None]:
        """The reads submitted meanwhile set the run up (a cache filled at start): traced apart from the run's
        own (moment.io.trace.setup_trace). Only for reads submitted and finished inside it."""
        if self._trace is None:
            yield
            return
        self._trace.setup = True
        try:
            yield
        finally:
            self._trace.setup = False

    def submit(self, batch: ReadBatch, dest, *, verify: Verifier | None = None) -> Ticket:
        """Queue every request of `batch` (reads land in `dest`) and return at once."""
        if self._engine is None:
            raise MomentError("I/O stack is closed")
        out = _as_dest(dest)
        if len(batch) and batch.dest_size > out.nbytes:
            raise MomentError(f"read batch needs a {batch.dest_size}-byte destination, got {out.nbytes} bytes")
        self.files.ensure_open(batch.file, batch.offset, batch.length)
        fds = self.files.fds[batch.file]
        if self._trace is not None:
            self._trace.record(batch.file, batch.offset, batch.length)
        ticket = self._engine.submit(fds, batch.offset, batch.length, batch.dest_offset, out,
                                     self.files.alignment)
        self._pending[ticket] = _Pending(batch, out, verify or self._verify)
        return ticket

    def reap(self, ticket: Ticket | None = None, *, min_completions: int = 1,
             timeout: float | None = None) -> list[Completion]:
        """Finished batches: `ticket`'s alone, or every finished one once `min_completions` are
        (fewer if `timeout` seconds pass first).  A failed batch raises MomentError."""
        t = -1.0 if timeout is None else max(timeout, 0.0)
        if ticket is not None:
            if ticket in self._ready:
                return [self._ready.pop(ticket)]
            if ticket not in self._pending or self._engine is None:
                raise MomentError(f"unknown or already reaped I/O ticket {ticket}")
            self._collect(self._engine.reap(ticket, 0, t))
            return [self._ready.pop(ticket)] if ticket in self._ready else []
        if self._engine is None:
            raise MomentError("I/O stack is closed")
        rest = min(min_completions, self.in_flight) - len(self._ready)
        self._collect(self._engine.reap(-1, rest, t) if rest > 0 else self._engine.reap(-1, 0, 0.0))
        out = sorted(self._ready.values(), key=lambda c: c.ticket)
        self._ready.clear()
        return out

    def wait(self, ticket: Ticket, timeout: float | None = None) -> Completion:
        """Reap one ticket; TimeoutError if it is not done within `timeout` seconds."""
        done = self.reap(ticket, timeout=timeout)
        if not done:
            raise TimeoutError(f"I/O ticket {ticket} not complete after {timeout} s")
        return done[0]

    def read(self, batch: ReadBatch, dest=None) -> np.ndarray:
        """Blocking convenience: submit, wait, return the destination bytes."""
        out = np.empty(batch.dest_size, np.uint8) if dest is None else dest
        return self.wait(self.submit(batch, out)).dest

    def _collect(self, results) -> None:
        """Move engine results into the ready set; raise for the first failure (after collecting all)."""
        failure = None
        for bid, bytes_read, err_index, code, got in results:
            p = self._pending.pop(bid)
            wanted = p.batch.bytes_wanted
            self.stats.batches += 1
            self.stats.requests += len(p.batch)
            self.stats.bytes_wanted += wanted
            self.stats.bytes_read += bytes_read
            c = Completion(bid, p.batch, p.dest, wanted, bytes_read)
            if err_index >= 0:
                failure = failure or self._error(p.batch, err_index, code, got)
                continue
            if p.verify is not None:
                try:
                    p.verify(c)
                except MomentError as e:
                    failure = failure or e
                    continue
            self._ready[bid] = c
        if failure is not None:
            raise failure

    def _error(self, batch: ReadBatch, i: int, code: int, got: int) -> MomentError:
        k = int(batch.file[i])
        path = self.files.paths[k]
        off, ln = int(batch.offset[i]), int(batch.length[i])
        where = f"reading {ln} bytes at offset {off}"
        if code == 0:
            try:
                size = f"the file has {os.stat(path).st_size} bytes"
            except OSError:
                size = "the file is gone"
            return MomentError(f"short read {where}: {size}", source=str(path),
                               hint="the shard file is truncated or the layout index is wrong")
        name = errno_mod.errorcode.get(code, str(code))
        return MomentError(f"I/O error {where}: [{name}] {os.strerror(code)}", source=str(path))

    def close(self) -> None:
        """Stop the engine (queued reads are cancelled) and close the files."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
            self.files.close()
            if self._trace is not None:
                self._trace.write()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_engine", None) is not None:  # absent when __init__ failed
            self.close()
