"""pyudev: NVMe namespaces (name, size) and GPU cards by PCI address, to label what sysfs found.

sysfs gives the PCI tree but not which block device an NVMe controller is, nor its capacity; udev
does. pyudev is optional (`pip install moment[scan]`): without it `available()` says why and the
scan report lists udev as missing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from moment.topology.model import Kind, Topology

try:  # optional dependency
    import pyudev
except ImportError:  # pragma: no cover - depends on the environment
    pyudev = None


class UdevDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str  # "nvme" or "gpu"
    name: str  # nvme0n1, card0
    pci: str | None = None
    model: str | None = None
    size_bytes: int | None = None


def available() -> tuple[bool, str]:
    if pyudev is None:
        return False, "pyudev is not installed (pip install 'moment[scan]')"
    return True, ""


def _pci_parent(dev) -> str | None:
    p = dev.find_parent("pci")
    return p.sys_name.lower() if p is not None else None


def enumerate_devices(context=None) -> list[UdevDevice]:
    """NVMe disks and DRM cards of NVIDIA/AMD GPUs, sorted by kind and PCI address."""
    if pyudev is None:
        return []
    ctx = context or pyudev.Context()
    out: list[UdevDevice] = []
    for d in ctx.list_devices(subsystem="block", DEVTYPE="disk"):
        if not d.sys_name.startswith("nvme"):
            continue
        size = d.attributes.get("size")
        try:
            nbytes = int(size) * 512 if size is not None else None
        except ValueError:
            nbytes = None
        model = d.get("ID_MODEL")
        out.append(UdevDevice(kind="nvme", name=d.sys_name, pci=_pci_parent(d), model=model, size_bytes=nbytes))
    for d in ctx.list_devices(subsystem="drm"):
        if not d.sys_name.startswith("card") or "-" in d.sys_name:
            continue
        pci = d.find_parent("pci")
        vendor = pci.attributes.get("vendor") if pci is not None else None
        if vendor in (b"0x10de", b"0x1002"):
            out.append(UdevDevice(kind="gpu", name=d.sys_name, pci=pci.sys_name.lower()))
    return sorted(out, key=lambda u: (u.kind, u.pci or "", u.name))


def annotate(topo: Topology, devices: list[UdevDevice]) -> Topology:
    """A copy of `topo` with NVMe names/capacities and GPU card names put on the matching nodes."""
    by_pci: dict[str, list[UdevDevice]] = {}
    for u in devices:
        if u.pci:
            by_pci.setdefault(u.pci, []).append(u)
    data = topo.model_dump(exclude_none=True)
    for n in data["nodes"]:
        found = by_pci.get((n.get("pci") or "").lower(), [])
        if n["kind"] == Kind.ssd.value and (disks := [u for u in found if u.kind == "nvme"]):
            n["label"] = f"{', '.join(u.name for u in disks)}: {disks[0].model or n.get('label') or 'NVMe'}"
            total = sum(u.size_bytes or 0 for u in disks)
            if total > 0:
                n["capacity_gb"] = round(total / 1e9, 1)
        elif n["kind"] == Kind.gpu.value and (cards := [u for u in found if u.kind == "gpu"]):
            n["label"] = f"{cards[0].name}: {n.get('label') or 'GPU'}"
    return Topology.model_validate(data)
