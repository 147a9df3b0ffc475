"""`moment train` failures and restarts as a person sees them: the ranks' errors, not torchrun's traceback;
restarts announced with where they resumed; checkpoints by default in the run directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_data import TRAIN_ARGS

from moment import testpoints
from moment.cli import train_launch as tl
from moment.errors import MomentError
from moment.runtime.agent import COMMAND
from moment.runtime.config import TrainConfig
from moment.runtime.runs import make_run_dir
from moment.runtime.run import SUMMARY_PREFIX
from moment.runtime.train import train

REPO = Path(__file__).resolve().parents[1]
FAST = {"fanouts": [10, 5], "hidden": 32, "threads": 1, "lr": 0.01}
ARGS = TRAIN_ARGS


@pytest.fixture(scope="module")
def layout(runtime_layout):
    """The session's shared layout (read-only: every run here writes under its own --run-dir)."""
    return runtime_layout


def _moment_train(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "moment", "train", *argv], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=300, check=False)


# ---- fast: pieces -------------------------------------------------------------------------------------
def test_rank_output_reattaches_to_the_launchers_streams(tmp_path):
    """A rank reopens the paths the launcher names (appending: a redirected file is not overwritten)."""
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    out.write_text("before\n")
    err.write_text("")
    code = ("import sys; from moment.runtime.console import attach_console; "
            "assert attach_console(); print('to out'); print('to err', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ,
                       "MOMENT_CONSOLE_OUT": str(out), "MOMENT_CONSOLE_ERR": str(err)},
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # nothing left on torchrun's streams
    assert out.read_text() == "before\nto out\n" and err.read_text() == "to err\n"


def test_the_launcher_checks_a_run_without_loading_torch(layout, tmp_path):
    """The process that runs torchrun makes no tensor: on a machine without a GPU driver its checks (device,
    ranks, layout, dataset) load no torch, seconds of start-up per launch (a budget's preview still does)."""
    code = ("import sys; from moment.io import device; device.GPU_DRIVER_PATHS = (sys.argv[1],); "
            "from moment.cli.train_cmds import _precheck; _precheck(sys.argv[2:], 2); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nvidiactl"), "--layout", str(layout), *ARGS],
                       cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr


def test_a_budgeted_launch_reuses_the_recorded_batch_extent_and_loads_no_torch(layout, tmp_path):
    """A budget's preview samples the batch extent (torch) once and records it; the next launch of the same graph
    and sampling reads the record, seconds less per launch, to the same plan, whose fixed cost is the fresh rank
    measured a moment before, said so (faked here: tests/test_run_plan.py measures it)."""
    code = ("import sys; from moment.io import device; device.GPU_DRIVER_PATHS = (sys.argv[1],); "
            "from moment.runtime import start_sizes as ss; ss._start = lambda model=None: None; "
            "ss._collect = lambda p: (100 << 20, 300 << 20, 80 << 20); "
            "from moment.cli.train_cmds import _precheck; _, _, plan = _precheck(sys.argv[2:], 2); "
            "print('torch' in sys.modules, plan.model_dump_json())")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path / "nvidiactl"), "--layout", str(layout),
                            "--memory-budget", "3GiB", *ARGS], cwd=REPO, env=env, capture_output=True, text=True,
                           check=False) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    (sampled, first), (read, second) = (r.stdout.split(" ", 1) for r in runs)
    when = re.search(r", recorded \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\)", second)
    assert (sampled, read) == ("True", "False") and when and ", recorded" not in first
    assert first == second.replace(when.group(0), ")")


def test_the_join_deadline_counts_from_the_agent_opening_its_socket():
    """`_agent_started` sees torchrun's agent begin the join (a socket, its store client), not its start-up."""
    code = "import socket, sys, time; sys.stdin.readline(); s = socket.socket(); print(1, flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert not tl._agent_started(p.pid)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline() == "1\n" and tl._agent_started(p.pid)
    finally:
        p.kill()
        p.wait()


def test_a_rendezvous_lost_after_the_ranks_started_names_the_other_machine(tmp_path):
    """Machine 1 hosting the store is killed; machine 0's rank ends by itself (torchrun logs no closing signal),
    then its agent's rendezvous fails to connect. The ranks had started (torchrun had children, seen by the
    join's watcher), so the message names machine 1, not "is it machine 0's address"."""
    import threading

    from moment.runtime.rendezvous import Rendezvous

    agent = subprocess.Popen(["bash", "-c", "sleep 30 & wait"])
    try:
        out, done = tl.Outcome(code=1, log=tmp_path / "log", rdzv=Rendezvous(2, 0, "127.0.0.1", 29400, 30)), \
            threading.Event()
        end = time.monotonic() + 10
        while not tl._children(agent.pid) and time.monotonic() < end:
            time.sleep(0.02)
        tl._join_deadline(agent, out.rdzv, out, done)  # returns at once: the "ranks" have started
        assert out.ranks_ran
        tl._watch("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: the connection failed\n",
                  out, 0)
        said = tl._rendezvous_failed(out)
        assert "machine 1 stopped or cannot be reached" in said and "machine 0" not in said, said
    finally:
        agent.kill()
        agent.wait()
    quiet = tl.Outcome(code=1, log=tmp_path / "log", rdzv=out.rdzv, rendezvous="Connection")
    assert "cannot reach the rendezvous at 127.0.0.1:29400: is it machine 0's address" in tl._rendezvous_failed(quiet)


