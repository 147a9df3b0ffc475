"""`moment probe`'s SSD figures against fio on the same scratch file, interleaved round by round.

The probe reads through Moment's IOStack (O_DIRECT, the engine training uses), exactly as `moment probe`
measures (median of its 3 repeats); fio reads the same file with the fastest engine that works here
(io_uring, else libaio, else psync; `fio_engine` says which) at the same queue depth. A shared machine's
disk rate drifts by tens of percent within seconds, so each round runs the probe and fio back to back
(alternating which goes first) and the ratio is taken per round; the summary is the median of those
ratios (`seq_ratio`, `iops_ratio`: probe / fio) beside the median rates.

Both sides read into huge pages (`fio_buffers`): the probe's aligned NumPy buffers are transparent huge
pages (NumPy advises them for large arrays), so a 1 MiB read is one memory segment, while fio's
default malloc'd buffers are 4 KiB pages, 256 segments, more than this virtio disk takes in one
request (max_segments 254): every fio read was split in two, and the probe read 1.3-1.7x fio's
sequential rate for that alone. fio gets the same resource through `--iomem=mmaphuge` (hugetlb pages:
when fewer are free than its buffers need, the bench, as root, reserves them for the run and gives them
back after; `--fio-buffers malloc` compares with fio's default instead).

    python bench/probe_fio.py [--dir /var/tmp/moment-probe] [--size-mib 512] [--rounds 7] [--fio-buffers huge|malloc]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from moment.io.probe import probe_ssd, scratch_path

ENGINES = ("io_uring", "libaio", "psync")
DEPTH = 32  # as `moment probe`


HUGE = 2 << 20
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
FIO_HUGE = ["--iomem=mmaphuge", f"--hugepage-size={HUGE}"]
IOMEM: list[str] = []  # fio's buffer flags for this run (main sets them)


def _free_huge() -> int:
    m = re.search(r"^HugePages_Free:\s+(\d+)", Path("/proc/meminfo").read_text(), re.M)
    return int(m.group(1)) if m else 0


@contextlib.contextmanager
def huge_pages(nbytes: int):
    """At least `nbytes` of free 2 MiB hugetlb pages while the block runs (reserved here when short, as
    root, and the old reservation put back after); yields why not ("" when they are there)."""
    need = -(-nbytes // HUGE) + (4 if nbytes else 0)  # fio's buffers and its alignment (32 MiB: 17 pages fail)
    old, why = None, ""
    try:
        if _free_huge() < need:
            old = int(NR_HUGEPAGES.read_text())
            NR_HUGEPAGES.write_text(str(old + need - _free_huge()))
    except OSError as e:
        why = f"cannot reserve huge pages in {NR_HUGEPAGES}: {e.strerror}"
    if not why and _free_huge() < need:
        why = f"only {_free_huge()} of {need} huge pages could be reserved"
    try:
        yield why
    finally:
        if old is not None:
            with contextlib.suppress(OSError):
                NR_HUGEPAGES.write_text(str(old))


def fio(path: Path, size: int, engine: str, rw: str, bs: str, runtime: float | None) -> dict | None:
    timed = [f"--runtime={runtime}", "--time_based"] if runtime else []
    r = subprocess.run(["fio", "--name=p", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
                        f"--ioengine={engine}", f"--iodepth={DEPTH}", f"--size={size}", "--readonly",
                        "--norandommap", "--randrepeat=0", "--output-format=json", *IOMEM, *timed],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]


def measure(a, size: int) -> list[dict] | None:
    """The interleaved rounds: per round the probe's and fio's rates."""
    a.dir.mkdir(parents=True, exist_ok=True)
    path = scratch_path(a.dir, size)
    rows = []
    try:
        probe_ssd(a.dir, file_bytes=size, repeats=1, keep=True)  # writes the scratch file; warms both sides
        engine = next((e for e in ENGINES if fio(path, size, e, "randread", "4k", 0.2)), None)
        if engine is None:
            print("fio cannot read the scratch file with any engine", file=sys.stderr)
            return None
        print(f"fio_engine: {engine}")
        for k in range(a.rounds):  # the scratch file is kept for fio, and removed at the end
            got: dict[str, float] = {}
            for side in (("probe", "fio") if k % 2 == 0 else ("fio", "probe")):
                if side == "probe":
                    p = probe_ssd(a.dir, file_bytes=size, seed=k, keep=True)  # as `moment probe` measures
                    got["ps"], got["pi"] = p.seq_read_gbps, p.rand_read_iops
                else:
                    got["fs"] = fio(path, size, engine, "read", "1M", None)["bw_bytes"] / 1e9
                    got["fi"] = fio(path, size, engine, "randread", "4k", a.fio_runtime)["iops"]
            rows.append(got)
            print(f"round {k}: probe {got['ps']:.3f} GB/s {got['pi']:,.0f} IOPS; fio {got['fs']:.3f} GB/s "
                  f"{got['fi']:,.0f} IOPS; ratios seq {got['ps'] / got['fs']:.3f} iops {got['pi'] / got['fi']:.3f} "
                  f"(direct={p.direct}, engine={p.backend})", flush=True)
    finally:
        path.unlink(missing_ok=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-probe"))
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fio-runtime", type=float, default=2.0, help="seconds of fio's random reads per round")
    ap.add_argument("--fio-buffers", choices=("huge", "malloc"), default="huge",
                    help="fio's read buffers: huge (hugetlb pages, as the probe's are huge pages; default) or "
                         "malloc (fio's default, 4 KiB pages)")
    a = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 1
    size = a.size_mib << 20
    with huge_pages(DEPTH << 20 if a.fio_buffers == "huge" else 0) as why:
        if why:
            print(f"--fio-buffers huge: {why} (as root: sysctl vm.nr_hugepages, or --fio-buffers malloc)",
                  file=sys.stderr)
            return 1
        IOMEM[:] = FIO_HUGE if a.fio_buffers == "huge" else []
        print(f"fio_buffers: {'huge pages (hugetlb 2 MiB, --iomem=mmaphuge)' if IOMEM else 'malloc (4 KiB pages)'}")
        rows = measure(a, size)
        if rows is None:
            return 1

    def med(f) -> float:
        return statistics.median(f(r) for r in rows)

    print(f"probe_seq_gbps: {med(lambda r: r['ps']):.3f}\nfio_seq_gbps: {med(lambda r: r['fs']):.3f}")
    print(f"seq_ratio: {med(lambda r: r['ps'] / r['fs']):.3f}")
    print(f"probe_iops: {med(lambda r: r['pi']):.0f}\nfio_iops: {med(lambda r: r['fi']):.0f}")
    print(f"iops_ratio: {med(lambda r: r['pi'] / r['fi']):.3f}")
    print("iops_ratio_per_round: " + " ".join(f"{r['pi'] / r['fi']:.2f}" for r in rows))
    print("seq_ratio_per_round: " + " ".join(f"{r['ps'] / r['fs']:.2f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
