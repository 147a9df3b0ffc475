"""What a fresh rank and a fresh torchrun agent hold before they touch data, measured once per process.

Why a fresh interpreter: the caller of a preview (`moment train`'s launcher, a benchmark holding a
dataset) is not a rank, so its own RSS is not a rank's fixed cost. A run's launcher has one anyway, its
torchrun agent, started held while the launcher checks (moment.runtime.agent's `--hold`): that agent
measures itself (`measured_by`) and no other interpreter is started. Why not kept for long: most of it is
torch's shared libraries, and how many of their pages a process maps depends on how the page cache came
to hold them (one installation measured 443 MiB for a rank, then 376 MiB after the page cache was
dropped, and stayed there), so a figure kept from an earlier day disagrees with what the rank measures
of itself at start, and the launcher's minimum would then be refused by the rank.

Every measurement is recorded (`record_path`), the last of each installation and model (RECORDS_KEPT). A
preview that hands its figure to no rank (`moment train --dry-run` without a budget) reuses the record of this
installation whatever its age; one that checks a budget (and hands its figure to the ranks) reuses it only when
it was measured in the last RECENT_S seconds since this boot, where the page cache is the one it was measured
in: a launch that follows another, as a person's next try does, starts seconds sooner (a dry run's fresh
interpreter is its longest wait). The plan says when a reused figure was measured.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from importlib.machinery import PathFinder
from pathlib import Path

import moment
from moment.runtime.budget import alone_bytes
from moment.runtime.config import callable_spec, user_model

# Imports inside functions: the models load only when a start size is measured.

#: a fresh interpreter as `moment train`'s torchrun agent (moment.runtime.agent): torch and what its ranks load,
#: a user's model module with it (`preload`), then a rank forked from it (`fork_sizes`); printed: what the agent
#: and the rank each hold alone, and what they share (the agent's memory, the libraries). `moment train`'s held
#: agent measures itself the same way (`measured_by`).
FRESH = """from moment.runtime.agent import fork_sizes, load_torchrun, preload
load_torchrun()
preload({model!r})
print(*fork_sizes())
"""


def script(model: str | None = None) -> str:
    """The fresh interpreter's program for a run of `model`: FRESH, which imports a user's model module as the
    agent does before it forks its ranks."""
    return FRESH.format(model=user_model(model))


def _moment_root() -> Path:
    return Path(__file__).resolve().parents[1]  # the moment package (this is moment/runtime/start_sizes.py)


def _start(model: str | None = None) -> subprocess.Popen | None:
    """The fresh interpreter for a run of `model`, started (None when it cannot be)."""
    root = str(_moment_root().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        return subprocess.Popen([sys.executable, "-c", script(model)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


#: how long a measurement (the fresh interpreter's, or the run's own agent's) may take before it is given up
MEASURE_WAIT_S = 300


def _collect(p: subprocess.Popen | None) -> tuple[int, int, int] | None:
    """(agent, rank, shared) from the fresh interpreter `p`, None when it could not run."""
    if p is None:
        return None
    if not isinstance(p, subprocess.Popen):  # the run's own agent (`measured_by`)
        return p.sizes()
    try:
        out, _ = p.communicate(timeout=MEASURE_WAIT_S)
        if p.returncode:
            return None
        agent, rank, shared = (int(x) for x in out.split()[-3:])
        return agent, rank, shared
    except (subprocess.SubprocessError, ValueError, IndexError):
        p.kill()
        p.communicate()
        return None


#: how long a budgeted launch reuses a measurement made since this boot (seconds)
RECENT_S = 600

_ahead: dict[str | None, subprocess.Popen | None] = {}  # the interpreter `measure_ahead` started, until collected
_measured: dict[str | None, tuple[int, int, int]] = {}  # per user model (None: built-in): measured, or a record taken
_taken: dict[str | None, str] = {}  # when the record `measure_ahead` took for a model was measured


def measure_ahead(*, budgeted: bool, model: str | None = None, start: bool = True) -> bool:
    """Start the measurement now and collect it when a size is first asked for: the launcher's own checks (the
    layout, the dataset, the graph) then run while the fresh interpreter loads torch, seconds of the preview.
    Or reuse the measurement recorded on this installation: any, for a preview that checks no budget; with
    `budgeted`, one made in the last RECENT_S seconds since this boot. `model`: the run's `--model` (a user's
    module is imported by the fresh interpreter too, as the agent imports it). Without `start`, only a record is
    taken (the run's own agent measures: `measured_by`). False when nothing is measured or taken yet."""
    model = user_model(model)
    if model in _ahead or model in _measured:
        return True
    if (got := _read_record(model, within=RECENT_S if budgeted else None)) is not None:
        _measured[model], _taken[model] = (got["agent"], got["rank"], got["shared"]), got["date"]
        return True
    if start:
        _ahead[model] = _start(model)
    return start


def start_sizes(model: str | None = None) -> tuple[int, int, int, str | None]:
    """(torchrun's agent, a rank, the shared pages, None) as `fresh_sizes`; or the record `measure_ahead` took,
    with when it was measured (every later size of this process is that record's: the ranks are handed what
    the preview charged)."""
    return (*fresh_sizes(model), _taken.get(user_model(model)))


def record_path() -> Path:
    """Where the measurements are recorded: $XDG_CACHE_HOME/moment (default ~/.cache/moment)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "moment" / "start_sizes.json"


def _record_key(model: str | None = None) -> dict:
    """What the figure depends on: the interpreter, torch's version, this moment and what it runs (with a
    user's model module, and that module's file as it is now)."""
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"python": sys.executable, "torch": version("torch"), "moment": moment.__version__,
            "moment_path": str(_moment_root()), "script": script(model), "module": _module_file(model)}


def _module_file(model: str | None) -> list | None:
    """A user's model module's file, size and modification time (None for a built-in model, or where it is not
    found), looked up as `load_callable` imports it (the current directory first) without running it: an
    edited module is measured anew."""
    parsed = callable_spec(spec) if (spec := user_model(model)) is not None else None
    if parsed is None:
        return None
    parts, where, found = parsed[0].split("."), [os.getcwd(), *sys.path], None
    try:
        for i in range(len(parts)):
            found = PathFinder.find_spec(".".join(parts[: i + 1]), where)
            if found is None:
                return None
            where = list(found.submodule_search_locations or [])
        st = os.stat(found.origin)
        return [found.origin, st.st_size, st.st_mtime_ns]
    except (ImportError, ValueError, TypeError, OSError):
        return None


def _boot() -> str | None:
    """This boot's id (Linux), None where it cannot be read: then no record is recent."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


