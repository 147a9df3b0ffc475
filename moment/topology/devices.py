"""Device catalogue, inventories and putting devices into slots.

The planner reasons about *models* of devices ("A100-PCIe-40GB", "P5510"); `populate` turns a
slot -> model assignment into a Topology with the devices present, which is what the capacity
graph is built from.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from moment.errors import MomentError
from moment.topology.bandwidth import GB
from moment.topology.model import PLACEABLE, Gpu, Kind, Link, Nic, Slot, Ssd, Topology


class DeviceModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Kind
    gen: int = Field(description="PCIe generation of the card")
    lanes: int = Field(description="electrical lanes of the card")
    double_width: bool = False
    memory_gib: float = 0.0
    hbm_gbps: float = 0.0
    read_gbps: float = 0.0
    capacity_gb: float = 0.0
    port_gbit: float = Field(0.0, description="NIC: line rate of one network port, Gb/s")
    ports: int = Field(0, description="NIC: network ports on the card")
    nvlink_bridge: bool = Field(False, description=(
        "GPU: takes an NVLink bridge to a card of its own model (a bridge between slots carries data only then)"))
    aliases: tuple[str, ...] = ()


CATALOG: tuple[DeviceModel, ...] = (
    DeviceModel(name="A100-PCIe-40GB", kind=Kind.gpu, gen=4, lanes=16, double_width=True, memory_gib=40,
                hbm_gbps=1555, nvlink_bridge=True, aliases=("a100", "a100-40gb", "a100-pcie")),
    DeviceModel(name="A100-PCIe-80GB", kind=Kind.gpu, gen=4, lanes=16, double_width=True, memory_gib=80,
                hbm_gbps=1935, nvlink_bridge=True, aliases=("a100-80gb",)),
    DeviceModel(name="H100-PCIe-80GB", kind=Kind.gpu, gen=5, lanes=16, double_width=True, memory_gib=80,
                hbm_gbps=2000, nvlink_bridge=True, aliases=("h100", "h100-pcie")),
    DeviceModel(name="L40S", kind=Kind.gpu, gen=4, lanes=16, double_width=True, memory_gib=48, hbm_gbps=864),
    DeviceModel(name="RTX-6000-Ada", kind=Kind.gpu, gen=4, lanes=16, double_width=True, memory_gib=48,
                hbm_gbps=960, aliases=("rtx6000ada",)),
    DeviceModel(name="V100-PCIe-32GB", kind=Kind.gpu, gen=3, lanes=16, double_width=True, memory_gib=32,
                hbm_gbps=900, aliases=("v100",)),
    DeviceModel(name="T4", kind=Kind.gpu, gen=3, lanes=16, double_width=False, memory_gib=16, hbm_gbps=320),
    DeviceModel(name="P5510", kind=Kind.ssd, gen=4, lanes=4, read_gbps=6.5, capacity_gb=3840,
                aliases=("intel-p5510", "d7-p5510")),
    DeviceModel(name="P5800X", kind=Kind.ssd, gen=4, lanes=4, read_gbps=7.2, capacity_gb=1600),
    DeviceModel(name="PM1733", kind=Kind.ssd, gen=4, lanes=4, read_gbps=7.0, capacity_gb=3840),
    DeviceModel(name="990-PRO", kind=Kind.ssd, gen=4, lanes=4, read_gbps=7.45, capacity_gb=2000,
                aliases=("samsung-990-pro",)),
    DeviceModel(name="PM1743", kind=Kind.ssd, gen=5, lanes=4, read_gbps=13.0, capacity_gb=3840),
    DeviceModel(name="P4510", kind=Kind.ssd, gen=3, lanes=4, read_gbps=3.2, capacity_gb=4000),
    # NICs: NVIDIA (Mellanox) product briefs. ConnectX-6 Dx MCX623106AN-CDAT: 2 x 100 GbE, PCIe 4.0 x16;
    # ConnectX-6 VPI MCX653105A-HDAT: 1 x HDR 200 Gb/s InfiniBand or 200 GbE, PCIe 4.0 x16; ConnectX-7
    # MCX75310AAS-NEAT: 1 x NDR 400 Gb/s InfiniBand, PCIe 5.0 x16.
    DeviceModel(name="CX6-Dx-100GbE", kind=Kind.nic, gen=4, lanes=16, port_gbit=100, ports=2,
                aliases=("connectx-6-dx", "cx6dx", "mcx623106an-cdat")),
    DeviceModel(name="CX6-HDR-200", kind=Kind.nic, gen=4, lanes=16, port_gbit=200, ports=1,
                aliases=("connectx-6", "cx6", "mcx653105a-hdat")),
    DeviceModel(name="CX7", kind=Kind.nic, gen=5, lanes=16, port_gbit=400, ports=1,
                aliases=("connectx-7", "cx7-ndr-400", "mcx75310aas-neat")),
)


@lru_cache(maxsize=256)
def bridge_group(model: str | None) -> str | None:
    """What an NVLink bridge on a GPU of `model` joins it to: cards of its own model where the catalogue says it
    takes a bridge (None: it takes none, a T4, an L40S); a model the catalogue does not know (a scanned card) is
    taken at its word, the bridge the profile shows."""
    if model is None:
        return None
    try:
        m = find_model(model)
    except MomentError:
        return model
    return m.name if m.nvlink_bridge else None


#: lower-case name or alias -> the first catalogue model it names (`find_model`, called per device of every
#: network a search builds: a scan of the catalogue was a tenth of building one)
_BY_NAME: dict[str, DeviceModel] = {}
for _m in CATALOG:
    for _key in (_m.name.lower(), *_m.aliases):
        _BY_NAME.setdefault(_key, _m)
del _m, _key


def find_model(name: str) -> DeviceModel:
    m = _BY_NAME.get(name.strip().lower())
    if m is not None:
        return m
    known = ", ".join(m.name for m in CATALOG)
    raise MomentError(f"unknown device model {name!r}", hint=f"known models: {known}")


class InventoryItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    count: int = Field(ge=0)


class Inventory(BaseModel):
    """What the user owns: e.g. 4 x A100-PCIe-40GB, 8 x P5510."""

    model_config = ConfigDict(extra="forbid")
    items: list[InventoryItem]

    @classmethod
    def simple(cls, gpus: int, ssds: int, gpu_model: str = "A100-PCIe-40GB", ssd_model: str = "P5510"):
        return cls(items=[InventoryItem(model=gpu_model, count=gpus), InventoryItem(model=ssd_model, count=ssds)])

    def models(self) -> list[tuple[DeviceModel, int]]:
        return [(find_model(i.model), i.count) for i in self.items if i.count > 0]

    def count(self, kind: Kind) -> int:
        return sum(c for m, c in self.models() if m.kind == kind)

    def merged(self) -> list[tuple[DeviceModel, int]]:
        """One line per model (a model listed twice is counted once, with both counts), in the inventory's
        order: what the inventory is, however it was spelled."""
        out: dict[str, list] = {}
        for m, c in self.models():
            out.setdefault(m.name, [m, 0])[1] += c
        return [(m, c) for m, c in out.values()]

    def describe(self) -> str:
        """The inventory in words, one line per model (`2xA100,2xA100` is 4 x A100-PCIe-40GB)."""
        return ", ".join(f"{c} x {m.name}" for m, c in self.merged())


def fits(slot: Slot, model: DeviceModel) -> bool:
    """Can this card physically go in this slot? (kind accepted, card not wider than the slot)."""
    return model.kind in slot.accepts and model.lanes <= slot.width


def trained_link(card: Link | None, slot: Slot) -> Link | None:
    """The link a card runs at in `slot`: PCIe link training settles on the lower generation and the
    narrower width of the card and the slot's port (a PCIe 5.0 x4 SSD in a PCIe 4.0 slot runs at
    4.0 x4, an x16 card in a slot wired x8 at x8). Every device link of the capacity graph, the
    planner's search and the cost advisor comes from here. A card link with a measured bandwidth, or
    none, is kept as it is (what was measured is what it carries)."""
    if card is None or card.kind != "pcie" or card.bandwidth_gbps is not None or card.gen is None:
        return card
    port = slot.link
    gen = min(card.gen, port.running_gen) if port is not None and port.running_gen is not None else card.gen
    lanes = port.width if port is not None and port.width is not None else slot.width
    width = min(card.width or lanes, lanes)
    if (gen, width) == (card.gen, card.width):
        return card
    return card.model_copy(update={"gen": gen, "width": width})


def card_link(model: DeviceModel, slot: Slot) -> Link:
    """The link a card of `model` runs at in `slot` (`trained_link`)."""
    link = trained_link(Link(gen=model.gen, width=model.lanes), slot)
    assert link is not None
    return link


def ssd_read_bytes(read_gbps: float, link: Link | None, scale: float = 1.0) -> float:
    """bytes/s an SSD can serve: its rated read rate times a calibration's read scale, and never more
    than its own (trained) link carries."""
    rate = read_gbps * GB * scale
    return min(rate, link.bandwidth()) if link is not None else rate


def check_placement(topo: Topology, placement: dict[str, str]) -> None:
    """Raise MomentError if a slot -> model assignment is physically impossible."""
    used = set(placement)
    for slot_id, model_name in placement.items():
        if not topo.has(slot_id) or topo.node(slot_id).kind != Kind.slot:
            raise MomentError(f"{slot_id!r} is not a slot of {topo.name!r}")
        slot = topo.node(slot_id)
        if topo.children(slot_id):
            raise MomentError(f"slot {slot_id!r} is already occupied")
        m = find_model(model_name)
        if not fits(slot, m):
            raise MomentError(f"{m.name} ({m.kind.value}, x{m.lanes}) does not fit slot {slot_id!r} (x{slot.width})")
        if m.double_width:
            for b in slot.blocks:
                if b in used or topo.children(b):
                    raise MomentError(f"double-width {m.name} in {slot_id!r} covers slot {b!r}, which is in use")


def populate(topo: Topology, placement: dict[str, str], *, check: bool = True) -> Topology:
    """A copy of `topo` with a device of the given model in each named slot.

    New devices are numbered per kind after the existing ones, in the topology's slot order, so the
    same placement always yields the same ids.
    """
    if check:
        check_placement(topo, placement)
    counters = {k: len(topo.of_kind(k)) for k in PLACEABLE}
    new_nodes = []
    for slot in topo.of_kind(Kind.slot):
        if slot.id not in placement:
            continue
        m = find_model(placement[slot.id])
        idx = counters[m.kind]
        counters[m.kind] += 1
        link = card_link(m, slot)
        common = dict(id=f"{m.kind.value}{idx}", parent=slot.id, link=link, label=m.name)
        if m.kind == Kind.gpu:
            new_nodes.append(Gpu(**common, model=m.name, memory_gib=m.memory_gib, hbm_gbps=m.hbm_gbps,
                                 double_width=m.double_width))
        elif m.kind == Kind.ssd:
            new_nodes.append(Ssd(**common, model=m.name, read_gbps=m.read_gbps, capacity_gb=m.capacity_gb))
        else:
            new_nodes.append(Nic(**common, model=m.name))
    data = topo.model_dump()
    data["nodes"] = [n.model_dump() for n in topo.nodes] + [n.model_dump() for n in new_nodes]
    return Topology.model_validate(data)


def strip(topo: Topology, kinds: tuple[Kind, ...] = (Kind.gpu, Kind.ssd)) -> tuple[Topology, dict[str, str]]:
    """Empty every slot holding a device of `kinds`; return the bare chassis and what was removed.

    This is how a scanned machine is re-planned: its current layout becomes a baseline.
    """
    removed: dict[str, str] = {}
    drop: set[str] = set()
    for n in topo.nodes:
        if n.kind in kinds and n.parent and topo.node(n.parent).kind == Kind.slot:
            removed[n.parent] = getattr(n, "model", n.kind.value)
            drop.add(n.id)
    # descendants of removed devices go too (e.g. functions behind a card)
    changed = True
    while changed:
        changed = False
        for n in topo.nodes:
            if n.id not in drop and n.parent in drop:
                drop.add(n.id)
                changed = True
    data = topo.model_dump()
    data["nodes"] = [n.model_dump() for n in topo.nodes if n.id not in drop]
    data["links"] = [lk.model_dump() for lk in topo.links if lk.a not in drop and lk.b not in drop]
    return Topology.model_validate(data), removed


def builtin_gpus(topo: Topology) -> list:
    """GPUs that are part of the machine (SXM modules, not in a slot): the planner never moves them."""
    return [n for n in topo.of_kind(Kind.gpu) if not (n.parent and topo.node(n.parent).kind == Kind.slot)]


def builtin_gpus_note(topo: Topology, sep: str = " ") -> str:
    """', 8 built-in A100-SXM4-80GB GPUs' (with `sep` in front), or '' when there are none."""
    gpus = builtin_gpus(topo)
    if not gpus:
        return ""
    models = sorted({getattr(g, "model", "GPU") for g in gpus})
    return f"{sep}{len(gpus)} built-in {' + '.join(models)} GPU{'s' if len(gpus) > 1 else ''}"
