"""`moment probe`'s SSD figures against fio on the same scratch file, run alternately.

The probe reads through Moment's IOStack (O_DIRECT, the engine training uses); fio uses libaio at the
same queue depth. Prints per pair and the medians: `probe_seq_gbps`, `fio_seq_gbps`, `seq_ratio`,
`probe_iops`, `fio_iops`, `iops_ratio` (probe / fio; target within 20%).

    python bench/probe_fio.py [--dir /tmp/moment-probe] [--size-mib 512] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from moment.io.probe import probe_ssd


def fio(path: str, rw: str, bs: str, extra: list[str]) -> dict:
    out = subprocess.run(["fio", "--name=p", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
                          "--ioengine=libaio", "--iodepth=32", "--readonly", "--output-format=json", *extra],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["jobs"][0]["read"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/moment-probe")
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()
    if shutil.which("fio") is None:
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 1
    size = a.size_mib << 20
    rows = []
    Path(a.dir).mkdir(parents=True, exist_ok=True)
    for k in range(a.pairs):  # the scratch file is kept for fio, and removed at the end
        p = probe_ssd(a.dir, file_bytes=size, seed=k, keep=True)  # as `moment probe` measures: median of 3
        fs = fio(p.path, "read", "1M", [f"--size={size}"])["bw_bytes"] / 1e9
        fi = fio(p.path, "randread", "4k", [f"--size={size}", "--runtime=2", "--time_based"])["iops"]
        rows.append((p.seq_read_gbps, fs, p.rand_read_iops, fi))
        print(f"pair {k}: probe {p.seq_read_gbps:.3f} GB/s {p.rand_read_iops:,.0f} IOPS; "
              f"fio {fs:.3f} GB/s {fi:,.0f} IOPS (direct={p.direct}, engine={p.backend})")
    Path(p.path).unlink()
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    print(f"probe_seq_gbps: {med[0]:.3f}\nfio_seq_gbps: {med[1]:.3f}")
    print(f"seq_ratio: {statistics.median(r[0] / r[1] for r in rows):.3f}")
    print(f"probe_iops: {med[2]:.0f}\nfio_iops: {med[3]:.0f}")
    print(f"iops_ratio: {statistics.median(r[2] / r[3] for r in rows):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
