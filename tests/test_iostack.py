"""The per-rank I/O stack: exact bytes on every backend, queue separation, errors, amplification."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import oscheck
import pytest

from moment.errors import MomentError
from moment.io import IOStack, ReadBatch, aligned_buffer, available_backends
from moment.io import files as io_files
from moment.io.buffers import HUGE_PAGE

REPO = Path(__file__).resolve().parents[1]
BACKENDS = [b for b, why in available_backends().items() if not why]
SIZE = 3 * 1024 * 1024 + 1234  # deliberately not a multiple of the block size


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A directory on a filesystem that accepts O_DIRECT (tmpfs before Linux 6.6 does not)."""
    d = tmp_path_factory.mktemp("iostack")
    if not oscheck.direct_refused(d):
        yield d
        return
    d = Path(tempfile.mkdtemp(prefix=".iostack-test-", dir=REPO))
    try:
        if why := oscheck.direct_refused(d):
            pytest.skip(f"no directory here supports O_DIRECT ({why})")
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def shards(data_dir):
    """Three shard files of random bytes and their contents."""
    rng = np.random.default_rng(7)
    out = []
    for k, size in enumerate([SIZE, SIZE // 2 + 17, 64 * 1024]):
        data = rng.integers(0, 256, size, dtype=np.uint8)
        p = data_dir / f"shard{k}.bin"
        data.tofile(p)
        out.append((p, data))
    return out


def _random_batch(rng, shards, n, *, aligned: bool, max_len: int = 20000) -> ReadBatch:
    file = rng.integers(0, len(shards), n)
    sizes = np.array([len(d) for _, d in shards])[file]
    if aligned:
        length = rng.integers(1, 5, n) * 4096
        offset = rng.integers(0, (sizes - length) // 4096 + 1) * 4096
    else:
        length = rng.integers(0, max_len, n)
        length = np.minimum(length, sizes)
        offset = rng.integers(0, sizes - length + 1)
    return ReadBatch.packed(file, offset, length)


def _expected(shards, batch: ReadBatch) -> np.ndarray:
    out = np.zeros(batch.dest_size, np.uint8)
    for f, o, ln, d in zip(batch.file, batch.offset, batch.length, batch.dest_offset):
        out[d:d + ln] = shards[f][1][o:o + ln]
    return out


def test_aligned_buffer_starts_on_the_boundary_zeroed():
    for align in (512, 4096, 1 << 16):
        for n in (1, 4096, 3 * 4096 + 5, 5 << 20):
            b = aligned_buffer(n, align)
            assert (b.ctypes.data % align, b.nbytes, b.dtype, b.flags.writeable) == (0, n, np.uint8, True)
            assert not b.any()
    assert aligned_buffer(5 << 20).ctypes.data % HUGE_PAGE == 0  # large: on a huge-page boundary
    with pytest.raises(MomentError, match="power of two"):
        aligned_buffer(4096, 3000)
    with pytest.raises(MomentError, match="negative"):
        aligned_buffer(-1)


def _vma_field(addr: int, field: str) -> str:
    """`field` of the mapping holding `addr`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return ""


@contextlib.contextmanager
def _numpy_advice_off():
    """NumPy's own huge-page advice off inside (where this NumPy has the switch), so that what is checked is
    Moment's."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:
        yield
        return
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)


def test_a_large_buffer_is_advised_huge_pages():
    """A large read into 4 KiB pages is split by the block layer (a 1 MiB read is 256 memory segments);
    a buffer from a huge page up asks for huge pages (THPeligible: the kernel may back it with them)."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.is_file() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this machine")
    big, small = aligned_buffer(4 << 20), aligned_buffer(HUGE_PAGE // 2)
    assert _vma_field(big.ctypes.data, "THPeligible") == "1"
    assert big.ctypes.data % HUGE_PAGE == 0 and not big.any() and big.flags.writeable
    assert small.ctypes.data % 4096 == 0


def test_the_read_arena_is_huge_page_memory():
    """The training reader reads whole runs of rows straight into the pool's arena (not only into its staging
    buffers), so the arena must be huge-page memory too, by its own advice: NumPy's may be off
    (NUMPY_MADVISE_HUGEPAGE=0), and in THP's "madvise" mode an unadvised arena would split each 1 MiB read
    again. Checked with NumPy's advice off, a huge page's worth and more of the arena."""
    from moment.runtime.gather import BufferPool

    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.is_file() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this machine")
    pool = BufferPool(64 << 20)
    with _numpy_advice_off():
        dest = pool.lend(1024, 4096)
        big = pool.lend(1024, 8192)
    try:
        for d in (dest, big):
            assert d.ctypes.data % 4096 == 0
            assert _vma_field(d.ctypes.data, "THPeligible") == "1"
        assert _vma_field(big.ctypes.data + big.nbytes - 1, "THPeligible") == "1"
    finally:
        pool.release(dest)
        pool.release(big)


def test_a_huge_page_buffer_is_advised_and_small_ones_plain():
    """huge_page_buffer: from one huge page up, on a huge-page boundary and advised huge pages (its own advice:
    the mapping's `hg` flag; not THPeligible, the kernel's verdict on a malloc'd mapping, which read 0 in ~1 full
    CI run in 3 and never alone); below that, a plain aligned malloc."""
    from moment.io import huge_page_buffer

    with _numpy_advice_off():
        big = huge_page_buffer(8 << 20)
    assert big.ctypes.data % HUGE_PAGE == 0 and big.nbytes == 8 << 20 and big.flags.writeable
    small = huge_page_buffer(HUGE_PAGE // 4, alignment=512)
    assert small.ctypes.data % 512 == 0 and small.nbytes == HUGE_PAGE // 4
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").is_file():  # a kernel with THP takes the advice
        flags = _vma_field(big.ctypes.data, "VmFlags").split()
        assert "hg" in flags and "nh" not in flags, flags


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aligned", [True, False])
def test_bit_exact_random_reads(shards, backend, aligned):
    rng = np.random.default_rng(1)
    with IOStack([p for p, _ in shards], backend=backend, queue_depth=32) as s:
        assert s.backend == backend
        batch = _random_batch(rng, shards, 600, aligned=aligned)
        dest = aligned_buffer(batch.dest_size)
        got = s.wait(s.submit(batch, dest)).dest
        assert np.array_equal(got, _expected(shards, batch))
        # every file was opened O_DIRECT, as the kernel says (not only the stack's own flag)
        assert s.direct and [oscheck.open_flags(int(fd)) & oscheck.O_DIRECT != 0 for fd in s.files.fds] == \
            [True] * len(shards), s.files.fallback_reason
        if aligned:  # aligned ranges into aligned memory: read in place, nothing wasted
            assert s.stats.read_amplification == 1.0
        else:
            assert s.stats.read_amplification > 1.0
        assert s.stats.requests == 600


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_reads_among_short_ones_land_bit_exact(shards, backend):
    """A packed segment's reads: back-to-back spans of 64 KiB to 1 MiB (io_uring submits each alone, so the block
    layer does not merge them) mixed with 4 KiB ones (submitted in groups), more than the queue holds at once."""
    rng = np.random.default_rng(3)
    spans = np.cumsum(np.r_[0, rng.integers(16, 257, 8) * 4096])  # 64 KiB to 1 MiB each, contiguous
    spans = spans[spans <= len(shards[0][1]) // 4096 * 4096]
    long_off, long_len = spans[:-1], np.diff(spans)
    short_off = rng.integers(0, len(shards[1][1]) // 4096, 40) * 4096
    file = np.r_[np.zeros(len(long_off), np.int64), np.ones(40, np.int64)]
    order = rng.permutation(len(file))
    batch = ReadBatch.packed(file[order], np.r_[long_off, short_off][order],
                             np.r_[long_len, np.full(40, 4096)][order])
    with IOStack([p for p, _ in shards], backend=backend, queue_depth=6) as s:
        got = s.wait(s.submit(batch, aligned_buffer(batch.dest_size))).dest
        assert np.array_equal(got, _expected(shards, batch))
        assert s.stats.requests == len(file) and s.stats.read_amplification == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_batches_in_flight_reaped_out_of_order(shards, backend):
    rng = np.random.default_rng(2)
    with IOStack([p for p, _ in shards], backend=backend, queue_depth=8) as s:
        batches = [_random_batch(rng, shards, 300, aligned=bool(i % 2)) for i in range(6)]
        dests = [np.empty(b.dest_size + 3, np.uint8)[3:] for b in batches]  # unaligned memory too
        tickets = [s.submit(b, d) for b, d in zip(batches, dests)]
        assert s.in_flight == 6
        # Reap the last two by ticket, newest first, then everything else at once.
        for i in (5, 4):
            (c,) = s.reap(tickets[i])
            assert c.ticket == tickets[i]
            assert np.array_equal(c.dest, _expected(shards, batches[i]))
        rest = s.reap(min_completions=4)
        while len(rest) < 4:
            rest += s.reap(min_completions=4 - len(rest))
        assert [c.ticket for c in rest] == tickets[:4]
        for c, b in zip(rest, batches):
            assert np.array_equal(c.dest, _expected(shards, b))
        assert s.in_flight == 0
        assert s.reap(min_completions=1, timeout=0) == []
        with pytest.raises(MomentError, match="ticket"):
            s.reap(tickets[0])


def _thread_names() -> list[str]:
    task = Path("/proc/self/task")
    names = []
    for t in os.listdir(task):
        with contextlib.suppress(OSError):  # a thread that ended while listed
            names.append((task / t / "comm").read_text().strip())
    return names


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="the kernel's thread names (/proc) are Linux's")
@pytest.mark.parametrize(("backend", "name"), [("io_uring", "io-ring"), ("pthreads", "io-pread")])
def test_the_engine_threads_have_names_of_their_own_and_end_with_the_stack(shards, backend, name):
    """A rank's profile (perf, top -H) tells its reads' threads apart: without a name of their own they showed
    the rank's (torchrun's `pt_elastic`), and their kernel time (io_uring_enter, the block layer) looked like
    the training thread's. Closing the stack ends them."""
    if backend not in BACKENDS:
        pytest.skip(f"the {backend} engine is not available here")
    before = _thread_names().count(name)
    with IOStack([p for p, _ in shards], backend=backend, queue_depth=4) as s:
        batch = _random_batch(np.random.default_rng(3), shards, 8, aligned=True)
        assert np.array_equal(s.wait(s.submit(batch, aligned_buffer(batch.dest_size))).dest, _expected(shards, batch))
        assert _thread_names().count(name) > before
        assert s.backend == backend
    assert _thread_names().count(name) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_destination_and_zero_lengths(shards, backend):
    with IOStack([shards[0][0]], backend=backend) as s:
        batch = ReadBatch.rows(np.zeros(4), [4096, 0, 999, 8192], 512, [3, 0, 2, 1])
        got = s.read(batch).reshape(4, 512)
        data = shards[0][1]
        for off, row in zip([4096, 0, 999, 8192], [3, 0, 2, 1]):
            assert np.array_equal(got[row], data[off:off + 512])
        empty = ReadBatch.packed([0, 0], [5, 6], [0, 0])
        assert s.wait(s.submit(empty, np.empty(0, np.uint8))).bytes_read == 0
        assert s.wait(s.submit(ReadBatch.packed([], [], []), bytearray(0))).bytes_wanted == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("depth", [1, 3, 5])
