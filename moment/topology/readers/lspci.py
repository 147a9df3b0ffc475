"""`lspci -tv` trees and `lspci -vvv` device sections -> PCI functions -> `Topology`.

The tree gives the shape (which bridge each function hangs under, every root bus, vendor/device
names); `-vvv` gives what the tree lacks (class, LnkCap/LnkSta speed and width, NUMA node, physical
slot, whether a port implements a slot). Either works alone (`-vvv` rebuilds the tree from the bridges'
bus numbers, so a partial `-vvv` of a few devices needs the tree); together they are merged by
address. What becomes a socket, switch, slot or device is decided in `readers.pci`.
"""

from __future__ import annotations

import re
from pathlib import Path

from moment.errors import MomentError
from moment.topology.model import Topology
from moment.topology.readers import console
from moment.topology.readers.pci import PciFunction, build_topology

# ---- lspci -tv ---------------------------------------------------------------------------------------
_ROOT = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{2})\]-")
_FUNC = re.compile(r"([0-9a-fA-F]{2})\.([0-7])")
_BRIDGE = re.compile(r"-\[([0-9a-fA-F]{2})(?:-([0-9a-fA-F]{2}))?\]-")
_IDS = re.compile(r"\s*\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")

_ROOT_CTX = (-1, -1)  # the list of root buses


class _TreeParser:
    """A column-aware reader of lspci's ASCII tree (ls-tree.c prints a sibling list's `+-`/`\\-`
    connectors in one column, so the column of a connector names the bus whose list it continues)."""

    def __init__(self, source: str):
        self.source = source
        self.open: dict[int, tuple[int, int]] = {}  # column -> (domain, bus) whose children are listed there
        self.parent_of_bus: dict[tuple[int, int], PciFunction | None] = {}
        self.funcs: list[PciFunction] = []

    def fail(self, no: int, msg: str) -> MomentError:
        return MomentError(f"line {no}: {msg}", source=self.source,
                           hint="expected `lspci -tv` output (a tree of [domain:bus] and dev.fn entries)")

    def line(self, no: int, text: str) -> None:
        i = 0
        while i < len(text) and text[i] in " |":
            i += 1
        rest = text[i:]
        if rest.startswith("-+-"):  # several root buses; their list sits in column i+1
            self.open = {i + 1: _ROOT_CTX}
            self.item(no, text, i + 3, _ROOT_CTX)
        elif rest.startswith("-["):  # one root bus
            self.open = {}
            self.item(no, text, i + 1, _ROOT_CTX)
        elif rest[:2] in ("+-", "\\-"):
            if i not in self.open:
                raise self.fail(no, f"column {i + 1}: '{rest[:2]}' continues no open list")
            ctx = self.open[i]
            for col in [c for c in self.open if c > i]:
                del self.open[col]
            if rest[0] == "\\":
                del self.open[i]
            self.item(no, text, i + 2, ctx)
        else:
            raise self.fail(no, f"unexpected text {rest[:20]!r}")

    def item(self, no: int, text: str, pos: int, ctx: tuple[int, int]) -> None:
        if ctx == _ROOT_CTX:
            m = _ROOT.match(text, pos)
            if not m:
                raise self.fail(no, f"column {pos + 1}: expected [domain:bus]")
            bus = (int(m.group(1), 16), int(m.group(2), 16))
            if bus in self.parent_of_bus:
                raise self.fail(no, f"root bus {m.group(1)}:{m.group(2)} appears twice")
            self.parent_of_bus[bus] = None
            self.bus(no, text, m.end(), bus)
            return
        m = _FUNC.match(text, pos)
        if not m:
            raise self.fail(no, f"column {pos + 1}: expected dev.fn such as 00.0")
        parent = self.parent_of_bus[ctx]
        f = PciFunction(domain=ctx[0], bus=ctx[1], dev=int(m.group(1), 16), fn=int(m.group(2)),
                        parent=parent.key if parent else None, parent_known=True, source_line=no)
        if f.dev > 0x1F:
            raise self.fail(no, f"device number {m.group(1)} is above 1f")
        self.funcs.append(f)
        b = _BRIDGE.match(text, m.end())
        if b:
            f.is_bridge = True
            f.secondary = int(b.group(1), 16)
            f.subordinate = int(b.group(2) or b.group(1), 16)
            sub = (ctx[0], f.secondary)
            if sub in self.parent_of_bus:
                raise self.fail(no, f"bus {f.secondary:02x} is reached twice")
            self.parent_of_bus[sub] = f
            self.bus(no, text, b.end(), sub)
            return
        tail = text[m.end():]
        if tail and not tail.startswith(" "):
            raise self.fail(no, f"column {m.end() + 1}: unexpected {tail[:12]!r} after {m.group(0)}")
        name = tail.strip()
        ids = _IDS.search(name)
        if ids and re.search(r"\[[0-9a-fA-F]{4}:[0-9a-fA-F]{4}\]\s*(\(rev [0-9a-fA-F]+\))?$", name):
            f.vendor_id, f.device_id = int(ids.group(1), 16), int(ids.group(2), 16)
            name = _IDS.sub("", name, count=0)
        f.name = re.sub(r"\s*\(rev [0-9a-fA-F]+\)$", "", name).strip()
        if f.name == "Device" and f.vendor_id is not None:
            f.name = ""  # `-nn` with no name resolved: the ids speak (display_name shows them)

    def bus(self, no: int, text: str, pos: int, bus: tuple[int, int]) -> None:
        """What follows a bus opening: nothing (empty), `--dev` (one child) or `+-dev` (a list)."""
        while pos < len(text) and text[pos] == "-":
            pos += 1
        if pos >= len(text):
            return
        if text[pos] in "+\\":
            if text[pos + 1:pos + 2] != "-":
                raise self.fail(no, f"column {pos + 2}: expected '-' after '{text[pos]}'")
            if text[pos] == "+":
                self.open[pos] = bus
            self.item(no, text, pos + 2, bus)
        else:
            self.item(no, text, pos, bus)


