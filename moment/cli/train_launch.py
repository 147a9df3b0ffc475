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
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from moment.cli import err_console
from moment.errors import MomentError
from moment.outputs import reason

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

#: torchrun's agent, when a rank exits non-zero: "failed (exitcode: 1) local_rank: 1 (pid: 123) of binary"
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
#: the rank's own clean error line (moment.runtime.train.main), for when it ended up in the log
_RANK_ERROR = re.compile(r"^error \(rank \d+\): ")
#: torchrun's agent, when the rendezvous of a run across machines fails (its traceback's last line)
_RDZV_ERROR = re.compile(r"\bRendezvous(Timeout|Connection|Closed|)Error\b")
#: the agent's own error line (moment.runtime.agent.main: a MomentError, before any rank started)
_AGENT_ERROR = re.compile(r"^error: (.*)$")
#: torchrun's agent stopping its ranks (they had started)
_STOPPING = re.compile(r"Sending process \d+ closing signal")
#: a rank exits with this after printing a user error (MomentError)
USER_ERROR = 2


@dataclass
class Outcome:
    code: int  # torchrun's exit status
    log: Path
    failures: list[tuple[int, int]] = field(default_factory=list)  # (local rank, exit code), in order
    rank_errors: list[str] = field(default_factory=list)  # clean error lines that went to the log
    stopped_by: str | None = None  # the signal that stopped `moment train` (passed on to torchrun)
    log_error: str | None = None  # why torchrun's log could not be written to the end
    rank_base: int = 0  # the global rank of this machine's local rank 0 (node rank x ranks per machine)
    rendezvous: str | None = None  # how the rendezvous failed: Timeout, Connection, Closed or "" (other)
    ranks_ran: bool = False  # ranks of ours had started (torchrun had children, or stopped its running ranks)
    rdzv: Any = None  # the run's rendezvous (moment.runtime.rendezvous.Rendezvous), for the message
    deadline: str | None = None  # why the join was stopped at --rdzv-timeout (what answered at the endpoint)
    agent_error: str | None = None  # the agent's own error (moment.runtime.agent: the rendezvous is another run's)

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


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, _frame) -> None:
    raise _Stopped(signum)


#: the longest torchrun may take to load and start its agent when the start is not seen (`_agent_started`): the
#: join's deadline then counts from here
AGENT_START_MAX_S = 60
PROBE_S = 3  # how long the endpoint may take to answer as a torch store, at the deadline
PROBE_LOAD_S = 8  # how long the probe's interpreter may take to load torch first (more on a loaded machine)
OWN_END_S = 1  # how long torchrun may take to end by itself once the probe has answered, before it is stopped


