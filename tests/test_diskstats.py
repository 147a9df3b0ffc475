"""The SSDs' own busy time and reads over a run's epochs (moment.io.diskstats), from the kernel's counters."""

from __future__ import annotations

import os

import numpy as np
import pytest

from moment.io import IOStack, ReadBatch, aligned_buffer
from moment.io import diskstats
from moment.io.diskstats import DiskWatch, block_device

MiB = 1 << 20


def _stat(path, reads, sectors, ticks):
    """A device's stat file as the kernel writes it (17 fields), with these reads, read sectors and io_ticks."""
    fields = [reads, 0, sectors, 5, 7, 0, 56, 3, 0, ticks, 9, 0, 0, 0, 0, 0, 0]
    (path / "stat").write_text(" ".join(f"{f:8d}" for f in fields) + "\n")


def test_a_span_counts_the_devices_reads_bytes_and_busy_time_exactly(tmp_path, monkeypatch):
    """Two files on one device and one on another: each device once, its files named, each span's deltas of
    its counters (sectors of 512 bytes, io_ticks in ms), the busy share and the rate while busy."""
    devs = {name: tmp_path / name for name in ("nvme0n1", "nvme1n1")}
    for d in devs.values():
        d.mkdir()
        _stat(d, 100, 1000, 50)
    where = {"a": devs["nvme0n1"], "b": devs["nvme1n1"], "pack": devs["nvme0n1"]}
    monkeypatch.setattr(diskstats, "block_device", lambda p: where.get(os.path.basename(p)))
    clock = iter([10.0, 12.0, 20.0, 21.0])
    monkeypatch.setattr(diskstats, "perf_counter", lambda: next(clock))
    w = DiskWatch({"a": "/x/a", "b": "/x/b", "pack": "/x/pack", "tmp": "/x/tmp"})
    assert w.report() == []  # nothing before a span
    w.end()  # an end without a begin adds nothing
    w.begin()
    _stat(devs["nvme0n1"], 164, 1000 + 2 * 2048, 50 + 1500)  # 64 reads, 2 MiB, busy 1.5 s of the 2 s span
    w.end()
    w.begin()
    _stat(devs["nvme0n1"], 165, 1000 + 2 * 2048 + 8, 50 + 1500 + 250)
    w.end()
    got = {d["device"]: d for d in w.report()}
    assert list(got) == ["nvme0n1", "nvme1n1"]
    a, b = got["nvme0n1"], got["nvme1n1"]
    assert a["files"] == ["a", "pack"] and b["files"] == ["b"]
    assert a["spans"] == [[64, 2 * MiB, 1.5, 2.0], [1, 4096, 0.25, 1.0]]
    assert (a["reads"], a["read_bytes"], a["busy_s"], a["span_s"]) == (65, 2 * MiB + 4096, 1.75, 3.0)
    assert a["busy_share"] == pytest.approx(1.75 / 3.0)
    assert a["read_MB_per_s_busy"] == pytest.approx((2 * MiB + 4096) / 1e6 / 1.75)
    assert b["read_bytes"] == 0 and b["busy_share"] == 0.0 and b["read_MB_per_s_busy"] is None  # idle: no rate


def test_a_device_whose_counters_cannot_be_read_is_left_out_of_that_span(tmp_path, monkeypatch):
    dev = tmp_path / "vdb"
    dev.mkdir()
    _stat(dev, 1, 8, 1)
    monkeypatch.setattr(diskstats, "block_device", lambda p: dev)
    w = DiskWatch({"ssd0": "/x"})
    w.begin()
    (dev / "stat").write_text("garbage\n")
    w.end()
    assert w.report() == []


def test_files_on_no_block_device_are_not_watched(tmp_path):
    assert block_device(tmp_path / "missing") is None
    assert block_device("/proc/self/stat") is None  # procfs: no device, no counters
    assert DiskWatch({"gone": tmp_path / "missing"}).report() == []


def test_direct_reads_of_a_file_show_on_its_device(tmp_path):
    """A real device: 32 MiB read with O_DIRECT inside a span are among the device's reads in it, and it was
    busy for part of the span (device-wide counters: other reads on the machine may only add to them)."""
    dev = block_device(tmp_path)
    if dev is None:
        pytest.skip(f"{tmp_path} is on no block device (tmpfs or overlay): nothing to count")
    path = tmp_path / "rows.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 32 * MiB, dtype=np.uint8).tobytes())
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    w = DiskWatch({"ssd0": path})
    w.begin()
    with IOStack([path], queue_depth=8) as s:
        n = 32
        got = s.read(ReadBatch.packed(np.zeros(n, np.int32), np.arange(n, dtype=np.int64) * MiB, np.full(n, MiB)),
                     aligned_buffer(32 * MiB))
        direct = s.direct
    w.end()
    if not direct:
        pytest.skip(f"the file system under {tmp_path} refused O_DIRECT: the reads may come from the page cache")
    assert got.nbytes == 32 * MiB
    [d] = w.report()
    assert d["device"] == dev.name and d["files"] == ["ssd0"]
    assert d["read_bytes"] >= 32 * MiB and d["reads"] >= 1
    assert 0 < d["busy_s"] and 0 < d["busy_share"] <= 1 and d["read_MB_per_s_busy"] > 0


def test_the_summary_line_names_each_device_that_read_its_files_share_and_rate():
    from moment.runtime.progress import disks_line

    used = {"device": "nvme0n1", "files": ["ssd0", "pack"], "busy_share": 0.634, "read_MB_per_s_busy": 1841.4}
    idle = {"device": "nvme1n1", "files": ["ssd1"], "busy_share": 0.0, "read_MB_per_s_busy": None}
    assert disks_line([used, idle]) == "nvme0n1 (ssd0, pack) busy 63% of the epochs, 1,841 MB/s while busy"
    assert disks_line([idle]) == "" and disks_line([]) == ""
