"""`moment plan` imports what it runs and nothing else: start-up is most of a small plan's time.

Each command line imports only the command module(s) that define the command it names
(`moment.cli.COMMANDS`); the planner loads no torch, no scipy (its LPs go to HiGHS through highspy), no
networkx unless asked for (`--maxflow-backend networkx`) and nothing of the training runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import moment.cli as cli
from moment.io.device import no_gpu_driver

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--json"]


#: runs `python -m moment ARGS` and writes the names in sys.modules at exit to the file in argv[1]
_RUN = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv[0] = "moment"
runpy.run_module("moment", run_name="__main__", alter_sys=True)
"""


def _imported(args: list[str], tmp_path: Path) -> set[str]:
    """The modules a real `moment ARGS` process had imported when it exited (it must succeed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "modules.txt"
    r = subprocess.run([sys.executable, "-c", _RUN, str(out), *args], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.lstrip().startswith("{")
    return set(out.read_text().split())


def _under(mods: set[str], *packages: str) -> list[str]:
    return sorted(m for m in mods if any(m == p or m.startswith(p + ".") for p in packages))


@pytest.mark.slow
def test_plan_imports_no_torch_scipy_networkx_or_runtime(tmp_path):
    mods = _imported(PLAN, tmp_path)
    assert "moment.planner.plan" in mods and "highspy" in mods  # (the list is real)
    assert _under(mods, "torch", "scipy", "networkx", "moment.runtime", "moment.io", "moment.service") == []
    # of the command modules, only the one that defines `plan`
    assert _under(mods, *(f"moment.cli.{m}" for m in cli.MODULES)) == ["moment.cli.topology_cmds"]


@pytest.mark.slow
@pytest.mark.skipif(not no_gpu_driver(), reason="this machine has a GPU driver: the doctor asks torch for devices")
def test_the_doctor_on_a_machine_without_a_gpu_driver_imports_no_torch(tmp_path):
    mods = _imported(["doctor", "--gpu", "--json"], tmp_path)
    assert "moment.runtime.gpucheck" in mods and _under(mods, "torch") == []


@pytest.mark.slow
def test_networkx_only_when_its_max_flow_is_asked_for(tmp_path):
    mods = _imported([*PLAN, "--maxflow-backend", "networkx"], tmp_path)
    assert "networkx" in mods
    assert _under(mods, "torch", "scipy", "moment.runtime") == []


def _modules(typer_app) -> set[str]:
    """The command modules whose commands make up a command group."""
    out = {c.callback.__module__.rsplit(".", 1)[1] for c in typer_app.registered_commands}
    for g in typer_app.registered_groups:
        out |= _modules(g.typer_instance)
    return out


@pytest.fixture(scope="module")
def every_command():
    cli._register([])  # no command named: every module
    return cli.app


def test_the_command_table_names_the_modules_that_define_each_command(every_command):
    found = {c.name: {c.callback.__module__.rsplit(".", 1)[1]} for c in every_command.registered_commands}
    found.update({g.name: _modules(g.typer_instance) for g in every_command.registered_groups})
    assert found == {name: set(mods) for name, mods in cli.COMMANDS.items()}
    assert {m for mods in cli.COMMANDS.values() for m in mods} == set(cli.MODULES)


def test_the_root_listing_is_the_commands_own_help(every_command):
    """`moment --help` lists the commands from cli.LISTING without importing them: the same names, order
    and first paragraphs as the commands themselves give."""
    real = [(c.name, c.help) for c in every_command.registered_commands]
    real += [(g.name, g.help) for g in every_command.registered_groups]
    assert [(name, text.split("\n\n")[0]) for name, text in real] == list(cli.LISTING.items())


@pytest.mark.slow
def test_the_root_help_imports_no_command_module(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "modules.txt"
    r = subprocess.run([sys.executable, "-c", _RUN, str(out), "--help"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "Usage: moment" in r.stdout and " plan " in r.stdout, r.stderr[-2000:]
    assert _under(set(out.read_text().split()), *(f"moment.cli.{m}" for m in cli.MODULES)) == []


def test_the_command_modules_import_no_circle():
    """What two command modules share lives in a module both import (common, render), never in one of
    them: an import circle between command modules breaks as soon as one imports the other at the top."""
    import ast

    edges: dict[str, set[str]] = {}
    for name in cli.MODULES:
        tree = ast.parse((ROOT / "moment" / "cli" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            edges.setdefault(name, set()).update(m.rsplit(".", 1)[-1] for m in mods if m.startswith("moment.cli."))

    def reaches(a: str, b: str, seen: set[str]) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in edges.get(a, ()))

    assert [m for m in cli.MODULES if reaches(m, m, {m})] == []


#: runs module argv[2] as a program with ARGS and writes, at exit, how many objects the collector had frozen and
#: whether it was on
_FROZEN = """
import atexit, gc, runpy, sys
out, module = sys.argv.pop(1), sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(f"{gc.get_freeze_count()} {gc.isenabled()}"))
sys.argv[0] = module
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(("program", "code"), [(["moment", "profiles"], 0),
                                              (["moment.train", "--layout", "no-such-layout"], 2),
                                              (["moment.runtime.agent", "--help"], 0)],
                         ids=["command-line", "rank", "torchrun-agent"])
def test_a_command_line_a_rank_and_the_agent_freeze_what_they_made_before_the_exit_collects_it(program, code,
                                                                                                tmp_path):
    """The interpreter's exit passes over every object once more (0.8 s with torch loaded, at every rank's end):
    a `moment` command line, a rank (here one refusing its layout) and `moment train`'s torchrun agent freeze
    them first, whichever way they end. The rank and the agent load torch with the collector paused
    (moment.gcpause.loading); it is back on after, for what they run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "frozen.txt"
    r = subprocess.run([sys.executable, "-c", _FROZEN, str(out), *program], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == code, r.stderr[-2000:]
    frozen, enabled = out.read_text().split()
    assert int(frozen) > 10_000 and enabled == "True"  # the modules' objects, not a handful
