"""Run directories: where `moment train` puts each run's torchrun log and checkpoints, and what may be
removed with the layout they belong to.

Each run gets a fresh folder BASE/<time> (BASE defaults to LAYOUT.runs beside the layout), so runs never
share checkpoints or logs. `layout rm` removes LAYOUT.runs with the layout, but only when it holds
nothing a run did not write (see `owned_runs`): a person's notes in it are never deleted. No torch here.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from moment.errors import MomentError
from moment.inputs import exists
from moment.outputs import check_output, check_replaceable, probe_writable, stale
from moment.runtime.checkpoint import CHECKPOINT_NAME

#: torchrun's own output, in each run directory
LOG = "torchrun.log"
#: the folder of a run's checkpoints (when --checkpoint-dir is not given)
CHECKPOINTS = "checkpoint"
_STAMP = "%Y%m%d-%H%M%S"
_RUN_NAME = re.compile(r"[0-9]{8}-[0-9]{6}(-[0-9]+)?")


def runs_dir(anchor: Path) -> Path:
    """The default folder of the runs of a layout (or dataset) `anchor`: ANCHOR.runs beside it."""
    return anchor.parent / f"{anchor.name}.runs"


def run_root(base: Path | None, anchor: Path) -> Path:
    """Where runs' directories go: BASE (--run-dir), else `runs_dir(anchor)`."""
    return base if base is not None else runs_dir(anchor)


def check_run_dir(base: Path | None, anchor: Path | None = None) -> None:
    """Refuse a run directory that cannot hold run folders (a file, a dangling link, `/`, a name too long, a
    read-only file system) before anything is derived from it or any rank starts: each run is a new folder
    under it, so an existing directory, whatever it holds, is fine, if a folder can be made in it (check_output
    tries its parent, so it is tried itself too). `base`: --run-dir; without it, `anchor`'s default (LAYOUT.runs:
    a layout on a read-only mount, as machine 1 may hold its part of a split), named as --run-dir's default with
    the hint to give one (it was refused later, by the checkpoint folder the run would get there, named
    --checkpoint-dir, an option not given, and at a path the run never uses)."""
    if base is None and anchor is None:
        return
    root = base if base is not None else runs_dir(anchor)
    what = "--run-dir" if base is not None else "the run directory (--run-dir's default)"
    try:
        check_output(root, what, directory=True)
        if root.is_dir():
            probe_writable(root, f"{what} {root}")
    except MomentError as e:
        if base is not None:
            raise
        raise MomentError(e.message, source=e.source, hint="pass --run-dir DIR, a folder this machine can write "
                                                           "(each run makes its own folder there)") from None


def make_run_dir(base: Path | None, anchor: Path) -> Path:
    """A fresh directory for this run: `run_root`/<time>."""
    root = run_root(base, anchor)
    stamp = time.strftime(_STAMP)
    for i in range(1000):
        run = root / (stamp if i == 0 else f"{stamp}-{i + 1}")
        try:
            run.mkdir(parents=True, exist_ok=False)
            return run
        except FileExistsError:
            continue
        except OSError as e:
            raise MomentError(f"cannot create the run directory: {e.strerror}", source=str(run),
                              hint="pass --run-dir DIR (checkpoints and torchrun's log go there)") from None
    raise MomentError("too many runs started this second", source=str(root))


def owned_runs(anchor: Path) -> Path | None:
    """ANCHOR.runs when it exists and holds only what runs wrote (run folders named by their start time,
    each with at most torchrun's log and a checkpoint); None when there is none. Raises MomentError,
    naming what it holds that no run wrote, otherwise."""
    anchor = Path(anchor)
    root = runs_dir(anchor if anchor.name else anchor.absolute())
    if not exists(root):
        return None
    named = set()
    if root.is_dir() and not root.is_symlink():
        for run in root.iterdir():
            if _RUN_NAME.fullmatch(run.name) and run.is_dir() and not run.is_symlink():
                ck = run / CHECKPOINTS / CHECKPOINT_NAME
                half = {f"{run.name}/{CHECKPOINTS}/{p.name}" for p in stale(ck)}  # of a killed run
                named |= {f"{run.name}/{LOG}", f"{run.name}/{CHECKPOINTS}/{CHECKPOINT_NAME}", *half}
    check_replaceable(root, "run", named, verb="remove", hint=None, unnamed="which no training run wrote")
    return root


def remove_runs(root: Path | None) -> None:
    """Remove the run directory `owned_runs` returned (nothing for None)."""
    if root is not None:
        shutil.rmtree(root)
