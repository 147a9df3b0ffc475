"""Renderer-neutral drawing primitives; the SVG and the PNG draw the same list."""

from __future__ import annotations

from dataclasses import dataclass, field

from moment.planner.diagram.text import ASCENT, DESCENT, text_width


@dataclass
class Rect:
    x: float
    y: float
    w: float
    h: float
    fill: str
    stroke: str = "#555555"
    stroke_w: float = 1.0
    dashed: bool = False
    rx: float = 5.0
    cls: str = ""


@dataclass
class Line:
    pts: list[tuple[float, float]]
    colour: str
    width: float
    dashed: bool = False
    cls: str = ""


@dataclass
class Text:
    x: float
    y: float  # baseline
    text: str
    size: float
    bold: bool = False
    colour: str = "#222222"
    anchor: str = "start"  # start, middle, end
    cls: str = ""
    bg: str | None = None  # a pill behind the text (labels sitting on a line)
    owner: str | None = None  # the box this text belongs inside

    PAD = 4.0

    def bbox(self) -> tuple[float, float, float, float]:
        w = text_width(self.text, self.size, self.bold)
        x0 = {"start": self.x, "middle": self.x - w / 2, "end": self.x - w}[self.anchor]
        pad = self.PAD if self.bg else 0.0
        return (x0 - pad, self.y - ASCENT * self.size - pad / 2, x0 + w + pad, self.y + DESCENT * self.size + pad / 2)


@dataclass
class Group:
    name: str
    items: list = field(default_factory=list)


@dataclass
class Scene:
    width: float
    height: float
    groups: list[Group]

    def items(self, kind=None):
        for g in self.groups:
            for it in g.items:
                if kind is None or isinstance(it, kind):
                    yield it

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)
