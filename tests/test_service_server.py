"""`moment serve` as scripts run it: a real server process on a free port."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the service needs the `serve` extra (fastapi, uvicorn)")

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MOMENT_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_serve_answers_health_openapi_and_plan(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moment", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--data-dir", str(tmp_path / "data"), "--log-level", "warning"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                status, health = _get(base + "/v1/health", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                assert time.monotonic() < end, "the server did not answer within 60 s"
                time.sleep(0.2)
        assert status == 200 and health["status"] == "ok" and health["auth"] is False
        status, spec = _get(base + "/openapi.json")
        assert status == 200 and "/v1/plan" in spec["paths"]
        status, plan = _get(base + "/v1/plan", {"profile": "paper-machine-b", "gpus": 4, "ssds": 8})
        assert status == 200, plan
        assert plan["machine"] == "paper-machine-b" and len(plan["predicted"]["gpus"]) == 4
        assert plan["inventory"] == "4 x A100-PCIe-40GB, 8 x P5510"
        status, err = _get(base + "/v1/plan", {"profile": "nope"})
        assert status == 422 and err["detail"].startswith("profile:")
        assert (tmp_path / "data" / "jobs.sqlite3").is_file()
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught
    assert proc.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), stderr[-2000:]  # after its clean-up
    assert "Traceback" not in stderr


def test_serve_refuses_a_public_address_without_a_token(tmp_path):
    r = subprocess.run([sys.executable, "-m", "moment", "serve", "--host", "0.0.0.0", "--port", str(_free_port()),
                        "--data-dir", str(tmp_path)], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "without a token" in lines[0] and "MOMENT_TOKEN" in lines[0], r.stderr
    assert not list(tmp_path.iterdir())  # refused before anything was created


def test_serve_on_a_taken_port_says_so_in_one_message(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "moment", "serve", "--port", str(port), "--data-dir",
                            str(tmp_path / "d")], env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"--port {port}: cannot listen there" in r.stderr and "pick another --port" in r.stderr
    assert "Traceback" not in r.stderr and "ERROR:" not in r.stderr


@pytest.mark.parametrize("option, words", [
    (["--log-level", "nope"], "--log-level 'nope': choose one of critical, error, warning, info, debug, trace"),
    (["--max-body-mib", "nan"], "--max-body-mib nan: must be a finite number above 0"),
    (["--max-upload-mib", "inf"], "--max-upload-mib inf: must be a finite number above 0"),
    (["--plan-timeout", "nan"], "--plan-timeout nan: must be a finite number above 0"),  # every plan was a 408
    (["--body-timeout", "0"], "--body-timeout 0.0: must be a finite number above 0"),
    (["--allowed-host", "http://moment.lan"], "--allowed-host 'http://moment.lan': expected a host name"),
    (["--root-path", "nope"], "--root-path 'nope': a URL path begins with /"),
])
def test_serve_refuses_a_bad_option_naming_it(tmp_path, option, words):
    """In-process (no server starts): each was a traceback, or a service whose every plan timed out at once."""
    from moment.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["serve", "--port", str(_free_port()), "--data-dir", str(tmp_path / "d"), *option])
    assert code == 2 and words in err.getvalue() and "Traceback" not in err.getvalue(), err.getvalue()
    assert not (tmp_path / "d").exists()


def _own_public_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the one a route out would use), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@pytest.mark.slow
def test_uvicorn_factory_on_all_addresses_serves_only_this_machine_without_a_token(tmp_path):
    """The factory entry point keeps `moment serve`'s rule: bound to 0.0.0.0 with no token, a connection
    to the machine's own public address is refused (403), one to 127.0.0.1 is served."""
    public = _own_public_address()
    if public is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect to")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "moment.service.app:create_app",
                             "--host", "0.0.0.0", "--port", str(port), "--log-level", "warning"],
                            env=_env(MOMENT_DATA_DIR=str(tmp_path / "data")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 60
        while True:
            try:
                status, _ = _get(f"http://127.0.0.1:{port}/v1/health", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                assert time.monotonic() < end, "the server did not answer within 60 s"
                time.sleep(0.2)
        assert status == 200
        status, body = _get(f"http://{public}:{port}/v1/health")
        assert status == 403 and "without a token" in body["detail"], body
        status, body = _get(f"http://{public}:{port}/v1/plan", {"gpus": 1, "ssds": 1})
        assert status == 403, body
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_serve_allow_no_token_is_the_explicit_opt_in(tmp_path):
    """With --allow-no-token (or MOMENT_ALLOW_NO_TOKEN=1) the bind rule lets 0.0.0.0 through: here the
    next check (a taken port) is the one that answers."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        for extra, env in ((["--allow-no-token"], {}), ([], {"MOMENT_ALLOW_NO_TOKEN": "1"})):
            r = subprocess.run([sys.executable, "-m", "moment", "serve", "--host", "0.0.0.0", "--port", str(port),
                                "--data-dir", str(tmp_path / "d"), *extra], env=_env(**env), capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 2 and "cannot listen there" in r.stderr and "token" not in r.stderr, r.stderr


def test_a_chunked_body_over_the_limit_is_answered_413_once_it_has_arrived(tmp_path):
    """A body without Content-Length is counted as it arrives (moment.service.limits). Sent whole in one packet,
    its last part is already read when it goes over, so the 413 comes at once. It used to come only after
    DRAIN_S (10 s), waiting for more body that could not come. Sent in parts, the rest is drained first, so
    the client, still sending, reads the 413."""
    import threading

    import uvicorn

    from moment.service.app import create_app
    from moment.service.config import Settings
    from moment.service.limits import DRAIN_S

    server = uvicorn.Server(uvicorn.Config(create_app(Settings(data_dir=tmp_path, max_body_bytes=4096)),
                                           host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < end:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    parts = [b'{"profile_yaml": "', b"z" * 5000, b'"}']

    def post(whole: bool) -> tuple[bytes, float]:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            chunks = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
            head = (b"POST /v1/plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n")
            t0 = time.monotonic()
            if whole:
                s.sendall(head + b"".join(chunks))
            else:
                for c in [head, *chunks]:
                    s.sendall(c)
                    time.sleep(0.05)
            answer = b""
            while got := s.recv(65536):
                answer += got
            return answer, time.monotonic() - t0

    try:
        for whole in (True, False):
            answer, took = post(whole)
            assert answer.startswith(b"HTTP/1.1 413") and b"over the service's limit of 4,096 bytes" in answer, answer
            assert took < DRAIN_S / 4, (whole, took)
    finally:
        server.should_exit = True
        thread.join(30)
