"""Measure this machine with the project's own I/O stack (`moment probe`): no root, no GPU needed.

* SSD: a scratch file on the SSD's file system (an existing directory: one that does not exist would be
  created on whatever disk holds its parent, and that disk measured), read with O_DIRECT through
  `IOStack` (the reader training uses): sequential large reads (GB/s) and random 4 KiB reads (IOPS),
  `queue_depth` in flight. The scratch file is removed afterwards unless kept for the next probe.
* memory: one-thread numpy copy bandwidth (read + write bytes / s) of a buffer well above the caches.
* CUDA (only where torch sees a GPU): pinned host -> device and device -> device copy rates per pair.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moment.errors import Flag, MomentError, cli_flag
from moment.inputs import check_dir, exists
from moment.io.buffers import aligned_buffer
from moment.io.device import no_gpu_driver
from moment.io.engines import MAX_QUEUE_DEPTH
from moment.outputs import atomic_file, name_max, probe_writable, writing
from moment.io.requests import ReadBatch
from moment.io.stack import IOStack

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

MiB = 1 << 20
#: sequential reads per batch; the queue depth must keep at least two batches in flight
SEQ_PER_BATCH = 4
MIN_QUEUE_DEPTH = 2 * SEQ_PER_BATCH
#: the scratch file holds at least this many sequential blocks
MIN_SEQ_BLOCKS = 16


@dataclass
class SsdProbe:
    path: str
    file_bytes: int
    direct: bool
    backend: str
    seq_read_gbps: float
    seq_block: int
    rand_read_iops: float
    rand_block: int
    queue_depth: int

    def as_dict(self) -> dict:
        return asdict(self)


def scratch_path(directory: str | Path, size: int) -> Path:
    """The probe's scratch file of `size` bytes in `directory`."""
    return Path(directory) / f".moment-probe-{size}.bin"


def check_probe_dir(directory: str | Path, size: int, what: str = "--ssd-path", flag: Flag = cli_flag) -> Path:
    """Refuse, before anything is measured, a directory the probe cannot measure: a missing one (creating
    it would measure whatever disk holds its parent), a file, one that cannot be written, or one whose
    file system has no room for the scratch file. `what` names the input that gave the directory, `flag`
    the others (a service request's fields rather than the CLI's flags)."""
    p = Path(directory)
    src = f"{what} {p}"
    if not exists(p) and len(os.fsencode(p.name)) <= name_max(p.parent):
        raise MomentError("does not exist: give a directory on the file system of the SSD to measure",
                          source=src, hint="create it (or mount the SSD there) first; a new directory would "
                                           "be made on whatever disk holds its parent, and that disk measured")
    check_dir(p, f"directory on the SSD ({what})")
    probe_writable(p, src)
    st = os.statvfs(p)
    have = st.f_bavail * st.f_frsize
    if not scratch_path(p, size).is_file() and have < size:
        raise MomentError(f"needs {size / MiB:.0f} MiB free for the scratch file, {have / MiB:.0f} MiB free",
                          source=src, hint=f"use a smaller {flag('size_mib')}")
    return p


def _scratch(directory: Path, size: int) -> Path:
    """A file of `size` random bytes (written once, fsynced, dropped from the page cache)."""
    p = scratch_path(directory, size)
    if not p.is_file() or p.stat().st_size != size:
        rng = np.random.default_rng(0)
        block = rng.integers(0, 256, 8 * MiB, dtype=np.uint8).tobytes()
        with writing(p, "the probe's scratch file"), atomic_file(p) as f:
            for off in range(0, size, len(block)):
                f.write(block[:min(len(block), size - off)])
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return p


def _run(stack: IOStack, batches: list[ReadBatch], bufs: list[np.ndarray]) -> float:
    """Seconds to complete `batches`, keeping one in flight per buffer in `bufs` (each large enough for
    any batch, aligned and already faulted in, so the reads land in place as fio's do)."""
    depth = len(bufs)
    t0 = time.perf_counter()
    inflight: list[int] = []
    for i, b in enumerate(batches):
        if len(inflight) >= depth:
            stack.wait(inflight.pop(0))
        inflight.append(stack.submit(b, bufs[i % depth]))
    for t in inflight:
        stack.wait(t)
    return time.perf_counter() - t0


