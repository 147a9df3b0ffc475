"""What a fresh rank and a fresh torchrun agent hold before they touch data, measured once per installation.

Why a fresh interpreter: the caller of a preview (`moment train`'s launcher, a benchmark holding a
dataset) is not a rank, so its own RSS is not a rank's fixed cost. Why kept: the measurement imports
torch and torch-geometric (~5 s of CPU on 2 cores) and every `moment train`, a dry run included, needs
it, while the figures depend only on the interpreter, the installed torch and torch-geometric, and
Moment's own code. So they are kept under `cache_root()/start-sizes`, one small file per such key, and
measured again when any of them changes. MOMENT_MEASURE_START=1 measures every time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from moment.errors import MomentError
from moment.outputs import atomic_write, cache_root
from moment.runtime.budget import process_bytes

#: a fresh interpreter: first what torchrun's agent imports, then what a rank loads before touching data
FRESH = ("from moment.runtime.budget import process_bytes\nimport torch.distributed.run\nprint(process_bytes())\n"
         "from moment.runtime.models import load_layers\nimport moment.runtime.train\nload_layers()\n"
         "print(process_bytes())\n")
NO_CACHE_ENV = "MOMENT_MEASURE_START"


def _moment_root() -> Path:
    import moment

    return Path(moment.__file__).resolve().parent


def cache_key() -> str:
    """What the figures depend on: the interpreter, torch's and torch-geometric's releases, and the
    content of every Python file of Moment (the rank imports most of them)."""
    h = hashlib.sha256(FRESH.encode())
    h.update(f"{os.path.realpath(sys.executable)}|{sys.version}".encode())
    for dist in ("torch", "torch_geometric"):
        try:
            h.update(f"|{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"|{dist}=none".encode())
    root = _moment_root()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:24]


def cache_file(key: str) -> Path:
    return cache_root() / "start-sizes" / f"{key}.json"


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


def _read(path: Path) -> tuple[int, int] | None:
    try:
        d = json.loads(path.read_text())
        agent, rank = int(d["agent_bytes"]), int(d["rank_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: measured again and rewritten
    return (agent, rank) if agent > 0 and rank > 0 else None


@functools.cache
def fresh_sizes() -> tuple[int, int]:
    """(torchrun's agent, a rank) as a fresh interpreter holds them, from the cache when it has them for
    this installation. Falls back to this process's RSS with the layers loaded (not kept) when no
    interpreter can be started."""
    key = None if os.environ.get(NO_CACHE_ENV) else cache_key()
    if key is not None and (got := _read(cache_file(key))) is not None:
        return got
    got = _measure()
    if got is None:
        from moment.runtime.models import load_layers

        load_layers()
        return process_bytes(), process_bytes()
    if key is not None:
        try:  # a cache that cannot be written (read-only home, full disk) only costs the next run a measurement
            atomic_write(cache_file(key), json.dumps({"agent_bytes": got[0], "rank_bytes": got[1]}) + "\n")
        except (OSError, MomentError):
            pass
    return got


def rank_start_bytes() -> int:
    """What a rank holds before it touches data (interpreter, torch, the runtime, the model's layers)."""
    return fresh_sizes()[1]


def agent_start_bytes() -> int:
    """What torchrun's agent (a Python process that imports torch.distributed.run) holds, measured the
    same way before it exists; the ranks, once started, measure their parent (`agent_bytes`)."""
    return fresh_sizes()[0]
