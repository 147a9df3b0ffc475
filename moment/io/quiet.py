"""Was a measurement taken on a quiet machine? A probe of a disk shared with other work measures the
other work as much as the disk, and a prediction built on it is wrong before it starts.

Three signs, each from the measurement's own window, none of which needs root:

* other processes' CPU time: all CPU time the machine spent (`/proc/stat`) less this process's and its
  waited-for children's (`os.times`), per second of the window, in cores;
* the spread of repeated rounds of one figure, (max - min) / median: a quiet disk repeats itself;
* the figure against an earlier probe judged quiet (the caller keeps it): the same disk read the same
  way should measure the same.

`judge` turns them into a verdict with the reasons; the limits are module constants so a test and a
bench report the same ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: other processes may use this many cores on average during a quiet measurement
MAX_OTHERS_CORES = 0.25
#: repeated rounds of one figure may differ by this share of their median
MAX_SPREAD = 0.10
#: a figure may fall below the earlier quiet probe's by this share of it (interference only slows a probe:
#: a faster one on a quiet machine is the disk's own change, e.g. a virtual disk's burst credit)
MAX_VS_QUIET = 0.15
#: fields of the `cpu` line of /proc/stat that count as busy (user nice system idle iowait irq softirq steal)
_BUSY = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class Snapshot:
    """What the machine and this process had used at one moment."""

    wall: float  # time.monotonic()
    machine_cpu_s: float | None  # CPU seconds every process has used (None: /proc/stat unreadable)
    own_cpu_s: float  # this process and its waited-for children
    loadavg: float | None  # 1-minute load average


def snapshot() -> Snapshot:
    t = os.times()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return Snapshot(time.monotonic(), _machine_cpu_s(), t.user + t.system + t.children_user + t.children_system,
                    load)


def _machine_cpu_s(stat: str = "/proc/stat") -> float | None:
    try:
        with open(stat) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(x) for x in first[1:]]
    return sum(values[i] for i in _BUSY if i < len(values)) / ticks


def others_cores(before: Snapshot, after: Snapshot) -> float | None:
    """Cores other processes kept busy on average between the two snapshots (None: cannot tell)."""
    if before.machine_cpu_s is None or after.machine_cpu_s is None or after.wall <= before.wall:
        return None
    others = (after.machine_cpu_s - before.machine_cpu_s) - (after.own_cpu_s - before.own_cpu_s)
    return max(0.0, others / (after.wall - before.wall))


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def spread(rounds: Sequence[float]) -> float:
    """(max - min) / median of repeated rounds (0 for fewer than two)."""
    if len(rounds) < 2:
        return 0.0
    mid = median(rounds)
    return (max(rounds) - min(rounds)) / mid if mid > 0 else float("inf")


@dataclass
class Verdict:
    disturbed: bool
    reasons: list[str] = field(default_factory=list)
    others_cores: float | None = None

    def line(self) -> str:
        """'yes (reasons)' or 'no', as a bench prints it."""
        return f"yes ({'; '.join(self.reasons)})" if self.disturbed else "no"


def judge(rounds: Mapping[str, Sequence[float]], others: float | None, *,
          quiet: Mapping[str, float] | None = None) -> Verdict:
    """Whether a measurement was disturbed: other processes' cores (`others_cores`), the spread of each
    figure's repeated rounds (`rounds`: name -> values) and each figure's median against an earlier quiet
    measurement of it (`quiet`: name -> value; names it lacks are not compared)."""
    reasons = []
    if others is not None and others > MAX_OTHERS_CORES:
        reasons.append(f"other processes used {others:.2f} cores (at most {MAX_OTHERS_CORES:g} on a quiet machine)")
    for name, values in rounds.items():
        if not values:
            raise ValueError(f"no rounds of {name}")
        sp = spread(values)
        if sp > MAX_SPREAD:
            reasons.append(f"{name} rounds spread {sp:.0%} ({', '.join(f'{v:.4g}' for v in values)}; "
                           f"at most {MAX_SPREAD:.0%})")
        ref = (quiet or {}).get(name)
        if ref:
            med = median(values)
            off = med / ref - 1
            if off < -MAX_VS_QUIET:
                reasons.append(f"{name} {med:.4g} is {off:+.0%} off the earlier quiet probe's {ref:.4g} "
                               f"(at most -{MAX_VS_QUIET:.0%})")
    return Verdict(bool(reasons), reasons, others)
