"""`moment train`: a thin wrapper that launches `python -m moment.train` under torchrun on this machine.

Why a wrapper and not the training loop itself: torchrun owns process creation, rendezvous and
restarts (`--max-restarts`), so one-machine runs and multi-machine runs (`--nnodes N --node-rank K
--rdzv-endpoint HOST:PORT`: torchrun's c10d rendezvous, see moment.runtime.rendezvous) go through the
same entry point.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperCommand

from moment.cli import app, console, err_console
from moment.errors import INSTALL_TRAIN, MomentError
from moment.gcpause import loading

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.


def torchrun_command(nproc: int, args: list[str], max_restarts: int = 0, rdzv: Any = None,
                     hold: str | None = None) -> list[str]:
    """The command line `moment train` runs (torchrun's agent, this interpreter's: moment.runtime.agent); `rdzv`:
    the rendezvous of a run across machines (moment.runtime.rendezvous.Rendezvous), else --standalone; `hold`:
    the agent's `--hold` mode (train_launch.HeldAgent)."""
    from moment.runtime.agent import COMMAND, RANK_MODULE

    where = rdzv.torchrun_args() if rdzv is not None else ["--standalone"]
    cmd = [*COMMAND, *(["--hold", hold] if hold else []), *where, f"--nproc-per-node={nproc}"]
    if max_restarts:
        cmd.append(f"--max-restarts={max_restarts}")
    return [*cmd, "-m", RANK_MODULE, *args]


def _check_torch() -> None:
    """The built-in models need torch alone (their layers are Moment's); a user's model whose module needs
    PyG is refused where it is imported, naming the missing module (model_spec.load_callable)."""
    if importlib.util.find_spec("torch") is None:
        raise MomentError("training needs torch, which is not installed", hint=INSTALL_TRAIN)


def _refuse_run_outputs(cfg: Any, run_dir: Path | None) -> None:
    """A dry run writes nothing, so a flag naming where a run writes would silently do nothing: refused."""
    given = [flag for flag, v in (("--metrics-json", cfg.metrics_json), ("--checkpoint-dir", cfg.checkpoint_dir),
                                  ("--run-dir", run_dir)) if v is not None]
    if given:
        raise MomentError(f"{given[0]}: a dry run trains nothing, so it writes nothing there; drop {given[0]} "
                          "or --dry-run")


def _checkpoints_said(checkpoints: Path, rdzv: Any) -> str:
    """Where a run's checkpoints go, as the run's first line says it. Machine K > 0 writes none (machine 0's rank 0
    writes them, and every machine resumes from them): it was told to resume from its own empty folder."""
    if rdzv is None or rdzv.node_rank == 0:
        return f", checkpoints (resume with --resume --checkpoint-dir {checkpoints})"
    return ("; the checkpoints are machine 0's, in its run directory (to resume, start every machine with --resume "
            "--checkpoint-dir DIR, machine 0 with the checkpoint folder its first line names)")


