"""The allocator's two modes (moment.runtime.heap), each in a fresh process: mallopt is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and /proc: Linux only")

MiB = 1 << 20

PRELUDE = """
import numpy as np
from moment.runtime.heap import _rss_anon, keep_freed_memory, return_freed_memory
MiB = 1 << 20
def arrays(n):  # n arrays of 4 MiB, every page written
    out = [np.empty(4 * MiB, np.uint8) for _ in range(n)]
    for a in out:
        a.fill(1)
    return out
"""


def _run(body: str) -> dict[str, int]:
    """Run `body` after the prelude in a fresh interpreter; it prints `key value` lines."""
    out = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_released_memory_goes_back_to_the_kernel_at_once():
    got = _run("""
        return_freed_memory()
        base = _rss_anon()
        held = arrays(20)
        print("held", _rss_anon() - base)
        del held
        print("after", _rss_anon() - base)
    """)
    assert got["held"] >= 75 * MiB and got["after"] < 8 * MiB


def test_kept_memory_is_reused_and_trimmed_past_its_limit():
    got = _run("""
        keeper = keep_freed_memory(48 * MiB, period=3600)  # checked by hand below, not by its thread
        assert keeper is not None
        base = _rss_anon()
        del arrays(8)[:]  # 32 MiB freed: under the limit, kept
        print("kept", _rss_anon() - base)
        print("trimmed_small", int(keeper.check()))
        again = arrays(8)  # made again from the kept memory: no new pages
        print("again", _rss_anon() - base)
        del again
        held = arrays(20)
        pin = np.ones(64 * 1024, np.uint8)  # above them in the heap: their pages are a hole, not the heap's top
        del held
        before = _rss_anon()
        print("trimmed_big", int(keeper.check()))
        print("released", before - _rss_anon())
        print("trims", keeper.trims)
        print("peak_kept", keeper.peak_kept)
        keeper.stop()
    """)
    assert got["kept"] >= 28 * MiB  # freed, still resident for the next arrays
    assert not got["trimmed_small"]
    assert got["again"] < got["kept"] + 4 * MiB  # reused, not mapped anew
    assert got["trimmed_big"] and got["trims"] == 1 and got["peak_kept"] >= 64 * MiB
    assert got["released"] >= 60 * MiB  # the trim gave the hole's pages back


def test_no_limit_means_release():
    got = _run("""
        print("none", int(keep_freed_memory(0) is None))
        base = _rss_anon()
        del arrays(20)[:]
        print("after", _rss_anon() - base)
    """)
    assert got["none"] and got["after"] < 8 * MiB


def test_the_keeper_walks_the_heap_only_when_resident_memory_grew():
    got = _run("""
        keeper = keep_freed_memory(48 * MiB, period=3600)  # checked by hand below, not by its thread
        held = arrays(8)
        print("first", int(keeper.check()))
        print("m_first", keeper.measures)
        small = [np.ones(16 * 1024, np.uint8) for _ in range(8)]  # 128 KiB of new pages: less than a step
        keeper.check()
        print("m_same", keeper.measures)  # grew by less than a step: not measured again
        del held[:]  # freed and kept: resident memory unchanged
        keeper.check()
        print("m_freed", keeper.measures)
        more = arrays(30)  # 32 MiB from the kept memory, the rest new pages
        print("grown_trimmed", int(keeper.check()))
        print("m_grown", keeper.measures)
        print("anon_matches_status", int(abs(keeper._anon.read() - _rss_anon()) < 4 * MiB))
        keeper.stop()
    """)
    assert got["m_first"] == 1 and got["m_same"] == 1 and got["m_freed"] == 1
    assert got["m_grown"] == 2 and not got["first"] and not got["grown_trimmed"]
    assert got["anon_matches_status"]
