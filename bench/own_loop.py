"""A user's own loop on `moment.open_run` against `moment train` on the same model: epoch time and loss curve.

examples/own_loop.py (its own 3-layer model, loss and AdamW) and `moment train --model
examples.own_loop:factory --loss examples.own_loop:loss --optimizer adamw ...` train the same batches on
`--nproc` gloo ranks, one after the other, alternating `--rounds` times, from the same layout (generated
into `--cache-dir` once). Prints each run's steady epochs (the first excluded: start-up), then
`epoch_s_own_loop`, `epoch_s_moment_train` (the medians over the rounds) and `ratio` = own loop /
moment train (1.0: the public loader costs nothing), and `loss_curves_equal`.

    python bench/own_loop.py [--nodes 50000] [--dim 64] [--epochs 3] [--rounds 2] [--nproc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def layout(cache: Path, nodes: int, dim: int) -> Path:
    from runtime_data import make_dataset, make_layout

    out = cache / f"own-loop-{nodes}x{dim}"
    if not (out / "L" / "manifest.json").exists():
        make_layout(make_dataset(out, nodes=nodes, dim=dim), out / "L")
    return out / "L"


def own_loop(lay: Path, epochs: int, nproc: int) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(REPO / "examples" / "own_loop.py"), str(lay), str(epochs)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    from moment.runtime.run import SUMMARY_PREFIX

    line = next(ln for ln in out.stdout.splitlines() if ln.startswith(SUMMARY_PREFIX))
    return json.loads(line.removeprefix(SUMMARY_PREFIX))


def moment_train(lay: Path, epochs: int, nproc: int, work: Path) -> dict:
    m = work / "m.json"
    cmd = [sys.executable, "-m", "moment", "train", "--nproc", str(nproc), "--layout", str(lay), "--run-dir",
           str(work / "runs"), "--memory-budget", "auto", "--model", "examples.own_loop:factory", "--loss",
           "examples.own_loop:loss", "--optimizer", "adamw", "--weight-decay", "5e-4", "--lr", "0.003",
           "--fanouts", "10,10,5", "--batch-size", "256", "--hidden", "64", "--epochs", str(epochs),
           "--checkpoint-every", "0", "--metrics-json", str(m), "--quiet"]
    subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    return json.loads(m.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("MOMENT_BENCH_CACHE", "/tmp/moment-bench")))
    a = ap.parse_args()
    a.cache_dir.mkdir(parents=True, exist_ok=True)
    lay = layout(a.cache_dir, a.nodes, a.dim)
    mine, theirs, equal = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            o, t = own_loop(lay, a.epochs, a.nproc), moment_train(lay, a.epochs, a.nproc, Path(tmp))
            equal &= np.allclose(o["loss_curve"], t["loss_curve"], rtol=1e-6, atol=1e-7)
            steady_o, steady_t = o["epoch_seconds"][1:], t["epoch_seconds"][1:]
            print(f"round {r + 1}: own_loop epochs {[round(x, 3) for x in steady_o]}  "
                  f"moment_train epochs {[round(x, 3) for x in steady_t]}")
            mine += steady_o
            theirs += steady_t
    em, et = float(np.median(mine)), float(np.median(theirs))
    print(f"graph: {a.nodes} nodes x {a.dim}, {a.nproc} ranks, {a.epochs} epochs (the first excluded), {a.rounds} rounds")
    print(f"epoch_s_own_loop: {em:.3f}")
    print(f"epoch_s_moment_train: {et:.3f}")
    print(f"loss_curves_equal: {str(bool(equal)).lower()}")
    print(f"ratio: {em / et:.3f}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
