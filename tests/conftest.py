from __future__ import annotations

import fcntl
import gc
import os
import resource
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# The suite draws the same examples on every run (a CI failure reproduces here); a wider random search
# is `HYPOTHESIS_PROFILE=fuzz`, with each test's own example count.
settings.register_profile("moment", derandomize=True, database=None)
settings.register_profile("fuzz", derandomize=False, database=None)
# pytest-xdist's workers export COLUMNS=80, which the CLI's piped output honours (outputs.console_width):
# the tests read the CLI's output as a pipe without COLUMNS gives it, unwrapped
os.environ.pop("COLUMNS", None)
# a command line asked twice runs twice (tests patch what it runs); tests/test_answers.py turns the kept answers on
os.environ["MOMENT_ANSWERS"] = "off"
# torch's OpenMP workers spin between parallel regions; with the suite's workers on every core that spinning takes
# the cores the other processes wait for (a 1-rank CPU training run: 3-5 CPU-s spinning, 1.4 with them asleep).
# Set before anything loads torch (libgomp reads it once), inherited by every process a test starts
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "moment"))

# collection imports torch, PyG, torch._dynamo and hypothesis: with the collector paused until it ends (and all of
# it is frozen, below), as moment.gcpause.loading loads them in Moment's own processes
gc.disable()

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("MOMENT_FIXTURES", REPO.parent / "shared" / "fixtures"))
DATA = Path(__file__).resolve().parent / "data"
# The suite's subprocesses import this checkout first, and whatever the caller's PYTHONPATH adds after it (a
# machine whose packages are on a path of their own, as a GPU host's carried wheels): set once here, so a
# test's child inherits it with os.environ, never by replacing it
_paths = [str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in _paths if p))


def pytest_collection_modifyitems(config, items):
    """A test that needs one of the session's torchrun launches is slow (`make test-fast` leaves it out)."""
    for item in items:
        if {"two_rank_dir", "restarted_run"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):  # after collection, in every worker and in pytest-xdist's controller
    """What collection imported (torch, PyG, torch._dynamo, hypothesis) moves to the collector's permanent
    generation, as moment.gcpause.freeze_for_exit does at a process's end: the full collections a worker's
    tests trigger then skip it (a worker's collector time on test_branch, test_bounds and test_models:
    1.69 -> 0.81 s). Cycles made later are still collected."""
    gc.freeze()
    gc.enable()


# ---- what each test costs in CPU ----------------------------------------------------------------------
# The suite is CPU-bound on CI's two cores (its workers keep them ~190% busy), so its wall time is set by the
# CPU its tests spend, not by their wall times: a test that waits on a rendezvous timeout is slow and cheap, a
# docs page that launches torchrun five times is both. `--cpu-costliest N` lists the N that spent the most,
# their own process's CPU and that of the processes they started and waited for (RUSAGE_CHILDREN: a child
# counts once it is reaped, with the descendants it reaped itself); a session's shared data is charged to the
# first test that asks for it.
def pytest_addoption(parser):
    parser.addoption("--cpu-costliest", type=int, default=0, metavar="N",
                     help="list the N tests that spent the most CPU (theirs and their children's; 0: none)")


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("--cpu-costliest"):
        yield
        return
    item.cpu_start = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The CPU spent so far (set-up, call, tear-down) rides on each phase's report, which pytest-xdist's workers
    send to the controller that prints the list."""
    outcome = yield
    start = getattr(item, "cpu_start", None)
    if start is not None:
        own, children = _cpu_s()
        outcome.get_result().user_properties.append(("cpu_s", (own - start[0], children - start[1])))


_cpu_spent: dict[str, tuple[float, float]] = {}


def pytest_runtest_logreport(report):
    spent = dict(report.user_properties).get("cpu_s")
    if spent is not None:  # the last phase's figure includes the earlier ones'
        _cpu_spent[report.nodeid] = tuple(spent)


def pytest_terminal_summary(terminalreporter, config):
    n = config.getoption("--cpu-costliest")
    if not n or not _cpu_spent:
        return
    total = sum(a + b for a, b in _cpu_spent.values())
    terminalreporter.write_sep("=", f"{n} costliest tests in CPU (of {total:.0f} CPU-s in {len(_cpu_spent)} tests)")
    for nodeid, (own, children) in sorted(_cpu_spent.items(), key=lambda kv: -sum(kv[1]))[:n]:
        terminalreporter.write_line(f"{own + children:6.1f} s  (own {own:5.1f}, children {children:5.1f})  {nodeid}")


@pytest.fixture
def fixtures_dir() -> Path:
    """Real topology files of real servers (../shared/fixtures); never copied into the repo."""
    if not FIXTURES.is_dir():
        pytest.skip(f"real-server fixtures not found at {FIXTURES} (set MOMENT_FIXTURES)")
    return FIXTURES


@pytest.fixture(scope="session")
def bench_epoch():
    """bench/epoch.py as a module: its arguments and size check, and its process-tree helpers
    (`descendants`, `alive`, `kill_tree`) that tests of killed launches use too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_epoch", REPO / "bench" / "epoch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fixture_file(name: str) -> Path:
    p = FIXTURES / name
    if not p.is_file():
        pytest.skip(f"fixture {name} not found in {FIXTURES}")
    return p


