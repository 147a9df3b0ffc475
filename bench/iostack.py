"""4 KiB random-read IOPS of the I/O stack against fio on the same file, same depths, same run.

Both sides use O_DIRECT, so the page cache plays no part (the file is also dropped from it with
posix_fadvise(DONTNEED) after it is written).  Prints `name: value` lines; the baseline is fio with
--ioengine=io_uring (libaio, then psync, if io_uring is refused here; `fio_engine` says which).
Shared virtual disks drift by tens of percent between runs seconds apart, so each depth runs
`--rounds` interleaved fio/stack pairs (alternating which goes first): `ratio_vs_fio_qdN` is the median
of the per-round ratios (each stack run over the fio run beside it), `rounds_qdN` lists every round.
`cpu_us_per_read_qdN` is each side's CPU time (user + system, every thread) per read, median over the
rounds: on a shared machine the IOPS drift with other work, the CPU a read costs much less.

    python bench/iostack.py [--file PATH] [--size-gib 4] [--runtime 2] [--rounds 7] [--depths 1,32,128]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from moment.io import IOStack, ReadBatch, aligned_buffer, available_backends

BS = 4096


def ensure_file(path: Path, size: int) -> None:
    """Random bytes (so nothing below can compress or dedupe), written once, then evicted."""
    if not path.exists() or path.stat().st_size < size:
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        chunk = 64 << 20
        tmp = path.with_suffix(".partial")
        with open(tmp, "wb") as f:
            f.writelines(rng.integers(0, 256, min(chunk, size - start), dtype=np.uint8).tobytes()
                         for start in range(0, size, chunk))
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(path)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


CPU: dict[str, list[float]] = {}  # side -> CPU microseconds per read, one entry per run


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fio_iops(path: Path, size: int, depth: int, runtime: float, engine: str) -> float | None:
    cmd = ["fio", "--name=randread", f"--filename={path}", "--direct=1", f"--ioengine={engine}",
           "--rw=randread", f"--bs={BS}", f"--iodepth={depth}", f"--size={size}", f"--runtime={runtime}",
           "--time_based", "--norandommap", "--randrepeat=0", "--output-format=json"]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    if job["read"]["total_ios"]:  # fio's own CPU figures cover its reading, not its start-up
        cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
        CPU.setdefault("fio", []).append(cpu_s * 1e6 / job["read"]["total_ios"])
    return float(job["read"]["iops"])


def pick_fio_engine(path: Path, size: int) -> str | None:
    for engine in ("io_uring", "libaio", "psync"):
        if fio_iops(path, size, 1, 0.2, engine) is not None:
            return engine
    return None


def stack_iops(path: Path, size: int, depth: int, runtime: float, backend: str, seed: int) -> tuple[float, float]:
    """Random aligned 4 KiB reads for `runtime` s; two batches queued so the engine never drains."""
    rng = np.random.default_rng(seed)
    per_batch = max(256, depth * 64)
    blocks = size // BS
    dests = [aligned_buffer(per_batch * BS) for _ in range(2)]
    zeros = np.zeros(per_batch, np.int32)

    def batch() -> ReadBatch:
        return ReadBatch.packed(zeros, rng.integers(0, blocks, per_batch) * BS, np.full(per_batch, BS))

    with IOStack([path], backend=backend, queue_depth=depth) as s:
        done = 0
        c0 = _cpu()
        t0 = time.perf_counter()
        queued = [s.submit(batch(), dests[0]), s.submit(batch(), dests[1])]
        i = 0
        while True:
            s.wait(queued[0])
            done += per_batch
            if time.perf_counter() - t0 >= runtime:
                s.wait(queued[1])
                done += per_batch
                break
            queued = [queued[1], s.submit(batch(), dests[i % 2])]
            i += 1
        elapsed = time.perf_counter() - t0
        CPU.setdefault(backend, []).append((_cpu() - c0) * 1e6 / done)
        return done / elapsed, s.stats.read_amplification


def paired_ratio(ours: list[float], fio: list[float]) -> float:
    """Median over rounds of our IOPS / fio's IOPS in the same round (drift between rounds cancels)."""
    return float(np.median([x / f for x, f in zip(ours, fio)]))


