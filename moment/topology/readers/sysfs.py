"""/sys/bus/pci/devices -> PCI functions -> `Topology`, without root and without any tool installed.

sysfs is the one source every Linux machine has: each function's directory holds its class, vendor,
device, link capability (`max_link_*`) and status (`current_link_*`), NUMA node and, for bridges,
the bus numbers; the real path (`/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0`) is the bridge
chain. Physical slot names come from /sys/bus/pci/slots/*/address. `root` is a parameter so tests run
this on a fake tree built in a temporary directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from moment.errors import MomentError
from moment.topology.model import Topology
from moment.topology.readers.pci import PciFunction, build_topology

DEFAULT_ROOT = Path("/sys/bus/pci/devices")
_BDF = re.compile(r"^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_GTS = re.compile(r"([\d.]+)\s*GT/s")


def _read(d: Path, name: str) -> str | None:
    try:
        return (d / name).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _gts(text: str | None) -> float | None:
    m = _GTS.search(text or "")
    return float(m.group(1)) if m else None


def _width(text: str | None) -> int | None:
    w = _int(text)
    return w if w is not None and 0 < w <= 32 else None


def _slots(root: Path) -> dict[str, str]:
    """'DDDD:BB:DD' -> physical slot name, from <root>/../../slots/*/address."""
    out: dict[str, str] = {}
    base = root.parent / "slots"
    if base.is_dir():
        for d in sorted(base.iterdir()):
            addr = _read(d, "address")
            if addr:
                out.setdefault(addr.lower(), d.name)
    return out


def read_functions(root: str | Path = DEFAULT_ROOT) -> list[PciFunction]:
    """One PciFunction per entry of `root` (a /sys/bus/pci/devices-like directory)."""
    base = Path(root)
    if not base.is_dir():
        raise MomentError("not a directory (no PCI sysfs here)", source=str(base))
    slots = _slots(base)
    entries = sorted(p for p in base.iterdir() if _BDF.match(p.name))
    names = {p.name.lower() for p in entries}
    out: list[PciFunction] = []
    for p in entries:
        if (p / "physfn").exists():
            continue  # an SR-IOV virtual function is not a card
        m = _BDF.match(p.name)
        assert m is not None
        dom, bus, dev, fn = (int(m.group(i), 16) for i in range(1, 5))
        f = PciFunction(domain=dom, bus=bus, dev=dev, fn=fn)
        cls = _int(_read(p, "class"), 16)
        if cls is not None:
            f.class_code = cls >> 8
        f.vendor_id = _int(_read(p, "vendor"), 16)
        f.device_id = _int(_read(p, "device"), 16)
        f.cap_gts, f.cap_width = _gts(_read(p, "max_link_speed")), _width(_read(p, "max_link_width"))
        f.sta_gts, f.sta_width = _gts(_read(p, "current_link_speed")), _width(_read(p, "current_link_width"))
        f.numa = _int(_read(p, "numa_node"))
        f.secondary = _int(_read(p, "secondary_bus_number"))
        f.subordinate = _int(_read(p, "subordinate_bus_number"))
        f.is_bridge = f.class_code == 0x0604 or f.secondary is not None
        f.physical_slot = slots.get(f"{dom:04x}:{bus:02x}:{dev:02x}")
        if p.is_symlink():  # the real path is the bridge chain
            parent = os.path.basename(os.path.dirname(os.path.realpath(p))).lower()
            if parent in names and _BDF.match(parent):
                pm = _BDF.match(parent)
                assert pm is not None
                f.parent = tuple(int(pm.group(i), 16) for i in range(1, 5))  # type: ignore[assignment]
            f.parent_known = True
        out.append(f)
    return out


def read_sysfs(root: str | Path = DEFAULT_ROOT, *, name: str = "sysfs", memory_gib: dict[int, float] | None = None,
               warnings: list[str] | None = None) -> Topology:
    """A Topology from a PCI sysfs tree (the real one by default)."""
    funcs = read_functions(root)
    if not funcs:
        raise MomentError("no PCI devices listed", source=str(root))
    return build_topology(funcs, name=name, source=f"sysfs {root}", memory_gib=memory_gib, warnings=warnings)
