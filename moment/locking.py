"""Exclusive locks on outputs (layouts, datasets), so two writers never work on the same path.

A lock is `fcntl.flock` on the file `<parent>/.<name>.lock` beside the output. The kernel drops it
when its holder exits, however it exits (kill -9 included), so a lock file left behind by a dead
process never blocks anyone: the next writer simply takes it. The file says who holds the lock
(pid, host, command, since when) for the one-line message of whoever finds it taken. The holder
deletes the file when it lets go; a taker checks that the file it locked is still the one at the
path (else it tries again), so the deletion can never let two writers in.

Locks are reentrant within a thread: `moment place` takes the lock on its --out before it
pre-samples, and the layout writer it calls takes the same lock again. Another thread of the same
process is refused as another process would be (the service runs jobs on several threads).
Base level: every layer may import it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moment import testpoints
from moment.errors import MomentError

#: the command line shown to whoever finds a lock taken (the CLI sets it; else sys.argv)
COMMAND: str | None = None

_held: dict[str, list[int]] = {}  # lock file -> [fd, depth, holding thread's ident]
_guard = threading.Lock()  # _held is shared by the process's threads


def lock_path(target: str | Path) -> Path:
    """The lock file of `target`: `.<name>.lock` in the same directory."""
    t = Path(target).absolute()
    return t.with_name(f".{t.name}.lock")


@contextmanager
def locked(target: str | Path, what: str = "output") -> Iterator[None]:
    """Hold the exclusive lock on `target` for the block; a taken lock raises MomentError at once,
    naming its holder. `what` names the output in that message ("layout", "dataset")."""
    path = lock_path(target)
    key = str(path)
    me = threading.get_ident()
    with _guard:
        mine = key in _held and _held[key][2] == me
        if mine:
            _held[key][1] += 1
    if mine:
        try:
            yield
        finally:
            with _guard:
                _held[key][1] -= 1
        return
    # not held by this thread: flock on a new open file, which another thread's open file also blocks
    fd = _acquire(path, Path(target), what)
    with _guard:
        _held[key] = [fd, 1, me]
    try:
        testpoints.reach("locked")
        yield
    finally:
        with _guard:
            del _held[key]
        try:
            os.unlink(path)  # still holding it: nobody can have locked this file meanwhile
        except OSError:
            pass
        os.close(fd)


def _acquire(path: Path, target: Path, what: str) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MomentError(f"cannot create the directory for the {what} ({e.strerror})", source=str(path.parent)) from None
    for _ in range(1000):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise MomentError(f"cannot create the lock file ({e.strerror})", source=str(path)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            info = _read(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise MomentError(f"cannot lock the {what} ({e.strerror})", source=str(path)) from None
            raise MomentError(f"{what} is locked by {_describe(info)}; wait for it to finish",
                              source=str(target)) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:  # the previous holder deleted the file after we opened it: lock the new one
            os.close(fd)
            continue
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "command": COMMAND or shlex.join(sys.argv), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError:  # a full disk: the lock holds without saying who holds it (the work says why it fails)
            pass
        return fd
    raise MomentError(f"cannot lock the {what}: its lock file keeps changing", source=str(path))


def _read(fd: int) -> dict | None:
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0) or b"null")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _describe(info: dict | None) -> str:
    if not info:
        return "another process (which has not yet said who it is)"
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {info.get('since', '?')} "
            f"({info.get('command', '?')})")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
