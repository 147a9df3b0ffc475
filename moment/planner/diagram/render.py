"""Write a Scene as SVG (no dependencies) or PNG (matplotlib, same geometry, 1 unit = 1 pixel)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO

from moment.planner.diagram.scene import Line, Rect, Scene, Text

# Imports inside functions: a solver's or renderer's library (networkx, OR-Tools, SciPy, matplotlib) loads
# only when it is used.

FONT_FAMILY = "DejaVu Sans, Bitstream Vera Sans, Verdana, sans-serif"


#: what XML 1.0 cannot hold even escaped (C0 controls but tab, LF and CR; lone surrogates; U+FFFE, U+FFFF): a
#: machine named "bad\x01name" made the SVG unreadable (the page showed a broken image)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _esc(s: str) -> str:
    """Text as SVG character data: markup escaped, characters XML cannot hold shown as U+FFFD."""
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    return _NOT_XML.sub("\ufffd", s)


def _svg_item(it) -> list[str]:
    if isinstance(it, Rect):
        dash = ' stroke-dasharray="5,3"' if it.dashed else ""
        return [f'<rect class="{it.cls}" x="{it.x:.1f}" y="{it.y:.1f}" width="{it.w:.1f}" height="{it.h:.1f}" '
                f'rx="{it.rx:g}" fill="{it.fill}" stroke="{it.stroke}" stroke-width="{it.stroke_w:g}"{dash}/>']
    if isinstance(it, Line):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in it.pts)
        dash = ' stroke-dasharray="7,4"' if it.dashed else ""
        return [f'<polyline class="{it.cls}" points="{pts}" fill="none" stroke="{it.colour}" '
                f'stroke-width="{it.width:g}"{dash}/>']
    assert isinstance(it, Text)
    out = []
    if it.bg:
        x0, y0, x1, y1 = it.bbox()
        out.append(f'<rect class="label-bg" x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" '
                   f'rx="4" fill="{it.bg}" stroke="#cccccc"/>')
    weight = ' font-weight="bold"' if it.bold else ""
    anchor = f' text-anchor="{it.anchor}"' if it.anchor != "start" else ""
    out.append(f'<text class="{it.cls}" x="{it.x:.1f}" y="{it.y:.1f}" font-size="{it.size:g}"{weight}{anchor} '
               f'fill="{it.colour}">{_esc(it.text)}</text>')
    return out


def to_svg(scene: Scene) -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{scene.width:.0f}" height="{scene.height:.0f}" '
             f'viewBox="0 0 {scene.width:.0f} {scene.height:.0f}" font-family="{FONT_FAMILY}">',
             '<rect width="100%" height="100%" fill="white"/>']
    for g in scene.groups:
        parts.append(f'<g id="{g.name}" class="{g.name}">')
        for it in g.items:
            parts.extend(_svg_item(it))
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


#: matplotlib sizes are points; at 100 dpi one point is 100/72 pixels
_PT = 72 / 100


def to_png(scene: Scene, path: Path | BinaryIO) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig = plt.figure(figsize=(scene.width / 100, scene.height / 100), dpi=100)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, scene.width)
    ax.set_ylim(scene.height, 0)
    ax.axis("off")
    for z, g in enumerate(scene.groups):
        for it in g.items:
            if isinstance(it, Rect):
                ax.add_patch(FancyBboxPatch((it.x, it.y), it.w, it.h, boxstyle=f"round,pad=0,rounding_size={it.rx}",
                                            fc=it.fill, ec=it.stroke, lw=it.stroke_w * _PT,
                                            ls="--" if it.dashed else "-", zorder=z * 2))
            elif isinstance(it, Line):
                ax.plot([p[0] for p in it.pts], [p[1] for p in it.pts], color=it.colour, lw=it.width * _PT,
                        ls=(0, (5, 3)) if it.dashed else "-", solid_capstyle="butt", zorder=z * 2)
            else:
                bbox = dict(boxstyle="round,pad=0.25", fc=it.bg, ec="#cccccc", lw=0.7) if it.bg else None
                ax.text(it.x, it.y, it.text, fontsize=it.size * _PT, fontweight="bold" if it.bold else "normal",
                        color=it.colour, ha={"start": "left", "middle": "center", "end": "right"}[it.anchor],
                        va="baseline", family="DejaVu Sans", bbox=bbox, zorder=z * 2 + 1)
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
