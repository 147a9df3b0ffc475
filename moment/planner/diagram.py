"""Draw a planned machine: the PCIe tree with devices in slots, links coloured by utilisation.

SVG is written directly (no dependencies); PNG goes through matplotlib with the same geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from moment.errors import MomentError
from moment.planner.contracts import LinkUse
from moment.topology.model import Kind, Topology

_FILL = {
    Kind.socket: "#d9e2f3", Kind.root_complex: "#e2efda", Kind.switch: "#fff2cc", Kind.slot: "#f2f2f2",
    Kind.gpu: "#76b900", Kind.ssd: "#5b9bd5", Kind.nic: "#c9a0dc", Kind.nvswitch: "#a9d18e", Kind.other: "#dddddd",
}
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 92, 34, 10, 62, 24


@dataclass
class _Box:
    id: str
    kind: Kind
    text: str
    x: float
    y: float


def util_colour(u: float) -> str:
    """Green (idle) -> yellow -> red (saturated)."""
    u = max(0.0, min(1.0, u))
    r = int(255 * min(1.0, 2 * u))
    g = int(200 * min(1.0, 2 * (1 - u)))
    return f"#{r:02x}{g:02x}30"


def _layout(topo: Topology) -> tuple[list[_Box], float, float]:
    boxes: dict[str, _Box] = {}
    next_x = [MARGIN]

    def place(nid: str, depth: int) -> float:
        kids = topo.children(nid)
        if kids:
            xs = [place(k, depth + 1) for k in kids]
            x = (min(xs) + max(xs)) / 2
        else:
            x = next_x[0]
            next_x[0] += BOX_W + GAP_X
        n = topo.node(nid)
        text = n.id if n.kind not in (Kind.gpu, Kind.ssd, Kind.nic) else f"{n.id} {getattr(n, 'model', '')}"
        boxes[nid] = _Box(nid, n.kind, text, x, MARGIN + depth * (BOX_H + GAP_Y))
        return x

    for s in topo.of_kind(Kind.socket):
        place(s.id, 0)
        next_x[0] += GAP_X * 3
    width = next_x[0] + MARGIN
    height = max(b.y for b in boxes.values()) + BOX_H + MARGIN + 30
    return list(boxes.values()), width, height


def _edge_util(links: list[LinkUse]) -> dict[frozenset, tuple[float, str]]:
    """Highest utilisation of either direction, per unordered node pair."""
    out: dict[frozenset, tuple[float, str]] = {}
    for lu in links:
        key = frozenset((lu.src, lu.dst))
        label = f"{lu.utilisation:.0%}" + (f" {lu.label}" if lu.label else "")
        if key not in out or lu.utilisation > out[key][0]:
            out[key] = (lu.utilisation, label)
    return out


@dataclass
class _Stroke:
    """One link to draw: a tree edge (straight) or a peer link (dashed, through a midpoint)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    colour: str
    width: float
    label: str
    dashed: bool


def _scene(topo: Topology, links: list[LinkUse]) -> tuple[list[_Box], list[_Stroke], float, float]:
    """Geometry shared by both renderers, so the SVG and the PNG show the same picture."""
    boxes, width, height = _layout(topo)
    pos = {b.id: b for b in boxes}
    util = _edge_util(links)
    strokes = []
    for b in boxes:
        n = topo.node(b.id)
        if n.parent is None:
            continue
        p = pos[n.parent]
        u, label = util.get(frozenset((b.id, n.parent)), (None, ""))
        strokes.append(_Stroke((p.x + BOX_W / 2, b.x + BOX_W / 2), (p.y + BOX_H, b.y),
                               util_colour(u) if u is not None else "#999999",
                               1.5 + (4 * u if u is not None else 0), label, False))
    for lk in topo.links:
        if lk.a in pos and lk.b in pos:
            a, b = pos[lk.a], pos[lk.b]
            u, label = util.get(frozenset((lk.a, lk.b)), (None, lk.describe()))
            xa, xb = a.x + BOX_W / 2, b.x + BOX_W / 2
            strokes.append(_Stroke((xa, (xa + xb) / 2, xb), (a.y, min(a.y, b.y) - 14, b.y),
                                   util_colour(u) if u is not None else "#7030a0", 2.0,
                                   label or lk.describe(), True))
    return boxes, strokes, width, height


