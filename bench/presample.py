"""Pre-sampling throughput (sampled node ids per second) on a synthetic power-law graph, against a
straightforward per-seed Python loop sampler run on the same graph in the same process, and the sampler's
C loops against its own torch path (the same batches bit for bit), and those loops with their prefetch against
none, each alternated on the same batches.

Both samplers draw, per target, min(fanout, degree) distinct neighbours and de-duplicate per batch;
the baseline does it node by node with `random.sample` and a dict, as research code often does.
Also reports the synth time (if it generates the graph), the dense-map vs `torch.unique` de-dup, and
the access skew. Prints `name: value` lines.

    .venv/bin/python bench/presample.py [--nodes 10000000] [--data DIR] [--batch-size 1024] [--batches 20]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from moment.workload.batch_bytes import native_sampling
from moment.workload.graph import GraphDataset
from moment.workload.hotness import presample
from moment.workload.sampler import CSRGraph, NeighborSampler, SeedBatches
from moment.workload.synth import synthesize


def loop_sampler(indptr: np.ndarray, indices: np.ndarray, seeds: list[int], fanouts: list[int], rng: random.Random) -> int:
    """Per-node Python reference: returns the number of ids drawn (seeds included)."""
    n_id = {s: i for i, s in enumerate(seeds)}
    frontier, drawn = list(seeds), len(seeds)
    for f in fanouts:
        new = []
        for t in frontier:
            lo, hi = int(indptr[t]), int(indptr[t + 1])
            picks = range(lo, hi) if hi - lo <= f else rng.sample(range(lo, hi), f)
            for p in picks:
                v = int(indices[p])
                drawn += 1
                if v not in n_id:
                    n_id[v] = len(n_id)
                    new.append(v)
        frontier = new
    return drawn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=float, default=1e7)
    ap.add_argument("--data", type=Path, help="existing dataset (default: generate one in a temp dir)")
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--batches", type=int, default=20, help="batches for the vectorised sampler")
    ap.add_argument("--baseline-batches", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    fanouts = [int(x) for x in a.fanouts.split(",")]
    tmp = None
    if a.data is None:
        tmp = Path(tempfile.mkdtemp(prefix="moment-bench-"))
        t0 = time.perf_counter()
        ds = synthesize(tmp / "g", int(a.nodes), feature_dim=a.feature_dim)
        print(f"synth_s[{int(a.nodes)} nodes x {a.feature_dim}]: {time.perf_counter() - t0:.1f}")
    else:
        ds = GraphDataset.open(a.data)
    try:
        print(f"graph: {ds.num_nodes} nodes, {ds.num_edges} edges, {len(ds.train_idx)} training seeds")
        presample(ds, fanouts, a.batch_size, num_batches=1, seed=0, threads=a.threads)  # warm-up (lazy init)
        hot = presample(ds, fanouts, a.batch_size, num_batches=a.batches, seed=0, threads=a.threads)
        rate = hot.meta["sampled_per_s"]
        print(f"presample_sampled_per_s: {rate:,.0f}")
        print(f"presample_batches_per_s: {hot.num_batches / hot.meta['elapsed_s']:.2f}")
        print(f"unique_ratio: {hot.unique_ratio:.3f}")
        for k, v in hot.skew().items():
            print(f"feature_skew_top_{k:.0%}: {v:.3f}")
        for k, v in hot.skew(kind="adjacency").items():
            print(f"adjacency_skew_top_{k:.0%}: {v:.3f}")

        torch.set_num_threads(a.threads)
        graph = CSRGraph.from_dataset(ds)
        batches = list(SeedBatches(ds.train_idx, a.batch_size, seed=0).epoch(0))[: max(a.baseline_batches, 1)]
        rates = {}
        for mode in ("map", "unique"):
            s = NeighborSampler(graph, fanouts, seed=0, dedup=mode)
            t0, drawn = time.perf_counter(), 0
            for b in batches:
                drawn += s.sample(b).num_sampled
            rates[mode] = drawn / (time.perf_counter() - t0)
            print(f"vectorised_{mode}_dedup_sampled_per_s: {rates[mode]:,.0f}")

        many = list(SeedBatches(ds.train_idx, a.batch_size, seed=0).epoch(0))[: a.batches]
        best = {True: 0.0, False: 0.0}
        for _ in range(2):  # alternated, the better of two each: this machine's noise hits both alike
            for native in (True, False):
                s = NeighborSampler(graph, fanouts, seed=0, native=native)
                s.sample(many[0])  # the node table's first touch is not the loops'
                t0, drawn = time.process_time(), 0
                for b in many:
                    drawn += s.sample(b).num_sampled
                best[native] = max(best[native], drawn / (time.process_time() - t0))
        if NeighborSampler(graph, fanouts).native:
            print(f"c_loops_sampled_per_cpu_s: {best[True]:,.0f}")
            print(f"torch_path_sampled_per_cpu_s: {best[False]:,.0f}")
            print(f"c_loops_over_torch_path[{len(many)} batches of {a.batch_size}, fanouts {a.fanouts}]: "
                  f"{best[True] / best[False]:.2f}")
            # the loops' prefetch (native/sampling.c) against none, alternated on the same batches
            loops = native_sampling()
            ahead = loops.prefetch()
            per = {ahead: 0.0, 0: 0.0}
            try:
                for _ in range(3):
                    for n in per:
                        loops.prefetch(n)
                        s = NeighborSampler(graph, fanouts, seed=0)
                        s.sample(many[0])
                        t0, drawn = time.process_time(), 0
                        for b in many:
                            drawn += s.sample(b).num_sampled
                        per[n] = max(per[n], drawn / (time.process_time() - t0))
            finally:
                loops.prefetch(ahead)
            print(f"c_loops_prefetch_{ahead}_sampled_per_cpu_s: {per[ahead]:,.0f}")
            print(f"c_loops_no_prefetch_sampled_per_cpu_s: {per[0]:,.0f}")
            print(f"c_loops_prefetch_over_none: {per[ahead] / per[0]:.2f}")
        else:
            print("c_loops_over_torch_path: n/a (the sampler's C extension is not built)")

        ip, ix = np.asarray(ds.indptr), np.asarray(ds.indices)
        rng = random.Random(0)
        t0, drawn = time.perf_counter(), 0
        for b in batches:
            drawn += loop_sampler(ip, ix, b.tolist(), fanouts, rng)
        base = drawn / (time.perf_counter() - t0)
        print(f"baseline_python_loop_sampled_per_s: {base:,.0f}")
        print(f"speedup_vs_python_loop[same batches]: {rates['map'] / base:.1f}")
        print(f"speedup_vs_python_loop[presample run]: {rate / base:.1f}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
