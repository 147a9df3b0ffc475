"""Input paths: the files and directories a user names, checked and read the same way for every option.

A missing path, a dangling symbolic link, a directory where a file is expected (or the reverse), a
device or pipe, a path that cannot be read (permissions), a name longer than the file system allows
and content that is not UTF-8 text each become one MomentError naming the path and what it should have
been, never an OSError or UnicodeDecodeError traceback. Every text input (profiles, calibrations,
measurement and price files, plan JSON, manifests) is read through `read_text`, so they all say the
same thing about the same problem.

This module sits beside `moment.errors` at the bottom of the package: everything may import it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moment.errors import MomentError

#: the largest text input read whole (profiles, calibrations, plans and manifests are far smaller)
MAX_TEXT_BYTES = 64 << 20

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
    errno.ENAMETOOLONG: "file name too long for the file system",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EIO: "input/output error (a failing disk?)",
}


def _a(what: str) -> str:
    return f"an {what}" if what[:1].lower() in "aeiou" else f"a {what}"


def why(e: OSError) -> str:
    """A short, lower-case description of an OSError for a person (`moment.outputs.reason` too)."""
    return _REASONS.get(e.errno, (e.strerror or str(e)).lower()) if e.errno else str(e)


def exists(path: str | Path) -> bool:
    """Whether anything (a dangling symbolic link included) is at `path`; False for a path that cannot be
    looked up (a name too long, a part that is a file), where `Path.exists` raises."""
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


def _missing(p: Path, what: str, directory: bool) -> MomentError:
    if p.is_symlink():
        return MomentError(f"is a symbolic link to {os.readlink(p)}, which does not exist", source=str(p),
                           hint=f"expected {_a(what)}")
    return MomentError(f"{what} not found" if directory else f"file not found (expected {_a(what)})", source=str(p))


def _stat(p: Path, what: str, directory: bool) -> os.stat_result:
    if str(p).strip() == "":
        raise MomentError(f"empty path, expected {_a(what)}")
    try:
        return p.stat()
    except FileNotFoundError:
        raise _missing(p, what, directory) from None
    except OSError as e:
        raise MomentError(f"cannot read the {what}: {why(e)}", source=str(p)) from None


def check_file(path: str | Path, what: str) -> Path:
    """`path` as a Path, if it is a regular file (or a link to one) that this process may read."""
    p = Path(path)
    st = _stat(p, what, False)
    if stat.S_ISDIR(st.st_mode):
        raise MomentError(f"is a directory, expected {_a(what)}", source=str(p))
    if not stat.S_ISREG(st.st_mode):
        raise MomentError(f"is not a regular file (a device, pipe or socket), expected {_a(what)}", source=str(p))
    if not os.access(p, os.R_OK):
        raise MomentError(f"cannot read the {what}: permission denied", source=str(p))
    return p


def check_dir(path: str | Path, what: str) -> Path:
    """`path` as a Path, if it is a directory (or a link to one) whose entries this process may read
    (`what` names the kind of directory, e.g. "dataset directory")."""
    p = Path(path)
    st = _stat(p, what, True)
    if not stat.S_ISDIR(st.st_mode):
        raise MomentError(f"is a file, not {_a(what)}", source=str(p))
    if not os.access(p, os.R_OK | os.X_OK):
        raise MomentError(f"cannot read the {what}: permission denied", source=str(p))
    return p


#: while a command's answer is recorded (moment.cli.answers): each file read here, as (absolute path, sha256)
_read_log: list[tuple[str, str]] | None = None


@contextmanager
def logging_reads() -> Iterator[list[tuple[str, str]]]:
    """The files read through `read_bytes` inside the block: what a kept answer depends on."""
    global _read_log
    old, _read_log = _read_log, []
    try:
        yield _read_log
    finally:
        if old is not None:
            old.extend(_read_log)
        _read_log = old


def read_bytes(path: str | Path, what: str, *, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The whole content of the file `what` at `path` (at most `limit` bytes)."""
    p = check_file(path, what)
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise MomentError(f"cannot read the {what}: {why(e)}", source=str(p)) from None
    if len(data) > limit:
        raise MomentError(f"is larger than {limit >> 20} MiB: too large for {_a(what)}", source=str(p))
    if _read_log is not None:
        _read_log.append((os.path.abspath(p), hashlib.sha256(data).hexdigest()))
    return data


def read_stdin(what: str, *, limit: int = MAX_TEXT_BYTES) -> bytes:
    """Standard input, whole (`-` for a file option that allows it); a terminal there is refused, since
    nothing would arrive until the person typed the output."""
    if sys.stdin is None or sys.stdin.isatty():
        raise MomentError(f"-: standard input is a terminal; pipe {_a(what)} in (e.g. `lspci -tv | moment scan "
                          "--from-lspci -`) or give a file")
    try:
        data = sys.stdin.buffer.read(limit + 1)
    except OSError as e:
        raise MomentError(f"-: cannot read standard input: {why(e)}") from None
    if len(data) > limit:
        raise MomentError(f"-: standard input is larger than {limit >> 20} MiB: too large for {_a(what)}")
    return data


def decode(data: bytes, source: str, what: str) -> str:
    """`data` as UTF-8 text; anything else (a binary file, another encoding) is one message saying where."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise MomentError(f"not a text file: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}) is not "
                          f"UTF-8; expected {_a(what)}", source=source) from None


def read_text(path: str | Path, what: str, *, limit: int = MAX_TEXT_BYTES) -> str:
    """The file `what` at `path` as UTF-8 text; anything else is one message saying where (`decode`)."""
    return decode(read_bytes(path, what, limit=limit), str(path), what)


def parse_ssd_paths(items: list[str]) -> dict[str, str]:
    """`--ssd-path ssd3=/mnt/nvme3` (repeatable) -> {ssd3: /mnt/nvme3}."""
    out: dict[str, str] = {}
    for it in items:
        key, sep, path = it.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"ssd\d+", key) or not path.strip():
            raise MomentError(f"--ssd-path {it!r}: expected ssdN=DIRECTORY, e.g. ssd3=/mnt/nvme3")
        if key in out:
            raise MomentError(f"--ssd-path names {key} twice")
        out[key] = path.strip()
    return out