#: measurements kept in the record, one per installation and model, the newest first: a person who switches between
#: runs of their own model and the built-in ones, or between two environments, reuses each one's figure
RECORDS_KEPT = 8


def _records() -> list:
    """The record file's measurements, newest first ([] when there is none or it cannot be read; a file of one
    measurement, as earlier versions wrote it, is a list of one)."""
    try:
        got = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return []
    got = got.get("records", [got]) if isinstance(got, dict) else []
    return got if isinstance(got, list) else []


def _read_record(model: str | None = None, within: float | None = None) -> dict | None:
    """The recorded measurement for this installation and model when it is well formed (and, `within`, made that
    many seconds ago at most, since this boot), with when it was measured; else None (measured again)."""
    key = _record_key(model)
    got = next((r for r in _records() if isinstance(r, dict) and r.get("key") == key), None)
    if got is None:
        return None
    try:
        sizes = {k: got[k] for k in ("agent", "rank", "shared")}
        if not all(type(v) is int and v > 0 for v in sizes.values()):
            return None
        day = str(datetime.date.fromisoformat(got["date"]))
        if within is None:
            return {**sizes, "date": day}
        at, now = float(got["at"]), time.time()
        if got["boot"] is None or got["boot"] != _boot() or not 0 <= now - at <= within:
            return None
        return {**sizes, "date": datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")}
    except (ValueError, TypeError, KeyError, OverflowError):
        return None


def _write_record(agent: int, rank: int, shared: int, model: str | None = None) -> None:
    """Record a measurement in place of its key's last (a temporary file renamed over the record: a reader never
    sees half of one; two launchers recording at once may keep only one's, and the other's is measured again);
    a record that cannot be written is no error, the next preview measures again."""
    path = record_path()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    key = _record_key(model)
    new = {"key": key, "agent": agent, "rank": rank, "shared": shared, "date": datetime.date.today().isoformat(),
           "at": time.time(), "boot": _boot()}
    kept = [r for r in _records() if isinstance(r, dict) and r.get("key") != key]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"records": [new, *kept][:RECORDS_KEPT]}))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _stop_ahead() -> None:
    """At exit (a user error before the sizes were asked for): no interpreter outlives the launcher."""
    for p in _ahead.values():
        if isinstance(p, subprocess.Popen) and p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_stop_ahead)


def measured_by(agent, model: str | None = None) -> None:
    """The run's own agent measures the start sizes for `model` (`agent.sizes()`: `moment train`'s held agent,
    which loads and forks as the fresh interpreter does), collected when a size is first asked for."""
    _ahead[user_model(model)] = agent


def fresh_sizes(model: str | None = None) -> tuple[int, int, int]:
    """(torchrun's agent, a rank, the libraries they share) as a fresh interpreter holds them, for a run of
    `model` (its `--model`): each process's own memory, and the pages the machine holds once
    (budget.alone_bytes). Falls back to this process's sizes with the runtime, the optimizers (and the user's
    model module) loaded when no interpreter can be started. Measured once per process and model (or the record
    `measure_ahead` took); each measurement is recorded (`record_path`)."""
    model = user_model(model)
    if model in _measured:
        return _measured[model]
    got = _collect(_ahead.pop(model) if model in _ahead else _start(model))
    if got is not None:
        _write_record(*got, model)
    else:
        from moment.runtime.model_spec import load_rank_code

        load_rank_code(model)
        own, shared = alone_bytes()
        got = own, own, shared
    _measured[model] = got
    return got
