"""The `moment` command. The only place in the code that prints.

Each command group lives in its own module and registers itself on `app`; heavy imports (torch,
solvers) happen inside the commands so `moment --help` stays instant.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shlex
import signal
import sys
import threading
from contextlib import nullcontext

import typer
from rich.console import Console
from rich.markup import escape

from moment import locking
from moment.gcpause import freeze_for_exit, paused
from moment.errors import MomentError, missing_torch
from moment.outputs import console_width

# Imports inside functions: each command loads only what it runs, so `moment --help` and every other command
# start fast.

_ROOT = dict(
    name="moment",
    help="Plan and run multi-GPU out-of-core GNN training: where GPUs and SSDs go (scan, plan, compare), "
    "where the data goes (data, place, layout) and how it is read (train).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app = typer.Typer(**_ROOT)
# Piped output (logs, CI) is not wrapped at rich's 80 columns, or any fixed width (outputs.console_width)
console = Console(width=console_width(sys.stdout), emoji=False)  # a user's ":boom:" stays text


def stderr_console(file=None) -> Console:
    """The CLI's console for stderr (`file`: a stream to write to instead of whatever sys.stderr is then)."""
    return Console(file=file, stderr=file is None, width=console_width(sys.stderr), emoji=False)


err_console = stderr_console()


#: The command modules, in the order their commands are listed in `moment --help`. Each registers its
#: commands on `app` when imported; none imports torch at import time (planning must work without it).
MODULES = ("cache_cmds", "cost_cmds", "data_cmds", "doctor_cmds", "fidelity_cmds", "pack_cmds", "place_cmds",
           "scan_cmds", "topology_cmds", "train_cmds", "version_cmds", "serve_cmds")
#: The modules that define each top-level command or group: a command line naming one imports only
#: those (`moment plan` does not import the training, data or service commands; tests/test_cli_imports.py
#: checks this table against what the modules register).
COMMANDS = {
    "advise": ("cost_cmds",), "cache": ("cache_cmds",), "calibrate": ("fidelity_cmds",), "compare": ("topology_cmds",),
    "data": ("data_cmds", "pack_cmds"), "doctor": ("doctor_cmds",), "export": ("scan_cmds",),
    "layout": ("place_cmds",), "models": ("topology_cmds",), "place": ("place_cmds",), "plan": ("topology_cmds",),
    "probe": ("fidelity_cmds",), "profiles": ("topology_cmds",), "scan": ("scan_cmds",), "schema": ("topology_cmds",),
    "serve": ("serve_cmds",), "simulate": ("fidelity_cmds",), "train": ("train_cmds",), "version": ("version_cmds",),
}
#: Commands whose whole run, imports included, does a bounded amount of work and exits: they run with the
#: garbage collector paused (moment.gcpause; `moment plan` spent 110-150 ms of ~0.8 s CPU in it)
GC_PAUSED = frozenset({"plan", "compare"})
#: `moment --help`'s list, in its order: each command's name and the first paragraph of its help, so that a
#: command line naming no command (the root's help, a bad root option, a mistyped command) imports no
#: command module (tests/test_cli_imports.py checks it against the commands' own help)
LISTING = {
    "advise": "Recommend what to buy: how many of which GPU and SSD, and where they go, for the best "
              "throughput per dollar and the best throughput under a budget.",
    "doctor": "Check that this machine is ready to train: run `moment doctor --gpu` first on a GPU machine.",
    "simulate": "Replay an epoch step by step on the capacity graph and compare it with the aggregate LP.",
    "calibrate": "Fit link efficiencies and a per-epoch overhead to measured epoch times by bounded least "
                 "squares.",
    "probe": "Measure this machine through Moment's own I/O stack: each SSD's direct-I/O read rate and "
             "random 4 KiB IOPS, memory copy bandwidth, and (only where CUDA is present) host<->GPU and "
             "GPU<->GPU copy rates. Example: moment probe --ssd-path ssd0=/mnt/nvme0 --out measured.yaml",
    "place": "Place every node embedding in a GPU cache, CPU memory or SSD (DDAK) and write the layout.",
    "scan": "Read a machine's topology: this machine (sysfs, lspci, dmidecode, nvidia-smi, udev) or saved "
            "files.",
    "export": "Write a profile as YAML, JSON or NCCL topology XML (hand the XML to NCCL_TOPO_FILE).",
    "plan": "Recommend which slot gets which GPU and SSD, with predicted bandwidth and bottlenecks.",
    "compare": "Plan several machines (or inventories) and put the best layouts side by side (what-if).",
    "schema": "Print the JSON Schema of a profile (topology), of `plan --json` output, or of the workload.",
    "models": "List the GPU, SSD and NIC models the planner knows (use with --gpu-model/--ssd-model).",
    "profiles": "List the built-in machine profiles (use them with --profile NAME).",
    "train": "Train a GNN from a layout with NPROC data-parallel ranks (torchrun --standalone), or on "
             "several machines: `--nnodes N --node-rank K --rdzv-endpoint HOST:PORT` on each, with its own "
             "--layout.",
    "version": "Print Moment's version and whether the native DDAK kernel, sampler loops and I/O engines are in use.",
    "serve": "Serve the planner over HTTP: JSON under /v1 (plan, compare, simulate, scan, profiles, models, "
             "and place/probe jobs), the OpenAPI schema at /openapi.json, and the web page at / when "
             "installed.",
    "cache": "Cache policies: simulate hit rates and SSD bytes.",
    "data": "Graph datasets: synth, import, info, presample.",
    "layout": "Layouts: verify checksums, show what is where, remove.",
}
_reflowed: set[int] = set()  # help texts already reflowed: reflowing one again would split its paragraphs