def test_every_byte_at_odd_queue_depths(shards, backend, depth):
    """io_uring splits the depth over its rings (one ring at depth 1, 2 + 1 at depth 3): aligned and
    unaligned reads from several batches in flight come back exact whichever ring served them."""
    rng = np.random.default_rng(depth)
    with IOStack([p for p, _ in shards], backend=backend, queue_depth=depth) as s:
        batches = [_random_batch(rng, shards, 200, aligned=bool(i % 2)) for i in range(3)]
        dests = [aligned_buffer(b.dest_size) for b in batches]
        for t, b in zip([s.submit(b, d) for b, d in zip(batches, dests)], batches):
            assert np.array_equal(s.wait(t).dest, _expected(shards, b))


def test_runtime_reader_reads_in_place(shards, monkeypatch):
    """The training reader's staging buffers are block-aligned, so its aligned runs need no bounce copy."""
    from moment.io.merge import SHAPES
    from moment.runtime.gather import BufferPool, Job, Reader

    seen = []
    submit = IOStack.submit

    def watch(self, batch, dest, **kw):
        seen.append(np.asarray(dest).ctypes.data % 4096)
        return submit(self, batch, dest, **kw)

    monkeypatch.setattr(IOStack, "submit", watch)
    path, data = shards[0]
    rows = np.random.default_rng(3).choice(len(data) // 512, 300, replace=False)
    reader = Reader([path], 512, 4096, pool=BufferPool(1 << 22), window=64 << 10)
    try:
        got = reader.submit(Job(np.zeros(300, np.int32), rows * 512, SHAPES["rows"])).wait()
    finally:
        reader.close()
    assert np.array_equal(got, data[:len(data) // 512 * 512].reshape(-1, 512)[rows])
    assert len(seen) > 1 and set(seen) == {0}


def test_runtime_reader_reads_adjacent_rows_straight_into_their_destination(shards):
    """A read that is exactly adjacent rows, for adjacent rows of the destination in file order, goes straight
    there (no staging, no copy); any other read is staged and its rows copied. Both give the rows bit-exact."""
    from moment.io.merge import SHAPES
    from moment.runtime.gather import BufferPool, Job, Reader

    path, data = shards[0]
    table = data[:len(data) // 512 * 512].reshape(-1, 512)
    scattered = np.random.default_rng(4).choice(np.arange(2000, len(table)), 40, replace=False)
    rows = np.concatenate([np.arange(64, 128), np.sort(scattered)])  # 64 rows: eight whole 4 KiB blocks
    reader = Reader([path], 512, 4096, pool=BufferPool(1 << 22), window=64 << 10)
    try:
        def read(order, dest=None):
            before = reader.direct_rows
            job = Job(np.zeros(order.shape[0], np.int32), order * 512, SHAPES["block"], dest=dest)
            got = reader.submit(job).wait()
            assert np.array_equal(got, table[order])
            return reader.direct_rows - before

        assert read(rows) == 64  # the pool's destinations are aligned
        assert read(rows[::-1]) == 0  # the same rows, in the reverse order of the file's: staged and copied
        raw = np.zeros(rows.shape[0] * 512 + 4096 + 16, np.uint8)
        start = -raw.ctypes.data % 4096 + 16  # a destination 16 bytes past a block boundary: staged
        assert read(rows, raw[start:start + rows.shape[0] * 512].reshape(-1, 512)) == 0
    finally:
        reader.close()


def test_a_span_job_is_read_straight_in_as_the_general_test_would_read_it(shards):
    """A pack segment (`Job(span=True)`) is planned by arithmetic, its runs read straight into the destination
    decided without looking at a row: the same runs the per-row test picks, the same rows, bit-exact, for row
    widths whose last run is padded (staged) or not, and for a destination off a block boundary (all staged)."""
    from moment.io.merge import SHAPES
    from moment.runtime.gather import BufferPool, Job, Reader, _Reading

    path, data = shards[0]
    checked = 0
    for rb, n, first in ((512, 300, 8), (512, 301, 16), (4096, 40, 3), (1536, 50, 8)):
        reader = Reader([path], rb, 4096, pool=BufferPool(1 << 22), window=64 << 10)
        try:
            table = data[:len(data) // rb * rb].reshape(-1, rb)
            raw = np.zeros(n * rb + 2 * 4096, np.uint8)
            base = -raw.ctypes.data % 4096
            for shift in (0, 16):
                dest = raw[base + shift:base + shift + n * rb].reshape(n, rb)
                job = Job(np.zeros(n, np.int32), (first + np.arange(n)) * rb, SHAPES["block"].limited(merge_gap=0),
                          dest=dest, span=True)
                r = _Reading(job)
                reader._plan(r)
                want = reader._direct(r.plan, r.plan.order, np.searchsorted(r.plan.row_run[r.plan.order],
                                                                            np.arange(len(r.plan) + 1)), dest)
                assert np.array_equal(r.direct, want), (rb, n, shift)
                assert np.array_equal(np.diff(r.run_rows), np.bincount(r.plan.row_run, minlength=len(r.plan)))
                checked += int(want.any()) + int(not want.all())
                got = reader.submit(Job(job.file, job.offset, job.shape, dest=dest, span=True)).wait()
                assert np.array_equal(got, table[first:first + n]), (rb, n, shift)
        finally:
            reader.close()
    assert checked >= 6  # runs read straight in and runs staged both came up


def test_runtime_reader_goes_straight_on_to_the_next_job(shards, monkeypatch):
    """A job's reads are submitted while the last windows of the job before it are still being read (the disk is
    never left with nothing of the rank's to read between two batches), and jobs still finish in order,
    bit-exact."""
    from moment.io.merge import SHAPES
    from moment.runtime.gather import BufferPool, Job, Reader

    path, data = shards[0]
    table = data[:len(data) // 512 * 512].reshape(-1, 512)
    dests = [aligned_buffer(512 * 512).reshape(512, 512) for _ in range(3)]
    log, gate = [], threading.Event()
    submit, wait = IOStack.submit, IOStack.wait

    def job_of(dest) -> int:
        at = np.asarray(dest).ctypes.data
        return next(k for k, d in enumerate(dests) if d.ctypes.data <= at < d.ctypes.data + d.nbytes)

    def watch_submit(self, batch, dest, **kw):
        t = submit(self, batch, dest, **kw)
        log.append(("s", job_of(dest), t))
        return t

    def watch_wait(self, ticket, timeout=None):
        gate.wait(10)  # every job is queued before the first read is reaped
        log.append(("w", None, ticket))
        return wait(self, ticket, timeout)

    monkeypatch.setattr(IOStack, "submit", watch_submit)
    monkeypatch.setattr(IOStack, "wait", watch_wait)
    reader = Reader([path], 512, 4096, pool=BufferPool(1 << 22), window=64 << 10)  # 4 windows a job
    done = []
    try:
        jobs = [Job(np.zeros(512, np.int32), (np.arange(512) + 704 * k) * 512, SHAPES["block"], dest=dests[k],
                    on_done=lambda j, k=k: done.append(k)) for k in range(3)]
        for j in jobs:
            reader.submit(j)
        gate.set()
        for k, j in enumerate(jobs):
            assert np.array_equal(j.wait(), table[704 * k: 704 * k + 512])
    finally:
        reader.close()
    assert done == [0, 1, 2]
    job = {t: k for kind, k, t in log if kind == "s"}
    for k in (1, 2):
        first_submit = next(i for i, (kind, j, _) in enumerate(log) if kind == "s" and j == k)
        last_wait = max(i for i, (kind, _, t) in enumerate(log) if kind == "w" and job[t] == k - 1)
        assert first_submit < last_wait, f"job {k}'s reads waited for job {k - 1}'s to drain: {log}"
    assert reader.direct_rows == 3 * 512


def test_runtime_reader_lends_a_full_pool_in_job_order_without_waiting_on_itself(shards):
    """Destinations lent by the reader from a pool that holds one job's: the next job starts only once the
    consumer gave the last one back (never a wait for room while the reader's own reads hold it), and a job
    whose read fails fails alone."""
    from moment.io.merge import SHAPES
    from moment.runtime.gather import BufferPool, Job, Reader

    path, data = shards[0]
    table = data[:len(data) // 512 * 512].reshape(-1, 512)
    pool = BufferPool(256 * 512)
    reader = Reader([path], 512, 4096, pool=pool, window=16 << 10)
    try:
        rows = [np.arange(256) + 300 * k for k in range(4)]
        offsets = [r * 512 for r in rows]
        offsets[2] = offsets[2] + len(data)  # past the file's end: a short read
        jobs = [reader.submit(Job(np.zeros(256, np.int32), o, SHAPES["block"])) for o in offsets]
        for k, j in enumerate(jobs):
            assert j.done.wait(20), f"job {k} never finished"
            if k == 2:
                with pytest.raises(MomentError):
                    j.wait()
                if j.dest is not None:
                    pool.release(j.dest)
                continue
            assert np.array_equal(j.wait(), table[rows[k]])
            pool.release(j.dest)
    finally:
        reader.close()
    assert pool.peak <= pool.capacity and pool.oversize == 0


def test_runtime_reader_closed_with_jobs_queued_and_in_flight_ends_every_one(shards):
    """Closing the reader while jobs are queued and windows of two of them are in flight: every job ends (none
    left waiting), each read whole or failed with the reader's closing, and no job is taken after."""
    from moment.io.merge import SHAPES
    from moment.runtime.gather import BufferPool, Job, Reader

    path, data = shards[0]
    table = data[:len(data) // 512 * 512].reshape(-1, 512)
    reader = Reader([path], 512, 4096, pool=BufferPool(1 << 22), window=16 << 10)
    rows = np.arange(2048)
    jobs = [reader.submit(Job(np.zeros(2048, np.int32), rows * 512, SHAPES["block"],
                              dest=aligned_buffer(2048 * 512).reshape(2048, 512))) for _ in range(6)]
    reader.close()
    for j in jobs:
        assert j.done.wait(10)
        if j.error is None:
            assert np.array_equal(j.wait(), table[rows])
        else:
            with pytest.raises(MomentError, match="closed"):
                j.wait()
    with pytest.raises(MomentError, match="closed"):
        reader.submit(Job(np.zeros(1, np.int32), np.zeros(1, np.int64), SHAPES["block"]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_amplification_accounting(shards, backend):
    path, data = shards[0]
    with IOStack([path], backend=backend) as s:
        s.read(ReadBatch.packed([0], [100], [10]))  # one 4 KiB block for 10 wanted bytes
        assert (s.stats.bytes_wanted, s.stats.bytes_read) == (10, 4096)
        s.read(ReadBatch.packed([0], [4000], [200]))  # straddles a block boundary: two blocks
        assert (s.stats.bytes_wanted, s.stats.bytes_read) == (210, 4096 + 8192)
        tail = len(data) - 50
        out = s.read(ReadBatch.packed([0], [tail], [50]))  # the last block is partial at EOF
        assert np.array_equal(out, data[tail:])
        assert s.stats.bytes_read == 4096 + 8192 + (len(data) - (tail // 4096) * 4096)
        assert s.stats.read_amplification == pytest.approx(s.stats.bytes_read / 260)


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_read_raises(shards, backend):
    path, data = shards[2]
    with IOStack([p for p, _ in shards], backend=backend) as s:
        bad = ReadBatch.packed([0, 2, 0], [0, len(data) - 100, 4096], [4096, 200, 4096])
        with pytest.raises(MomentError) as e:
            s.read(bad)
        msg = str(e.value)
        assert str(path) in msg and f"offset {len(data) - 100}" in msg and "200 bytes" in msg
        assert "short read" in msg
        with pytest.raises(MomentError, match="short read"):
            s.read(ReadBatch.packed([2], [len(data) + 8192], [10]))  # wholly past the end
        # The stack keeps working after a failed batch.
        assert np.array_equal(s.read(ReadBatch.packed([2], [5], [7])), data[5:12])


@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_shard_and_bad_index(shards, tmp_path, backend):
    missing = tmp_path / "nope.bin"
    with IOStack([shards[0][0], missing], backend=backend) as s:
        assert s.read(ReadBatch.packed([0], [0], [8])).tobytes() == shards[0][1][:8].tobytes()
        with pytest.raises(MomentError) as e:
            s.submit(ReadBatch.packed([0, 1], [0, 12288], [8, 4096]), np.empty(8192, np.uint8))
        assert str(missing) in str(e.value) and "offset 12288" in str(e.value) and "4096 bytes" in str(e.value)
        with pytest.raises(MomentError, match="shard file 5"):
            s.submit(ReadBatch.packed([5], [0], [8]), np.empty(8, np.uint8))
        with pytest.raises(MomentError, match="destination"):
            s.submit(ReadBatch.packed([0], [0], [100]), np.empty(10, np.uint8))


@pytest.mark.parametrize("backend", BACKENDS)
def test_io_error_names_file_offset_length(shards, tmp_path, backend):
    with IOStack([shards[0][0]], backend=backend) as s:
        s.read(ReadBatch.packed([0], [0], [1]))
        dfd = os.open(tmp_path, os.O_RDONLY)  # pread on a directory fails with EISDIR, like EIO would
        old, s.files.fds[0] = s.files.fds[0], dfd
        try:
            with pytest.raises(MomentError) as e:
                s.read(ReadBatch.packed([0], [8192], [100]))
        finally:
            s.files.fds[0] = old
            os.close(dfd)
        msg = str(e.value)
        assert "EISDIR" in msg and str(shards[0][0]) in msg and "offset 8192" in msg and "100 bytes" in msg


def test_odirect_refused_falls_back_to_buffered(shards, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *a):
        if flags & io_files.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(io_files.os, "open", no_direct)
    rng = np.random.default_rng(3)
    for backend in BACKENDS:
        with IOStack([p for p, _ in shards], backend=backend) as s:
            batch = _random_batch(rng, shards, 200, aligned=False)
            assert np.array_equal(s.read(batch), _expected(shards, batch))
            assert not s.direct and "EINVAL" in s.files.fallback_reason
            assert s.files.alignment == 1 and s.stats.read_amplification == 1.0


def test_buffered_on_request_and_verify_hook(shards):
    seen = []

    def verify(c):
        seen.append(c.ticket)
        if c.batch.offset[0] == 13:
            raise MomentError("checksum mismatch", source="chunk 0")

    with IOStack([shards[0][0]], direct=False, verify=verify) as s:
        assert not s.direct and s.files.fallback_reason
        t = s.submit(ReadBatch.packed([0], [0], [64]), np.empty(64, np.uint8))
        s.wait(t)
        assert seen == [t]
        with pytest.raises(MomentError, match="checksum mismatch"):
            s.read(ReadBatch.packed([0], [13], [64]))


def test_bad_configuration():
    with pytest.raises(MomentError, match="unknown I/O backend"):
        IOStack([], backend="spdk")
    with pytest.raises(MomentError, match="queue depth"):
        IOStack([], queue_depth=0)
    with pytest.raises(MomentError, match="power of two"):
        IOStack([], alignment=3000)
    with pytest.raises(MomentError, match="entries"):
        ReadBatch([0, 1], [0], [1, 1], [0, 0])


def test_import_does_not_need_torch():
    code = "import sys, moment.io; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_device_staging_cpu(shards):
    torch = pytest.importorskip("torch")
    from moment.io.device import DeviceStaging

    path = shards[0][0]
    stage = DeviceStaging(3 * 4096, "cpu")
    with IOStack([path]) as s:
        batch = ReadBatch.packed([0, 0, 0], [0, 8192, 4096 * 5], [4096] * 3)
        s.wait(s.submit(batch, stage.array))
    t = stage.to_device()
    assert t.device == torch.device("cpu")
    assert np.array_equal(t.numpy(), _expected(shards, batch))
    if not torch.cuda.is_available():
        with pytest.raises(MomentError, match="CUDA"):
            DeviceStaging(16, "cuda")


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_with_reads_in_flight(shards, backend):
    rng = np.random.default_rng(4)
    s = IOStack([p for p, _ in shards], backend=backend, queue_depth=4)
    batches = [_random_batch(rng, shards, 400, aligned=False) for _ in range(3)]
    for b in batches:
        s.submit(b, np.empty(b.dest_size, np.uint8))
    s.close()  # queued reads are cancelled; must not hang or crash
    with pytest.raises(MomentError, match="closed"):
        s.submit(batches[0], np.empty(batches[0].dest_size, np.uint8))


@pytest.mark.parametrize("native", [True, False])
def test_copy_rows_moves_each_row_as_fancy_indexing_does(native, monkeypatch):
    """The gather path's row copy (native, and its NumPy fallback) equals dst[rows] = src[idx], by row
    numbers and by byte offsets; an index outside either array is refused before any byte moves."""
    import moment.io.rows as rows_mod

    if not native:
        monkeypatch.setattr(rows_mod, "_copy", None)
    elif rows_mod._copy is None:
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (50, 24), dtype=np.uint8)
    idx, pos = rng.integers(0, 50, 30), rng.permutation(40)[:30]
    dst, want = np.zeros((40, 24), np.uint8), np.zeros((40, 24), np.uint8)
    want[pos] = src[idx]
    rows_mod.copy_rows(dst, pos, src, idx)
    assert (dst == want).all()
    dst[:] = 0
    rows_mod.copy_rows(dst, None, src, idx)
    assert (dst[:30] == src[idx]).all() and not dst[30:].any()
    offsets = rng.integers(0, src.size - 24, 30)  # unaligned byte offsets (a read window's rows)
    rows_mod.copy_rows(dst, pos, src, offsets, 1)
    assert all((dst[p] == src.reshape(-1)[o:o + 24]).all() for p, o in zip(pos, offsets, strict=True))
    if native:
        before = dst.copy()
        with pytest.raises(IndexError, match="outside"):
            rows_mod.copy_rows(dst, pos, src, np.append(idx[:-1], 50))
        with pytest.raises(IndexError, match="outside"):
            rows_mod.copy_rows(dst, np.append(pos[:-1], 40), src, idx)
        assert (dst == before).all()
        # the prefetch distance changes no byte: none, the default, one past the last row
        for ahead in (0, 1, 29, 30):
            dst[:] = 0
            rows_mod._copy(dst, pos, src, idx, 24, 24, ahead)
            assert (dst == want).all(), ahead
        with pytest.raises(ValueError, match="ahead"):
            rows_mod._copy(dst, pos, src, idx, 24, 24, -1)


@pytest.mark.parametrize("rb", [16, 48, 1000, 1024])
def test_streamed_row_copies_write_the_bytes_memcpy_writes(rb):
    """copy_rows writes rows read in order with streaming stores (from 1 MiB up, where the row size and the
    destination allow them): every mode (-1 the copy's choice, 1 streamed wherever allowed, 0 never) gives
    fancy indexing's bytes, for rows in order and not, a row size that is no multiple of 16 (1000: memcpy),
    and a destination 8 bytes off 16 (memcpy)."""
    from moment.io.rows import _copy

    if _copy is None:
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(rb)
    n = max(2048, (1 << 20) // rb + 1)  # over 1 MiB: streamed by the copy's own choice when in order
    src = rng.integers(0, 256, (2 * n, rb), dtype=np.uint8)
    raw = np.zeros(2 * n * rb + 64, np.uint8)
    aligned = raw[-raw.ctypes.data % 64:][: 2 * n * rb].reshape(2 * n, rb)
    shifted = raw[(8 - raw.ctypes.data) % 16:][: 2 * n * rb].reshape(2 * n, rb)
    assert aligned.ctypes.data % 16 == 0 and shifted.ctypes.data % 16 == 8
    in_order = np.sort(rng.permutation(2 * n)[:n]).astype(np.int64)
    for idx in (in_order, rng.permutation(in_order)):
        pos = rng.permutation(2 * n)[:n].astype(np.int64)
        for dst in (aligned, shifted):
            want = np.zeros_like(dst)
            want[pos] = src[idx]
            for mode in (-1, 1, 0):
                dst[:] = 0
                _copy(dst, pos, src, idx, rb, rb, 8, mode)
                assert (dst == want).all(), (mode, dst.ctypes.data % 16)
            dst[:] = 0
            _copy(dst, None, src, idx, rb, rb, 8, -1)  # no destination rows: rows 0..n-1
            assert (dst[:n] == src[idx]).all() and not dst[n:].any()


def test_the_row_copy_bench_prints_its_ratios():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "row_copy.py"), "--segment", "4MiB", "--rows", "2000",
                        "--row-bytes", "64,512", "--repeat", "1"], capture_output=True, text=True, timeout=120)
    if "not built" in r.stderr:
        pytest.skip("the native extension is not built")
    assert r.returncode == 0, r.stderr
    ratios = [float(line.split(":")[1]) for line in r.stdout.splitlines() if "ratio_" in line]
    assert len(ratios) == 6 and all(x > 0 for x in ratios), r.stdout


def test_the_segment_plan_bench_plans_the_same_both_ways_and_prints_its_ratio():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "segment_plan.py"), "--rows", "5001", "--rounds", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = dict(line.split(": ", 1) for line in r.stdout.splitlines()[1:])
    assert got["same_plan"] == "True" and float(got["plan_ratio"].split()[0]) > 0, r.stdout
    assert "5001 rows" in r.stdout and "read straight in" in r.stdout
