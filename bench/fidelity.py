"""Fidelity of the SSD-read prediction: probe + model on a real layout vs a `moment train` run.

1. Dataset and DDAK layout as `bench/epoch.py` builds them (reused from `--cache-dir`); features well
   above the caches (default 8M x 128 float32 = 4 GiB, CPU cache capped at `--cpu-cache-limit 10%`).
2. Probe the cache dir's file system with `moment probe`'s `probe_ssd` (O_DIRECT through IOStack):
   sequential GB/s (1 MiB reads) and random IOPS at the layout's alignment (the runtime's smallest
   request), at the runtime's queue depth; then the same random reads from `--nproc` processes at
   once (`probe_concurrent`), which is how the ranks use the disk: the model's IOPS. (With the
   pthreads backend on a small VM one process does not reach the disk's IOPS; the one-process figure
   and the prediction it gives are printed too.)
3. Predict, before the run: each rank's training batches are sampled as the runtime samples them
   (`sample_trace`); `moment.runtime.ssd_model.TierModel` finds the rows that miss the GPU stand-ins
   (the rank's own and, through the peer tier, the other ranks') and the CPU cache of the run plan the
   ranks will resolve (`preview_plan`) and plans the reads `Reader` would issue for them (`Shape.plan`,
   the run's I/O shape); nothing is read. The time of a batch's reads alone is  requests / IOPS + (bytes
   beyond the first `align` bytes of each request) / seq rate, and the ranks, which step together, share
   the disk fairly: rank r's reads at a step take sum_j min(c_j, c_r) (ssd_model's docstring).
   predicted_ssd_s = the sum over steps and epochs of that, averaged over ranks.
4. Measure: `python -m moment.train` under torchrun (`--nproc` CPU ranks, `--no-pipeline` so no stage
   hides another, `--io-shape rows` by default), every file of the dataset and layout dropped from the
   page cache first. measured_ssd_s = the gather stage (gather_submit + gather_wait, averaged over
   ranks, all epochs): the runtime times no pure SSD stage, so the gather time, which also holds the
   store's lookups and copies, stands for it; the settings (sparse misses of 512-B rows, a tenth of
   the rows cached) make the reads dominate it.
5. Check the reads themselves: the run's `ssd_bytes_read` / `ssd_requests` (training and the
   per-epoch evaluation, all ranks) against the predicted ones (`reads_match`).

A disturbed probe is refused, not reported (`moment.io.quiet`): the probe is taken in rounds, and it
is disturbed when other processes kept more than a quarter of a core busy meanwhile, when its rounds
spread by more than 10%, or when it is more than 15% slower than the last quiet probe of the same disk and
settings (kept in the cache dir, `probe-quiet.json`). It is retried `--probe-tries` times; if every
try was disturbed the bench prints why and exits 3 without running. The run is judged the same way
(other processes' CPU during it): `run_disturbed` says so beside the ratio.

Prints `name: value` lines, last `probe_disturbed`, `run_disturbed`, `predicted_ssd_s`, `measured_ssd_s`,
`ratio` (predicted / measured; the target is within 15%). Exit 0 only when the run finished on a quiet
probe.

    python bench/fidelity.py [--nodes 8000000] [--epochs 2] [--nproc 2] [--io-shape rows|block]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


def _reader(path: str, file_bytes: int, block: int, depth: int, reads: int, seed: int, barrier, q) -> None:
    """One of `probe_concurrent`'s processes: `reads` random `block`-byte reads, as probe_ssd makes them."""
    from moment.io.buffers import aligned_buffer
    from moment.io.probe import _run
    from moment.io.requests import ReadBatch
    from moment.io.stack import IOStack

    ro = np.random.default_rng(seed).integers(0, file_bytes // block, reads, dtype=np.int64) * block
    rnd = [ReadBatch.packed(np.zeros(len(o), np.int32), o, np.full(len(o), block))
           for o in np.array_split(ro, max(1, reads // (depth // 2)))]
    bufs = [aligned_buffer(max(b.dest_size for b in rnd)) for _ in range(2)]
    with IOStack([path], queue_depth=depth, threads=depth) as stack:
        barrier.wait()
        t0 = time.time()
        _run(stack, rnd, bufs)
        q.put((t0, time.time(), reads))


def probe_concurrent(path: str, file_bytes: int, block: int, depth: int, procs: int, *, reads: int = 40_000,
                     repeats: int = 3) -> list[float]:
    """Random-read IOPS of the disk with `procs` processes reading at once (each as `probe_ssd` reads:
    its own IOStack, `depth` in flight): all their reads / the time from the first start to the last
    end, each of `repeats` rounds. The ranks of a run read the disk this way."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = []
    for k in range(repeats):
        barrier, q = ctx.Barrier(procs), ctx.Queue()
        ps = [ctx.Process(target=_reader, args=(path, file_bytes, block, depth, reads, 100 * k + i, barrier, q))
              for i in range(procs)]
        for pr in ps:
            pr.start()
        res = [q.get(timeout=300) for _ in ps]
        for pr in ps:
            pr.join()
        out.append(sum(r[2] for r in res) / (max(r[1] for r in res) - min(r[0] for r in res)))
    return out


def probe_rounds(a, align: int, earlier: dict | None):
    """One probe of the cache dir's disk in three rounds (sequential GB/s and one process's IOPS, then the
    IOPS of `a.nproc` processes), judged by `moment.io.quiet`: (figures, verdict)."""
    from moment.io.probe import probe_ssd
    from moment.io.quiet import judge, median, others_cores, snapshot

    before = snapshot()
    rounds = [probe_ssd(a.cache_dir, file_bytes=a.probe_mib << 20, rand_block=align, queue_depth=a.queue_depth,
                        keep=True, repeats=1) for _ in range(3)]
    pr = rounds[0]
    shared = probe_concurrent(pr.path, pr.file_bytes, align, a.queue_depth, a.nproc)
    Path(pr.path).unlink()
    after = snapshot()
    got = {"seq_GBps": [r.seq_read_gbps for r in rounds], "iops_one_process": [r.rand_read_iops for r in rounds],
           f"iops_{a.nproc}_processes": shared}
    verdict = judge(got, others_cores(before, after), quiet=earlier)
    figures = {k: median(v) for k, v in got.items()}
    return pr, figures, got, verdict


def _quiet_key(a, align: int) -> str:
    return f"{a.probe_mib}MiB/align{align}/qd{a.queue_depth}/nproc{a.nproc}"


def predict(ds, layout, plan, disks: dict, a) -> dict:
    """Predicted reads of the run's training gathers (and its evaluation reads), and their seconds on
    each of `disks` (name -> Disk): `seconds` (ranks sharing the disk) and `alone` per name. `layout`:
    the opened layout; `plan`: the run plan the ranks will resolve (`preview_plan`)."""
    from moment.runtime.hostcache import shm_room
    from moment.runtime.run_plan import node_ranks
    from moment.runtime.ssd_model import TierModel, shared
    from moment.workload.trace import sample_eval_trace, sample_trace

    f = [int(x) for x in a.fanouts.split(",")]
    t = plan.tiers
    # what the machine allows: the store falls back to per-rank caches without /dev/shm room (the peer
    # tier's exchange needs none)
    shared_cache = t.shared_cache and not shm_room(t.cpu_rows * ds.row_bytes)
    peers = t.peer_tier
    costs, out = {k: [] for k in disks}, {"bytes": 0, "requests": 0, "eval_bytes": 0, "eval_requests": 0, "ssd_rows": 0}
    for r in range(a.nproc):
        mine = plan.store_plan(r)
        mine = mine.model_copy(update={"tiers": t.model_copy(update={"shared_cache": shared_cache})})
        others = [p for p in node_ranks(plan, r) if p.rank != r] if peers else []
        tm = TierModel(layout, mine, peers=others)
        tr = sample_trace(ds, f, a.batch_size, seed=0, epochs=a.epochs, rank=r, world_size=a.nproc)
        mine = {k: [] for k in disks}
        for b in tr.batches():
            p = tm.batch_plan(b)
            out["bytes"] += p.bytes
            out["requests"] += len(p)
            out["ssd_rows"] += int(p.row_run.shape[0])
            for k, d in disks.items():
                mine[k].append(d.seconds(p))
        for k in disks:
            costs[k].append(mine[k])
        ev = sample_eval_trace(ds, f, a.batch_size, seed=0, epochs=a.epochs, rank=r, world_size=a.nproc)
        for b in ev.batches():  # the validation batches the run reads after each epoch
            p = tm.batch_plan(b)
            out["eval_bytes"] += p.bytes
            out["eval_requests"] += len(p)
        del tm
    out["seconds"], out["alone"] = {}, {}
    for k in disks:
        steps = np.array(costs[k]).T  # [step, rank]
        out["seconds"][k] = float(sum(np.mean(shared(c)) for c in steps))
        out["alone"][k] = float(steps.sum(0).mean())  # each rank's reads as if it had the disk to itself
    out["shared_cache"] = shared_cache
    return out


def main() -> int:
    from moment.runtime.config import TrainConfig
    from moment.runtime.ssd_model import Disk
    from moment.placement.opened import Layout
    from moment.runtime.sizing import preview_plan
    from moment.workload.graph import GraphDataset

    import epoch as ep

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ep.workload_args(p)
    p.add_argument("--io-shape", default="rows", choices=["rows", "block"])
    p.add_argument("--cpu-cache-limit", default="10%")
    p.add_argument("--queue-depth", type=int, default=128, help="the run's and the probe's")
    p.add_argument("--probe-mib", type=int, default=1024, help="size of the probe's scratch file")
    p.add_argument("--probe-tries", type=int, default=3, help="probes before a disturbed one is refused")
    p.add_argument("--forget-quiet-probe", action="store_true",
                   help="do not compare with the last quiet probe (the disk or its settings changed)")
    p.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "MOMENT_BENCH_CACHE", Path.home() / ".cache" / "moment-bench")))
    a = p.parse_args()
    if a.probe_tries < 1:
        p.error("--probe-tries must be at least 1")
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    ds_dir, layout = ep.build(a.cache_dir, a)
    ds = GraphDataset.open(ds_dir)
    opened = Layout.open(layout)
    align = opened.manifest.row.align
    feature_bytes = ds.num_nodes * ds.row_bytes
    print(f"nodes: {ds.num_nodes}\nfeature_MiB: {feature_bytes / 2**20:.0f}\nrow_bytes: {ds.row_bytes}\nalign: {align}")
    print(f"ranks: {a.nproc}\nepochs: {a.epochs}\nio_shape: {a.io_shape}\ncpu_cache_limit: {a.cpu_cache_limit}",
          flush=True)

    import json

    from moment.io.quiet import judge, others_cores, snapshot
    from moment.outputs import atomic_write

    t = time.perf_counter()
    quiet_file, key = a.cache_dir / "probe-quiet.json", _quiet_key(a, align)
    known = json.loads(quiet_file.read_text()) if quiet_file.exists() else {}
    earlier = None if a.forget_quiet_probe else known.get(key)
    for attempt in range(1, a.probe_tries + 1):
        pr, fig, got, verdict = probe_rounds(a, align, earlier)
        print(f"probe_try_{attempt}: " + ", ".join(f"{k} {' '.join(f'{x:.4g}' for x in v)}" for k, v in got.items())
              + (f"; others' CPU {verdict.others_cores:.2f} cores" if verdict.others_cores is not None else ""),
              flush=True)
        if not verdict.disturbed:
            break
        print(f"probe_try_{attempt}_disturbed: {verdict.line()}", flush=True)
    if verdict.disturbed:
        print(f"probe_disturbed: {verdict.line()}")
        print("refused: every probe was disturbed, so no prediction is made from it; run again on a quiet machine "
              "(or --forget-quiet-probe if the disk itself changed)")
        return 3
    print("probe_disturbed: no" + (" (matches the earlier quiet probe)" if earlier else " (no earlier quiet probe)"))
    atomic_write(quiet_file, json.dumps({**known, key: fig}, indent=1) + "\n", "probe-quiet.json")
    iops = fig[f"iops_{a.nproc}_processes"]
    disks = {"shared": Disk(fig["seq_GBps"] * 1e9, iops, align),
             "one_stream": Disk(fig["seq_GBps"] * 1e9, fig["iops_one_process"], align)}
    print(f"probe_s: {time.perf_counter() - t:.1f}\nprobe_backend: {pr.backend}\nprobe_direct: {pr.direct}")
    print(f"probed_seq_GBps: {fig['seq_GBps']:.3f}\nprobed_iops_one_process: {fig['iops_one_process']:.0f}  "
          f"({align}-B reads, queue depth {pr.queue_depth})")
    print(f"probed_iops_{a.nproc}_processes: {iops:.0f}  (all processes' reads together)", flush=True)

    f = [int(x) for x in a.fanouts.split(",")]
    cfg = TrainConfig(layout=layout, dataset=ds_dir, fanouts=f, batch_size=a.batch_size, hidden=a.hidden,
                      io_shape=a.io_shape, cpu_cache_limit=a.cpu_cache_limit, epochs=a.epochs)
    plan = preview_plan(cfg, ds, a.nproc, layout=opened)
    t = time.perf_counter()
    pred = predict(ds, opened, plan, disks, a)
    print(f"predict_s: {time.perf_counter() - t:.1f}")
    print(f"cpu_cache_rows: {plan.tiers.cpu_rows}{' (shared)' if pred['shared_cache'] else ' (per rank)'}\n"
          f"gpu_stand_in_rows_per_rank: {plan.memory.gpu_rows}")
    print(f"predicted_ssd_rows: {pred['ssd_rows']}\npredicted_ssd_MB: {pred['bytes'] / 1e6:.1f}\n"
          f"predicted_ssd_requests: {pred['requests']}")
    print(f"predicted_ssd_s_alone: {pred['alone']['shared']:.2f}  (per rank, as if it had the disk to itself)")
    print(f"predicted_ssd_s_one_process_probe: {pred['seconds']['one_stream']:.2f}  (the disk's IOPS taken "
          "from the one-process probe)", flush=True)

    args = ["--layout", str(layout), "--dataset", str(ds_dir), "--epochs", str(a.epochs), "--fanouts", a.fanouts,
            "--hidden", str(a.hidden), "--batch-size", str(a.batch_size), "--io-shape", a.io_shape,
            "--cache-policy", "static", "--cpu-cache-limit", a.cpu_cache_limit, "--queue-depth",
            str(a.queue_depth), "--no-pipeline", "--device", "cpu"]
    before = snapshot()
    m = ep.run("fidelity", a.nproc, args, a.cache_dir / "fidelity.json", cold=[ds_dir, layout], bound=None)
    run_verdict = judge({}, others_cores(before, snapshot()))
    if not m:
        return 1
    st = m["stage_seconds"]
    measured = st["gather_submit"] + st["gather_wait"]
    want_b, want_r = pred["bytes"] + pred["eval_bytes"], pred["requests"] + pred["eval_requests"]
    print(f"run_process_s: {m['process_s']:.1f}\nrun_epoch_s_each: {', '.join(f'{x:.2f}' for x in m['epoch_seconds'])}")
    for k, v in st.items():
        print(f"run_stage_{k}_s: {v:.2f}")
    print(f"run_ssd_MB_incl_eval: {m['ssd_bytes_read'] / 1e6:.1f}  (predicted {want_b / 1e6:.1f})")
    print(f"run_ssd_requests_incl_eval: {m['ssd_requests']}  (predicted {want_r})")
    print(f"reads_match: {m['ssd_bytes_read'] == want_b and m['ssd_requests'] == want_r}")
    print(f"probed_seq_GBps: {fig['seq_GBps']:.3f}\nprobed_iops: {iops:.0f}")
    print("probe_disturbed: no")
    print(f"run_disturbed: {run_verdict.line()}"
          + (f"  (others' CPU {run_verdict.others_cores:.2f} cores)" if run_verdict.others_cores is not None else ""))
    print(f"ssd_bytes: {pred['bytes']}\nssd_requests: {pred['requests']}")
    sec = pred["seconds"]["shared"]
    print(f"predicted_ssd_s: {sec:.2f}\nmeasured_ssd_s: {measured:.2f}\nratio: {sec / measured:.3f}"
          + ("  (the run was disturbed: not a figure of the model)" if run_verdict.disturbed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