def _register(argv: list[str] | None = None) -> None:
    """Import the modules of the command `argv` names (every module when it names none it knows: the
    root's help, a typo), reflow the new help texts, and keep `moment --help`'s order whatever was
    imported first."""
    for name in COMMANDS.get(_named(argv), MODULES):
        importlib.import_module(f"moment.cli.{name}")
    rank = {m: i for i, m in enumerate(MODULES)}

    def module_rank(callback) -> int:
        return rank.get(getattr(callback, "__module__", "").rsplit(".", 1)[-1], len(rank))

    def group_rank(g) -> int:
        infos = g.typer_instance.registered_commands if g.typer_instance is not None else []
        return min((module_rank(c.callback) for c in infos), default=len(rank))

    app.registered_commands.sort(key=lambda c: module_rank(c.callback))
    app.registered_groups.sort(key=group_rank)
    _reflow_help(app)


def _named(argv: list[str] | None) -> str:
    """The command a command line names: its first argument, unless an option comes first (`moment --help
    plan` is the root's help); "" when it names none."""
    args = sys.argv[1:] if argv is None else argv
    return args[0] if args and not args[0].startswith("-") else ""


def _own_path_checks(command) -> None:
    """Leave path checks to the readers (moment.inputs): typer's own check of a path argument says only
    "is not readable" in a usage box; the readers say what the file should be, in one error line. An empty
    path is refused as given (`_refuse_empty`)."""
    for p in command.params:
        desc = getattr(p, "type_descriptor", None)
        info = getattr(desc, "parameter_info", None)
        if info is not None:
            info.readable = False
        if desc is not None and desc.is_path:
            _refuse_empty(p)
    for sub in getattr(command, "commands", {}).values():
        _own_path_checks(sub)


def _refuse_empty(param) -> None:
    """Refuse an empty path option or argument, naming it as given: typer made Path("") of it, which is `.`, so
    `place --out ""` was told "--out .: names no file or directory of its own" of a `.` it was never given."""
    process = param.process_value

    def checked(ctx, value):
        if value == "":
            name = param.opts[0] if param.param_type_name == "option" else (param.name or "").upper()
            raise MomentError("empty path: give the name of a file or directory", source=f"{name} ''")
        return process(ctx, value)

    param.process_value = checked


def _reflow_help(t: typer.Typer) -> None:
    """One line per docstring paragraph: rich keeps a docstring's single line breaks, so help wrapped at
    the source's width came out ragged in an 80-column terminal; rich wraps each paragraph to fit."""
    for c in t.registered_commands:
        if id(c) in _reflowed:
            continue
        _reflowed.add(id(c))
        doc = c.help if c.help is not None else (c.callback.__doc__ if c.callback else None)
        if doc:  # an "Example:" line stays a paragraph of its own
            doc = re.sub(r"\n(?=Example)", "\n\n", inspect.cleandoc(doc))
            c.help = "\n\n".join(" ".join(ln.strip() for ln in p.splitlines()) for p in doc.split("\n\n"))
    for g in t.registered_groups:
        if g.typer_instance is not None:
            _reflow_help(g.typer_instance)


