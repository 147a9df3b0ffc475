"""How well DDAK realises the planner's storage shares against hash, on a pre-sampled synthetic graph,
and what each step of `moment place` costs.

Machine: paper-machine-b with 4 x A100 + 8 x P5510 in the profile's fixed `paper-c` layout, evaluated
with the measured workload (`evaluate`, no placement search, so the numbers do not wait on the
planner's search). Caches default to 1% of the rows per GPU and 2.5% per socket: the dataset is small,
and the default 25%-of-HBM cache would hold all of it (no SSD traffic to place). Both policies get the
same bins and hotness order. Prints `name: value` lines; per-bin error = |achieved - target| / target.

    .venv/bin/python bench/placement.py [--nodes 1000000] [--feature-dim 128] [--cache DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from moment.placement import PlanRef, ddak, hash_placement, policy_report, verify_layout, write_layout
from moment.placement import planning as pl
from moment.placement.assignment import hotness_order
from moment.placement.manifest import row_format
from moment.planner.baselines import named_layouts
from moment.planner.evaluate import evaluate
from moment.runtime.config import TrainConfig
from moment.topology.devices import Inventory, strip
from moment.topology.profiles import load_profile
from moment.workload.graph import GraphDataset
from moment.workload.hotness import presample
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


def errors(rep) -> dict[str, float]:
    return {b.name: b.rel_error for b in rep.bins if b.rel_error is not None}


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
    ap.add_argument("--no-write", action="store_true", help="skip writing and verifying the layout")
    a = ap.parse_args()

    ds, synth_s = dataset(a.cache, int(a.nodes), a.feature_dim)
    if synth_s is not None:
        print(f"synth_s: {synth_s:.2f}")
    topo = load_profile("paper-machine-b")
    inv = Inventory.simple(4, 8)
    bare, _ = strip(topo)
    placement = next(p.placement for p in named_layouts(bare, inv) if p.name == a.layout)
    batch = TrainConfig().resolved_batch_size(len(ds.train_idx), 4)
    hot, presample_s = timed(presample, ds, [25, 10], batch, seed=0)
    order, sort_s = timed(hotness_order, hot.feature_reads)

    cache = pl.CacheRows(gpu=pl.cache_rows(pl.parse_cache(a.gpu_cache, "gpu"), 0, ds),
                         cpu=pl.cache_rows(pl.parse_cache(a.cpu_cache, "cpu"), 0, ds))
    wl = pl.workload_from_hotness(ds, hot, cache.gpu, cache.cpu, 4, 2, [25, 10], batch, order=order)
    ev, evaluate_s = timed(evaluate, bare, placement, wl)
    fmt = row_format(ds.row_bytes)
    bins = pl.bins_from_plan(ev, topo, cache=cache, row_bytes=ds.row_bytes, ssd_stride=fmt.stride)
    h = hot.feature_reads
    a_ddak, ddak_s = timed(ddak, h, bins, a.pool, order=order)
    a_hash, hash_s = timed(hash_placement, h, bins, order=order)
    reps = {k: policy_report(x, row_stride=fmt.stride, cache_row_bytes=ds.row_bytes)
            for k, x in (("ddak", a_ddak), ("hash", a_hash))}

    print(f"nodes: {ds.num_nodes}")
    print(f"feature_dim: {ds.feature_dim}")
    print(f"machine: paper-machine-b 4xA100 8xP5510 layout {a.layout} (fixed, evaluate)")
    print(f"batches: {hot.num_batches} (batch size {batch}, fan-outs 25,10, 1 epoch)")
    print(f"skew_top1pct: {hot.skew()[0.01]:.4f}")
    print(f"gpu_cache_share: {wl.gpu_cache_share:.4f}")
    print(f"cpu_cache_share: {wl.cpu_cache_share:.4f}")
    print(f"predicted_epoch_read_s: {ev.predicted.epoch_read_s:.4f}")
    for name, rep in reps.items():
        e = errors(rep)
        ssd = [v for k, v in e.items() if k.startswith("ssd")]
        print(f"{name}_mean_rel_error: {np.mean(list(e.values())):.4f}")
        print(f"{name}_max_rel_error: {max(e.values()):.4f}")
        print(f"{name}_ssd_mean_rel_error: {np.mean(ssd):.4f}")
        print(f"{name}_ssd_max_rel_error: {max(ssd):.4f}")
        print(f"{name}_l1_error: {rep.l1_error:.4f}")
        print(f"{name}_cross_socket_share: {rep.cross_socket_share:.4f}")
    for bd, bh in zip(reps["ddak"].bins, reps["hash"].bins):
        if bd.rel_error is None:  # target 0: show the share it serves anyway
            print(f"bin_{bd.name}: target 0 ddak_share {bd.achieved_share:.4f} hash_share {bh.achieved_share:.4f}")
        else:
            print(f"bin_{bd.name}: target {bd.target_share:.4f} ddak {bd.rel_error:.4f} hash {bh.rel_error:.4f}")
    ratio = reps["hash"].l1_error / reps["ddak"].l1_error if reps["ddak"].l1_error > 0 else float("inf")
    print(f"l1_error_hash_over_ddak: {ratio:.2f}")
    print(f"presample_s: {presample_s:.2f}")
    print(f"sort_s: {sort_s:.3f}")
    print(f"evaluate_s: {evaluate_s:.3f}")
    print(f"ddak_s: {ddak_s:.3f} (engine {a_ddak.engine})")
    print(f"hash_s: {hash_s:.3f}")
    if not a.no_write:
        with tempfile.TemporaryDirectory(dir=a.cache) as tmp:
            out = Path(tmp) / "L"
            _, write_s = timed(write_layout, out, ds.file("features"), a_ddak,
                               plan=PlanRef(machine=topo.name, placement=placement, pool=a.pool),
                               dataset_checksum=ds.manifest.files["features"].sha256)
            rep, verify_s = timed(verify_layout, out)
            assert rep.ok, rep.problems
            print(f"write_s: {write_s:.2f} ({ds.num_nodes * ds.row_bytes / write_s / 1e9:.2f} GB/s of features)")
            print(f"verify_s: {verify_s:.2f}")


if __name__ == "__main__":
    main()
