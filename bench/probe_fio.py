"""`moment probe`'s SSD figures against fio on the same scratch file, interleaved round by round.

The probe reads through Moment's IOStack (O_DIRECT, the engine training uses), exactly as `moment probe`
measures (median of its 3 repeats); fio reads the same file with the fastest engine that works here
(io_uring, else libaio, else psync; `fio_engine` says which) at the same queue depth. A shared machine's
disk rate drifts by tens of percent within seconds, so each round runs the probe and fio back to back
(alternating which goes first) and the ratio is taken per round; the summary is the median of those
ratios (`seq_ratio`, `iops_ratio`: probe / fio) beside the median rates.

    python bench/probe_fio.py [--dir /var/tmp/moment-probe] [--size-mib 512] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from moment.io.probe import probe_ssd, scratch_path

ENGINES = ("io_uring", "libaio", "psync")
DEPTH = 32  # as `moment probe`


def fio(path: Path, size: int, engine: str, rw: str, bs: str, runtime: float | None) -> dict | None:
    timed = [f"--runtime={runtime}", "--time_based"] if runtime else []
    r = subprocess.run(["fio", "--name=p", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
                        f"--ioengine={engine}", f"--iodepth={DEPTH}", f"--size={size}", "--readonly",
                        "--norandommap", "--randrepeat=0", "--output-format=json", *timed],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/moment-probe"))
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fio-runtime", type=float, default=2.0, help="seconds of fio's random reads per round")
    a = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 1
    size = a.size_mib << 20
    a.dir.mkdir(parents=True, exist_ok=True)
    path = scratch_path(a.dir, size)
    rows = []
    try:
        probe_ssd(a.dir, file_bytes=size, repeats=1, keep=True)  # writes the scratch file; warms both sides
        engine = next((e for e in ENGINES if fio(path, size, e, "randread", "4k", 0.2)), None)
        if engine is None:
            print("fio cannot read the scratch file with any engine", file=sys.stderr)
            return 1
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
