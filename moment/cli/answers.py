"""Answers kept: `moment plan` (`moment compare`, `moment advise`) asked a question it answered before prints that
answer again, before any of the planner's libraries load.

A plan is a pure function of its command line, the files it reads, a few environment variables and the code, and
its libraries' import alone takes about twice the process floor (`bench/processes.py`), so no cold plan answers at
the floor. A script or a person asking the same question again (a notebook re-run, a sweep revisiting a point, a
CI job) gets the answer from $MOMENT_CACHE/answers instead: what the first run printed, byte for byte, with the
first run's own search statistics.

An answer is kept only for a command line whose every option is in KEPT (options that write files, read what
does not pass through `moment.inputs` or depend on the clock are not: a new option is not kept until it is
classified, and tests/test_answers.py checks KEPT against the command's options), only when the run exited 0 and
wrote nothing to stderr but its progress bar (`untracked`): no warning. Its key holds the command line, the working
directory, which of its words name a path, the environment variables the output depends on, the terminal's
width, the Python, the installed distributions and every file of the `moment` package (size and mtime); the
entry holds the path and sha256 of every file the run read through `moment.inputs`, each hashed again before the
answer is used, and the answer's own sha256. A changed input, a corrupt or foreign entry, an unreadable or
read-only cache are each a miss, never an error. `--fresh` (or MOMENT_ANSWERS=off) solves again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from moment import inputs
from moment.outputs import atomic_file, cache_root, sha256_file

#: the commands whose answers are kept -> their options that may be given (value-taking ones map to True)
KEPT = {
    "plan": {"--profile": True, "-p": True, "--gpus": True, "--ssds": True, "--gpu-model": True,
             "--ssd-model": True, "--inventory": True, "--set": True, "--feature-dim": True, "--gb-per-gpu": True,
             "--gpu-cache-share": True, "--cpu-cache-share": True, "--maxflow-backend": True,
             "--calibration": True, "--replay": False, "--data": True, "--json": False, "--fresh": False},
    "advise": {"--profile": True, "-p": True, "--budget": True, "--models": True, "--max-gpus": True,
               "--max-ssds": True, "--prices": True, "--top": True, "--years": True, "--pue": True,
               "--utilisation": True, "--machine-watts": True, "--set": True, "--data": True, "--machines-max": True,
               "--nic": True, "--nics": True, "--switch-gbit": True, "--json": False, "--jobs": True,
               "--fresh": False},
    "compare": {"--gpus": True, "--ssds": True, "--gpu-model": True, "--ssd-model": True, "--inventory": True,
                "--set": True, "--calibration": True, "--data": True, "--json": False, "--fresh": False},
}
#: the options of those commands whose runs are never kept, with why (the test checks KEPT | NOT_KEPT covers all)
NOT_KEPT = {
    "plan": {"--diagram": "writes a file", "--timeout": "its answer depends on the clock",
             "--cluster": "its file names profiles: a file made later could shadow a built-in name there",
             "--remote-fraction": "only with --cluster", "--help": "help", "-h": "help"},
    "advise": {"--help": "help", "-h": "help"},
    "compare": {"--help": "help", "-h": "help"},
}
#: the commands that take words besides their options (`moment compare PROFILE...`)
ARGUMENTS = frozenset({"compare"})
FRESH = "--fresh"
#: the environment variables rich and Moment read that change what a command prints
_ENV = ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TERM", "COLORTERM", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
        "JUPYTER_COLUMNS", "JUPYTER_LINES", "PYTHONIOENCODING", "PYTHONUTF8")
#: entries kept; beyond it the oldest go
MAX_ENTRIES = 256
_VERSION = 1


def enabled() -> bool:
    return os.environ.get("MOMENT_ANSWERS", "").strip().lower() not in ("0", "off", "no", "false")


def folder() -> Path:
    return cache_root() / "answers"


def question(argv: list[str]) -> Question | None:
    """The question `argv` asks, when its answer may be kept (None: run as usual, keep nothing)."""
    if not argv or argv[0] not in KEPT or not enabled():
        return None
    options, words, i = KEPT[argv[0]], argv[1:], 0
    while i < len(words):
        if not words[i].startswith("-"):  # an argument
            if argv[0] not in ARGUMENTS:
                return None
            i += 1
            continue
        name, eq, _ = words[i].partition("=")
        if name not in options or (eq and not options[name]):  # an unknown or unkept option, `--`
            return None
        i += 1 if eq or not options[name] else 2
    if i != len(words):
        return None
    try:
        return Question([w for w in argv if w != FRESH], fresh=FRESH in argv)
    except OSError:  # no working directory (removed under us): nothing to key on
        return None


class Question:
    """One command line's key, its kept answer (`replay`) and the recording of a new one (`recording`, `keep`)."""

    def __init__(self, argv: list[str], *, fresh: bool):
        self.fresh = fresh
        self.path = folder() / f"{_key(argv)}.json"
        self._out: _Tee | None = None
        self._err: _Tee | None = None
        self._reads: list[tuple[str, str]] = []

    def replay(self, out: IO[str], err: IO[str] | None = None) -> bool:
        """Print the kept answer to `out` when there is one and every file it read is as it was; on `err`, when
        it is a terminal, when the answer was kept (a person sees it was not solved now; a script's stderr stays
        empty, as the first run's was)."""
        if self.fresh:
            return False
        entry = _load(self.path)
        if entry is None or not all(_digest_of(path) == digest for path, digest in entry["reads"]):
            return False
        out.write(entry["stdout"])
        out.flush()
        if err is not None and _isatty(err):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.path.stat().st_mtime))
            err.write(f"(the answer kept on {when}: --fresh solves again)\n")
            err.flush()
        return True

    @contextmanager
    def recording(self) -> Iterator[None]:
        """The command's run: what it prints to stdout and whether it writes to stderr, and the files it reads."""
        self._out, self._err = _Tee(sys.stdout), _Tee(sys.stderr)
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self._out, self._err
        try:
            with inputs.logging_reads() as reads:
                yield
        finally:
            sys.stdout, sys.stderr = old
            self._reads = reads

    def keep(self, code: int) -> None:
        """Keep the recorded answer of a run that exited 0 having written nothing to stderr but its progress bar;
        a cache that cannot be written (read-only, full) keeps nothing and says nothing."""
        if code != 0 or self._out is None or self._err is None or self._err.text():
            return
        stdout = self._out.text()
        entry = {"version": _VERSION, "reads": sorted(set(self._reads)), "stdout": stdout, "sha256": _sha(stdout)}
        try:
            with atomic_file(self.path, text=True) as f:
                json.dump(entry, f)
            _prune(self.path.parent)
        except OSError:
            pass