def probe_endpoint(rdzv: Any) -> str:
    """What is at the rendezvous endpoint, in words, when the join did not end by --rdzv-timeout. Why: torchrun
    waits on a port held by another program (or on an address that drops packets) far longer than its join
    timeout, and its own messages do not say which it was."""
    where = rdzv.endpoint
    try:
        with socket.create_connection((rdzv.host, rdzv.port), timeout=PROBE_S):
            pass
    except TimeoutError:
        return f"the rendezvous endpoint {where} cannot be reached (no answer within {PROBE_S} s)"
    except OSError as e:
        why = "connection refused" if isinstance(e, ConnectionRefusedError) else reason(e)
        return f"the rendezvous endpoint {where} cannot be reached ({why})"
    # a torch store answers a client's handshake; another program does not (or closes). In a process of its own:
    # torch's C++ client prints its failures to stderr, which is the user's screen here; and it does not keep
    # its timeout against a listener that never speaks, so the probe is given PROBE_S from when torch is loaded
    # (the line it prints), its start up to PROBE_LOAD_S more
    from moment.runtime.lifetime import die_with_parent

    me = os.getpid()
    ask = ("import sys; from datetime import timedelta; from torch.distributed import TCPStore; print(flush=True); "
           f"TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds={PROBE_S}))"
           ".check(['moment'])")
    try:
        proc = subprocess.Popen([sys.executable, "-c", ask, rdzv.host, str(rdzv.port)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"},
                                preexec_fn=lambda: die_with_parent(me))
    except OSError:
        answer = 1
    else:
        with proc:
            answer = _loaded_then_answered(proc)
    if answer == 0:
        return (f"not all {rdzv.nnodes} machines joined the rendezvous at {where}: a store answered there, "
                "but the join did not complete")
    return (f"the rendezvous endpoint {where} answered but is not a rendezvous (another program holds the port?)")


def _loaded_then_answered(proc: subprocess.Popen) -> int:
    """The probe's exit status, or 1 when it has not printed (torch loaded) within PROBE_LOAD_S, or not ended
    PROBE_S after that; it is killed then."""
    loaded, _, _ = select.select([proc.stdout], [], [], PROBE_LOAD_S)  # its line, or its end
    try:
        return proc.wait(PROBE_S if loaded else 0)
    except subprocess.TimeoutExpired:
        proc.kill()
        return 1


def _children(pid: int) -> bool | None:
    """Whether process `pid` has started a child (torchrun starts its ranks once the rendezvous completes); None
    when this cannot be told (not Linux)."""
    try:
        return bool(Path(f"/proc/{pid}/task/{pid}/children").read_text().strip())
    except OSError:
        return None


def _agent_started(pid: int) -> bool:
    """Whether torchrun's agent has begun its rendezvous: it then holds a socket (its client of the endpoint's
    store), which loading torch before it does not open and the launcher does not pass on."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True  # cannot tell: count from now
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                return True
        except OSError:
            pass  # closed meanwhile
    return False


def _join_deadline(proc: subprocess.Popen, rdzv: Any, out: Outcome, done: threading.Event) -> None:
    """Stop torchrun when its ranks have not started --rdzv-timeout after its agent began the join (as torchrun's
    own join timeout counts): a held or silent endpoint would keep its agent waiting. Before the rendezvous
    there are no ranks to stop. Why from the agent's start: torchrun's own start (loading torch) takes from
    under a second to many on a loaded machine, so a fixed allowance for it is either too short or waited
    for in vain."""
    latest = time.monotonic() + AGENT_START_MAX_S
    end = None
    while not done.wait(0.2):
        if proc.poll() is not None:
            return
        if (started := _children(proc.pid)) is not False:  # or cannot tell: the bound is then torchrun's
            # a rank that ends by itself (its peer's machine died) is not stopped by torchrun, whose closing
            # lines would otherwise be the only sign that the ranks ran before the rendezvous failed
            out.ranks_ran = out.ranks_ran or bool(started)
            return
        now = time.monotonic()
        if end is None and (now >= latest or _agent_started(proc.pid)):
            end = now + rdzv.timeout_s
        if end is not None and now >= end:
            what = probe_endpoint(rdzv)
            # torchrun's own join timeout is the same: ending meanwhile (its store closed, which the probe may
            # have found refused), it says what happened itself
            if done.wait(OWN_END_S) or proc.poll() is not None or _children(proc.pid) is not False:
                return
            out.deadline = f"{what}; the join did not complete within {rdzv.timeout_s} s (--rdzv-timeout)"
            proc.kill()
            return


#: signals that stop `moment train` and are passed on to torchrun, which stops the ranks
FORWARDED = (signal.SIGTERM, signal.SIGHUP)
STOP_GRACE_S = 30  # torchrun's time to stop its ranks before it is killed
AGENT_END_S = 5  # a held agent's time to end by SIGTERM (it is loading torch, or waiting for its go) before it is killed


class HeldAgent:
    """torchrun's agent started while the launcher still checks the run (`--hold`, moment.runtime.agent): it loads
    torch, the runtime and the user's model module meanwhile (about three seconds), measures its start sizes when
    the budget needs them (instead of a fresh interpreter of its own doing the same), and starts the ranks on
    `go`. It dies with this process (PR_SET_PDEATHSIG) and ends by itself without a go."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        """`cmd`: the agent's command line with its `--hold` mode (train_cmds.torchrun_command)."""
        from moment.runtime.console import console_env
        from moment.runtime.lifetime import die_with_parent

        me = os.getpid()
        self.cmd = cmd
        self.early: list[str] = []  # what it printed before the go (torchrun's log gets it)
        sys.stdout.flush()
        sys.stderr.flush()
        self.proc = subprocess.Popen(self.cmd, env={**env, **console_env()}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     errors="replace", preexec_fn=lambda: die_with_parent(me))

    def sizes(self, wait_s: float | None = None) -> tuple[int, int, int] | None:
        """(agent, rank, shared) as it measured them; None when it ended first (its output says why: the log), or
        had not measured within `wait_s` (default: start_sizes.MEASURE_WAIT_S; stopped then, as a fresh
        interpreter would be: the launcher measures itself, and the run fails with what the agent said). Read
        from the pipe itself, not through the text stream, so that a line already read is never waited for again."""
        from moment.runtime.agent import HOLD_SIZES
        from moment.runtime.start_sizes import MEASURE_WAIT_S

        assert self.proc.stdout is not None
        wait_s = MEASURE_WAIT_S if wait_s is None else wait_s
        fd, buf, end = self.proc.stdout.fileno(), b"", time.monotonic() + wait_s
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._end()
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            *lines, buf = (buf + chunk).split(b"\n")
            for i, raw in enumerate(lines):
                line = raw.decode(errors="replace") + "\n"
                if line.startswith(HOLD_SIZES):
                    self.early += [r.decode(errors="replace") + "\n" for r in lines[i + 1:]]
                    self.early += [buf.decode(errors="replace")] if buf else []
                    try:
                        agent, rank, shared = (int(x) for x in line.split()[1:4])
                        return agent, rank, shared
                    except ValueError:
                        return None
                self.early.append(line)

    def go(self, args: list[str], env: dict[str, str]) -> None:
        """Start the ranks, with `args` after the rank arguments it was started with and `env` in their
        environment (an agent that has died meanwhile shows it in `run`)."""
        import json

        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"args": args, "env": env}) + "\n")
            self.proc.stdin.close()
        except OSError:
            pass

    def _end(self) -> None:
        """SIGTERM, which it ends by after removing the log directory it made for torchrun (moment.runtime.agent); killed
        when it has not ended within AGENT_END_S."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(AGENT_END_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def stop(self) -> None:
        """End it before the go (the run was refused): nothing is left running, nor its log directory."""
        self._end()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def run(agent: HeldAgent, args: list[str], env: dict[str, str], log_path: Path, max_restarts: int,
        rdzv: Any = None) -> Outcome:
    """Give the held agent its go (`HeldAgent.go`) once its log is open, and watch it; its output goes to
    `log_path`. It dies with this process (even by SIGKILL: PR_SET_PDEATHSIG), and a SIGTERM/SIGHUP/Ctrl-C here
    is passed on, so no rank outlives it. `rdzv`: the rendezvous of a run across machines, named when it fails."""
    proc = agent.proc
    out = Outcome(code=0, log=log_path, rdzv=rdzv,
                  rank_base=rdzv.node_rank * _nproc(agent.cmd) if rdzv is not None else 0)
    try:
        log = open(log_path, "w")
        log.write("$ " + " ".join([*agent.cmd, *args]) + "\n")
        log.flush()
    except OSError as e:
        agent.stop()  # no go: no rank started
        raise MomentError(f"cannot write torchrun's log: {reason(e)}", source=str(log_path),
                          hint="free some space or pass --run-dir DIR") from None
    done = threading.Event()
    old: dict[int, Any] = {}
    try:  # a signal from the first handler on is passed on (one as the go was given ended this process at exit 1)
        for sig in FORWARDED:
            old[sig] = signal.signal(sig, _raise_stopped)
        agent.go(args, env)
        assert proc.stdout is not None
        if rdzv is not None:
            threading.Thread(target=_join_deadline, args=(proc, rdzv, out, done), daemon=True).start()
        for line in agent.early:
            _log(log, line, out)
            _watch(line, out, max_restarts)
        for line in proc.stdout:
            _log(log, line, out)
            _watch(line, out, max_restarts)
        out.code = proc.wait()
    except (KeyboardInterrupt, _Stopped) as e:
        sig = e.signum if isinstance(e, _Stopped) else signal.SIGINT
        _stop(proc, sig)
        if isinstance(e, KeyboardInterrupt):
            raise
        out.code = 128 + sig
        out.stopped_by = signal.Signals(sig).name
    finally:
        done.set()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        try:
            log.close()
        except OSError:
            pass
    _seek_end(1)
    _seek_end(2)
    return out


def _nproc(cmd: list[str]) -> int:
    """torchrun's --nproc-per-node in `cmd`."""
    return next(int(a.split("=", 1)[1]) for a in cmd if a.startswith("--nproc-per-node="))


