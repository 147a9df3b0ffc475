"""A graph split over two machines against the whole graph on one, same world size: remote rows and epoch time.

Both runs train the bench graph of bench/epoch.py (the same dataset, made once in `--cache-dir` and shared
with it) with the same ranks, seeds and batches:

* one_agent  `moment train --nproc 2` on one machine's whole layout (`moment place`, GPUs = ranks);
* split      `moment place --machines 2` (each machine a layout of its part, the hottest rows on both),
             then two agents on 127.0.0.1, `moment train --nnodes 2 --node-rank K --nproc 1`, each with its
             own machine's layout: the rows a machine lacks come from the other through the remote tier.

On one machine the two agents share its cores and disk: the ratio is the split's overhead (the exchange, the
serving reads), not a cluster's speed. Every run starts with the layouts' and dataset's files dropped from the
page cache. Prints `name: value` lines: the split's replicated rows and predicted remote share (a held-out sample),
each machine's measured remote share, rows and MB fetched and served, both runs' epoch seconds, and last
`ratio_split_vs_one_agent` (split epoch s / one agent's) and `loss_curves_equal`. Exit 0 only when both ran
and their loss curves agree (the split must train exactly what the whole layout trains).

    python bench/cluster_train.py [--nodes 8000000] [--dim 128] [--train-fraction 0.0025] [--epochs 2]
                                  [--cache-dir DIR] [--replicate SIZE] [--gpu-cache 1%] [--cpu-cache 5%]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _moment(*args: str) -> list[str]:
    return [sys.executable, "-m", "moment", *args]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dataset(cache: Path, a) -> Path:
    """bench/epoch.py's graph for these parameters (made once, shared with it)."""
    from moment.workload.synth import synthesize

    ds = cache / f"synth-{a.nodes}-{a.dim}"
    if not (ds / "manifest.json").is_file():
        t = time.perf_counter()
        synthesize(ds, a.nodes, feature_dim=a.dim, seed=0, train_fraction=a.train_fraction,
                   val_fraction=a.train_fraction / 5, test_fraction=a.train_fraction / 5, overwrite=True)
        print(f"synth_s: {time.perf_counter() - t:.1f}", flush=True)
    return ds


def place(ds: Path, out: Path, a, *machines: str) -> None:
    """The whole layout (no `machines`) or the split (`--machines 2`), placed once per parameters."""
    mark = "cluster.json" if machines else "manifest.json"
    if (out / mark).is_file():
        return
    gpus = "1" if machines else "2"  # one plan GPU per rank: the whole machine runs 2 ranks, each split machine 1
    t = time.perf_counter()
    subprocess.run(_moment("place", "--dataset", str(ds), "--profile", "paper-machine-b", "--gpus", gpus, "--ssds",
                           "2", "--gpu-cache", a.gpu_cache, "--cpu-cache", a.cpu_cache, "--fanouts", a.fanouts,
                           "--batch-size", str(a.batch_size), "--out", str(out), "--overwrite", "--json",
                           *machines), check=True, stdout=subprocess.DEVNULL)
    print(f"place_{'split' if machines else 'whole'}_s: {time.perf_counter() - t:.1f}", flush=True)


def train_args(a, out: Path) -> list[str]:
    return ["--epochs", str(a.epochs), "--fanouts", a.fanouts, "--batch-size", str(a.batch_size), "--hidden",
            str(a.hidden), "--quiet", "--run-dir", str(out.parent / "runs")]


def one_agent(layout: Path, a, out: Path) -> dict:
    out.unlink(missing_ok=True)
    subprocess.run(_moment("train", "--nproc", "2", "--layout", str(layout), *train_args(a, out), "--metrics-json",
                           str(out)), check=True)
    return json.loads(out.read_text())


def split(layout: Path, a, out: Path) -> dict:
    out.unlink(missing_ok=True)
    port = _port()
    agents = []
    for k in (0, 1):  # machine 0 first: its agent hosts the rendezvous, as on a cluster
        metrics = ["--metrics-json", str(out)] if k == 0 else []
        agents.append(subprocess.Popen(_moment("train", "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint",
                                               f"127.0.0.1:{port}", "--rdzv-timeout", "300", "--layout",
                                               str(layout / f"m{k}"), *train_args(a, out), *metrics)))
    codes = [p.wait() for p in agents]
    if any(codes):
        raise SystemExit(f"the split's agents exited {codes}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    import epoch as ep
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ep.workload_args(p)
    p.add_argument("--replicate", default=None, help="`moment place --replicate` of the split (default: its own)")
    p.add_argument("--gpu-cache", default="1%")
    p.add_argument("--cpu-cache", default="5%")
    p.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "MOMENT_BENCH_CACHE", Path.home() / ".cache" / "moment-bench")))
    a = p.parse_args(argv)
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    ds = dataset(a.cache_dir, a)
    whole = a.cache_dir / f"cluster-whole-{a.nodes}-{a.dim}"
    parts = a.cache_dir / (f"cluster-split-{a.nodes}-{a.dim}" + (f"-r{a.replicate}" if a.replicate else ""))
    place(ds, whole, a)
    place(ds, parts, a, "--machines", "2", *(["--replicate", a.replicate] if a.replicate else []))
    print(f"nodes: {a.nodes}\ndim: {a.dim}\nepochs: {a.epochs}", flush=True)

    ep.drop_files(ds, whole, parts)
    one = one_agent(whole, a, a.cache_dir / "cluster-one.json")
    ep.drop_files(ds, whole, parts)
    two = split(parts, a, a.cache_dir / "cluster-split.json")

    manifest = json.loads((parts / "cluster.json").read_text())
    print(f"replicated_rows: {manifest['replicated_rows']} ({manifest['replicated_rows'] / a.nodes:.1%} of the rows)")
    for x in manifest["machines"]:
        print(f"remote_read_share_predicted_{x['name']}: {x['remote_read_share']:.4f}")
    for x in two["machines"]:
        m = x["machine"]
        print(f"remote_rows_share_{m}: {x['remote_share']:.4f}")
        print(f"remote_rows_{m}: {x['remote_rows']}  (of {x['rows']} rows read)")
        print(f"remote_mb_{m}: {x['remote_bytes'] / 1e6:.1f}  (served to the other: {x['remote_served_bytes'] / 1e6:.1f})")
    rows = sum(x["rows"] for x in two["machines"])
    print(f"remote_rows_share: {sum(x['remote_rows'] for x in two['machines']) / max(rows, 1):.4f}")
    for name, m in (("one_agent", one), ("split", two)):
        print(f"epoch_s_{name}: {', '.join(f'{s:.2f}' for s in m['epoch_seconds'])}  (mean "
              f"{np.mean(m['epoch_seconds']):.2f}; stages {json.dumps(m['stage_seconds'])})")
    ratio = float(np.mean(two["epoch_seconds"]) / np.mean(one["epoch_seconds"]))
    print(f"ratio_split_vs_one_agent: {ratio:.3f}")
    equal = np.allclose(one["loss_curve"], two["loss_curve"], rtol=1e-6)
    print(f"loss_curves_equal: {str(equal).lower()}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
