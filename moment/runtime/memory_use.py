"""The memory a run held at its peak, measured, to set beside what its budget split predicted.

Why measured and not added up: the budget (moment.runtime.budget) is a prediction; only the kernel
knows what the processes held. A cgroup charges a run's processes their resident pages, and a
shared-memory segment or a file's page once however many processes map it. So the run's peak on one
machine is

    sum over its ranks of (peak RSS - the rank's pages of shared segments and shared files)
    + each /dev/shm segment and each shared file once  + the peak RSS of torchrun's agent (the ranks'
    parent), when there is one.

"Shared files" are the data files every rank memory-maps and the budget charges once (the graph
structure: `rank_sample(shared_files=...)`). Per-rank peaks are the kernel's high-water mark (VmHWM),
reset when a run starts, so a run inside a longer-lived process (a test, a notebook) is measured from
its own start. Pages of the libraries every rank maps are counted in each rank, as the budget's
per-rank `process` item counts them. Page cache that reads leave behind is not counted: the kernel
takes it back under pressure. Linux only; elsewhere the peak is getrusage's, since the process started.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

# Imports inside functions: the rank's resource usage is read only when measured.

SHM_PREFIX = "/dev/shm/"


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


def _shared_pages(files: Sequence[str | Path] = ()) -> dict[str, int]:
    """Resident bytes of each /dev/shm segment, and of each of `files`, this process maps, by
    device:inode (one key per segment or file, the same in every process)."""
    out: dict[str, int] = {}
    key = None
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return out
    named = {os.path.realpath(f) for f in files}
    for line in lines:
        head = line.split(None, 5)
        if len(head) >= 5 and "-" in head[0] and ":" in head[3]:  # a mapping's header line
            path = head[5].strip() if len(head) == 6 else ""
            key = f"{head[3]}:{head[4]}" if path.startswith(SHM_PREFIX) or (path and path in named) else None
        elif key is not None and line.startswith("Rss:"):
            out[key] = out.get(key, 0) + int(line.split()[1]) * 1024
    return out


def parent_peak() -> int:
    """The peak RSS of this process's parent (under torchrun: its agent), 0 when unknown."""
    return (status_kib(os.getppid(), "VmHWM") or 0) * 1024


def rank_sample(*, with_agent: bool, shared_files: Sequence[str | Path] = ()) -> dict:
    """This rank's share of the measurement (a plain dict: it travels through all_gather_object).
    `shared_files`: files every rank maps whose pages the machine holds once (see the module docstring)."""
    hwm = status_kib("self", "VmHWM")
    if hwm is None:  # no /proc: the process's lifetime peak (kilobytes on Linux and BSD)
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    else:
        peak = hwm * 1024
    agent = parent_peak() if with_agent else 0
    return {"peak": peak, "shm": _shared_pages(shared_files), "agent": agent}


def machine_peak(samples: list[dict], local_world_size: int) -> dict:
    """The measured peak of the busiest machine, from every rank's `rank_sample` (in rank order)."""
    lws = max(int(local_world_size), 1)
    best: dict | None = None
    for node in range(0, len(samples), lws):
        mine = samples[node:node + lws]
        segments: dict[str, int] = {}
        for s in mine:
            for k, v in s["shm"].items():
                segments[k] = max(segments.get(k, 0), v)  # a segment once, as much as any rank touched
        ranks = sum(max(s["peak"] - sum(s["shm"].values()), 0) for s in mine)
        shared = sum(segments.values())
        agent = sum(s["agent"] for s in mine)
        total = ranks + shared + agent
        if best is None or total > best["bytes"]:
            best = {"bytes": total, "ranks": ranks, "shared_segments": shared, "agent": agent}
    return best or {"bytes": 0, "ranks": 0, "shared_segments": 0, "agent": 0}
