"""Output paths: checked before any work starts, written atomically, with the modes the umask asks for.

The package's base file helpers live here, once: `atomic_write`/`atomic_file` (every single-file
writer), `publish_dir` (every directory writer: dataset, hotness, pack, layout), `fsync_dir`,
`sha256_file`, `ChunkHasher` and its reader `bad_chunk`, `check_output`, `write_error`, `follow_umask`,
and the rules of what a writer may delete: `check_replaceable` (an existing output is replaced only when
Moment wrote it and it holds nothing else) and `remove_stale` (what a killed writer left behind; a
previous version it had set aside is put back).

Every command that writes (datasets, layouts, profiles, diagrams, metrics) checks its output path up
front with `check_output`, so a read-only directory, a path under a regular file or a missing
directory is one message naming the option, before minutes of sampling or solving. An OSError while
writing (a full disk) becomes `write_error`'s one-line message; the writers remove what they had
written. Temporary files and directories made by `tempfile` are private (0600/0700); `follow_umask`
gives the finished output the mode every other tool would (0644/0755 under umask 022).

Temporary names carry the writer's pid (`.NAME.tmp-PID-XXXXXXXX`, `.NAME.old-PID`), so a later writer
of the same output removes what a killed one left (`remove_stale`) and never what a running one is
writing.

This module sits beside `moment.errors` at the bottom of the package: everything may import it.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from moment import testpoints
from moment.errors import MomentError
from moment.inputs import exists, read_text
from moment.inputs import why as reason  # one description of an OSError, for readers and writers
from moment.locking import pid_alive

#: bytes the longest name Moment derives from an output's name adds to it (lock file, temporaries,
#: a layout's `.partial`/`.old` and its shard directories `moment-NAME-KEY-N.shards.partial`)
DERIVED_NAME_BYTES = 40
#: rich's width for output that is not a terminal and has no COLUMNS: in practice no wrapping at all
UNWRAPPED = 10_000


def console_width(stream: IO[str]) -> int | None:
    """rich's width for `stream`. A terminal's own width, or COLUMNS where set (None: rich reads both);
    else none at all (UNWRAPPED): piped output goes to logs and tools, which a fixed width would cut
    mid-name and mid-row."""
    if stream.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    return UNWRAPPED


def _label(path: str | Path, what: str | None) -> str:
    return f"{what} {path}" if what else str(path)


def write_error(e: OSError, path: str | Path, what: str | None = None, doing: str = "cannot write",
                hint: str | None = None) -> MomentError:
    """The one-line message for an OSError met while writing `path` (`what` names the option; `hint`, when the
    default one of a full disk would point at the wrong option)."""
    if hint is None and e.errno in (errno.ENOSPC, errno.EDQUOT):
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
    while not exists(p) and p != p.parent:
        p = p.parent
    return p


def name_max(directory: Path) -> int:
    """The longest name (bytes) the file system holding `directory` allows (255 where it cannot say)."""
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def check_name(p: Path, src: str) -> None:
    """Refuse an output path without a name of its own (`/`, `.`, `..`) or with a name the file system
    cannot hold once Moment adds its temporary suffixes (`DERIVED_NAME_BYTES`)."""
    if p.name in ("", ".", "..") or p.absolute() == p.absolute().parent:
        raise MomentError("names no file or directory of its own (the root, `.` or `..`): give the name of "
                          "the output to create, e.g. out/NAME", source=src)
    limit = name_max(_nearest_existing(p.absolute().parent))
    for part in p.absolute().parts[1:]:
        n = len(os.fsencode(part))
        room = limit - (DERIVED_NAME_BYTES if part == p.name else 0)
        if n > room:
            what = "the output's name" if part == p.name else f"the path part {part[:24]}..."
            raise MomentError(f"{what} is {n} bytes long; this file system allows {limit} per name"
                              + (f" and Moment adds up to {DERIVED_NAME_BYTES} for its temporary names: use at "
                                 f"most {room}" if part == p.name else ""), source=src)


def check_output(path: str | Path, what: str | None = None, *, directory: bool = False,
                 create_parents: bool | None = None) -> Path:
    """Check up front that `path` can be written; returns it as a Path.

    `directory`: the output is a directory (a dataset, a layout) rather than a file. Directories may
    have missing parents created (`create_parents`, default True for directories, False for files:
    a file's directory must exist, as with any other tool). Fails, naming `what` (the option) and the
    path, when the path is empty or names nothing of its own (`/`), a name is too long for the file
    system, a file is where a directory must be (or the reverse), a part of the path is a regular file,
    the directory is missing, or the directory cannot be written (permissions, read-only file system:
    tried for real with a temporary file, so root is not fooled by the mode).
    """
    if str(path).strip() == "":
        raise MomentError("empty path", source=what)
    p = Path(path)
    src = _label(p, what)
    check_name(p, src)
    if create_parents is None:
        create_parents = directory
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):  # nothing there yet (a part that is a file: see below)
        st = None
    except OSError as e:
        raise MomentError(f"cannot look it up: {reason(e)}", source=src) from None
    if st is not None and stat.S_ISDIR(st.st_mode) and not directory:
        raise MomentError("is a directory, expected a file name", source=src)
    if st is None and p.is_symlink():
        raise MomentError(f"is a symbolic link to {os.readlink(p)}, which does not exist: refusing to write "
                          "through it", source=src)
    if st is not None and directory and not stat.S_ISDIR(st.st_mode):
        raise MomentError("exists and is a file, not a directory", source=src)
    parent = p.absolute().parent
    anchor = _nearest_existing(parent)
    if anchor.is_symlink() and not anchor.exists():
        raise MomentError(f"{anchor} is a symbolic link to {os.readlink(anchor)}, which does not exist", source=src)
    if not anchor.is_dir():
        raise MomentError(f"{anchor} is a file, not a directory", source=src)
    if anchor != parent and not create_parents:
        raise MomentError(f"directory {parent} does not exist", source=src, hint="create it first")
    if not directory and (owner := moment_directory(anchor)) is not None:
        raise MomentError(f"is inside {owner[1]} {owner[0]}, which Moment wrote: a file written there would damage "
                          "it", source=src, hint="write it elsewhere")
    probe_writable(anchor, src)
    return p


#: a split layout's own files beside its machines' layouts (moment.placement.split writes them): its cluster
#: manifest and its owners file. Named here, at the bottom, since no machine may take either name
#: (moment.topology.cluster.check_machine_names): its layout would take the file's place
SPLIT_MANIFEST = "cluster.json"
SPLIT_OWNERS = "owners.npy"

#: the files whose JSON marks a directory as a Moment writer's: a dataset's, layout's or pack's manifest, a
#: split's cluster file, a hotness directory's record
_OWNED_BY = {"manifest.json": "format", SPLIT_MANIFEST: "format", "hotness.json": "num_nodes"}
_KINDS = {"moment-graph": "the dataset", "moment-layout": "the layout", "moment-pack": "the pack",
          "moment-split": "the split layout"}


def moment_directory(directory: Path) -> tuple[Path, str] | None:
    """(the nearest of `directory` and its parents that a Moment writer made, what it is), or None: a file
    output placed there would replace a file it names or be one it does not (which `layout rm` and an
    overwrite then refuse), so single-file outputs are refused there (`--trace-out ds/features.npy` replaced
    the dataset's features)."""
    for d in (directory, *directory.parents):
        for name, key in _OWNED_BY.items():
            if (d / name).is_file() and (head := manifest_head(d, name)) is not None and key in head:
                fmt = head.get("format")
                if name != "hotness.json" and not (isinstance(fmt, str) and fmt.startswith("moment-")):
                    continue
                return d, _KINDS.get(fmt, "the hotness record" if name == "hotness.json" else "Moment's directory")
    return None


def create_reason(e: OSError, directory: str | Path) -> str:
    """Why a file could not be created in `directory` (`reason`), but for "no such file or directory" in one that
    is there: its file system makes no files a program asks for (/proc, /sys: the kernel's), which that names
    wrongly."""
    if e.errno == errno.ENOENT and os.path.isdir(directory):
        return "its file system takes no new files (a kernel file system, as /proc and /sys are)"
    return reason(e)


def probe_writable(directory: Path, src: str) -> None:
    """Create and remove a temporary file in `directory`; a failure is the user's error about `src`."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moment-probe-", dir=directory)
    except OSError as e:
        raise MomentError(f"cannot write in {directory}: {create_reason(e, directory)}", source=src) from None
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
    in `writing(path, what)` for an OSError as one message naming the option and the path). A symbolic
    link to a file is written through: its target is replaced, the link stays. A device, a pipe or a socket
    (`--out /dev/stdout`, a FIFO a reader waits on) is written into as it is: replaced by a file, /dev/null or
    /dev/full became a regular file, run as root."""
    if _special(path):
        with open(path, "w" if text else "wb") as f:
            yield f
            f.flush()
        return
    path = Path(os.path.realpath(path)) if os.path.islink(path) and os.path.isfile(path) else Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), dir=path.parent)
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


