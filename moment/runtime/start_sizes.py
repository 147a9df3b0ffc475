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


def _measure() -> tuple[int, int] | None:
    """(agent, rank) from a fresh interpreter, None when it cannot run."""
    root = str(_moment_root().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        r = subprocess.run([sys.executable, "-c", FRESH], env=env, capture_output=True, text=True,
                           timeout=300, check=True)
        agent, rank = (int(x) for x in r.stdout.split()[-2:])
        return agent, rank
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


@functools.cache
def fresh_sizes() -> tuple[int, int]:
    """(torchrun's agent, a rank) as a fresh interpreter holds them. Falls back to this process's RSS with
    the layers loaded when no interpreter can be started."""
    got = _measure()
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
