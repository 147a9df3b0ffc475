"""`dmidecode` / `dmidecode -t slot`: the board's slots (names, physical width, in use) onto a Topology.

lspci sees ports, not slots: it cannot name a slot, tell its mechanical width, or show an empty slot
behind a port that does not exist yet. SMBIOS type 9 records do, but BIOSes fill them loosely
(`0000:ff:00.0` or no address for empty slots, `<OUT OF SPEC>` types for Gen4+, bogus segments), so
records are parsed into typed `SlotRecord`s first and `merge_slots` matches them to the tree:

1. a slot whose port leads to the record's bus (the slot's link label `bus DDDD:BB`, or the bus of the
   device in it), or whose port address is the record's address: the slot gets the designation,
   the physical width, and a warning if dmidecode and lspci disagree about it being in use;
2. a GPU/SSD/NIC on that bus that is not in a slot: a slot is inserted above it;
3. a PCIe switch on that bus (a card with a switch on it): left as is (the model puts no switch in a
   slot), with a warning;
4. otherwise (address unknown, `ff` bus, or nothing there): a new empty slot under the first root
   complex of the socket its designation names ("CPU2 ..." -> cpu1), else of cpu0 (a warning names
   such slots when there are several sockets). Its link is the record's data width (narrowed to a
   designation's "X8" where that is narrower, at most x4 for M.2) at the record's generation (from
   the type or a "PCI-E 4.0" designation); a record that names none gets the highest generation the
   board's other records state, at most the CPU's ("Processor Information"), else the CPU's, else
   PCIe 4.0 (`assumed_gen`), said in the slot's label and one warning naming the slots. Records of
   legacy PCI slots are skipped.
Slots added in 2 and 4 are named by the builder's one rule (`readers.build.slot_id`: `<parent>-slot<k>`,
the parent's next free k), like the slots every reader builds. On its own (`topology_from_slots`),
its sockets are joined by the socket link every reader assumes (`readers.build.socket_mesh`).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from moment.errors import MomentError, validation_error
from moment.topology.model import PLACEABLE, Kind, Topology
from moment.topology.readers import console
from moment.topology.readers import _xml_cpu as cpus
from moment.topology.readers.build import next_slot_id, socket_mesh
from moment.topology.readers.pci import DEFAULT_GEN

_ADDR = re.compile(r"^([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_TYPE = re.compile(r"^(?:x(?P<dw>\d+)\s+)?(?P<rest>.*)$")
_PCIE = re.compile(r"PCI Express(?:\s+(?P<gen>\d))?(?:\s+x(?P<pw>\d+))?", re.IGNORECASE)
_DESIG_GEN = re.compile(r"(?:PCI-?E|PCIe|Gen)\s*(\d)(?:\.0)?\b", re.IGNORECASE)
_CPU = re.compile(r"\bCPU\s*(\d+)", re.IGNORECASE)
_DESIG_WIDTH = re.compile(r"\bX(1|2|4|8|16)\b", re.IGNORECASE)  # "PCI-E 3.0 X8": the lanes wired
M2_LANES = 4  # an M.2 socket carries at most four PCIe lanes
_HANDLE = re.compile(r"^Handle (0x[0-9a-fA-F]+), DMI type \d+")
_BUS_LABEL = re.compile(r"bus ([0-9a-f]{4}):([0-9a-f]{2})")


class SlotRecord(BaseModel):
    """One SMBIOS "System Slot Information" record."""

    model_config = ConfigDict(extra="forbid")

    designation: str
    type: str = ""
    data_width: int | None = None
    physical_width: int | None = None
    gen: int | None = None
    pcie: bool = False
    m2: bool = False
    in_use: bool | None = None
    length: str | None = None
    bus_address: str | None = None  # None when missing or ff (dmidecode's "no device")
    line: int | None = None

    @property
    def width(self) -> int | None:
        return self.physical_width or self.data_width


def _blocks(lines: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    out, cur = [], []
    for no, line in lines:
        if not line.strip() or line.startswith("Handle "):
            if cur:
                out.append(cur)
            cur = []
            continue
        cur.append((no, line))
    if cur:
        out.append(cur)
    return out


def _fields(block: list[tuple[int, str]]) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for no, line in block:
        if line.startswith("\t\t") or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        out.setdefault(key.strip(), (no, value.strip()))
    return out


def _one_table(lines: list[tuple[int, str]], source: str) -> None:
    """Refuse two SMBIOS tables in one file: a record handle appears once in a table, so one seen twice
    means two dmidecode outputs (two machines' dumps, or one run twice, `>>`), whose records would add up
    to a machine that does not exist."""
    seen: dict[str, int] = {}
    for no, line in lines:
        if m := _HANDLE.match(line):
            handle = m.group(1).lower()
            if handle in seen:
                raise MomentError(f"holds more than one SMBIOS table: record Handle {m.group(1)} appears at lines "
                                  f"{seen[handle]} and {no} (two dmidecode outputs in one file)", source=source,
                                  hint="keep one machine's dmidecode output in the file (`sudo dmidecode > dmi.txt`, "
                                       "not >>)")
            seen[handle] = no


def parse_slots(text: str, source: str = "dmidecode") -> list[SlotRecord]:
    """Typed slot records from full `dmidecode` or `dmidecode -t slot` output ([] when there are none);
    a file holding two SMBIOS tables is refused (`_one_table`)."""
    out: list[SlotRecord] = []
    lines = console.select(text, console.is_dmidecode)
    _one_table(lines, source)
    for block in _blocks(lines):
        if block[0][1].strip() != "System Slot Information":
            continue
        f = _fields(block[1:])
        start = block[0][0]
        designation = f.get("Designation", (start, ""))[1] or f"slot record at line {start}"
        type_text = f.get("Type", (start, ""))[1]
        t = _TYPE.match(type_text)
        assert t is not None  # the pattern matches any string
        data_width = int(t.group("dw")) if t.group("dw") else None
        pcie = _PCIE.search(t.group("rest"))
        m2 = "m.2" in type_text.lower()
        gen = int(pcie.group("gen")) if pcie and pcie.group("gen") else None
        if gen is None and (d := _DESIG_GEN.search(designation)):
            gen = int(d.group(1))
        if gen is not None and not 1 <= gen <= 6:
            gen = None
        physical = int(pcie.group("pw")) if pcie and pcie.group("pw") else None
        if data_width is not None and not 0 < data_width <= 32 or physical is not None and not 0 < physical <= 32:
            raise MomentError(f"line {f['Type'][0]}: slot width out of range in {type_text!r}", source=source)
        if (w := _DESIG_WIDTH.search(designation)) and int(w.group(1)) < (data_width or 32):
            physical = physical or data_width  # the Type's width is the slot's size; the name says the lanes
            data_width = int(w.group(1))
        if m2:
            data_width = min(data_width or M2_LANES, M2_LANES)
        usage = f.get("Current Usage", (start, ""))[1].lower()
        address = None
        if "Bus Address" in f:
            no, raw = f["Bus Address"]
            m = _ADDR.match(raw)
            if not m:
                raise MomentError(f"line {no}: Bus Address {raw!r} is not DDDD:BB:DD.F", source=source)
            if m.group(2).lower() != "ff":
                address = raw.lower()
        out.append(SlotRecord(
            designation=designation, type=type_text, data_width=data_width, physical_width=physical, gen=gen,
            pcie=bool(pcie) or m2 or (data_width is not None and "pci" not in type_text.lower()), m2=m2,
            in_use=True if usage == "in use" else False if usage == "available" else None,
            length=f.get("Length", (start, None))[1], bus_address=address, line=start))
    return out


def looks_like_dmidecode(text: str) -> bool:
    """Does the text hold at least one DMI record header ("Handle 0x0900, DMI type 9, 17 bytes")?"""
    return any(_HANDLE.match(line) for _, line in console.select(text, console.is_dmidecode))


def count_sockets(text: str) -> int | None:
    """Populated CPU sockets from `dmidecode` "Processor Information" records (None if there are none)."""
    n, seen = 0, False
    for block in _blocks(console.select(text, console.is_dmidecode)):
        if block[0][1].strip() != "Processor Information":
            continue
        seen = True
        status = _fields(block[1:]).get("Status", (0, ""))[1]
        if "unpopulated" not in status.lower():
            n += 1
    return n if seen else None


def cpu_model(text: str) -> str | None:
    """The first populated socket's CPU name ("Processor Information" Version), for its socket link."""
    for block in _blocks(console.select(text, console.is_dmidecode)):
        if block[0][1].strip() != "Processor Information":
            continue
        f = _fields(block[1:])
        if "unpopulated" not in f.get("Status", (0, ""))[1].lower() and f.get("Version", (0, ""))[1]:
            return f["Version"][1]
    return None


def read_dmidecode(path: str | Path) -> list[SlotRecord]:
    return parse_slots(console.read_text(path), str(path))


# ---- merging -----------------------------------------------------------------------------------------
def _bus_of(pci: str | None) -> str | None:
    if not pci:
        return None
    m = _ADDR.match(pci)
    return f"{m.group(1)}:{m.group(2)}".lower() if m else None


def assumed_gen(records: list[SlotRecord], cpu: str | None = None) -> tuple[int, str]:
    """The PCIe generation of a slot whose record names none, and where it comes from: the highest the
    board's other slot records state, at most the CPU's (the "Processor Information" name), else the
    CPU's, else the readers' default (`pci.DEFAULT_GEN`)."""
    cpu_gen = cpus.pcie_gen(cpus.from_model_string(cpu))
    stated = [r.gen for r in records if r.pcie and r.gen]
    cpu_text = f"{' '.join(cpu.split())}: PCIe {cpu_gen}.0" if cpu and cpu_gen else None
    if stated:
        gen = max(stated)
        if cpu_gen and cpu_gen < gen:
            return cpu_gen, f"the CPU's ({cpu_text}), below the board's other slot records' {gen}.0"
        return gen, "the highest the board's other slot records state" + (f" (CPU {cpu_text})" if cpu_text else "")
    if cpu_gen:
        return cpu_gen, f"the CPU's ({cpu_text})"
    return DEFAULT_GEN, "no slot record states a generation and the CPU is not known"


def merge_slots(topo: Topology, records: list[SlotRecord], *, warnings: list[str] | None = None,
                pci_scanned: bool = True, cpu: str | None = None) -> Topology:
    """A copy of `topo` with dmidecode's slots matched, annotated or added (rules in the module docstring);
    `cpu` is the "Processor Information" name, for the generation of slots whose record names none."""
    warns: list[str] = [] if warnings is None else warnings
    fallback_gen, fallback_why = assumed_gen(records, cpu)
    gen_assumed: list[str] = []
    socket_unknown: list[str] = []
    nodes = [n.model_dump(exclude_none=True) for n in topo.nodes]
    by_id = {n["id"]: n for n in nodes}
    kids: dict[str, list[dict]] = {}
    for n in nodes:
        if n.get("parent"):
            kids.setdefault(n["parent"], []).append(n)
    used: set[str] = set()
    skipped = [r for r in records if not r.pcie]
    if skipped:
        warns.append(f"dmidecode: skipped {len(skipped)} slot records that are not PCIe "
                     f"({', '.join(r.designation for r in skipped[:4])}{', ...' if len(skipped) > 4 else ''})")

    def slot_bus(s: dict) -> str | None:
        m = _BUS_LABEL.search((s.get("link") or {}).get("label") or "")
        if m:
            return f"{m.group(1)}:{m.group(2)}"
        occ = kids.get(s["id"], [])
        return _bus_of(occ[0].get("pci")) if occ else None

    for r in (r for r in records if r.pcie):
        target = None
        if r.bus_address:
            bus = _bus_of(r.bus_address)
            cands = [s for s in nodes if s["kind"] == "slot" and s["id"] not in used
                     and (slot_bus(s) == bus or s.get("pci") == r.bus_address)]
            if cands:
                target = cands[0]
            else:
                devs = [d for d in nodes if d["kind"] in [k.value for k in PLACEABLE] and _bus_of(d.get("pci")) == bus
                        and by_id[d["parent"]]["kind"] != "slot"]
                sws = [d for d in nodes if d["kind"] == "switch" and _bus_of(d.get("pci")) == bus]
                if devs:
                    target = _wrap(nodes, by_id, kids, devs[0], next_slot_id(devs[0]["parent"], set(by_id)))
                elif sws:
                    warns.append(f"dmidecode slot {r.designation!r} ({r.bus_address}) holds a card with a PCIe "
                                 f"switch ({sws[0]['id']}); the model puts no switch in a slot, left as is")
                    sws[0]["label"] = f"{sws[0].get('label') or 'switch'} in {r.designation}"
                    continue
        if target is None:
            target = _new_slot(nodes, by_id, kids, r, fallback_gen, socket_unknown)
            if r.gen is None:
                gen_assumed.append(r.designation)
                target["label"] = f"PCIe {fallback_gen}.0 assumed: the record names no generation"
            if r.in_use and pci_scanned:
                warns.append(f"dmidecode slot {r.designation!r} is in use"
                             f"{' at ' + r.bus_address if r.bus_address else ''} but the PCI scan shows nothing "
                             f"there; added as an empty slot ({target['id']})")
        used.add(target["id"])
        target["designation"] = r.designation
        target["label"] = r.designation if not target.get("label") else f"{r.designation} ({target['label']})"
        if r.width:
            target["width"] = r.width
        if r.m2:
            target["accepts"] = [Kind.ssd.value]
        occupied = bool(kids.get(target["id"]))
        if r.in_use is False and occupied:
            warns.append(f"dmidecode says slot {r.designation!r} is available, but {kids[target['id']][0]['id']} "
                         "sits there")
    if socket_unknown:
        sockets = [n["id"] for n in nodes if n["kind"] == "socket"]
        warns.append(f"dmidecode: the socket of {_count(socket_unknown, 'slot')} is not in the records (no "
                     f"\"CPU<n>\" in the designation: {_names(socket_unknown)}): put under {sockets[0]}, though the "
                     f"machine has {len(sockets)} sockets")
    if gen_assumed:
        warns.append(f"dmidecode: {_count(gen_assumed, 'slot record')} name{'s' if len(gen_assumed) == 1 else ''} "
                     f"no PCIe generation ({_names(gen_assumed)}): assumed PCIe {fallback_gen}.0, {fallback_why}")
    data = topo.model_dump(exclude_none=True)
    data["nodes"] = nodes
    try:
        return Topology.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, "could not merge dmidecode slots", limit=1) from None


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _names(designations: list[str], shown: int = 6) -> str:
    return ", ".join(designations[:shown]) + (f", ... ({len(designations) - shown} more)" if len(designations) > shown
                                              else "")


