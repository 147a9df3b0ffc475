"""torchrun's agent as `moment train` starts it, and as a user's own script may be started (`python -m
moment.runtime.agent`, with torchrun's options): torch.distributed.run's own `main` (what the `torchrun` command
runs), with the same arguments, then an exit that does not collect torch's objects once more
(`moment.gcpause.freeze_for_exit`). The agent is the last process of a run to end, so its exit is the run's:
0.52 s after its exit handlers as `python -m torch.distributed.run`, 0.11 s frozen.

Its ranks are forked from it, not started as fresh interpreters: the agent first imports what each rank would
import again (torch, the runtime, torch._dynamo, a `moment.train` rank's `--model MODULE:FACTORY` module, the
modules a script's launch names with the agent's own option `--preload MODULE`), so a rank starts with it loaded,
and the pages it did not write stay shared with the agent; so does the node index of the layout the ranks read
(`keep_index`: a `moment.train` rank's --layout, a script's `--preload-index LAYOUT`), which the machine then
holds once. torchrun's own function entrypoints (its `--run-path`) start ranks this way; the start method is
`fork`. `moment train` starts it held (`--hold`, `_held`): it loads
while the launcher checks the run, and starts the ranks on the launcher's go. Measured on 2 cores: a 2-rank GAT
launch on the 100k layout 4.9 -> 3.9 s and 7.3 -> 4.6 CPU-s, equal loss curves, and the 8M bench's machine peak
2,623 -> 2,350 MiB (docs/training.md); one epoch of examples/own_loop.py 7.1-8.2 -> 5.3 s and 12-13 -> 7.1 CPU-s
(docs/your-model-loop-data.md). The agent never initializes CUDA (its imports only; torch asked to check for GPUs
through NVML, which forks safely), so each forked rank sets up its own device as before; a user's module whose
import starts CUDA or a thread gets fresh interpreters (`preload`). A program that is not Python (`--no-python`)
and `--run-path` run as torchrun runs them. The agent names the events of torch's rendezvous from their frames,
not from `inspect.stack()` (`_frame_names_for_rendezvous_events`)."""

import os
import signal
import sys
from collections.abc import Sequence

# Imports inside functions: torch and the runtime load in the agent's process alone, and only for its ranks.

#: the command line that starts the agent (torchrun's options and the rank's program follow)
COMMAND = [sys.executable, "-m", "moment.runtime.agent"]
#: the program `moment train` and `moment doctor --gpu` run on each rank
RANK_MODULE = "moment.train"
#: log directories made for this agent's torchrun in the temporary folder (no `--log-dir` given), removed at its exit
_made_log_dirs: list[str] = []
#: how the agent's error begins when the rendezvous it joins is another run's (`one_run_per_rendezvous`)
IN_USE = "the rendezvous endpoint is in use by a run in progress"
#: signals that end the agent: until torchrun starts the ranks (and sets its own handlers) their default action would
#: end it at once, past the removal of its log directory; they end it through `main`'s clean-up instead
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Stopped(BaseException):
    """SIGTERM or SIGHUP before torchrun's own handlers: unwinds the agent to `main`, which removes its log directory
    and then ends by that signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop_here(signum: int, _frame) -> None:
    for sig in STOP_SIGNALS:  # a second signal (the launcher's, then its death's) must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise _Stopped(signum)


def _stop_through_cleanup() -> None:
    """SIGTERM/SIGHUP end the agent through its clean-up (`_stop_here`); one inherited as ignored stays ignored."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop_here)


def _own_log_dir() -> str:
    """The log directory torchrun would make when none is given (a `torchelastic_*` folder in the temporary folder),
    made here and recorded before it exists, so that a signal at any moment leaves none behind (torchrun's own
    `mkdtemp` made it before this agent could record it)."""
    import secrets
    import tempfile

    while True:
        path = os.path.join(tempfile.gettempdir(), f"torchelastic_{secrets.token_hex(4)}")
        _made_log_dirs.append(path)
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:  # another's: not ours to remove
            _made_log_dirs.remove(path)


