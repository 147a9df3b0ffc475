"""Output locks between threads of one process (the service runs jobs on several threads)."""

from __future__ import annotations

import os
import threading

from moment.errors import MomentError
from moment.locking import lock_path, locked


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