def test_the_agent_removes_the_log_directories_torchrun_left_empty_and_keeps_any_log(tmp_path, monkeypatch):
    from moment.runtime import agent

    empty, kept = tmp_path / "torchelastic_a", tmp_path / "torchelastic_b"
    (empty / "run_x" / "attempt_0").mkdir(parents=True)
    (kept / "run_y" / "attempt_0" / "1").mkdir(parents=True)
    (kept / "run_y" / "attempt_0" / "1" / "stderr.log").write_text("a rank's redirected output")
    monkeypatch.setattr(agent, "_made_log_dirs", [str(empty), str(kept)])
    agent.remove_empty_log_dirs()
    assert not empty.exists() and (kept / "run_y" / "attempt_0" / "1" / "stderr.log").read_text()
    assert [p.name for p in (kept / "run_y" / "attempt_0").iterdir()] == ["1"] and agent._made_log_dirs == []


def test_the_agent_forks_the_ranks_of_every_python_program_and_leaves_others_to_torchrun(monkeypatch):
    import gc

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.run import config_from_args, parse_args

    from moment.runtime import agent

    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test's process is no agent: nothing to keep
    monkeypatch.setattr(MultiprocessContext, "_is_done", MultiprocessContext._is_done)  # restored after the test
    config = agent.forked_ranks(config_from_args)

    def both(*program):
        line = parse_args(["--standalone", "--nproc-per-node=2", *program])
        return config(line), config_from_args(line)

    (cfg, entry, args), _ = both("-m", agent.RANK_MODULE, "--layout", "L", "--epochs", "1")
    assert (cfg.start_method, entry, args) == ("fork", agent.program, ["module", agent.RANK_MODULE, "--layout", "L",
                                                                        "--epochs", "1"])
    # torchrun's log folder (none given) is the agent's, recorded before it was made: removed at its exit
    root = cfg.logs_specs.root_log_dir
    assert Path(root).name.startswith("torchelastic_") and Path(root).parent == Path(tempfile.gettempdir())
    assert root in agent._made_log_dirs and Path(root).is_dir()
    (cfg, entry, args), _ = both("-m", "other.module", "--x")
    assert (cfg.start_method, entry, args) == ("fork", agent.program, ["module", "other.module", "--x"])
    (cfg, entry, args), _ = both("script.py", "--x")
    assert (cfg.start_method, entry, args) == ("fork", agent.program, ["script", "script.py", "--x"])
    assert MultiprocessContext._is_done.exits_count  # a rank that exited 0 counts as returned
    for program in (["--no-python", "echo", "--x"], ["--run-path", "moment/train.py", "--x"]):
        (cfg, entry, args), theirs = both(*program)
        assert (cfg.start_method, entry, args) == (theirs[0].start_method, theirs[1], theirs[2]), program


