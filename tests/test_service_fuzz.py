"""Fuzz the service over its own OpenAPI schema (schemathesis strategies, hypothesis): for every
operation, requests that fit the schema and requests that break it. Whatever a client sends, the
answer is never a 5xx, and its body matches the schema documented for its status code."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")
schemathesis = pytest.importorskip("schemathesis", reason="the fuzz test needs schemathesis (the `dev` extra)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error, response_schema_conformance  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402

#: examples per operation and mode (13 operations x 2 modes)
EXAMPLES = 8


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    data = tmp_path_factory.mktemp("fuzz")
    (data / "datasets" / "ds").mkdir(parents=True)  # a dataset name that exists (but holds no dataset)
    (data / "probe").write_text("")  # probe jobs are refused up front: no disk benchmarks while fuzzing
    # short limits: the fuzzer's valid plans answer (or time out with a 408) quickly
    app = create_app(Settings(data_dir=data, plan_timeout_s=0.3, max_body_bytes=256 << 10,
                              max_upload_bytes=64 << 10, probe_max_mib=16))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def _fuzz(op, mode, seen: dict[str, set[int]]) -> None:
    label = f"{op.method.upper()} {op.path}"

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def call(case):
        response = case.call()
        seen.setdefault(label, set()).add(response.status_code)
        assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:500]}"
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    call()


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(schema, mode):
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= 13
    seen: dict[str, set[int]] = {}
    for op in ops:
        if mode == GenerationMode.NEGATIVE and not (len(op.body) or len(op.path_parameters)):
            continue  # nothing to break in a request without inputs
        _fuzz(op, mode, seen)
    if mode == GenerationMode.POSITIVE:  # the fuzzer reached the searches (200, or 408 past the limit)
        assert seen["POST /v1/plan"] & {200, 408}, seen
        assert seen["GET /v1/profiles"] == {200}
    else:
        assert all(codes <= {400, 401, 404, 405, 408, 413, 415, 422, 429} or 200 in codes for codes in seen.values())
