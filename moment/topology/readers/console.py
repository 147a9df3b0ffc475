"""Cut a saved console transcript into the outputs of the commands it shows.

People paste `lspci`, `nvidia-smi` and `dmidecode` output together with the shell prompt, often
inside a Markdown document that holds many commands (the stelline hardware notes do). Every reader
first asks this module for "the lines printed by a command like X", so one file can feed several
readers and a stray prompt line never reaches a parser. A file with no prompt at all is taken whole;
the lines before a file's first prompt are offered to every reader.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from moment import inputs
from moment.errors import MomentError

#: "$ cmd", "$ user@host:~$ cmd", "user@host:~# cmd".
_DOLLAR = re.compile(r"^\$\s+(?P<cmd>.*)$")
_USER_PROMPT = re.compile(r"^[\w.-]+@[\w.-]+:[^\s$#]*[$#]\s*(?P<cmd>.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

Line = tuple[int, str]  # (1-based line number in the file, text)


@dataclass
class Section:
    command: str | None
    lines: list[Line] = field(default_factory=list)


def clean(text: str) -> str:
    """Drop ANSI colour/underline escapes (nvidia-smi underlines its header) and CRs."""
    return _ANSI.sub("", text).replace("\r", "")


def prompt_command(line: str) -> str | None:
    """The command typed on a prompt line, or None if the line is not a prompt."""
    m = _DOLLAR.match(line)
    if m:
        cmd = m.group("cmd")
        inner = _USER_PROMPT.match(cmd)
        return (inner.group("cmd") if inner else cmd).strip()
    m = _USER_PROMPT.match(line)
    return m.group("cmd").strip() if m else None


def sections(text: str) -> list[Section]:
    """Split into command sections; lines outside any command (before a prompt, after a fence) have None."""
    out = [Section(None)]
    for no, raw in enumerate(clean(text).split("\n"), start=1):
        cmd = prompt_command(raw)
        if cmd is not None:
            out.append(Section(cmd))
            continue
        if _FENCE.match(raw):
            if out[-1].command is not None:
                out.append(Section(None))
            continue
        out[-1].lines.append((no, raw))
    return [s for s in out if s.lines or s.command is not None]


def has_prompts(text: str) -> bool:
    return any(prompt_command(ln) is not None for ln in clean(text).split("\n"))


def select(text: str, wanted: Callable[[str], bool]) -> list[Line]:
    """The output lines of every command matching `wanted`, and the lines before the first prompt (a copy
    that starts below its command's prompt: they belong to no other command, and each reader takes only
    what it recognises); the whole text if it has no prompt."""
    if not has_prompts(text):
        return list(enumerate(clean(text).split("\n"), start=1))
    picked: list[Line] = []
    for i, s in enumerate(sections(text)):
        if (s.command is None and i == 0) or (s.command is not None and wanted(s.command)):
            picked.extend(s.lines)
    return picked


@dataclass(frozen=True)
class Given:
    """Saved output read already (standard input, `-`): its text, and what messages call it."""

    text: str
    source: str = "standard input"


def read_text(path: str | Path | Given) -> str:
    """Read a saved output file; a missing or unreadable file is the user's error, and so is UTF-16 text
    (`decode`). A stray byte that is not UTF-8 does not stop the parsers (they say when they find nothing
    they know)."""
    if isinstance(path, Given):
        return path.text
    return decode(inputs.read_bytes(path, "text file (saved command output)"), str(path))


def decode(data: bytes, source: str) -> str:
    """Saved output as text: UTF-8, a stray byte replaced; UTF-16 (`utf16`) is refused by name."""
    if utf16(data):
        raise MomentError("the file is UTF-16 text (what PowerShell's `>` and Out-File write); the readers need "
                          "UTF-8", source=source,
                          hint="save it as UTF-8: PowerShell `... | Out-File -Encoding utf8 FILE`, or convert it: "
                               "`iconv -f utf-16 -t utf-8 FILE > FILE.txt`")
    return data.decode("utf-8", errors="replace")


def utf16(data: bytes) -> bool:
    """Is this UTF-16 text: a UTF-16 byte-order mark, or (without one) a NUL in every other byte, as ASCII
    text in UTF-16 has?"""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True
    sample = data[:4096]
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    return len(sample) >= 8 and max(even, odd) >= len(sample) // 4 and min(even, odd) * 10 <= max(even, odd)


# ---- command predicates -----------------------------------------------------------------------------
def _flags(cmd: str) -> str:
    return "".join(tok[1:] for tok in cmd.split() if tok.startswith("-") and not tok.startswith("--"))


def is_lspci_tree(cmd: str) -> bool:
    return "lspci" in cmd and "t" in _flags(cmd.split("|")[0])


def is_lspci_verbose(cmd: str) -> bool:
    first = cmd.split("|")[0]
    return "lspci" in first and "v" in _flags(first) and "t" not in _flags(first) and "|" not in cmd


def is_nvidia_topo(cmd: str) -> bool:
    return "nvidia-smi" in cmd and "topo" in cmd


def is_dmidecode(cmd: str) -> bool:
    return "dmidecode" in cmd


def is_numactl(cmd: str) -> bool:
    return "numactl" in cmd and ("-H" in cmd.split() or "--hardware" in cmd)
