"""Whole-process timings for the benches: a command run in fresh interpreters, the median of several
(wall seconds, and CPU seconds, which other work on the machine disturbs less), and the same command
from another commit's tree (`git archive`) as a baseline in the same run.

Bytecode goes to a private cache (PYTHONPYCACHEPREFIX) filled by one run that is not counted, so each
counted run starts a fresh process as an installed `moment` does, compiled once.

Run as a script, the floor: `moment --help` (starting Python with the CLI), `moment plan` on paper-machine-b
with 4 GPUs + 8 SSDs and `moment train --dry-run` on the README's 100k layout, each as its median wall
seconds and its ratio to the help's, for this tree and for commit `--against` (default: where this branch
left main), alternating so that the machine's other work disturbs both alike; beside them `plan_libraries`, the
help run after importing what `moment plan` loads beyond it outside the standard library and Moment (numpy,
pydantic, HiGHS, OR-Tools...): the least a plan using those libraries can take. `--launch`: `moment train`
itself on that layout (two ranks, one epoch, `--memory-budget 3GiB`, with the built-in model and with
examples/own_loop.py's), its start size measured anew and recorded, `--runs` rounds. `--agent`: torchrun's agent
alone on that layout (two forked ranks, one epoch): its own CPU seconds (what it loads, its watch) and the run's.
`--start LAYOUT`: a large
layout's start (`start`): `moment train --data-only` on it, two ranks, one epoch, its layout and dataset dropped
from the page cache before each run, now and at `--against`, alternating: wall and CPU seconds, and the memory
the run charged for the layout index and measured at its peak; `--dataset DIR`: the run reads that copy of its
dataset (a layout in /dev/shm with its dataset on disk: the start's reads of the graph, cold, without the epoch's).

    .venv/bin/python bench/processes.py [--runs 5] [--against REF] [--floor-dir /tmp/floor] [--launch | --agent]
    .venv/bin/python bench/processes.py --start /tmp/bench/cache16/layout-16000000-256-a512 [--budget 5GiB]
    .venv/bin/python bench/processes.py --start /dev/shm/L --dataset /data/DS [--budget 3GiB]  # its dataset on disk
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: the commit before the start-up and advise work: the default baseline of `--against`
BEFORE = "6242c0a"


@dataclass
class Timing:
    wall_s: float  # median
    cpu_s: float  # median, user + system of the process
    runs: list[float]  # wall seconds of each counted run
    stdout: str  # of the last run

    def line(self) -> str:
        return f"{self.wall_s:.3f} s wall, {self.cpu_s:.3f} s CPU (median of {len(self.runs)}: " + \
            ", ".join(f"{r:.2f}" for r in self.runs) + ")"


def tree_at(ref: str) -> Path:
    """The source tree of commit `ref` in a temporary folder, with this checkout's compiled extensions (an archive
    has none, and a tree without them would read through the slower fallback engine)."""
    out = Path(tempfile.mkdtemp(prefix=f"moment-{ref.replace('/', '_')}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref], capture_output=True,
                             check=True).stdout
    tar = out / "src.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    tar.unlink()
    for built in (ROOT / "moment").rglob("*.so"):
        target = out / built.relative_to(ROOT)
        if target.parent.is_dir():
            shutil.copy2(built, target)
    return out


def time_command(args: list[str], runs: int, *, tree: Path | None = None, cwd: Path | None = None,
                 program: list[str] | None = None, kept: bool = False) -> Timing:
    """`python -m moment ARGS` (`python PROGRAM ARGS`) from `tree` (default: this checkout) `runs` times after one
    uncounted run. Every run does the command's work (MOMENT_ANSWERS=off); `kept`: a question asked again is
    answered from the answers the uncounted run kept (moment.cli.answers, in a cache of its own)."""
    cache = Path(tempfile.mkdtemp(prefix="moment-pyc-"))
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(cache), MOMENT_ANSWERS="on" if kept else "off")
    if kept:
        env["MOMENT_CACHE"] = tempfile.mkdtemp(prefix="moment-answers-")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, *(program or ["-m", "moment"]), *args]
    walls, cpus, out = [], [], ""
    for i in range(runs + 1):
        wall, cpu, stdout = _timed(cmd, env, cwd or tree or ROOT)
        if i:  # the first run fills the bytecode cache
            walls.append(wall)
            cpus.append(cpu)
            out = stdout
    return Timing(statistics.median(walls), statistics.median(cpus), walls, out)


def _timed(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float | None = None) -> tuple[float, float, str]:
    """One run of `cmd`: its wall seconds, its CPU seconds (user + system, its children's included) and its
    output; a failed run, or one still running after `timeout` seconds, ends the bench."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), _now()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(cmd)} was still running after {timeout:.0f} s (in {cwd}): stopped") from None
    wall, after = _now() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (in {cwd}):\n{r.stderr[-2000:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, r.stdout


def compare(name: str, args: list[str], runs: int, against: str | None, target: str = "",
            same=lambda a, b: a == b) -> Timing:
    """Print `name.*` lines: this checkout's whole-process time, and beside it the same command from
    commit `against` (its time, the ratio, and whether the output is the same by `same`); returns this one's."""
    print(f"{name}.command: moment {' '.join(args)}")
    now = time_command(args, runs)
    print(f"{name}.wall_s: {now.wall_s:.3f}" + (f"  (target {target})" if target else ""))
    print(f"{name}.cpu_s: {now.cpu_s:.3f}")
    print(f"{name}.runs_s: {', '.join(f'{r:.3f}' for r in now.runs)}")
    if against is None:
        return now
    then = time_command(args, runs, tree=tree_at(against))
    print(f"{name}.baseline_{against}.wall_s: {then.wall_s:.3f}")
    print(f"{name}.baseline_{against}.cpu_s: {then.cpu_s:.3f}")
    print(f"{name}.baseline_{against}.runs_s: {', '.join(f'{r:.3f}' for r in then.runs)}")
    print(f"{name}.speedup_wall: {then.wall_s / now.wall_s:.2f}x")
    print(f"{name}.speedup_cpu: {then.cpu_s / now.cpu_s:.2f}x")
    print(f"{name}.same_output_as_baseline: {same(now.stdout, then.stdout)}")
    return now


def _now() -> float:
    import time

    return time.perf_counter()


#: the floor's commands (`moment ARGS`; {dir}: the README's 100k example, made by `floor_dir`), targets and
#: whether the question is asked again (`plan_again`: answered from the kept answer; `plan`: solved every time)
_PLAN = ["plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8"]
FLOOR = {"help": (["--help"], 1.0, False),
         "plan": (_PLAN, 1.6, False),
         "plan_again": (_PLAN, 1.6, True),
         "dry_run": (["train", "--dry-run", "--layout", "{dir}/layouts/synth100k"], 3.0, False)}


# `python -c _LOADED OUT ARGS`: runs `moment ARGS` and writes the names of the modules it loaded to OUT
_LOADED = """import runpy, sys
out, sys.argv = sys.argv[1], ["moment", *sys.argv[2:]]
try:
    runpy.run_module("moment", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
with open(out, "w") as f:
    f.write("\\n".join(sys.modules))
"""
# `python -c _PRELOADED MODULES`: imports MODULES (comma-separated), then runs `moment --help`
_PRELOADED = """import importlib, runpy, sys
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
    except Exception:
        pass
sys.argv = ["moment", "--help"]
runpy.run_module("moment", run_name="__main__", alter_sys=True)
"""


def libraries(args: list[str], tree: Path, cwd: Path) -> list[str]:
    """The modules outside Python's standard library and Moment that `moment ARGS` loads and `moment --help`
    does not (parents before their submodules): what any command doing its work with these libraries loads."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
               MOMENT_ANSWERS="off")  # a kept answer loads nothing
    loaded = []
    for argv in (["--help"], args):
        with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
            subprocess.run([sys.executable, "-c", _LOADED, out.name, *argv], env=env, cwd=cwd, check=True,
                           capture_output=True)
            loaded.append(set(out.read().split()))
    own = set(sys.stdlib_module_names) | {"moment"}
    return sorted(m for m in loaded[1] - loaded[0]
                  if m.split(".")[0] not in own and not m.startswith(("__", "_sysconfigdata")))


#: the floor's row for `libraries(plan)` loaded before the help
PLAN_LIBRARIES = "plan_libraries"


def floor_dir(path: Path) -> Path:
    """The README's 100k example (dataset, plan, layout) at `path`, made with the README's commands if missing."""
    if not (path / "layouts" / "synth100k").is_dir():
        path.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        plan = subprocess.run([sys.executable, "-m", "moment", "plan", "--profile", "paper-machine-b", "--gpus", "4",
                               "--ssds", "8", "--json"], cwd=path, check=True, capture_output=True, text=True, env=env)
        (path / "plan.json").write_text(plan.stdout)
        for ssd in ("nvme0", "nvme1"):
            (path / "mnt" / ssd).mkdir(parents=True, exist_ok=True)
        for args in (["data", "synth", "--nodes", "100000", "--feature-dim", "64", "--out", "data/synth100k"],
                     ["place", "--dataset", "data/synth100k", "--profile", "paper-machine-b", "--gpus", "4", "--ssds",
                      "8", "--plan", "plan.json", "--gpu-cache", "2%", "--cpu-cache", "5%", "--ssd-path",
                      "ssd0=mnt/nvme0", "--ssd-path", "ssd1=mnt/nvme1", "--out", "layouts/synth100k"]):
            subprocess.run([sys.executable, "-m", "moment", *args], cwd=path, check=True, capture_output=True, env=env)
    return path


def floor(runs: int, against: str, where: Path) -> None:
    """Print each floor command's median wall seconds and ratio to `moment --help`, now and at `against`;
    the two trees' runs alternate, twice, each time `runs` counted runs."""
    # a private user cache: the dry run's uncounted first run records a fresh rank's size, the counted reuse it
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="moment-xdg-")
    trees = {"now": ROOT, against: tree_at(against)}  # (run from `where`: this checkout named, not installed)
    got: dict[tuple[str, str], list[float]] = {}
    # the help with the plan's libraries loaded first: no `moment plan` using them can start in less
    libs = {label: libraries(FLOOR["plan"][0], tree, where) for label, tree in trees.items()}
    for _ in range(2):
        for label, tree in trees.items():
            for name, (args, _, kept) in FLOOR.items():
                t = time_command([a.format(dir=where) for a in args], runs, tree=tree, cwd=where, kept=kept)
                got.setdefault((label, name), []).extend(t.runs)
            t = time_command([], runs, tree=tree, cwd=where, program=["-c", _PRELOADED, ",".join(libs[label])])
            got.setdefault((label, PLAN_LIBRARIES), []).extend(t.runs)
    print(f"{'command':<14} " + " ".join(f"{label + ' s':>12} {'ratio':>6}" for label in trees) + "  target")
    for name, target in [*((n, t) for n, (_, t, _) in FLOOR.items()), (PLAN_LIBRARIES, None)]:
        cells = []
        for label in trees:
            med, base = statistics.median(got[label, name]), statistics.median(got[label, "help"])
            cells.append(f"{med:>12.3f} {med / base:>5.2f}x")
        print(f"{name:<14} " + " ".join(cells) + (f"  <= {target}x" if target and name != "help" else ""))
    tops = sorted({m.split(".")[0] for m in libs["now"]})
    print(f"{PLAN_LIBRARIES}: `moment --help` after importing the {len(libs['now'])} modules `moment plan` loads "
          f"beyond it, outside the standard library and Moment ({', '.join(tops)})")


#: `--launch`: `moment train` itself on the README's 100k layout, two ranks, one epoch, under a budget
LAUNCH = {"built-in model": [],
          "user's model": ["--model", "examples.own_loop:factory", "--loss", "examples.own_loop:loss"]}


def launch(runs: int, against: str, where: Path) -> None:
    """Each LAUNCH run's median wall and CPU seconds to the end of the run, now and at `against`, alternating:
    with the start size measured anew (an empty cache folder per run) and recorded (one uncounted run first)."""
    trees = {"now": ROOT, against: tree_at(against)}
    pyc = tempfile.mkdtemp(prefix="moment-pyc-")
    kept = {(label, name): tempfile.mkdtemp(prefix="moment-xdg-") for label in trees for name in LAUNCH}
    got: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    kinds = ("measured anew", "recorded")
    for i in range(runs + 1):  # the first round fills the bytecode caches and the records, not counted
        for (label, tree), (name, extra), kind in itertools.product(trees.items(), LAUNCH.items(), kinds):
            xdg = tempfile.mkdtemp(prefix="moment-xdg-") if kind == "measured anew" else kept[label, name]
            env = dict(os.environ, PYTHONPATH=str(tree), XDG_CACHE_HOME=xdg, PYTHONPYCACHEPREFIX=pyc)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            cmd = [sys.executable, "-m", "moment", "train", "--nproc", "2", "--layout",
                   str(where / "layouts" / "synth100k"), "--run-dir", tempfile.mkdtemp(prefix="moment-runs-"),
                   "--epochs", "1", "--memory-budget", "3GiB", "--checkpoint-every", "0", "--quiet", *extra]
            wall, cpu, _ = _timed(cmd, env, tree)
            if i:
                got.setdefault((label, name, kind), []).append((wall, cpu))
    print(f"{'moment train (2 ranks, 1 epoch, 100k)':<42} " +
          " ".join(f"{label + ' s':>10} {'CPU s':>6}" for label in trees) + "  speedup")
    for name in LAUNCH:
        for kind in kinds:
            med = {label: [statistics.median(x[k] for x in got[label, name, kind]) for k in (0, 1)] for label in trees}
            print(f"{name + ', start size ' + kind:<42} " +
                  " ".join(f"{w:>10.2f} {c:>6.2f}" for w, c in med.values()) +
                  f"  {med[against][0] / med['now'][0]:.2f}x")
            for label in trees:
                print(f"  {label} runs s: " + ", ".join(f"{w:.2f}" for w, _ in got[label, name, kind]))


#: `--agent`: torchrun's agent run as a program, writing its own CPU seconds (not its ranks') at its exit; argv[1]: where
AGENT_SELF = """import atexit, os, resource, runpy, sys
out, pid = sys.argv.pop(1), os.getpid()
def own():
    if os.getpid() == pid:  # the agent, not a forked rank
        r = resource.getrusage(resource.RUSAGE_SELF)
        open(out, "w").write(str(r.ru_utime + r.ru_stime))
atexit.register(own)
sys.argv[0] = "moment.runtime.agent"
runpy.run_module("moment.runtime.agent", run_name="__main__", alter_sys=True)
"""


def agent(runs: int, against: str, where: Path) -> None:
    """torchrun's agent alone (`python -m moment.runtime.agent`, two forked ranks of `moment.train`, one epoch of the
    100k layout): its own CPU seconds, which are what it loads (torch, torch._dynamo, the runtime) and its watch of
    the ranks, and the whole run's wall and CPU seconds, now and at `against`, alternating, after one uncounted
    round (bytecode)."""
    trees = {"now": ROOT, against: tree_at(against)}
    pyc = tempfile.mkdtemp(prefix="moment-pyc-")
    got: dict[str, list[tuple[float, float, float]]] = {label: [] for label in trees}
    own = Path(tempfile.mkdtemp(prefix="moment-agent-")) / "cpu"  # each run's agent writes it, read at once
    for i in range(runs + 1):
        for label, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree), PYTHONPYCACHEPREFIX=pyc)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            own.unlink(missing_ok=True)  # an agent that wrote nothing is not read as the last one's figure
            wall, cpu, _ = _timed([sys.executable, "-c", AGENT_SELF, str(own), "--standalone", "--nproc-per-node=2",
                                   "-m", "moment.train", "--layout", str(where / "layouts" / "synth100k"),
                                   "--epochs", "1", "--checkpoint-every", "0", "--quiet"], env, tree)
            if i:
                got[label].append((float(own.read_text()), wall, cpu))
    print(f"{'torchrun agent, 2 forked ranks, 1 epoch, 100k':<46} {'agent CPU s':>11} {'run s':>6} {'run CPU s':>9}")
    for label, runs_ in got.items():
        med = [statistics.median(x[k] for x in runs_) for k in range(3)]
        print(f"  {label:<44} {med[0]:>11.2f} {med[1]:>6.2f} {med[2]:>9.2f}  (agent CPU s: " +
              ", ".join(f"{x[0]:.2f}" for x in runs_) + ")")
    now, then = ([statistics.median(x[k] for x in got[label]) for k in range(3)] for label in trees)
    print(f"  agent_cpu_ratio: {then[0] / now[0]:.2f}x  run_cpu_ratio: {then[2] / now[2]:.2f}x  "
          f"run_wall_ratio: {then[1] / now[1]:.2f}x")


