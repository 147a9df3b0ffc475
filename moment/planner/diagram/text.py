"""Text extents without a font engine: a per-character width table for DejaVu Sans (what the PNG
uses, and first in the SVG's font list), slightly generous so boxes and label slots never clip."""

from __future__ import annotations

#: em widths of DejaVu Sans, rounded up; characters not listed count as wide
_NARROW = {c: 0.31 for c in "ijlI.,:;'|!· "}
_MID = {c: 0.40 for c in "ftr()[]/\\-_\"J"}
_WIDE = {c: 1.0 for c in "mwMW%@#"}
_TABLE = {**_NARROW, **_MID, **_WIDE}
#: bold DejaVu Sans is about this much wider
BOLD = 1.12
ASCENT, DESCENT = 0.80, 0.25


def _char(c: str) -> float:
    if c in _TABLE:
        return _TABLE[c]
    if c.isdigit() or (c.isascii() and c.islower()):
        return 0.65
    if c.isascii() and c.isupper():
        return 0.80
    return 0.90


def text_width(text: str, size: float, bold: bool = False) -> float:
    """Advance width in px of `text` at font size `size` px."""
    return sum(_char(c) for c in text) * size * (BOLD if bold else 1.0)