_BARE_IDS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}")  # what `lspci -tvn` prints instead of a name
_OPENING = re.compile(r"^-(\+-)?\[[0-9a-fA-F]{4}:[0-9a-fA-F]{2}\]")


def parse_tree(text: str, source: str = "lspci -tv") -> list[PciFunction]:
    """PCI functions (with parents and bridge bus ranges) from `lspci -tv` output.

    Pasted output is read the way a person would: a tree indented as a whole (quoted in an issue or
    mail) is read at its indentation, a line repeated verbatim right after itself (a doubled closing
    line) is read once, and text after the tree ends it. What stays ambiguous (a connector in a column
    no open list is in) is refused with its line number, and so is a tree without device names
    (`lspci -t`, `lspci -tvn`), whose devices would all be `other`.
    """
    lines = console.select(text, console.is_lspci_tree)
    p = _TreeParser(source)
    started = False
    indent = 0
    prev: str | None = None
    for no, raw in lines:
        line = raw.expandtabs().rstrip()
        if not started:
            body = line.lstrip(" ")
            if not _OPENING.match(body):
                continue  # prompt echo, headings or a Markdown list before the tree
            started, indent, prev = True, len(line) - len(body), None
        elif indent and line.strip() and line[:indent].strip():
            started = False  # less indented than the tree: the tree ended (columns stay the file's)
            continue
        if started and prev is not None:
            stripped = line.lstrip(" |")
            if not line.strip() or not line.startswith((" ", "|", "-", "+", "\\")) or not stripped.startswith(
                    ("+-", "\\-", "-")):
                if line.strip():
                    started = False  # the tree ended; another may follow (several captures in one file)
                continue
            if line == prev:
                continue  # the same line pasted twice in a row (lspci never prints one twice)
        p.line(no, line)
        prev = line
    if not p.funcs:
        raise MomentError("no `lspci -tv` tree found", source=source,
                          hint="the tree starts with a line like '-[0000:00]-+-00.0 ...' or '-+-[0000:00]-+-...'")
    ends = [f for f in p.funcs if not f.is_bridge]
    if ends and not any(f.vendor_id is not None or (f.name and not _BARE_IDS.fullmatch(f.name)) for f in ends):
        raise MomentError("the tree has no device names (`lspci -t` without -v, or `lspci -tvn`): what each "
                          "device is (GPU, SSD, NIC) cannot be told", source=source,
                          hint="save `lspci -tv` (with -v; -tvnn adds the ids)")
    return p.funcs


# ---- lspci -vvv --------------------------------------------------------------------------------------
_HEADER = re.compile(
    r"^(?:(?P<dom>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[01][0-9a-fA-F])\.(?P<fn>[0-7])\s+"
    r"(?P<cls>[^:\[]+?)(?:\s+\[(?P<code>[0-9a-fA-F]{4})\])?:\s*(?P<rest>.*)$")
_LNKCAP = re.compile(r"LnkCap:.*?Speed (?P<gts>[\d.]+|unknown)\s*GT/s.*?Width x(?P<w>\d+)")
_LNKSTA = re.compile(r"LnkSta:.*?Speed (?P<gts>[\d.]+|unknown)\s*GT/s.*?Width x(?P<w>\d+)")
_BUSNO = re.compile(r"Bus:\s*primary=(?P<p>[0-9a-fA-F]+),\s*secondary=(?P<s>[0-9a-fA-F]+),"
                    r"\s*subordinate=(?P<u>[0-9a-fA-F]+)")
_EXPRESS = re.compile(r"Capabilities: \[[0-9a-fA-F]+\] Express \(v\d+\) (?P<type>[A-Za-z ]+?)"
                      r"(?: \((?P<slot>Slot[+-])\))?(?:,|$)")
_NUMA = re.compile(r"NUMA node:\s*(?P<n>-?\d+)")
_PHYS = re.compile(r"Physical Slot:\s*(?P<s>\S.*)$")
_SLTCAP = re.compile(r"SltCap:.*Slot #(?P<s>\d+)")


