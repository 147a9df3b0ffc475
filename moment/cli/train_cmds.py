"""`moment train`: a thin wrapper that launches `python -m moment.train` under torchrun on this machine.

Why a wrapper and not the training loop itself: torchrun owns process creation, rendezvous and
restarts (`--max-restarts`), so one-machine runs and multi-machine runs (`torchrun --nnodes ...
--rdzv-endpoint ...` directly) go through the same entry point.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperCommand

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


def _precheck(args: list[str], nproc: int = 1, run_dir: Path | None = None) -> tuple[Any, dict[str, str]]:
    """Catch user errors (bad flags, missing layout or dataset, more ranks than the layout's GPUs, a budget
    below the minimum) here, before torchrun starts N ranks. Returns the parsed configuration and what the
    ranks' environment must add so that their own checks use the same numbers."""
    from moment.runtime.runs import CHECKPOINTS, run_root
    from moment.runtime.config import parse_args
    from moment.runtime.devices import check_local_ranks
    from moment.runtime.train import BASE_ENV, dataset_dir, layout_gpus, preview_split, rank_start_bytes
    from moment.workload.graph import GraphDataset

    cfg = parse_args(args, check=False)
    anchor = cfg.layout or cfg.dataset
    if cfg.checkpoint_dir is None and cfg.checkpoint_every != 0 and not cfg.resume and anchor is not None:
        # checked with the checkpoint directory `train` gives the run (in its run directory, made later)
        cfg.model_copy(update={"checkpoint_dir": run_root(run_dir, Path(anchor)) / CHECKPOINTS}).check()
    else:
        cfg.check()
    check_local_ranks(nproc, [g for g, _ in layout_gpus(cfg)], f"--nproc {nproc}")
    ds = GraphDataset.open(dataset_dir(cfg))
    ds.check()  # a damaged dataset is one line here, not one per rank (rank 0 prints any note)
    if cfg.layout is not None:
        from moment.placement.reader import check_dataset, load_manifest

        note = check_dataset(cfg.layout, load_manifest(cfg.layout), ds)  # refuses another dataset
        if note:
            err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if cfg.memory_budget and cfg.features == "tiered":
        preview_split(cfg, ds, nproc)  # as rank 0 will split it: a budget below the minimum is one message
        return cfg, {BASE_ENV: str(rank_start_bytes())}  # the ranks charge the figure this check charged
    return cfg, {}


def _forwarded_options() -> str:
    from moment.runtime.config import option_names

    return ", ".join(option_names())


class _TrainCommand(TyperCommand):
    """Lists the options it forwards only when its help is shown: asking the runtime's configuration
    for them costs a fifth of a second, which every other command (`moment plan`) would pay."""

    @property
    def epilog(self) -> str:
        return ("Every other option goes to `python -m moment.train` (run `python -m moment.train --help`): "
                + _forwarded_options() + ".")

    @epilog.setter
    def epilog(self, _value) -> None:
        pass


@app.command(
    "train",
    cls=_TrainCommand,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def train(
    ctx: typer.Context,
    nproc: Annotated[int, typer.Option("--nproc", help="ranks (GPUs) on this machine: 1 to the layout's GPUs")] = 1,
    max_restarts: Annotated[int, typer.Option("--max-restarts",
                                              help="torchrun restarts after a failed rank (they resume from "
                                                   "the last checkpoint)")] = 0,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="where this run's checkpoints and torchrun's log go, in a new timestamped folder "
                          "(default: LAYOUT.runs beside the layout)")] = None,
) -> None:
    """Train a GNN from a layout with NPROC data-parallel ranks (torchrun --standalone).

    The ranks' progress and errors are shown; torchrun's own messages go to RUN_DIR/torchrun.log.
    Checkpoints go to RUN_DIR/checkpoint unless --checkpoint-dir is given, so a restart resumes.
    """
    from moment.cli import err_console
    from moment.cli.train_launch import report, run
    from moment.runtime.runs import CHECKPOINTS, LOG, make_run_dir

    if nproc < 1:
        raise MomentError(f"--nproc {nproc}: must be an integer >= 1")
    if max_restarts < 0:
        raise MomentError(f"--max-restarts {max_restarts}: must be an integer >= 0")
    _check_torch()
    if not ctx.args:
        raise MomentError("nothing to train: pass at least --layout LAYOUT (see --help)")
    args = list(ctx.args)
    cfg, rank_env = _precheck(args, nproc, run_dir)
    run_path = make_run_dir(run_dir, Path(cfg.layout or cfg.dataset))
    where = f"run directory {run_path}: torchrun's log"
    if cfg.checkpoint_dir is None and cfg.checkpoint_every != 0:
        args += ["--checkpoint-dir", str(run_path / CHECKPOINTS)]
        where += ", checkpoints (resume with --resume --checkpoint-dir " + str(run_path / CHECKPOINTS) + ")"
    if not cfg.quiet:
        err_console.print(where, highlight=False, soft_wrap=True)
    env = {**os.environ, **rank_env}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    code = report(run(torchrun_command(nproc, args, max_restarts), env, run_path / LOG, max_restarts))
    if code:
        raise typer.Exit(code)