def _stop(proc: subprocess.Popen, sig: int) -> None:
    """Pass `sig` on to torchrun and wait while it stops the ranks; kill it when it takes too long."""
    for s in FORWARDED:  # a second SIGTERM while it stops changes nothing (SIGKILL: torchrun dies with us)
        signal.signal(s, signal.SIG_IGN)
    try:
        proc.send_signal(sig)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # its ranks die with it (each set PR_SET_PDEATHSIG)
        proc.wait()


def _log(log, line: str, out: Outcome) -> None:
    """Append torchrun's line to its log; a full disk stops the log, not the run (said at the end)."""
    if out.log_error:
        return
    try:
        log.write(line)
        log.flush()
    except OSError as e:
        from moment.outputs import reason

        out.log_error = reason(e)


def _watch(line: str, out: Outcome, max_restarts: int) -> None:
    if _RANK_ERROR.match(line):
        out.rank_errors.append(line.rstrip())
    if (r := _RDZV_ERROR.search(line)) and out.rendezvous is None:
        out.rendezvous = r.group(1)
    if (a := _AGENT_ERROR.match(line)) and out.agent_error is None:
        out.agent_error = a.group(1).rstrip()
    if _STOPPING.search(line):
        out.ranks_ran = True
    m = _FAILED.search(line)
    if not m:
        return
    code, rank = int(m.group(1)), out.rank_base + int(m.group(2))
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


