"""`moment train` failures and restarts as a person sees them: the ranks' errors, not torchrun's traceback;
restarts announced with where they resumed; checkpoints by default in the run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_data import make_dataset, make_layout

import moment.runtime.train as train_mod
from moment.cli import train_launch as tl
from moment.errors import MomentError
from moment.runtime.config import TrainConfig
from moment.runtime.runs import make_run_dir
from moment.runtime.train import train

REPO = Path(__file__).resolve().parents[1]
FAST = {"fanouts": [10, 5], "hidden": 32, "threads": 1, "lr": 0.01}
ARGS = ["--fanouts", "10,5", "--hidden", "32", "--lr", "0.01", "--threads", "1"]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("launch")
    return make_layout(make_dataset(root), root / "L")


def _moment_train(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "moment", "train", *argv], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=300, check=False)


# ---- fast: pieces -------------------------------------------------------------------------------------
def test_rank_output_reattaches_to_the_launchers_streams(tmp_path):
    """A rank reopens the paths the launcher names (appending: a redirected file is not overwritten)."""
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    out.write_text("before\n")
    err.write_text("")
    code = ("import sys; from moment.runtime.console import attach_console; "
            "assert attach_console(); print('to out'); print('to err', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO),
                       "MOMENT_CONSOLE_OUT": str(out), "MOMENT_CONSOLE_ERR": str(err)},
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == ""  # nothing left on torchrun's streams
    assert out.read_text() == "before\nto out\n" and err.read_text() == "to err\n"


def test_torchrun_lines_become_one_message_and_an_exit_status(tmp_path, capsys):
    log = tmp_path / "torchrun.log"
    killed = tl.Outcome(code=0, log=log)
    tl._watch("E1122 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 7) of binary: python\n", killed, 1)
    assert "rank 1 was killed (SIGKILL); torchrun restarts the ranks (restart 1 of 1)" in capsys.readouterr().err
    assert tl.report(killed) == 0 and "finished after 1 restart(s)" in capsys.readouterr().err
    user = tl.Outcome(code=1, log=log)
    for r in (0, 1):
        tl._watch(f"E1122 api.py:1002] failed (exitcode: 2) local_rank: {r} (pid: 7) of binary: python\n", user, 0)
    assert capsys.readouterr().err == ""  # the ranks said what was wrong
    assert tl.report(user) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "training stopped: a rank reported an error; torchrun's log: " + str(log) in err
    crash = tl.Outcome(code=1, log=log)
    tl._watch("failed (exitcode: 1) local_rank: 0 (pid: 7) of binary\n", crash, 0)
    assert "rank 0 died (exit code 1)" in capsys.readouterr().err and tl.report(crash) == 1


def test_run_directories_are_fresh_and_a_bad_one_is_one_message(tmp_path):
    a = make_run_dir(None, tmp_path / "L")
    b = make_run_dir(None, tmp_path / "L")
    assert a != b and a.parent == b.parent == tmp_path / "L.runs" and a.is_dir() and b.is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(MomentError, match="--run-dir"):
        make_run_dir(tmp_path / "file" / "runs", tmp_path / "L")


def test_checkpoints_by_default_with_a_dir_and_restarts_say_what_they_lose(layout, tmp_path, monkeypatch, capsys):
    cfg = TrainConfig(layout=layout, checkpoint_dir=tmp_path / "ck", **FAST)
    assert cfg.resolved_checkpoint_every(8) == 2 and TrainConfig(layout=layout).resolved_checkpoint_every(8) == 0
    first = train(cfg)
    assert (tmp_path / "ck" / "checkpoint.pt").exists() and first["checkpoint_dir"] == str(tmp_path / "ck")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # as torchrun sets it after a restart
    capsys.readouterr()
    again = train(TrainConfig(layout=layout, checkpoint_dir=tmp_path / "ck", quiet=True, **FAST))
    err = " ".join(capsys.readouterr().err.split())
    assert "restart 1: a rank failed; resumed from step 8 (all 1 epochs were done)" in err  # even --quiet
    assert again["restarts"] == 1 and again["resumed_from_step"] == 8
    train(TrainConfig(layout=layout, quiet=True, **FAST))
    err = " ".join(capsys.readouterr().err.split())
    assert "no --checkpoint-dir, so training starts again from epoch 1" in err


# ---- torchrun, 2 ranks on gloo ----------------------------------------------------------------------------
@pytest.mark.slow
def test_failing_ranks_show_their_errors_not_torchruns_traceback(layout, tmp_path):
    r = _moment_train("--nproc", "2", "--run-dir", str(tmp_path / "runs"), "--layout", str(layout), *ARGS,
                      "--resume", "--checkpoint-dir", str(tmp_path / "empty"))
    assert r.returncode == 2, r.stderr
    err = r.stderr
    assert "error (rank 0): " in err and "error (rank 1): " in err and "no checkpoint here yet" in err
    assert "Traceback" not in err and "ChildFailedError" not in err and "elastic" not in err
    log = next((tmp_path / "runs").glob("*/torchrun.log"))
    assert f"training stopped: a rank reported an error; torchrun's log: {log}" in err
    assert "ChildFailedError" in log.read_text()  # kept, not shown
    assert len(err.strip().splitlines()) <= 6


@pytest.mark.slow
def test_killed_rank_is_announced_and_the_restart_resumes_from_the_default_checkpoint(layout, tmp_path):
    out = tmp_path / "m.json"
    r = _moment_train("--nproc", "2", "--max-restarts", "1", "--run-dir", str(tmp_path / "runs"),
                      "--layout", str(layout), *ARGS, "--metrics-json", str(out), "--quiet",
                      env={train_mod.KILL_ENV: "5"})
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert "Traceback" not in err, r.stderr  # rank 0 may lose its peer first: one line, not a traceback
    assert "rank 1 died (exit code 1); torchrun restarts the ranks (restart 1 of 1)" in err
    m = json.loads(out.read_text())
    assert m["restarts"] == 1 and 0 < m["resumed_from_step"] < 5
    assert f"restart 1: a rank failed; resumed from step {m['resumed_from_step']} (epoch 1, batch" in err, r.stderr
    ck = Path(m["checkpoint_dir"])
    assert ck.parent.parent == tmp_path / "runs" and (ck / "checkpoint.pt").exists()
    assert "finished after 1 restart(s)" in err
    whole = _moment_train("--nproc", "2", "--run-dir", str(tmp_path / "runs"), "--layout", str(layout), *ARGS,
                          "--metrics-json", str(tmp_path / "w.json"), "--quiet")
    assert whole.returncode == 0, whole.stderr
    np.testing.assert_allclose(m["loss_curve"], json.loads((tmp_path / "w.json").read_text())["loss_curve"],
                               rtol=1e-6)
