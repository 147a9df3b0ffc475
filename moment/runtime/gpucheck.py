"""Ready for the first GPU: the checks to run first on a machine with CUDA (`moment doctor --gpu`, or
`python -m moment.runtime.gpucheck`).

Why: CI has no GPU, so the runtime's CUDA side (the device layer's streams, pinned buffers and
`record_stream`; NCCL; the rank -> device map; the CUDA RNG state in checkpoints; DDP's device_ids) first
runs on a user's machine. These checks run it there in a few minutes, before hours of training, each
under a deadline (a hang is a failure, not a hung doctor):

- `cuda tests`: the repository's tests of the CUDA-only lines and of the CUDA side of code shared by both
  devices, which skip on a machine without CUDA (tools/cuda_tests.py in a clone lists them);
- `pipelined epoch`: a small layout trained for one epoch with the tiered, pipelined store and with the
  features in memory, on the device with the same ranks (up to `MAX_RANKS`, one per GPU, each matched to
  its plan GPU by PCI address): every batch's sampled ids, blocks, labels and feature bytes agree bit for
  bit (`moment.runtime.run_record`), and the loss curves within `TOLERANCE`;
- `collectives`: in the tiered run, every rank issued each collective from one thread, in the same order
  as every other rank (moment.runtime.collective_trace; NCCL deadlocks otherwise);
- `rank devices`: each rank ran on its own GPU, matched by PCI address, and holds a CUDA context on that
  GPU only (NVML: a thread of a rank that touched CUDA unbound makes a context on GPU 0);
- `staging ring`: batches of random bytes through `moment.io.device.StagingRing` with every copy delayed
  on its stream and a slow consumer (a refill that does not wait for the copy changes the bytes that
  arrive), under `torch.cuda.set_sync_debug_mode("warn")`: every byte arrives, no call blocks the host.

Every check is written for any device: `--device cpu` runs the same comparisons (tests/test_gpucheck.py
does, in CI); only the calls to `torch.cuda` are CUDA's own. Without CUDA (and no `--device cpu`)
nothing runs: one line says so. The summary counts what passed, what was skipped and why, and what
failed; it never calls a run with skipped checks a full pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from moment.errors import INSTALL_TRAIN, MomentError
from moment.runtime import agent
from moment.runtime.devices import cuda_available

# Imports inside functions: `moment doctor` loads the runtime only for the checks it runs.

#: how far the loss curves of the pipelined and the in-memory run may be apart on each device, as (absolute,
#: relative): on CPU nothing (the same bytes in the same order); on CUDA the atomic adds of scatter
#: reductions are not bit-reproducible, and Adam turns last-bit differences of near-zero gradients into
#: whole steps, so the curves drift apart a little. The batches themselves are compared bit for bit.
TOLERANCE = {"cpu": (0.0, 0.0), "cuda": (1e-3, 1e-2)}
MAX_RANKS = 4  # ranks of the pipelined epoch at most: one per GPU
#: seconds each check may take before it counts as hung (and fails)
DEADLINE = {"cuda tests": 600, "pipelined epoch": 900, "staging ring": 120}
REPO = Path(__file__).resolve().parents[2]
#: the developer script that lists the CUDA layer and its tests (a clone has it; an installed wheel does not)
CUDA_TESTS = REPO / "tools" / "cuda_tests.py"
RING_BATCHES = (3000, 70_000, 1 << 20, (1 << 20) + 7, 3 << 20, 100, 2 << 20, 4096)  # varying, through fixed slots
RING_DELAY_CYCLES = 50_000_000  # each copy waits this long on its stream first (tens of ms of GPU time)


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

    def counts(self) -> dict[str, int]:
        return {k: sum(c.status == k for c in self.checks) for k in ("ok", "skipped", "failed")}

    def summary(self) -> str:
        """'N passed, M skipped (why), K failed': a run with skipped checks is never called a full pass."""
        n = self.counts()
        why = "; ".join(f"{c.name}: {c.detail}" for c in self.checks if c.status == "skipped")
        line = f"{n['ok']} passed" + (f", {n['skipped']} skipped ({why})" if n["skipped"] else "")
        return line + (f", {n['failed']} FAILED: see above" if n["failed"] else "")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "counts": self.counts(), "summary": self.summary()}


def cuda_info() -> tuple[str | None, dict[str, Any] | None]:
    """(torch's version or None when torch is missing, CUDA's version and devices or None). Without a GPU
    driver, torch is not imported: `moment doctor --gpu` says so at once (1.4 s sooner on 2 cores)."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None, None
    if not cuda_available():
        return version, None
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return torch.__version__, {"version": torch.version.cuda, "devices": names}


