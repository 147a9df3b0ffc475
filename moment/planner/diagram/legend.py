"""The legend under the tree: what colours, widths, percentages and the boxes' numbers mean."""

from __future__ import annotations

from moment.planner.diagram.scene import Group, Line, Rect, Text
from moment.planner.diagram.style import (BOX_FILL, FONT, IDLE, KIND_NAME, LIMIT, NVLINK, SMALL, link_width,
                                          util_colour)
from moment.planner.diagram.text import text_width
from moment.planner.diagram.tree import Tree

SW, GAP, ROW = 30, 22, 26
_ORDER = ("gpu", "ssd", "nic", "switch", "root_complex", "socket", "nvswitch", "other", "empty")
_KIND_NOTE = {"gpu": "GPU: in = GB/s it receives", "ssd": "SSD: GB/s read from it"}


def _line_item(colour: str, width: float, text: str, dashed: bool = False, bold: bool = False):
    def draw(x: float, y: float) -> list:
        return [Line([(x, y - 4), (x + SW, y - 4)], colour, width, dashed=dashed, cls="legend-swatch"),
                Text(x + SW + 6, y, text, SMALL, bold=bold, colour=LIMIT if bold else "#222222", cls="legend-text")]
    return SW + 6 + text_width(text, SMALL, bold), draw


def _box_item(kind: str, text: str, limit: bool = False):
    def draw(x: float, y: float) -> list:
        stroke, sw = (LIMIT, 3.0) if limit else ("#666666", 1.0)
        return [Rect(x, y - 13, SW - 6, 16, BOX_FILL[kind], stroke, sw, dashed=kind == "empty", rx=3,
                     cls="legend-swatch"),
                Text(x + SW, y, text, SMALL, bold=limit, colour=LIMIT if limit else "#222222", cls="legend-text")]
    return SW + text_width(text, SMALL, limit), draw


def _ramp_item():
    steps = (0.0, 0.25, 0.5, 0.75, 0.99)
    head = "link load ÷ capacity:"

    def draw(x: float, y: float) -> list:
        out: list = [Text(x, y, head, SMALL, cls="legend-text")]
        cx = x + text_width(head, SMALL) + 8
        for u in steps:
            out.append(Line([(cx, y - 4), (cx + SW, y - 4)], util_colour(u), link_width(u), cls="legend-swatch"))
            label = f"{u:.0%}"
            out.append(Text(cx + SW + 4, y, label, SMALL, cls="legend-text"))
            cx += SW + 4 + text_width(label, SMALL) + 10
        return out
    width = text_width(head, SMALL) + 8 + sum(SW + 14 + text_width(f"{u:.0%}", SMALL) for u in steps)
    return width, draw


def legend(tree: Tree, x0: float, y0: float, width: float, compact: bool = False) -> tuple[Group, float]:
    """The legend group, laid out in rows no wider than `width`; returns it and its bottom edge."""
    kinds = {b.kind for b in tree.boxes.values()}
    items = [_ramp_item(),
             _line_item(LIMIT, link_width(1.0, True), "⚠ saturated: it limits the epoch time", bold=True),
             _line_item(IDLE, link_width(None), "carries no reads")]
    if tree.fabric or any(p.a not in tree.roots for p in tree.peers):
        items.append(_line_item(NVLINK, 3.0, "NVLink / peer link (dashed: no reads)", dashed=True))
    for k in _ORDER:
        if k in kinds:
            items.append(_box_item(k, _KIND_NOTE.get(k, KIND_NAME[k])))
    if any(b.limit for b in tree.boxes.values()):
        items.append(_box_item("ssd", "⚠ read at its limit", limit=True))
    g = Group("legend")
    head = Text(x0 + 12, y0 + 12 + FONT, "Legend", FONT, bold=True, cls="legend-title")
    g.items.append(head)
    x, y = x0 + 12, y0 + 12 + FONT + ROW
    for w, draw in items:
        if x > x0 + 12 and x + w > x0 + width - 12:
            x, y = x0 + 12, y + ROW
        g.items.extend(draw(x, y))
        x += w + GAP
    note = ("A link's label: load of its busier direction as % of its capacity, in the LP solution "
            "(the realisable prediction)." + (" Capacities are shown on saturated links only." if compact else ""))
    y += ROW
    for line in _wrap(note, width - 24):
        g.items.append(Text(x0 + 12, y, line, SMALL, colour="#333333", cls="legend-text"))
        y += SMALL + 6
    bottom = y + 4
    g.items.insert(0, Rect(x0, y0, width, bottom - y0, "#fbfbfb", "#bbbbbb", 1.0, rx=6, cls="legend-frame"))
    return g, bottom


def _wrap(text: str, width: float) -> list[str]:
    lines, cur = [], ""
    for word in text.split():
        cand = f"{cur} {word}".strip()
        if cur and text_width(cand, SMALL) > width:
            lines.append(cur)
            cur = word
        else:
            cur = cand
    return lines + ([cur] if cur else [])
