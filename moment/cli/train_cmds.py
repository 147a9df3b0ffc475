"""`moment train`: a thin wrapper that launches `python -m moment.train` under torchrun on this machine.

Why a wrapper and not the training loop itself: torchrun owns process creation, rendezvous and
restarts (`--max-restarts`), so one-machine runs and multi-machine runs (`torchrun --nnodes ...
--rdzv-endpoint ...` directly) go through the same entry point.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Annotated

import typer

from rich.markup import escape

from moment.cli import app, err_console
from moment.errors import MomentError


def torchrun_command(nproc: int, args: list[str], max_restarts: int = 0) -> list[str]:
    """The command line `moment train` runs (uses this interpreter's torch.distributed.run)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    return [*cmd, "-m", "moment.train", *args]


def _check_torch() -> None:
    for mod in ("torch", "torch_geometric"):
        if importlib.util.find_spec(mod) is None:
            raise MomentError(f"training needs {mod}, which is not installed",
                              hint="pip install -e .[train]")


def _precheck(args: list[str], nproc: int = 1) -> None:
    """Catch user errors (bad flags, missing layout or dataset) here, before torchrun starts N ranks."""
    from moment.runtime.config import parse_args
    from moment.runtime.train import dataset_dir
    from moment.workload.graph import GraphDataset

    cfg = parse_args(args)
    ds = GraphDataset.open(dataset_dir(cfg))
    if cfg.layout is not None:
        from moment.placement.reader import check_dataset, load_manifest

        note = check_dataset(cfg.layout, load_manifest(cfg.layout), ds)  # refuses another dataset
        if note:
            err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if cfg.memory_budget and cfg.features == "tiered":
        _check_budget(cfg, ds, nproc)


def _check_budget(cfg, ds, nproc: int) -> None:
    """Split the budget here as rank 0 will, so a budget below the minimum is one message, not N."""
    from moment.runtime.train import preview_split

    preview_split(cfg, ds, nproc)


@app.command(
    "train",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Every other option goes to `python -m moment.train` (run `python -m moment.train --help`): "
    "--layout, --model, --epochs, --metrics-json, --dataset, --fanouts, --batch-size, --hidden, --layers, "
    "--lr, --seed, --checkpoint-dir, --checkpoint-every, --resume, --memory-budget, --cache-policy, --io-shape, "
    "--superbatch, --cpu-cache-limit, --features-in-memory, "
    "--features-memmap, --io-backend, --verify, --no-pipeline, --device, --quiet.",
)
def train(
    ctx: typer.Context,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="ranks (GPUs) on this machine")] = 1,
    max_restarts: Annotated[int, typer.Option("--max-restarts", min=0,
                                              help="torchrun restarts after a failed rank (resumes from "
                                                   "--checkpoint-dir)")] = 0,
) -> None:
    """Train a GNN from a layout with NPROC data-parallel ranks (torchrun --standalone)."""
    _check_torch()
    if not ctx.args:
        raise MomentError("nothing to train: pass at least --layout LAYOUT (see --help)")
    _precheck(list(ctx.args), nproc)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    code = subprocess.call(torchrun_command(nproc, list(ctx.args), max_restarts), env=env)
    if code:
        raise typer.Exit(code)
