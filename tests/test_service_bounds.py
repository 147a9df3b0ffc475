"""The service's bounds: a body over the limit is answered 413 (not a reset connection) on every
route; the cluster plan runs where its deadline kills it and its memory is capped."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("uvicorn", reason="the service needs the `serve` extra (fastapi, uvicorn)")

import uvicorn  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402

LIMIT = 1 << 20


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("svc"), max_body_bytes=LIMIT))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    end = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.05)
    yield free
    server.should_exit = True
    t.join(10)


@pytest.mark.parametrize("route", ["/v1/plan/cluster", "/v1/plan", "/v1/jobs/place"])
@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_answered_413_naming_the_limit(port, route, chunked):
    body = b'{"cluster": "' + b"x" * (64 * LIMIT) + b'"}'
    data = iter([body[i:i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    # urllib asks for Connection: close, as most one-shot clients do: the server closes after answering
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", data=data, method="POST",
                                 headers={"content-type": "application/json",
                                          **({"transfer-encoding": "chunked"} if chunked else {})})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    detail = json.loads(e.value.read())["detail"]
    assert e.value.code == 413 and f"{LIMIT:,} bytes" in detail


def test_a_request_past_its_memory_cap_is_refused_not_the_service_killed():
    from moment.service.errors import TooLarge
    from moment.service.worker import run_capped

    with pytest.raises(TooLarge, match="memory limit of 256 MiB"):  # a small cap: it cannot hurt the machine
        run_capped(bytearray, (8 << 30,), 60, "the test", 256 << 20)


def test_the_deadline_kills_the_work():
    import multiprocessing

    from moment.service.errors import TimedOut
    from moment.service.worker import run_capped

    t0 = time.monotonic()
    with pytest.raises(TimedOut, match="within the service's limit of 1 s"):
        run_capped(time.sleep, (120,), 1, "the test", 1 << 30)
    assert time.monotonic() - t0 < 20 and not multiprocessing.active_children()


def test_the_cluster_plan_runs_under_the_request_memory_cap(tmp_path):
    from fastapi.testclient import TestClient

    from tests.test_service_cluster import CLUSTER

    with TestClient(create_app(Settings(data_dir=tmp_path, request_max_mib=64))) as c:
        r = c.post("/v1/plan/cluster", json={"cluster": CLUSTER})
    assert r.status_code == 413 and "memory limit of 64 MiB" in r.json()["detail"]
