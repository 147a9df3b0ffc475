"""The service under conditions a hostile tester made: a job database that fails (a full disk), clients
that send half a request, too many connections, a web page reaching it through DNS rebinding, HEAD
requests, and a damaged job database at start."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def until(cond, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


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