class _Tee:
    """A text stream that passes everything on to `stream` and keeps a copy (rich asks it what `stream` is)."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._parts: list[str] = []

    def write(self, s: str) -> int:
        self._parts.append(s)
        return self._stream.write(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def text(self) -> str:
        return "".join(self._parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def untracked(stream: IO[str]) -> IO[str]:
    """The stream under a recording's copy of it: what is written there (a progress bar) is not part of the
    answer, and does not keep a run's answer from being kept as a warning does."""
    return stream._stream if isinstance(stream, _Tee) else stream


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _digest_of(path: str) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def _load(path: Path) -> dict | None:
    """The entry at `path` when it is whole and ours; None for anything else (missing, corrupt, older, or written
    by another user: in a cache folder others can write to, their entry would print their answer as ours)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return None
            entry = json.loads(f.read().decode("utf-8"))
        ok = (entry["version"] == _VERSION and isinstance(entry["stdout"], str)
              and _sha(entry["stdout"]) == entry["sha256"]
              and all(isinstance(p, str) and isinstance(d, str) for p, d in entry["reads"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entry if ok else None


def _prune(where: Path) -> None:
    entries = sorted(where.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    for old in entries[:max(0, len(entries) - MAX_ENTRIES)]:
        old.unlink(missing_ok=True)


def _key(argv: list[str]) -> str:
    h = hashlib.sha256()
    for part in _key_parts(argv):
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


def _key_parts(argv: list[str]) -> Iterator[str]:
    yield str(_VERSION)
    yield sys.version
    yield sys.executable
    yield os.getcwd()
    for word in argv:
        yield word
        yield "path" if inputs.exists(word) else "-"
    for name in _ENV:
        yield f"{name}={os.environ.get(name)}"
    for name in sorted(k for k in os.environ if k.startswith("MOMENT_") and k != "MOMENT_ANSWERS"):
        yield f"{name}={os.environ[name]}"
    yield _terminal(sys.stdout)
    yield from _installed()
    yield from _code()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False


def _terminal(stream: IO[str]) -> str:
    tty = _isatty(stream)
    try:
        size = os.get_terminal_size(stream.fileno()) if tty else None
    except (OSError, ValueError, AttributeError):
        size = None
    return f"tty={tty} size={size} encoding={getattr(stream, 'encoding', None)}"


def _installed() -> Iterator[str]:
    """The distributions installed where Python imports from (their versions are in the names)."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        yield entry
        yield from sorted(n for n in names if n.endswith((".dist-info", ".egg-info", ".pth")))


def _code() -> Iterator[str]:
    """Every file of the `moment` package (built-in profiles and native kernels too), by size and mtime."""
    top = Path(__file__).resolve().parent.parent
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            yield f"{root}/{name}:{st.st_size}:{st.st_mtime_ns}"