def _as_fresh_interpreter() -> None:
    """What a forked rank must not keep of the agent: the signal handlers torchrun set there (its SIGTERM raises),
    replaced by a fresh interpreter's so that torchrun's SIGTERM ends the rank; buffered output (torchrun starts a
    rank with -u)."""
    for sig in signal.valid_signals():
        handler = signal.getsignal(sig)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.reconfigure(write_through=True)


def _fresh_exit_handlers() -> None:
    """The agent's exit handlers dropped; those the standard library registers when it is imported (it already
    is) registered again, so that they run last, as in a fresh interpreter: logging's flush, multiprocessing's
    end of the rank's own workers, weakref finalizers marked to run at exit."""
    import atexit
    import weakref

    atexit._clear()
    for module, name in (("logging", "shutdown"), ("multiprocessing.util", "_exit_function")):
        if module in sys.modules:
            atexit.register(getattr(sys.modules[module], name))
    if weakref.finalize._registered_with_atexit:
        atexit.register(weakref.finalize._exitfunc)


def _status(code: object) -> int:
    """The exit status of SystemExit(code), as the interpreter makes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def program(kind: str, target: str, *argv: str) -> None:
    """A forked rank (`kind` "module": `python -u -m TARGET ARGV`; "script": `python -u TARGET ARGV`), run as the
    interpreter runs it: the script's folder first on sys.path, an uncaught error's traceback (the program's own
    frames) on stderr and status 1, then the program's other threads joined and its exit handlers run. It ends
    the process itself (os._exit) instead of returning to torchrun, which would hold each returned rank until
    every rank has returned (`_exits_count_as_returns`)."""
    import atexit
    import runpy
    import threading
    import traceback

    _as_fresh_interpreter()
    _fresh_exit_handlers()
    sys.argv = [target, *argv]
    code = 0
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = _status(e.code)
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    if code == -signal.SIGINT:  # the interpreter's end after a KeyboardInterrupt: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exits_count_as_returns() -> None:
    """torchrun counts a forked rank done once its function has returned a value; `program` ends the process
    instead, so a rank that exited with status 0 counts as returned (as a fresh interpreter's exit does)."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    is_done = MultiprocessContext._is_done
    if getattr(is_done, "exits_count", False):
        return

    def _is_done(self) -> bool:
        for local_rank, process in enumerate(self._pc.processes):
            if local_rank not in self._return_values and process.exitcode == 0:
                self._return_values[local_rank] = None
        return is_done(self)

    _is_done.exits_count = True
    MultiprocessContext._is_done = _is_done


def preload(model: str | None = None, modules: Sequence[str] = ()) -> bool:
    """What the agent loads for its ranks before forking them (moment.runtime.start_sizes measures the same),
    with a user's `--model MODULE:FACTORY` module (examples/own_loop.py's with PyG: 0.4 CPU-s and 83 MiB of a
    rank's own memory each) and the `--preload` `modules` a user's script names. False when importing them started
    a thread or CUDA, which a forked rank would not have: its ranks then start as fresh interpreters. A `--model`
    module that fails to import is left to the ranks, which say why; a `--preload` one is the agent's MomentError,
    before any rank starts."""
    from moment.gcpause import loading

    # frozen once loaded: besides the collections they would cost here (moment.gcpause.loading), a forked rank's
    # collector never writes to (copies) the pages of what is loaded here
    with loading():
        import moment.runtime.train  # noqa: F401 - what a rank loads first
        from moment.runtime.models import load_optimizers

        load_optimizers()
        forkable = True
        if model is not None or modules:
            from moment.errors import MomentError
            from moment.io.device import cuda_started
            from moment.runtime.model_spec import import_named, load_callable

            before = _threads()
            for name in modules:
                import_named(name, f"--preload {name or repr(name)}")
            if model is not None:
                try:
                    load_callable(model, "--model")
                except MomentError:
                    pass
            forkable = _threads() == before and not cuda_started()
    return forkable


def fork_sizes() -> tuple[int, int, int]:
    """(what this agent holds alone, what a rank forked from it now holds alone, the most either shares) as the
    budget charges them: measured with a child forked here that only waits (moment.runtime.start_sizes)."""
    from moment.runtime.budget import process_sizes

    (ready, told), (wait, go) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank's stand-in: it ends when told, or when this process is gone (its pipe ends)
        os.close(ready)
        os.close(go)
        try:
            os.write(told, b"1")
            os.read(wait, 1)
        finally:
            os._exit(0)
    os.close(told)
    os.close(wait)
    try:
        if os.read(ready, 1) != b"1":
            raise OSError("the forked stand-in of a rank did not start")
        (agent, agent_shared), (rank, rank_shared) = process_sizes(), process_sizes(pid)
        os.write(go, b"1")
    finally:
        os.close(ready)
        os.close(go)
        os.waitpid(pid, 0)
    return agent, rank, max(agent_shared, rank_shared)


#: `--hold measure`: the line the held agent prints its start sizes on (agent, rank, shared bytes)
HOLD_SIZES = "moment-agent-sizes:"


def keep_index(layout: str | None, *, given: bool = False) -> None:
    """Load and check the node index of the layout the ranks read (`Layout.keep_index`) once, here, so that each
    forked rank finds it loaded and the machine holds one copy instead of one per rank. One that cannot be read
    is left to the ranks, which say why; one the user named (`given`: --preload-index) is the agent's
    MomentError, before any rank starts. With `given` (a script's launch, which no `moment train` launcher
    checked) the layout's dataset is checked here too, once, and the ranks are told (GraphDataset.vouch); one
    that cannot be opened or is damaged is left to the ranks."""
    if layout is None:
        return
    from moment.errors import MomentError
    from moment.placement.opened import Layout

    try:
        opened = Layout.open(layout)
        opened.keep_index()
    except (MomentError, OSError, ValueError) as e:
        if given:
            raise MomentError(f"cannot load the layout's node index: {e}", source=f"--preload-index {layout}") from None
        return
    if given:
        from moment.workload.graph import CHECKED_ENV, GraphDataset

        try:
            _, checked = GraphDataset.open(opened.dataset_dir).vouch()
        except (MomentError, OSError, ValueError):
            return  # (the script may read another copy) its ranks check what they open, and say why
        if checked:
            os.environ[CHECKED_ENV] = checked  # what the ranks start with


def _held(mode: str, layout: str | None) -> list[str]:
    """`moment train`'s held agent (`--hold`): started while the launcher still checks the run, it loads what
    its ranks load, prints its start sizes when asked (`measure`: before it keeps the `layout`'s index, which
    the budget charges on its own), keeps that index meanwhile, then waits for the launcher's go, one JSON
    line on stdin: the rank arguments to add and the environment the ranks get. No go (the launcher refused
    the run, or died): the agent ends here, before any rendezvous."""
    import json

    if mode == "measure":
        print(HOLD_SIZES, *fork_sizes(), flush=True)
    keep_index(layout)
    line = sys.stdin.readline()
    if not line:
        remove_empty_log_dirs()
        os._exit(0)
    go = json.loads(line)
    os.environ.update(go["env"])
    null = os.open(os.devnull, os.O_RDONLY)  # the ranks read nothing from the launcher
    os.dup2(null, 0)
    os.close(null)
    return list(go["args"])


#: native threads a forked rank does without: jemalloc's background purger (pyarrow's allocator starts one when
#: PyG's pandas imports it), whose own fork handlers leave the child's allocator whole and the thread off
_FORK_SAFE_THREADS = ("jemalloc_bg_thd",)


def _threads() -> int:
    """The threads of this process, native ones (an OpenMP pool) included where Linux lists them, but for those
    a fork leaves behind safely (`_FORK_SAFE_THREADS`): importing a user's PyG model started jemalloc's, and its
    ranks started as fresh interpreters (`moment train --model examples.own_loop:factory`, one epoch on 2 ranks:
    agent and ranks 10.3 -> 5.3 CPU-s)."""
    import threading

    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return threading.active_count()
    return sum(_task_name(t) not in _FORK_SAFE_THREADS for t in tasks)


def _task_name(task: str) -> str:
    try:
        with open(f"/proc/self/task/{task}/comm") as f:
            return f.read().strip()
    except OSError:  # ended meanwhile
        return ""


def with_options(get_args_parser):
    """torchrun's `get_args_parser`, with the agent's own options: `--preload MODULE`, and `--hold` (`moment
    train`'s, not shown)."""
    import argparse

    def parser():
        p = get_args_parser()
        p.add_argument("--preload", action="append", default=[], metavar="MODULE",
                       help="a module the script imports (e.g. torch_geometric, or the one that defines its model), "
                            "imported once by this agent before it forks the ranks, so that each rank finds it loaded "
                            "and shares its memory; repeat for several. One whose import starts a thread or CUDA makes "
                            "the ranks fresh interpreters")
        p.add_argument("--preload-index", default=None, metavar="LAYOUT",
                       help="the layout the script reads (moment.open_run): its node index is loaded and checked "
                            "once by this agent before it forks the ranks, which share that copy instead of each "
                            "reading its own, and its dataset is checked once for them (`moment train` does both "
                            "itself)")
        p.add_argument("--hold", choices=("wait", "measure"), default=None, help=argparse.SUPPRESS)
        return p

    return parser


def forked_ranks(config_from_args):
    """torchrun's `config_from_args`, with the ranks of a Python program forked from this process (`program`) once
    it has loaded what they load first. `--no-python` (a program that is not Python) and `--run-path` (torchrun's
    own function entrypoint) are left to torchrun."""

    def config(args):
        if not args.log_dir:
            args.log_dir = _own_log_dir()
        cfg, cmd, cmd_args = config_from_args(args)
        if args.no_python or args.run_path:
            given = [f"{f} {v}" for f, v in (("--preload", (getattr(args, "preload", None) or [None])[0]),
                                              ("--preload-index", getattr(args, "preload_index", None))) if v]
            if given:
                from moment.errors import MomentError

                flag = "--no-python" if args.no_python else "--run-path"
                raise MomentError(f"the ranks of a {flag} launch are not forked from this agent, so nothing it loads "
                                  "reaches them", source=given[0], hint=f"drop {given[0].split()[0]} or {flag}")
            return cfg, cmd, cmd_args
        from moment.runtime.config import layout_in, user_model_in

        ours = args.module and args.training_script == RANK_MODULE
        forkable = preload(user_model_in(args.training_script_args) if ours else None, getattr(args, "preload", ()))
        named = getattr(args, "preload_index", None)
        layout = (named or (layout_in(args.training_script_args) if ours else None)) if forkable else None
        if getattr(args, "hold", None):
            more = _held(args.hold, layout)
        else:
            more = []
            keep_index(layout, given=named is not None)
        if not forkable:
            return cfg, cmd, [*cmd_args, *more]
        cfg.start_method = "fork"
        _exits_count_as_returns()
        return cfg, program, ["module" if args.module else "script", args.training_script,
                              *args.training_script_args, *more]

    return config


def _frame_names_for_rendezvous_events() -> None:
    """torch's dynamic rendezvous names the method of each event it records by calling `inspect.stack()` twice,
    which reads the source line of every frame and, for each frame not from a module's file (runpy's), scans every
    loaded module: 9 calls in a 2-rank run of the 100k layout, at the ranks' start and at the run's end, 0.12-0.15
    CPU-s of the agent's (0.27-0.30 with a user's PyG model loaded). The frame `depth` levels up names the same
    method (`inspect.stack()[depth].function`). A torch without the function (the train extra allows 2.3 on) is
    left as it is."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    if not callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        return

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # fewer frames than that, as torch's says
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def one_run_per_rendezvous() -> None:
    """An agent whose first join finds the rendezvous's round complete without it (every machine joined, a run in
    progress) ends with one MomentError saying so. Why: every `moment train` gives the rendezvous id `moment`
    (`Rendezvous.torchrun_args`), so a second run started on the endpoint of a running one joined that run's
    rendezvous, waited as torch's spare node until the run ended, and then said "cannot reach the rendezvous ...
    is the port open?" (or, past --rdzv-timeout, that not all its machines joined, though both had). A round
    completes only with all --nnodes machines, so a machine of the same run finds it complete only when it was
    started twice. Such an agent leaves the rendezvous as it found it: torch's agent ending in an error shuts its
    rendezvous down, which closed the running run's (no restart could then rejoin it). A torch without the handler's
    method is left as it is."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    handler = getattr(dynamic_rendezvous, "DynamicRendezvousHandler", None)
    joined = getattr(handler, "next_rendezvous", None)
    if joined is None or getattr(joined, "one_run", False):
        return

    def next_rendezvous(self):
        if not getattr(self, "_moment_joined", False):  # a restart's rounds are its run's own
            from moment.errors import MomentError

            try:  # torch's own state (private): a torch that keeps it otherwise is joined as before
                self._state_holder.sync()
                state = self._state_holder.state
                taken = state.complete and not state.closed and self._this_node not in state.participants
            except AttributeError:
                taken = False
            if taken:
                self._moment_refused = True
                raise MomentError(
                    f"{IN_USE}: its {len(state.participants)} machines joined already (another run started on this "
                    "endpoint, or a machine of this run started twice); give each run its own port (--rdzv-endpoint "
                    "HOST:PORT, the same on every machine of that run)")
            self._moment_joined = True
        return joined(self)

    def shutdown(self) -> bool:
        if getattr(self, "_moment_refused", False):  # torch's closes the rendezvous: the other run's, never joined
            return True
        return closes(self)

    closes = handler.shutdown
    next_rendezvous.one_run = True
    handler.next_rendezvous, handler.shutdown = next_rendezvous, shutdown