def _wrap(nodes: list[dict], by_id: dict, kids: dict, dev: dict, slot_id: str) -> dict:
    """Insert a slot between a device and its parent (dmidecode says the device sits in a slot)."""
    parent = dev["parent"]
    slot = {"id": slot_id, "kind": "slot", "parent": parent, "width": (dev.get("link") or {}).get("width") or 16,
            "link": dict(dev["link"]) if dev.get("link") else {"gen": DEFAULT_GEN, "width": 16}}
    nodes.insert(nodes.index(dev), slot)
    by_id[slot_id] = slot
    kids[parent] = [slot if k is dev else k for k in kids.get(parent, [])]
    dev["parent"] = slot_id
    kids[slot_id] = [dev]
    return slot


def _new_slot(nodes: list[dict], by_id: dict, kids: dict, r: SlotRecord, fallback_gen: int,
              socket_unknown: list[str]) -> dict:
    sockets = [n for n in nodes if n["kind"] == "socket"]
    want = None
    if m := _CPU.search(r.designation):
        idx = int(m.group(1)) - 1
        want = next((s for s in sockets if s["id"] == f"cpu{idx}"), None)
    if want is None and len(sockets) > 1:
        socket_unknown.append(r.designation)
    sock = want or sockets[0]
    rc = next((n for n in kids.get(sock["id"], []) if n["kind"] == "root_complex"), None)
    if rc is None:
        used = {n["id"] for n in nodes}
        i = 0
        while f"rc{i}" in used:
            i += 1
        rc = {"id": f"rc{i}", "kind": "root_complex", "parent": sock["id"], "label": "root complex (assumed)"}
        nodes.append(rc)
        by_id[rc["id"]] = rc
        kids.setdefault(sock["id"], []).append(rc)
    width = r.data_width or r.width or 16
    slot_id = next_slot_id(rc["id"], set(by_id))
    slot = {"id": slot_id, "kind": "slot", "parent": rc["id"], "width": r.width or width,
            "link": {"gen": r.gen or fallback_gen, "width": width}}
    nodes.append(slot)
    by_id[slot_id] = slot
    kids.setdefault(rc["id"], []).append(slot)
    return slot