def _special(path: str | Path) -> bool:
    """Whether `path` (its link's target) is a device, a pipe or a socket: no file to replace, a stream to write."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def cache_root() -> Path:
    """Where Moment keeps what it can rebuild (compiled kernels): $MOMENT_CACHE,
    else ~/.cache/moment. Anything there may be deleted at any time."""
    return Path(os.environ.get("MOMENT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "moment"))


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


def bad_chunk(path: str | Path, chunk: int, sums: list[str], which: Iterable[int] | None = None,
              progress: Callable[[int], Any] | None = None) -> int | None:
    """The first of the chunks `which` (all when None, in order) of the file at `path` whose sha256 is not
    the one a `ChunkHasher` of `chunk` bytes recorded in `sums`; None when all match. `progress(n)`
    after each chunk read. One rule for every reader of chunked checksums (layout verify, the runtime's
    first-touch check, a dataset's spot check): a short or missing tail hashes differently, so a
    truncated file is found at its first short chunk."""
    with open(path, "rb") as f:
        for k in range(len(sums)) if which is None else which:
            data = os.pread(f.fileno(), chunk, k * chunk)
            if progress:
                progress(len(data))
            if hashlib.sha256(data).hexdigest() != sums[k]:
                return int(k)
    return None


def document_sha256(doc: dict[str, Any]) -> str:
    """A JSON document's own checksum (a layout's manifest.json, a split's cluster.json, a hotness's hotness.json):
    sha256 of its canonical JSON (keys sorted, no spaces) with its `sha256` field left empty. Every key counts, so
    an edit to one the reader does not know is seen too."""
    body = dict(doc)
    body["sha256"] = ""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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


# ---- what a writer may delete --------------------------------------------------------------------------


def temp_prefix(out: Path) -> str:
    """The prefix of this process's temporary names for `out`: `.NAME.tmp-PID-` (tempfile adds the rest)."""
    return f".{out.name}.tmp-{os.getpid()}-"