def check_machine(device: str | None = None, *, tests: bool = True, ranks: int | None = None,
                  workdir: Path | None = None) -> Report:
    """Run the checks on `device` ("cuda", "cpu"; None: cuda where there is one, else nothing runs)."""
    version, cuda = cuda_info()
    if device is None and cuda is None:
        why = f"torch is not installed ({INSTALL_TRAIN})" if version is None else \
            f"torch {version} sees no CUDA device"
        return Report(None, version, None, note=f"no CUDA here: {why}; nothing to check on a GPU")
    device = device or "cuda"
    if device not in ("cpu", "cuda"):
        raise MomentError(f"--device {device!r}: choose cpu or cuda")
    if version is None:
        raise MomentError("torch is not installed", hint=INSTALL_TRAIN)
    if device == "cuda" and cuda is None:
        raise MomentError(f"--device cuda: torch {version} sees no CUDA device", hint="leave --device out, or "
                          "--device cpu to run the same checks on the CPU")
    if ranks is None:
        ranks = min(MAX_RANKS, len(cuda["devices"])) if device == "cuda" else 2
    if ranks < 1:
        raise MomentError(f"--ranks {ranks}: must be at least 1")
    if device == "cuda":  # one rank per GPU: the runtime's own rank -> device map refuses more
        from moment.runtime.devices import local_devices

        local_devices(device, ranks, [], f"--ranks {ranks}")
    rep = Report(device, version, cuda)
    if device == "cuda" and tests:
        rep.checks.append(_timed("cuda tests", cuda_tests))
    with contextlib.ExitStack() as stack:
        work = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moment-gpucheck-")))
        runs = _timed("pipelined epoch", pipelined_epoch, device, work, ranks)
        rep.checks.append(runs)
        rep.checks += [collectives(runs), rank_devices(runs, device)]
    rep.checks.append(_timed("staging ring", staging_ring, device))
    return rep


def _timed(name: str, fn: Callable[..., Check], *args) -> Check:
    """`fn(*args)` under its deadline (`DEADLINE[name]`), in a thread of its own: a check that hangs fails
    (its thread is left behind; the subprocesses a check starts have the same deadline and are killed)."""
    from moment.runtime.threads import start_thread

    box: list[Check] = []
    t0 = time.perf_counter()

    def run() -> None:
        try:
            box.append(fn(*args))
        except Exception as e:  # noqa: BLE001 - a check that breaks is reported as failed; the others still run
            box.append(Check(name, "failed", str(e) if isinstance(e, MomentError) else f"{type(e).__name__}: {e}"))

    limit = DEADLINE[name]
    start_thread(run, f"moment-check-{name.replace(' ', '-')}", "cpu").join(limit)
    c = box[0] if box else Check(name, "failed", f"did not finish within {limit} s: it hangs")
    c.seconds = round(time.perf_counter() - t0, 2)
    return c


