"""Property tests: every text reader, fed random or mangled real captures, returns a valid result or
raises MomentError — never another exception (the CLI turns MomentError into a clean message)."""

from __future__ import annotations

import os

import pytest
from conftest import DATA, FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moment.errors import MomentError
from moment.topology.model import Topology
from moment.topology.readers import dmidecode, lspci, numa, nvidia_smi

if not FIXTURES.is_dir():
    pytest.skip(f"real-server fixtures not found at {FIXTURES}", allow_module_level=True)


def _texts(pattern: str) -> list[str]:
    return [p.read_text() for p in sorted(FIXTURES.glob(pattern))]


TREES = _texts("lspci-tv_*.txt") + [(DATA / "this-machine/lspci-tv.txt").read_text()]
DOCS = _texts("stelline_*.md")
DMI = _texts("dmidecode_*.txt") + [(DATA / "this-machine/dmidecode-t-slot.txt").read_text()]
SMI = _texts("nvidia-smi-topo_*.txt")
VERBOSE = DOCS + [(DATA / "this-machine/lspci-vvv.txt").read_text()]

FUZZ = settings(max_examples=int(os.environ.get("MOMENT_FUZZ_EXAMPLES", 50)), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mangled(draw, pool: list[str]) -> str:
    """A real capture with a few line-level mutations, or cut short."""
    lines = draw(st.sampled_from(pool)).split("\n")
    for _ in range(draw(st.integers(0, 4))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "shuffle", "hex", "truncate_line", "swap_char"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "shuffle":
            j = draw(st.integers(i, min(len(lines), i + 6)))
            chunk = lines[i:j]
            lines[i:j] = draw(st.permutations(chunk)) if chunk else chunk
        elif op == "hex":
            hexpos = [k for k, c in enumerate(lines[i]) if c in "0123456789abcdef"]
            if hexpos:
                k = draw(st.sampled_from(hexpos))
                new = draw(st.sampled_from("0123456789abcdefgxz-[]: "))
                lines[i] = lines[i][:k] + new + lines[i][k + 1:]
        elif op == "truncate_line":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        else:
            if lines[i]:
                k = draw(st.integers(0, len(lines[i]) - 1))
                lines[i] = lines[i][:k] + draw(st.characters(codec="utf-8")) + lines[i][k + 1:]
    text = "\n".join(lines)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


def _ok_or_moment_error(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except MomentError:
        return None


@pytest.mark.slow
@FUZZ
@given(st.one_of(mangled(TREES + DOCS), st.text(max_size=400)))
def test_lspci_tree_never_crashes(text):
    topo = _ok_or_moment_error(lspci.read_lspci, text)
    assert topo is None or isinstance(topo, Topology)


@FUZZ
@given(st.one_of(mangled(VERBOSE), st.text(max_size=400)))
def test_lspci_verbose_never_crashes(text):
    topo = _ok_or_moment_error(lspci.read_lspci, verbose=text)
    assert topo is None or isinstance(topo, Topology)


@FUZZ
@given(mangled(DOCS))
def test_lspci_tree_and_verbose_together_never_crash(text):
    topo = _ok_or_moment_error(lspci.read_lspci, text, text)
    assert topo is None or isinstance(topo, Topology)


@FUZZ
@given(st.one_of(mangled(DMI), st.text(max_size=400)))
def test_dmidecode_never_crashes(text):
    recs = _ok_or_moment_error(dmidecode.parse_slots, text)
    if recs is not None:
        topo = _ok_or_moment_error(dmidecode.topology_from_slots, recs, sockets=dmidecode.count_sockets(text))
        assert topo is None or isinstance(topo, Topology)


@FUZZ
@given(st.one_of(mangled(SMI + DOCS), st.text(max_size=400)))
def test_nvidia_smi_never_crashes(text):
    m = _ok_or_moment_error(nvidia_smi.parse_topo, text)
    if m is not None:
        for mode in ("auto", "never"):
            topo = _ok_or_moment_error(nvidia_smi.topology_from_matrix, m, nvswitch=mode)
            assert topo is None or isinstance(topo, Topology)


@FUZZ
@given(st.one_of(mangled(DOCS), st.text(max_size=200)))
def test_numactl_never_crashes(text):
    assert isinstance(numa.parse_numactl(text), dict)
