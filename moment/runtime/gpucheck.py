"""Ready for the first GPU: the checks to run first on a machine with CUDA (`moment doctor --gpu`, or
`python -m moment.runtime.gpucheck`).

Why: CI has no GPU, so the runtime's CUDA side (the device layer's streams, pinned buffers and
`record_stream`; NCCL; the CUDA RNG state in checkpoints; DDP's device_ids) first runs on a user's
machine. These checks run it there in a few minutes, before hours of training:

- `cuda tests`: the repository's tests of the CUDA-only lines (`CUDA_LAYER` names them) and of the
  CUDA side of code shared by both devices (`CUDA_TOO`), which skip on a machine without CUDA;
- `pipelined epoch`: a small layout trained for one epoch with the tiered, pipelined store and with
  the features in memory, both on the device with the same ranks (2 where there are 2 GPUs): the
  same batches, so the loss curves agree to `TOLERANCE` (bit for bit on CPU);
- `staging ring`: batches of random bytes through `moment.io.device.StagingRing` under
  `torch.cuda.set_sync_debug_mode("warn")`: every byte arrives, and no call blocks the host (a copy
  from pageable memory, a stream synchronisation).

Every check is written for any device: `--device cpu` runs the same comparisons (tests/test_gpucheck.py
does, in CI); only the calls to `torch.cuda` are CUDA's own. Without CUDA (and no `--device cpu`)
nothing runs: one line says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moment.errors import MomentError

#: how far the loss curves of the pipelined and the in-memory run may be apart on each device: on CPU
#: nothing (the same bytes in the same order); on CUDA 1e-6 (its atomic-add reductions are not
#: bit-reproducible from run to run)
TOLERANCE = {"cpu": 0.0, "cuda": 1e-6}
SELF_TEST = "tests/test_gpucheck.py"  # runs these checks: not among the tests they run
#: Every module of the package with CUDA-only lines (a call to `torch.cuda`, a branch on the device type
#: or the NCCL backend, pinned memory, `record_stream`), and the tests that run those lines where CUDA
#: exists. tests/test_cuda_layer.py fails when another module gains such a line, so the CUDA layer
#: stays thin and listed; docs/cuda.md says line by line what each one does.
CUDA_LAYER: dict[str, tuple[str, ...]] = {
    "moment/io/device.py": ("tests/test_device.py",),
    "moment/io/probe.py": ("tests/test_probe.py",),
    "moment/runtime/checkpoint.py": ("tests/test_cuda_layer.py",),
    "moment/runtime/devices.py": ("tests/test_cuda_layer.py",),
    "moment/runtime/dist.py": ("tests/test_cuda_layer.py", "tests/test_peers.py"),
    "moment/runtime/gpucheck.py": (SELF_TEST,),
    "moment/runtime/train.py": ("tests/test_cuda_layer.py",),
}
#: tests with a CUDA side for code that has no CUDA-only line (it runs on both devices): the store's rows
#: through pinned staging, the row exchange on NCCL
CUDA_TOO = ("tests/test_exchange.py", "tests/test_store.py")
REPO = Path(__file__).resolve().parents[2]
RING_BATCHES = (3000, 70_000, 1 << 20, (1 << 20) + 7, 3 << 20, 100, 2 << 20, 4096)  # varying, through fixed slots


@dataclass
class Check:
    name: str
    status: str  # "ok", "failed" or "skipped"
    detail: str
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    device: str | None  # None: nothing was checked (no CUDA)
    torch: str | None
    cuda: dict[str, Any] | None  # CUDA's version and devices, None without CUDA
    checks: list[Check] = field(default_factory=list)
    note: str | None = None

    @property
    def ok(self) -> bool:
        return all(c.status != "failed" for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def cuda_info() -> tuple[str | None, dict[str, Any] | None]:
    """(torch's version or None when torch is missing, CUDA's version and devices or None)."""
    try:
        import torch
    except ImportError:
        return None, None
    if not torch.cuda.is_available():
        return torch.__version__, None
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return torch.__version__, {"version": torch.version.cuda, "devices": names}


def check_machine(device: str | None = None, *, tests: bool = True, ranks: int | None = None,
                  workdir: Path | None = None) -> Report:
    """Run the checks on `device` ("cuda", "cpu"; None: cuda where there is one, else nothing runs)."""
    version, cuda = cuda_info()
    if device is None and cuda is None:
        why = "torch is not installed (pip install 'moment[train]')" if version is None else \
            f"torch {version} sees no CUDA device"
        return Report(None, version, None, note=f"no CUDA here: {why}; nothing to check on a GPU")
    device = device or "cuda"
    if device not in ("cpu", "cuda"):
        raise MomentError(f"--device {device!r}: choose cpu or cuda")
    if version is None:
        raise MomentError("torch is not installed", hint="pip install 'moment[train]'")
    if device == "cuda" and cuda is None:
        raise MomentError(f"--device cuda: torch {version} sees no CUDA device", hint="leave --device out, or "
                          "--device cpu to run the same checks on the CPU")
    if ranks is None:
        ranks = min(2, len(cuda["devices"])) if device == "cuda" else 2
    if ranks < 1:
        raise MomentError(f"--ranks {ranks}: must be at least 1")
    if device == "cuda" and ranks > len(cuda["devices"]):
        raise MomentError(f"--ranks {ranks}: this machine has {len(cuda['devices'])} CUDA device(s), and NCCL runs "
                          "one rank per device")
    rep = Report(device, version, cuda)
    if device == "cuda" and tests:
        rep.checks.append(_timed(cuda_tests))
    with contextlib.ExitStack() as stack:
        work = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moment-gpucheck-")))
        rep.checks.append(_timed(pipelined_epoch, device, work, ranks))
    rep.checks.append(_timed(staging_ring, device))
    return rep


def _timed(fn, *args) -> Check:
    t0 = time.perf_counter()
    try:
        c = fn(*args)
    except Exception as e:  # noqa: BLE001 - a check that breaks is reported as failed; the others still run
        c = Check(fn.__name__.replace("_", " "), "failed", str(e) if isinstance(e, MomentError) else
                  f"{type(e).__name__}: {e}")
    c.seconds = round(time.perf_counter() - t0, 2)
    return c


# ---- the CUDA tests ------------------------------------------------------------------------------------


def cuda_tests() -> Check:
    """The tests that run the CUDA-only lines, from this repository's tests/ (a clone has them; an
    installed wheel does not)."""
    files = sorted({t for ts in CUDA_LAYER.values() for t in ts} - {SELF_TEST} | set(CUDA_TOO))
    missing = [f for f in files if not (REPO / f).is_file()]
    if missing:
        return Check("cuda tests", "skipped", f"{missing[0]} is not here: run from a clone of the repository")
    try:
        import pytest  # noqa: F401
    except ImportError:
        return Check("cuda tests", "skipped", "pytest is not installed (pip install 'moment[dev]')")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *files]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    summary = next((ln.strip("= ") for ln in reversed(r.stdout.splitlines()) if " in " in ln and "=" in ln),
                   r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "no output")
    skipped = [ln for ln in r.stdout.splitlines() if ln.startswith("SKIPPED")]
    return Check("cuda tests", "ok" if r.returncode == 0 else "failed", f"{summary} ({' '.join(files)})",
                 data={"returncode": r.returncode, "skipped": skipped,
                       "failures": [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]})


# ---- a pipelined epoch against the in-memory one ------------------------------------------------------


def make_layout(root: Path, gpus: int) -> Path:
    """A small learnable graph and its layout: one GPU bin per rank, a CPU bin, two SSD bins."""
    from moment.placement import BinSet, ddak, write_layout
    from moment.workload.hotness import presample
    from moment.workload.synth import synthesize

    ds = synthesize(root / "ds", 4000, feature_dim=32, num_classes=4, seed=1, train_fraction=0.3,
                    val_fraction=0.1, test_fraction=0.05, overwrite=True)
    n = ds.num_nodes
    bins = BinSet.uniform(gpus=gpus, cpus=1, ssds=2, gpu_rows=n // 20, cpu_rows=n // 10, ssd_rows=n,
                          gpu_share=0.2, cpu_share=0.2)
    a = ddak(presample(ds, (10, 5), 64).feature_reads, bins, pool=10, cache_fill="capacity")
    return write_layout(root / "L", ds.file("features"), a, chunk_bytes=8192, overwrite=True)


def launch(ranks: int, args: list[str], metrics: Path) -> dict[str, Any]:
    """`moment.train ARGS` in this process (one rank) or under torchrun; its metrics."""
    args = [*args, "--metrics-json", str(metrics)]
    if ranks == 1:
        from moment.runtime.config import parse_args
        from moment.runtime.train import train

        return train(parse_args(args))
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "moment.train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([*run, *args], env=env, capture_output=True, text=True, timeout=900, check=False)
    if r.returncode != 0:  # a rank's own error line (moment.runtime.train.main), else torchrun's last words
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.startswith("error (rank")] or lines[-1:] or ["no output"]
        raise MomentError(f"training under torchrun exited with {r.returncode}: {said[0]}")
    return json.loads(metrics.read_text())


def pipelined_epoch(device: str, work: Path, ranks: int) -> Check:
    layout = make_layout(work, ranks)
    common = ["--layout", str(layout), "--device", device, "--epochs", "1", "--fanouts", "10,5", "--hidden", "32",
              "--lr", "0.01", "--threads", "1", "--quiet"]
    ref = launch(ranks, [*common, "--features-in-memory", "--no-pipeline"], work / "memory.json")
    got = launch(ranks, common, work / "tiered.json")
    a, b = ref["loss_curve"], got["loss_curve"]
    what = f"{ranks} rank(s) on {device}, {got.get('io_shape', '?')} reads"
    if len(a) != len(b) or not a:
        return Check("pipelined epoch", "failed", f"{what}: {len(b)} steps, the in-memory run had {len(a)}")
    diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
    tiers = {k: v for k, v in got.get("tier_rows", {}).items() if v}
    data = {"steps": len(a), "max_abs_diff": diff, "bit_exact": a == b, "tier_rows": tiers, "ranks": ranks}
    how = "bit for bit" if a == b else f"to {diff:.1e}"
    if diff > TOLERANCE[device]:
        return Check("pipelined epoch", "failed", f"{what}: the loss curve differs from the in-memory run's by "
                                                  f"{diff:.3g} (more than {TOLERANCE[device]:g} on {device})",
                     data=data)
    return Check("pipelined epoch", "ok", f"{what}: {len(a)} losses equal the in-memory run's {how} (rows from "
                                          + ", ".join(f"{k} {v}" for k, v in tiers.items()) + ")", data=data)


# ---- the staging ring under the sync debug mode -------------------------------------------------------


@contextlib.contextmanager
def _sync_debug(cuda: bool) -> Iterator[list[str]]:
    """On CUDA: torch warns at every call that blocks the host on the device; yields those warnings."""
    import torch

    seen: list[str] = []
    if not cuda:
        yield seen
        return
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode(before)
    seen += [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]


def staging_ring(device: str) -> Check:
    import numpy as np

    from moment.io.device import DeviceLayer, StagingRing

    dev = DeviceLayer(device)
    ring = StagingRing(dev, max(RING_BATCHES), slots=2)
    rng = np.random.default_rng(0)
    sent, got = [], []
    with _sync_debug(dev.cuda) as syncs:
        for n in RING_BATCHES:
            src = rng.integers(0, 256, n, dtype=np.uint8)
            stage = ring.take(n)
            stage.array[:n] = src
            got.append(stage.to_device(n))
            sent.append(src)
    bad = [i for i, (s, g) in enumerate(zip(sent, got, strict=True)) if not np.array_equal(s, g.cpu().numpy())]
    what = (f"{len(RING_BATCHES)} batches ({sum(RING_BATCHES) >> 20} MiB) through "
            + (f"{len(ring.bufs)} pinned slots" if dev.copies else "their own buffers"))
    data = {"batches": len(RING_BATCHES), "mismatched": bad, "synchronizing_calls": syncs}
    if bad:
        return Check("staging ring", "failed", f"{what}: batch {bad[0]} arrived changed", data=data)
    if syncs:
        return Check("staging ring", "failed", f"{what}: {len(syncs)} call(s) blocked the host: {syncs[0]}",
                     data=data)
    mode = "; no call blocked the host (sync debug mode warn)" if dev.cuda else " (no sync debug mode on CPU)"
    return Check("staging ring", "ok", f"{what}: every byte arrived{mode}", data=data)


# ---- the report ---------------------------------------------------------------------------------------


def render(rep: Report) -> list[str]:
    """The report for people, one line per check."""
    if rep.device is None:
        return [rep.note or "nothing checked"]
    where = (f"CUDA {rep.cuda['version']}, {len(rep.cuda['devices'])} device(s): {', '.join(rep.cuda['devices'])}"
             if rep.cuda else "no CUDA")
    lines = [f"checks on {rep.device} (torch {rep.torch}; {where})"]
    for c in rep.checks:
        lines.append(f"  {c.status:<7} {c.name:<16} {c.detail} [{c.seconds:.1f} s]")
        lines += [f"          {ln}" for ln in c.data.get("failures", [])[:10]]
    lines.append("all checks passed" if rep.ok else "some checks FAILED: see above")
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python -m moment.runtime.gpucheck [--device cpu|cuda] [--ranks N] [--no-tests] [--json]`."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m moment.runtime.gpucheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where there is one, else nothing runs")
    p.add_argument("--ranks", type=int, help="ranks of the pipelined epoch (default 2, or the CUDA devices, up to 2)")
    p.add_argument("--no-tests", action="store_true", help="leave out the repository's CUDA tests")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    try:
        rep = check_machine(a.device, tests=not a.no_tests, ranks=a.ranks)
    except MomentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep.to_json(), indent=2) if a.json else "\n".join(render(rep)))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
