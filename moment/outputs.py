"""Output paths: checked before any work starts, written atomically, with the modes the umask asks for.

The package's base file helpers live here, once: `atomic_write`/`atomic_file` (every single-file
writer), `fsync_dir` (directory swaps), `sha256_file`, `ChunkHasher`, `check_output`, `write_error`,
`follow_umask`.

Every command that writes (datasets, layouts, profiles, diagrams, metrics) checks its output path up
front with `check_output`, so a read-only directory, a path under a regular file or a missing
directory is one message naming the option, before minutes of sampling or solving. An OSError while
writing (a full disk) becomes `write_error`'s one-line message; the writers remove what they had
written. Temporary files and directories made by `tempfile` are private (0600/0700); `follow_umask`
gives the finished output the mode every other tool would (0644/0755 under umask 022).

This module sits beside `moment.errors` at the bottom of the package: everything may import it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from moment.errors import MomentError

_REASONS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EISDIR: "is a directory",
    errno.ENOENT: "no such file or directory",
    errno.EFBIG: "file too large for the file system",
}


def _label(path: str | Path, what: str | None) -> str:
    return f"{what} {path}" if what else str(path)


def reason(e: OSError) -> str:
    """A short, lower-case description of an OSError for a person."""
    return _REASONS.get(e.errno, (e.strerror or str(e)).lower()) if e.errno else str(e)


def write_error(e: OSError, path: str | Path, what: str | None = None, doing: str = "cannot write") -> MomentError:
    """The one-line message for an OSError met while writing `path` (`what` names the option)."""
    hint = None
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some space or choose another output location; nothing was left behind"
    return MomentError(f"{doing}: {reason(e)}", source=_label(path, what), hint=hint)


@contextmanager
def writing(path: str | Path, what: str | None = None) -> Iterator[None]:
    """Turn an OSError inside the block into `write_error` for `path` (MomentError passes through)."""
    try:
        yield
    except MomentError:
        raise
    except OSError as e:
        raise write_error(e, path, what) from None


def _nearest_existing(p: Path) -> Path:
    while not (p.exists() or p.is_symlink()) and p != p.parent:
        p = p.parent
    return p


def check_output(path: str | Path, what: str | None = None, *, directory: bool = False,
                 create_parents: bool | None = None) -> Path:
    """Check up front that `path` can be written; returns it as a Path.

    `directory`: the output is a directory (a dataset, a layout) rather than a file. Directories may
    have missing parents created (`create_parents`, default True for directories, False for files:
    a file's directory must exist, as with any other tool). Fails, naming `what` (the option) and the
    path, when the path is empty, a file is where a directory must be (or the reverse), a part of the
    path is a regular file, the directory is missing, or the directory cannot be written (permissions,
    read-only file system: tried for real with a temporary file, so root is not fooled by the mode).
    """
    if str(path).strip() == "":
        raise MomentError("empty path", source=what)
    p = Path(path)
    src = _label(p, what)
    if create_parents is None:
        create_parents = directory
    if p.is_dir() and not directory:
        raise MomentError("is a directory, expected a file name", source=src)
    if (p.exists() or p.is_symlink()) and directory and not p.is_dir():
        raise MomentError("exists and is not a directory", source=src)
    parent = p.absolute().parent
    anchor = _nearest_existing(parent)
    if not anchor.is_dir():
        raise MomentError(f"{anchor} is a file, not a directory", source=src)
    if anchor != parent and not create_parents:
        raise MomentError(f"directory {parent} does not exist", source=src, hint="create it first")
    probe_writable(anchor, src)
    return p


def probe_writable(directory: Path, src: str) -> None:
    """Create and remove a temporary file in `directory`; a failure is the user's error about `src`."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moment-probe-", dir=directory)
    except OSError as e:
        raise MomentError(f"cannot write in {directory}: {reason(e)}", source=src) from None
    os.close(fd)
    os.unlink(tmp)


def current_umask() -> int:
    """The process's umask (read from /proc where possible: setting it to read it is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def follow_umask(path: str | Path, *, directory: bool = False) -> None:
    """Give a file made by `tempfile` (0600/0700) the mode `open`/`mkdir` would have given it."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in the directory `path` durable (a no-op where directories cannot
    be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: str | Path, *, text: bool = False, private: bool = False) -> Iterator[IO[Any]]:
    """Open a temporary file in `path`'s directory for writing; when the block ends, fsync it, give it
    the umask's mode (0600 with `private`), rename it over `path` and fsync the directory: `path` is
    never half-written. On any failure the temporary file is removed and the exception passes on (wrap
    in `writing(path, what)` for an OSError as one message naming the option and the path)."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w" if text else "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if not private:
            follow_umask(tmp)
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write(path: str | Path, data: str | bytes, what: str | None = None) -> None:
    """Write `data` to `path` through `atomic_file`: never half-written, the umask's mode, nothing left
    behind on failure, an OSError (full disk, read-only directory) as one message naming `what`."""
    with writing(path, what), atomic_file(path, text=isinstance(data, str)) as f:
        f.write(data)


class ChunkHasher:
    """sha256 per `chunk` bytes of a stream fed in pieces of any size (layout shards, dataset blocks):
    a later check can re-hash any one chunk alone."""

    def __init__(self, chunk: int):
        self.chunk = chunk
        self.sums: list[str] = []
        self._h = hashlib.sha256()
        self._fill = 0

    def update(self, data: memoryview | bytes) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            take = min(self.chunk - self._fill, len(mv))
            self._h.update(mv[:take])
            self._fill += take
            mv = mv[take:]
            if self._fill == self.chunk:
                self.sums.append(self._h.hexdigest())
                self._h, self._fill = hashlib.sha256(), 0

    def finish(self) -> list[str]:
        if self._fill:
            self.sums.append(self._h.hexdigest())
            self._h, self._fill = hashlib.sha256(), 0
        return self.sums


def sha256_file(path: str | Path, progress: Callable[[int, int], Any] | None = None, done: int = 0,
                total: int = 0, block: int = 8 << 20) -> str:
    """The hex sha256 of a file, read `block` bytes at a time; `progress(done, total)` after each."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(block):
            h.update(b)
            done += len(b)
            if progress:
                progress(done, total)
    return h.hexdigest()
