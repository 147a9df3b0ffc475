"""Every number a user gives has a bound stated in one place, and a flag that does nothing in
its combination is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moment.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 100-node synthetic dataset."""
    d = tmp_path_factory.mktemp("tiny") / "ds"
    assert main(["data", "synth", "--nodes", "100", "--feature-dim", "4", "--out", str(d)]) == 0
    return d


def test_place_refuses_more_machines_than_the_graph_has_rows_before_any_work(tiny, tmp_path, capsys):
    t = time.perf_counter()
    assert main(["place", "--dataset", str(tiny), "--machines", "20001", "--out", str(tmp_path / "s")]) == 2
    assert time.perf_counter() - t < 5
    err = _err(capsys)
    assert "--machines 20001" in err and "at most 100 machines" in err
    assert not (tmp_path / "s").exists()


def test_a_replication_that_leaves_a_machine_no_rows_is_refused(tiny, tmp_path, capsys):
    assert main(["place", "--dataset", str(tiny), "--machines", "80", "--replicate", "50%",
                 "--out", str(tmp_path / "s")]) == 2
    assert "every machine must own rows" in _err(capsys)
    assert not (tmp_path / "s").exists()


def test_a_place_stopped_by_sigterm_leaves_no_lock_behind(tiny, tmp_path):
    out, flag = tmp_path / "s", tmp_path / "paused"
    env = {**os.environ, "MOMENT_TEST_PAUSE_AT": "locked",
           "MOMENT_TEST_PAUSE_FILE": str(flag)}
    p = subprocess.Popen([sys.executable, "-m", "moment", "place", "--dataset", str(tiny), "--machines", "2",
                          "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.exists()
    assert (tmp_path / ".s.lock").exists()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err
    assert not (tmp_path / ".s.lock").exists()
    assert not out.exists()
