"""What a fresh rank and a fresh torchrun agent hold before they touch data, measured once per process.

Why a fresh interpreter: the caller of a preview (`moment train`'s launcher, a benchmark holding a
dataset) is not a rank, so its own RSS is not a rank's fixed cost. Why not kept across processes: most
of it is torch's shared libraries, and how many of their pages a process maps depends on how the page
cache came to hold them (one installation measured 443 MiB for a rank, then 376 MiB after the page
cache was dropped, and stayed there), so a figure kept from an earlier day disagrees with what the
rank measures of itself at start, and the launcher's minimum would then be refused by the rank.
Measured now, the preview and the ranks it starts see the same page cache.
"""

from __future__ import annotations

import atexit
import functools
import os
import subprocess
import sys
from pathlib import Path

from moment.runtime.budget import process_bytes

# Imports inside functions: the models load only when a start size is measured.

#: a fresh interpreter: first what torchrun's agent imports, then what a rank loads before touching data
FRESH = ("from moment.runtime.budget import process_bytes\nimport torch.distributed.run\nprint(process_bytes())\n"
         "from moment.runtime.models import load_layers\nimport moment.runtime.train\nload_layers()\n"
         "print(process_bytes())\n")


def _moment_root() -> Path:
    return Path(__file__).resolve().parents[1]  # the moment package (this is moment/runtime/start_sizes.py)


def _start() -> subprocess.Popen | None:
    """The fresh interpreter, started (None when it cannot be)."""
    root = str(_moment_root().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        return subprocess.Popen([sys.executable, "-c", FRESH], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def _collect(p: subprocess.Popen | None) -> tuple[int, int] | None:
    """(agent, rank) from the fresh interpreter `p`, None when it could not run."""
    if p is None:
        return None
    try:
        out, _ = p.communicate(timeout=300)
        if p.returncode:
            return None
        agent, rank = (int(x) for x in out.split()[-2:])
        return agent, rank
    except (subprocess.SubprocessError, ValueError, IndexError):
        p.kill()
        p.communicate()
        return None


_ahead: list[subprocess.Popen | None] = []  # the interpreter `measure_ahead` started, until collected


def measure_ahead() -> None:
    """Start the measurement now and collect it when a size is first asked for: the launcher's own checks (the
    layout, the dataset, the graph) then run while the fresh interpreter loads torch, seconds of the preview."""
    if not _ahead and fresh_sizes.cache_info().currsize == 0:
        _ahead.append(_start())


def _stop_ahead() -> None:
    """At exit (a user error before the sizes were asked for): no interpreter outlives the launcher."""
    for p in _ahead:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_stop_ahead)


@functools.cache
def fresh_sizes() -> tuple[int, int]:
    """(torchrun's agent, a rank) as a fresh interpreter holds them. Falls back to this process's RSS with
    the layers loaded when no interpreter can be started."""
    got = _collect(_ahead.pop() if _ahead else _start())
    if got is None:
        from moment.runtime.models import load_layers

        load_layers()
        return process_bytes(), process_bytes()
    return got


def rank_start_bytes() -> int:
    """What a rank holds before it touches data (interpreter, torch, the runtime, the model's layers)."""
    return fresh_sizes()[1]


def agent_start_bytes() -> int:
    """What torchrun's agent (a Python process that imports torch.distributed.run) holds, measured the
    same way before it exists; the ranks, once started, measure their parent (`agent_bytes`)."""
    return fresh_sizes()[0]
