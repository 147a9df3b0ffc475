"""Geometry: the PCIe tree drawn left to right, one row per device.

Columns are tree depths (socket, root complex, switches...); every device sits in the right-hand
column, one per row, so GPUs and SSDs line up and read like a table. A parent reaches its children
through a grey bus just right of it; each child's own segment carries its link's colour, width and
label, on that child's row, so labels never share a line. Sockets are joined in the left column
(UPI/QPI), NVSwitch links become one bar right of the GPUs.
"""

from __future__ import annotations

import math

from moment.planner.diagram.legend import legend
from moment.planner.diagram.scene import Group, Line, Rect, Scene, Text
from moment.planner.diagram.style import (BOX_FILL, FONT, LIMIT, NVLINK, SMALL, SUB, TITLE,
                                          link_width, util_colour)
from moment.planner.diagram.text import text_width
from moment.planner.diagram.tree import Box, Tree

BOX_H, PITCH, SOCKET_GAP = 42, 52, 24
PAD, BUS, MARGIN, MIN_GAP, LABEL_GAP = 10, 14, 24, 40, 8
LANE = 12


def _red(b: Box) -> bool:
    return b.limit or b.detail.startswith("⚠")


def _box_width(b: Box) -> float:
    return max(text_width(b.title, FONT, bold=True), text_width(b.detail, SMALL, bold=_red(b))) + 2 * PAD


def _label(b: Box, compact: bool) -> Text | None:
    text = b.edge.text(compact)
    if not text:
        return None
    neck = b.edge.bottleneck
    return Text(0, 0, text, SMALL, bold=neck, colour=LIMIT if neck else "#333333", cls="edge-label")


def layout(tree: Tree, title: str, subtitle: str = "", compact: bool = False) -> Scene:
    """The scene; `compact` leaves capacities off unsaturated links' labels (narrower picture)."""
    boxes = tree.boxes
    depth: dict[str, int] = {}

    def assign(bid: str, d: int) -> None:
        depth[bid] = d
        for k in boxes[bid].children:
            if not boxes[k].leaf:
                assign(k, d + 1)

    for r in tree.roots:
        assign(r, 0)
    leaf_col = max(depth.values()) + 1
    col = {bid: (leaf_col if b.leaf else depth[bid]) for bid, b in boxes.items()}
    ncol = leaf_col + 1

    socket_pills = [_socket_pill(p) for p in tree.peers if p.a in tree.roots and p.b in tree.roots]
    widths = [0.0] * ncol
    for bid, b in boxes.items():
        widths[col[bid]] = max(widths[col[bid]], _box_width(b))
    widths[0] = max([widths[0]] + [text_width(t.text, t.size, t.bold) + 2 * Text.PAD for t in socket_pills])
    labels = {bid: _label(b, compact) for bid, b in boxes.items() if b.parent is not None}
    gaps = [float(MIN_GAP)] * ncol
    for bid, lab in labels.items():
        if lab is not None:
            c = col[bid] - 1
            gaps[c] = max(gaps[c], BUS + 2 * LABEL_GAP + text_width(lab.text, lab.size, lab.bold))
    xs = [float(MARGIN)]
    for c in range(ncol - 1):
        xs.append(xs[c] + widths[c] + gaps[c])

    sublines = subtitle.splitlines()
    top = MARGIN + TITLE + (SUB + 8) * len(sublines) + 26
    ys: dict[str, float] = {}
    cursor = [float(top)]

    def place(bid: str) -> None:
        kids = boxes[bid].children
        if not kids:
            ys[bid] = cursor[0] + BOX_H / 2
            cursor[0] += PITCH
            return
        for k in kids:
            place(k)
        ys[bid] = (ys[kids[0]] + ys[kids[-1]]) / 2

    for i, r in enumerate(tree.roots):
        cursor[0] += SOCKET_GAP if i else 0
        place(r)

    links, drawn, texts = Group("links"), Group("boxes"), Group("labels")
    for bid, b in boxes.items():
        _draw_box(drawn, b, xs[col[bid]], ys[bid], widths[col[bid]])
    for p in boxes.values():
        if p.children:
            _draw_fanout(links, texts, p, boxes, xs, widths, col, ys, labels)
    right = xs[leaf_col] + widths[leaf_col]
    right = _draw_socket_links(links, texts, tree, socket_pills, xs[0] + widths[0] / 2, ys, right)
    right = _draw_peers(links, tree, ys, right, col, xs, widths)
    right = _draw_fabric(links, texts, tree, ys, right, xs[leaf_col] + widths[leaf_col])

    bottom = cursor[0] - (PITCH - BOX_H) + 28
    width = max(right + MARGIN, 760.0)
    head = Group("title")
    head.items.append(Text(MARGIN, MARGIN + TITLE, title, TITLE, bold=True, cls="title"))
    for i, line in enumerate(sublines):
        head.items.append(Text(MARGIN, MARGIN + TITLE + (SUB + 8) * (i + 1), line, SUB, colour="#333333",
                               cls="subtitle"))
    width = max(width, *(it.bbox()[2] + MARGIN for it in head.items))
    leg, height = legend(tree, MARGIN, bottom, width - 2 * MARGIN, compact)
    return Scene(float(math.ceil(width)), float(math.ceil(height + MARGIN)), [head, links, drawn, texts, leg])


