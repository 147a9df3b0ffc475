"""Where a rank's output goes when `moment train` launched it.

torchrun's own messages (agent warnings, the ChildFailedError traceback) belong in a log file, the
ranks' (progress, errors, restart notes) on the user's screen. Both normally share torchrun's stdout
and stderr, which the ranks inherit. So `moment train` sends torchrun's streams to its log and names
its own stdout/stderr in the environment (`/proc/<pid>/fd/1`, `.../2`); each rank reopens those
first thing. Opening with O_APPEND keeps a redirected file from being overwritten. Where the paths
cannot be opened (no /proc, a socket) the rank keeps torchrun's streams: its output lands in the log,
and the launcher shows the ranks' error lines from there.
"""

from __future__ import annotations

import os
import sys

OUT_ENV, ERR_ENV = "MOMENT_CONSOLE_OUT", "MOMENT_CONSOLE_ERR"


def console_env(pid: int | None = None) -> dict[str, str]:
    """What the launcher puts in the ranks' environment: its own stdout and stderr, by path."""
    pid = os.getpid() if pid is None else pid
    if not os.path.isdir(f"/proc/{pid}/fd"):
        return {}
    return {OUT_ENV: f"/proc/{pid}/fd/1", ERR_ENV: f"/proc/{pid}/fd/2"}


_log_fd: int | None = None


def attach_console() -> bool:
    """Reopen stdout/stderr on the launcher's (see module doc); True when both were reattached.
    torchrun's stderr stays reachable through `log_stream()` for details the screen need not show."""
    global _log_fd
    done = 0
    for fd, var, stream in ((1, OUT_ENV, sys.stdout), (2, ERR_ENV, sys.stderr)):
        path = os.environ.get(var)
        if not path:
            continue
        try:
            new = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue
        if stream is not None:
            stream.flush()
        if fd == 2 and _log_fd is None:
            _log_fd = os.dup(2)
        os.dup2(new, fd)
        os.close(new)
        done += 1
    return done == 2


def log_stream():
    """A text stream into torchrun's log when the console was reattached, else stderr."""
    if _log_fd is None:
        return sys.stderr
    return os.fdopen(os.dup(_log_fd), "w", closefd=True)
