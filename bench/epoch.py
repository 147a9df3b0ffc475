"""Epoch time of Moment's runtime vs the plain out-of-core baseline, same model, same batches, same script.

* moment:   `python -m moment.train` over a DDAK layout (GPU bins 1% of the nodes each, CPU cache 10%
            of the features, 2 SSD bins, rows aligned to `--align`), O_DIRECT reads through each rank's
            I/O stack, pipelined.
* baseline: the same model trained from a numpy memmap of features.npy indexed per batch, one stage
            after the other (what PyG code does when features do not fit in memory), advised
            MADV_RANDOM by default: under the bound, the kernel's mmap read-around (read_ahead_kb, 8 MiB
            on some VMs) makes a plain memmap re-read gigabytes per batch (>460 GB per rank in 13 min
            without finishing an epoch, measured here), which would flatter Moment; `--baseline-readahead`
            runs that plain memmap anyway.

"Features do not fit" is made true for both, the same way: each run (torchrun and its ranks) lives in
its own cgroup v1 memory cgroup limited to the processes' working set + 10% of the feature bytes
(page cache is charged to the cgroup in v1, so the memmap cannot keep the file cached). The working
set is measured first: peak anonymous + mapped-file memory of a Moment run with no feature cache at
all (`--cpu-cache-limit 0`, O_DIRECT), one epoch. Every file of the dataset and layout is dropped from
the page cache (POSIX_FADV_DONTNEED) before each run, so neither starts warm. Without a usable memory
cgroup (not root, cgroup v2, no memory controller) the bench says so and falls back to an emulation:
the baseline memmap is advised MADV_RANDOM and its pages are dropped before every batch.

Both run under torchrun with `--nproc` ranks on CPU (gloo). The graph (default 2M nodes, 128-d float32
features) and the layout are generated into `--cache-dir` once. Prints `name: value` lines.

    python bench/epoch.py [--nodes 2000000] [--dim 128] [--epochs 2] [--nproc 2] [--cache-dir DIR]
                          [--memory-bound BYTES|auto|none]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from moment.cli.train_cmds import torchrun_command


MERGE_GAP = 0  # adjacent rows already merge (and the block layer merges touching requests); gaps cost bandwidth
SLACK = 32 << 20
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
# The launcher: joins the cgroup (its pid into cgroup.procs), then becomes torchrun; children inherit it.
_JOIN_AND_EXEC = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); os.execv(sys.argv[2], sys.argv[2:])"


class MemoryBound:
    """A cgroup v1 memory cgroup for one run; `limit` None only measures (no bound)."""

    def __init__(self, name: str, limit: int | None):
        self.path = CGROUP_MEMORY / f"moment-bench-{name}-{os.getpid()}"
        self.path.mkdir()
        try:
            if limit is not None:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
        except OSError:
            self.close()
            raise
        self.peak_ws = self.peak_rss = 0

    def wrap(self, cmd: list[str]) -> list[str]:
        return [sys.executable, "-c", _JOIN_AND_EXEC, str(self.path / "cgroup.procs"), *cmd]

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def sample(self) -> None:
        """Track the working set: anonymous memory + mapped file pages (not the unmapped page cache)."""
        st = dict(line.split() for line in self._read("memory.stat").splitlines())
        self.peak_ws = max(self.peak_ws, int(st["total_rss"]) + int(st["total_mapped_file"]))
        self.peak_rss = max(self.peak_rss, int(st["total_rss"]))

    def peak_usage(self) -> int:
        return int(self._read("memory.max_usage_in_bytes"))

    def failcnt(self) -> int:
        return int(self._read("memory.failcnt"))

    def close(self) -> None:
        for _ in range(100):  # the last rank may still be exiting
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        print(f"warning: could not remove {self.path}", file=sys.stderr)


def cgroup_problem() -> str:
    """Why a cgroup v1 memory bound cannot be set here ("" when it can)."""
    if not (CGROUP_MEMORY / "memory.limit_in_bytes").is_file():
        return f"no cgroup v1 memory controller at {CGROUP_MEMORY}"
    try:
        MemoryBound("probe", 1 << 40).close()
    except OSError as e:
        return f"cannot create a memory cgroup in {CGROUP_MEMORY}: {e.strerror}"
    return ""


def drop_files(*dirs: Path) -> None:
    """POSIX_FADV_DONTNEED every file under `dirs`: the next run starts with nothing cached."""
    for d in dirs:
        for f in d.rglob("*"):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


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


def run(name: str, nproc: int, args: list[str], out: Path, *, cold: list[Path], bound: int | None = None,
        cgroup: bool = True) -> dict:
    """One torchrun, started cold, in its own memory cgroup (limited to `bound` bytes when given)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
    cmd = torchrun_command(nproc, [*args, "--metrics-json", str(out), "--quiet"])
    drop_files(*cold)
    cg = MemoryBound(name, bound) if cgroup else None
    try:
        t = time.perf_counter()
        logs = out.with_suffix(".log")
        with open(logs, "w") as log:
            proc = subprocess.Popen(cg.wrap(cmd) if cg else cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                while proc.poll() is None:
                    if cg:
                        cg.sample()
                    time.sleep(0.02)
            finally:
                if proc.poll() is None:  # interrupted: take torchrun and its ranks down before the rmdir
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if proc.returncode:
            sys.stderr.write(logs.read_text()[-12000:])
            oom = " (memory bound too tight: OOM?)" if proc.returncode in (-9, 137) or "Signals.SIGKILL" in \
                logs.read_text() else ""
            raise SystemExit(f"{name} run failed ({proc.returncode}){oom}")
        m = json.loads(out.read_text())
        m["process_s"] = time.perf_counter() - t
        if cg:
            m["cgroup"] = {"working_set": cg.peak_ws, "peak_rss": cg.peak_rss, "peak_usage": cg.peak_usage(), "failcnt": cg.failcnt()}
        return m
    finally:
        if cg:
            cg.close()


def report(prefix: str, m: dict) -> None:
    ep = m["epoch_seconds"]
    if "cgroup" in m:
        print(f"{prefix}_cgroup_peak_MiB: {m['cgroup']['peak_usage'] / 2**20:.0f}")
        print(f"{prefix}_cgroup_limit_hits: {m['cgroup']['failcnt']}")
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


def memory_bound(a, nproc: int, args: list[str], feature_bytes: int, cold: list[Path], name: str,
                 features_mapped: bool) -> tuple[int | None, str]:
    """The bound of one system's run: its own measured working set + 10% of the feature bytes.

    Working set: peak memory of a 1-epoch unbounded run of the same system with no feature cache to
    speak of — anonymous memory plus mapped files, less the features themselves where they are mapped
    (the memmap baseline), i.e. total_rss; for Moment (`--cpu-cache-limit 0`, O_DIRECT) the layout's
    index and peer-GPU rows, which are mapped files, count too.
    """
    if a.memory_bound == "none":
        return None, "none (--memory-bound none)"
    why = cgroup_problem()
    if why:
        return None, f"none ({why}); baseline emulates it: MADV_RANDOM + drop its pages before every batch"
    cache = feature_bytes // 10
    if a.memory_bound != "auto":
        from moment.runtime.store import parse_size

        b = parse_size(a.memory_bound, feature_bytes)
        return b, f"{b / 2**20:.0f} MiB (given)"
    m = run(f"calibrate-{name}", nproc, [*args, "--epochs", "1"], a.cache_dir / f"calibrate-{name}.json",
            cold=cold)
    c = m["cgroup"]
    ws = (c["peak_rss"] if features_mapped else c["working_set"]) + SLACK
    print(f"{name}_working_set_MiB: {ws / 2**20:.0f}  (peak {'anon' if features_mapped else 'anon + mapped-file'} "
          f"memory of {nproc} ranks + torchrun in a 1-epoch run without feature cache, + {SLACK >> 20} MiB "
          "for the 20 ms sampling)")
    return ws + cache, (f"{(ws + cache) / 2**20:.0f} MiB (cgroup v1 memory.limit_in_bytes = {name} working set "
                        f"+ {cache / 2**20:.0f} MiB = 10% of {feature_bytes / 2**20:.0f} MiB of features)")


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
    p.add_argument("--align", type=int, help="layout row alignment (default: the logical block size of the "
                                             "disk holding --cache-dir, as the layout writer picks it)")
    p.add_argument("--merge-gap", type=int, default=MERGE_GAP, help="Moment: --io-merge-gap (bytes)")
    p.add_argument("--memory-bound", default="auto",
                   help="auto (working set + 10%% of the features, measured), none, or bytes (e.g. 1.5GiB)")
    p.add_argument("--moment-args", default="", help="extra flags for the Moment run, e.g. '--queue-depth 256'")
    p.add_argument("--baseline-readahead", action="store_true",
                   help="baseline: plain memmap with the kernel's read-around (no MADV_RANDOM)")
    p.add_argument("--skip-baseline", action="store_true")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up (cgroup rmdir) on kill
    fanouts = [int(x) for x in a.fanouts.split(",")]
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    if a.align is None:
        from moment.placement.layout import block_size

        a.align = block_size(a.cache_dir)
    ds_dir, layout = build(a.cache_dir, a.nodes, a.dim, fanouts, a.batch_size, a.align)
    cold = [ds_dir, layout]
    feature_bytes = int(np.load(ds_dir / "features.npy", mmap_mode="r").nbytes)
    common = ["--dataset", str(ds_dir), "--epochs", str(a.epochs), "--fanouts", a.fanouts, "--hidden", str(a.hidden)]
    if a.batch_size:
        common += ["--batch-size", str(a.batch_size)]
    print(f"nodes: {a.nodes}\nfeature_dim: {a.dim}\nranks: {a.nproc}\nepochs: {a.epochs}\nfanouts: {a.fanouts}")
    print(f"align: {a.align}\nmerge_gap: {a.merge_gap}")
    moment_args = ["--layout", str(layout), "--io-merge-gap", str(a.merge_gap), *a.moment_args.split(), *common]
    bound, how = memory_bound(a, a.nproc, [*moment_args, "--cpu-cache-limit", "0"], feature_bytes, cold, "moment",
                              False)
    print(f"moment_memory_bound: {how}")
    use_cg = bound is not None
    mo = run("moment", a.nproc, moment_args, a.cache_dir / "moment.json", cold=cold, bound=bound, cgroup=use_cg)
    print(f"batch_size_per_rank: {mo['batch_size']}\nio_backend: {mo['backend']}")
    report("moment", mo)
    m_ep = sum(mo["epoch_seconds"]) / len(mo["epoch_seconds"])
    print(f"moment_epoch_s: {m_ep:.2f}")
    if a.skip_baseline:
        return
    emulate = [] if use_cg or a.memory_bound == "none" else ["--drop-page-cache", "batch"]
    if not a.baseline_readahead:
        emulate.append("--memmap-random")
    print(f"baseline_mode: memmap{'' if a.baseline_readahead else ' + MADV_RANDOM'}"
          f"{' + drop pages every batch (emulated bound)' if '--drop-page-cache' in emulate else ''}")
    bl_args = ["--features-memmap", "--drop-page-cache", "--no-pipeline", *emulate, *common]
    if use_cg and a.memory_bound == "auto":
        bound, how = memory_bound(a, a.nproc, bl_args, feature_bytes, cold, "baseline", True)
        print(f"baseline_memory_bound: {how}")
    bl = run("baseline", a.nproc, bl_args, a.cache_dir / "baseline.json", cold=cold, bound=bound, cgroup=use_cg)
    report("baseline", bl)
    b_ep = sum(bl["epoch_seconds"]) / len(bl["epoch_seconds"])
    print(f"baseline_epoch_s: {b_ep:.2f}")
    print(f"speedup: {b_ep / m_ep:.2f}")
    print(f"same_loss_curve: {mo['loss_curve'] == bl['loss_curve']}")


if __name__ == "__main__":
    main()