def set_aside_name(out: Path) -> Path:
    """Where this process moves the previous version of `out` while it puts the new one in place."""
    return out.with_name(f".{out.name}.old-{os.getpid()}")


def stale(out: str | Path, *, set_aside: bool = False) -> list[Path]:
    """What writers of `out` that are no longer running left beside it: temporaries (`.NAME.tmp-PID-...`)
    and, with `set_aside` (directory writers that swap), a previous version set aside (`.NAME.old-PID`);
    never what a running process is writing."""
    out = Path(out).absolute()
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?:tmp-(?P<tmp>[0-9]+)-[A-Za-z0-9_]+|old-(?P<old>[0-9]+))")
    try:
        entries = sorted(e.name for e in os.scandir(out.parent))
    except OSError:
        return []
    found = []
    for name in entries:
        m = pattern.fullmatch(name)
        if m is not None and (set_aside or not m["old"]) and not pid_alive(int(m["tmp"] or m["old"])):
            found.append(out.parent / name)
    return found


def remove_stale(out: str | Path, *, set_aside: bool = False) -> list[Path]:
    """Remove `stale(out)`; a previous version whose replacement never arrived (killed between the two
    renames) is put back at `out` instead. Returns what was removed."""
    out = Path(out).absolute()
    removed = []
    for p in stale(out, set_aside=set_aside):
        try:
            if p.name.startswith(f".{out.name}.old-") and put_back(out, p):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
        except OSError:  # not ours to remove after all (another user's): leave it
            continue
    return removed


