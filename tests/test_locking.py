"""Output locks between threads of one process (the service runs jobs on several threads), and between a layout's
readers (training runs, shared) and its writers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from moment.errors import MomentError
from moment.locking import lock_path, locked, shared


def test_lock_is_reentrant_in_a_thread_and_exclusive_across_threads(tmp_path):
    """Two threads of one process (two service jobs on one layout) never both hold the lock; the
    holder may take it again, and the other gets it once the holder lets go."""
    target = tmp_path / "out"
    taken, release, outcome = threading.Event(), threading.Event(), {}

    def holder():
        with locked(target, "layout"), locked(target, "layout"):
            taken.set()
            release.wait(30)

    def other():
        try:
            with locked(target, "layout"):
                outcome["other"] = "held"
        except MomentError as e:
            outcome["other"] = str(e)

    first = threading.Thread(target=holder)
    first.start()
    assert taken.wait(30)
    second = threading.Thread(target=other)
    second.start()
    second.join(30)
    assert f"layout is locked by pid {os.getpid()}" in outcome["other"], outcome
    release.set()
    first.join(30)
    assert not lock_path(target).exists()
    second = threading.Thread(target=other)
    second.start()
    second.join(30)
    assert outcome["other"] == "held"


# ---- readers: training runs hold their layout shared -----------------------------------------------------

_READER = ("import sys; from moment import locking; locking.COMMAND = sys.argv[2]\n"
           "with locking.shared(sys.argv[1], 'layout'):\n    print('held', flush=True); sys.stdin.readline()")


def _reader(target, command: str) -> subprocess.Popen:
    """A process holding `target` shared (as a training run does) until its stdin closes."""
    p = subprocess.Popen([sys.executable, "-c", _READER, str(target), command], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


def test_readers_share_a_layout_and_a_writer_is_refused_naming_one_until_the_last_is_gone(tmp_path):
    """Two training runs on one layout at once are supported (shared), a writer (`layout rm`, `place` over it) is
    refused naming a live run, and a run killed with -9 blocks nothing and is not named."""
    target = tmp_path / "L"
    first, second = _reader(target, "moment train --layout L (first)"), _reader(target, "moment train (second)")
    try:
        with pytest.raises(MomentError, match=rf"layout is locked by pid {first.pid} on host .*\(moment train "
                                              r"--layout L \(first\)\) and 1 more process; wait for it to finish"):
            with locked(target, "layout"):
                pass
        first.kill()  # -9: its lock goes with it, its line stays in the file
        first.wait()
        with pytest.raises(MomentError, match=rf"locked by pid {second.pid} .*\(moment train \(second\)\); wait"):
            with locked(target, "layout"):
                pass
        with shared(target, "layout"), shared(target, "layout"):  # this process too, alongside the other
            pass
        assert lock_path(target).exists()  # the other still holds it: not deleted under it
    finally:
        second.kill()
        second.wait()
    with locked(target, "layout"):  # nobody left
        pass
    assert not lock_path(target).exists()


def test_a_reader_is_refused_while_a_writer_holds_the_layout_and_the_last_reader_deletes_the_file(tmp_path):
    target = tmp_path / "L"
    with locked(target, "layout"):
        with pytest.raises(MomentError, match=f"layout is locked by pid {os.getpid()}"):
            _reader_in_thread(target)
    with shared(target, "layout"):
        assert lock_path(target).exists()
    assert not lock_path(target).exists()
    with shared(tmp_path / "no-such-dir" / "L", "layout"):  # no lock file can be made: the caller refuses it
        pass


def _reader_in_thread(target) -> None:
    """`shared` from another thread (this one holds the writer's lock reentrantly)."""
    out = {}

    def read():
        try:
            with shared(target, "layout"):
                pass
        except MomentError as e:
            out["error"] = e

    t = threading.Thread(target=read)
    t.start()
    t.join(30)
    if "error" in out:
        raise out["error"]


def test_layout_rm_is_refused_while_a_run_reads_the_layout(tmp_path, capsys):
    """`moment layout rm` deleted a layout and its run's directory from under a live `moment train`; `moment
    train` holds its layout shared (train_cmds._reading), as each rank's Run does."""
    from moment.cli import main
    from moment.cli.train_cmds import _reading
    from moment.workload.synth import synthesize
    from runtime_data import make_layout

    layout = make_layout(synthesize(tmp_path / "ds", 300, feature_dim=8, seed=1), tmp_path / "L")
    run = _reader(layout, "moment train --layout L")
    try:
        assert main(["layout", "rm", str(layout)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"layout is locked by pid {run.pid} on host" in err and "(moment train --layout L)" in err, err
        assert (layout / "manifest.json").is_file()
    finally:
        run.kill()
        run.wait()
    with _reading(["--layout", str(layout), "--epochs", "1"]):
        assert main(["layout", "rm", str(layout)]) == 2
    capsys.readouterr()
    assert main(["layout", "rm", str(layout)]) == 0 and not layout.exists()