def run_bounded(cmd: list[str], limit: float, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`cmd` in a process group of its own, killed with everything it started after `limit` seconds
    (MomentError): a hung NCCL rank never hangs the doctor. The error names where it hung when the process
    said so on stderr (the CUDA tests' pytest dumps a slow test's stacks: `tools/cuda_tests.py`)."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        at = hung_test(err or "")
        raise MomentError(f"{' '.join(cmd[:6])} ... did not finish within {limit:.0f} s: it hangs"
                          + (f" ({at})" if at else "")) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def hung_test(stderr: str) -> str | None:
    """The test frame of the last stack dump on `stderr` (faulthandler prints the most recent call first), as
    "tests/test_x.py, line N, in test_name"; None when there is none."""
    frames = re.findall(r'File "[^"]*?(tests/test_[^"]+)", line (\d+) in (\w+)', stderr.rpartition("Timeout (")[2])
    return f"{frames[0][0]}, line {frames[0][1]}, in {frames[0][2]}" if frames else None


# ---- the CUDA tests ------------------------------------------------------------------------------------


def cuda_tests() -> Check:
    """The tests that run the CUDA-only lines, as a clone's tools/cuda_tests.py lists them (an installed
    wheel has neither the list nor the tests)."""
    if not CUDA_TESTS.is_file():
        return Check("cuda tests", "skipped", "tools/cuda_tests.py is not here: run from a clone of the repository")
    listed = runpy.run_path(str(CUDA_TESTS))
    files = listed["files"]()
    missing = [f for f in files if not (REPO / f).is_file()]
    if missing:
        return Check("cuda tests", "skipped", f"{missing[0]} is not here: run from a clone of the repository")
    try:
        import pytest  # noqa: F401
    except ImportError:
        return Check("cuda tests", "skipped", "pytest is not installed (pip install 'moment[dev]')")
    r = run_bounded(listed["command"](sys.executable), DEADLINE["cuda tests"] - 30, cwd=REPO)
    return tests_check(r.returncode, r.stdout, files)


#: pytest's last line, with or without its rule of "=" (quiet mode leaves the rule out)
_PYTEST_COUNTS = re.compile(r"^=*\s*\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s")


def tests_check(returncode: int, stdout: str, files: list[str]) -> Check:
    """The CUDA tests' outcome from pytest's output: their summary line, and which were skipped (a skip on
    a CUDA machine says a test could not run its CUDA side: shown, never hidden in a pass)."""
    lines = stdout.splitlines()
    summary = next((ln.strip("= ") for ln in reversed(lines) if _PYTEST_COUNTS.search(ln)),
                   lines[-1] if lines else "no output")
    skipped = [ln for ln in lines if ln.startswith("SKIPPED")]
    data = {"returncode": returncode, "skipped": skipped,
            "failures": [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]}
    return Check("cuda tests", "ok" if returncode == 0 else "failed", f"{summary} ({' '.join(files)})", data=data)


# ---- a pipelined epoch against the in-memory one ------------------------------------------------------


def make_layout(root: Path, gpus: int, pci: list[str | None] | None = None) -> Path:
    """A small learnable graph and its layout: one GPU bin per rank (plan GPU r at PCI address pci[r], when
    given), a CPU bin, two SSD bins."""
    from moment.placement import BinSet, ddak, write_layout
    from moment.workload.hotness import presample
    from moment.workload.synth import synthesize

    ds = synthesize(root / "ds", 4000, feature_dim=32, num_classes=4, seed=1, train_fraction=0.3,
                    val_fraction=0.1, test_fraction=0.05, overwrite=True)
    n = ds.num_nodes
    bins = BinSet.uniform(gpus=gpus, cpus=1, ssds=2, gpu_rows=n // 20, cpu_rows=n // 10, ssd_rows=n,
                          gpu_share=0.2, cpu_share=0.2)
    if pci is not None:
        for r, i in enumerate(bins.of_kind("gpu")):
            bins.bins[i] = bins.bins[i].model_copy(update={"pci": pci[r]})
    a = ddak(presample(ds, (10, 5), 64).feature_reads, bins, pool=10, cache_fill="capacity")
    return write_layout(root / "L", ds.file("features"), a, chunk_bytes=8192, overwrite=True)


def plan_addresses(device: str, ranks: int) -> list[str | None] | None:
    """The plan GPUs' PCI addresses for the doctor's layout: on CUDA the last `ranks` visible devices in
    reverse order, so that each rank must find its device by address (local rank order would not)."""
    if device != "cuda":
        return None
    from moment.runtime.devices import cuda_pci_addresses

    visible = cuda_pci_addresses() or []
    return list(reversed(visible[-ranks:]))


def launch(ranks: int, args: list[str], metrics: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`moment.train ARGS` under torchrun, within the pipelined epoch's deadline (its own processes: the records
    are written by each rank); its metrics."""
    args = [*args, "--metrics-json", str(metrics)]
    run = [*agent.COMMAND, "--standalone", f"--nproc-per-node={ranks}", "-m", agent.RANK_MODULE]
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    r = run_bounded([*run, *args], DEADLINE["pipelined epoch"] / 2 - 30, env=full)
    if r.returncode != 0:  # a rank's own error line (moment.runtime.train.main), else torchrun's last words
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        said = [ln for ln in lines if ln.startswith("error (rank")] or lines[-1:] or ["no output"]
        raise MomentError(f"training under torchrun exited with {r.returncode}: {said[0]}")
    return json.loads(metrics.read_text())


def pipelined_epoch(device: str, work: Path, ranks: int) -> Check:
    """One epoch, tiered and pipelined against the features in memory: the same batches bit for bit, the
    loss curves within TOLERANCE. Its data keep what the checks after it read (the records)."""
    from moment.runtime.collective_trace import TRACE_ENV
    from moment.runtime.run_record import RECORD_ENV

    layout = make_layout(work, ranks, plan_addresses(device, ranks))
    common = ["--layout", str(layout), "--device", device, "--epochs", "1", "--fanouts", "10,5", "--hidden", "32",
              "--lr", "0.01", "--threads", "1", "--quiet"]
    ref = launch(ranks, [*common, "--features-in-memory", "--no-pipeline"], work / "memory.json",
                 {RECORD_ENV: str(work / "memory")})
    # the peer tier on, as on CUDA by default: on CPU too its exchange rounds are checked
    got = launch(ranks, [*common, "--peer-tier", "on"], work / "tiered.json", {RECORD_ENV: str(work / "tiered"),
                                                                               TRACE_ENV: str(work / "trace")})
    what = f"{ranks} rank(s) on {device}, {got.get('io_shape', '?')} reads"
    tiers = {k: v for k, v in got.get("tier_rows", {}).items() if v}
    a, b = ref["loss_curve"], got["loss_curve"]
    data: dict[str, Any] = {"steps": len(b), "ranks": ranks, "tier_rows": tiers, "work": str(work),
                            "per_rank": got.get("per_rank", [])}
    if len(a) != len(b) or not a:
        return Check("pipelined epoch", "failed", f"{what}: {len(b)} steps, the in-memory run had {len(a)}", data=data)
    differ = batch_differences(_records(work / "memory", ranks), _records(work / "tiered", ranks))
    diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
    atol, rtol = TOLERANCE[device]
    far = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if abs(x - y) > atol + rtol * abs(x)]
    data |= {"max_abs_diff": diff, "bit_exact": a == b, "batch_differences": differ[:20]}
    if differ:
        return Check("pipelined epoch", "failed", f"{what}: {len(differ)} batch(es) differ from the in-memory run's: "
                                                  f"{differ[0]}", data=data)
    if far:
        return Check("pipelined epoch", "failed", f"{what}: the loss of step {far[0] + 1} differs from the in-memory "
                                                  f"run's by {abs(a[far[0]] - b[far[0]]):.3g} (more than {atol:g} + "
                                                  f"{rtol:g} x the loss on {device})", data=data)
    how = "bit for bit" if a == b else f"to {diff:.1e}"
    return Check("pipelined epoch", "ok", f"{what}: every batch's ids, blocks, labels and feature bytes equal the "
                                          f"in-memory run's, and {len(a)} losses {how} (rows from "
                                          + ", ".join(f"{k} {v}" for k, v in tiers.items()) + ")", data=data)


def _records(where: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((where / f"run-rank{r}.json").read_text()) for r in range(ranks)]


def batch_differences(ref: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
    """Where two runs' recorded batches differ (rank by rank, batch by batch): 'rank R batch B: features'."""
    out = []
    for r, (x, y) in enumerate(zip(ref, got, strict=True)):
        if len(x["batches"]) != len(y["batches"]):
            out.append(f"rank {r}: {len(y['batches'])} batches, the reference {len(x['batches'])}")
        for p, q in zip(x["batches"], y["batches"], strict=False):
            bad = [k for k in ("ids", "blocks", "labels", "features") if p[k] != q[k]]
            if bad:
                out.append(f"rank {r} batch {q['batch']} of epoch {q['epoch'] + 1}: {', '.join(bad)}")
    return out


def _needs_runs(name: str, runs: Check) -> Check | None:
    if runs.status == "failed" or "work" not in runs.data:
        return Check(name, "skipped", "needs the pipelined epoch's runs, which failed")
    return None


def collectives(runs: Check) -> Check:
    """In the pipelined epoch's tiered run: every rank's collectives from one thread, in one order."""
    from moment.runtime.collective_trace import check

    skip = _needs_runs("collectives", runs)
    if skip is not None:
        return skip
    ranks = runs.data["ranks"]
    where = Path(runs.data["work"]) / "trace"
    if ranks == 1:
        return Check("collectives", "skipped", "one rank: no collective to order")
    calls = [json.loads((where / f"collectives-rank{r}.json").read_text())["calls"] for r in range(ranks)]
    problems = check(calls)
    data = {"calls": [len(c) for c in calls], "problems": problems}
    if problems:
        return Check("collectives", "failed", problems[0], data=data)
    return Check("collectives", "ok", f"{ranks} ranks issued {len(calls[0])} collectives each, every one from its "
                                      "training thread, in the same order", data=data)


def rank_devices(runs: Check, device: str) -> Check:
    """In the pipelined epoch's tiered run: each rank on its own GPU, matched by PCI address, holding a CUDA
    context there only."""
    from moment.runtime.devices import normalise_pci

    skip = _needs_runs("rank devices", runs)
    if skip is not None:
        return skip
    if device != "cuda":
        return Check("rank devices", "skipped", "no GPU: the ranks run on the CPU")
    recs = _records(Path(runs.data["work"]) / "tiered", runs.data["ranks"])
    per = {r["rank"]: r for r in runs.data["per_rank"]}
    problems = []
    devices = [r["device"] for r in recs]
    if len(set(devices)) != len(devices):
        problems.append(f"two ranks on one device: {devices}")
    for rec in recs:
        how = per.get(rec["rank"], {}).get("matched_by")
        if how != "pci bus id":
            problems.append(f"rank {rec['rank']} took {rec['device']} by {how}, not by its plan GPU's PCI address")
        if rec["gpu_contexts"] is not None:
            held = sorted({normalise_pci(b) for b in rec["gpu_contexts"]})
            if held != [normalise_pci(rec["pci"])]:
                problems.append(f"rank {rec['rank']} (on {rec['device']} at {rec['pci']}) holds CUDA contexts on "
                                f"{', '.join(map(str, held)) or 'no GPU'}")
    nvml = all(rec["gpu_contexts"] is not None for rec in recs)
    data = {"devices": devices, "problems": problems, "nvml": nvml}
    if problems:
        return Check("rank devices", "failed", problems[0], data=data)
    ctx = ("each holds a CUDA context on its own GPU only (NVML)" if nvml else
           "NVML could not list the GPUs' processes (pip install nvidia-ml-py): contexts not checked")
    return Check("rank devices", "ok", f"{len(recs)} ranks on {', '.join(devices)}, matched by PCI address; {ctx}",
                 data=data)


# ---- the staging ring: delayed copies, a slow consumer, the sync debug mode ------------------------------


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
    seen += host_syncs(str(w.message) for w in caught)


#: what torch says once as the mode is set (seen on torch 2.11): a notice about the mode, not a call that blocked
SYNC_MODE_NOTICE = "debug mode is a prototype feature"


def host_syncs(messages: Iterable[str]) -> list[str]:
    """The warnings of the sync debug mode that name a call blocking the host; its notice about itself is not
    one (counting it failed the staging ring on the first GPU run)."""
    return [m for m in messages if "synchroniz" in m.lower() and SYNC_MODE_NOTICE not in m]


def staging_ring(device: str) -> Check:
    """Random bytes through the ring, every copy delayed on its stream, the device batches read only at the
    end (a slow consumer): a buffer refilled before its copy is done would send the new bytes."""
    import numpy as np

    from moment.io.device import DeviceLayer, StagingRing

    dev = DeviceLayer(device)
    dev.copy_delay = RING_DELAY_CYCLES
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
            + (f"{len(ring.bufs)} pinned slots, each copy delayed" if dev.copies else "their own buffers"))
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
    """The report for people, one line per check, and the count of each outcome."""
    if rep.device is None:
        return [rep.note or "nothing checked"]
    where = (f"CUDA {rep.cuda['version']}, {len(rep.cuda['devices'])} device(s): {', '.join(rep.cuda['devices'])}"
             if rep.cuda else "no CUDA")
    lines = [f"checks on {rep.device} (torch {rep.torch}; {where})"]
    for c in rep.checks:
        lines.append(f"  {c.status:<7} {c.name:<16} {c.detail} [{c.seconds:.1f} s]")
        lines += [f"          {ln}" for ln in c.data.get("failures", [])[:10]]
    lines.append(rep.summary())
    return lines


def main(argv: list[str] | None = None) -> int:
    """`python -m moment.runtime.gpucheck [--device cpu|cuda] [--ranks N] [--no-tests] [--json]`."""
    p = argparse.ArgumentParser(prog="python -m moment.runtime.gpucheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where there is one, else nothing runs")
    p.add_argument("--ranks", type=int, help=f"ranks of the pipelined epoch (default 2 on CPU, one per CUDA device "
                                             f"up to {MAX_RANKS})")
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
