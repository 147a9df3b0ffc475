"""What numbering an edge list's own ids costs: `moment data import edgelist` of the same graph written in node
numbers (the baseline), in sparse 64-bit integer ids (`--renumber`), and in names (`--renumber`), in
alternating rounds, each import a fresh process. Prints each time, peak memory and the ratio to the baseline.
Then the same sparse-id graph with `--dim` features and labels as tables keyed by the ids (`--node-table`,
`--label-table`) against the same as arrays in node order (`--node-ids`, `--features`, `--labels`).
Then (`--parts parquet` alone) the same graph, tables and names as Parquet (what Spark and `df.to_parquet`
write: an int64 or string column each end, a list column of vectors, an integer label column) against the same
as text, with each import's peak resident memory.

    .venv/bin/python bench/renumber.py [--nodes 2000000] [--edges 20000000] [--dim 32] [--rounds 2]
                                       [--parts numbering,tables,parquet]
"""

from __future__ import annotations

import argparse
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


def write_parquet(path: Path, pairs: np.ndarray, ids: np.ndarray, prefix: str = "") -> None:
    """The edges as a Parquet table of two columns (src, dst), a row group a chunk: int64 ids, or names."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for s in range(0, pairs.shape[0], 1 << 21):
        c = ids[pairs[s : s + (1 << 21)]]
        cols = [np.char.add(prefix, c[:, k].astype(str)) if prefix else c[:, k] for k in range(2)]
        t = pa.table({"src": cols[0], "dst": cols[1]})
        writer = writer or pq.ParquetWriter(path, t.schema)
        writer.write_table(t)
    writer.close()


def import_once(edges: Path, out: Path, *options: str) -> tuple[float, float]:
    """Seconds and peak resident MiB of one import in a fresh process (its own peak, read by GNU time)."""
    cmd = [sys.executable, "-m", "moment", "data", "import", "edgelist", str(edges), "--out", str(out), "--overwrite",
           "--feature-dim", "8", "--json", *options]
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss %M", *cmd], check=True, capture_output=True, text=True)
    took = time.perf_counter() - t
    return took, int(r.stderr.rsplit("maxrss ", 1)[1].split()[0]) / 1024


def rounds(ways: dict[str, tuple[Path, list[str]]], n: int, out: Path) -> dict[str, list[tuple[float, float]]]:
    """Each way's import `n` times, the ways alternating within a round: (seconds, peak MiB) a run."""
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
    for r in range(n):
        for k, (edges, options) in ways.items():
            got[k].append(import_once(edges, out / f"out_{k}", *options))
            print(f"round {r + 1} {k}: {got[k][-1][0]:.2f} s, peak {got[k][-1][1]:.0f} MiB", flush=True)
    return got


def ratio(name: str, got: dict[str, list[tuple[float, float]]], way: str, base: str) -> None:
    best, against = min(t for t, _ in got[way]), min(t for t, _ in got[base])
    print(f"{name}: {best / against:.2f}x ({best:.2f} s against {against:.2f} s, best of {len(got[way])}; peak "
          f"{max(m for _, m in got[way]):.0f} against {max(m for _, m in got[base]):.0f} MiB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--edges", type=int, default=20_000_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parts", default="numbering,tables,parquet", help="which comparisons, comma-separated")
    a = ap.parse_args()
    parts = set(a.parts.split(","))
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, a.nodes, (a.edges, 2))
    own = np.sort(rng.choice(1 << 62, a.nodes, replace=False)).astype(np.int64)
    x = rng.standard_normal((a.nodes, a.dim)).astype(np.float32)
    y = rng.integers(0, 4, a.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        files = {"dense": (d / "dense.txt", None, ""), "sparse": (d / "sparse.txt", own, ""),
                 "names": (d / "names.txt", own, "user")}
        for path, ids, prefix in files.values():
            write_edges(path, pairs, ids, prefix)
        print(f"nodes: {a.nodes:,}  edges: {a.edges:,}  text MB: "
              + ", ".join(f"{k} {p.stat().st_size / 1e6:.0f}" for k, (p, _, _) in files.items()))
        if "numbering" in parts:
            got = rounds({k: (p, ["--renumber"] if k != "dense" else []) for k, (p, _, _) in files.items()}, a.rounds, d)
            for k in ("sparse", "names"):
                ratio(f"{k}_vs_dense", got, k, "dense")
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
        tables = ["--node-table", str(d / "nodes.csv"), "--label-table", str(d / "labels.csv")]
        if "tables" in parts:
            got = rounds({"arrays": (d / "sparse.txt", ["--node-ids", str(d / "ids.txt"), "--features", str(d / "x.npy"),
                                                        "--labels", str(d / "y.npy")]),
                          "tables": (d / "sparse.txt", tables)}, a.rounds, d)
            ratio("tables_vs_arrays", got, "tables", "arrays")
        if "parquet" in parts:
            import pyarrow as pa
            import pyarrow.parquet as pq

            write_parquet(d / "sparse.parquet", pairs, own)
            write_parquet(d / "names.parquet", pairs, own, "user")
            pq.write_table(pa.table({"id": own, "x": pa.FixedSizeListArray.from_arrays(x.reshape(-1), a.dim)}),
                           d / "nodes.parquet")
            pq.write_table(pa.table({"id": own, "label": y}), d / "labels.parquet")
            print("Parquet MB: " + ", ".join(f"{k} {(d / f'{k}.parquet').stat().st_size / 1e6:.0f}"
                                             for k in ("sparse", "names", "nodes", "labels")), flush=True)
            got = rounds({"text_tables": (d / "sparse.txt", tables),
                          "parquet_tables": (d / "sparse.parquet", ["--node-table", str(d / "nodes.parquet"),
                                                                    "--label-table", str(d / "labels.parquet")]),
                          "text_names": (d / "names.txt", ["--renumber"]),
                          "parquet_names": (d / "names.parquet", ["--renumber"])}, a.rounds, d)
            ratio("parquet_vs_text_tables", got, "parquet_tables", "text_tables")
            ratio("parquet_vs_text_names", got, "parquet_names", "text_names")


if __name__ == "__main__":
    main()
