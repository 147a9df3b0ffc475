"""Colours, font sizes (px at the picture's native size) and line widths, in one place."""

from __future__ import annotations

TITLE, SUB, FONT, SMALL = 18, 14, 13, 12
#: the smallest text in the picture; tests hold every text to it
MIN_FONT = SMALL

BOX_FILL = {
    "socket": "#d9e2f3", "root_complex": "#e2efda", "switch": "#fff2cc", "gpu": "#b7e07a",
    "ssd": "#bdd7ee", "nic": "#e4d1ef", "nvswitch": "#c6e0b4", "other": "#e7e6e6", "empty": "#f7f7f7",
}
KIND_NAME = {
    "socket": "CPU socket", "root_complex": "root complex", "switch": "PCIe switch", "gpu": "GPU",
    "ssd": "SSD", "nic": "NIC", "nvswitch": "NVSwitch", "other": "other device", "empty": "empty slots",
}
LIMIT = "#d62728"
IDLE = "#a6a6a6"
NVLINK = "#7030a0"
_RAMP = ((0.0, (44, 160, 44)), (0.5, (230, 190, 0)), (1.0, (242, 120, 0)))


def util_colour(u: float | None, bottleneck: bool = False) -> str:
    """Green (idle) -> yellow -> orange (busy); red only for a saturated link, grey for no reads."""
    if bottleneck:
        return LIMIT
    if u is None:
        return IDLE
    u = max(0.0, min(1.0, u))
    for (u0, c0), (u1, c1) in zip(_RAMP, _RAMP[1:]):
        if u <= u1:
            t = (u - u0) / (u1 - u0)
            r, g, b = (round(a + (z - a) * t) for a, z in zip(c0, c1))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#f27800"


def link_width(u: float | None, bottleneck: bool = False) -> float:
    if bottleneck:
        return 5.5
    if u is None:
        return 1.5
    return 2.0 + 2.5 * max(0.0, min(1.0, u))
