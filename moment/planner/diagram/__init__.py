"""Draw a planned machine: the PCIe tree with devices in slots, links coloured by utilisation,
bottlenecks marked, each GPU's inlet bandwidth, and a legend.

`tree` decides what is shown, `layout` where (a renderer-neutral `Scene`), `render` writes it as
SVG (no dependencies) or PNG (matplotlib, same geometry, one unit = one pixel).
"""

from __future__ import annotations

import io
from pathlib import Path

from moment.errors import MomentError
from moment.planner.contracts import LinkUse, Plan
from moment.planner.diagram.layout import layout
from moment.planner.diagram.render import to_png, to_svg
from moment.planner.diagram.scene import Scene
from moment.planner.diagram.style import util_colour
from moment.planner.diagram.tree import build_tree
from moment.planner.explain import bottleneck_summary
from moment.topology.devices import builtin_gpus_note, populate, strip
from moment.topology.model import Topology

# Imports inside functions: the renderer and the output writer load only when a picture is drawn.

#: widest picture (px) before link labels drop their capacities: fits a laptop screen and a slide
MAX_WIDTH = 1600

__all__ = ["scene", "plan_scene", "plan_svg", "render_svg", "render_png", "write_diagram", "write_plan_diagram",
           "check_diagram_path", "util_colour"]


def scene(topo: Topology, links: list[LinkUse], title: str = "", *, subtitle: str = "",
          inlet: dict[str, float] | None = None) -> Scene:
    """The picture of populated `topo` with the LP's `links`; `inlet`: GB/s per GPU id. Narrower
    labels when the full ones would make it wider than MAX_WIDTH px."""
    tree = build_tree(topo, links, inlet)
    sc = layout(tree, title, subtitle)
    return sc if sc.width <= MAX_WIDTH else layout(tree, title, subtitle, compact=True)


def plan_scene(topo: Topology, plan: Plan) -> Scene:
    """The picture of a plan's recommended layout on `topo` (devices already in it are replaced)."""
    p = plan.predicted
    title = f"{plan.machine}: {plan.inventory}" + builtin_gpus_note(topo, ", ")
    lo = min(p.per_gpu_inlet_gbps) if p.per_gpu_inlet_gbps else 0.0
    limits = bottleneck_summary(plan)
    subtitle = (f"recommended layout: epoch read {p.epoch_read_s:.1f} s, every GPU gets ≥ {lo:.1f} GB/s, "
                f"{p.aggregate_gbps:.1f} GB/s in all" + (f"; limited by {limits}" if limits else ""))
    if plan.overrides:
        subtitle += "\nwhat-if (--set): " + ", ".join(plan.overrides)
    inlet = dict(zip(p.gpus, p.per_gpu_inlet_gbps))
    return scene(populate(strip(topo)[0], plan.placement), plan.links, title, subtitle=subtitle, inlet=inlet)


def plan_svg(topo: Topology, plan: Plan) -> str:
    """The plan's diagram as SVG text (the service returns it; `write_plan_diagram` writes it)."""
    return to_svg(plan_scene(topo, plan))


def render_svg(topo: Topology, links: list[LinkUse], title: str = "", **kw) -> str:
    return to_svg(scene(topo, links, title, **kw))


def render_png(topo: Topology, links: list[LinkUse], path: Path, title: str = "", **kw) -> None:
    to_png(scene(topo, links, title, **kw), path)


def _write(sc: Scene, path: str | Path, what: str = "--diagram") -> Path:
    """Both formats are rendered in memory and written atomically (same checks, same errors)."""
    from moment.outputs import atomic_write

    path = check_diagram_path(path, what)
    if path.suffix.lower() == ".svg":
        data: str | bytes = to_svg(sc)
    else:
        buf = io.BytesIO()
        to_png(sc, buf)
        data = buf.getvalue()
    atomic_write(path, data, what)
    return path


def check_diagram_path(path: str | Path, what: str = "--diagram") -> Path:
    """Up front, before any solving: a .svg or .png name in a directory that exists and is writable."""
    from moment.outputs import check_output

    p = Path(path)
    if p.suffix.lower() not in (".svg", ".png"):
        raise MomentError("use a .svg or .png file name", source=f"{what} {p}")
    return check_output(p, what)


def write_diagram(topo: Topology, links: list[LinkUse], path: str | Path, title: str = "",
                  what: str = "--diagram", **kw) -> Path:
    return _write(scene(topo, links, title, **kw), path, what)


def write_plan_diagram(topo: Topology, plan: Plan, path: str | Path, what: str = "--diagram") -> Path:
    return _write(plan_scene(topo, plan), path, what)
