"""`--io-trace`: a stack's reads written as an fio iolog, as the disk served them, that fio replays."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from moment.errors import MomentError
from moment.io import IOStack, ReadBatch
from moment.io.trace import HEADER, ReadTrace, rank_trace, setup_trace
from moment.runtime.config import parse_args

ALIGN = 4096


@pytest.fixture
def files(tmp_path):
    """Two files: one of whole blocks, one ending in a partial block (as an unpadded cache-bin file)."""
    rng = np.random.default_rng(0)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(rng.integers(0, 256, 16 * ALIGN, dtype=np.uint8).tobytes())
    b.write_bytes(rng.integers(0, 256, 3 * ALIGN + 100, dtype=np.uint8).tobytes())
    return [a, b]


def _reads(text: str) -> list[tuple[str, int, int]]:
    return [(p[0], int(p[2]), int(p[3])) for p in (line.split() for line in text.splitlines()) if p[1:2] == ["read"]]


def test_the_trace_holds_each_read_as_the_engine_issues_it(files, tmp_path):
    out = tmp_path / "t" / "rank-0.iolog"
    batch = ReadBatch.packed([0, 0, 1, 1], [100, 5 * ALIGN, 2 * ALIGN + 10, 3 * ALIGN + 4], [50, 2 * ALIGN, 200, 90])
    with IOStack(files, alignment=ALIGN, trace=out) as stack:
        got = stack.read(batch)
        assert not out.exists()  # written when the stack closes, whole
    assert got[:50].tobytes() == files[0].read_bytes()[100:150]
    text = out.read_text()
    lines = text.splitlines()
    names = [str(f.resolve()) for f in files]
    assert lines[0] == HEADER and lines[1:5] == [f"{names[0]} add", f"{names[1]} add", f"{names[0]} open",
                                                  f"{names[1]} open"]
    assert lines[-2:] == [f"{names[0]} close", f"{names[1]} close"]
    # rounded outward to the block; the read inside b's partial last block is left out (fio's O_DIRECT refuses it)
    assert _reads(text) == [(names[0], 0, ALIGN), (names[0], 5 * ALIGN, 2 * ALIGN), (names[1], 2 * ALIGN, ALIGN)]
    assert sorted(p.name for p in out.parent.iterdir()) == ["rank-0.iolog"]  # no temporary file left


def test_set_up_reads_are_traced_apart_from_the_runs(files, tmp_path):
    """A cache filled at start is not what the feed rate counts: its reads go to rank-N.setup.iolog, and
    rank-N.iolog holds the run's own reads alone (before, during and after the set-up)."""
    out = tmp_path / "rank-0.iolog"
    one = lambda off: ReadBatch.packed([0], [off], [ALIGN])  # noqa: E731
    with IOStack(files, alignment=ALIGN, trace=out) as stack:
        stack.read(one(0))
        with stack.setup_reads():
            stack.read(one(ALIGN))
            stack.read(one(2 * ALIGN))
        stack.read(one(3 * ALIGN))
    name = str(files[0].resolve())
    assert setup_trace(out) == tmp_path / "rank-0.setup.iolog"
    assert _reads(out.read_text()) == [(name, 0, ALIGN), (name, 3 * ALIGN, ALIGN)]
    assert _reads(setup_trace(out).read_text()) == [(name, ALIGN, ALIGN), (name, 2 * ALIGN, ALIGN)]
    with IOStack(files, alignment=ALIGN, trace=tmp_path / "rank-1.iolog") as stack:
        stack.read(one(0))
    assert not setup_trace(tmp_path / "rank-1.iolog").exists()  # no set-up reads: no set-up log
    with IOStack(files, alignment=ALIGN, trace=out) as stack:  # a later run into the same directory without any
        stack.read(one(0))
    assert not setup_trace(out).exists() and _reads(out.read_text()) == [(name, 0, ALIGN)]  # the earlier one's gone
    with IOStack(files, alignment=ALIGN) as stack, stack.setup_reads():  # untraced: nothing to set apart
        stack.read(one(0))


def test_a_path_fio_cannot_name_is_refused(tmp_path):
    f = tmp_path / "with space.bin"
    f.write_bytes(b"\0" * ALIGN)
    with pytest.raises(MomentError, match="white space"):
        ReadTrace(tmp_path / "t.iolog", [f], ALIGN)


def test_the_option_names_a_directory_it_can_write(tmp_path):
    layout = tmp_path / "layout"
    cfg = parse_args(["--layout", str(layout), "--io-trace", str(tmp_path / "traces")])
    assert cfg.io_trace == tmp_path / "traces" and rank_trace(cfg.io_trace, 1) == tmp_path / "traces" / "rank-1.iolog"
    (tmp_path / "file").write_text("x")
    with pytest.raises(MomentError, match="--io-trace"):
        parse_args(["--layout", str(layout), "--io-trace", str(tmp_path / "file")])


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")
def test_fio_replays_the_trace(files, tmp_path):
    out = tmp_path / "rank-0.iolog"
    rng = np.random.default_rng(1)
    off = rng.integers(0, 15 * ALIGN, 200)
    with IOStack(files[:1], alignment=ALIGN, trace=out) as stack:
        stack.read(ReadBatch.packed(np.zeros(200, np.int32), off, np.full(200, 512)))
    r = subprocess.run(["fio", "--name=replay", f"--read_iolog={out}", "--replay_no_stall=1", "--direct=1",
                        "--readonly", "--iodepth=8", "--output-format=json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    assert job["error"] == 0 and job["read"]["total_ios"] == len(_reads(out.read_text())) == 200


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")
def test_the_bench_replays_every_ranks_trace_for_the_disks_rate(bench_epoch, files, tmp_path, capsys):
    rng = np.random.default_rng(2)
    traces = [rank_trace(tmp_path / "traces", r) for r in range(2)]
    for t in traces:
        with IOStack(files[:1], alignment=ALIGN, trace=t) as stack:
            stack.read(ReadBatch.packed(np.zeros(100, np.int32), rng.integers(0, 15 * ALIGN, 100), np.full(100, 1024)))
    rate = bench_epoch.replay_limit(traces, 16)
    out = capsys.readouterr().out
    assert rate is not None and rate > 0 and "fio_replay: Moment's 200 SSD reads of its ranks" in out
    assert f"fio_replay_MB_per_s: {rate / 1e6:.0f}" in out
