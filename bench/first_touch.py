"""What touching fresh memory costs here, in 4 KiB pages (the baseline) and in transparent huge pages: why a
run's first epoch, which touches most of its memory for the first time, varies so (1.1-4.7 s against 0.8-1.6
steady on the 16M data-only bench). On a VM whose balloon reports free pages to its host (virtio's
VIRTIO_BALLOON_F_REPORTING), the host takes back each 2 MiB block the guest frees, and touching it again faults
it in there too; how much that costs, and whether 4 KiB pages escape it, depends on the VM's history.

Each round is a fresh process that first waits `--settle` seconds (the balloon reports free blocks a couple of
seconds after they are freed), then maps `--gib` GiB, advises it (MADV_NOHUGEPAGE or MADV_HUGEPAGE), writes one
byte per 4 KiB page, and prints its wall and CPU seconds and how much of it was huge pages (AnonHugePages). The
two kinds alternate; medians per GiB and their ratio at the end. `--fragmented`: each round first leaves as much
free memory in 64 KiB pieces (which the balloon does not report: it reports 2 MiB blocks and up), as a machine
that has run for a while has: 4 KiB pages come from those, a huge page cannot.

    .venv/bin/python bench/first_touch.py [--gib 1] [--rounds 3] [--settle 10] [--fragmented]
"""

from __future__ import annotations

import argparse
import json
import mmap
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

KINDS = {"4k": "MADV_NOHUGEPAGE", "huge": "MADV_HUGEPAGE"}
PIECE = 64 << 10  # --fragmented: the free pieces' size


def reporting_balloon(sysfs: Path = Path("/sys")) -> str | None:
    """The virtio balloon that reports free pages to the host (feature bit 5 of its `features`), or None."""
    for dev in sorted((sysfs / "bus" / "virtio" / "devices").glob("*")):
        try:
            if (dev / "driver").resolve().name == "virtio_balloon" and (dev / "features").read_text()[5:6] == "1":
                return dev.name
        except OSError:
            continue
    return None


def fragment(n: int) -> mmap.mmap:
    """`n` bytes of free memory in pieces smaller than a huge page, as a machine's history leaves it: 2n written,
    then every other 64 KiB of it freed (the mapping returned holds the rest)."""
    import numpy as np

    held = mmap.mmap(-1, 2 * n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    held.madvise(mmap.MADV_NOHUGEPAGE)
    np.frombuffer(held, np.uint8)[::4096] = 1
    for at in range(0, 2 * n, PIECE * 2):
        held.madvise(mmap.MADV_DONTNEED, at, PIECE)
    return held


def touch(kind: str, gib: float, settle: float, fragmented: bool) -> dict[str, float]:
    import numpy as np

    n = int(gib * (1 << 30))
    held = fragment(n) if fragmented else None  # noqa: F841 (kept mapped while the fresh memory is touched)
    time.sleep(settle)
    region = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(getattr(mmap, KINDS[kind]))
    pages = np.frombuffer(region, np.uint8)
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pages[::4096] = 1
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    rollup = Path("/proc/self/smaps_rollup").read_text()
    huge_kib = next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("AnonHugePages:")), 0)
    return {"wall_s": wall, "cpu_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
            "huge_share": huge_kib * 1024 / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="memory each round touches (default 1 GiB)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each kind, alternating (default 3)")
    ap.add_argument("--settle", type=float, default=10.0,
                    help="seconds each round waits before it maps (default 10: after the balloon has reported)")
    ap.add_argument("--fragmented", action="store_true",
                    help="leave --gib of free memory in 64 KiB pieces before each round's touch")
    ap.add_argument("--one", choices=sorted(KINDS), help=argparse.SUPPRESS)  # a round's own process
    a = ap.parse_args()
    if a.gib <= 0 or a.rounds < 1 or a.settle < 0:
        ap.error("--gib must be above 0, --rounds at least 1 and --settle at least 0")
    if a.one:
        print(json.dumps(touch(a.one, a.gib, a.settle, a.fragmented)))
        return 0
    balloon = reporting_balloon()
    print(f"balloon reporting free pages to the host: {balloon}; free memory "
          f"{'in 64 KiB pieces first' if a.fragmented else 'as the machine has it'}")
    got: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    for r in range(a.rounds):
        for kind in KINDS:
            out = subprocess.run([sys.executable, __file__, "--one", kind, "--gib", str(a.gib), "--settle",
                                  str(a.settle), *(["--fragmented"] if a.fragmented else [])], capture_output=True, text=True, check=True).stdout
            m = json.loads(out)
            got[kind].append(m)
            print(f"round {r + 1} {kind:>4}: {m['wall_s'] / a.gib:.3f} s/GiB wall, {m['cpu_s'] / a.gib:.3f} CPU-s/GiB, "
                  f"{m['huge_share']:.0%} huge pages", flush=True)
    med = {k: (statistics.median(m["wall_s"] for m in v) / a.gib, statistics.median(m["cpu_s"] for m in v) / a.gib)
           for k, v in got.items()}
    for k, (w, c) in med.items():
        print(f"{k:>4} pages: median {w:.3f} s/GiB wall, {c:.3f} CPU-s/GiB")
    print(f"ratio huge / 4k: {med['huge'][0] / med['4k'][0]:.1f}x wall, {med['huge'][1] / med['4k'][1]:.1f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
