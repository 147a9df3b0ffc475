"""Run torchrun for `moment train`: its own output to a log file, the ranks' to the screen.

torchrun prints agent warnings and, when a rank fails, a ~30-line ChildFailedError traceback that
buries the rank's one-line error. Here torchrun's stdout/stderr go through a pipe into
RUN_DIR/torchrun.log; the ranks reattach to this process's stdout/stderr (moment.runtime.console),
so their progress and errors stay on screen. Reading the pipe also shows when a rank dies and
torchrun restarts the group; the ranks themselves say where they resumed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from moment.cli import err_console

#: torchrun's agent, when a rank exits non-zero: "failed (exitcode: 1) local_rank: 1 (pid: 123) of binary"
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
#: the rank's own clean error line (moment.runtime.train.main), for when it ended up in the log
_RANK_ERROR = re.compile(r"^error \(rank \d+\): ")
#: a rank exits with this after printing a user error (MomentError)
USER_ERROR = 2


@dataclass
class Outcome:
    code: int  # torchrun's exit status
    log: Path
    failures: list[tuple[int, int]] = field(default_factory=list)  # (local rank, exit code), in order
    rank_errors: list[str] = field(default_factory=list)  # clean error lines that went to the log

    @property
    def user_error(self) -> bool:
        return bool(self.failures) and all(c == USER_ERROR for _, c in self.failures)


def _died(rank: int, code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed ({name})"
    return f"rank {rank} died (exit code {code})"


def _seek_end(fd: int) -> None:
    """After the ranks appended to a file we share, write after them, not over them."""
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        pass  # a terminal or a pipe: nothing to do


def run(cmd: list[str], env: dict[str, str], log_path: Path, max_restarts: int) -> Outcome:
    from moment.runtime.console import console_env

    env = {**env, **console_env()}
    sys.stdout.flush()
    sys.stderr.flush()
    out = Outcome(code=0, log=log_path)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, errors="replace")
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                _watch(line, out, max_restarts)
            out.code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    _seek_end(1)
    _seek_end(2)
    return out


def _watch(line: str, out: Outcome, max_restarts: int) -> None:
    if _RANK_ERROR.match(line):
        out.rank_errors.append(line.rstrip())
    m = _FAILED.search(line)
    if not m:
        return
    code, rank = int(m.group(1)), int(m.group(2))
    out.failures.append((rank, code))
    if code == USER_ERROR:
        return  # the rank has said what was wrong
    _seek_end(2)  # the ranks append to our stderr: write after them
    n = len(out.failures)
    if n <= max_restarts:
        err_console.print(f"[yellow]{_died(rank, code)}; torchrun restarts the ranks (restart {n} of "
                          f"{max_restarts})[/]", highlight=False, soft_wrap=True)
    else:
        err_console.print(f"[red]{_died(rank, code)}[/]" + ("; no restarts left" if max_restarts else ""),
                          highlight=False, soft_wrap=True)


def report(out: Outcome) -> int:
    """The one closing message and the exit status of `moment train`."""
    from rich.markup import escape

    if out.code == 0:
        if out.failures:
            err_console.print(f"finished after {len(out.failures)} restart(s); torchrun's log: "
                              f"{escape(str(out.log))}", highlight=False, soft_wrap=True)
        return 0
    for line in out.rank_errors:  # ranks that could not reach the screen
        err_console.print(escape(line), highlight=False, soft_wrap=True)
    what = "stopped: a rank reported an error" if out.user_error else "failed"
    err_console.print(f"[bold red]training {what}[/]; torchrun's log: {escape(str(out.log))}", highlight=False, soft_wrap=True)
    return USER_ERROR if out.user_error else out.code
