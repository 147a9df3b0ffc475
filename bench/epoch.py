"""Epoch time of Moment's runtime vs the plain out-of-core baseline, same model, same batches, same script.

* moment:   `python -m moment.train` over a DDAK layout (GPU bins 1% of the nodes each, CPU cache 10%
            of the features, 2 SSD bins, rows aligned to `--align`), O_DIRECT reads through each rank's
            I/O stack, pipelined.
* baseline: the same model trained from a numpy memmap of features.npy indexed per batch, one stage
            after the other (what PyG code does when features do not fit in memory); the file's pages
            are dropped from the page cache at every epoch start (POSIX_FADV_DONTNEED), so it reads
            the disk like Moment does.

Both run under torchrun with `--nproc` ranks on CPU (gloo). The graph (default 2M nodes, 128-d float32
features) and the layout are generated into `--cache-dir` once. Prints `name: value` lines.

    python bench/epoch.py [--nodes 2000000] [--dim 128] [--epochs 2] [--nproc 2] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from moment.cli.train_cmds import torchrun_command


def build(cache: Path, nodes: int, dim: int, fanouts: list[int], batch: int | None, align: int) -> tuple[Path, Path]:
    """Dataset and layout, made once per (nodes, dim) and reused."""
    from moment.placement import BinSet, ddak, write_layout
    from moment.runtime.config import TrainConfig
    from moment.workload.graph import GraphDataset
    from moment.workload.hotness import presample
    from moment.workload.synth import synthesize

    ds_dir, layout = cache / f"synth-{nodes}-{dim}", cache / f"layout-{nodes}-{dim}-a{align}"
    if (ds_dir / "manifest.json").is_file():
        ds = GraphDataset.open(ds_dir)
    else:
        t = time.perf_counter()
        ds = synthesize(ds_dir, nodes, feature_dim=dim, seed=0, overwrite=True)
        print(f"synth_s: {time.perf_counter() - t:.1f}", flush=True)
    if not (layout / "manifest.json").is_file():
        t = time.perf_counter()
        bs = TrainConfig(batch_size=batch).resolved_batch_size(ds.train_idx.size, 1)
        h = presample(ds, fanouts, bs, seed=0)
        n = ds.num_nodes
        bins = BinSet.uniform(gpus=2, cpus=1, ssds=2, gpu_rows=n // 100, cpu_rows=n // 10, ssd_rows=n,
                              gpu_share=0.1, cpu_share=0.3)
        a = ddak(h.feature_reads, bins, pool=100, cache_fill="capacity")
        write_layout(layout, ds.file("features"), a, align=align, dataset_checksum=ds.manifest.files["features"].sha256,
                     overwrite=True)
        print(f"layout_s: {time.perf_counter() - t:.1f}", flush=True)
    return ds_dir, layout


def run(name: str, nproc: int, args: list[str], out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
    t = time.perf_counter()
    r = subprocess.run(torchrun_command(nproc, [*args, "--metrics-json", str(out), "--quiet"]), env=env,
                       capture_output=True, text=True, check=False)
    if r.returncode:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
        raise SystemExit(f"{name} run failed ({r.returncode})")
    m = json.loads(out.read_text())
    m["process_s"] = time.perf_counter() - t
    return m


def report(prefix: str, m: dict) -> None:
    ep = m["epoch_seconds"]
    print(f"{prefix}_epoch_s_each: {', '.join(f'{x:.2f}' for x in ep)}")
    for k, v in m["stage_seconds"].items():
        print(f"{prefix}_stage_{k}_s: {v:.2f}")
    print(f"{prefix}_pipeline_wall_s: {m['pipeline_wall_s']:.2f}")
    print(f"{prefix}_limiting_stage: {m['limiting_stage']}")
    print(f"{prefix}_seeds_per_s: {m['seeds_per_s']:.0f}")
    for k, v in m["tier_mb_per_s"].items():
        print(f"{prefix}_tier_{k}_MB_per_s: {v:.1f}")
    if m["ssd_bytes_read"]:
        ssd = m["tier_bytes"].get("ssd", 0)
        print(f"{prefix}_ssd_read_amplification: {m['ssd_bytes_read'] / max(ssd, 1):.2f}")
        print(f"{prefix}_ssd_requests: {m['ssd_requests']}")
    print(f"{prefix}_val_accuracy: {m['val_accuracy']:.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "MOMENT_BENCH_CACHE", Path.home() / ".cache" / "moment-bench")))
    p.add_argument("--align", type=int, default=512,
                   help="layout row alignment: the disk's logical block size (512 here; 4096 on 4Kn drives)")
    p.add_argument("--merge-gap", type=int, default=0, help="Moment: --io-merge-gap (bytes)")
    p.add_argument("--skip-baseline", action="store_true")
    a = p.parse_args()
    fanouts = [int(x) for x in a.fanouts.split(",")]
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    ds_dir, layout = build(a.cache_dir, a.nodes, a.dim, fanouts, a.batch_size, a.align)
    common = ["--dataset", str(ds_dir), "--epochs", str(a.epochs), "--fanouts", a.fanouts, "--hidden", str(a.hidden)]
    if a.batch_size:
        common += ["--batch-size", str(a.batch_size)]
    print(f"nodes: {a.nodes}\nfeature_dim: {a.dim}\nranks: {a.nproc}\nepochs: {a.epochs}\nfanouts: {a.fanouts}")
    print(f"align: {a.align}\nmerge_gap: {a.merge_gap}")
    mo = run("moment", a.nproc, ["--layout", str(layout), "--io-merge-gap", str(a.merge_gap), *common],
             a.cache_dir / "moment.json")
    print(f"batch_size_per_rank: {mo['batch_size']}\nio_backend: {mo['backend']}")
    report("moment", mo)
    m_ep = sum(mo["epoch_seconds"]) / len(mo["epoch_seconds"])
    print(f"moment_epoch_s: {m_ep:.2f}")
    if a.skip_baseline:
        return
    bl = run("baseline", a.nproc, ["--features-memmap", "--drop-page-cache", "--no-pipeline", *common],
             a.cache_dir / "baseline.json")
    report("baseline", bl)
    b_ep = sum(bl["epoch_seconds"]) / len(bl["epoch_seconds"])
    print(f"baseline_epoch_s: {b_ep:.2f}")
    print(f"speedup: {b_ep / m_ep:.2f}")
    print(f"same_loss_curve: {mo['loss_curve'] == bl['loss_curve']}")


if __name__ == "__main__":
    main()
