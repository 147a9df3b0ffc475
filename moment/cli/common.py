"""Small helpers the command modules share: progress bars on stderr and fan-out parsing.

Command modules import these from here, never each other's private helpers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from moment.cli import err_console
from moment import errors
from moment.workload.spec import parse_fanouts  # noqa: F401 - the commands take it from here

# Imports inside functions: rich's progress bar loads only when a command shows one.


@contextmanager
def progress_bar(label: str, enabled: bool = True) -> Iterator[Any]:
    """A rich progress bar on stderr (stdout stays clean for --json); yields a progress(done, total) callback."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=err_console, transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@contextmanager
def solver_bar(enabled: bool = True, label: str = "solving candidates") -> Iterator[Any]:
    """A rich bar counting the planner's candidates (done of total); yields its progress(done, total) callback.
    Only on a terminal: piped stderr (scripts, logs) gets nothing, not even the bar's closing newline."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from moment.cli import stderr_console
    from moment.cli.answers import untracked

    # drawn past a kept answer's recording of stderr (moment.cli.answers): a bar is not part of the answer
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr_console(untracked(sys.stderr)), transient=True) as prog:
        task = prog.add_task(label, total=None)

        def cb(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        yield cb


#: `--fresh` of the commands whose answers are kept (moment.cli.answers)
FRESH_HELP = "solve again even if this question was answered before (the new answer is kept in its place)"


def check_at_least(**flags: tuple[int | None, int]) -> None:
    """Each `name=(value, least)` must be at least `least` (None: not given): one line naming the flag,
    instead of click's usage text, worded as the training options' ranges. `batch_size=(0, 1)` reads as
    --batch-size."""
    for name, (value, least) in flags.items():
        errors.check_at_least(f"--{name.replace('_', '-')}", value, least)
