"""Out-of-core epoch time: Moment's runtime vs the plain memmap path, one memory bound for everyone.

Every system runs under torchrun with `--nproc` CPU ranks (gloo), the same model, seeds and batches,
each in its own cgroup v1 memory cgroup with the *same* limit (`--memory-bound`, default 3 GiB for the
default 8M x 128 float32 = 3.8 GiB of features), started cold: every file of the dataset and layout is
dropped from the page cache first (POSIX_FADV_DONTNEED), and cgroup v1 charges page cache to the
cgroup, so no system can keep the features in memory the bound does not give it.

* moment            `python -m moment.train --memory-budget auto` (the budget is the cgroup's limit
                    less a margin) with its default cache policy and I/O shape (auto: packed, since
                    the DiskGNN pack for these batches is written first, of the kind `moment data pack`
                    picks on this machine (`--pack auto`): with no GPU driver whole, as `moment data pack
                    --whole` writes it, each batch then read straight into its own buffer, no row copied,
                    for about twice the disk reads; else (or `--pack fit`) as `moment data pack
                    --memory-budget` writes it, leaving out the rows the run's CPU cache will hold; the
                    pack's time and disk cost print, the time is not part of an epoch);
* moment-<variant>  the same with another policy or shape (`--variants`, e.g. rows, lru, belady);
* baseline          what a PyG user whose features do not fit in memory runs: features from a numpy
                    memmap of features.npy indexed per batch inside a torch DataLoader whose worker
                    processes (`--loader-workers`, 4 per rank) sample and read while the rank trains, so
                    several page faults are in flight; with MADV_RANDOM and with the kernel's readahead
                    on, each cold, and the faster of the two is the baseline (the second is stopped once
                    it has taken 1.1x the first's whole run; `--baseline-readahead on|off` runs one). Each
                    is stopped after `--baseline-cap` seconds (default 1200), and if none finished,
                    `speedup_at_least` is the whole runs' ratio reached, the cap over Moment's whole run
                    (16M x 256 under 5 GiB: the first setting was still running after 47 min, reading
                    2 MB/s at the end).
                    `--baseline serial` is the older baseline: the stages one after the other in the
                    rank. `baseline_mode` names the one compared with.
* memory_*          the limit: the same training with every feature in memory, no bound, the dataset warm
                    in the page cache: Moment's pipeline with --features-in-memory (a copy per rank, when
                    memory holds them) and with --features-memmap (one page-cache copy for all ranks), and
                    the worker baseline; the fastest, steady state (epochs 2..N), is `in_memory_epoch_s`,
                    and `limit_ratio` = Moment's out-of-core steady epoch / it (`--skip-limit`: none). They
                    run right after Moment's runs, before the baseline's minutes: the two sides of the
                    ratio are measured as close together as they can be on a machine whose speed drifts.
* data_only_*       with `--data-only`, then the feed rate: Moment, the faster baseline and the fastest
                    in-memory run again without the model step (`moment train --data-only`), the features
                    cold and the graph warm: seeds/s and SSD bytes/s (Moment's own count; the baseline's,
                    what its processes read from disk), and the disk's limit for the same reads in the same
                    run: Moment's own reads in its epochs, recorded with `--io-trace` (the CPU cache's fill
                    at start is logged apart and not replayed), replayed by fio in order as fast as
                    it can, one job per rank at its queue depth (`data_only_ssd_over_fio`), right after
                    the run, and right before it too (`data_only_ssd_over_fio_bracketed_steady`: the
                    steady rate over the mean of both, the disk's drift on either side): Moment's run is
                    repeated `--feed-rounds` times (default 3), each cold, each replay after a round the
                    one before the next (the same reads: its seeds fix them), the first round's the reads
                    an earlier run of the same command kept; these ratios are the medians over the
                    rounds, printed with each round's, every other line the first round's; after each
                    round fio also replays at the reads the run's readers hold in flight (their windows'
                    bytes over the mean read: 32 per rank for a pack's 1 MiB reads), not the queue depth
                    (`data_only_ssd_over_fio_in_flight_steady`); beside it, each
                    size class of its reads (`ssd_request_sizes`) read alone by fio at random offsets of
                    the same files, combined by bytes (`data_only_ssd_over_fio_random`: no merging of
                    neighbouring reads by the block layer, so a different load); `data_only_seeds_ratio`:
                    Moment's seeds/s over the baseline's; `data_only_cpu_ratio`: Moment's CPU per steady
                    epoch over the in-memory run's.

Prints `name: value` lines: per system its epoch seconds (each epoch), SSD bytes read, CPU-cache hit
rate (with the cache simulator's prediction for Moment's policy), per-stage seconds (a loader baseline's
sample and gather seconds are its workers' summed), cgroup peak and limit hits; then `speedup` = baseline
epoch s / Moment default epoch s, last. Each size's runs sit between two disk checks, of 1 MiB reads and of
random 4 KiB ones (`disk_MB_per_s_at_start`, `disk_4k_iops_at_start`, `_at_end`; `disk_slowed` when an end's
figure is under half the start's; a slowdown between the two shows only in the fio lines). `--sizes` runs
several graph sizes (nodes, and a feature width when not --dim), each with its own bound, one after the other
(a `size:` line starts each block); each block ends with `speedup_NODES[xDIM]` (and `limit_ratio_...`, the
data-only ratios), and the run with every one of them again and the worst of each (`speedup`, the smallest;
`limit_ratio`, the largest).
Before anything is built, every bounded size is checked against the least bound Moment's runtime accepts
for it (its own budget rule, on the graph alone: `size_check_` lines); a size below it is
refused, naming a size that runs. Exit 0 only when every system finished.
The datasets and layouts are generated into `--cache-dir` once and reused.

    python bench/epoch.py [--nodes 8000000] [--dim 128] [--memory-bound 3GiB] [--epochs 3] [--nproc 2]
                          [--variants rows,lru,belady] [--baseline loader|serial] [--loader-workers 4]
                          [--baseline-readahead auto|on|off] [--baseline-cap 1200] [--skip-baseline] [--skip-limit]
                          [--data-only]
    python bench/epoch.py --sizes 8000000:3GiB,16000000x256:5GiB --data-only  # features 1.2x, 3.05x their bounds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared helpers

from probe_fio import ENGINES, FIO_HUGE, huge_pages  # noqa: E402

from moment.cli.train_cmds import torchrun_command  # noqa: E402
from moment.errors import MomentError  # noqa: E402
from moment.io.trace import rank_trace  # noqa: E402
from moment.runtime.gather import INFLIGHT, WINDOW  # noqa: E402
from moment.runtime.sizing import start_env  # noqa: E402

CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
# The launcher: joins the cgroup (its pid into cgroup.procs), then becomes torchrun; children inherit it.
_JOIN_AND_EXEC = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); os.execv(sys.argv[2], sys.argv[2:])"
VARIANTS = {
    "rows": ["--io-shape", "rows"],
    "block": ["--io-shape", "block"],
    "static": ["--cache-policy", "static"],
    "lru": ["--cache-policy", "lru"],
    "belady": ["--cache-policy", "belady-superbatch"],
    "packed": ["--io-shape", "packed"],
}
READAHEAD = ("auto", "on", "off")
DEFAULT = ["--cache-policy", "static"]  # --io-shape auto: packed, as the pack is written first
GPU_BINS, GPU_ROWS_DIV = 2, 200  # the layout's GPU bins, each of nodes // GPU_ROWS_DIV rows (see build)
TARGET_RATIO = 3.0  # a second size's features over its bound, at least: a size the bound cannot hide
WARM_CHUNK = 8 << 20
IN_MEMORY_SHARE = 0.8  # of available memory, at most, that the in-memory runs' copies of the features take
FIO_SECONDS = 4  # per request size of the mix
MIX_SHARE = 0.005  # a request size class of the mix is read by fio when it has this share of requests or bytes
STAMP = "command.json"  # beside kept traces: the command that read them and its queue depth
# the summary figures, each with the worst of the sizes' (lower is worse for a speedup, higher for a ratio to a limit)
SUMMARY = [("speedup", min, ".2f", "the smallest"), ("speedup_at_least", min, ".1f", "the smallest"),
           ("limit_ratio", max, ".3f", "the largest"),
           ("data_only_seeds_ratio", min, ".2f", "the smallest"), ("data_only_limit_ratio", max, ".3f", "the largest"),
           ("data_only_ssd_over_fio", min, ".3f", "the smallest"),
           ("data_only_ssd_over_fio_steady", min, ".3f", "the smallest"),
           ("data_only_ssd_over_fio_bracketed_steady", min, ".3f", "the smallest"),
           ("data_only_ssd_over_fio_in_flight_steady", min, ".3f", "the smallest"),
           ("data_only_cpu_ceiling_over_fio", min, ".3f", "the smallest")]


class MemoryBound:
    """A cgroup v1 memory cgroup for one run."""

    def __init__(self, name: str, limit: int):
        self.path = CGROUP_MEMORY / f"moment-bench-{name}-{os.getpid()}"
        self.path.mkdir()
        try:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
        except OSError:
            self.close()
            raise

    def wrap(self, cmd: list[str]) -> list[str]:
        return [sys.executable, "-c", _JOIN_AND_EXEC, str(self.path / "cgroup.procs"), *cmd]

    def read(self, name: str) -> int:
        return int((self.path / name).read_text())

    def reclaim(self) -> dict[str, int]:
        """What the bound took back during the run (memory.stat): pages of files read again after being evicted
        (`workingset_refault_file`: the ranks' own code and mapped graph among them, so every stage slows, not
        only the reads), major faults, and pages charged out."""
        stat = dict(ln.split() for ln in (self.path / "memory.stat").read_text().splitlines())
        return {k: int(stat.get(k, 0)) for k in ("workingset_refault_file", "pgmajfault", "pgpgout")}

    def oom_killed(self) -> bool:
        try:
            return "oom_kill 0" not in (self.path / "memory.oom_control").read_text()
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup: the ranks' DataLoader workers are in their ranks' process
        groups, not torchrun's, so only the cgroup knows them all."""
        try:
            pids = [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()  # normally no one is left; after an interruption, stragglers
        for _ in range(100):  # the last rank may still be exiting
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        print(f"warning: could not remove {self.path}", file=sys.stderr)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def state(pid: int) -> str:
    """The process's state letter (R, S, D, T, Z, ...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie has)."""
    return state(pid) not in ("", "Z", "X")


def _until(done, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)


def kill_tree(pid: int, wait_s: float = 30.0) -> None:
    """SIGKILL `pid` and every process below it (torchrun's ranks and their DataLoader workers each lead
    their own process group, so killing torchrun's group alone would leave them running), and return
    once they have exited. Each is stopped first, top down, until a look at the tree, taken once every
    process in it has stopped, finds no new one: a stopped process starts no child the kill would miss
    (a fork under way when SIGSTOP arrives finishes first, and its child shows up below a parent that is
    still there), and a child whose parent was killed first would no longer be found below `pid`. A
    SIGKILLed process stays in /proc, its command line readable, until the kernel has torn it down
    (milliseconds for a rank that mapped torch): hence the wait for each to exit (or be a zombie)."""
    seen: list[int] = []
    while new := [p for p in descendants(pid) if p not in seen]:
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        seen += new
        _until(lambda pids=tuple(seen): all(state(p) in ("", "T", "t", "Z", "X") for p in pids), wait_s)
    for p in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    _until(lambda: not any(alive(p) for p in seen), wait_s)


def cgroup_problem() -> str:
    """Why a cgroup v1 memory bound cannot be set here ("" when it can)."""
    if not (CGROUP_MEMORY / "memory.limit_in_bytes").is_file():
        return f"no cgroup v1 memory controller at {CGROUP_MEMORY}"
    try:
        MemoryBound("probe", 1 << 40).close()
    except OSError as e:
        return f"cannot create a memory cgroup in {CGROUP_MEMORY}: {e.strerror}"
    return ""


def drop_files(*paths: Path) -> None:
    """POSIX_FADV_DONTNEED every file in `paths` (files, or folders: every file under them): the next run
    starts with nothing of them cached."""
    for d in paths:
        for f in d.rglob("*") if d.is_dir() else [d]:
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def warm_files(*paths: Path) -> None:
    """Read every file in `paths` (files, or folders: every file under them) once: the next run finds
    them in the page cache."""
    for d in paths:
        for f in sorted(d.rglob("*")) if d.is_dir() else [d]:
            if f.is_file():
                with open(f, "rb", buffering=0) as fh:
                    while fh.read(WARM_CHUNK):
                        pass


def bytes_read() -> int:
    """What this process and its reaped descendants have read from disk (the kernel adds a child's count
    to its parent's when the parent reaps it: a finished run's torchrun, ranks and DataLoader workers)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def memory_bytes(field: str = "MemAvailable") -> int:
    """A /proc/meminfo figure, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def synth(out: Path, a, dim: int):
    """The bench's synthetic dataset of a.nodes nodes (its graph does not depend on `dim`)."""
    from moment.workload.synth import synthesize

    return synthesize(out, a.nodes, feature_dim=dim, seed=0, train_fraction=a.train_fraction,
                      val_fraction=a.train_fraction / 5, test_fraction=a.train_fraction / 5, overwrite=True)


def planned_budget(a, dim: int):
    """The fixed needs Moment's runtime charges this bench's run on a.nodes x `dim` (a MemoryBudget whose
    `suggested()` is the least bound it accepts), asked of the runtime's own budget rule
    (run_plan.planned_minimum) before the dataset and layout are built: the batch extent is sampled on
    the graph alone (synthesized with one-wide features, kept in --cache-dir: seconds to a minute where
    the full build takes many). The pack's index is not charged: a bound within a few MiB of the least
    may still be refused once the pack is written."""
    from moment.placement.layout import block_size
    from moment.runtime.config import TrainConfig
    from moment.runtime.devices import default_device
    from moment.runtime.run_plan import planned_minimum
    from moment.runtime.sizing import planned_inputs
    from moment.workload.graph import GraphDataset

    key = (a.nodes, dim, a.nproc, a.batch_size, a.fanouts, a.hidden, a.train_fraction)
    if key not in _PLANNED:
        g = a.cache_dir / f"graph-{a.nodes}-tf{a.train_fraction}"
        ds = GraphDataset.open(g) if (g / "manifest.json").is_file() else synth(g, a, 1)
        cfg = TrainConfig(dataset=g, fanouts=[int(x) for x in a.fanouts.split(",")], batch_size=a.batch_size,
                          hidden=a.hidden, cache_policy="static")
        gpu_rows = -(-GPU_BINS // a.nproc) * (a.nodes // GPU_ROWS_DIV)  # one rank's bins
        inputs = planned_inputs(cfg, ds, a.nproc, feature_dim=dim, gpu_rows=gpu_rows)
        _PLANNED[key] = planned_minimum(cfg, inputs, num_nodes=a.nodes, row_bytes=dim * 4, nproc=a.nproc,
                                        shards=GPU_BINS + 3, gpu_rows=gpu_rows, align=block_size(a.cache_dir),
                                        device=default_device(cfg.device))  # where its ranks run: the peer tier
    return _PLANNED[key]


def minimum_bound(a, dim: int) -> int:
    """The least memory bound Moment's runtime accepts for this bench's run on a.nodes x `dim`, with the
    room its own refusal adds (`planned_budget`)."""
    return planned_budget(a, dim).suggested()


_PLANNED: dict[tuple, object] = {}


def check_feasible(a, nodes: int, dim: int, memory_bound: str) -> None:
    """Refuse, before anything is built, a size whose bound is below what Moment's runtime accepts, naming
    what would run: this size's least bound, and where that leaves the features under TARGET_RATIO x the
    bound, the narrowest wider --dim whose features are that far over a bound the runtime accepts."""
    from moment.runtime.budget import fmt_bytes
    from moment.sizes import parse_size

    if memory_bound == "none":
        return
    a = argparse.Namespace(**{**vars(a), "nodes": nodes})
    feature_bytes = nodes * dim * 4
    bound = parse_size(memory_bound, feature_bytes)
    least, need = planned_budget(a, dim).minimum(), minimum_bound(a, dim)
    print(f"size_check_{nodes}x{dim}: bound {fmt_bytes(bound)}, Moment's least {fmt_bytes(least)}, features "
          f"{feature_bytes / max(bound, 1):.2f}x the bound", flush=True)
    if bound >= least:
        return
    fixes = [f"{nodes}x{dim}:{need // 2**20}MiB (features {feature_bytes / need:.2f}x that bound)"]
    if feature_bytes / need < TARGET_RATIO:
        for wider in (dim * k for k in (2, 3, 4, 6, 8)):
            n2 = minimum_bound(a, wider)
            if nodes * wider * 4 >= TARGET_RATIO * n2:
                fixes.append(f"{nodes}x{wider}:{n2 // 2**20}MiB (features "
                             f"{nodes * wider * 4 / n2:.2f}x that bound)")
                break
    raise MomentError(f"--sizes {nodes}x{dim}:{memory_bound}: a {fmt_bytes(bound)} bound is below the "
                      f"{fmt_bytes(least)} Moment's runtime needs for {nodes} nodes x {dim} features, "
                      f"{a.nproc} ranks, batch {a.batch_size}, fan-outs {a.fanouts} (it would refuse the run "
                      "after the dataset and layout were built)", hint="a size that runs: " + " or ".join(fixes))


def build(cache: Path, a) -> tuple[Path, Path]:
    """Dataset and DDAK layout, made once per parameters and reused."""
    from moment.placement import BinSet, ddak, write_layout
    from moment.placement.layout import block_size
    from moment.workload.graph import GraphDataset
    from moment.workload.hotness import presample

    ds_dir = cache / f"synth-{a.nodes}-{a.dim}"
    if (ds_dir / "manifest.json").is_file():
        ds = GraphDataset.open(ds_dir)
    else:
        t = time.perf_counter()
        ds = synth(ds_dir, a, a.dim)
        print(f"synth_s: {time.perf_counter() - t:.1f}", flush=True)
    align = block_size(cache)
    layout = cache / f"layout-{a.nodes}-{a.dim}-a{align}"
    if not (layout / "manifest.json").is_file() or not (layout / "order.npy").is_file():
        t = time.perf_counter()
        h = presample(ds, [int(x) for x in a.fanouts.split(",")], a.batch_size, seed=1)
        n = ds.num_nodes
        bins = BinSet.uniform(gpus=GPU_BINS, cpus=1, ssds=2, gpu_rows=n // GPU_ROWS_DIV, cpu_rows=n // 10, ssd_rows=n,
                              gpu_share=0.05, cpu_share=0.3)
        asg = ddak(h.feature_reads, bins, pool=100, cache_fill="capacity")
        write_layout(layout, ds.file("features"), asg, align=align,
                     dataset_checksum=ds.manifest.files["features"].sha256, overwrite=True)
        print(f"layout_s: {time.perf_counter() - t:.1f}", flush=True)
    return ds_dir, layout


def run(name: str, nproc: int, args: list[str], out: Path, *, cold: list[Path], bound: int | None,
        deadline: float | None = None, warm: tuple[Path, ...] = ()) -> dict:
    """One torchrun, started with `cold` out of the page cache and `warm` in it, in its own memory cgroup
    limited to `bound` bytes; stopped after `deadline` seconds ({"stopped_after_s": deadline}). Adds
    `disk_bytes_read`: what its processes read from disk (page faults and readahead included)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc))}
    if "--memory-budget" in args:  # as `moment train` starts its ranks: they charge what its preview charged
        env |= start_env()
    cmd = torchrun_command(nproc, [*args, "--metrics-json", str(out), "--quiet"])
    out.unlink(missing_ok=True)
    drop_files(*cold)
    warm_files(*warm)
    cg = MemoryBound(name, bound) if bound is not None else None
    try:
        t, disk = time.perf_counter(), bytes_read()
        logs = out.with_suffix(".log")
        with open(logs, "w") as log:
            proc = subprocess.Popen(cg.wrap(cmd) if cg else cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(deadline)
            except subprocess.TimeoutExpired:
                return {"stopped_after_s": deadline}
            finally:
                if proc.poll() is None:  # interrupted: take torchrun, its ranks and their workers down
                    kill_tree(proc.pid)
                    proc.wait()
        if proc.returncode:
            sys.stderr.write(logs.read_text()[-6000:])
            oom = " (OOM-killed by the memory bound)" if cg and cg.oom_killed() else ""
            print(f"{name}_failed: exit {proc.returncode}{oom}", flush=True)
            return {}
        m = json.loads(out.read_text())
        m["process_s"] = time.perf_counter() - t
        m["disk_bytes_read"] = bytes_read() - disk
        if cg:
            m["cgroup"] = {"peak_usage": cg.read("memory.max_usage_in_bytes"), "failcnt": cg.read("memory.failcnt"),
                           "oom_killed": cg.oom_killed(), **cg.reclaim()}
        return m
    finally:
        if cg:
            cg.close()


DISK_CHECK_BYTES = 256 << 20  # read by each disk check's 1 MiB pass
DISK_CHECK_READS = 8192  # random 4 KiB reads of each disk check's second pass
DISK_SLOWED = 0.5  # a disk check at a size's end below this share of its start's says the disk slowed


def _largest(files: list[Path]) -> Path | None:
    return max((f for f in files if f.is_file()), key=lambda f: f.stat().st_size, default=None)


def _read_seconds(path: Path, offsets: np.ndarray, length: int) -> float:
    """Seconds to read `length` bytes at each of `offsets` of `path` with direct I/O, 32 in flight (batches of 4
    reads, 8 batches in flight, through the runtime's IOStack and the probe's pass)."""
    from moment.io import IOStack, ReadBatch, aligned_buffer
    from moment.io.probe import _run  # the probe's pass: a batch in flight per buffer

    per = 4
    batches = [ReadBatch.packed(np.zeros(len(o), np.int32), o, np.full(len(o), length))
               for o in np.array_split(offsets, -(-len(offsets) // per))]
    bufs = [aligned_buffer(per * length) for _ in range(8)]
    with IOStack([path], queue_depth=32) as stack:
        return _run(stack, batches, bufs)


def disk_rate(files: list[Path], nbytes: int = DISK_CHECK_BYTES) -> float | None:
    """MB/s of one direct-I/O pass of 1 MiB reads (32 in flight) over the first `nbytes` of the largest of
    `files`: a disk that slows mid-bench (this machine's: 8 MB/s after the 16M runs, 626 MB/s four minutes
    later) makes every figure after it suspect, so each size is checked before and after."""
    path = _largest(files)
    n = min(nbytes, path.stat().st_size) >> 20 if path is not None else 0
    if not n:
        return None
    drop_files(path)
    return (n << 20) / _read_seconds(path, np.arange(n, dtype=np.int64) << 20, 1 << 20) / 1e6


def disk_iops(files: list[Path], reads: int = DISK_CHECK_READS, seed: int = 0) -> float | None:
    """Random 4 KiB direct reads per second (32 in flight, seeded offsets) over the largest of `files`: this
    machine's disk can keep its large-read rate while its small reads are throttled (an 8M epoch of small reads
    took 354 s, then 5.7 s minutes later, while 1 MiB reads ran at 566-729 MB/s), and the worker baseline reads
    4 KiB pages, so a check of large reads alone does not see what slows it."""
    path = _largest(files)
    blocks = path.stat().st_size >> 12 if path is not None else 0
    if not blocks:
        return None
    offsets = np.random.default_rng(seed).integers(0, blocks, reads, dtype=np.int64) << 12
    return reads / _read_seconds(path, offsets, 4096)


def check_disk(files: list[Path], when: str, suffix: str, start: tuple[float, float] | None = None
               ) -> tuple[float, float] | None:
    """Print the disk check `when` ("start" or "end"): (MB/s of 1 MiB reads, IOPS of 4 KiB reads); at the end,
    say so when either fell under half the start's."""
    rate, iops = disk_rate(files), disk_iops(files)
    if rate is None or iops is None:
        return None
    print(f"disk_MB_per_s_at_{when}{suffix}: {rate:.0f}  (direct 1 MiB reads, 32 in flight, {DISK_CHECK_BYTES >> 20} "
          "MiB at most of a layout file, cold)", flush=True)
    print(f"disk_4k_iops_at_{when}{suffix}: {iops:.0f}  (direct 4 KiB reads at random offsets, 32 in flight, "
          f"{DISK_CHECK_READS} of them)", flush=True)
    if start:
        slow = [f"{now:.0f} {unit} at the end against {then:.0f} at the start" for now, then, unit
                in ((rate, start[0], "MB/s"), (iops, start[1], "4 KiB reads/s")) if now < DISK_SLOWED * then]
        if slow:
            print(f"disk_slowed{suffix}: {'; '.join(slow)}: the disk slowed during this size's runs, so its figures "
                  "may be the disk's, not the systems'", flush=True)
    return rate, iops


def epoch_s(m: dict) -> float:
    return sum(m["epoch_seconds"]) / len(m["epoch_seconds"])


def steady_s(m: dict) -> float:
    """The mean epoch after the first (its cold start and warm-up excluded); a one-epoch run's only one."""
    return steady(m["epoch_seconds"])


def steady(per_epoch: list[float]) -> float:
    """The mean of a figure per epoch after the first; a one-epoch run's only one."""
    ep = steady_epochs(per_epoch)
    return sum(ep) / len(ep)


def steady_epochs(per_epoch: list) -> list:
    """The epochs after the first (its cold start and warm-up); a one-epoch run's only one."""
    return per_epoch[1:] or per_epoch


class DiskBusy(NamedTuple):
    """A machine's SSD devices over the steady epochs, summed over them."""

    read_bytes: float
    busy_s: float  # device-seconds with a read in flight
    span_s: float  # device-seconds of epochs
    devices: int


def disk_busy(m: dict) -> DiskBusy | None:
    """The first machine's SSD devices over the steady epochs (the first excluded, as `steady`), from the
    kernel's counters (moment.io.diskstats); None where the layout is on no block device or the devices never
    read."""
    disks = (m.get("machines") or [{}])[0].get("disks") or []
    spans = [s for d in disks for s in steady_epochs(d["spans"])]
    read, busy = sum(s[1] for s in spans), sum(s[2] for s in spans)
    return DiskBusy(read, busy, sum(s[3] for s in spans), len(disks)) if read and busy else None


def print_disk_busy(prefix: str, m: dict) -> None:
    if use := disk_busy(m):
        print(f"{prefix}_ssd_busy_share: {use.busy_s / use.span_s:.3f}  (the time its {use.devices} SSD device(s) "
              "were busy, by the kernel's count, over the steady epochs)")
        print(f"{prefix}_ssd_MB_per_s_busy: {use.read_bytes / 1e6 / use.busy_s:.0f}  (their reads, every process's, "
              "while busy: per device)")


def report(prefix: str, m: dict) -> None:
    ep = m["epoch_seconds"]
    print(f"{prefix}_epoch_s: {epoch_s(m):.2f}")
    print(f"{prefix}_epoch_s_each: {', '.join(f'{x:.2f}' for x in ep)}")
    if len(ep) > 1:
        print(f"{prefix}_last_over_first: {ep[-1] / ep[0]:.3f}")
    cpu = m.get("epoch_cpu_seconds") or []
    if cpu and not m.get("loader_workers"):  # a DataLoader worker's CPU is its own process's, not counted there
        print(f"{prefix}_cpu_s_each: {', '.join(f'{x:.2f}' for x in cpu)}  (CPU seconds of every rank per epoch)")
    if "cgroup" in m:
        print(f"{prefix}_cgroup_peak_MiB: {m['cgroup']['peak_usage'] / 2**20:.0f}")
        print(f"{prefix}_cgroup_limit_hits: {m['cgroup']['failcnt']}")
        c = m["cgroup"]
        print(f"{prefix}_cgroup_refaults: {c['workingset_refault_file']}  (file pages read again after eviction; "
              f"major faults {c['pgmajfault']}, pages out {c['pgpgout']})")
    print(f"{prefix}_peak_rss_per_rank_MiB: {m['peak_rss_bytes'] / 2**20:.0f}")
    mem = m.get("memory") or {}
    print(f"{prefix}_memory_measured_peak_MiB: {mem.get('measured_peak_bytes', 0) / 2**20:.0f}  (ranks, agent, shared pages once)")
    if mem.get("predicted_peak_bytes"):
        print(f"{prefix}_memory_predicted_over_measured: "
              f"{mem['predicted_peak_bytes'] / mem['measured_peak_bytes']:.3f}  (the budget split's prediction)")
    for k, v in m["stage_seconds"].items():
        print(f"{prefix}_stage_{k}_s: {v:.2f}")
    print(f"{prefix}_limiting_stage: {m['limiting_stage']}")
    print(f"{prefix}_seeds_per_s: {m['seeds_per_s']:.0f}")
    if m.get("cache_policy"):
        print(f"{prefix}_config: policy {m['cache_policy']}, shape {m['io_shape']}, superbatch {m['superbatch']}")
        items = {it["name"]: it["machine_bytes"] for it in m["memory"]["items"]}
        print(f"{prefix}_cpu_cache_MiB: {items.get('cpu cache', 0) / 2**20:.0f}")
        print(f"{prefix}_read_buffers_MiB: {items.get('read buffers', 0) / 2**20:.0f}")
        heaps = [r["heap"] for r in m.get("per_rank", []) if (r.get("heap") or {}).get("mode") == "keep"]
        if heaps:
            kept = ", ".join(f"{h['peak_kept_bytes'] / 2**20:.0f}" for h in heaps)
            trims = ", ".join(str(h["trims"]) for h in heaps)
            print(f"{prefix}_heap_reuse_MiB: {items.get('heap reuse', 0) / 2**20:.0f}  (freed memory kept, all ranks; "
                  f"the most each rank kept: {kept} MiB; trims: {trims})")
        print(f"{prefix}_cpu_hit_rate: {m['cpu_hit_rate']:.4f}  (of rows not on a GPU tier, own or peer)")
        print(f"{prefix}_hit_rate: {m['memory_hit_rate']:.4f}  (GPU stand-ins or CPU cache, all ranks and epochs)")
        print(f"{prefix}_peer_rows: {m['tier_rows'].get('peer', 0)}  (rows copied from another rank's GPU tier)")
        print_disk_busy(prefix, m)
        print(f"{prefix}_ssd_requests: {m['ssd_requests']}")
        print(f"{prefix}_packed_rows: {m.get('packed_rows', 0)}  (SSD rows read from the pack)")
        print(f"{prefix}_segment_batches: {m.get('segment_batches', 0)}  (batches read as their pack segment, whole)")
        print(f"{prefix}_whole_batches: {m.get('whole_batches', 0)}  (of those, read straight into the batch's buffer)")
        print(f"{prefix}_pack_left_out_rows: {m.get('pack_left_out_rows', 0)}  (rows the pack left out for caches "
              "this run does not have: read from the layout on their own)")
        print(f"{prefix}_direct_rows: {m.get('direct_rows', 0)}  (SSD rows read straight into their job's buffer)")
        ssd = m["tier_bytes"].get("ssd", 0)
        print(f"{prefix}_ssd_rows_MB: {ssd / 1e6:.0f}")
        print(f"{prefix}_read_amplification: {m['ssd_bytes_read'] / max(ssd, 1):.2f}")
    print(f"{prefix}_ssd_bytes_read_MB: {m['ssd_bytes_read'] / 1e6:.0f}")
    if m.get("eval_wall_s") is not None:
        print(f"{prefix}_eval_s: {m['eval_wall_s'] / len(m['epoch_seconds']):.2f}  (each epoch's validation, mean)")
    wall = max(m["pipeline_wall_s"], 1e-9)
    print(f"{prefix}_effective_MB_per_s: {m['ssd_bytes_read'] / 1e6 / wall:.0f}")
    print(f"{prefix}_val_accuracy: {m['val_accuracy']:.4f}")


def run_budget(a, bound: int | None) -> str | None:
    """The memory budget Moment's runs size their caches by: a `--memory-budget` of --moment-args, else the bound
    (`--memory-budget auto` is the cgroup's limit). The pack leaves out what that budget's cache holds, so a run
    without a bound but with a budget (a GPU host's) reads its batches as their segments too."""
    args = a.moment_args.split()
    for i, x in enumerate(args):
        if x.startswith("--memory-budget="):
            return x.split("=", 1)[1]
        if x == "--memory-budget" and i + 1 < len(args):
            return args[i + 1]
    return str(bound) if bound else None


def ensure_pack(ds_dir: Path, layout: Path, a, budget: str | None) -> None:
    """The layout's pack for this run's batches (kept between runs when the parameters match)."""
    from moment.placement.opened import Layout
    from moment.placement.pack import EVAL_SPLITS, pack_summary, whole_here, write_pack
    from moment.runtime.config import TrainConfig
    from moment.runtime.sizing import preview_inputs, preview_plan
    from moment.workload.graph import GraphDataset

    ds = GraphDataset.open(ds_dir)
    f = [int(x) for x in a.fanouts.split(",")]
    cfg = TrainConfig(layout=layout, dataset=ds_dir, memory_budget=budget, fanouts=f,
                      batch_size=a.batch_size, hidden=a.hidden, io_shape="block")
    opened = Layout.open(layout)
    measured = preview_inputs(cfg, ds, a.nproc)

    def budget_rows(index_bytes: int) -> int:  # the run's CPU cache with a pack index this large
        return preview_plan(cfg, ds, a.nproc, layout=opened, pack_index_bytes=index_bytes,
                            inputs=measured).memory.cpu_rows

    old, whole = opened.pack, a.pack == "whole" or (a.pack == "auto" and whole_here()[0])
    # a pack is kept when the run's cache, with that pack's own index charged, is what it left out (none: whole)
    if old is None or old.mismatch(world_size=a.nproc, batch_size=a.batch_size, fanouts=f, seed=0) or \
            old.epochs < a.epochs or old.eval_splits != list(EVAL_SPLITS) or old.segment_order != "batch" or \
            old.cached_rows != (0 if whole else budget_rows(opened.pack_index_bytes)):
        t = time.perf_counter()
        rows = {"cached_rows": 0} if whole else {"budget_rows": budget_rows}
        old = write_pack(layout, ds, world_size=a.nproc, batch_size=a.batch_size, fanouts=f, seed=0,
                         epochs=a.epochs, overwrite=True, **rows)
        print(f"pack_s: {time.perf_counter() - t:.1f}")
    s = pack_summary(old)
    print(f"pack_MiB: {s['bytes'] / 2**20:.0f}\npack_disk_overhead: {s['disk_overhead']:.2f}  (x the features)")
    print(f"pack: {'whole' if whole else 'fit'}{' (auto)' if a.pack == 'auto' else ''}\n"
          f"pack_cached_rows_left_out: {old.cached_rows}", flush=True)


def predicted_hit_rate(ds_dir: Path, layout: Path, m: dict, a) -> float | None:
    """The cache simulator's hit rate for rank 0's epoch 0 at the run's cache capacity and policy."""
    try:
        from moment.caching.simulate import simulate
        from moment.workload.graph import GraphDataset
        from moment.workload.trace import sample_trace
    except ImportError:
        return None
    ds = GraphDataset.open(ds_dir)
    cap = next(it["bytes"] for it in m["memory"]["items"] if it["name"] == "cpu cache") // ds.row_bytes
    tr = sample_trace(ds, [int(x) for x in a.fanouts.split(",")], m["batch_size"], seed=0, epochs=1, rank=0,
                      world_size=a.nproc)
    order = np.load(layout / "order.npy", mmap_mode="r")
    hot = np.zeros(ds.num_nodes, np.int64)
    hot[np.asarray(order)] = np.arange(ds.num_nodes, 0, -1)
    r = simulate(tr, cap, policies=(m["cache_policy"],), hotness=hot, superbatch=m["superbatch"])
    return float(r[m["cache_policy"]]["hit_rate"]) if m["cache_policy"] in r else None


def memory_runs(a, feature_bytes: int, available: int) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
    """(name, what, flags) of the runs that hold every feature in memory (the limit an out-of-core epoch
    is measured against), and a line for each one memory of `available` bytes cannot hold."""
    runs, skipped = [], []
    room = IN_MEMORY_SHARE * available
    if a.nproc * feature_bytes <= room:
        runs.append(("memory_moment", "Moment's pipeline, --features-in-memory (a copy of the features per rank)",
                     ["--features-in-memory"]))
    else:
        skipped.append(f"memory_moment_skipped: --features-in-memory holds a copy per rank, {a.nproc} x "
                       f"{feature_bytes / 2**30:.1f} GiB, over {IN_MEMORY_SHARE:.0%} of the {available / 2**30:.1f} "
                       "GiB available (the page-cache runs hold one copy for all ranks)")
    if feature_bytes <= room:
        runs.append(("memory_pagecache", "Moment's pipeline, --features-memmap with every feature in the page cache "
                     "(one copy for all ranks)", ["--features-memmap"]))
        runs.append(("memory_loader", f"the worker baseline ({a.loader_workers} DataLoader workers per rank), every "
                     "feature in the page cache", ["--features-memmap", "--loader-workers", str(a.loader_workers)]))
    else:
        skipped.append(f"memory_pagecache_skipped: the {feature_bytes / 2**30:.1f} GiB of features are over "
                       f"{IN_MEMORY_SHARE:.0%} of the {available / 2**30:.1f} GiB available")
    return runs, skipped


#: an in-memory run whose whole process takes this many times the fastest one's so far is stopped: its epochs
#: cannot be the faster, and a run that hangs (Python before 3.11.8 can deadlock a DataLoader worker in its fork,
#: CPython gh-112275; seen once here, a worker baseline rank waiting 15 min) ends there instead of never
SLOWER_IN_MEMORY = 2.0


def memory_run_deadline(done: dict[str, dict]) -> float | None:
    """Seconds the next in-memory run may take, whole process: None before one has finished."""
    return SLOWER_IN_MEMORY * min(m["process_s"] for m in done.values()) if done else None


def in_memory_limit(a, ds_dir: Path, common: list[str], moment: dict, key: str) -> tuple[float, list[str]] | None:
    """Every in-memory run (no bound, the dataset warm in the page cache, the same ranks, batches and
    model) and `key` = Moment's out-of-core epoch over the fastest of them, steady state; (that ratio, the
    fastest one's flags), None when none ran."""
    feature_bytes = (ds_dir / "features.npy").stat().st_size
    runs, skipped = memory_runs(a, feature_bytes, memory_bytes())
    if skipped:
        print("\n".join(skipped))
    done: dict[str, dict] = {}
    for name, what, flags in runs:
        print(f"{name}_mode: {what}", flush=True)
        limit = memory_run_deadline(done)
        m = run(name, a.nproc, [*flags, *common], a.cache_dir / f"{name}.json", cold=[], bound=None,
                warm=(ds_dir,), deadline=limit)
        if "stopped_after_s" in m:
            print(f"{name}_stopped_after_s: {limit:.0f}  (over {SLOWER_IN_MEMORY:g}x the fastest in-memory run's "
                  "whole process: it cannot set the limit)", flush=True)
            continue
        if m:
            report(name, m)
            print(f"{name}_steady_epoch_s: {steady_s(m):.2f}", flush=True)
            done[name] = m
    if not done:
        return None
    best = min(done, key=lambda k: steady_s(done[k]))
    limit, first = done[best], done[best]["epoch_seconds"][0]
    print("limit_epochs: steady state, the mean of epochs 2..N of each run (the first, with its cold start and "
          "warm-up, excluded); a one-epoch run counts its only epoch")
    print(f"in_memory_system: {best}  (the fastest in-memory run)")
    print(f"in_memory_epoch_s: {steady_s(limit):.2f}")
    print(f"moment_steady_epoch_s: {steady_s(moment):.2f}")
    print(f"limit_ratio_first_epoch: {moment['epoch_seconds'][0] / first:.3f}  (the first epochs alone)")
    if limit.get("loss_curve"):
        print(f"in_memory_same_loss_curve: {np.allclose(moment['loss_curve'], limit['loss_curve'], rtol=1e-5)}")
    ratio = steady_s(moment) / steady_s(limit)
    if (cpu := cpu_ratio(moment, limit)) is not None:
        print(f"cpu_ratio: {cpu:.3f}  (the ranks' CPU seconds per steady epoch, Moment out of core / in memory)")
    if moment.get("eval_wall_s") and limit.get("eval_wall_s"):
        print(f"eval_ratio: {moment['eval_wall_s'] / limit['eval_wall_s']:.3f}  (the validation passes' seconds, "
              "Moment out of core / in memory; outside the epochs)")
    print(f"{key}: {ratio:.3f}  (Moment out of core / in memory, steady epochs)", flush=True)
    return ratio, next(f for n, _, f in runs if n == best)


def cpu_ratio(mo: dict, mem: dict) -> float | None:
    """Moment's CPU per steady epoch over the in-memory run's (every rank's process, each over its own span of the
    epoch): the work out-of-core reading adds per batch (routing each id through the tiers, the reader, the
    copies), which on cores the in-memory run already keeps busy sets how far an epoch can fall. None when a run
    lacks the count or the in-memory run had loader workers (their processes' CPU is not in it)."""
    if not (mo.get("epoch_cpu_seconds") and mem.get("epoch_cpu_seconds")) or mem.get("loader_workers"):
        return None
    return steady(mo["epoch_cpu_seconds"]) / steady(mem["epoch_cpu_seconds"])


def fio_limit(files: list[Path], request: int, depth: int, jobs: int) -> dict | None:
    """fio's random-read rate over `files` (direct I/O, `jobs` jobs of `depth` in flight, `request`-byte
    reads rounded to 512 B, into huge pages as Moment's buffers are), cold; None without fio (said once)."""
    if shutil.which("fio") is None:
        print("fio_MB_per_s: n/a (fio is not installed: apt-get install fio)")
        return None
    bs = max(512, round(request / 512) * 512)
    drop_files(*files)
    with huge_pages(depth * jobs * bs) as why:
        for engine in ENGINES:
            r = subprocess.run(["fio", "--name=moment-mix", "--rw=randread", f"--bs={bs}", "--direct=1", "--readonly",
                                f"--ioengine={engine}", f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
                                "--norandommap", "--randrepeat=0", "--time_based", f"--runtime={FIO_SECONDS}",
                                "--output-format=json", *([] if why else FIO_HUGE),
                                "--filename=" + ":".join(str(f) for f in files)],
                               capture_output=True, text=True, check=False)
            if r.returncode == 0:
                read = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
                return {"engine": engine, "bs": bs, "depth": depth, "jobs": jobs, "bw_bytes": read["bw_bytes"],
                        "iops": read["iops"], "buffers": "malloc" if why else "huge pages"}
    print(f"fio_MB_per_s: n/a (fio could not read {files[0]} with any engine)")
    return None


def size_mix(sizes: list[dict[str, int]], share: float = MIX_SHARE) -> list[tuple[int, int, int]]:
    """(request bytes, requests, bytes) of each size class of a run's SSD reads (`ssd_request_sizes`, by
    power of two): a class with at least `share` of the requests or of the bytes is kept, at its mean
    request rounded to 512 B; the others' requests and bytes join the nearest kept class."""
    n, b = sum(x["requests"] for x in sizes), sum(x["bytes"] for x in sizes)
    kept = [x for x in sizes if x["requests"] >= share * n or x["bytes"] >= share * b] or sizes
    out = {x["from_bytes"]: [x["requests"], x["bytes"]] for x in kept}
    for x in sizes:
        if x["from_bytes"] not in out:
            near = min(out, key=lambda k: (abs(k.bit_length() - x["from_bytes"].bit_length()), k))
            out[near][0] += x["requests"]
            out[near][1] += x["bytes"]
    return [(max(512, round(bb / nn / 512) * 512), nn, bb) for _, (nn, bb) in sorted(out.items())]


def mix_limit(files: list[Path], sizes: list[dict[str, int]], depth: int, jobs: int) -> float | None:
    """The disk's rate in bytes/s for a run's mix of SSD reads: each size class read alone by fio, and the
    mix's bytes over the seconds fio needs for each class's bytes at its rate; None without fio."""
    mix = size_mix(sizes)
    n, b = sum(m[1] for m in mix), sum(m[2] for m in mix)
    seconds, f = 0.0, None
    for bs, nn, bb in mix:
        f = fio_limit(files, bs, depth, jobs)
        if f is None:
            return None
        seconds += bb / f["bw_bytes"]
        print(f"fio_size_{bs}: {nn / n:.1%} of the requests, {bb / b:.1%} of the bytes, fio {f['bw_bytes'] / 1e6:.0f} "
              f"MB/s ({f['iops']:.0f} IOPS)")
    print(f"fio_mix: Moment's SSD reads in {len(mix)} size classes, each read alone by fio (random offsets, "
          f"{f['engine']}, direct, {f['buffers']}, {jobs} jobs x {depth} in flight: its ranks x queue depth) over the "
          f"{len(files)} files it read; the mix's rate = its bytes / the sum of each class's bytes over fio's rate")
    print(f"fio_MB_per_s: {b / seconds / 1e6:.0f}  (the mix)")
    return b / seconds


def replay_limit(traces: list[Path], depth: int, label: str = "fio_replay") -> float | None:
    """The disk's rate in bytes/s for exactly a run's reads: each rank's trace (`--io-trace`) replayed by fio as
    fast as it can (`--replay_no_stall`), one job per rank at the run's queue depth, all at once, cold,
    direct, into huge pages; the traces' bytes over the longest job's time. None without fio."""
    if shutil.which("fio") is None:
        print(f"{label}_MB_per_s: n/a (fio is not installed: apt-get install fio)")
        return None
    reads = [[line.split() for line in t.read_text().splitlines() if " read " in line] for t in traces]
    wanted, need = sum(int(r[3]) for rs in reads for r in rs), max((int(r[3]) for rs in reads for r in rs), default=0)
    drop_files(*sorted({Path(r[0]) for rs in reads for r in rs}))
    with huge_pages(depth * len(traces) * need) as why:
        for engine in ENGINES:
            jobs = [x for i, t in enumerate(traces) for x in (f"--name=rank{i}", f"--read_iolog={t}")]
            r = subprocess.run(["fio", "--replay_no_stall=1", "--direct=1", "--readonly", f"--ioengine={engine}",
                                f"--iodepth={depth}", "--output-format=json", *([] if why else FIO_HUGE), *jobs],
                               capture_output=True, text=True, check=False)
            if r.returncode == 0:
                done = json.loads(r.stdout[r.stdout.index("{"):])["jobs"]
                if all(j["error"] == 0 and j["read"]["total_ios"] == len(rs) for j, rs in zip(done, reads)):
                    break
        else:
            print(f"{label}_MB_per_s: n/a (fio could not replay {traces[0]} with any engine)")
            return None
    # fio's byte count of a replay leaves out reads still in flight at its end: the traces' own bytes are exact
    seconds = max(j["job_runtime"] for j in done) / 1e3
    print(f"{label}: Moment's {sum(map(len, reads))} SSD reads of its ranks, {wanted / 1e6:.0f} MB, replayed by fio in "
          f"order (one job per rank, {engine}, {depth} in flight, direct, {'malloc' if why else 'huge pages'}, "
          f"cold) in {seconds:.2f} s")
    print(f"{label}_MB_per_s: {wanted / seconds / 1e6:.0f}")
    return wanted / seconds


def replay_kept(kept: Path, command: list[str], nproc: int) -> float | None:
    """fio's replay, right before a data-only run, of the reads an earlier run of the same command kept
    (`keep_traces`: its seeds fix its batches, so its ranks read the same); None where none did."""
    try:
        stamp = json.loads((kept / STAMP).read_text())
    except (OSError, ValueError):
        stamp = None
    traces = [rank_trace(kept, r) for r in range(nproc)]
    if not stamp or stamp.get("command") != command or not all(t.is_file() for t in traces):
        print("fio_replay_before_MB_per_s: n/a (no earlier run of this command kept its reads: the next one "
              "replays them before it runs)")
        return None
    return replay_limit(traces, int(stamp["depth"]), "fio_replay_before")


def keep_traces(traces: Path, kept: Path, command: list[str], depth: int, nproc: int) -> None:
    """Keep a data-only run's rank traces for the next run of `command` to replay before it runs (a copy
    renamed into place: a run stopped halfway leaves the kept ones whole)."""
    tmp = kept.with_name(kept.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for r in range(nproc):
        if not rank_trace(traces, r).is_file():
            shutil.rmtree(tmp)
            return
        shutil.copyfile(rank_trace(traces, r), rank_trace(tmp, r))
    (tmp / STAMP).write_text(json.dumps({"command": command, "depth": depth}))
    shutil.rmtree(kept, ignore_errors=True)
    tmp.rename(kept)


class Round(NamedTuple):
    """One data-only run of Moment's and the fio replays of its reads on either side (bytes/s; None: none)."""
    rate: float  # Moment's SSD bytes/s over its epochs
    steady: float  # over its steady epochs
    before: float | None  # fio's replay right before the run (the round before's, or the kept reads')
    after: float | None  # right after it
    in_flight: float | None = None  # right after that, at the depth the run's readers keep (`reader_depth`)
    in_flight_depth: int = 0


def reader_depth(m: dict) -> int | None:
    """The most reads a rank's reader keeps in flight: its windows' bytes over the run's mean read (32 for a
    pack's 1 MiB reads), at most its queue depth; None without reads. fio's replay at the queue depth (128)
    holds four times what the run ever did, and on this project's disk fio's rate moves with its depth."""
    n = sum(c["requests"] for c in m.get("ssd_request_sizes") or [])
    if not n:
        return None
    mean = sum(c["bytes"] for c in m["ssd_request_sizes"]) / n
    return max(1, min(int(m.get("config", {}).get("queue_depth") or 128), round(INFLIGHT * WINDOW / mean)))


def feed_ratios(rounds: list[Round]) -> list[tuple[str, list[float], str]]:
    """(key, each round's ratio, what it is) of Moment's SSD rate over fio's replays, the rounds that have them.
    The disk drifts by more than the gap between the two within a minute, so a ratio is of a run and the replays
    right beside it, and the figure is the median over the rounds."""
    after = [r for r in rounds if r.after]
    both = [r for r in after if r.before]
    out = []
    if after:
        out.append(("data_only_ssd_over_fio", [r.rate / r.after for r in after],
                    "Moment's SSD bytes/s / fio's replay of the same reads right after"))
        out.append(("data_only_ssd_over_fio_steady", [r.steady / r.after for r in after], "the same, over the steady "
                    "epochs"))
    if both:
        out.append(("data_only_ssd_over_fio_bracketed_steady", [r.steady / ((r.before + r.after) / 2) for r in both],
                    "the steady rate / the mean of fio's replays right before and right after the run, "
                    + ", ".join(f"{r.before / 1e6:.0f} and {r.after / 1e6:.0f}" for r in both) + " MB/s"))
    if held := [r for r in rounds if r.in_flight]:
        out.append(("data_only_ssd_over_fio_in_flight_steady", [r.steady / r.in_flight for r in held],
                    f"the steady rate / fio's replay at the {held[0].in_flight_depth} reads per rank the run's readers "
                    "keep in flight, not its queue depth: " + ", ".join(f"{r.in_flight / 1e6:.0f}" for r in held)
                    + " MB/s"))
    return out


def print_feed(name: str, m: dict) -> None:
    """A data-only run's lines; adds its SSD rates to `m` (Moment's own count of its train epochs' SSD reads,
    validation's and the caches' fill apart; a baseline's, what its processes read)."""
    wall, tiered = sum(m["epoch_seconds"]), m.get("features") == "tiered"
    disk = m["disk_bytes_read"]
    m["ssd_MB_per_s"] = (sum(m["epoch_ssd_bytes"]) if tiered else disk) / 1e6 / wall
    print(f"{name}_epoch_s_each: {', '.join(f'{x:.2f}' for x in m['epoch_seconds'])}")
    print(f"{name}_seeds_per_s: {m['seeds_per_s']:.0f}")
    read = "what its processes read from disk, start-up and validation included"
    print(f"{name}_ssd_MB_per_s: {m['ssd_MB_per_s']:.0f}  "
          f"({'its own count of the SSD reads in its train epochs' if tiered else read}, over its epochs)")
    if tiered:
        m["ssd_bytes_steady"] = steady(m["epoch_ssd_bytes"])  # per steady epoch
        m["ssd_MB_per_s_steady"] = m["ssd_bytes_steady"] / 1e6 / steady_s(m)
        print(f"{name}_ssd_MB_per_s_steady: {m['ssd_MB_per_s_steady']:.0f}  (the same over the steady epochs: "
              f"{', '.join(f'{x / 1e6:.0f}' for x in steady_epochs(m['epoch_ssd_bytes']))} MB)")
        print(f"{name}_limiting_stage: {m['limiting_stage']}")
        print(f"{name}_disk_MB_per_s: {disk / 1e6 / wall:.0f}  ({read}, over its epochs)")
        print_disk_busy(name, m)
    print(flush=True)


def feed_rate(a, ds_dir: Path, layout: Path, bound: int | None, common: list[str], moment_flags: list[str],
              baseline_flags: list[str] | None, memory_flags: list[str] | None, suffix: str) -> dict[str, float]:
    """The pipeline without the model step (`--data-only`): seeds/s and SSD bytes/s of Moment, the worker
    baseline and the in-memory run, the features cold (the graph warm: this is the feature path's rate),
    and fio's rate for Moment's request size and queue depth on the files Moment read."""
    graph = [f for f in ds_dir.iterdir() if f.name != "features.npy"]
    systems = [("data_only_moment", moment_flags, [ds_dir, layout], graph, bound)]
    if baseline_flags is not None:
        systems.append(("data_only_baseline", baseline_flags, [ds_dir, layout], graph, bound))
    if memory_flags is not None:
        systems.append(("data_only_in_memory", memory_flags, [], [ds_dir], None))
    got: dict[str, dict] = {}
    rounds: list[Round] = []
    depth = 128
    traces = a.cache_dir / "io-trace"
    kept = a.cache_dir / f"io-trace-kept{suffix}"
    for name, flags, cold, warm, b in systems:
        moment = name == "data_only_moment"
        command = [str(x) for x in [*flags, "--data-only", *common]]
        before = replay_kept(kept, command, a.nproc) if moment else None  # the disk drifts both ways
        for k in range(a.feed_rounds if moment else 1):
            if moment and a.feed_rounds > 1:
                print(f"data_only_round: {k + 1} of {a.feed_rounds}")
            shutil.rmtree(traces, ignore_errors=True)
            trace = ["--io-trace", str(traces)] if moment else []
            m = run(name, a.nproc, [*flags, "--data-only", *trace, *common], a.cache_dir / f"{name}.json",
                    cold=cold, bound=b, warm=tuple(warm))
            if not m:
                break
            print_feed(name, m)
            got.setdefault(name, m)  # every line but the fio ratios is the first round's
            if moment and m["ssd_requests"]:
                # the disk's rate drifts by 10% and more within a minute on these VMs: its replay goes right after
                # the run it replays (and before the next round, which reads the same: its seeds fix them)
                depth = int(m.get("config", {}).get("queue_depth") or depth)
                logs = [rank_trace(traces, r) for r in range(a.nproc)]
                after = replay_limit(logs, depth)
                held = reader_depth(m)
                in_flight = replay_limit(logs, held, "fio_replay_in_flight") if held and held != depth else None
                keep_traces(traces, kept, command, depth, a.nproc)
                rounds.append(Round(m["ssd_MB_per_s"] * 1e6, m["ssd_MB_per_s_steady"] * 1e6, before, after,
                                    in_flight, held or 0))
                before = after
                print(flush=True)
    out: dict[str, float] = {}
    mo = got.get("data_only_moment")
    if mo is None:
        return out
    if "data_only_baseline" in got:
        out["data_only_seeds_ratio"] = mo["seeds_per_s"] / got["data_only_baseline"]["seeds_per_s"]
        print(f"data_only_seeds_ratio{suffix}: {out['data_only_seeds_ratio']:.2f}  (Moment / the worker baseline)")
    if "data_only_in_memory" in got:
        out["data_only_limit_ratio"] = steady_s(mo) / steady_s(got["data_only_in_memory"])
        print(f"data_only_limit_ratio{suffix}: {out['data_only_limit_ratio']:.3f}  (Moment / in memory, steady epochs)")
        if (cpu := cpu_ratio(mo, got["data_only_in_memory"])) is not None:
            out["data_only_cpu_ratio"] = cpu
            print(f"data_only_cpu_ratio{suffix}: {cpu:.3f}  (the ranks' CPU seconds per steady epoch, Moment / in memory)")
    if mo["ssd_requests"]:
        files = sorted((layout / "shards").glob("ssd*")) + sorted((layout / "pack").glob("*.bin"))
        rate = mix_limit(files, mo["ssd_request_sizes"], depth, a.nproc)
        if rate:
            out["data_only_ssd_over_fio_random"] = mo["ssd_MB_per_s"] / (rate / 1e6)
            print(f"data_only_ssd_over_fio_random{suffix}: {out['data_only_ssd_over_fio_random']:.3f}  (Moment's SSD "
                  "bytes/s / fio's for the same sizes at random offsets)")
        rate = rounds[0].after if rounds else None
        for key, ratios, what in feed_ratios(rounds):
            out[key] = float(np.median(ratios))
            each = f"; each round {', '.join(f'{x:.3f}' for x in ratios)}" if len(rounds) > 1 else ""
            print(f"{key}{suffix}: {out[key]:.3f}  ({what}{each})")
        if rate and "data_only_in_memory" in got:
            # no reader can feed faster than the pipeline consumes: at the in-memory run's pace (the same sampling
            # and copies, no reads) Moment's steady epoch's SSD bytes would be asked for at this rate
            ceiling = mo["ssd_bytes_steady"] / steady_s(got["data_only_in_memory"])
            out["data_only_cpu_ceiling_over_fio"] = ceiling / rate
            print(f"data_only_cpu_ceiling_over_fio{suffix}: {out['data_only_cpu_ceiling_over_fio']:.3f}  (Moment's "
                  "steady SSD bytes per epoch over the in-memory steady epoch / fio's replay: the most the CPU "
                  "side lets any reader ask of the disk on these cores)")
        if rate and (use := disk_busy(mo)) and use.devices == 1:  # fio's rate is every device's at once
            out["data_only_ssd_busy_over_fio"] = use.read_bytes / use.busy_s / rate
            print(f"data_only_ssd_busy_over_fio{suffix}: {out['data_only_ssd_busy_over_fio']:.3f}  (the devices' rate "
                  "while Moment's epochs kept them busy / fio's replay: the rest of the gap is the CPU side's)")
    return out


def workload_args(p: argparse.ArgumentParser, epochs: int = 2) -> None:
    """The dataset and training run this bench builds (bench/fidelity.py and cluster_train.py reuse them)."""
    p.add_argument("--nodes", type=int, default=8_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--train-fraction", type=float, default=0.0025)
    p.add_argument("--epochs", type=int, default=epochs, help=f"epochs of every run (default {epochs})")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--fanouts", default="25,10")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # the steady figures are the mean of epochs 2..N: with two of them, one epoch disturbed by the machine's other
    # work moves a figure half as much
    workload_args(p, epochs=3)
    p.add_argument("--memory-bound", default="3GiB", help="the cgroup limit of every system, or 'none'")
    p.add_argument("--sizes", default="",
                   help="several graph sizes in one run, NODES[xDIM]:BOUND[,...] (DIM: --dim), e.g. "
                        "8000000:3GiB,16000000x256:5GiB (features 4.1 GB under 3 GiB, 16.4 GB under 5 GiB: 3.05x); "
                        "overrides --nodes, --dim and --memory-bound. Each size is checked against the least "
                        "bound Moment's runtime accepts before anything is built (a refusal names a size that "
                        "runs). `speedup` is the smallest of them, each prints as speedup_NODES[xDIM]")
    p.add_argument("--variants", default="block,rows,belady",
                   help=f"other Moment configurations to run too ({', '.join(VARIANTS)}; '' for none)")
    p.add_argument("--moment-args", default="", help="extra flags for every Moment run")
    p.add_argument("--pack", choices=("auto", "fit", "whole"), default="auto",
                   help="the pack Moment's runs read: auto (default: the kind `moment data pack` picks here, whole "
                        "on a machine with no GPU driver), fit (`moment data pack --memory-budget`: each batch's rows "
                        "outside the run's CPU cache) or whole (`moment data pack --whole`: every row of each batch, "
                        "read straight into the batch's buffer, for about twice the disk reads)")
    p.add_argument("--baseline", choices=("loader", "serial"), default="loader",
                   help="loader (default): a torch DataLoader whose worker processes sample and read the memmap "
                        "while the rank trains, as PyG's NeighborLoader(num_workers=N) runs; serial: sample, "
                        "read and train one after the other in the rank")
    p.add_argument("--loader-workers", type=int, default=4, metavar="N",
                   help="DataLoader worker processes per rank of the loader baseline")
    p.add_argument("--baseline-readahead", nargs="?", const="on", choices=READAHEAD, default="auto",
                   help="the baseline's memmap: on (the kernel's read-around), off (MADV_RANDOM), or auto "
                        "(default: run both, each cold, and compare Moment with the faster)")
    p.add_argument("--baseline-cap", type=float, default=1200.0, metavar="SECONDS",
                   help="stop a baseline run after SECONDS, whole process; when no setting finished, print "
                        "speedup_at_least (the cap over Moment's whole run: start-up, epochs and validation) "
                        "instead of its speedup; 0: no cap")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--skip-limit", action="store_true",
                   help="leave out the in-memory runs (the limit: the same training with every feature in memory, "
                        "no bound, the dataset warm) and `limit_ratio`")
    p.add_argument("--data-only", action="store_true",
                   help="then the feed rate: Moment, the faster baseline and the fastest in-memory run again with "
                        "--data-only (no model step), their seeds/s and SSD bytes/s, and fio's rate for Moment's "
                        "request size and queue depth on the files it read")
    p.add_argument("--feed-rounds", type=int, default=3, metavar="N",
                   help="with --data-only: Moment's data-only run N times, each cold and followed by fio's replay of "
                        "its reads; the fio ratios are the medians over the rounds (the disk drifts by more than "
                        "their gap within a minute), every other line the first round's (default 3)")
    p.add_argument("--cache-dir", type=Path, default=Path(os.environ.get(
        "MOMENT_BENCH_CACHE", Path.home() / ".cache" / "moment-bench")))
    return p


def parse_sizes(a) -> list[tuple[int, int, str]]:
    """(nodes, feature dim, memory bound) per size: --sizes (NODES[xDIM]:BOUND, DIM defaulting to --dim),
    else --nodes, --dim and --memory-bound."""
    if not a.sizes.strip():
        return [(a.nodes, a.dim, a.memory_bound)]
    out = []
    for item in a.sizes.split(","):
        size, sep, bound = item.strip().partition(":")
        nodes, x, dim = size.lower().partition("x")
        try:
            n, d = int(nodes), int(dim) if x else a.dim
        except ValueError:
            n = d = 0
        if not sep or n < 1 or d < 1 or not bound.strip():
            raise MomentError(f"--sizes: cannot read {item.strip()!r}", hint="give NODES[xDIM]:BOUND pairs, e.g. "
                              "--sizes 8000000:3GiB,16000000x256:5GiB (BOUND may be 'none')")
        out.append((n, d, bound.strip()))
    if len({(n, d) for n, d, _ in out}) < len(out):
        raise MomentError(f"--sizes: {a.sizes!r} names a size twice", hint="give each size once")
    return out


#: a later baseline setting that takes longer than this x the faster one so far (whole process) is no faster
SLOWER_BASELINE = 1.1


def baseline_deadline(tried: dict[str, dict], cap: float | None) -> tuple[float | None, bool]:
    """Seconds the next baseline setting may take, whole process (None: no limit), and whether `cap`
    (--baseline-cap seconds) set them rather than the faster finished setting."""
    limit = SLOWER_BASELINE * min(m["process_s"] for m in tried.values()) if tried else None
    if cap is not None and (limit is None or cap < limit):
        return cap, True
    return limit, False


def baseline_runs(a) -> list[tuple[str, str, list[str]]]:
    """(name, mode, train flags) of each baseline run: both readahead settings under auto."""
    if a.loader_workers < 1:
        raise MomentError(f"--loader-workers must be at least 1, got {a.loader_workers}",
                          hint="use --baseline serial for a baseline without worker processes")
    stages = (["--loader-workers", str(a.loader_workers)] if a.baseline == "loader" else ["--no-pipeline"])
    how = (f"torch DataLoader, {a.loader_workers} worker processes per rank sample and read while the rank trains"
           if a.baseline == "loader" else "serial stages (sample, read, train one after the other)")
    runs = []
    for ra in (("off", "on") if a.baseline_readahead == "auto" else (a.baseline_readahead,)):
        mode = f"memmap {'+ kernel readahead' if ra == 'on' else '+ MADV_RANDOM'}, {how}"
        name = "baseline" if a.baseline_readahead != "auto" else f"baseline_readahead_{ra}"
        runs.append((name, mode, ["--features-memmap", *stages, *([] if ra == "on" else ["--memmap-random"])]))
    return runs


def run_size(a, nodes: int, dim: int, memory_bound: str, suffix: str = "") -> tuple[bool, dict[str, float]]:
    """Every system on one graph size; (all finished, its summary figures: speedup of Moment's default
    over the baseline, limit_ratio, the data-only ratios), each printed with `suffix`."""
    from moment.sizes import parse_size

    a = argparse.Namespace(**{**vars(a), "nodes": nodes, "dim": dim})
    ds_dir, layout = build(a.cache_dir, a)
    cold = [ds_dir, layout]
    feature_bytes = int(np.load(ds_dir / "features.npy", mmap_mode="r").nbytes)
    bound = None if memory_bound == "none" else parse_size(memory_bound, feature_bytes)
    print(f"nodes: {a.nodes}\nfeature_dim: {a.dim}\nranks: {a.nproc}\nepochs: {a.epochs}\nfanouts: {a.fanouts}")
    print(f"batch_size_per_rank: {a.batch_size}")
    print(f"feature_MiB: {feature_bytes / 2**20:.0f}")
    print(f"memory_bound_MiB: {bound / 2**20:.0f}" if bound else "memory_bound_MiB: none")
    disk = sorted((layout / "shards").glob("ssd*"))
    disk_start = check_disk(disk, "start", suffix)
    if bound:
        print(f"features_over_bound: {feature_bytes / bound:.2f}")
    common = ["--dataset", str(ds_dir), "--epochs", str(a.epochs), "--fanouts", a.fanouts, "--hidden", str(a.hidden),
              "--batch-size", str(a.batch_size)]
    budget = ["--memory-budget", "auto"] if bound else []
    systems = [("moment", [*DEFAULT])] + [(f"moment_{v}", [*DEFAULT, *VARIANTS[v]]) for v in a.variants.split(",") if v]
    results: dict[str, dict] = {}
    figures: dict[str, float] = {}
    ok = True
    ensure_pack(ds_dir, layout, a, run_budget(a, bound))
    moment_flags = ["--layout", str(layout), *budget, *DEFAULT, *a.moment_args.split()]
    for name, extra in systems:
        m = run(name, a.nproc, ["--layout", str(layout), *budget, *extra, *a.moment_args.split(), *common],
                a.cache_dir / f"{name}.json", cold=cold, bound=bound)
        if not m:
            ok = False
            continue
        results[name] = m
        report(name, m)
        pred = predicted_hit_rate(ds_dir, layout, m, a)
        if pred is not None:
            print(f"{name}_hit_rate_simulated: {pred:.4f}  (cache simulator, rank 0, epoch 0, same capacity and policy)")
        print(flush=True)
    # the limit next, beside Moment's run in time: the baseline takes minutes, and the machine drifts
    memory_flags = None
    if not a.skip_limit and "moment" in results:
        print()
        limit = in_memory_limit(a, ds_dir, common, results["moment"], f"limit_ratio{suffix}")
        if limit is not None:
            figures["limit_ratio"], memory_flags = limit
    baseline_flags = None
    if not a.skip_baseline:
        tried: dict[str, dict] = {}
        flags_of: dict[str, list[str]] = {}
        whole = results["moment"]["process_s"] if "moment" in results else None
        cap = a.baseline_cap if a.baseline_cap > 0 else None
        settings, at_cap = baseline_runs(a), 0
        for name, mode, flags in settings:
            print(f"{name}_mode: {mode}", flush=True)
            limit, capped = baseline_deadline(tried, cap)
            bl = run(name, a.nproc, [*flags, *common], a.cache_dir / f"{name}.json", cold=cold, bound=bound,
                     deadline=limit)
            if "stopped_after_s" in bl:
                at_cap += capped
                print(f"{name}_stopped_after_s: {limit:.0f}  " + (
                    "(--baseline-cap)" if capped
                    else f"(slower than the faster setting's whole run x {SLOWER_BASELINE:g})"))
                continue
            if not bl:
                ok = False
                continue
            report(name, bl)
            print(flush=True)
            tried[mode] = bl
            flags_of[mode] = flags
        if tried:  # the faster setting is the baseline
            mode = min(tried, key=lambda k: epoch_s(tried[k]))
            results["baseline"], baseline_flags = tried[mode], flags_of[mode]
            print(f"baseline_mode: {mode}" + ("  (the faster of the two readahead settings)" if len(tried) > 1 else ""))
        elif at_cap == len(settings) and whole:  # every setting stopped unfinished: their whole runs took longer
            figures["speedup_at_least"] = cap / whole
            print(f"speedup_at_least{suffix}: {cap / whole:.1f}  (whole runs: no baseline setting finished in "
                  f"{cap:.0f} s, Moment's took {whole:.0f} s; the epochs' speedup is not measured)", flush=True)
    if "moment" in results:
        print(f"moment_epoch_s: {epoch_s(results['moment']):.2f}")
    if "baseline" in results:
        print(f"baseline_epoch_s: {epoch_s(results['baseline']):.2f}")
        for name, m in results.items():
            if name.startswith("moment_"):
                print(f"{name}_speedup: {epoch_s(results['baseline']) / epoch_s(m):.2f}")
        if "moment" in results:
            print(f"same_loss_curve: {np.allclose(results['moment']['loss_curve'], results['baseline']['loss_curve'], rtol=1e-5)}")
            figures["speedup"] = epoch_s(results["baseline"]) / epoch_s(results["moment"])
            print(f"speedup{suffix}: {figures['speedup']:.2f}", flush=True)
    if a.data_only:
        print()
        figures.update(feed_rate(a, ds_dir, layout, bound, common, moment_flags, baseline_flags, memory_flags, suffix))
    check_disk(disk, "end", suffix, disk_start)
    return ok, figures


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    sizes = parse_sizes(a)
    unknown = [v for v in a.variants.split(",") if v and v not in VARIANTS]
    if unknown:
        raise MomentError(f"--variants: unknown variant {unknown[0]!r}", hint=f"choose from {', '.join(VARIANTS)}")
    if a.feed_rounds < 1:
        raise MomentError(f"--feed-rounds must be at least 1, got {a.feed_rounds}")
    if not a.skip_baseline:
        baseline_runs(a)  # its flags are checked before hours of building
    why = cgroup_problem() if any(b != "none" for _, _, b in sizes) else ""
    if why:
        raise MomentError(f"cannot bound memory: {why}",
                          hint="run as root on a cgroup v1 machine, or --memory-bound none")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up (cgroup rmdir) on kill
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    for nodes, dim, bound in sizes:  # every size the runtime would refuse, before hours of building
        check_feasible(a, nodes, dim, bound)
    ok, figures = True, {}
    for nodes, dim, bound in sizes:
        name = f"{nodes}" if dim == a.dim else f"{nodes}x{dim}"
        if len(sizes) > 1:
            print(f"size: {nodes} nodes x {dim} features, memory bound {bound}", flush=True)
        done, figures[name] = run_size(a, nodes, dim, bound, suffix=f"_{name}" if len(sizes) > 1 else "")
        ok = ok and done
        print(flush=True)
    if len(sizes) > 1:  # each figure per size again, then the worst of them
        for key, worst, fmt, what in SUMMARY:
            got = {name: f[key] for name, f in figures.items() if key in f}
            for name, x in got.items():
                print(f"{key}_{name}: {x:{fmt}}")
            if len(got) == len(sizes):
                print(f"{key}: {worst(got.values()):{fmt}}  ({what} over the sizes)")
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MomentError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
