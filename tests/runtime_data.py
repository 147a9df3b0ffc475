"""Tiny learnable graphs and their layouts for the runtime tests (built with the real placement API),
and the torchrun launch the 2-rank tests share.

Most tests should not build these themselves: tests/conftest.py's session fixtures `runtime_dataset`,
`runtime_layout` and `two_rank_run` build them once per session (read them; copy before changing)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from moment.placement import BinSet, ddak, write_layout
from moment.runtime import agent
from moment.runtime.collective_trace import TRACE_ENV
from moment.workload.graph import GraphDataset
from moment.workload.hotness import presample
from moment.workload.synth import synthesize

NODES, DIM, CLASSES = 4000, 32, 4
REPO = Path(__file__).resolve().parents[1]
# the pre-sampled hotness of each dataset, by its id (a hash of its files: equal content, equal hotness):
# several layouts of one dataset, or equal datasets in several modules, sample once
_HOTNESS: dict[str, object] = {}


def make_dataset(root: Path, nodes: int = NODES, dim: int = DIM, *, seed: int = 1, name: str = "ds") -> GraphDataset:
    return synthesize(root / name, nodes, feature_dim=dim, num_classes=CLASSES, seed=seed, train_fraction=0.3,
                      val_fraction=0.1, test_fraction=0.05, overwrite=True)


def make_layout(ds: GraphDataset, out: Path, *, align: int = 4096, row_mode: str = "auto",
                ssd_paths: list[str] | None = None) -> Path:
    """2 GPU bins (5% each), 1 CPU bin (10%), 2 SSDs; DDAK on pre-sampled hotness, caches filled."""
    n = ds.num_nodes
    h = _HOTNESS.get(ds.dataset_id)
    if h is None:
        h = _HOTNESS[ds.dataset_id] = presample(ds, (10, 5), 64)
    bins = BinSet.uniform(gpus=2, cpus=1, ssds=2, gpu_rows=n // 20, cpu_rows=n // 10, ssd_rows=n,
                          gpu_share=0.2, cpu_share=0.2, ssd_paths=ssd_paths)
    a = ddak(h.feature_reads, bins, pool=10, cache_fill="capacity")
    return write_layout(out, ds.file("features"), a, align=align, row_mode=row_mode, chunk_bytes=8192,
                        overwrite=True)


def torchrun(args: list[str], nproc: int = 2, restarts: int = 0, env: dict | None = None,
             script: Path | None = None, forked: bool = True) -> None:
    """`python -m moment.train ARGS` (or `script ARGS`) under torchrun (gloo on CPU); fails the test with the
    ranks' own words. `forked`: through `moment.runtime.agent`, whose ranks are forked from it, as `moment train`
    starts them (about 2 CPU-s less per rank); else plain torchrun's fresh interpreters, for a test that compares
    what each process measured of itself with what the budget charged it."""
    launcher = agent.COMMAND if forked else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*launcher, "--standalone", f"--nproc-per-node={nproc}"]
    if restarts:
        cmd.append(f"--max-restarts={restarts}")
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    # its own process group: on a timeout the ranks go down with torchrun instead of lingering as orphans
    entry = [str(script)] if script else ["-m", "moment.train"]
    p = subprocess.Popen([*cmd, *entry, *args], cwd=REPO, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError("torchrun hung for 480 s:\n" + out[-3000:] + err[-5000:]) from None
    # a rank's own last words (an abort's message, a Python error) come before torchrun's long traceback
    said = [ln for ln in err.splitlines() if re.search(r"terminate|what\(\)|Abort|Fatal|Error|error:", ln)]
    assert p.returncode == 0, out[-3000:] + "\n".join(said)[-4000:] + "\n...\n" + err[-3000:]


# the 2-rank runs' settings: small and quick, the same in every test that compares loss curves
# the peer tier on: its exchange rounds are collectives the 2-rank tests check (auto turns it off on CPU)
TRAIN_ARGS = ["--fanouts", "10,5", "--hidden", "32", "--lr", "0.01", "--threads", "1", "--peer-tier", "on"]


def train_args(layout: Path, out: Path, *extra: str) -> list[str]:
    """Two epochs of TRAIN_ARGS on `layout`, metrics to `out`: `two_rank_run`'s arguments plus `extra`."""
    return ["--layout", str(layout), "--epochs", "2", *TRAIN_ARGS, "--metrics-json", str(out), *extra]


def run_two_ranks(layout: Path, out_dir: Path) -> dict:
    """`two_rank_run`: through tests/exit_ranks.py (the real `moment.train` entry's `train()`), so the same
    launch also records each rank's threads once training has returned (`rank0.json`, `rank1.json`), and
    every collective each rank issued (`trace/`, moment.runtime.collective_trace); it writes the validation
    nodes' predictions (`val.csv`)."""
    torchrun([str(out_dir), *train_args(layout, out_dir / "m.json", "--predict", str(out_dir / "val.csv"),
                                        "--predict-nodes", "val")], script=REPO / "tests" / "exit_ranks.py",
             env={TRACE_ENV: str(out_dir / "trace")}, forked=False)
    return json.loads((out_dir / "m.json").read_text())


def run_restarted(layout: Path, out_dir: Path) -> None:
    """`restarted_run`: `moment train --nproc 2 --max-restarts 1` of `train_args` with the launcher's defaults (run
    directory `out_dir/runs`, checkpoints in it), rank 1 exiting after its fifth step; the launcher's exit status
    and stderr (`launch.json`), its metrics (`m.json`)."""
    from moment import testpoints

    e = {**os.environ, "OMP_NUM_THREADS": "1", testpoints.EXIT_ENV: "train-step:5"}
    r = subprocess.run([sys.executable, "-m", "moment", "train", "--nproc", "2", "--max-restarts", "1", "--run-dir",
                        str(out_dir / "runs"), *train_args(layout, out_dir / "m.json", "--quiet")], cwd=REPO, env=e,
                       capture_output=True, text=True, timeout=480, check=False)
    (out_dir / "launch.json").write_text(json.dumps({"returncode": r.returncode, "stderr": r.stderr}))


def make_split(ds: GraphDataset, out: Path, machines: int = 2, **kw) -> Path:
    """`ds` split over `machines` machines of paper-machine-b with 2 GPUs and 2 SSDs each (the GPU caches 2%, the
    CPU caches 5%: 560 of its 4000 rows on every machine), as `moment place --machines` writes it."""
    from moment.placement.api import SplitMachine, place_split
    from moment.planner.api import parse_inventory
    from moment.topology.profiles import load_profile

    topo = load_profile("paper-machine-b")
    inv = parse_inventory(None, 2, 2)
    h = _HOTNESS.get(ds.dataset_id)
    if h is None:
        h = _HOTNESS[ds.dataset_id] = presample(ds, (10, 5), 64)
    place_split(ds, out, [SplitMachine(f"m{k}", topo, inv) for k in range(machines)], hotness=h, gpu_cache="2%",
                cpu_cache="5%", verify=False, **kw)
    return out
