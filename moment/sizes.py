"""Sizes people type ('512MiB', '2GB', '10%', plain bytes), read once for every command."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from moment.errors import MomentError

#: a number in a size as people type one: digits, a fraction, an exponent (8, 0.5, .5, 1e20, 2.5E3). The one
#: spelling of every size (`parse_size`, `place --gpu-cache`'s GiB): 1e20 was refused as unreadable where
#: 99999999999999999999999 was read, and refused as too large
NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"


def finite(value: float) -> float:
    """`value` (a `NUMBER` read, scaled), one past a float's range (1e400) as the largest float: refused as too large
    like any large one, never an overflow."""
    return min(value, sys.float_info.max)


def parse_size(text: str | int | None, total: int) -> int | None:
    """'512MiB', '2GB', '10%' (of `total`), or a plain byte count -> bytes; None stays None."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        return text
    m = re.fullmatch(rf"\s*({NUMBER})\s*(%|[kKmMgGtT]i?[bB]?|[bB])?\s*", str(text))
    if not m:
        raise MomentError(f"cannot read size {text!r}", hint="use bytes, e.g. 512MiB, 2GB, or a percentage: 10%")
    v = finite(float(m.group(1)))
    unit = (m.group(2) or "b").lower()
    if unit == "%":
        return int(finite(total * v / 100))
    scale = {"b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[unit[0]]
    if "i" in unit:
        scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit[0]]
    return int(finite(v * scale))


def fmt_size(b: float) -> str:
    """Bytes for people: GiB/MiB/KiB, one decimal (TiB beyond 1024 GiB)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:,.1f} {unit}"
    return f"{int(b)} B"


def available_memory() -> int | None:
    """Memory this process can still take: /proc/meminfo's MemAvailable, lowered by a cgroup v2 limit
    (memory.max less memory.current); None where neither can be read (not Linux)."""
    cands: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                cands.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            cands.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(cands) if cands else None
