"""The memory a run held at its peak, measured, to set beside what its budget split predicted.

Why measured and not added up: the budget (moment.runtime.budget) is a prediction; only the kernel
knows what the processes held. A cgroup charges a page once however many processes map it: a shared
library, a data file every rank maps (the graph structure), a /dev/shm segment, and the pages forked
ranks still share with the torchrun agent they were forked from. The kernel says, per process, which of
its resident pages it alone maps (smaps_rollup's Private_*) and which it shares; the processes of a run
share nearly the same pages (each rank maps the libraries, the graph and the segments the others map, and
a forked rank the agent's memory), so the run's peak on one machine is

    sum over its ranks and torchrun's agent (the ranks' parent), when there is one, of
    (peak RSS - the pages it shares now)  +  the most pages any of them shares now

read at the end: what a process held above its end (its batches, its heap) was its own. Per-rank peaks
are the kernel's high-water mark (VmHWM), reset when a run starts, so a run inside a longer-lived process
(a test, a notebook) is measured from its own start; a process alone is measured at its peak RSS. Page
cache that reads leave behind is not counted: the kernel takes it back under pressure. Linux only;
elsewhere the peak is getrusage's, since the process started, all of it the process's own.
"""

from __future__ import annotations

import os
from pathlib import Path

# Imports inside functions: the rank's resource usage is read only when measured.


def reset_peak() -> bool:
    """Reset this process's RSS high-water mark to its current RSS; False where the kernel does not let us."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def status_kib(pid: int | str, key: str) -> int | None:
    """Field `key` of /proc/PID/status in KiB (VmHWM, RssAnon, ...), None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rollup_kib(pid: int | str) -> dict[str, int]:
    """/proc/PID/smaps_rollup's fields in KiB (Rss, Pss, Private_Dirty, ...); empty where it cannot be read."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            head = line.split()
            if len(head) == 3 and head[0].endswith(":") and head[2] == "kB":
                out[head[0][:-1]] = int(head[1])
    except (OSError, ValueError):
        pass
    return out


def own_and_shared(pid: int | str = "self") -> tuple[int, int] | None:
    """(bytes only process `pid` maps, bytes it shares with another process) resident now; None where unknown.
    Shared: its libraries, files and segments others map too and, in a rank forked from torchrun's agent,
    the agent's pages it has not written since."""
    r = rollup_kib(pid)
    if "Rss" not in r:
        return None
    own = r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
    return own * 1024, (r["Rss"] - own) * 1024


def _footprint(pid: int | str) -> dict[str, int]:
    """Process `pid`'s share of the measurement (bytes): its peak RSS and the pages it shares now (0 where
    smaps_rollup cannot be read: all of it its own); all 0 where /proc/PID/status cannot be read either."""
    hwm = status_kib(pid, "VmHWM")
    if hwm is None and pid == "self":  # no /proc: the process's lifetime peak (kilobytes on Linux and BSD)
        import resource

        hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    got = own_and_shared(pid)
    return {"peak": (hwm or 0) * 1024, "shared": got[1] if got is not None else 0}


def own_peak(footprint: dict[str, int]) -> int:
    """What a process's `_footprint` held at its peak that it shares with no other process."""
    return max(footprint["peak"] - footprint["shared"], 0)


def rank_sample(*, with_agent: bool) -> dict:
    """This rank's share of the measurement (a plain dict: it travels through all_gather_object), with its
    parent's (torchrun's agent's) when `with_agent` (one rank per machine says it)."""
    return {"self": _footprint("self"), "agent": _footprint(os.getppid()) if with_agent else None}


def machine_peak(samples: list[dict], local_world_size: int) -> dict:
    """The measured peak of the busiest machine, from every rank's `rank_sample` (in rank order): its
    processes' own peaks (the ranks', the agent's) and the most any of them shares (the module docstring),
    and its ranks' batch buffers at their most (a sample's `batches`, where the caller added it)."""
    lws = max(int(local_world_size), 1)
    best: dict | None = None
    for node in range(0, len(samples), lws):
        mine = samples[node:node + lws]
        agents = [s["agent"] for s in mine if s["agent"] is not None]
        ranks = sum(own_peak(s["self"]) for s in mine)
        agent = sum(own_peak(a) for a in agents)
        shared = max(p["shared"] for p in [*(s["self"] for s in mine), *agents])
        if best is None or ranks + agent + shared > best["bytes"]:
            best = {"bytes": ranks + agent + shared, "ranks": ranks, "agent": agent, "shared": shared,
                    "batch_buffers": sum(s.get("batches", 0) for s in mine)}
    return best or {"bytes": 0, "ranks": 0, "agent": 0, "shared": 0, "batch_buffers": 0}