def check_probe(file_bytes: int, queue_depth: int, *, seq_block: int = MiB, flag: Flag = cli_flag) -> None:
    """The probe's bounds on its scratch file and queue depth, asked before anything is written
    (`moment probe`, the service's probe job at submit, and probe_ssd itself)."""
    if file_bytes < MIN_SEQ_BLOCKS * seq_block:
        raise MomentError(f"{flag('size_mib')} {file_bytes / MiB:g}: the probe file must hold at least {MIN_SEQ_BLOCKS} "
                          f"sequential blocks ({MIN_SEQ_BLOCKS * seq_block // MiB} MiB)", field="size_mib")
    if not MIN_QUEUE_DEPTH <= queue_depth <= MAX_QUEUE_DEPTH:
        raise MomentError(f"{flag('queue_depth')} {queue_depth}: choose {MIN_QUEUE_DEPTH}-{MAX_QUEUE_DEPTH} reads in "
                          f"flight (the sequential pass keeps batches of {SEQ_PER_BATCH} reads, at least two in "
                          "flight)", field="queue_depth")


def probe_ssd(directory: str | Path, *, file_bytes: int = 1 << 30, seq_block: int = MiB, rand_block: int = 4096,
              rand_reads: int = 40_000, queue_depth: int = 32, repeats: int = 3, seed: int = 0,
              keep: bool = False) -> SsdProbe:
    """Direct-I/O read rate (whole file in `seq_block` reads) and random-read IOPS of the file system
    holding `directory`; `queue_depth` reads in flight (as fio's iodepth); median of `repeats`. The
    scratch file is removed afterwards unless `keep` (the next probe of the same size reuses it)."""
    check_probe(file_bytes, queue_depth, seq_block=seq_block)
    if repeats < 1:
        raise MomentError("the probe needs at least one repeat")
    path = _scratch(check_probe_dir(directory, file_bytes), file_bytes)
    try:
        return _measure(path, file_bytes, seq_block, rand_block, rand_reads, queue_depth, repeats, seed)
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def _measure(path: Path, file_bytes: int, seq_block: int, rand_block: int, rand_reads: int, queue_depth: int,
             repeats: int, seed: int) -> SsdProbe:
    # large reads: small batches keep the queue full (a batch completes only when all its reads have);
    # 4 KiB reads: four batches of 1,000 in flight (the engine's ring still holds `queue_depth` reads at
    # once, as fio's iodepth), so neither Python's per-batch cost nor a batch's tail caps the IOPS
    seq_per, rnd_per = SEQ_PER_BATCH, 1000
    rng = np.random.default_rng(seed)
    seq_rates, iops = [], []
    with IOStack([path], queue_depth=queue_depth, threads=queue_depth) as stack:
        n = file_bytes // seq_block
        offs = np.arange(n, dtype=np.int64) * seq_block
        seq = [ReadBatch.packed(np.zeros(len(o), np.int32), o, np.full(len(o), seq_block))
               for o in np.array_split(offs, n // seq_per)]
        rnd_batches = max(1, rand_reads // rnd_per)
        seq_bufs = [aligned_buffer(max(b.dest_size for b in seq)) for _ in range(queue_depth // seq_per)]
        rnd_bufs = [aligned_buffer(-(-rand_reads // rnd_batches) * rand_block) for _ in range(4)]
        for _ in range(repeats):
            seq_rates.append(n * seq_block / _run(stack, seq, seq_bufs) / 1e9)
            ro = rng.integers(0, file_bytes // rand_block, rand_reads, dtype=np.int64) * rand_block
            rnd = [ReadBatch.packed(np.zeros(len(o), np.int32), o, np.full(len(o), rand_block))
                   for o in np.array_split(ro, rnd_batches)]
            iops.append(rand_reads / _run(stack, rnd, rnd_bufs))
        direct, backend = stack.direct, stack.backend
    return SsdProbe(str(path), file_bytes, direct, backend, float(np.median(seq_rates)), seq_block,
                    float(np.median(iops)), rand_block, queue_depth)


def probe_machine(targets: dict[str, str | Path], *, file_bytes: int = 1 << 30, queue_depth: int = 32,
                  before: Callable[[str, int, int], None] | None = None, keep: bool = False,
                  label: Callable[[str], str] = lambda ssd: f"--ssd-path {ssd}", flag: Flag = cli_flag) -> dict:
    """`moment probe --json`'s object: each SSD (id -> directory on it), memory copy, CUDA. `before(what,
    i, n)` is called before each of the n steps (progress, and a chance to stop the probe by raising).
    Every directory is checked before the first is measured, an error naming it by `label(ssd)` and the
    other inputs by `flag`; scratch files are removed unless `keep`."""
    for k, v in targets.items():
        check_probe_dir(v, file_bytes, label(k), flag)
    n = len(targets) + 2
    ssd = {}
    for i, (k, v) in enumerate(targets.items()):
        if before is not None:
            before(k, i, n)
        ssd[k] = probe_ssd(v, file_bytes=file_bytes, queue_depth=queue_depth, keep=keep).as_dict()
    if before is not None:
        before("memory", n - 2, n)
    memory = probe_memory()
    if before is not None:
        before("cuda", n - 1, n)
    return {"ssd": ssd, "memory_copy_gbps": memory, "cuda": probe_cuda()}


def probe_memory(nbytes: int = 128 * MiB, repeats: int = 3) -> float:
    """GB/s of a one-thread numpy copy (bytes read + bytes written), best of `repeats`. 128 MiB per array is
    past the last-level cache one core sees (96 MiB at most today), and measured the same rate as 512 MiB
    here (24.0 against 23.1 GB/s) in 0.07 s instead of 1.7: a larger pair spends seconds in the kernel's first
    touch of pages (huge-page compaction), so a 16 MiB `moment probe` took 2.5-4.9 s. The arrays are plain
    anonymous maps, not numpy's (which advises huge pages): on a busy machine the first touch of the second
    array waited 0.5-0.7 CPU-s in the kernel's compaction, plain pages take 0.1 s, and the copy rate measured
    the same (21.2-21.6 GB/s either way)."""
    a = _plain_pages(nbytes // 8)
    a.fill(1.0)
    b = _plain_pages(nbytes // 8)
    return copy_gbps(2 * a.nbytes, timed_copies(lambda: np.copyto(b, a), lambda: None, repeats))


def _plain_pages(n: int) -> np.ndarray:
    """`n` zeroed float64s in private anonymous memory of ordinary pages (no huge-page advice)."""
    return np.frombuffer(mmap.mmap(-1, n * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.float64)


def copy_gbps(nbytes: int, seconds: Sequence[float]) -> float:
    """GB/s of the fastest of several timings of one `nbytes` copy: the slower ones measured the
    machine's other work, not the link."""
    best = min(seconds)
    if best <= 0:
        raise ValueError(f"a copy of {nbytes} bytes timed at {best} s: the clock stopped before the copy ended")
    return nbytes / best / 1e9


def timed_copies(copy: Callable[[], object], wait: Callable[[], object], repeats: int,
                 clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of `repeats` copies after one untimed warm-up (first touch, lazy set-up). `wait`
    returns once the copy is done (a GPU copy is asynchronous: without it the clock times the launch)."""
    copy()
    wait()
    out = []
    for _ in range(repeats):
        t = clock()
        copy()
        wait()
        out.append(clock() - t)
    return out


def copy_rates(n: int, nbytes: int, copy: Callable[[int | None, int], object],
               sync: Callable[[tuple[int, ...]], object], repeats: int = 3,
               clock: Callable[[], float] = time.perf_counter) -> dict:
    """Host -> GPU i for each of `n` GPUs and GPU i -> GPU j per ordered pair, GB/s. `copy(src, dst)` starts
    one copy (src None: the host); `sync(devices)` waits for those GPUs. Each copy is timed until every GPU
    it involves is done: waiting on the current GPU alone stops the clock while a copy to another one still
    runs (GPUs other than 0 reported absurd rates)."""
    def rate(src: int | None, dst: int) -> float:
        involved = (dst,) if src is None else (src, dst)
        return copy_gbps(nbytes, timed_copies(lambda: copy(src, dst), lambda: sync(involved), repeats, clock))

    return {"h2d_gbps": {f"gpu{i}": rate(None, i) for i in range(n)},
            "d2d_gbps": {f"gpu{i}->gpu{j}": rate(i, j) for i in range(n) for j in range(n) if i != j}}


def probe_cuda(nbytes: int = 256 * MiB) -> dict | None:  # pragma: no cover - needs a GPU
    """Host->device (pinned) per GPU and device->device per ordered pair, GB/s; None without CUDA."""
    if no_gpu_driver():
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    n = torch.cuda.device_count()
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    bufs = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]

    def copy(src: int | None, dst: int) -> None:
        bufs[dst].copy_(host if src is None else bufs[src], non_blocking=True)

    def sync(devices: tuple[int, ...]) -> None:
        for d in devices:
            torch.cuda.synchronize(d)

    return copy_rates(n, nbytes, copy, sync)
