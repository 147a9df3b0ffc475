"""A record of every torch.distributed call a rank makes: which operation, on which group, from which
thread. Off unless the environment asks (`MOMENT_TRACE_COLLECTIVES=DIR`): tests and `moment doctor` use
it to show that a rank issues all its collectives from one thread, in the same order as every other rank
(NCCL deadlocks otherwise; gloo does not care, so a CPU run cannot show it any other way).

It wraps the functions of the `torch.distributed` module (the names `COLLECTIVES`), which Moment calls
as `dist.<name>`; torch's own calls between its functions, and DDP's gradient all-reduce (issued by its
C++ reducer, inside `backward` on the calling thread), are not seen. Each rank writes
DIR/collectives-rank<R>.json when its process group is closed (moment.runtime.dist.DistContext.close).
"""

from __future__ import annotations

import functools
import json
import os
import threading
from pathlib import Path
from typing import Any

from moment.errors import MomentError

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

TRACE_ENV = "MOMENT_TRACE_COLLECTIVES"

#: the functions of torch.distributed that talk to other ranks (and make groups: a collective too)
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "gather",
               "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
               "send", "recv", "isend", "irecv", "batch_isend_irecv", "new_group", "new_subgroups",
               "new_subgroups_by_enumeration")

_calls: list[dict[str, Any]] = []
_installed = False


def _group(kwargs: dict[str, Any]) -> list[int] | None:
    """The ranks of the call's group (None: the world's)."""
    import torch.distributed as dist

    g = kwargs.get("group")
    if g is None or g is dist.group.WORLD:
        return None
    try:
        return list(dist.get_process_group_ranks(g))
    except (RuntimeError, ValueError):
        return []


def _kind(call: dict[str, Any]) -> tuple[str, str]:
    """What must be the same on every rank: the operation, and the world or a subgroup of its size (the ranks
    of different machines call their own machine's group at the same point)."""
    g = call["group"]
    return call["op"], "world" if g is None else f"a group of {len(g)}"


def install() -> bool:
    """Wrap torch.distributed's collectives to record each call, when the environment asks; returns
    whether it does. Idempotent."""
    global _installed
    if _installed or not os.environ.get(TRACE_ENV):
        return _installed
    import torch.distributed as dist

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        def wrap(fn=fn, name=name):
            @functools.wraps(fn)
            def call(*args, **kwargs):
                t = threading.current_thread()
                _calls.append({"op": name, "group": _group(kwargs), "thread": t.name,
                               "main": t is threading.main_thread(), "async": bool(kwargs.get("async_op"))})
                return fn(*args, **kwargs)
            return call

        setattr(dist, name, wrap())
    _installed = True
    return True


def calls() -> list[dict[str, Any]]:
    """The calls recorded so far in this process, in order."""
    return list(_calls)


def write(rank: int) -> Path | None:
    """Write this rank's record to the directory the environment names (None: not tracing)."""
    where = os.environ.get(TRACE_ENV)
    if not _installed or not where:
        return None
    from moment.outputs import atomic_write

    out = Path(where) / f"collectives-rank{rank}.json"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MomentError(f"{TRACE_ENV}={where}: cannot make the directory: {e.strerror}") from None
    atomic_write(out, json.dumps({"rank": rank, "calls": _calls}), TRACE_ENV)
    return out


def check(traces: list[list[dict[str, Any]]]) -> list[str]:
    """What is wrong with the ranks' records (each a list of calls, rank order): a rank calling from more
    than one thread, or two ranks whose sequences of (operation, group) differ. Empty: nothing."""
    problems = []
    for r, calls_ in enumerate(traces):
        threads = sorted({c["thread"] for c in calls_})
        if len(threads) > 1:
            first = next(c for c in calls_ if c["thread"] != calls_[0]["thread"])
            problems.append(f"rank {r} issued collectives from {len(threads)} threads ({', '.join(threads)}): "
                            f"e.g. {first['op']} on {_kind(first)[1]} from {first['thread']}")
    seqs = [[_kind(c) for c in calls_] for calls_ in traces]
    for r in range(1, len(seqs)):
        if seqs[r] != seqs[0]:
            i = next((i for i, (a, b) in enumerate(zip(seqs[0], seqs[r], strict=False)) if a != b),
                     min(len(seqs[0]), len(seqs[r])))
            problems.append(f"rank {r}'s collective {i + 1} is {_say(seqs[r], i)}, rank 0's is {_say(seqs[0], i)} "
                            f"({len(seqs[r])} calls against {len(seqs[0])})")
    return problems


def _say(seq: list[tuple[str, str]], i: int) -> str:
    return f"{seq[i][0]} on {seq[i][1]}" if i < len(seq) else "nothing (its record ends)"
