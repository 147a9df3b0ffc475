"""Sizes people type ('512MiB', '2GB', '10%', plain bytes), read once for every command."""

from __future__ import annotations

import re

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
