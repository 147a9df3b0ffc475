"""Processes of a run die with the process that started them.

Why: `moment train` starts torchrun, which starts the ranks. Killed with SIGKILL, a parent runs no
clean-up, so its children would train on as orphans, holding memory, GPUs and the shared cache. Linux's
PR_SET_PDEATHSIG has the kernel send a signal to a child when its parent dies, even by SIGKILL: the
launcher sets it for torchrun, and each rank for itself. A no-op where prctl does not exist; the same
call names the runtime's threads (`name_this_thread`).
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15

try:  # resolved here, not in a forked child (where `preexec_fn` calls it)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent dies; `parent`: the pid the parent had
    when this process was made, so that a parent that died before this call is noticed too."""
    if _prctl is None or _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def name_this_thread(name: str) -> None:
    """The calling thread's name as the kernel shows it (top -H, perf, /proc/PID/task/TID/comm), cut to the
    15 bytes Linux keeps; a no-op where prctl does not exist."""
    if _prctl is not None:
        _prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
