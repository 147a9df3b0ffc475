"""On-disk layout: bit-exact round trip, alignment, checksums, crash safety, bad input."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.outputs import LEFTOVER_MARK
from moment.placement import (
    BinSet,
    PlanRef,
    ddak,
    hash_placement,
    open_layout,
    row_format,
    verify_layout,
    write_layout,
)
from moment.placement.reader import load_manifest

layout_mod = importlib.import_module("moment.placement.layout")
N = 3000


@pytest.fixture
def data(tmp_path: Path):
    """Features (N x dim float32), hotness, two 'SSD mounts' (sub-directories) plus one in-layout SSD."""
    rng = np.random.default_rng(7)
    feats = rng.standard_normal((N, 100)).astype(np.float32)  # 400-B rows
    np.save(tmp_path / "features.npy", feats)
    for m in ("ssdA", "ssdB"):
        (tmp_path / m).mkdir()
    h = rng.zipf(1.3, N).astype(np.int64)
    bins = BinSet.uniform(gpus=2, cpus=1, ssds=3, gpu_rows=50, cpu_rows=200, ssd_rows=N, gpu_share=0.3,
                          cpu_share=0.2, ssd_paths=[str(tmp_path / "ssdA"), str(tmp_path / "ssdB"), None])
    return tmp_path, feats, ddak(h, bins, pool=10)


def _write(tmp: Path, a, **kw):
    kw.setdefault("chunk_bytes", 8192)
    return write_layout(tmp / "L", tmp / "features.npy", a, plan=PlanRef(machine="m1"), **kw)


def _leftovers(tmp: Path) -> list[str]:
    found = [p.name for p in tmp.iterdir() if p.name.startswith("L")]
    for m in ("ssdA", "ssdB"):
        found += [f"{m}/{p.name}" for p in (tmp / m).iterdir()]
    return sorted(found)


@pytest.mark.parametrize("align,mode", [(4096, "auto"), (512, "pad"), (4096, "pad")])
def test_round_trip_bit_exact_and_aligned(data, align, mode):
    tmp, feats, a = data
    seen = []
    path = _write(tmp, a, align=align, row_mode=mode, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]
    r = open_layout(path, expected_machine="m1")
    ids = np.arange(N)
    assert np.array_equal(r.rows(ids), feats)  # bit-exact, every node
    assert r.rows([5, 5, 0]).shape == (3, 100)
    fmt = r.manifest.row
    assert fmt == row_format(400, align, mode)
    bins, offs = r.locate(ids)
    ssd = np.array([r.manifest.shards[b].kind == "ssd" for b in bins])
    o = offs[ssd]
    if fmt.mode == "pad":
        assert (o % align == 0).all() and fmt.stride % align == 0
    else:  # packed: no row straddles an aligned block
        assert (o // align == (o + fmt.row_bytes - 1) // align).all()
    for s in r.manifest.shards:
        if s.kind == "ssd":
            assert Path(s.path).is_absolute() or s.path.startswith("shards/")
            assert s.bytes % align == 0
    # rows in a shard are hottest first
    nodes = a.nodes_of(a.bins.index("ssd0"))
    _, off = r.locate(nodes)
    assert (np.diff(off) > 0).all()
    rep = verify_layout(path)
    assert rep.ok and rep.first_bad_file is None, rep.problems
    assert _leftovers(tmp) == ["L", "ssdA/" + Path(r.manifest.shards[3].path).parent.name,
                               "ssdB/" + Path(r.manifest.shards[4].path).parent.name]
    assert (path / "lists" / "gpu0.nodes.npy").is_file()
    assert np.array_equal(np.load(path / "lists" / "gpu0.nodes.npy"), a.nodes_of(0))


def test_row_format_choices():
    assert row_format(4096).stride == 4096 and row_format(4096).padding_overhead == 0
    assert row_format(400).mode == "pack" and row_format(400).stride == 512
    assert row_format(4100, 512).stride == 4608
    assert row_format(3000).mode == "pad" and row_format(3000).stride == 4096  # pack would be 4096 too
    with pytest.raises(MomentError):
        row_format(100, 1000)
    with pytest.raises(MomentError):
        row_format(5000, 4096, "pack")


def test_verify_names_bad_shard_and_offset(data):
    tmp, _, a = data
    path = _write(tmp, a, align=512, row_mode="pad")
    m = load_manifest(path)
    s = next(s for s in m.shards if s.bin == "ssd1")
    f = Path(s.path)
    pos = 3 * 8192 + 17
    with open(f, "r+b") as fh:
        fh.seek(pos)
        byte = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([byte[0] ^ 0xFF]))
    rep = verify_layout(path)
    assert not rep.ok
    assert rep.first_bad_shard == "ssd1" and rep.first_bad_file == str(f)
    assert rep.first_bad_offset == 3 * 8192
    assert "chunk 3" in rep.problems[0]
    # a damaged index is named too
    with open(path / "index.npy", "r+b") as fh:
        fh.seek(200)
        fh.write(b"\x01")
    rep = verify_layout(path)
    assert rep.first_bad_file == str(path / "index.npy")


def test_interrupted_write_leaves_nothing_complete_and_rerun_works(data):
    tmp, feats, a = data

    def boom(done, total):
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _write(tmp, a, progress=boom)
    assert _leftovers(tmp) == []
    with pytest.raises(MomentError):
        open_layout(tmp / "L")
    # a hard crash leaves .partial directories (manifest never written, Moment's mark there): a rerun starts clean
    (tmp / "L.partial" / "shards").mkdir(parents=True)
    (tmp / "L.partial" / LEFTOVER_MARK).write_text("L")
    (tmp / "L.partial" / "shards" / "ssd2.shard").write_bytes(b"junk")
    with pytest.raises(MomentError, match="manifest"):
        load_manifest(tmp / "L.partial")
    path = _write(tmp, a)
    assert verify_layout(path).ok
    assert np.array_equal(open_layout(path).rows(np.arange(N)), feats)
    with pytest.raises(MomentError, match="exists"):
        _write(tmp, a)
    path = _write(tmp, hash_placement(np.ones(N), a.bins), overwrite=True)
    assert verify_layout(path).ok and load_manifest(path).plan.machine == "m1"
    assert np.array_equal(open_layout(path).rows(np.arange(N)), feats)
    assert len(_leftovers(tmp)) == 3


def test_bad_input(data, monkeypatch):
    tmp, _, a = data
    feats = tmp / "features.npy"
    bins = a.bins.model_copy(deep=True)
    bins.bins[3].path = str(tmp / "no-such-ssd")
    bad = ddak(np.ones(N), bins)
    with pytest.raises(MomentError, match="does not exist") as e:
        write_layout(tmp / "L", feats, bad)
    assert "no-such-ssd" in str(e.value)
    (tmp / "a-file").write_text("x")
    bins.bins[3].path = str(tmp / "a-file")
    with pytest.raises(MomentError, match="not a directory"):
        write_layout(tmp / "L", feats, ddak(np.ones(N), bins))
    if os.geteuid() != 0:  # root can write anywhere
        ro = tmp / "ro"
        ro.mkdir(mode=0o500)
        bins.bins[3].path = str(ro)
        with pytest.raises(MomentError, match="not writable"):
            write_layout(tmp / "L", feats, ddak(np.ones(N), bins))
    small = ddak(np.ones(N - 1), a.bins)
    with pytest.raises(MomentError, match="2999 nodes but the dataset has 3000"):
        write_layout(tmp / "L", feats, small)
    with pytest.raises(MomentError, match="not found"):
        write_layout(tmp / "L", tmp / "nope.npy", a)

    class Usage:
        free = 1000

    monkeypatch.setattr(layout_mod.shutil, "disk_usage", lambda p: Usage())
    with pytest.raises(MomentError, match="not enough free space"):
        write_layout(tmp / "L", feats, a)
    monkeypatch.undo()
    assert _leftovers(tmp) == []  # nothing half-written by any of the above
    path = _write(tmp, a)
    with pytest.raises(MomentError, match="planned for machine 'm1'"):
        open_layout(path, expected_machine="other")
    with pytest.raises(MomentError, match="not a complete layout"):
        open_layout(tmp / "ssdA")
