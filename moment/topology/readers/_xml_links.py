"""Fill in PCIe links a file leaves blank, and say so in each link's label.

Order of evidence: a switch with no speed of its own takes the fastest generation below it (AWS p5
lists speeds only on the switch's children); any other link takes its parent's generation, else the
CPU's; a missing width takes the usual width for the device kind (x16, SSDs x4).
"""

from __future__ import annotations

from moment.topology.model import Kind
from moment.topology.readers.build import DraftDev
from moment.topology.readers._xml_pci import DEFAULT_WIDTH


def _fill_up(d: DraftDev) -> None:
    for c in d.children:
        _fill_up(c)
    if d.gen is None and d.kind == Kind.switch:
        gens = [c.gen for c in d.children if c.gen is not None and c.link_kind == "pcie"]
        if gens:
            d.gen = max(gens)
            d.notes.append(f"speed not given; Gen{d.gen} taken from the devices below")


def _fill_down(d: DraftDev, parent_gen: int | None, default_gen: int) -> int:
    assumed = 0
    if d.link_kind == "pcie":
        if d.gen is None:
            d.gen = parent_gen or default_gen
            src = "the parent link's" if parent_gen else "the CPU's"
            d.notes.append(f"speed not given; Gen{d.gen} assumed ({src})")
            assumed = 1
        if d.width is None:
            d.width = DEFAULT_WIDTH.get(d.kind, 16)
            d.notes.append(f"width not given; x{d.width} assumed")
            assumed = 1
    for c in d.children:
        assumed += _fill_down(c, d.gen, default_gen)
    return assumed


def resolve_links(devs: list[DraftDev], default_gen: int) -> int:
    """Complete gen/width on every PCIe link under a root complex; returns how many were assumed."""
    assumed = 0
    for d in devs:
        _fill_up(d)
        assumed += _fill_down(d, None, default_gen)
    return assumed