# ---- putting a finished directory in place -------------------------------------------------------------

_RENAME_EXCHANGE = 2


def exchange(a: str | Path, b: str | Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the file system or
    the platform lacks it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_dir(new: str | Path, out: str | Path, point: str, aside: str | Path | None = None) -> Path | None:
    """Put the complete directory `new` at `out` so that a kill -9 at any instant leaves the old version or
    the new one at `out` (or, on a file system without an atomic swap, the old one at `aside`, which the
    next writer puts back); returns where the previous version now is, for the caller to delete once
    nothing refers to it (None: there was none). Call it holding the output's lock.

    Where the file system swaps atomically (renameat2 RENAME_EXCHANGE) `new` and `out` trade places in
    one step; elsewhere `out` is renamed to `aside` (default `set_aside_name(out)`, which `remove_stale`
    puts back) and then `new` to `out`. Test points `POINT-old-moved` (between those two renames) and
    `POINT-swapped` (the new version in place, the old one not yet removed)."""
    new, out = Path(new), Path(out)
    if not exists(out):
        os.rename(new, out)
        fsync_dir(out.parent)
        return None
    if exchange(new, out):
        old = new
    else:
        old = Path(aside) if aside is not None else set_aside_name(out)
        os.rename(out, old)
        testpoints.reach(f"{point}-old-moved")
        os.rename(new, out)
    fsync_dir(out.parent)
    testpoints.reach(f"{point}-swapped")
    return old


#: the file by which Moment knows LAYOUT.partial / LAYOUT.old (and a split's) as its own: it holds LAYOUT's name.
#: A user's layout written with `--out LAYOUT.partial`, or their files there, never carry it for LAYOUT, so they are
#: never removed or put back as a killed write's leftovers
LEFTOVER_MARK = ".moment-leftover"


def make_partial(partial: Path, out: Path) -> None:
    """Create `partial`, where a write of `out` is assembled, with the mark naming `out` from its first instant:
    it is made under a temporary name (`.NAME.tmp-PID-...`, which `remove_stale(out)` clears after a kill) and
    renamed."""
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), dir=partial.parent))
    follow_umask(tmp, directory=True)
    (tmp / LEFTOVER_MARK).write_text(out.name)
    os.rename(tmp, partial)


def mark_leftover(d: Path, out: Path) -> None:
    """Mark the version of `out` at `d` as Moment's to remove, before it is moved aside (to a .partial or .old
    name) by a swap or a removal. The new version keeps the mark until its writer drops it."""
    (d / LEFTOVER_MARK).write_text(out.name)


def is_leftover(d: Path, out: Path) -> bool:
    """Whether `d` (OUT.partial, OUT.old) exists and a write or removal of `out` left it: it holds the mark naming
    `out`. False when it does not exist; a MomentError naming `d` when it exists and is not Moment's leftover
    (it is left as it is, and the caller refuses to go on)."""
    if not exists(d):
        return False
    try:
        if d.is_dir() and not d.is_symlink() and (d / LEFTOVER_MARK).read_text() == out.name:
            return True
    except (OSError, UnicodeDecodeError):
        pass
    raise MomentError(f"exists, and is not what a killed write or removal of {out.name} left: refusing to remove "
                      "it or to go on", source=str(d), hint="move it or rename it, or choose another --out")


