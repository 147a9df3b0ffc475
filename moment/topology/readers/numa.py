"""NUMA nodes and their memory from `numactl --hardware` text or sysfs: sockets' size for the planner."""

from __future__ import annotations

import re
from pathlib import Path

from moment.topology.readers import console

_SIZE = re.compile(r"^node (?P<n>\d+) size: (?P<mb>\d+) MB")
_AVAILABLE = re.compile(r"^available: (?P<n>\d+) nodes")


def parse_numactl(text: str) -> dict[int, float]:
    """NUMA node -> memory in GiB from `numactl --hardware` output ({} if the text has none)."""
    out: dict[int, float] = {}
    for _, line in console.select(text, console.is_numactl):
        m = _SIZE.match(line.strip())
        if m:
            out[int(m.group("n"))] = int(m.group("mb")) / 1024
    return out


def sysfs_nodes(root: str | Path = "/sys/devices/system/node") -> dict[int, float]:
    """NUMA node -> memory in GiB from /sys/devices/system/node/nodeN/meminfo ({} if absent)."""
    out: dict[int, float] = {}
    base = Path(root)
    if not base.is_dir():
        return out
    for d in sorted(base.glob("node[0-9]*")):
        try:
            text = (d / "meminfo").read_text()
        except OSError:
            continue
        m = re.search(r"MemTotal:\s+(\d+) kB", text)
        if m:
            out[int(d.name[4:])] = int(m.group(1)) / (1024 * 1024)
    return out
