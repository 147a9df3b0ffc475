"""Exclusive locks on outputs (layouts, datasets), so two writers never work on the same path.

A lock is `fcntl.flock` on the file `<parent>/.<name>.lock` beside the output. The kernel drops it
when its holder exits, however it exits (kill -9 included), so a lock file left behind by a dead
process never blocks anyone: the next writer simply takes it. The file says who holds the lock
(pid, host, command, since when) for the one-line message of whoever finds it taken. The holder
deletes the file when it lets go; a taker checks that the file it locked is still the one at the
path (else it tries again), so the deletion can never let two writers in.

Readers of a layout (a training run: `moment train`'s launcher and each rank's `open_run`) hold the same lock
file shared (`shared`): any number of them at once, none while a writer holds it, and a writer (`moment place`
over it, `moment layout rm`) is refused while one does, naming them. Each reader appends a line saying who it is;
lines of readers that are gone (kill -9: the kernel dropped their lock) are not named. The last reader to let go
deletes the file, holding it exclusively for that moment as a writer does.

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
_shared: dict[str, list[int]] = {}  # lock file -> [fd or -1 (none could be made), holders, holding process's pid]
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
            if not _lock_current(fd, path, target, what, fcntl.LOCK_EX):
                continue
        except OSError as e:
            raise MomentError(f"cannot lock the {what} ({e.strerror})", source=str(path)) from None
        info = _me()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError:  # a full disk: the lock holds without saying who holds it (the work says why it fails)
            pass
        return fd
    raise MomentError(f"cannot lock the {what}: its lock file keeps changing", source=str(path))


def _lock_current(fd: int, path: Path, target: Path, what: str, how: int) -> bool:
    """Lock `fd` (`how`: LOCK_EX or LOCK_SH) without waiting. True: locked, and still the file at `path`; False:
    the holder before deleted that file after we opened it (`fd` closed: open the new one). Held by another: one
    MomentError naming the holders; another OSError passes on (`fd` closed)."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as e:
        holders = _holders(fd)
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise MomentError(f"{what} is locked by {_describe(holders)}; wait for it to finish",
                              source=str(target)) from None
        raise
    try:
        same = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        same = False
    if not same:
        os.close(fd)
    return same


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": COMMAND or shlex.join(sys.argv),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


@contextmanager
def shared(target: str | Path, what: str = "output") -> Iterator[None]:
    """Hold the lock on `target` shared for the block (see the module's docstring): with other readers, never
    with a writer; a writer's lock raises MomentError at once, naming it. Nested and concurrent holds of one
    process share one lock. Where no lock file can be made (a read-only file system, a missing directory: nothing
    can write or remove the target there either, or the caller refuses it) the block runs unlocked."""
    path = lock_path(target)
    key = str(path)
    with _guard:  # acquiring never waits (LOCK_NB)
        if key in _shared and _shared[key][2] == os.getpid():
            _shared[key][1] += 1
        else:
            _shared[key] = [_acquire_shared(path, Path(target), what), 1, os.getpid()]
    try:
        yield
    finally:
        with _guard:
            entry = _shared[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _shared[key]
                if entry[0] >= 0:
                    _release_shared(entry[0], path)


def _acquire_shared(path: Path, target: Path, what: str) -> int:
    for _ in range(1000):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError:
            try:  # a read-only file system: an existing lock file can still be locked (and its writer named)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return -1
        try:
            if not _lock_current(fd, path, target, what, fcntl.LOCK_SH):
                continue
        except OSError:
            return -1  # a file system without flock: as without a lock file
        try:  # a line of its own: a writer killed mid-write may have left a line without its end
            os.write(fd, f"\n{json.dumps(_me())}\n".encode())
        except OSError:
            pass
        return fd
    raise MomentError(f"cannot lock the {what}: its lock file keeps changing", source=str(path))


def _release_shared(fd: int, path: Path) -> None:
    """Let go of a shared lock; the last holder (it then gets the lock exclusively) deletes the file, as a writer
    does: the next reader or writer makes a new one. Another holder keeps it, with its lines."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass
    else:
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                os.unlink(path)
        except OSError:
            pass
    os.close(fd)


def _holders(fd: int) -> list[dict]:
    """Who holds the lock, as the file says: a writer's one JSON object, or a line per reader (those of this host
    whose process is gone are left out: their lock went with them)."""
    try:
        text = os.pread(fd, 1 << 20, 0).decode(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            info = json.loads(line)
        except ValueError:
            continue
        if isinstance(info, dict) and not (info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int)
                                           and not pid_alive(info["pid"])):
            out.append(info)
    return out


def _describe(holders: dict | list[dict] | None) -> str:
    if isinstance(holders, dict):
        holders = [holders]
    if not holders:
        return "another process (which has not yet said who it is)"
    info, more = holders[0], len(holders) - 1  # a run's launcher first, then its ranks
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {info.get('since', '?')} "
            f"({info.get('command', '?')})" + (f" and {more} more process{'es' * (more > 1)}" if more else ""))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
