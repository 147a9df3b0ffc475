"""What a run's start-up integrity checks cost on a large graph, against the full re-hash in the same
process: the sampled block checksums (`GraphDataset.spot_check`), the graph's structure (`validate`), and
the structure of a layout index and hotness order of the same node count (`IndexCheck`, `order_problem`).
The baseline, `verify_checksums`, reads every byte (what `moment place` and `data info --verify` do).
Prints `name: value` lines; "first" is the first call in this process (page cache as the OS left it).

    .venv/bin/python bench/integrity.py [--nodes 8000000] [--dim 128] [--data DIR] [--skip-full]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from moment.placement.reader import IndexCheck, order_problem
from moment.workload.graph import GraphDataset
from moment.workload.synth import synthesize


def timed(f: Callable[[], object], reps: int = 3) -> tuple[float, float]:
    """(first, best) seconds of `reps` calls."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out.append(time.perf_counter() - t)
    return out[0], min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--data", type=Path, help="existing dataset (default: generate one in a temp dir)")
    ap.add_argument("--bins", type=int, default=12, help="layout bins of the index checked")
    ap.add_argument("--skip-full", action="store_true", help="leave out the full re-hash baseline")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.data
        if path is None:
            path = Path(tmp) / "g"
            t = time.perf_counter()
            synthesize(path, a.nodes, feature_dim=a.dim, seed=0)
            print(f"synth_s: {time.perf_counter() - t:.1f}")
        ds = GraphDataset.open(path)
        n = ds.num_nodes
        print(f"nodes: {n}\nedges: {ds.num_edges}\ndataset_bytes: {sum(f.bytes for f in ds.manifest.files.values())}")
        for name, f in (("open_s", lambda: GraphDataset.open(path)),
                        ("spot_check_s", lambda: GraphDataset.open(path).spot_check()),
                        ("validate_s", lambda: GraphDataset.open(path).validate())):
            first, best = timed(f)
            print(f"{name}: first {first:.3f} best {best:.3f}")

        rng = np.random.default_rng(0)
        rows = np.full(a.bins, n // a.bins)
        rows[-1] += n - rows.sum()
        m = SimpleNamespace(shards=[SimpleNamespace(rows=int(r), bin=f"b{i}", stride=512, bytes=int(r) * 512)
                                    for i, r in enumerate(rows)],
                            dataset=SimpleNamespace(num_nodes=n))
        perm = rng.permutation(n)
        index = np.empty((n, 2), np.int64)
        index[perm, 0] = np.repeat(np.arange(a.bins), rows)
        index[perm, 1] = np.concatenate([np.arange(r) for r in rows])

        def check_index() -> None:
            chk = IndexCheck(m)
            for s in range(0, n, 1 << 20):
                chk.add(s, index[s:s + (1 << 20)])
            assert chk.problem() is None

        first, best = timed(check_index)
        print(f"layout_index_check_s: first {first:.3f} best {best:.3f}")
        first, best = timed(lambda: order_problem(perm, n))
        print(f"order_check_s: first {first:.3f} best {best:.3f}")
        if not a.skip_full:
            first, _ = timed(lambda: GraphDataset.open(path).verify_checksums(), reps=1)
            print(f"full_rehash_s (baseline): {first:.1f}")


if __name__ == "__main__":
    main()
