"""Property tests: damaged XML either reads as a valid Topology or raises MomentError, nothing else.

Inputs are the real fixtures, cut at random points or with one attribute deleted, one number
corrupted or one attribute value replaced, plus plain random bytes.
"""

from __future__ import annotations

import os
import re

import pytest
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moment.errors import MomentError
from moment.topology.model import Topology
from moment.topology.readers.hwloc_xml import read_hwloc_xml
from moment.topology.readers.nccl_xml import read_nccl_xml, write_nccl_xml

TEXTS = {p.name: p.read_text() for p in sorted(FIXTURES.glob("*.xml"))} if FIXTURES.is_dir() else {}
needs_fixtures = pytest.mark.skipif(not TEXTS, reason=f"real-server fixtures not found at {FIXTURES}")
NAMES = sorted(TEXTS) or ["none"]
FAST = settings(max_examples=int(os.environ.get("MOMENT_FUZZ_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.too_slow])

_ATTR = re.compile(r'\s[\w:.-]+="[^"]*"')
_NUMBER = re.compile(r"(?<==\")[^\"]*\d[^\"]*(?=\")|(?<=>)[\d ]+(?=<)")
BAD_NUMBERS = ["", "-1", "0", "0x", "1e400", "nan", "inf", "3.5", "99999999999999999999", "0xZZ", " ", "१६"]


def reader(name: str):
    return read_hwloc_xml if name.startswith("hwloc_") else read_nccl_xml


def outcome(read, text) -> None:
    """The whole contract: a Topology or a MomentError."""
    try:
        topo = read(text)
    except MomentError as e:
        assert str(e)
        return
    assert isinstance(topo, Topology)
    if read is read_nccl_xml:  # whatever was read can be written and read back
        assert isinstance(read_nccl_xml(write_nccl_xml(topo)), Topology)


@FAST
@given(data=st.binary(max_size=400))
def test_random_bytes(data):
    outcome(read_nccl_xml, data)
    outcome(read_hwloc_xml, data)


@FAST
@given(prefix=st.sampled_from(["<system>", '<system version="1"><cpu numaid="0">', "<topology>"]),
       tail=st.text(max_size=200))
def test_random_text_after_a_valid_start(prefix, tail):
    outcome(read_nccl_xml, prefix + tail)
    outcome(read_hwloc_xml, prefix + tail)


@needs_fixtures
@FAST
@given(name=st.sampled_from(NAMES), cut=st.floats(0, 1))
def test_truncated(name, cut):
    text = TEXTS[name]
    outcome(reader(name), text[: int(len(text) * cut)])


@needs_fixtures
@FAST
@given(name=st.sampled_from(NAMES), which=st.integers(min_value=0))
def test_attribute_deleted(name, which):
    text = TEXTS[name]
    spans = [m.span() for m in _ATTR.finditer(text)]
    a, b = spans[which % len(spans)]
    outcome(reader(name), text[:a] + text[b:])


@needs_fixtures
@FAST
@given(name=st.sampled_from(NAMES), which=st.integers(min_value=0), bad=st.sampled_from(BAD_NUMBERS))
def test_number_corrupted(name, which, bad):
    text = TEXTS[name]
    spans = [m.span() for m in _NUMBER.finditer(text)]
    a, b = spans[which % len(spans)]
    outcome(reader(name), text[:a] + bad + text[b:])


@needs_fixtures
@FAST
@given(name=st.sampled_from(NAMES), which=st.integers(min_value=0),
       value=st.text(alphabet=st.characters(blacklist_characters='"<&', blacklist_categories=("Cs",)),
                     max_size=20))
def test_attribute_value_replaced(name, which, value):
    text = TEXTS[name]
    spans = [m.span() for m in _ATTR.finditer(text)]
    a, b = spans[which % len(spans)]
    key = text[a:b].split("=", 1)[0]
    outcome(reader(name), f'{text[:a]}{key}="{value}"{text[b:]}')


@needs_fixtures
@FAST
@given(name=st.sampled_from(NAMES), cut=st.floats(0, 1), which=st.integers(min_value=0))
def test_wrong_reader(name, cut, which):
    """Feeding one format to the other reader, damaged or not, is still only a MomentError."""
    text = TEXTS[name]
    other = read_nccl_xml if name.startswith("hwloc_") else read_hwloc_xml
    outcome(other, text[: max(1, int(len(text) * cut))] if which % 2 else text)