def _precheck(args: list[str], nproc: int = 1, run_dir: Path | None = None, *,
              plan: bool = False, rdzv: Any = None, launch: Callable[[bool], Any] | None = None,
              ) -> tuple[Any, dict[str, str], Any]:
    """Catch user errors (bad flags, missing layout or dataset, more ranks than the layout's GPUs or than the
    visible CUDA devices, a budget below the minimum) here, before torchrun starts N ranks. Returns the
    parsed configuration, what the ranks' environment must add so that their own checks use the same
    numbers, and the run plan the ranks will resolve (when there is a budget to check, or `plan`; else None).
    `launch(measure)`: starts torchrun's agent held (train_launch.HeldAgent) once the options, the layout and the
    devices are checked, so that it loads torch while the dataset (its whole graph read, seconds when cold), the
    model and the budget are checked; with `measure` its start sizes are the ones the budget charges."""
    from moment.runtime.config import BUILT_IN_MODELS, parse_args
    from moment.runtime.start_sizes import measure_ahead

    cfg = parse_args(args, check=False)
    # a fresh rank's size, which the preview below charges: one recorded, or measured while the checks run, by a
    # fresh interpreter or by the run's own agent (start_sizes says which; the plan says when)
    sized = (cfg.memory_budget or cfg.device_memory_budget or plan) and cfg.features == "tiered"
    known = sized and measure_ahead(budgeted=bool(cfg.memory_budget or cfg.device_memory_budget), model=cfg.model,
                                    start=launch is None)

    from moment.placement.opened import Layout
    from moment.runtime.devices import check_local_ranks, cuda_pci_addresses, default_device, local_devices
    from moment.runtime.run_plan import dataset_dir, layout_gpus
    from moment.runtime.runs import check_run_dir
    from moment.workload.graph import CHECKED_ENV, GraphDataset

    if plan:  # a dry run writes nothing: a flag naming where a run writes is refused, no run directory checked
        _refuse_run_outputs(cfg, run_dir)
    else:
        check_run_dir(run_dir)
    if cfg.layout is not None:
        from moment.placement.split import refuse_split_dir

        refuse_split_dir(cfg.layout)
    anchor = cfg.layout or cfg.dataset
    if plan and cfg.data_only:
        raise MomentError("--data-only runs the data path to measure its feed rate; a dry run starts no rank "
                          "and reads nothing, and its plan is the same with or without it: drop --data-only "
                          "or --dry-run")
    cfg.check(run_dir=True)  # `train` gives a run without --checkpoint-dir its run directory's
    if plan and cfg.features != "tiered":
        raise MomentError("--dry-run shows the run plan of a tiered run: the --features-in-memory and "
                          "--features-memmap baselines have no tiers, caches or memory split to plan")
    layout = Layout.open(cfg.layout) if cfg.layout is not None else None  # its manifests are read once
    if layout is not None and cfg.features == "tiered":
        layout.check_files()  # one line here, not a traceback per rank; a dry run of it refused as well
        _check_split(cfg.layout, layout, rdzv)
    if not plan and run_dir is None:  # its default, beside the layout (or dataset): torchrun's log goes there
        check_run_dir(None, Path(anchor))
    device, gpus = default_device(cfg.device), layout_gpus(cfg, layout)
    if plan and device == "cuda" and cuda_pci_addresses() is None:  # a dry run may plan a GPU machine elsewhere
        check_local_ranks(nproc, [g for g, _ in gpus], f"--nproc {nproc}")
        err_console.print("[yellow]note:[/] CUDA is not available here: this is the plan of the run on a machine "
                          "with GPUs; here the run stops at its start (--device cpu trains on this one)",
                          highlight=False)
    else:
        local_devices(device, nproc, gpus, f"--nproc {nproc}")
    ds = GraphDataset.open(dataset_dir(cfg, layout))
    if layout is not None:
        from moment.placement.reader import check_dataset

        note = check_dataset(cfg.layout, layout.manifest, ds)  # refuses another dataset (from the manifests)
        if note:
            err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if launch is not None:
        # it loads while the dataset, the model and the budget are checked (a refused run stops it)
        agent = launch(bool(sized and not known))
        if sized and not known:
            from moment.runtime.start_sizes import measured_by

            measured_by(agent, cfg.model)
    # a damaged dataset is one line here, not one per rank (rank 0 prints any note); the ranks are told it was
    # checked, and do not check it again unless it changed meanwhile
    _, checked = ds.vouch()
    vouched = {CHECKED_ENV: checked} if checked else {}
    if plan and cfg.fanouts:  # a run's rank 0 says it; a dry run has no rank
        from moment.runtime.config import effective_fanouts
        from moment.workload.graph import degree_histogram

        _, note = effective_fanouts(cfg.resolved_fanouts(), degree_histogram(ds.indptr).size - 1)  # the largest degree
        if note:
            err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    if cfg.model not in BUILT_IN_MODELS or cfg.loss is not None:  # a wrong one is one line here, not one per rank
        from moment.runtime.footprint import multilabel_targets
        from moment.runtime.link_task import out_dim
        from moment.runtime.model_spec import load_loss, make_model

        width = out_dim(cfg.task, cfg.model, cfg.hidden, ds.num_classes)
        make_model(cfg, ds.feature_dim, width, len(cfg.resolved_fanouts()))
        load_loss(cfg.loss, width, multilabel_targets(cfg.task, ds.multilabel))
    if (cfg.memory_budget or cfg.device_memory_budget or plan) and cfg.features == "tiered":
        from moment.runtime.sizing import extent_env, preview_plan, start_env

        nnodes = rdzv.nnodes if rdzv is not None else 1
        # as the ranks will resolve it: a budget below the minimum is one message, here
        run_plan = preview_plan(cfg, ds, nproc, layout=layout, nnodes=nnodes)
        # the ranks charge the figures this check charged (its batch extent: not sampled again by each)
        env = {**(start_env(cfg.model) if cfg.memory_budget else {}), **extent_env(cfg, ds, nproc * nnodes)}
        return cfg, {**env, **vouched}, run_plan
    return cfg, vouched, None


