"""The service under conditions a hostile tester made: a job database that fails (a full disk), clients
that send half a request, too many connections, a web page reaching it through DNS rebinding, HEAD
requests, and a damaged job database at start."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service import jobs  # noqa: E402
from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402
from moment.service.jobs import JobRunner, JobStore  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def until(cond, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


# ---- a full disk -----------------------------------------------------------------------------------------
@pytest.fixture
def full(monkeypatch):
    """full(store): an event; while it is set, every access to that store's database fails as SQLite does
    on a full disk (only that store's: other tests' runners may still poll theirs). Workers retry fast."""
    monkeypatch.setattr(jobs, "RETRY_S", 0.02)
    monkeypatch.setattr(jobs, "RETRY_MAX_S", 0.05)

    def failing(store: JobStore) -> threading.Event:
        real, event = store._db, threading.Event()

        @contextmanager
        def db():
            with real() as conn:
                if event.is_set():
                    raise sqlite3.OperationalError("disk I/O error")
                yield conn

        monkeypatch.setattr(store, "_db", db)
        return event

    return failing


def test_a_job_worker_outlives_a_full_disk_and_ends_its_job_once_it_can(tmp_path, full, caplog):
    """One SQLite error in the polling loop ended the worker thread for good: every later job stayed
    queued, and health said ok. The worker now waits and retries; the end of a job that ran while the
    disk was full is written once it can be, not left `running`; it is logged once, not per retry."""
    gate, store = threading.Event(), JobStore(tmp_path / "jobs.sqlite3")
    disk = full(store)

    def work(request, ctx):
        if request["n"] == 1:
            disk.set()  # the disk fills while the job runs: its progress and its end cannot be written
            ctx.report("step", 1, 2, force=True)  # lost, not the job's failure
            gate.wait(10)
        return {"n": request["n"]}

    runner = JobRunner(store, {"probe": work})
    try:
        with caplog.at_level(logging.INFO, logger="moment.service"):
            first = runner.submit("probe", {"n": 1})
            until(lambda: runner.problem() is not None)
            assert "the job database cannot be read or written: disk I/O error" in runner.problem()
            gate.set()
            time.sleep(0.3)  # the job is over; its end cannot be written yet, and the worker keeps polling
            disk.clear()
            until(lambda: runner.store.get(first.id).state == "done")
            assert runner.store.get(first.id).result == {"n": 1}
            until(lambda: runner.problem() is None)
            second = runner.submit("probe", {"n": 2})
            until(lambda: runner.store.get(second.id).state == "done")
        said = [r.getMessage() for r in caplog.records if r.name == "moment.service"]
        assert sum("cannot be read or written" in m for m in said) == 1, said  # once, not per retry
        assert sum("works again" in m for m in said) == 1, said
        assert not any(r.exc_info for r in caplog.records), "a traceback for a full disk"
    finally:
        gate.set()
        disk.clear()
        runner.close()


def test_health_says_when_a_job_worker_is_stuck(tmp_path, monkeypatch):
    store = JobStore(tmp_path / "jobs.sqlite3")
    hold, held = threading.Event(), threading.Event()
    real = store.claim

    def claim(owner):
        held.set()
        hold.wait(10)  # a database that never answers (a hung network file system)
        return real(owner)

    monkeypatch.setattr(jobs, "STUCK_S", 0.2)
    monkeypatch.setattr(store, "claim", claim)
    runner = JobRunner(store, {})
    try:
        until(held.is_set)
        until(lambda: runner.problem() is not None)
        assert runner.problem() == "job worker moment-jobs-0 has not looked for work for over 0.2 s"
        hold.set()
        until(lambda: runner.problem() is None)
    finally:
        hold.set()
        runner.close()


def test_job_routes_answer_503_while_the_database_fails_and_health_says_why(tmp_path, full):
    """They answered a plain-text 500; health said ok while no job could run."""
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        disk = full(c.app.state.jobs.store)
        assert c.get("/v1/health").json() == {"status": "ok", "version": "0.1.0", "auth": False}
        disk.set()
        for method, path, body in (("GET", "/v1/jobs", None), ("GET", "/v1/jobs/abc", None),
                                   ("DELETE", "/v1/jobs/abc", None),
                                   ("POST", "/v1/jobs/probe", {"ssd_dirs": {"ssd0": "p"}, "size_mib": 16})):
            r = c.request(method, path, json=body)
            assert r.status_code == 503 and r.headers["retry-after"], (path, r.text)
            assert r.json() == {"detail": "the job database cannot be read or written: disk I/O error; try again later"}
        until(lambda: c.get("/v1/health").status_code == 503)
        health = c.get("/v1/health").json()
        assert health["status"] == "degraded" and "disk I/O error" in health["problem"], health
        assert c.head("/v1/health").status_code == 503
        assert c.post("/v1/plan", json={"gpus": 1, "ssds": 1}).status_code == 200  # planning goes on
        disk.clear()
        until(lambda: c.get("/v1/health").status_code == 200)
        assert c.get("/v1/jobs").json() == []


# ---- DNS rebinding -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("settings", "host", "status"), [
    ({}, "attacker.example", 403),  # a page whose name was pointed at 127.0.0.1
    ({}, "attacker.example:8000", 403),
    ({}, "127.0.0.1:8000", 200), ({}, "localhost:8000", 200), ({}, "LOCALHOST.", 200), ({}, "[::1]:8000", 200),
    ({}, "127.0.0.2", 200),
    ({"allowed_hosts": ("moment.lan",)}, "moment.lan:8000", 200),  # --allowed-host
    ({"allowed_hosts": ("moment.lan",)}, "other.lan", 403),
    ({"allowed_hosts": ("*",)}, "attacker.example", 200),
    ({"token": "s3cret"}, "attacker.example", 401),  # a page cannot know the token: the token check decides
    ({"allow_no_token": True}, "attacker.example", 200),  # a proxy in front answers for its clients
])
def test_without_a_token_only_loopback_host_names_are_served(tmp_path, settings, host, status):
    with TestClient(create_app(Settings(data_dir=tmp_path, **settings)), base_url="http://127.0.0.1:8000") as c:
        r = c.post("/v1/jobs/place", json={"dataset": "ds", "layout": "EVIL"}, headers={"host": host})
        assert r.status_code == (422 if status == 200 else status), r.text  # 422: no dataset ds, so it got in
        assert c.get("/v1/profiles", headers={"host": host}).status_code == status
        assert c.get("/", headers={"host": host}).status_code == (200 if status == 401 else status)  # the page too
    if status == 403:
        assert r.json()["detail"].startswith(f"Host {host!r}: without a token the service answers only requests "
                                              "naming it localhost, 127.0.0.1 or [::1]")
        assert "--allowed-host" in r.json()["detail"] and "DNS rebinding" in r.json()["detail"]


def test_an_allowed_host_that_is_not_a_name_is_refused(tmp_path):
    from moment.errors import MomentError

    for bad in ("http://moment.lan", "moment.lan:8000", "a b"):
        with pytest.raises(MomentError, match=f"--allowed-host '{bad}': expected a host name"):
            Settings(data_dir=tmp_path, allowed_hosts=(bad,)).checked()


# ---- HEAD ---------------------------------------------------------------------------------------------
def test_head_is_answered_as_get_without_a_body(tmp_path):
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        for path in ("/v1/profiles", "/v1/models", "/v1/jobs", "/v1/jobs/nope", "/v1/health", "/openapi.json", "/"):
            get, head = c.get(path), c.head(path)
            assert head.status_code == get.status_code and head.content == b"", path
            assert head.headers["content-length"] == get.headers["content-length"], path
        r = c.head("/v1/plan")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert c.put("/v1/profiles").headers["allow"] == "GET, HEAD"