def put_back(out: str | Path, aside: str | Path) -> bool:
    """Undo a `publish_dir` killed between its two renames: the previous version at `aside` goes back to
    `out` when nothing is there. Returns whether it did."""
    out, aside = Path(out), Path(aside)
    if exists(out) or not aside.is_dir() or aside.is_symlink():
        return False
    os.rename(aside, out)
    fsync_dir(out.parent)
    return True


def manifest_head(directory: str | Path, name: str = "manifest.json") -> dict | None:
    """The JSON object in `directory`/`name`, or None when there is none or it is not a readable JSON
    object (what decides whether a directory is one a Moment writer made)."""
    try:
        head = json.loads(read_text(Path(directory) / name, name))
    except (MomentError, ValueError, RecursionError):
        return None
    return head if isinstance(head, dict) else None


def unnamed_entries(directory: str | Path, named: set[str]) -> list[str]:
    """What is under `directory` that `named` (paths relative to it, '/'-separated) does not name: files
    and links by their path, directories holding no named file by their path and a '/'. A writer that
    owns exactly `named` may delete the directory only when this is empty."""
    root = Path(directory)
    extra: list[str] = []
    unreadable: list[str] = []
    for base, dirs, files in os.walk(root, onerror=lambda e: unreadable.append(f"{e.filename} (unreadable)")):
        rel = Path(base).relative_to(root).as_posix()
        pre = "" if rel == "." else rel + "/"
        links = [d for d in dirs if (Path(base) / d).is_symlink()]
        foreign = [d for d in dirs if d not in links and not any(n.startswith(f"{pre}{d}/") for n in named)]
        extra += [f"{pre}{d}/" for d in foreign]
        dirs[:] = [d for d in dirs if d not in links and d not in foreign]
        extra += [f"{pre}{f}" for f in files + links if f"{pre}{f}" not in named]
    return sorted(extra + unreadable)


def check_replaceable(path: str | Path, what: str, named: set[str] | None, *, verb: str = "replace",
                      hint: str | None = "choose another --out", unnamed: str | None = None) -> None:
    """Refuse to delete `path` (to replace or remove it) unless Moment wrote it: it must be an empty
    directory, or a `what` whose own manifest names `named` (None: it has no manifest Moment wrote for a
    `what`) and that holds nothing else. The message names what would otherwise be lost (`unnamed` says
    why it is not the writer's, by default "which the WHAT's manifest does not name")."""
    p = Path(path)
    if p.is_symlink():  # its target is not replaced through it: said as a link, not as no directory at all
        target = os.readlink(p)
        raise MomentError(f"is a symbolic link to {target}: refusing to {verb} it", source=str(p),
                          hint=f"give the directory itself ({os.path.realpath(p)})" if p.is_dir() else hint)
    if not p.is_dir():
        raise MomentError(f"exists and is not a {what} directory; refusing to {verb} it", source=str(p), hint=hint)
    try:
        empty = not any(os.scandir(p))
    except OSError as e:
        raise MomentError(f"cannot list it: {reason(e)}; refusing to {verb} it", source=str(p)) from None
    if empty:
        return
    if named is None:
        raise MomentError(f"exists and is not a Moment {what} (it has no manifest.json that Moment wrote for "
                          f"one); refusing to {verb} it", source=str(p), hint=hint)
    extra = unnamed_entries(p, named)
    if extra:
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        why = unnamed or f"which the {what}'s manifest does not name"
        raise MomentError(f"holds {', '.join(extra[:5])}{more}, {why}: refusing to {verb} it (they would be lost)",
                          source=str(p), hint="move them out of it first")
