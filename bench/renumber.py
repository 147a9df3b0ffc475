"""What numbering an edge list's own ids costs: `moment data import edgelist` of the same graph written in node
numbers (the baseline), in sparse 64-bit integer ids (`--renumber`), and in names (`--renumber`), in
alternating rounds, each import a fresh process. Prints each time, peak memory and the ratio to the baseline.
Then the same sparse-id graph with `--dim` features and labels as tables keyed by the ids (`--node-table`,
`--label-table`) against the same as arrays in node order (`--node-ids`, `--features`, `--labels`).

    .venv/bin/python bench/renumber.py [--nodes 2000000] [--edges 20000000] [--dim 32] [--rounds 2]
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


def import_once(edges: Path, out: Path, *options: str) -> tuple[float, float]:
    """Seconds and peak resident MiB of one import in a fresh process."""
    cmd = [sys.executable, "-m", "moment", "data", "import", "edgelist", str(edges), "--out", str(out), "--overwrite",
           "--feature-dim", "8", "--json", *options]
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
    ap.add_argument("--dim", type=int, default=32)
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
                took, peak = import_once(path, d / f"out_{k}", *(["--renumber"] if k != "dense" else []))
                got[k].append(took)
                print(f"round {r + 1} {k}: {took:.2f} s (peak of imports so far {peak:.0f} MiB)", flush=True)
        base = min(got["dense"])
        for k in ("sparse", "names"):
            print(f"{k}_vs_dense: {min(got[k]) / base:.2f}x ({min(got[k]):.2f} s against {base:.2f} s, best of "
                  f"{a.rounds})")
        x = rng.standard_normal((a.nodes, a.dim)).astype(np.float32)
        y = rng.integers(0, 4, a.nodes)
        np.save(d / "x.npy", x)
        np.save(d / "y.npy", y)
        np.savetxt(d / "ids.txt", own, fmt="%d")
        with open(d / "nodes.csv", "w") as f:
            for s in range(0, a.nodes, 1 << 16):
                f.write("".join(",".join([str(i), *map(repr, r)]) + "\n"
                                for i, r in zip(own[s : s + (1 << 16)].tolist(), x[s : s + (1 << 16)].tolist())))
        (d / "labels.csv").write_text("id,label\n" + "".join(f"{i},{v}\n" for i, v in zip(own.tolist(), y.tolist())))
        print(f"tables MB: nodes {(d / 'nodes.csv').stat().st_size / 1e6:.0f}, labels "
              f"{(d / 'labels.csv').stat().st_size / 1e6:.0f}", flush=True)
        ways = {"arrays": ["--node-ids", str(d / "ids.txt"), "--features", str(d / "x.npy"), "--labels", str(d / "y.npy")],
                "tables": ["--node-table", str(d / "nodes.csv"), "--label-table", str(d / "labels.csv")]}
        got = {k: [] for k in ways}
        for r in range(a.rounds):
            for k, options in ways.items():
                took, _ = import_once(d / "sparse.txt", d / f"out_{k}", *options)
                got[k].append(took)
                print(f"round {r + 1} {k}: {took:.2f} s", flush=True)
        print(f"tables_vs_arrays: {min(got['tables']) / min(got['arrays']):.2f}x ({min(got['tables']):.2f} s against "
              f"{min(got['arrays']):.2f} s, best of {a.rounds})")


if __name__ == "__main__":
    main()