def _draw_box(g: Group, b: Box, x: float, y: float, w: float) -> None:
    fill, dashed = BOX_FILL.get(b.kind, "#eeeeee"), b.kind == "empty"
    stroke, sw = (LIMIT, 3.0) if b.limit else ("#666666", 1.0)
    g.items.append(Rect(x, y - BOX_H / 2, w, BOX_H, fill, stroke, sw, dashed=dashed,
                        cls=f"box {b.kind}" + (" limit" if b.limit else "")))
    g.items.append(Text(x + PAD, y - 4, b.title, FONT, bold=True, cls="box-title", owner=b.id))
    red = _red(b)
    g.items.append(Text(x + PAD, y + 14, b.detail, SMALL, bold=red, colour=LIMIT if red else "#333333",
                        cls="box-detail", owner=b.id))


def _draw_fanout(links: Group, texts: Group, p: Box, boxes, xs, widths, col, ys, labels) -> None:
    px = xs[col[p.id]] + widths[col[p.id]]
    bus = px + BUS
    py = ys[p.id]
    kid_ys = [ys[k] for k in p.children]
    straight = len(p.children) == 1 and abs(kid_ys[0] - py) < 0.5
    if not straight:
        links.items.append(Line([(px, py), (bus, py)], "#777777", 1.5, cls="bus"))
        links.items.append(Line([(bus, min(py, *kid_ys)), (bus, max(py, *kid_ys))], "#777777", 1.5, cls="bus"))
    # draw the busiest last so a saturated link is never hidden under an idle one
    for k in sorted(p.children, key=lambda k: (boxes[k].edge.bottleneck, boxes[k].edge.util or -1.0)):
        kb, cx, cy = boxes[k], xs[col[k]], ys[k]
        e = kb.edge
        colour = util_colour(e.util, e.bottleneck)
        start = px if straight else bus
        links.items.append(Line([(start, cy), (cx, cy)], colour, link_width(e.util, e.bottleneck),
                                cls="link bottleneck" if e.bottleneck else "link"))
        lab = labels.get(k)
        if lab is not None:
            if kb.leaf:
                lab.x, lab.anchor = cx - LABEL_GAP, "end"
            else:
                lab.x, lab.anchor = start + LABEL_GAP, "start"
            lab.y = cy - 6
            texts.items.append(lab)


def _socket_pill(peer) -> Text:
    util = f" · {peer.util:.0%}" if peer.util is not None else ""
    text = ("⚠ " if peer.bottleneck else "") + peer.name + util
    return Text(0, 0, text, SMALL, bold=peer.bottleneck, colour=LIMIT if peer.bottleneck else "#333333",
                anchor="middle", bg="#ffffff", cls="peer-label")


def _draw_socket_links(links: Group, texts: Group, tree: Tree, pills: list[Text], x: float, ys, right):
    socket_peers = [p for p in tree.peers if p.a in tree.roots and p.b in tree.roots]
    for i, (p, pill) in enumerate(zip(socket_peers, pills)):
        ya, yb = sorted((ys[p.a], ys[p.b]))
        lx = x + 10 * i
        links.items.append(Line([(lx, ya + BOX_H / 2), (lx, yb - BOX_H / 2)], util_colour(p.util, p.bottleneck),
                                link_width(p.util, p.bottleneck), cls="link socket-link"
                                + (" bottleneck" if p.bottleneck else "")))
        pill.x, pill.y = lx, (ya + yb) / 2 + SMALL * 0.3 + 12 * i
        texts.items.append(pill)
    return right


def _draw_peers(links: Group, tree: Tree, ys, right, col, xs, widths) -> float:
    """Links between boxes other than sockets (direct NVLink, xGMI bridges): brackets in lanes right
    of the device column, one lane per link so they never cross a box."""
    others = [p for p in tree.peers if not (p.a in tree.roots and p.b in tree.roots)]
    if not others:
        return right
    lanes: list[list[tuple[float, float]]] = []
    base = right
    for p in sorted(others, key=lambda p: abs(ys[p.a] - ys[p.b])):
        ya, yb = sorted((ys[p.a], ys[p.b]))
        lane = next((i for i, used in enumerate(lanes) if all(yb < u0 or ya > u1 for u0, u1 in used)), None)
        if lane is None:
            lanes.append([])
            lane = len(lanes) - 1
        lanes[lane].append((ya, yb))
        lx = base + LANE * (lane + 1)
        xa = xs[col[p.a]] + widths[col[p.a]]
        xb = xs[col[p.b]] + widths[col[p.b]]
        colour = NVLINK if p.util is None else util_colour(p.util, p.bottleneck)
        links.items.append(Line([(xa, ys[p.a]), (lx, ys[p.a]), (lx, ys[p.b]), (xb, ys[p.b])], colour,
                                link_width(p.util, p.bottleneck), dashed=p.util is None,
                                cls="link peer" + (" bottleneck" if p.bottleneck else "")))
    return base + LANE * (len(lanes) + 1)


def _draw_fabric(links: Group, texts: Group, tree: Tree, ys, right: float, leaf_right: float) -> float:
    if not tree.fabric:
        return right
    bar = right + 28
    gys = [ys[b] for b, _, _ in tree.fabric]
    for b, util, neck in tree.fabric:
        colour = NVLINK if util is None else util_colour(util, neck)
        links.items.append(Line([(leaf_right, ys[b]), (bar, ys[b])], colour, link_width(util, neck),
                                dashed=util is None, cls="link nvlink" + (" bottleneck" if neck else "")))
    links.items.append(Line([(bar, min(gys) - 10), (bar, max(gys) + 10)], NVLINK, 7.0, cls="fabric"))
    mid = (min(gys) + max(gys)) / 2 - (len(tree.fabric_lines) - 1) * 9
    widest = 0.0
    for i, line in enumerate(tree.fabric_lines):
        t = Text(bar + 14, mid + 18 * i, line, FONT if i == 0 else SMALL, bold=i == 0, cls="fabric-label")
        texts.items.append(t)
        widest = max(widest, t.bbox()[2])
    return widest
