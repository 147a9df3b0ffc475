"""Sizes people type ('512MiB', '2GB', '10%', plain bytes), read once for every command."""

from __future__ import annotations

import re
from pathlib import Path

from moment.errors import MomentError


def parse_size(text: str | int | None, total: int) -> int | None:
    """'512MiB', '2GB', '10%' (of `total`), or a plain byte count -> bytes; None stays None."""
    if text is None or text == "":
        return None
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.]+)\s*(%|[kKmMgGtT]i?[bB]?|[bB])?\s*", str(text))
    if not m:
        raise MomentError(f"cannot read size {text!r}", hint="use bytes, e.g. 512MiB, 2GB, or a percentage: 10%")
    try:
        v = float(m.group(1))
    except ValueError:
        raise MomentError(f"cannot read size {text!r}", hint="use bytes, e.g. 512MiB, 2GB, or 10%") from None
    unit = (m.group(2) or "b").lower()
    if unit == "%":
        return int(total * v / 100)
    scale = {"b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[unit[0]]
    if "i" in unit:
        scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit[0]]
    return int(v * scale)


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