def _check_split(path: Path, layout: Any, rdzv: Any) -> None:
    """A machine's part of a split layout trains on its own machine of the split: --nnodes is the split's
    machine count and --node-rank its index (the other machines own the rows it lacks)."""
    s = layout.split
    if s is None:
        return
    n = len(s.machines)
    if rdzv is None:
        raise MomentError(f"this is machine {s.name}'s part of a layout split over {n} machines ({', '.join(s.machines)}): "
                          "its other rows are on the others, which train with it", source=str(path),
                          hint=f"start every machine with its own part: moment train --nnodes {n} --node-rank "
                               f"{s.machine} --rdzv-endpoint HOST:PORT --layout {path} on {s.name}, and so on")
    if rdzv.nnodes != n:
        raise MomentError(f"--nnodes {rdzv.nnodes}, but the layout is split over {n} machines ({', '.join(s.machines)})",
                          source=str(path), hint=f"give --nnodes {n}")
    if rdzv.node_rank != s.machine:
        raise MomentError(f"--node-rank {rdzv.node_rank}, but this is machine {s.name}'s layout, node rank {s.machine}",
                          source=str(path), hint=f"give --node-rank {s.machine} with this layout, or machine "
                                                 f"{s.machines[rdzv.node_rank]}'s layout with --node-rank {rdzv.node_rank}")


def _reading(args: list[str]) -> AbstractContextManager:
    """The run's layout held shared (moment.locking.shared) from before its checks to the run's end: `moment
    layout rm` (and `moment place` over it) is refused while the run reads it, naming the run, which used to have
    its layout and run directory deleted from under it. Other runs on the layout share it. The kernel drops it
    with this process, so a run killed with -9 blocks nothing."""
    from moment.locking import shared
    from moment.runtime.config import layout_in

    layout = layout_in(args)
    return shared(layout, "layout") if layout is not None else nullcontext()


