"""bench/processes.py's floor of the plan's libraries: what it loads and runs (the timings are the bench)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_processes", REPO / "bench" / "processes.py")
    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


def test_the_plans_libraries_are_what_it_loads_beyond_the_help_and_run_before_the_help(tmp_path):
    bench = _bench()
    libs = bench.libraries(bench.FLOOR["plan"][0], REPO, tmp_path)
    tops = {m.split(".")[0] for m in libs}
    # the planner's solvers and models, not the CLI's own start (typer and rich load for the help too)
    assert {"numpy", "ortools", "highspy", "pydantic", "yaml"} <= tops, tops
    assert "rich" not in tops and not tops & set(sys.stdlib_module_names) and "moment" not in tops, tops
    assert libs == sorted(libs) and "ortools.graph.python.max_flow" in libs
    # the floor's command: those modules imported (a name that cannot be imported, as Cython's `cython_runtime`,
    # passed over), then the help, printed as `moment --help` prints it (which alone loads no max-flow solver)
    seen = "import atexit, sys\natexit.register(lambda: print('solver loaded:', 'ortools.graph.python.max_flow' in " \
           "sys.modules))\n"
    r = subprocess.run([sys.executable, "-c", seen + bench._PRELOADED, ",".join([*libs, "no_such_module"])],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "Usage: moment" in r.stdout and "solver loaded: True" in r.stdout, r.stderr[-2000:]


def test_the_agents_own_cpu_is_written_by_the_agent_at_its_exit(tmp_path):
    """`--agent`'s program: the agent runs as `python -m moment.runtime.agent` does (here its help), and writes
    its own CPU seconds when it exits."""
    out = tmp_path / "cpu"
    r = subprocess.run([sys.executable, "-c", _bench().AGENT_SELF, str(out), "--help"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "--preload" in r.stdout, r.stderr[-2000:]
    assert 0 < float(out.read_text()) < 300


def test_the_advise_process_bench_compares_what_the_baseline_says_not_fields_added_since(monkeypatch):
    """bench/advise.py's `same_output_as_baseline`: a field the older commit's output lacks (6242c0a has no `data`)
    is no different advice; a field changed or gone is, and the elapsed time never counts."""
    import json

    monkeypatch.syspath_prepend(str(REPO / "bench"))  # advise.py imports processes.py as its neighbour
    spec = importlib.util.spec_from_file_location("bench_advise", REPO / "bench" / "advise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    then = {"best_throughput": {"gpus": 4}, "searched": 9, "elapsed_s": 60.0}
    now = {**then, "data": "planned", "elapsed_s": 4.0}
    assert mod.same_advice(json.dumps(now), json.dumps(then))
    assert not mod.same_advice(json.dumps(then), json.dumps(now))  # `now` lost a field
    assert not mod.same_advice(json.dumps({**now, "searched": 8}), json.dumps(then))