def render_svg(topo: Topology, links: list[LinkUse], title: str = "") -> str:
    boxes, strokes, width, height = _scene(topo, links)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             f'font-family="Helvetica,Arial,sans-serif" font-size="10">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{MARGIN}" y="{height - 12:.0f}" font-size="12">{_esc(title)}</text>']
    for st in strokes:
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(st.xs, st.ys))
        dash = ' stroke-dasharray="5,3"' if st.dashed else ""
        parts.append(f'<polyline points="{points}" fill="none" stroke="{st.colour}" '
                     f'stroke-width="{st.width:.1f}"{dash}/>')
        if st.label:
            mx, my = sum(st.xs) / len(st.xs), (sum(st.ys) / len(st.ys)) - (3 if st.dashed else 0)
            parts.append(f'<text x="{mx + 3:.1f}" y="{my:.1f}" fill="#333">{_esc(st.label)}</text>')
    for b in boxes:
        parts.append(f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                     f'fill="{_FILL[b.kind]}" stroke="#555"/>')
        parts.append(f'<text x="{b.x + BOX_W / 2:.1f}" y="{b.y + 14:.1f}" text-anchor="middle">{_esc(b.text[:18])}</text>')
        parts.append(f'<text x="{b.x + BOX_W / 2:.1f}" y="{b.y + 27:.1f}" text-anchor="middle" fill="#555">'
                     f'{b.kind.value}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_png(topo: Topology, links: list[LinkUse], path: Path | BinaryIO, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    boxes, strokes, width, height = _scene(topo, links)
    fig = plt.figure(figsize=(width / 80, height / 80), dpi=100)
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for st in strokes:
        ax.plot(st.xs, st.ys, color=st.colour, lw=st.width * 0.75, ls="--" if st.dashed else "-")
        if st.label:
            mx, my = sum(st.xs) / len(st.xs), (sum(st.ys) / len(st.ys)) - (3 if st.dashed else 0)
            ax.text(mx + 3, my, st.label, fontsize=6)
    for b in boxes:
        ax.add_patch(FancyBboxPatch((b.x, b.y), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=4",
                                    fc=_FILL[b.kind], ec="#555"))
        ax.text(b.x + BOX_W / 2, b.y + 13, b.text[:18], ha="center", fontsize=6)
        ax.text(b.x + BOX_W / 2, b.y + 26, b.kind.value, ha="center", fontsize=5, color="#555")
    ax.text(MARGIN, height - 12, title, fontsize=8)
    fig.savefig(path, format="png")
    plt.close(fig)


def check_diagram_path(path: str | Path, what: str = "--diagram") -> Path:
    """Up front, before any solving: a .svg or .png name in a directory that exists and is writable."""
    from moment.outputs import check_output

    p = Path(path)
    if p.suffix.lower() not in (".svg", ".png"):
        raise MomentError("use a .svg or .png file name", source=f"{what} {p}")
    return check_output(p, what)


def write_diagram(topo: Topology, links: list[LinkUse], path: str | Path, title: str = "",
                  what: str | None = None) -> Path:
    """Both formats are rendered in memory and written atomically (same checks, same errors)."""
    import io

    from moment.outputs import atomic_write

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        data: str | bytes = render_svg(topo, links, title)
    elif suffix == ".png":
        buf = io.BytesIO()
        render_png(topo, links, buf, title)
        data = buf.getvalue()
    else:
        raise MomentError(f"--diagram {path}: use a .svg or .png file name")
    atomic_write(path, data, what)
    return path


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