def _print_plan(plan, json_out: bool) -> None:
    if json_out:
        print(plan.model_dump_json(indent=2))
        return
    for line in plan.lines():
        console.print(escape(line), highlight=False, soft_wrap=True)


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
    nproc: Annotated[int, typer.Option("--nproc", help="ranks (GPUs) on this machine: 1 to the layout's GPUs "
                                                        "and the visible CUDA devices")] = 1,
    nnodes: Annotated[int, typer.Option("--nnodes", help="machines training together (torchrun's c10d rendezvous); "
                                                         "start `moment train` on each")] = 1,
    node_rank: Annotated[int | None, typer.Option(
        "--node-rank", help="with --nnodes: this machine's number, 0 to N-1 (machine 0 prints, writes the metrics "
                            "and the checkpoints; a split layout's machine K trains with --node-rank K)",
        show_default=False)] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        "--rdzv-endpoint", help="with --nnodes: HOST:PORT of the rendezvous, the same on every machine (machine 0's "
                                "address or hostname)", show_default=False)] = None,
    rdzv_timeout: Annotated[int | None, typer.Option(
        "--rdzv-timeout", help="with --nnodes: seconds to wait for every machine to join (also after a restart); "
                               "default 600", show_default=False)] = None,
    max_restarts: Annotated[int, typer.Option("--max-restarts",
                                              help="torchrun restarts after a failed rank (they resume from "
                                                   "the last checkpoint)")] = 0,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="where this run's checkpoints and torchrun's log go, in a new timestamped folder "
                          "(default: LAYOUT.runs beside the layout)")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="resolve the run plan the ranks would (I/O shape and pack match, each rank's plan GPUs, "
                          "GPU-tier rows and SSD shares, the CPU cache, the memory budget's split), print it "
                          "and exit; starts neither torchrun nor any rank")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="with --dry-run: the run plan as one JSON object")] = False,
) -> None:
    """Train a GNN from a layout with NPROC data-parallel ranks (torchrun --standalone), or on several
    machines: `--nnodes N --node-rank K --rdzv-endpoint HOST:PORT` on each, with its own --layout.

    The ranks' progress and errors are shown; torchrun's own messages go to RUN_DIR/torchrun.log.
    Checkpoints go to RUN_DIR/checkpoint unless --checkpoint-dir is given, so a restart resumes (on
    several machines, machine 0's).
    With --dry-run, only the run plan is printed (--json: keys io_shape, cache_policy, pack, tiers,
    ranks [{rank, plan_gpus, gpu_bins, ssd_shares}], memory {budget_bytes, predicted_peak_bytes, items,
    cpu_rows, ..., device}, device: a CUDA run's device budget per rank {budget_bytes, predicted_peak_bytes,
    items, gpu_rows, gpu_rows_wanted, source}, null on CPU; split {id, machine, name, machines, held_rows,
    remote_rows} for a machine's part of a split layout, else null).
    """
    from moment.cli.train_launch import HeldAgent, report, run
    from moment.runtime.rendezvous import parse_rendezvous
    from moment.runtime.runs import CHECKPOINTS, LOG, make_run_dir

    rdzv = parse_rendezvous(nnodes, node_rank, rdzv_endpoint, rdzv_timeout)
    if nproc < 1:
        raise MomentError(f"--nproc {nproc}: must be an integer >= 1")
    if max_restarts < 0:
        raise MomentError(f"--max-restarts {max_restarts}: must be an integer >= 0")
    if json_out and not dry_run:
        raise MomentError("--json goes with --dry-run (a run writes its metrics with --metrics-json FILE)")
    _check_torch()
    if not ctx.args:
        raise MomentError("nothing to train: pass at least --layout LAYOUT (see --help)")
    args = list(ctx.args)
    if dry_run:
        with loading():
            _print_plan(_precheck(args, nproc, run_dir, plan=True, rdzv=rdzv)[2], json_out)
        return
    env = {**os.environ, **(rdzv.env() if rdzv is not None else {})}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    agent: HeldAgent | None = None

    def launch(measure: bool) -> HeldAgent:
        nonlocal agent
        agent = HeldAgent(torchrun_command(nproc, args, max_restarts, rdzv, "measure" if measure else "wait"), env)
        return agent

    with _reading(args):
        try:
            with loading():  # what the checks load (a user's model, with torch and PyG) is then held until the end
                cfg, rank_env, _ = _precheck(args, nproc, run_dir, rdzv=rdzv, launch=launch)
            run_path = make_run_dir(run_dir, Path(cfg.layout or cfg.dataset))
        except BaseException:
            if agent is not None:
                agent.stop()
            raise
        assert agent is not None  # _precheck starts it
        where, more = f"run directory {run_path}: torchrun's log", []
        if cfg.checkpoint_dir is None and cfg.checkpoint_every != 0 and not cfg.data_only:  # no model to save
            more = ["--checkpoint-dir", str(run_path / CHECKPOINTS)]
            where += _checkpoints_said(run_path / CHECKPOINTS, rdzv)
        if not cfg.quiet:
            err_console.print(where, highlight=False, soft_wrap=True)
        code = report(run(agent, more, rank_env, run_path / LOG, max_restarts, rdzv))
    if code:
        raise typer.Exit(code)
