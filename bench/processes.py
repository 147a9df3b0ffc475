"""Whole-process timings for the benches: a command run in fresh interpreters, the median of several
(wall seconds, and CPU seconds, which other work on the machine disturbs less), and the same command
from another commit's tree (`git archive`) as a baseline in the same run.

Bytecode goes to a private cache (PYTHONPYCACHEPREFIX) filled by one run that is not counted, so each
counted run starts a fresh process as an installed `moment` does, compiled once.
"""

from __future__ import annotations

import os
import resource
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
    """The source tree of commit `ref` in a temporary folder (removed at exit with the process)."""
    out = Path(tempfile.mkdtemp(prefix=f"moment-{ref.replace('/', '_')}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref], capture_output=True,
                             check=True).stdout
    tar = out / "src.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(out, filter="data")
    tar.unlink()
    return out


def time_command(args: list[str], runs: int, *, tree: Path | None = None, cwd: Path | None = None) -> Timing:
    """`python -m moment ARGS` from `tree` (default: this checkout) `runs` times after one uncounted run."""
    cache = Path(tempfile.mkdtemp(prefix="moment-pyc-"))
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "moment", *args]
    walls, cpus, out = [], [], ""
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = _now()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd or tree or ROOT)
        wall = _now() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
        if i:  # the first run fills the bytecode cache
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            out = r.stdout
    return Timing(statistics.median(walls), statistics.median(cpus), walls, out)


def compare(name: str, args: list[str], runs: int, against: str | None, target: str = "",
            same=lambda a, b: a == b) -> None:
    """Print `name.*` lines: this checkout's whole-process time, and beside it the same command from
    commit `against` (its time, the ratio, and whether the output is the same by `same`)."""
    print(f"{name}.command: moment {' '.join(args)}")
    now = time_command(args, runs)
    print(f"{name}.wall_s: {now.wall_s:.3f}" + (f"  (target {target})" if target else ""))
    print(f"{name}.cpu_s: {now.cpu_s:.3f}")
    print(f"{name}.runs_s: {', '.join(f'{r:.3f}' for r in now.runs)}")
    if against is None:
        return
    then = time_command(args, runs, tree=tree_at(against))
    print(f"{name}.baseline_{against}.wall_s: {then.wall_s:.3f}")
    print(f"{name}.baseline_{against}.cpu_s: {then.cpu_s:.3f}")
    print(f"{name}.baseline_{against}.runs_s: {', '.join(f'{r:.3f}' for r in then.runs)}")
    print(f"{name}.speedup_wall: {then.wall_s / now.wall_s:.2f}x")
    print(f"{name}.speedup_cpu: {then.cpu_s / now.cpu_s:.2f}x")
    print(f"{name}.same_output_as_baseline: {same(now.stdout, then.stdout)}")


def _now() -> float:
    import time

    return time.perf_counter()