def _rendezvous_failed(out: Outcome) -> str:
    r = out.rdzv
    start = (f"start `moment train --nnodes {r.nnodes} --node-rank K --rdzv-endpoint {r.endpoint}` on every machine "
             f"(K = 0 to {r.nnodes - 1})")
    if out.ranks_ran and out.rendezvous != "Timeout":
        from moment.runtime.rendezvous import others_gone

        return (f"the rendezvous at {r.endpoint} ended while the ranks ran: {others_gone(r.node_rank, r.nnodes)}; "
                "its own messages say why")
    if out.rendezvous == "Timeout":
        again = " again after a restart" if out.ranks_ran else ""
        return (f"not all {r.nnodes} machines joined the rendezvous at {r.endpoint}{again} within {r.timeout_s} s "
                f"(--rdzv-timeout): {start}, or see why a machine stopped (its own message)")
    if out.rendezvous == "Connection":
        return (f"cannot reach the rendezvous at {r.endpoint}: is it machine 0's address, and is the port open? "
                f"{start[0].upper()}{start[1:]}")
    return f"the rendezvous at {r.endpoint} failed"


def report(out: Outcome) -> int:
    """The one closing message and the exit status of `moment train`."""
    if out.log_error:
        err_console.print(f"[yellow]torchrun's log {escape(str(out.log))} is incomplete: {out.log_error}[/]",
                          highlight=False, soft_wrap=True)
    if out.stopped_by:
        err_console.print(f"[bold red]training stopped by {out.stopped_by}[/]: torchrun and the ranks were stopped; "
                          f"torchrun's log: {escape(str(out.log))}", highlight=False, soft_wrap=True)
        return out.code
    if out.agent_error and out.code:
        from moment.runtime.agent import IN_USE

        said = out.agent_error
        if out.rdzv is not None and said.startswith(IN_USE):  # named as the user gave it
            said = said.replace("rendezvous endpoint", f"rendezvous endpoint {out.rdzv.endpoint}", 1)
        err_console.print(f"[bold red]training stopped[/]: {escape(said)}; torchrun's log: {escape(str(out.log))}",
                          highlight=False, soft_wrap=True)
        return USER_ERROR
    if out.code == 0:
        if out.failures:
            err_console.print(f"finished after {len(out.failures)} restart(s); torchrun's log: "
                              f"{escape(str(out.log))}", highlight=False, soft_wrap=True)
        return 0
    if out.deadline:
        err_console.print(f"[bold red]training stopped[/]: {escape(out.deadline)}; start `moment train` on every "
                          f"machine with machine 0's address as --rdzv-endpoint; torchrun's log: {escape(str(out.log))}",
                          highlight=False, soft_wrap=True)
        return 1
    for line in out.rank_errors:  # ranks that could not reach the screen
        err_console.print(escape(line), highlight=False, soft_wrap=True)
    if out.rendezvous is not None and out.rdzv is not None and not out.failures:  # no rank of ours ever failed
        err_console.print(f"[bold red]training stopped[/]: {escape(_rendezvous_failed(out))}; torchrun's log: "
                          f"{escape(str(out.log))}", highlight=False, soft_wrap=True)
        return out.code or 1
    what = "stopped: a rank reported an error" if out.user_error else "failed"
    err_console.print(f"[bold red]training {what}[/]; torchrun's log: {escape(str(out.log))}", highlight=False, soft_wrap=True)
    return USER_ERROR if out.user_error else out.code
