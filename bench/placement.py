"""How well DDAK realises the planner's storage shares against hash, on a pre-sampled synthetic graph,
and what each step of `moment place` costs.

Machine: paper-machine-b with 4 x A100 + 8 x P5510 in the profile's fixed `paper-c` layout, evaluated
with the measured workload. Caches default to 1% of the rows per GPU and 2.5% per socket: the dataset is small,
and the default 25%-of-HBM cache would hold all of it (no SSD traffic to place). Both policies get the
same bins and hotness order. Prints `name: value` lines; per-bin error = |achieved - target| / target.

    .venv/bin/python bench/placement.py [--nodes 1000000] [--feature-dim 128] [--cache DIR]

Every step runs through `moment.placement.place()`, the call `moment place` makes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from moment.placement.api import place
from moment.placement.planning import recommended_plan
from moment.planner.baselines import named_layouts
from moment.topology.devices import Inventory, strip
from moment.topology.profiles import load_profile
from moment.workload.graph import GraphDataset
from moment.workload.synth import synthesize


def timed(f, *a, **kw):
    t = time.perf_counter()
    r = f(*a, **kw)
    return r, time.perf_counter() - t


def dataset(cache: Path, nodes: int, dim: int) -> tuple[GraphDataset, float | None]:
    path = cache / f"synth-{nodes}-{dim}"
    if (path / "manifest.json").is_file():
        return GraphDataset.open(path), None
    return timed(synthesize, path, nodes, feature_dim=dim, seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=float, default=1e6)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                    / "moment-bench", help="where the synthetic dataset is kept between runs")
    ap.add_argument("--gpu-cache", default="1%")
    ap.add_argument("--cpu-cache", default="2.5%")
    ap.add_argument("--layout", default="paper-c")
    ap.add_argument("--pool", type=int, default=100)
    a = ap.parse_args()

    ds, synth_s = dataset(a.cache, int(a.nodes), a.feature_dim)
    if synth_s is not None:
        print(f"synth_s: {synth_s:.2f}")
    topo = load_profile("paper-machine-b")
    inv = Inventory.simple(4, 8)
    placement = next(p.placement for p in named_layouts(strip(topo)[0], inv) if p.name == a.layout)
    plan, search_s = timed(recommended_plan, topo, inv)
    plan = plan.model_copy(update={"placement": placement})  # the fixed layout, re-evaluated by place()
    a.cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=a.cache) as tmp:
        res, place_s = timed(place, ds, Path(tmp) / "L", topo, inv, plan=plan, epochs=1, fanouts=(25, 10),
                             gpu_cache=a.gpu_cache, cpu_cache=a.cpu_cache, pool=a.pool, seed=0)
    reps = {k: res.policies[k] for k in ("ddak", "hash")}

    print(f"nodes: {ds.num_nodes}")
    print(f"feature_dim: {ds.feature_dim}")
    print(f"machine: paper-machine-b 4xA100 8xP5510 layout {a.layout} (fixed, re-evaluated by place())")
    print(f"batches: {res.presample['batches']} (batch size {res.presample['batch_size']}, fan-outs 25,10, 1 epoch)")
    print(f"skew_top1pct: {res.skew['top_0.01']:.4f}")
    print(f"gpu_cache_share: {res.workload['gpu_cache_share']:.4f}")
    print(f"cpu_cache_share: {res.workload['cpu_cache_share']:.4f}")
    print(f"predicted_epoch_read_s: {res.plan['epoch_read_s']:.4f}")
    for name, rep in reps.items():
        e = {b["name"]: b["rel_error"] for b in rep["bins"] if b["rel_error"] is not None}
        ssd = [v for k, v in e.items() if k.startswith("ssd")]
        print(f"{name}_mean_rel_error: {np.mean(list(e.values())):.4f}")
        print(f"{name}_max_rel_error: {max(e.values()):.4f}")
        print(f"{name}_ssd_mean_rel_error: {np.mean(ssd):.4f}")
        print(f"{name}_ssd_max_rel_error: {max(ssd):.4f}")
        print(f"{name}_l1_error: {rep['l1_error']:.4f}")
        print(f"{name}_cross_socket_share: {rep['cross_socket_share']:.4f}")
    for bd, bh in zip(reps["ddak"]["bins"], reps["hash"]["bins"], strict=True):
        if bd["rel_error"] is None:  # target 0: show the share it serves anyway
            print(f"bin_{bd['name']}: target 0 ddak_share {bd['achieved_share']:.4f} hash_share {bh['achieved_share']:.4f}")
        else:
            print(f"bin_{bd['name']}: target {bd['target_share']:.4f} ddak {bd['rel_error']:.4f} hash {bh['rel_error']:.4f}")
    ratio = reps["hash"]["l1_error"] / reps["ddak"]["l1_error"] if reps["ddak"]["l1_error"] > 0 else float("inf")
    print(f"l1_error_hash_over_ddak: {ratio:.2f}")
    print(f"search_s: {search_s:.2f} (the recommended plan, whose placement is replaced by {a.layout})")
    for k, v in sorted(res.timings.items()):
        print(f"{k}: {v:.3f}")
    print(f"ddak_engine: {reps['ddak'].get('engine')}")
    print(f"place_s: {place_s:.2f} ({ds.num_nodes * ds.row_bytes / res.timings.get('write_s', place_s) / 1e9:.2f} "
          "GB/s of features written)")


if __name__ == "__main__":
    main()
