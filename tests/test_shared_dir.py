"""tests/conftest.py's shared_dir: under pytest-xdist the session data (a dataset, a layout, a torchrun
launch) is built once for all workers, not once per worker; a failed build is tried again."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
from conftest import shared_dir


class _Factory:
    """A worker's tmp_path_factory: its base temp is popen-gwN under the run's directory."""

    def __init__(self, run: Path, worker: str):
        self.base = run / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self) -> Path:
        return self.base


def _build(d: Path) -> None:
    with open(d.parent / "builds.log", "a") as f:
        f.write("built\n")
    time.sleep(0.3)  # long enough for the other worker to arrive while this one builds
    (d / "data").write_text("x")


def _worker(run: str, worker: str) -> None:
    import os

    os.environ["PYTEST_XDIST_WORKER"] = worker
    assert (shared_dir(_Factory(Path(run), worker), "ds", _build) / "data").read_text() == "x"


def test_two_workers_build_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), w)) for w in ("gw0", "gw1")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert (tmp_path / "shared" / "builds.log").read_text() == "built\n"


def test_a_failed_build_is_tried_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    factory = _Factory(tmp_path, "gw0")

    def broken(d: Path) -> None:
        (d / "half").write_text("")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        shared_dir(factory, "ds", broken)
    d = shared_dir(factory, "ds", _build)
    assert sorted(p.name for p in d.iterdir()) == ["data"]  # the failed build's leftovers are gone
