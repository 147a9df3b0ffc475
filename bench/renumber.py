"""What numbering an edge list's own ids costs: `moment data import edgelist` of the same graph written in node
numbers (the baseline), in sparse 64-bit integer ids (`--renumber`), and in names (`--renumber`), in
alternating rounds, each import a fresh process. Prints each time, peak memory and the ratio to the baseline.

    .venv/bin/python bench/renumber.py [--nodes 2000000] [--edges 20000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_edges(path: Path, pairs: np.ndarray, ids: np.ndarray | None, prefix: str = "") -> None:
    """The edges as text, a chunk at a time, each end written as its id (or its node number)."""
    with open(path, "w") as f:
        for s in range(0, pairs.shape[0], 1 << 21):
            c = pairs[s : s + (1 << 21)]
            c = ids[c] if ids is not None else c
            f.write("\n".join(f"{prefix}{a} {prefix}{b}" for a, b in c.tolist()) + "\n")


def import_once(edges: Path, out: Path, renumber: bool) -> tuple[float, float]:
    """Seconds and peak resident MiB of one import in a fresh process."""
    cmd = [sys.executable, "-m", "moment", "data", "import", "edgelist", str(edges), "--out", str(out), "--overwrite",
           "--feature-dim", "8", "--json", *(["--renumber"] if renumber else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    took = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return took, max(peak, before) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--edges", type=int, default=20_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, a.nodes, (a.edges, 2))
    own = np.sort(rng.choice(1 << 62, a.nodes, replace=False)).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files = {"dense": (d / "dense.txt", None, ""), "sparse": (d / "sparse.txt", own, ""),
                 "names": (d / "names.txt", own, "user")}
        for path, ids, prefix in files.values():
            write_edges(path, pairs, ids, prefix)
        print(f"nodes: {a.nodes:,}  edges: {a.edges:,}  text MB: "
              + ", ".join(f"{k} {p.stat().st_size / 1e6:.0f}" for k, (p, _, _) in files.items()))
        got: dict[str, list[float]] = {k: [] for k in files}
        for r in range(a.rounds):
            for k, (path, _, _) in files.items():
                took, peak = import_once(path, d / f"out_{k}", renumber=k != "dense")
                got[k].append(took)
                print(f"round {r + 1} {k}: {took:.2f} s (peak of imports so far {peak:.0f} MiB)", flush=True)
        base = min(got["dense"])
        for k in ("sparse", "names"):
            print(f"{k}_vs_dense: {min(got[k]) / base:.2f}x ({min(got[k]):.2f} s against {base:.2f} s, best of "
                  f"{a.rounds})")


if __name__ == "__main__":
    main()
