"""The service's contract beyond the CLI's answers: hostile inputs are 4xx naming the field, the
routes' methods, limits answered up front, and bodies that match the OpenAPI schema."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402

DEEP_YAML = "nodes: " + "[" * 1000 + "]" * 1000


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("svc")))) as c:
        yield c


@pytest.mark.parametrize(("path", "extra"), [("/v1/plan", {}), ("/v1/whatif/targets", {}),
                                             ("/v1/advise", {"budget": 50000})])
def test_deeply_nested_yaml_upload_is_a_422_naming_the_field(client, path, extra):
    r = client.post(path, json={"profile_yaml": DEEP_YAML, **extra})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == "profile_yaml: not valid YAML at line 1: nested more than 200 deep"
