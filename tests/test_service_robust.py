"""The service under conditions a hostile tester made: a job database that fails (a full disk), clients
that send half a request, too many connections, a web page reaching it through DNS rebinding, HEAD
requests, and a damaged job database at start."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import resource
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the service needs the `serve` extra (fastapi, uvicorn)")

import uvicorn  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from moment.service import jobs, server  # noqa: E402
from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402
from moment.service.jobs import JobRunner, JobStore  # noqa: E402
from moment.service.limits import quiet_accept_errors  # noqa: E402

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


# ---- slow clients, many connections ----------------------------------------------------------------
@contextmanager
def serving(settings: Settings):
    """The app under uvicorn with `moment serve`'s protocol, in this process: its port."""
    srv = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning",
                                        http=server.PROTOCOL))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    until(lambda: srv.started or not thread.is_alive())
    try:
        yield srv.servers[0].sockets[0].getsockname()[1]
    finally:
        srv.should_exit = True
        thread.join(30)


HALF = (b"POST /v1/plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{\"gpus\":")


def _answer(s: socket.socket) -> bytes:
    """What the server sends until it closes the connection (b"RESET" if it reset it)."""
    out = b""
    try:
        while got := s.recv(65536):
            out += got
    except ConnectionResetError:
        return out or b"RESET"
    return out


def _one_answer(s: socket.socket) -> bytes:
    """One whole answer on a connection kept open."""
    out = b""
    while b"\r\n\r\n" not in out:
        out += s.recv(65536)
    head, body = out.split(b"\r\n\r\n", 1)
    length = int(next(v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"content-length"))
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_half_sent_body_is_answered_408_and_closed(tmp_path):
    """A client that sent headers and half its body and waited held its connection for good."""
    with serving(Settings(data_dir=tmp_path, body_timeout_s=0.5)) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(HALF)
            answer = _answer(s)  # until the server closes the connection
            took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer, answer
        detail = json.loads(answer.split(b"\r\n\r\n", 1)[1])["detail"]
        assert detail == ("the request body stopped arriving: nothing for 0.5 s (8 bytes received); send it "
                          "whole, without pauses")
        assert 0.4 < took < 5, took
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # a trickle: the whole-body deadline
            s.sendall(HALF)
            t0 = time.monotonic()
            with contextlib.suppress(OSError):
                while time.monotonic() - t0 < 10:
                    s.sendall(b" ")
                    time.sleep(0.1)
            answer = _answer(s)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 5 s" in answer, answer


def test_a_request_s_headers_have_a_deadline(tmp_path, monkeypatch):
    """uvicorn times out only the pause between requests: a connection that sent nothing, or half its
    headers, was held for good."""
    monkeypatch.setattr(server, "HEADER_S", 0.5)
    with serving(Settings(data_dir=tmp_path)) as port:
        for sent in (b"", b"GET /v1/hea"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(sent)
                t0 = time.monotonic()
                assert _answer(s) == b""  # closed
                assert 0.4 < time.monotonic() - t0 < 5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # answered twice, then idle
            for _ in range(2):
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert _one_answer(s).startswith(b"HTTP/1.1 200")
            t0 = time.monotonic()
            assert _answer(s) == b""
            assert time.monotonic() - t0 < 8  # uvicorn's keep-alive timeout (5 s), or the deadline


def test_connections_past_the_cap_get_503_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "connection_cap", lambda: 3)
    with serving(Settings(data_dir=tmp_path)) as port:
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        try:
            time.sleep(0.2)
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                answer = _answer(s)
            assert answer.startswith(b"HTTP/1.1 503") and b"3 connections open" in answer, answer
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert _answer(s).startswith(b"HTTP/1.1 200")


def test_refused_accepts_are_logged_once_a_minute(caplog):
    """asyncio logged a traceback per refused accept (EMFILE), thousands a second: 300 MB of log."""
    loop, others = asyncio.new_event_loop(), []
    try:
        loop.set_exception_handler(lambda lp, context: others.append(context["message"]))
        quiet_accept_errors(loop)
        with caplog.at_level(logging.INFO, logger="moment.service"):
            for _ in range(5000):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(24, "Too many open files")})
            loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "cannot accept connections: [Errno 24] Too many open files" in said[0], said
    assert others == ["something else"]


@pytest.mark.slow
def test_a_flood_of_half_bodies_at_the_fd_limit_neither_floods_the_log_nor_stops_the_service(tmp_path):
    """With `ulimit -n 256`, 300 half-sent bodies stopped the service for good (health included) and
    wrote about 4 MB/s of tracebacks. Now those past the cap get a 503, the rest a 408 after the body
    timeout, and the service answers again."""
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("MOMENT_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "moment", "serve", "--port", str(port), "--data-dir",
                             str(tmp_path / "d"), "--body-timeout", "1", "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
    socks: list[socket.socket] = []
    try:
        until(lambda: _health(port) == 200 or proc.poll() is not None, 60)
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(HALF)
            socks.append(s)
        # 503 at once (or a reset: closed at once with the request unread), or 408 after the body timeout
        answers = [_answer(s)[:12] for s in socks]
        assert set(answers) <= {b"HTTP/1.1 503", b"RESET", b"HTTP/1.1 408"}, set(answers)
        assert answers.count(b"HTTP/1.1 408") >= 50, answers.count(b"HTTP/1.1 408")
        until(lambda: _health(port) == 200, 20)
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and len(err) < 5000, err[-3000:]


def _health(port: int) -> int | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return int(_answer(s)[9:12])
    except (OSError, ValueError):
        return None


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


# ---- a damaged job database --------------------------------------------------------------------------
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_a_damaged_job_database_before_announcing_itself(tmp_path, workers):
    from moment.cli import main

    (tmp_path / "jobs.sqlite3").write_text("garbage\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["serve", "--port", str(socket.create_server(("127.0.0.1", 0)).getsockname()[1]),
                     "--data-dir", str(tmp_path), "--workers", workers])
    assert code == 2, err.getvalue()
    assert err.getvalue().strip().splitlines() == [
        f"error: {tmp_path}/jobs.sqlite3: cannot open the job database: file is not a database"], err.getvalue()