def _speed(text: str) -> float | None:
    return None if text == "unknown" else float(text)


def _width(text: str) -> int | None:
    w = int(text)
    return w if 0 < w <= 32 else None


def parse_verbose(text: str, source: str = "lspci -vvv") -> list[PciFunction]:
    """PCI functions with class, links, NUMA node and slot facts from `lspci -v/-vv/-vvv` output."""
    funcs: list[PciFunction] = []
    cur: PciFunction | None = None
    for no, raw in console.select(text, console.is_lspci_verbose):
        line = raw.rstrip()
        if not line:
            continue
        m = _HEADER.match(line)
        if m:
            rest = m.group("rest")
            cur = PciFunction(domain=int(m.group("dom") or "0", 16), bus=int(m.group("bus"), 16),
                              dev=int(m.group("dev"), 16), fn=int(m.group("fn")), class_name=m.group("cls").strip(),
                              source_line=no)
            if m.group("code"):
                cur.class_code = int(m.group("code"), 16)
            ids = re.search(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]", rest)
            if ids:
                cur.vendor_id, cur.device_id = int(ids.group(1), 16), int(ids.group(2), 16)
                rest = rest[:ids.start()] + rest[ids.end():]
            rest = re.sub(r"\s*\(prog-if [^)]*(\[[^\]]*\])?\)", "", rest)
            cur.name = re.sub(r"\s*\(rev [0-9a-fA-F]+\)", "", rest).strip()
            code = cur.code()
            cur.is_bridge = code == 0x0604 or (cur.class_name or "").lower().startswith("pci bridge")
            funcs.append(cur)
            continue
        if not line[0].isspace():
            cur = None  # something else (a fence, a prompt, another command's output)
            continue
        if cur is None:
            continue
        body = line.strip()
        try:
            if (m := _LNKCAP.search(body)) and body.startswith("LnkCap:"):
                cur.cap_gts, cur.cap_width = _speed(m.group("gts")), _width(m.group("w"))
            elif (m := _LNKSTA.search(body)) and body.startswith("LnkSta:"):
                cur.sta_gts, cur.sta_width = _speed(m.group("gts")), _width(m.group("w"))
            elif m := _BUSNO.match(body):
                cur.is_bridge = True
                cur.secondary, cur.subordinate = int(m.group("s"), 16), int(m.group("u"), 16)
                if cur.secondary > 0xFF or cur.subordinate > 0xFF:
                    raise ValueError("bus number above ff")
            elif m := _EXPRESS.match(body):
                cur.port_type = m.group("type").strip()
                if m.group("slot"):
                    cur.slot_capable = m.group("slot") == "Slot+"
            elif m := _NUMA.match(body):
                cur.numa = int(m.group("n"))
            elif m := _PHYS.match(body):
                cur.physical_slot = m.group("s").strip()
            elif (m := _SLTCAP.search(body)) and cur.physical_slot is None:
                cur.physical_slot = m.group("s")
        except ValueError as e:
            raise MomentError(f"line {no}: cannot read {body[:40]!r} ({e})", source=source) from None
    if not funcs:
        raise MomentError("no `lspci -vvv` device sections found", source=source,
                          hint="each device starts with a line like '01:00.0 VGA compatible controller: ...'")
    return funcs


# ---- both together -----------------------------------------------------------------------------------
def merge(tree: list[PciFunction], details: list[PciFunction]) -> list[PciFunction]:
    """The tree's functions with `-vvv` facts filled in; `-vvv` functions the tree lacks are appended."""
    by_key = {f.key: f for f in tree}
    extra = []
    for d in details:
        if d.key in by_key:
            by_key[d.key].merge(d)
        else:
            extra.append(d)
    return [*tree, *extra]


def read_lspci(tree: str | Path | None = None, verbose: str | Path | None = None, *, name: str = "lspci",
               sockets: int | None = None, memory_gib: dict[int, float] | None = None,
               warnings: list[str] | None = None) -> Topology:
    """A Topology from saved `lspci -tv` and/or `lspci -vvv` output (paths or text)."""
    if tree is None and verbose is None:
        raise MomentError("read_lspci needs `lspci -tv` or `lspci -vvv` output")
    funcs: list[PciFunction] = []
    sources = []
    if tree is not None:
        text, src = _text(tree, "lspci -tv")
        funcs = parse_tree(text, src)
        sources.append(src)
    if verbose is not None:
        text, src = _text(verbose, "lspci -vvv")
        funcs = merge(funcs, parse_verbose(text, src))
        sources.append(src)
    return build_topology(funcs, name=name, source=" + ".join(sources), sockets=sockets,
                          memory_gib=memory_gib, warnings=warnings)


def _text(arg: str | Path, what: str) -> tuple[str, str]:
    if isinstance(arg, Path):
        return console.read_text(arg), str(arg)
    return arg, what