def start(runs: int, against: str, layout: Path, budget: str, deadline: float, dataset: Path | None = None) -> None:
    """`moment train --data-only` on `layout` (two ranks, one epoch, `budget`) from a cold page cache for its data,
    `runs` rounds of both trees alternating, after one uncounted round (bytecode, start-size records): each run's
    line as it ends, then the median wall and CPU seconds of the whole run, and from its metrics the machine's
    charge for the layout index and the run's measured peak. The disk is checked before and after (a throttled
    cloud disk slows both trees' reads, not their start); a run past `deadline` seconds ends the bench. `dataset`:
    the run reads that copy of the layout's dataset (`--dataset`; an in-memory layout's dataset on disk, cold)."""
    import json

    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this tree's moment, also for the bench it imports
    from epoch import check_disk, drop_files

    from moment.placement.opened import Layout

    opened = Layout.open(layout)
    data = [layout, dataset or opened.dataset_dir]
    given = ["--dataset", str(dataset)] if dataset is not None else []
    shards = [opened.shard_file(s) for s in opened.manifest.shards if s.kind == "ssd"]
    disk = check_disk(shards, "start", "")
    trees = {"now": ROOT, against: tree_at(against)}
    pyc = tempfile.mkdtemp(prefix="moment-pyc-")
    got: dict[str, list[tuple[float, float, int, int]]] = {label: [] for label in trees}
    for i in range(runs + 1):
        for label, tree in trees.items():
            env = dict(os.environ, PYTHONPATH=str(tree), PYTHONPYCACHEPREFIX=pyc, OMP_NUM_THREADS="1")
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            out = Path(tempfile.mkdtemp(prefix="moment-start-"))
            drop_files(*data)
            wall, cpu, _ = _timed([sys.executable, "-m", "moment", "train", "--nproc", "2", "--layout", str(layout),
                                   "--memory-budget", budget, "--data-only", "--epochs", "1", "--quiet",
                                   "--run-dir", str(out / "runs"), "--metrics-json", str(out / "m.json"), *given],
                                  env, tree, timeout=deadline)
            mem = json.loads((out / "m.json").read_text())["memory"]
            index = next(it["machine_bytes"] for it in mem["items"] if it["name"] == "layout index")
            shutil.rmtree(out)
            print(f"  round {i}{' (not counted)' if not i else ''} {label}: {wall:.2f} s wall, {cpu:.2f} s CPU, index "
                  f"{index / 2**20:.0f} MiB, peak {mem['measured_peak_bytes'] / 2**20:.0f} MiB", flush=True)
            if i:
                got[label].append((wall, cpu, index, mem["measured_peak_bytes"]))
    check_disk(shards, "end", "", disk)
    print(f"moment train --data-only on {layout}{' with ' + str(dataset) if dataset else ''} (2 ranks, 1 epoch, "
          f"--memory-budget {budget}, its data cold)")
    med = {label: [statistics.median(x[k] for x in runs_) for k in range(4)] for label, runs_ in got.items()}
    for label, (wall, cpu, index, peak) in med.items():
        print(f"  {label:>8}: {wall:.2f} s wall, {cpu:.2f} s CPU, layout index charged {index / 2**20:.0f} MiB, "
              f"measured peak {peak / 2**20:.0f} MiB (medians; runs s: " +
              ", ".join(f"{x[0]:.2f}" for x in got[label]) + ")")
    print(f"  speedup_wall: {med[against][0] / med['now'][0]:.2f}x  speedup_cpu: {med[against][1] / med['now'][1]:.2f}x"
          f"  index_charge_ratio: {med['now'][2] / med[against][2]:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="counted runs per command and tree, per round (two rounds)")
    ap.add_argument("--against", default=None, help="the baseline commit (default: where this branch left main)")
    ap.add_argument("--floor-dir", type=Path, default=Path("/tmp/floor"), help="the README's 100k example")
    ap.add_argument("--launch", action="store_true",
                    help="instead of the floor: `moment train` itself on that example (`launch`), --runs rounds")
    ap.add_argument("--agent", action="store_true",
                    help="instead of the floor: torchrun's agent alone on that example, its own CPU (`agent`)")
    ap.add_argument("--start", type=Path, default=None, metavar="LAYOUT",
                    help="instead of the floor: a large layout's `moment train --data-only` from a cold cache (`start`)")
    ap.add_argument("--budget", default="5GiB", help="--memory-budget of the --start runs")
    ap.add_argument("--dataset", type=Path, default=None,
                    help="--start: read this copy of the layout's dataset (e.g. on disk, for a layout in /dev/shm)")
    ap.add_argument("--deadline", type=float, default=600, help="seconds a --start run may take before the bench stops")
    a = ap.parse_args()
    base = a.against
    if base is None:
        r = subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"processes.py: no baseline: this checkout has no branch 'main' to compare with "
                     f"({r.stderr.strip() or 'git merge-base failed'}); give one with --against COMMIT")
        base = r.stdout.strip()[:7]
    if a.start is not None:
        start(a.runs, base, a.start, a.budget, a.deadline, a.dataset)
    else:
        (launch if a.launch else agent if a.agent else floor)(a.runs, base, floor_dir(a.floor_dir))