def test_the_agent_imports_a_users_model_module_for_its_ranks_unless_it_starts_a_thread(monkeypatch, tmp_path):
    """`--model MODULE:FACTORY`'s module, and a script's `--preload MODULE`s, are imported once, in the agent,
    before it forks the ranks (which then find them loaded). One whose import starts a thread (or CUDA) cannot be
    inherited by a fork: its ranks start as fresh interpreters; but for jemalloc's purger (pyarrow's, which PyG
    starts), which a fork leaves behind safely. A `--model` module that fails to import is left to
    the ranks, which say why; a `--preload` one is the agent's error, in one line."""
    import gc
    import sys

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    from torch.distributed.run import config_from_args, get_args_parser, parse_args

    from moment.errors import MomentError
    from moment.runtime import agent

    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test's process is no agent: nothing to keep
    monkeypatch.setattr(MultiprocessContext, "_is_done", MultiprocessContext._is_done)  # restored after the test
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain_net.py").write_text("def make(**kw): ...\n")
    (tmp_path / "threaded_net.py").write_text("import threading\nSTOP = threading.Event()\n"
                                              "T = threading.Thread(target=STOP.wait, daemon=True)\nT.start()\n"
                                              "def make(**kw): ...\n")
    (tmp_path / "broken_net.py").write_text("raise RuntimeError('no GPU here')\n")
    # a thread a fork leaves behind safely, as pyarrow's jemalloc purger that PyG's import starts (PR_SET_NAME: 15)
    (tmp_path / "purger_net.py").write_text("import ctypes, threading\nSTOP, NAMED = threading.Event(), threading.Event()\n"
                                            "def run():\n    ctypes.CDLL(None).prctl(15, b'jemalloc_bg_thd', 0, 0, 0)\n"
                                            "    NAMED.set()\n    STOP.wait()\n"
                                            "T = threading.Thread(target=run, daemon=True)\nT.start()\nNAMED.wait(10)\n"
                                            "def make(**kw): ...\n")
    config = agent.forked_ranks(config_from_args)

    def entry(model: str):
        return config(parse_args(["--standalone", "--nproc-per-node=2", "-m", agent.RANK_MODULE, "--layout", "L",
                                  "--model", model]))[1]

    def stop(module) -> None:  # its thread ended, so that the next import counts its own
        module.STOP.set()
        module.T.join(10)
        assert not module.T.is_alive()
        task = Path(f"/proc/self/task/{module.T.native_id}")
        for _ in range(1000):  # joined, it may still be listed until the kernel has reaped it: the next import
            if not task.exists():  # would then count one thread ending and its own starting as no change
                break
            time.sleep(0.01)

    def script(*preloads: str):  # a user's script, with the agent's --preload MODULE for each
        parse = agent.with_options(get_args_parser)
        return config(parse().parse_args([*(f"--preload={m}" for m in preloads), "--standalone",
                                          "--nproc-per-node=2", "train.py"]))[1]

    try:
        assert entry("plain_net:make") is agent.program and "plain_net" in sys.modules
        assert entry("broken_net:make") is agent.program and "broken_net" not in sys.modules
        assert entry("threaded_net:make") == sys.executable  # torchrun's own: fresh interpreters
        stop(sys.modules["threaded_net"])
        assert entry("purger_net:make") is agent.program
        stop(sys.modules["purger_net"])
        assert entry("sage") is agent.program
        sys.modules.pop("plain_net")
        assert script("plain_net", "json") is agent.program and "plain_net" in sys.modules
        sys.modules.pop("threaded_net")
        assert script("threaded_net") == sys.executable
        stop(sys.modules["threaded_net"])
        for bad, why in (("broken_net", "importing broken_net failed: RuntimeError: no GPU here"),
                         ("no_such_net", "cannot import no_such_net: no module named 'no_such_net'"),
                         ("nets/plain.py", "'nets/plain.py' is not a module name")):
            with pytest.raises(MomentError) as e:
                script(bad)
            assert str(e.value).startswith(f"--preload {bad}: {why}"), str(e.value)
        with pytest.raises(MomentError, match="--preload json: the ranks of a --no-python launch are not forked"):
            parse = agent.with_options(get_args_parser)
            config(parse().parse_args(["--preload=json", "--no-python", "--standalone", "/bin/true"]))
    finally:
        for name in ("plain_net", "threaded_net", "broken_net"):
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_a_script_forked_by_the_agent_runs_as_a_fresh_interpreter_would_run_it(tmp_path):
    """Its name, argv and path, its own exit handlers (not the agent's), and an uncaught error's traceback showing
    the script's frames only, with a non-zero exit. A rank that ends without returning (os._exit) does not hold
    the others: torchrun would wait for its function's return value forever. Neither launch leaves torchrun's log
    directory behind in the temporary folder."""
    from moment.runtime import agent

    script = tmp_path / "prog.py"
    # each line one write: the ranks share the pipe, and print's pieces (text, then end) of two ranks interleave
    (tmp_path / "preloaded.py").write_text("import os\nPID = os.getpid()\n")
    script.write_text(
        "import atexit, json, os, sys, preloaded\n"
        "atexit.register(lambda: os.write(1, f'bye {os.environ[\"RANK\"]}\\n'.encode()))\n"
        "os.write(1, (json.dumps([os.environ['RANK'], __name__, sys.argv, sys.path[0], preloaded.PID == os.getppid()])"
        " + '\\n').encode())\n"
        "if sys.argv[1] == 'vanish' and os.environ['RANK'] == '1':\n"
        "    os._exit(0)\n"
        "if sys.argv[1] == 'raise' and os.environ['RANK'] == '1':\n"
        "    raise ValueError('the script failed')\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(temp)}

    def launch(arg, *preload):
        return subprocess.run([*agent.COMMAND, *preload, "--standalone", "--nproc-per-node=2", str(script), arg],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    r = launch("vanish", "--preload", "preloaded")
    assert r.returncode == 0, r.stderr[-3000:]
    said = sorted(json.loads(line) for line in r.stdout.splitlines() if line.startswith("["))
    # the module --preload named was imported by the agent, the ranks' parent
    assert said == [[k, "__main__", [str(script), "vanish"], str(tmp_path), True] for k in ("0", "1")], r.stdout
    assert [line for line in r.stdout.splitlines() if line.startswith("bye")] == ["bye 0"], r.stdout
    r = launch("raise")
    assert r.returncode != 0 and "bye 1" in r.stdout, r.stdout
    tb = r.stderr[r.stderr.index("Traceback"):].splitlines()
    assert tb[1].strip().startswith(f'File "{script}", line 7') and tb[3] == "ValueError: the script failed", tb
    # without --preload each rank imports the module itself
    assert [json.loads(line)[-1] for line in r.stdout.splitlines() if line.startswith("[")] == [False, False], r.stdout
    assert [p.name for p in temp.iterdir() if p.name.startswith("torchelastic_")] == []


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # torchrun's, on the captured stderr
def test_a_preload_that_cannot_be_imported_is_the_agents_one_line_before_any_rank(monkeypatch, capsys):
    import gc

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from moment.runtime import agent

    monkeypatch.setattr(gc, "freeze", lambda: None)  # this test's process is no agent: nothing to keep
    for name in ("config_from_args", "get_args_parser"):  # restored after the test
        monkeypatch.setattr(torchrun, name, getattr(torchrun, name))
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    assert agent.main(["--preload", "no_such_net", "--standalone", "--nproc-per-node=2", "train.py"]) == 2
    assert capsys.readouterr().err == "error: --preload no_such_net: cannot import no_such_net: no module named " \
                                      "'no_such_net'\n"


def test_the_agent_names_rendezvous_events_as_torch_does_without_reading_the_stack(monkeypatch):
    """torch's rendezvous names each event's method from `inspect.stack()` (source lines of every frame, every
    loaded module scanned); the agent's answer is the same frame's name."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from moment.runtime import agent

    torchs = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", torchs)  # restored after the test
    agent._frame_names_for_rendezvous_events()
    ours = dynamic_rendezvous.get_method_name
    assert ours is not torchs

    def _record(name_of):  # as the handler's `_record` asks, one level below the method it names
        return name_of()

    def next_rendezvous(name_of):
        return _record(name_of)

    assert next_rendezvous(torchs) == "next_rendezvous" and torchs(10_000) == "no_method_name"
    monkeypatch.setattr(inspect, "stack", lambda *a, **k: pytest.fail("read the whole stack"))
    assert next_rendezvous(ours) == "next_rendezvous" and ours(10_000) == "no_method_name"
    monkeypatch.delattr(dynamic_rendezvous, "get_method_name")  # a torch that names its events otherwise
    agent._frame_names_for_rendezvous_events()
    assert not hasattr(dynamic_rendezvous, "get_method_name")


def test_a_join_that_torchrun_ends_itself_at_the_deadline_keeps_its_own_message(monkeypatch, tmp_path):
    """torchrun's join timeout is --rdzv-timeout too: when it ends as the probe runs (its store closed, so the
    probe found the endpoint refused), its own message stands and nothing is killed (seen once in CI as
    "cannot be reached (connection refused)" instead of "not all 2 machines joined")."""
    import threading

    from moment.runtime.rendezvous import Rendezvous

    agent = subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); time.sleep(60)"])
    done = threading.Event()

    def ends(proc):
        proc.terminate()
        proc.wait()
        done.set()  # as `run` does once torchrun's output has ended

    def probe(rdzv):
        threading.Thread(target=ends, args=(agent,), daemon=True).start()
        return f"the rendezvous endpoint {rdzv.endpoint} cannot be reached (connection refused)"

    monkeypatch.setattr(tl, "probe_endpoint", probe)
    out = tl.Outcome(code=1, log=tmp_path / "log", rdzv=Rendezvous(2, 0, "127.0.0.1", 29400, 1))
    try:
        tl._join_deadline(agent, out.rdzv, out, done)
        assert out.deadline is None and agent.wait(10) == -signal.SIGTERM
    finally:
        agent.kill()
        agent.wait()


def test_torchrun_lines_become_one_message_and_an_exit_status(tmp_path, capsys):
    log = tmp_path / "torchrun.log"
    killed = tl.Outcome(code=0, log=log)
    tl._watch("E1122 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 7) of binary: python\n", killed, 1)
    assert "rank 1 was killed (SIGKILL); torchrun restarts the ranks (restart 1 of 1)" in capsys.readouterr().err
    assert tl.report(killed) == 0 and "finished after 1 restart(s)" in capsys.readouterr().err
    user = tl.Outcome(code=1, log=log)
    for r in (0, 1):
        tl._watch(f"E1122 api.py:1002] failed (exitcode: 2) local_rank: {r} (pid: 7) of binary: python\n", user, 0)
    assert capsys.readouterr().err == ""  # the ranks said what was wrong
    assert tl.report(user) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "training stopped: a rank reported an error; torchrun's log: " + str(log) in err
    crash = tl.Outcome(code=1, log=log)
    tl._watch("failed (exitcode: 1) local_rank: 0 (pid: 7) of binary\n", crash, 0)
    assert "rank 0 died (exit code 1)" in capsys.readouterr().err and tl.report(crash) == 1


def test_an_agent_that_finds_its_rendezvous_complete_refuses_it_and_leaves_it_open(monkeypatch):
    """A second run on a running run's endpoint joined that run's rendezvous (every run's id is `moment`), waited as
    torch's spare node until the run ended, then said "cannot reach the rendezvous ... is the port open?" (hunt-E 2).
    Its agent now refuses at once, and leaves the running run's rendezvous open (torch's shutdown closed it: the
    run could not have restarted)."""
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler as Handler

    from moment.runtime.agent import IN_USE, one_run_per_rendezvous

    monkeypatch.setattr(Handler, "next_rendezvous", Handler.next_rendezvous)  # put back after the test
    monkeypatch.setattr(Handler, "shutdown", Handler.shutdown)
    one_run_per_rendezvous()
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))

    def agent() -> Handler:
        return Handler.from_backend("moment", store, C10dRendezvousBackend(store, "moment"), 1, 1,
                                    local_addr="127.0.0.1")

    running = agent()
    running.next_rendezvous()  # a run of one machine: its round complete
    try:
        late = agent()
        with pytest.raises(MomentError, match=IN_USE):
            late.next_rendezvous()
        assert late.shutdown()
        running._state_holder.sync()
        state = running._state_holder.state
        assert state.complete and not state.closed and len(state.participants) == 1
    finally:
        running.shutdown()


def test_the_agents_own_error_is_the_launchers_one_line(tmp_path, capsys):
    from moment.runtime.agent import IN_USE
    from moment.runtime.rendezvous import Rendezvous

    out = tl.Outcome(code=2, log=tmp_path / "torchrun.log", rdzv=Rendezvous(2, 1, "127.0.0.1", 29511, 60))
    tl._watch(f"error: {IN_USE}: its 2 machines joined already (...)\n", out, 0)
    assert tl.report(out) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("training stopped: the rendezvous endpoint 127.0.0.1:29511 is in use by a run in progress: "
                          "its 2 machines joined already"), err


def test_machine_k_is_told_its_checkpoints_are_machine_0s(tmp_path):
    """Machine 1 was told to resume from its own run directory's checkpoint folder, which never gets one (hunt-E 5)."""
    from moment.cli.train_cmds import _checkpoints_said
    from moment.runtime.rendezvous import Rendezvous

    ck = tmp_path / "runs" / "t" / "checkpoint"
    own = f", checkpoints (resume with --resume --checkpoint-dir {ck})"
    assert _checkpoints_said(ck, None) == own == _checkpoints_said(ck, Rendezvous(2, 0, "127.0.0.1", 29500, 60))
    said = _checkpoints_said(ck, Rendezvous(2, 1, "127.0.0.1", 29500, 60))
    assert str(ck) not in said and "the checkpoints are machine 0's" in said and "every machine with --resume" in said


def test_run_directories_are_fresh_and_a_bad_one_is_one_message(tmp_path):
    a = make_run_dir(None, tmp_path / "L")
    b = make_run_dir(None, tmp_path / "L")
    assert a != b and a.parent == b.parent == tmp_path / "L.runs" and a.is_dir() and b.is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(MomentError, match="--run-dir"):
        make_run_dir(tmp_path / "file" / "runs", tmp_path / "L")


@pytest.mark.parametrize(("run_dir", "says"), [
    ("/", "--run-dir /: names no file or directory of its own"),  # a run once went to /<time>
    ("{t}/file", "--run-dir {t}/file: exists and is a file, not a directory"),
    ("{t}/dangling/runs", "--run-dir {t}/dangling/runs: {t}/dangling is a symbolic link to {t}/nowhere, which does "
                          "not exist"),
])
def test_a_bad_run_dir_is_named_as_itself_before_anything_starts(layout, tmp_path, monkeypatch, capsys,
                                                                  run_dir, says):
    """--run-dir is the parent of each run's folder: a file, a dangling link or `/` is one line naming
    --run-dir (the derived checkpoint directory was named instead, and `/` was trained into)."""
    from moment.cli import main

    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    monkeypatch.setattr(tl, "run", lambda *a, **k: pytest.fail("torchrun must not start"))
    assert main(["train", "--run-dir", run_dir.format(t=tmp_path), "--layout", str(layout), *ARGS]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says.format(t=tmp_path) in err and "--checkpoint-dir" not in err, err


def test_checkpoints_by_default_with_a_dir_and_restarts_say_what_they_lose(layout, tmp_path, monkeypatch, capsys):
    cfg = TrainConfig(layout=layout, checkpoint_dir=tmp_path / "ck", **FAST)
    assert cfg.resolved_checkpoint_every(8) == 2 and TrainConfig(layout=layout).resolved_checkpoint_every(8) == 0
    first = train(cfg)
    assert (tmp_path / "ck" / "checkpoint.pt").exists() and first["checkpoint_dir"] == str(tmp_path / "ck")
    # `moment train` prints its own summary: not also the API's one-line JSON (moment.open_run's, for a user's script)
    shown = capsys.readouterr()
    assert "done: 1 epochs" in shown.err and SUMMARY_PREFIX not in shown.out + shown.err, shown.out[-800:]
    # the SSD devices' line, where the kernel saw them busy in the epoch (moment.io.diskstats)
    busy = [d["device"] for x in first["machines"] for d in x["disks"] if d["read_MB_per_s_busy"]]
    assert ("  SSDs: " in shown.err) == bool(busy) and (not busy or f"SSDs: {busy[0]} (" in shown.err), shown.err
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # as torchrun sets it after a restart
    capsys.readouterr()
    again = train(TrainConfig(layout=layout, checkpoint_dir=tmp_path / "ck", quiet=True, **FAST))
    err = " ".join(capsys.readouterr().err.split())
    assert "restart 1: a rank failed; resumed from step 8 (all 1 epochs were done)" in err  # even --quiet
    assert again["restarts"] == 1 and again["resumed_from_step"] == 8
    train(TrainConfig(layout=layout, quiet=True, **FAST))
    err = " ".join(capsys.readouterr().err.split())
    assert "no --checkpoint-dir, so training starts again from epoch 1" in err


# ---- torchrun, 2 ranks on gloo ----------------------------------------------------------------------------
@pytest.mark.slow
def test_failing_ranks_show_their_errors_not_torchruns_traceback(layout, tmp_path):
    r = _moment_train("--nproc", "2", "--run-dir", str(tmp_path / "runs"), "--layout", str(layout), *ARGS,
                      "--resume", "--checkpoint-dir", str(tmp_path / "empty"))
    assert r.returncode == 2, r.stderr
    err = r.stderr
    assert "error (rank 0): " in err and "error (rank 1): " in err and "no checkpoint here yet" in err
    assert "Traceback" not in err and "ChildFailedError" not in err and "elastic" not in err
    log = next((tmp_path / "runs").glob("*/torchrun.log"))
    assert f"training stopped: a rank reported an error; torchrun's log: {log}" in err
    assert "ChildFailedError" in log.read_text()  # kept, not shown
    assert len(err.strip().splitlines()) <= 6


@pytest.mark.slow
def test_killed_rank_is_announced_and_the_restart_resumes_from_the_default_checkpoint(restarted_run, two_rank_run):
    """`moment train --max-restarts 1` without a checkpoint option, rank 1 exiting after its fifth step (the
    session's restarted_run), compared with the session's uninterrupted 2-rank run of the same layout and
    settings (two epochs)."""
    r = json.loads((restarted_run / "launch.json").read_text())
    assert r["returncode"] == 0, r["stderr"]
    err = " ".join(r["stderr"].split())
    assert "Traceback" not in err, r["stderr"]  # rank 0 may lose its peer first: one line, not a traceback
    assert "rank 1 died (exit code 1); torchrun restarts the ranks (restart 1 of 1)" in err
    m = json.loads((restarted_run / "m.json").read_text())
    assert m["restarts"] == 1 and 0 < m["resumed_from_step"] < 5
    assert f"restart 1: a rank failed; resumed from step {m['resumed_from_step']} (epoch 1, batch" in err, r["stderr"]
    ck = Path(m["checkpoint_dir"])
    assert ck.parent.parent == restarted_run / "runs" and (ck / "checkpoint.pt").exists()
    assert "finished after 1 restart(s)" in err
    assert len(m["loss_curve"]) == len(two_rank_run["loss_curve"]) == 16
    np.testing.assert_allclose(m["loss_curve"], two_rank_run["loss_curve"], rtol=1e-6)


@pytest.mark.slow
def test_the_suggested_budget_is_accepted_and_a_full_disk_stops_every_rank_with_one_message(layout, tmp_path, capsys):
    """The minimum `moment train` names before starting torchrun is what the ranks accept (the same rule and
    numbers); in that run, a checkpoint meeting a full disk stops both ranks with one message naming the
    file, and the last good checkpoint stays."""
    from moment.cli import main
    from moment.runtime.checkpoint import load_checkpoint

    assert main(["train", "--nproc", "2", "--layout", str(layout), *ARGS, "--memory-budget", "200MiB"]) == 2
    hint = re.search(r"give at least --memory-budget (\d+MiB)", capsys.readouterr().err)
    assert hint, "no suggested budget"
    ck = tmp_path / "ck"
    r = _moment_train("--nproc", "2", "--run-dir", str(tmp_path / "runs"), "--layout", str(layout), *ARGS,
                      "--memory-budget", hint.group(1), "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                      "--quiet", env={testpoints.ENOSPC_ENV: "checkpoint-write:2"})
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert "below the minimum" not in err, r.stderr
    said = (f"error (rank 0): {ck / 'checkpoint.pt'}: cannot write the checkpoint at step 4: no space left on the "
            "device; the last good checkpoint (step 2) is kept")
    assert err.count(said) == 1 and "rank 1" not in err and "lost the connection" not in err, r.stderr
    assert "Traceback" not in err and load_checkpoint(ck)["step"] == 2


@pytest.mark.slow
def test_the_held_agents_sizes_are_read_past_its_other_lines_and_waited_for_only_so_long(tmp_path):
    """Its start sizes follow whatever it printed first (those lines go to torchrun's log, in order, even when
    they came in one write); one that ends first, or says nothing within the wait, gives none (stopped). Its go
    comes once torchrun's log is open."""
    from moment.runtime.agent import HOLD_SIZES

    def held(program: str) -> tl.HeldAgent:
        agent = tl.HeldAgent.__new__(tl.HeldAgent)  # the reading alone: a stand-in process for the agent
        agent.early = []
        agent.proc = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        return agent

    agent = held(f"import os, time; os.write(1, b'a warning\\nits detail\\n{HOLD_SIZES} 7 8 9\\n'); time.sleep(60)")
    assert agent.sizes() == (7, 8, 9) and agent.early == ["a warning\n", "its detail\n"]
    agent.stop()
    agent = held("print('cannot load torch')")
    assert agent.sizes() is None and agent.early == ["cannot load torch\n"]
    agent.stop()
    agent = held("import time; time.sleep(60)")
    t0 = time.monotonic()
    assert agent.sizes(wait_s=0.5) is None and time.monotonic() - t0 < 5
    assert agent.proc.wait(5) is not None  # stopped
    agent.stop()
    # a log that cannot be written: the agent is stopped before its go, so no rank ever starts
    agent = held(f"import sys; sys.stdin.readline() and open({str(tmp_path / 'went')!r}, 'w')")
    with pytest.raises(MomentError, match="cannot write torchrun's log"):
        tl.run(agent, [], {}, tmp_path / "no-such-folder" / "torchrun.log", 0)
    assert agent.proc.poll() is not None and not (tmp_path / "went").exists()


@pytest.mark.slow
def test_the_agent_loads_while_the_launcher_checks_and_a_refused_run_leaves_nothing_running(layout, tmp_path,
                                                                                           monkeypatch, capsys):
    """`moment train` starts torchrun's agent held once the options and the data are checked: it loads torch
    while the launcher checks the model and the budget, and measures the start sizes the budget charges
    (no fresh interpreter of its own; recorded). A run refused then (a budget below the minimum, a factory that
    raises) stops it: one line, exit 2, no process left, no rank started."""
    import subprocess as sp

    from moment.cli import main
    from moment.runtime import start_sizes as ss

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing recorded
    for name in ("_measured", "_ahead", "_taken"):
        monkeypatch.setattr(ss, name, {})
    started: list[sp.Popen] = []
    real = sp.Popen

    class Spy(real):
        def __init__(self, args, *a, **k):
            super().__init__(args, *a, **k)
            started.append(self)

    monkeypatch.setattr(sp, "Popen", Spy)
    monkeypatch.chdir(REPO)
    common = ["train", "--nproc", "2", "--layout", str(layout), "--run-dir", str(tmp_path / "runs"), *ARGS]
    assert main([*common, "--memory-budget", "200MiB"]) == 2
    assert "give at least --memory-budget" in capsys.readouterr().err
    (agent,) = started  # the agent alone, held and measuring
    assert agent.args[len(COMMAND):len(COMMAND) + 2] == ["--hold", "measure"] and agent.poll() is not None
    recorded = json.loads(ss.record_path().read_text())["records"][0]
    assert recorded["rank"] == ss.fresh_sizes()[1] > 0  # its figures, recorded
    started.clear()
    assert main([*common, "--model", "tests.user_models:raises"]) == 2  # no budget: nothing to measure
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: --model tests.user_models:raises: factory(") and err.count("error") == 1, err
    (agent,) = started
    assert agent.args[len(COMMAND):len(COMMAND) + 2] == ["--hold", "wait"] and agent.poll() is not None
    assert not (tmp_path / "runs").exists()  # no run directory: no run


def _log_folders(temp: Path) -> list[str]:
    return sorted(p.name for p in temp.iterdir() if p.name.startswith("torchelastic_"))


def _until(done, wait_s: float = 120) -> None:
    deadline = time.monotonic() + wait_s
    while not done():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_held_agent_stopped_or_never_told_to_go_removes_its_log_folder(layout, tmp_path):
    """The held agent has made torchrun's log folder (the `torchelastic_*` one) before its go: a refused run stops
    it (SIGTERM, it ends by that signal) and a launcher that ends without a go closes its input; either way the
    folder goes (a stop by SIGKILL left it, one per refused run)."""
    from moment.cli.train_cmds import torchrun_command

    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1"}
    for how in ("stop", "no go"):
        agent = tl.HeldAgent(torchrun_command(1, ["--layout", str(layout), *ARGS], hold="wait"), env)
        try:
            _until(lambda a=agent: _log_folders(temp) or a.proc.poll() is not None)
            assert _log_folders(temp) and agent.proc.poll() is None, "".join(agent.proc.stdout or [])
            if how == "stop":
                agent.stop()
                assert agent.proc.returncode == -signal.SIGTERM
            else:
                agent.proc.stdin.close()
                assert agent.proc.wait(60) == 0
            assert _log_folders(temp) == [], how
        finally:
            agent.stop()


@pytest.mark.slow
def test_a_signal_that_comes_as_the_go_is_given_is_passed_on(tmp_path):
    """A SIGTERM that reached the launcher while it gave the held agent its go (its handlers set, its watch not yet
    begun) ended it with a traceback, exit 1, in CI's parallel suite: it is passed on to the agent, which stops,
    as one a moment later is."""

    class Agent:  # a held agent whose go is interrupted by the signal
        cmd = ["agent"]
        early: list[str] = []

        def __init__(self):
            self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE,
                                         text=True)

        def go(self, args, env):
            os.kill(os.getpid(), signal.SIGTERM)

    agent = Agent()
    before = signal.getsignal(signal.SIGTERM)
    try:
        out = tl.run(agent, [], {}, tmp_path / "torchrun.log", 0)
        assert (out.code, out.stopped_by) == (128 + signal.SIGTERM, "SIGTERM")
        assert agent.proc.poll() == -signal.SIGTERM and signal.getsignal(signal.SIGTERM) == before
    finally:
        agent.proc.kill()
        agent.proc.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the launcher's children in Linux /proc")
def test_stopping_moment_train_during_its_start_leaves_no_log_folder(layout, tmp_path, bench_epoch):
    """hunt-D D8: a SIGTERM (or SIGHUP, or a SIGKILL of the launcher, which its agent dies with) while the agent is
    held or starting its ranks, before torchrun's own handlers, ended the agent at once and left its empty
    `torchelastic_*` folder in $TMPDIR, one per interrupted launch. Now nothing is left, nor any process."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1"}
    cases = [("folder", signal.SIGTERM), ("go", signal.SIGTERM), ("folder", signal.SIGKILL), ("go", signal.SIGHUP)]
    for when, sig in cases:
        runs = tmp_path / f"runs-{when}-{sig.name}"
        p = subprocess.Popen([sys.executable, "-m", "moment", "train", "--nproc", "2", "--run-dir", str(runs),
                              "--layout", str(layout), *ARGS, "--epochs", "100000"], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        family: set[int] = set()
        try:
            if when == "folder":  # the agent held (the launcher may still be checking the run)
                _until(lambda p=p: _log_folders(temp) or p.poll() is not None)
            else:  # the go given: the launcher forwards the signal while the agent starts the ranks
                assert p.stderr is not None
                for line in p.stderr:
                    if line.startswith("run directory"):
                        break
            assert p.poll() is None, p.stderr.read() if p.stderr else ""
            family = set(bench_epoch.descendants(p.pid)) - {p.pid}
            os.kill(p.pid, sig)
            rc = p.wait(timeout=60)
            assert rc in (-sig, 128 + sig), (when, sig.name, rc, p.stderr.read() if p.stderr else "")
            _until(lambda f=family: not [c for c in f if bench_epoch.alive(c)], 30)
            assert _log_folders(temp) == [], (when, sig.name)
        finally:
            for pid in [p.pid, *family]:
                if bench_epoch.alive(pid):
                    os.kill(pid, signal.SIGKILL)
            p.wait()


@pytest.mark.slow
def test_a_non_finite_loss_on_one_rank_stops_every_rank_together(layout, tmp_path):
    """Only rank 1's first batch holds a NaN feature row: both ranks stop at that step (they agree through
    an all-reduce), with one message naming rank 1, and rank 0 does not report a lost peer."""
    from moment.placement.opened import Layout
    from moment.workload.graph import GraphDataset
    from moment.workload.sampler import CSRGraph, NeighborSampler, SeedBatches
    from moment.workload.seeds import mix

    ds = GraphDataset.open(shutil.copytree(Layout.open(layout).dataset_dir, tmp_path / "ds"))
    train_idx = np.asarray(ds.train_idx)
    bs = TrainConfig().resolved_batch_size(train_idx.size, 2)
    first = [next(iter(SeedBatches(train_idx, bs, seed=0, rank=r, world_size=2).epoch(0))) for r in (0, 1)]
    sampler = NeighborSampler(CSRGraph.from_dataset(ds), [10, 5])
    sampler.generator.manual_seed(mix(0, 0, 0, 0))  # rank 0's first batch, as its pipeline samples it
    read_by_rank0 = set(sampler.sample(first[0]).n_id.tolist())
    victim = next(int(v) for v in first[1].tolist() if int(v) not in read_by_rank0)
    feats = np.load(ds.file("features"), mmap_mode="r+")
    feats[victim] = np.nan
    feats.flush()
    del feats
    # a dataset written with the NaN (a bad import), so its checksums agree and only the loss can tell
    from moment.workload.graph import hash_blocks
    m = json.loads((ds.path / "manifest.json").read_text())
    whole, blocks, size = hash_blocks(ds.file("features"))
    m["files"]["features"].update(sha256=whole, block_sha256=blocks, block_bytes=size)
    (ds.path / "manifest.json").write_text(json.dumps(m))
    r = _moment_train("--nproc", "2", "--run-dir", str(tmp_path / "runs"), "--dataset", str(ds.path),
                      "--features-in-memory", *ARGS, "--quiet")
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert err.count("error (rank 0): training stopped at step 1 (epoch 1, batch 1 of ") == 1, r.stderr
    assert "on rank 1: the loss is not finite because the feature rows read for the batch hold NaN" in err
    assert f"the dataset {ds.path} (features.npy) is probably corrupt" in err
    assert "lost the connection" not in err and "Traceback" not in err and "error (rank 1)" not in err, r.stderr


@pytest.mark.slow
def test_a_diverging_finite_loss_exits_non_zero_with_one_message_and_nothing_saved_past_it(layout, tmp_path):
    """`moment train --lr 1e6`: every loss finite (1e12 and more), and the run exited 0. It stops with one
    message naming divergence, the step and the learning rate; no traceback; the last checkpoint is from
    before the step it names."""
    from moment.runtime.checkpoint import load_checkpoint

    r = _moment_train("--nproc", "1", "--run-dir", str(tmp_path / "runs"), "--layout", str(layout), "--epochs", "1",
                      *ARGS, "--lr", "1e6", "--checkpoint-every", "1", "--quiet")
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    said = "error (rank 0): training stopped at step 4 (epoch 1, batch 4 of 8): the loss diverged (learning rate 1e+06)"
    assert err.count(said) == 1 and err.count("error (rank") == 1, r.stderr
    assert "since step 2" in err and "lower the learning rate (--lr) and start again" in err, r.stderr
    assert "Traceback" not in err and "not finite" not in err, r.stderr
    ck = load_checkpoint(next((tmp_path / "runs").glob("*/checkpoint")))
    assert ck["step"] == 3 and all(np.isfinite(ck["loss_curve"])), ck["loss_curve"]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the launcher's children in Linux /proc")
def test_killing_moment_train_leaves_no_torchrun_or_rank_behind(layout, tmp_path, bench_epoch):
    alive = bench_epoch.alive
    for sig in (signal.SIGTERM, signal.SIGKILL):
        runs = tmp_path / sig.name
        e = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.Popen([sys.executable, "-m", "moment", "train", "--nproc", "2", "--run-dir", str(runs),
                              "--layout", str(layout), *ARGS, "--epochs", "100000", "--checkpoint-every", "1",
                              "--quiet"], cwd=REPO, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # its own group: cleaned up whatever happens
        family: set[int] = set()
        try:
            deadline = time.monotonic() + 240
            while not list(runs.glob("*/checkpoint/checkpoint.pt")):  # the ranks are training
                assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr else ""
                time.sleep(0.2)
            family = set(bench_epoch.descendants(p.pid)) - {p.pid}
            assert len(family) >= 3, family  # torchrun and two ranks
            # the ranks were forked from the agent (moment.runtime.agent), not started as interpreters of their own
            assert all(b"moment.runtime.agent" in Path(f"/proc/{c}/cmdline").read_bytes() for c in family), family
            os.kill(p.pid, sig)
            p.wait(timeout=60)
            deadline = time.monotonic() + 20
            while any(alive(c) for c in family) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not [c for c in family if alive(c)], (sig.name, [c for c in family if alive(c)])
            if sig == signal.SIGTERM:
                assert p.returncode == 128 + sig
                assert "training stopped by SIGTERM" in " ".join(p.stderr.read().split())
        finally:  # torchrun starts each rank in a session of its own: end them one by one
            for pid in [p.pid, *family]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            p.wait()