# ---- shared runtime data ------------------------------------------------------------------------------
# Built once per session and shared by every module that asks: READ-ONLY. A test that changes a file
# copies first (shutil.copytree(runtime_layout, tmp_path / "L")); a run writes its outputs (metrics,
# checkpoints, --run-dir) under its own tmp_path. In-process training of runtime_layout is fine (it
# writes nothing beside the layout); `moment train` without --run-dir would add LAYOUT.runs: pass one.
def shared_dir(tmp_path_factory, name: str, build) -> Path:
    """A directory `build(path)` fills once for the whole test session. Under pytest-xdist each worker is
    its own process with its own session fixtures, so the first worker to ask builds it under the run's
    common base directory (tmp_path_factory.getbasetemp().parent) while holding a lock, and the others
    wait for that lock and reuse it; a build that failed leaves no mark and the next asker tries again."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    root = tmp_path_factory.getbasetemp().parent / "shared"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def runtime_dataset(tmp_path_factory):
    """tests/runtime_data.py's 4000-node, 32-dim, 4-class graph (a GraphDataset)."""
    from runtime_data import make_dataset

    from moment.workload.graph import GraphDataset

    root = shared_dir(tmp_path_factory, "runtime", make_dataset)
    return GraphDataset.open(root / "ds")


@pytest.fixture(scope="session")
def runtime_layout(runtime_dataset, tmp_path_factory) -> Path:
    """runtime_dataset placed by runtime_data.make_layout: 2 GPU bins, 1 CPU bin, 2 SSDs, 4-KiB aligned."""
    from runtime_data import make_layout

    return shared_dir(tmp_path_factory, "runtime-layout", lambda d: make_layout(runtime_dataset, d / "L")) / "L"


@pytest.fixture(scope="session")
def split_layout(runtime_dataset, tmp_path_factory) -> Path:
    """runtime_dataset split over two machines by runtime_data.make_split (SPLIT/m0, SPLIT/m1, cluster.json)."""
    from runtime_data import make_split

    out = shared_dir(tmp_path_factory, "runtime-split", lambda d: make_split(runtime_dataset, d / "S"))
    return out / "S"


@pytest.fixture(scope="session")
def two_rank_dir(runtime_layout, tmp_path_factory) -> Path:
    """One torchrun launch, 2 ranks on gloo, `runtime_data.train_args(runtime_layout, ...)` (2 epochs): its
    metrics (`m.json`) and each rank's threads after training (`rank0.json`, `rank1.json`)."""
    from runtime_data import run_two_ranks

    return shared_dir(tmp_path_factory, "two-ranks", lambda d: run_two_ranks(runtime_layout, d))


@pytest.fixture(scope="session")
def restarted_run(runtime_layout, tmp_path_factory) -> Path:
    """One `moment train --nproc 2 --max-restarts 1` of two_rank_dir's run whose rank 1 exits after its fifth step
    (`runtime_data.run_restarted`): the launcher's exit status and stderr (`launch.json`), the metrics (`m.json`),
    its run directory (`runs/`). The restart tests of the launcher and of the runtime read it, instead of each
    launching it again."""
    from runtime_data import run_restarted

    return shared_dir(tmp_path_factory, "restarted", lambda d: run_restarted(runtime_layout, d))


@pytest.fixture(scope="session")
def two_rank_run(two_rank_dir) -> dict:
    """two_rank_dir's metrics: the reference a 2-rank test compares its own run with (same layout and
    `runtime_data.train_args`), instead of launching that run again. Any test using it is slow."""
    import json

    return json.loads((two_rank_dir / "m.json").read_text())


#: the machine's temporary folder, before the session's replaces it (`_session_temp`)
_MACHINE_TEMP = Path(tempfile.gettempdir())


@pytest.fixture
def machine_temp() -> Path:
    """The machine's temporary folder, for a test whose files another user must reach (the session's is root's
    alone, as pytest's folders are)."""
    return _MACHINE_TEMP


@pytest.fixture(scope="session", autouse=True)
def _session_temp(tmp_path_factory):
    """Tests and the processes they start put their temporary files under this session's base folder, which pytest
    removes with its old runs, not in the machine's: torch's own torchrun makes a `torchelastic_*` folder per launch and
    leaves it (Moment's agent removes its own), PyG writes a module per layer class it generates."""
    folder = tmp_path_factory.getbasetemp() / "temp"
    folder.mkdir(exist_ok=True)
    old, old_here = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)  # theirs, and this process's (tests run torchrun's parts)
    yield
    tempfile.tempdir = old_here
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
