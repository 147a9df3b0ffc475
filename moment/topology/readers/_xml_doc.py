"""Load an XML machine description with line numbers, so every complaint can say where.

ElementTree drops source positions, so the tree is built from expat events here; each element's
line is kept in a side table. Every failure (missing file, bad encoding, not well-formed) becomes a
`MomentError` that names the file and, when expat knows it, the line and column.

A DOCTYPE with a DTD of its own (`<!DOCTYPE x [ ... ]>`) is refused before anything in it is read: NCCL and
hwloc dumps carry none (hwloc names an external `hwloc2.dtd`, which is never fetched), and its entities are
how 776 bytes expand into gigabytes (the "billion laughs": expat's own guard took minutes of CPU to stop it).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from moment.errors import MomentError
from moment.inputs import read_bytes
from moment.topology.limits import MAX_DEPTH


@dataclass
class XmlDoc:
    """A parsed document: its root, where it came from, and the line of every element."""

    root: ET.Element
    source: str
    lines: dict[int, int] = field(default_factory=dict)

    def line(self, el: ET.Element) -> int | None:
        return self.lines.get(id(el))

    def error(self, el: ET.Element | None, message: str) -> MomentError:
        """A MomentError naming the file, the element's line and its tag."""
        if el is None:
            return MomentError(message, source=self.source)
        where = f"line {self.line(el)}: " if self.line(el) else ""
        return MomentError(f"{where}<{el.tag}>: {message}", source=self.source)


def load_text(path_or_text: str | bytes | Path, kind: str) -> tuple[str | bytes, str]:
    """(content, source name). A Path, or a str without '<', is a file name; otherwise it is the text."""
    if isinstance(path_or_text, bytes):
        return path_or_text, f"{kind} (text)"
    if isinstance(path_or_text, str) and "<" in path_or_text:
        return path_or_text, f"{kind} (text)"
    if not isinstance(path_or_text, str | Path):
        raise MomentError(f"expected a file path or {kind} text, got {type(path_or_text).__name__}")
    path = Path(path_or_text)
    return read_bytes(path, f"{kind} file"), str(path)


def parse(content: str | bytes, source: str) -> XmlDoc:
    """Parse with expat, recording element lines; comments and processing instructions are dropped."""
    parser = expat.ParserCreate()
    lines: dict[int, int] = {}
    stack: list[ET.Element] = []
    roots: list[ET.Element] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        el = ET.Element(tag, attrs)
        lines[id(el)] = parser.CurrentLineNumber
        if stack:
            stack[-1].append(el)
        else:
            roots.append(el)
        stack.append(el)
        if len(stack) > MAX_DEPTH:
            raise _TooDeep(parser.CurrentLineNumber)

    def end(tag: str) -> None:
        stack.pop()

    def doctype(name: str, system_id: str | None, public_id: str | None, has_internal_subset: int) -> None:
        if has_internal_subset:
            raise _OwnDtd(parser.CurrentLineNumber)

    def text(data: str) -> None:
        if stack:
            el = stack[-1]
            if len(el):
                el[-1].tail = (el[-1].tail or "") + data
            else:
                el.text = (el.text or "") + data

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    parser.StartDoctypeDeclHandler = doctype
    try:
        parser.Parse(content, True)
    except expat.ExpatError as e:
        msg = expat.ErrorString(e.code) if e.code else str(e)
        raise MomentError(
            f"not well-formed XML at line {e.lineno}, column {e.offset + 1}: {msg}", source=source
        ) from None
    except _TooDeep as e:
        raise MomentError(f"elements nested more than {MAX_DEPTH} deep at line {e.line}", source=source) from None
    except _OwnDtd as e:
        raise MomentError(f"line {e.line}: the DOCTYPE declares a DTD of its own (entities, elements): an NCCL or "
                          "hwloc dump has none", source=source,
                          hint="remove the [ ... ] part of <!DOCTYPE ...>: give the file as NCCL or lstopo wrote it") from None
    except (UnicodeError, ValueError) as e:  # undecodable bytes, NUL in str input
        raise MomentError(f"cannot decode the XML text: {e}", source=source) from None
    if not roots:
        raise MomentError("no XML element found", source=source)
    return XmlDoc(roots[0], source, lines)


class _TooDeep(Exception):
    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


class _OwnDtd(Exception):
    """A DOCTYPE with an internal subset (module docstring)."""

    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


def load(path_or_text: str | bytes | Path, kind: str, root_tag: str) -> XmlDoc:
    """Read and parse, and check the root element is `root_tag`."""
    content, source = load_text(path_or_text, kind)
    doc = parse(content, source)
    if doc.root.tag != root_tag:
        raise MomentError(
            f"root element is <{doc.root.tag}> (line {doc.line(doc.root)}), expected <{root_tag}>: "
            f"this is not a {kind} file",
            source=source,
        )
    return doc


# ---- typed attribute access ----------------------------------------------------------------------
_BUSID = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])$")


def busid(doc: XmlDoc, el: ET.Element, attr: str, value: str | None = None) -> str:
    """A PCI address 'dddd:bb:dd.f' in lower case, or MomentError naming the attribute."""
    raw = el.get(attr) if value is None else value
    if raw is None:
        raise doc.error(el, f"missing attribute {attr!r} (a PCI bus id such as 0000:17:00.0)")
    v = raw.strip().lower()
    if not _BUSID.match(v):
        raise doc.error(el, f"{attr}={raw!r} is not a PCI bus id (expected dddd:bb:dd.f)")
    return v


def busid_key(bus: str | None) -> tuple:
    """Sort key in numeric bus order; ids without an address sort last, a repeat (`...#2`) after its first."""
    if bus is None:
        return (1, 0, 0, 0, 0, 0)
    base, _, repeat = bus.partition(REPEAT)
    m = _BUSID.match(base)
    assert m, bus
    return (0, *(int(g, 16) for g in m.groups()), int(repeat or 1))


#: Separates a bus id a file repeats from its occurrence number: the second `0000:a1:00.0` is `0000:a1:00.0#2`.
REPEAT = "#"


def base_busid(bus: str) -> str:
    """The bus id as the file wrote it (a repeat's `#n` removed)."""
    return bus.partition(REPEAT)[0]


def int_attr(doc: XmlDoc, el: ET.Element, attr: str, *, base: int = 10, lo: int | None = None,
             hi: int | None = None, required: bool = False) -> int | None:
    raw = el.get(attr)
    if raw is None or raw.strip() == "":
        if required:
            raise doc.error(el, f"missing attribute {attr!r}")
        return None
    text = raw.strip()
    if base == 16 and text[:2].lower() == "0x":
        text = text[2:]
    digits = text[1:] if base == 10 and text.startswith("-") else text
    try:
        if not digits.isalnum():  # int() would accept '+', '_' and spaces
            raise ValueError(text)
        v = int(text, base)
    except ValueError:
        raise doc.error(el, f"{attr}={raw!r} is not {'a hexadecimal' if base == 16 else 'an'} integer") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        negative = "negative, " if v < 0 and lo is not None and lo >= 0 else ""
        raise doc.error(el, f"{attr}={raw!r} is {negative}out of range ({lo}..{hi})")
    return v


def float_attr(doc: XmlDoc, el: ET.Element, attr: str, *, lo: float = 0.0) -> float | None:
    raw = el.get(attr)
    if raw is None or raw.strip() == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        raise doc.error(el, f"{attr}={raw!r} is not a number") from None
    if not (v >= lo) or v == float("inf"):
        raise doc.error(el, f"{attr}={raw!r} is out of range")
    return v