def remove_empty_log_dirs() -> None:
    """torchrun makes a log directory in the temporary folder when none is given and leaves it there, empty unless
    a rank's output was redirected (`--redirects`, `--tee`): one directory per launch, thousands after a test suite.
    This agent makes it (`_own_log_dir`) and removes it here, at its exit or its stop (`_stop_here`): empty
    directories go; any holding a file stays, with the file."""
    for root in _made_log_dirs:
        for folder, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):  # deepest first
            try:
                os.rmdir(folder)
            except OSError:  # holds a file (or is gone already)
                pass
    _made_log_dirs.clear()


def load_torchrun():
    """torchrun's launcher module, loaded as the agent loads it (moment.gcpause.loading), here and where its start
    sizes are measured (moment.runtime.start_sizes)."""
    from moment.gcpause import loading

    with loading():
        import torch.distributed.run

        import moment.runtime.config  # noqa: F401 - what `forked_ranks` reads the ranks' options with

    return torch.distributed.run


def main(argv: list[str] | None = None) -> int:
    """torchrun's `main` with forked ranks, `--preload` and `--hold`; a user error (a `--preload` module that cannot be
    imported) is one line and exit status 2, before any rank starts."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before torch: a check never initializes CUDA
    _stop_through_cleanup()
    try:
        from moment.errors import MomentError

        torchrun = load_torchrun()
        _frame_names_for_rendezvous_events()
        one_run_per_rendezvous()
        torchrun.config_from_args = forked_ranks(torchrun.config_from_args)
        torchrun.get_args_parser = with_options(torchrun.get_args_parser)
        try:
            torchrun.main(argv)
        except MomentError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        finally:
            remove_empty_log_dirs()
    except _Stopped as e:  # before the ranks started (torchrun's handlers): ended by the signal, as it would have been
        remove_empty_log_dirs()  # again: the signal may have come during it (now ignored, it cannot again)
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)
        return 128 + e.signum
    return 0


if __name__ == "__main__":
    from moment.gcpause import freeze_for_exit

    try:
        code = main()
    finally:
        freeze_for_exit()
    sys.exit(code)