def unaligned_amplification(path: Path, size: int, backend: str) -> float:
    """Feature rows of 4000 bytes at arbitrary offsets: what alignment costs on a realistic layout."""
    rng = np.random.default_rng(1)
    n = 2000
    batch = ReadBatch.packed(np.zeros(n), rng.integers(0, size - 4000, n), np.full(n, 4000))
    with IOStack([path], backend=backend, queue_depth=32) as s:
        s.read(batch)
        return s.stats.read_amplification


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, default=Path("/var/tmp/moment-bench/iostack.bin"))
    ap.add_argument("--size-gib", type=float, default=4.0)
    ap.add_argument("--runtime", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved fio/stack pairs per depth")
    ap.add_argument("--depths", default="1,32,128")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--all-backends", action="store_true", help="also measure every other usable backend")
    args = ap.parse_args()

    size = int(args.size_gib * (1 << 30)) // BS * BS
    ensure_file(args.file, size)
    depths = [int(d) for d in args.depths.split(",")]
    engine = pick_fio_engine(args.file, size) if shutil.which("fio") else None
    print(f"file: {args.file}")
    print(f"file_gib: {size / (1 << 30):.2f}")
    print(f"fio_engine: {engine or 'unavailable (fio missing or failing); only our numbers follow'}")
    with IOStack([args.file], backend=None if args.backend == "auto" else args.backend) as s:
        backend = s.backend
    others = [b for b, why in available_backends().items() if not why and b != backend] if args.all_backends else []
    amp = 1.0
    for qd in depths:
        runs: dict[str, list[float]] = {"fio": [], backend: [], **{o: [] for o in others}}
        CPU.clear()
        for r in range(args.rounds):
            order = ["fio", backend, *others] if r % 2 == 0 else [backend, *others, "fio"]
            for name in order:
                if name == "fio":
                    if engine:
                        runs["fio"].append(fio_iops(args.file, size, qd, args.runtime, engine) or float("nan"))
                    continue
                iops, a = stack_iops(args.file, size, qd, args.runtime, name, seed=qd * 100 + r)
                runs[name].append(iops)
                if name == backend:
                    amp = a
        med = {k: float(np.median(v)) for k, v in runs.items() if v}
        if "fio" in med:
            print(f"fio_iops_qd{qd}: {med['fio']:.0f}")
        print(f"iostack_iops_qd{qd}: {med[backend]:.0f}")
        if "fio" in med:
            print(f"ratio_vs_fio_qd{qd}: {paired_ratio(runs[backend], runs['fio']):.3f}")
        for other in others:
            print(f"iostack_{other}_iops_qd{qd}: {med[other]:.0f}")
            if "fio" in med:
                print(f"ratio_vs_fio_{other}_qd{qd}: {paired_ratio(runs[other], runs['fio']):.3f}")
        print(f"cpu_us_per_read_qd{qd}: " + ", ".join(f"{k} {np.median(v):.2f}" for k, v in CPU.items()))
        spread = ", ".join(f"{k}=" + "/".join(f"{x / 1000:.1f}k" for x in v) for k, v in runs.items() if v)
        print(f"rounds_qd{qd}: {spread}")
        if "fio" in med:
            print(f"ratio_per_round_qd{qd}: " + " ".join(f"{x / f:.2f}" for x, f in zip(runs[backend], runs["fio"])))
    print(f"read_amplification: {amp:.3f}")
    print(f"read_amplification_unaligned_4000B_rows: {unaligned_amplification(args.file, size, backend):.3f}")
    print(f"backend: {backend}")


if __name__ == "__main__":
    main()