@app.callback()
def _root() -> None:
    """Plan and run multi-GPU out-of-core GNN training."""


def _listing() -> typer.Typer:
    """The root with its commands listed from LISTING, not imported: all that a command line naming no
    command it knows can run (the root's help; a bad root option's or a mistyped command's error)."""
    root = typer.Typer(**_ROOT)
    root.callback()(_root)
    for name, text in LISTING.items():
        root.command(name, help=text)(_listed)
    return root


def _listed() -> None:
    """A command as the root's help lists it (never run: a command line naming it loads the real one)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors become one red message and exit code 2, never a traceback."""
    # (argv None: the command line of this process, which ends after it)
    with paused() if _named(argv) in GC_PAUSED else nullcontext():
        code = _entry(argv)
        if argv is None:  # frozen before a paused collector is back: its first allocation would collect them all
            freeze_for_exit()
    return code


def _entry(argv: list[str] | None) -> int:
    from moment.cli import answers

    asked = answers.question(sys.argv[1:] if argv is None else argv)
    if asked is not None and asked.replay(sys.stdout, sys.stderr):
        return 0
    with asked.recording() if asked is not None else nullcontext():
        code = _run(argv)
    if asked is not None:
        asked.keep(code)
    return code


def _run(argv: list[str] | None) -> int:
    root = app if _named(argv) in COMMANDS else _listing()
    if root is app:
        _register(argv)
    # whoever finds an output locked by this run is told which command holds it
    locking.COMMAND = "moment " + shlex.join(str(a) for a in (sys.argv[1:] if argv is None else argv))
    old = _stop_cleanly_on_sigterm()
    try:
        return _main(argv, root)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None, root: typer.Typer) -> int:
    command = typer.main.get_command(root)
    _own_path_checks(command)
    usage_error, click_exception = _click_errors()
    try:
        code = command.main(args=argv, prog_name="moment", standalone_mode=False)
    except MomentError as e:
        err_console.print("[bold red]error:[/] " + _escape(str(e)), highlight=False, soft_wrap=True)
        return 2
    except ModuleNotFoundError as e:  # a command (or what it imports) needs torch: one line, not a traceback
        if (err := missing_torch(e)) is None:
            raise
        err_console.print("[bold red]error:[/] " + _escape(str(err)), highlight=False, soft_wrap=True)
        return 2
    except usage_error as e:  # a bad flag or value: one line and where to look, not a usage box
        where = e.ctx.command_path if e.ctx is not None else "moment"
        err_console.print("[bold red]error:[/] " + _escape(e.format_message()) + f"\n  hint: see {where} --help",
                          highlight=False, soft_wrap=True)
        return e.exit_code
    except click_exception as e:
        err_console.print("[bold red]error:[/] " + _escape(e.format_message()), highlight=False, soft_wrap=True)
        return e.exit_code
    except typer.Abort:
        err_console.print("aborted", highlight=False)
        return 1
    except Terminated as e:
        err_console.print(f"stopped by a signal: exit {e.code}", highlight=False)
        return int(e.code)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code if isinstance(code, int) else 0


class Terminated(SystemExit):
    """SIGTERM/SIGHUP (`timeout`, a closed terminal): raised where the command is, so its `finally`
    blocks run (output locks released, half-written outputs removed) before it exits 128+signal."""


def _stop_cleanly_on_sigterm() -> dict:
    """Python's default SIGTERM ends the process at once, leaving a lock file and temporary outputs
    behind; turn it into an exception instead (code that forwards signals, e.g. train, sets its own)."""

    def stop(signum, frame):
        raise Terminated(128 + signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                old[sig] = signal.signal(sig, stop)
    return old


def _click_errors() -> tuple[type[Exception], type[Exception]]:
    """click's UsageError and ClickException as this typer raises them (typer vendors its own click)."""
    mro = typer.BadParameter.__mro__
    return (next(c for c in mro if c.__name__ == "UsageError"), next(c for c in mro if c.__name__ == "ClickException"))


def _escape(text: str) -> str:
    return escape(text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