def topology_from_slots(records: list[SlotRecord], *, name: str = "dmidecode", sockets: int | None = None,
                        source: str | None = None, warnings: list[str] | None = None,
                        cpu: str | None = None) -> Topology:
    """A coarse machine from slot records alone: sockets, one root complex each, the slots under them,
    and the sockets joined as every reader joins them (`socket_mesh`, the link assumed for `cpu`, the
    "Processor Information" name, when known)."""
    n = max(sockets or 1, 1)
    nodes = [{"id": f"cpu{i}", "kind": "socket"} for i in range(n)]
    nodes += [{"id": f"rc{i}", "kind": "root_complex", "parent": f"cpu{i}", "label": "root complex (assumed)"}
              for i in range(n)]
    spec = cpus.socket_link(cpus.from_model_string(cpu))
    links = socket_mesh([(f"cpu{i}", spec) for i in range(n)])
    base = Topology.model_validate({"name": name, "source": source, "nodes": nodes, "links": links})
    if warnings is not None:
        warnings.append("dmidecode alone: each socket has one assumed root complex, a slot hangs under the one "
                        "of the socket its designation names (\"CPU2 ...\"), and the slots are shown empty (no "
                        "PCI scan says what is in them)")
    return merge_slots(base, records, warnings=warnings, pci_scanned=False, cpu=cpu)
