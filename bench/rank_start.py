"""What a rank of `moment train` no longer does at its start, against what it does instead: the dataset's check
(`GraphDataset.check`: sampled block checksums and the graph's structure) against comparing the identity its launcher
handed it (`check(checked)`), and its first batches sampled for the batch extent (`sizing._batch_extent`) against
reading the extent its launcher handed it (`_given_extent`). CPU seconds of this process, best and median of
`--repeat`, each on a freshly opened dataset; then each pair's ratio.

    .venv/bin/python bench/rank_start.py LAYOUT [--ranks 2] [--fanouts 25,10] [--batch-size 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's moment


def cpu_s(f: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(best, median) CPU seconds of this process running `f`."""
    got = []
    for _ in range(repeat):
        t = time.process_time()
        f()
        got.append(time.process_time() - t)
    return min(got), statistics.median(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layout", type=Path)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--fanouts", default="25,10")
    ap.add_argument("--batch-size", default="1024")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="rank-start-")  # the launcher's extent record: this run's

    import numpy as np

    from moment.placement.opened import Layout
    from moment.runtime import sizing
    from moment.runtime.config import parse_args
    from moment.workload.graph import GraphDataset
    from moment.workload.sampler import CSRGraph, SeedBatches

    where = Layout.open(a.layout).dataset_dir
    checked = GraphDataset.open(where).vouch()[1]
    check = cpu_s(lambda: GraphDataset.open(where).check(), a.repeat)
    trusted = cpu_s(lambda: GraphDataset.open(where).check(checked), a.repeat)
    cfg = parse_args(["--layout", str(a.layout), "--fanouts", a.fanouts, "--batch-size", a.batch_size,
                      "--memory-budget", "auto"], check=False)
    ds = GraphDataset.open(where)
    graph, train = CSRGraph.from_dataset(ds), np.asarray(ds.train_idx)
    batches = SeedBatches(train, cfg.resolved_batch_size(train.size, a.ranks), seed=cfg.seed, rank=0,
                          world_size=a.ranks)
    fanouts = cfg.resolved_fanouts()
    sampled = cpu_s(lambda: sizing._batch_extent(cfg, graph, batches, fanouts, graph.degree_histogram()), a.repeat)
    sizing.preview_inputs(cfg, ds, a.ranks)  # the launcher's check, which records the extent it hands the ranks
    os.environ.update(sizing.extent_env(cfg, ds, a.ranks))
    assert sizing._given_extent(cfg, ds, a.ranks) is not None
    handed = cpu_s(lambda: sizing._given_extent(cfg, ds, a.ranks), a.repeat)
    print(f"{a.layout}: {ds.num_nodes:,} nodes, {ds.num_edges:,} edges; a rank of {a.ranks}, fan-outs {a.fanouts}, "
          f"batch {a.batch_size} (CPU s, best / median of {a.repeat})")
    print(f"dataset_check_s: {check[0]:.4f} / {check[1]:.4f}   identity_compared_s: {trusted[0]:.4f} / {trusted[1]:.4f}"
          f"   ratio: {check[1] / trusted[1]:.0f}x")
    print(f"extent_sampled_s: {sampled[0]:.4f} / {sampled[1]:.4f}   extent_handed_s: {handed[0]:.4f} / {handed[1]:.4f}"
          f"   ratio: {sampled[1] / handed[1]:.0f}x")
    print(f"saved_per_rank_s: {check[1] + sampled[1] - trusted[1] - handed[1]:.3f}")


if __name__ == "__main__":
    main()
