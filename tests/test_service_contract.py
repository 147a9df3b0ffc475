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


@pytest.mark.parametrize("field", ["nccl_xml", "hwloc_xml"])
def test_an_xml_entity_bomb_is_refused_at_once(client, field):
    """776 bytes of nested entities held a search slot and a core for 45-130 s (past --plan-timeout, which
    covers the search, not the upload's reading): the reader refuses a DTD of its own before expanding it."""
    bomb = '<?xml version="1.0"?><!DOCTYPE s [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><system>&b;</system>'
    r = client.post("/v1/plan", json={field: bomb})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == field and "declares a DTD of its own" in r.json()["detail"], r.text


@pytest.mark.slow
@pytest.mark.parametrize(("settings", "base", "health", "plan"), [
    ({}, "http://192.0.2.7", 403, 403),  # a TCP connection to a public address, no token: refused
    ({}, "http://[2001:db8::7]", 403, 403),
    ({}, "http://127.0.0.1", 200, 200),  # to loopback (also on a server bound to 0.0.0.0): served
    ({}, "http://testserver", 200, 200),  # in-process (no socket): served
    ({"token": "s3cret"}, "http://192.0.2.7", 200, 401),  # a token: the token check decides
    ({"allow_no_token": True}, "http://192.0.2.7", 200, 200),  # told explicitly (a proxy authenticates)
])
def test_the_app_itself_refuses_other_machines_without_a_token(tmp_path, settings, base, health, plan):
    """`uvicorn --factory moment.service.app:create_app --host 0.0.0.0` is held to `moment serve`'s rule:
    the app judges each connection by the local address it reached (the ASGI scope's `server`)."""
    app = create_app(Settings(data_dir=tmp_path, **settings))
    with TestClient(app, base_url=base) as c:
        r = c.get("/v1/health")
        assert r.status_code == health, r.text
        assert c.post("/v1/plan", json={"gpus": 1, "ssds": 1}).status_code == plan
        if health == 403:
            assert "without a token" in r.json()["detail"] and "MOMENT_ALLOW_NO_TOKEN=1" in r.json()["detail"]
            assert c.get("/").status_code == 403 and c.get("/openapi.json").status_code == 403


def test_the_bind_rule_is_one_function_with_an_explicit_opt_in(monkeypatch):
    from moment.errors import MomentError
    from moment.service.config import check_bind

    check_bind("0.0.0.0", None, allow_no_token=True)
    with pytest.raises(MomentError, match="--host 0.0.0.0: refusing .* MOMENT_ALLOW_NO_TOKEN=1"):
        check_bind("0.0.0.0", None)
    monkeypatch.setenv("MOMENT_DATA_DIR", "/tmp/unused")
    for text, allowed in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv("MOMENT_ALLOW_NO_TOKEN", text)
        assert Settings.from_env().allow_no_token is allowed
    monkeypatch.setenv("MOMENT_ALLOW_NO_TOKEN", "maybe")
    with pytest.raises(MomentError, match="MOMENT_ALLOW_NO_TOKEN='maybe': expected 1 or 0"):
        Settings.from_env()


def _field_error(r, field: str) -> str:
    """The 422's message for `field` (the body names it in `errors`, for a page to place it)."""
    assert r.status_code == 422, r.text
    body = r.json()
    assert [e["field"] for e in body["errors"]] == [field], body
    assert "--" not in body["detail"], body  # request fields, not CLI flags
    return body["detail"]


@pytest.mark.parametrize(("body", "field", "needle"), [
    ({"ssd_dirs": {f"ssd{i}": f"d{i}" for i in range(64)}, "size_mib": 4096}, "size_mib",
     "64 directories x 4096 MiB = 262,144 MiB of scratch files, above the service's limit of 16,384 MiB per job"),
    ({"queue_depth": 3}, "queue_depth", "queue_depth 3: choose 8-4096 reads in flight"),
    ({"queue_depth": 5000}, "queue_depth", "queue_depth 5000: choose 8-4096"),
    ({"size_mib": 4}, "size_mib", "size_mib 4: the probe file must hold at least 16"),
])
def test_probe_jobs_are_bounded_at_submit(tmp_path, body, field, needle):
    """What the probe would refuse, or a job writing more scratch than the service allows, is a 422 before
    anything is queued."""
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        assert needle in _field_error(c.post("/v1/jobs/probe", json=body), field)
        assert c.get("/v1/jobs").json() == []
    assert not (tmp_path / "probe").exists()


@pytest.mark.parametrize(("body", "field", "needle"), [
    ({"gpu_cache": "100"}, "gpu_cache", "gpu_cache '100' is larger than the 40 GiB of memory of the GPU"),
    ({"cpu_cache": "150%"}, "cpu_cache", "cpu_cache '150%': a share of the dataset must be at most 100%"),
    ({"cpu_cache": "lots"}, "cpu_cache", "cpu_cache 'lots': expected GiB"),
])
def test_place_jobs_check_their_caches_at_submit(tmp_path, body, field, needle):
    """What `moment place` refuses before any work is a 422 naming the request field, not a job that fails
    later saying `--gpu-cache`."""
    from moment.workload.synth import synthesize

    synthesize(tmp_path / "datasets" / "ds", 500, feature_dim=4, seed=0)
    with TestClient(create_app(Settings(data_dir=tmp_path))) as c:
        r = c.post("/v1/jobs/place", json={"dataset": "ds", "layout": "L", **body})
        assert needle in _field_error(r, field)
        assert c.get("/v1/jobs").json() == []


def test_queued_jobs_are_capped_with_a_429(tmp_path):
    from moment.service.jobs import JobStore

    store = JobStore(tmp_path / "jobs.sqlite3")
    for _ in range(2):  # waiting jobs of a service on another machine (never run here)
        store.create("probe", {"ssd_dirs": {"ssd0": "a"}}, "elsewhere:1:x")
    with TestClient(create_app(Settings(data_dir=tmp_path, max_queued_jobs=2))) as c:
        r = c.post("/v1/jobs/probe", json={"size_mib": 16})
        assert r.status_code == 429 and r.headers["retry-after"], r.text
        assert "2 jobs are waiting to start, the service's limit" in r.json()["detail"]
        assert len(c.get("/v1/jobs").json()) == 2


def test_health_needs_no_worker_and_a_flood_of_searches_is_429_at_once(tmp_path, monkeypatch):
    """A search holds the only worker thread and the only search place: health still answers at once,
    and another search is answered 429 at once instead of waiting for the time limit."""
    import threading
    import time

    import anyio.to_thread

    from moment.planner import api

    started, release = threading.Event(), threading.Event()
    plan_machine = api.plan_machine

    def held(*a, **k):
        started.set()
        release.wait(30)
        return plan_machine(*a, **k)

    monkeypatch.setattr(api, "plan_machine", held)
    app = create_app(Settings(data_dir=tmp_path, max_searches=1, max_waiting_searches=0, plan_timeout_s=60))
    with TestClient(app) as c:
        async def one_worker():
            anyio.to_thread.current_default_thread_limiter().total_tokens = 1

        c.portal.call(one_worker)
        first = {}
        busy = threading.Thread(target=lambda: first.update(r=c.post("/v1/plan", json={"gpus": 1, "ssds": 1})))
        busy.start()
        try:
            assert started.wait(30)
            answers = {}
            health = threading.Thread(target=lambda: answers.update(r=c.get("/v1/health")))
            health.start()
            health.join(5)
            assert "r" in answers and answers["r"].status_code == 200, "health waited for a worker thread"
            t0 = time.monotonic()
            r = c.post("/v1/plan", json={"gpus": 1, "ssds": 1})
            assert r.status_code == 429 and "1 searches are running and 0 more are waiting" in r.json()["detail"]
            assert time.monotonic() - t0 < 5 and r.headers["retry-after"]
        finally:
            release.set()
            busy.join(60)
        assert first["r"].status_code == 200, first["r"].text


@pytest.mark.parametrize(("path", "body", "field", "needle"), [
    ("/v1/plan", {"gpus": 0}, "gpus", "the inventory has no GPU and the machine holds none"),
    ("/v1/plan", {"ssds": 100}, "ssds", "100 x P5510 need 100 free slots"),
    ("/v1/plan", {"inventory": "30xP5510,1xA100-PCIe-40GB"}, "inventory", "30 x P5510 need 30 free slots"),
    ("/v1/plan", {"inventory": "four"}, "inventory", "inventory 'four': expected COUNTxMODEL"),
    ("/v1/plan", {"profile": "dgx2", "gpus": 3}, "gpus", "gpus 3: 'dgx2' has 16 built-in GPUs"),
    ("/v1/plan", {"gpu_model": "GeForce 256"}, "gpu_model", "gpu_model: unknown device model 'GeForce 256'"),
    ("/v1/plan", {"gpu_cache_share": 0.5, "cpu_cache_share": 0.6}, "cpu_cache_share",
     "workload options: workload: the GPU caches' share of the reads (0.5) and the CPU memory's (0.6) add up to more "
     "than 1: lower one (the defaults are 0.15 and 0.1)"),
    ("/v1/plan", {"set": ["nodes.nope.link.gen=5"]}, "set", "set nodes.nope.link.gen=5: no element with id 'nope'"),
    ("/v1/plan", {"set": ["nodes.sw1.link.gen=99"]}, "set", "set nodes.sw1.link.gen=99: PCIe generation must be 1-6"),
    ("/v1/plan", {"set": ["name=" + "[" * 1000 + "]" * 1000]}, "set", "nested more than 200 deep"),
    ("/v1/plan", {"nccl_xml": "<system"}, "nccl_xml", "not well-formed XML"),
    ("/v1/plan", {"profile_yaml": "name: x\nnodes: [{id: a, kind: socket}]", "set": ["nodes.b.link.gen=5"]}, "set",
     "set nodes.b.link.gen=5: no element with id 'b'"),
    ("/v1/compare", {"profiles": ["paper-machine-b"], "gpus": 0}, "gpus", "the inventory has no GPU"),
    ("/v1/compare", {"profiles": ["paper-machine-b"], "inventories": ["x"]}, "inventories", "inventories 'x': expected"),
    ("/v1/compare", {"profiles": ["paper-machine-b"], "inventories": ["40xP5510,1xT4"]}, "inventories",
     "40 x P5510 need 40 free slots"),
    ("/v1/simulate", {"placement": "nope"}, "placement", "placement 'nope': not a layout of 'paper-machine-b'"),
    ("/v1/advise", {"budget": 100}, "budget", "budget 100 USD buys nothing for 'paper-machine-b'"),
    ("/v1/advise", {"budget": 50000, "models": ["CX7"]}, "models", "models: CX7 is a NIC"),
    ("/v1/advise", {"budget": 50000, "models": ["X100"]}, "models", "models: unknown device model 'X100'"),
    ("/v1/advise", {"budget": 50000, "prices": {"devices": {"X9": {"price_usd": 1}}}}, "prices",
     "prices: devices.X9: unknown device model 'X9'"),
    ("/v1/whatif/targets", {"hwloc_xml": "<topology><object"}, "hwloc_xml", "not well-formed XML"),
    # an inventory names every device: counts or models beside it were silently ignored
    ("/v1/plan", {"inventory": "2xA100-PCIe-40GB,2xP5510", "ssd_model": "PM1743"}, "ssd_model",
     "inventory lists every device to place, so ssd_model would be ignored"),
    ("/v1/plan", {"inventory": "2xA100-PCIe-40GB,2xP5510", "gpus": 3}, "gpus", "so gpus would be ignored"),
    ("/v1/compare", {"profiles": ["paper-machine-b"], "inventories": ["2xT4,2xP5510"], "ssds": 3}, "ssds",
     "inventories lists every device to place, so ssds would be ignored"),
    ("/v1/compare/machines", {"machines": [{"profile": "paper-machine-b", "ssd_model": "PM1743"}],
                              "inventory": "2xA100-PCIe-40GB,2xP5510"}, "machines.0.ssd_model",
     "inventory lists every device to place, so ssd_model would be ignored"),
    ("/v1/compare/machines", {"machines": [{"profile": "paper-machine-b", "inventory": "1xT4,40xP5510"}]},
     "machines.0.inventory", "40 x P5510 need 40 free slots that take an SSD"),
])
def test_semantic_422s_name_the_request_field_not_a_cli_flag(client, path, body, field, needle):
    """The body is {detail, errors: [{field, message}]}; the page places each error beside its field, and
    every message (and hint) speaks of request fields, never of `--gpus` or `--set`."""
    r = client.post(path, json=body)
    assert needle in _field_error(r, field)
    assert "--" not in r.json().get("hint", ""), r.json()


def test_a_probe_job_s_error_names_the_request_fields(tmp_path, monkeypatch):
    """A probe job on a disk without room said '--ssd-path ssd0 probe/p0: ... hint: use a smaller --size-mib'."""
    import os
    import time

    import moment.io.probe as probe_mod

    full = os.statvfs(tmp_path)
    monkeypatch.setattr(probe_mod.os, "statvfs", lambda p: type("Full", (), {"f_bavail": 2, "f_frsize": 1 << 20})()
                        if "probe" in str(p) else full)
    with TestClient(create_app(Settings(data_dir=tmp_path, probe_max_mib=64))) as c:
        job = c.post("/v1/jobs/probe", json={"ssd_dirs": {"ssd0": "p0"}, "size_mib": 16}).json()
        end = time.monotonic() + 60
        while job["state"] in ("queued", "running") and time.monotonic() < end:
            time.sleep(0.05)
            job = c.get(f"/v1/jobs/{job['id']}").json()
    assert job["state"] == "failed" and "--" not in job["error"], job
    assert job["error"] == ("ssd_dirs.ssd0 probe/p0: needs 16 MiB free for the scratch file, 2 MiB free\n"
                            "  hint: use a smaller size_mib"), job


def test_uploaded_command_outputs_blame_the_one_that_is_wrong(client):
    lspci = "-[0000:00]-+-00.0  Intel Corporation Device 09a2\n"
    r = client.post("/v1/scan", files={"lspci": ("a", lspci.encode()), "dmidecode": ("b", b"zz")})
    assert "dmidecode: not dmidecode output" in _field_error(r, "dmidecode")


@pytest.mark.parametrize(("content", "ctype", "needle"), [
    (b'{"profile": "\xff\xfe"}', "application/json", "body: not UTF-8 text (byte 0xff at position 13)"),
    (b'{"gpus": ', "application/json", "body: not valid JSON at character 9"),
    (b'{"set": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json", "body: nested too deep to read"),
])
def test_unreadable_json_bodies_are_422_naming_the_body(client, content, ctype, needle):
    r = client.post("/v1/plan", content=content, headers={"content-type": ctype})
    assert needle in _field_error(r, "body")


@pytest.mark.parametrize(("path", "body", "field", "needle"), [
    ("/v1/plan", {"gpus": True}, "gpus", "true is a truth value, not a number"),
    ("/v1/plan", {"gb_per_gpu": True}, "gb_per_gpu", "true is a truth value, not a number"),
    ("/v1/plan", {"ssds": False}, "ssds", "false is a truth value, not a number"),
    ("/v1/plan", {"gpus": "3"}, "gpus", "Input should be a valid integer"),
    ("/v1/plan", {"diagram": 1}, "diagram", "Input should be a valid boolean"),
    ("/v1/compare", {"profiles": ["paper-machine-b"], "gpus": True}, "gpus", "true is a truth value"),
    ("/v1/compare/machines", {"machines": [{}], "gpus": True}, "gpus", "true is a truth value"),
    ("/v1/compare/machines", {"machines": [{}], "ssds": "8"}, "ssds", "Input should be a valid integer"),
    ("/v1/simulate", {"placement": "paper-c", "steps": True}, "steps", "true is a truth value"),
    ("/v1/advise", {"budget": True}, "budget", "true is a truth value"),
    ("/v1/plan/cluster", {"cluster": {}, "feature_dim": True}, "feature_dim", "true is a truth value"),
    ("/v1/jobs/probe", {"size_mib": True}, "size_mib", "true is a truth value"),
    ("/v1/jobs/place", {"dataset": "d", "layout": "l", "epochs": "2"}, "epochs", "Input should be a valid integer"),
])
def test_request_fields_take_only_their_own_json_type(client, path, body, field, needle):
    """`gpus: true` planned 1 GPU and `"gpus": "3"` 3 (pydantic's lax mode): every request body is strict, and a
    truth value for a number is refused by the rule the machine models follow, naming the field."""
    assert needle in _field_error(client.post(path, json=body), field)


def test_a_body_of_many_unknown_keys_is_refused_cheaply_listing_twenty(client):
    """1.3 million unknown keys (15.8 MB) held the event loop 13 s, grew the service 1.7 GB and were answered with
    an 82 MB list of errors: unknown keys are refused before validation, and a 422 lists the first 20 errors."""
    body = b"{" + b",".join(b'"k%d":1' % i for i in range(200_000)) + b"}"
    r = client.post("/v1/plan", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and len(r.content) < 5000, len(r.content)
    errors = r.json()["errors"]
    assert [e["field"] for e in errors[:-1]] == [f"k{i}" for i in range(20)]
    assert errors[-1] == {"field": "body", "message": "(and 199,980 more errors not listed)"}
    assert r.json()["detail"].endswith("k7: Extra inputs are not permitted; (and 199,992 more)")
    # errors deeper in the body: the same bound, and a body of more values than any request holds
    bad = {"placement": "paper-c", "plan": {"bottlenecks": [1] * 30, "overrides": [2] * 30}}
    r = client.post("/v1/simulate", json=bad)
    assert r.status_code == 422 and len(r.json()["errors"]) == 21 and "more errors not listed" in r.text, r.text
    r = client.post("/v1/simulate", json={"placement": "paper-c", "plan": {"bottlenecks": [1] * 200_000}})
    assert "body: more than 100,000 values" in _field_error(r, "body")


@pytest.mark.parametrize(("content", "headers", "field", "needle"), [
    (b'{"gpus": 2, "gpus": 3}', {"content-type": "application/json"}, "gpus", "appears twice in the body"),
    (b'{"calibration": {"fitted": [], "fitted": []}}', {"content-type": "application/json"}, "body",
     "key 'fitted' appears twice in one object"),
    (b'{"gpus": 2}', {}, "body", "send JSON with the header Content-Type: application/json (no Content-Type "
                                 "header was sent)"),
    (b'{"gpus": 2}', {"content-type": "text/plain"}, "body", "Content-Type: application/json (got text/plain)"),
])
def test_a_body_is_json_said_so_with_each_key_once(client, content, headers, field, needle):
    """A key given twice took the last value (the YAML loader refuses one); a JSON body sent without its content
    type was 'Input should be a valid dictionary'."""
    assert needle in _field_error(client.post("/v1/plan", content=content, headers=headers), field)
    ok = client.post("/v1/plan", content=b'{"gpus": 2}', headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code != 422, ok.text


@pytest.mark.parametrize(("method", "path", "field", "needle"), [
    ("POST", "/v1/plan?gpus=8", "gpus", "gpus: give it in the JSON body, not the query string"),
    ("POST", "/v1/jobs/probe?x=1", "x", "x: the route takes no such query parameter"),
    ("GET", "/v1/jobs?limit=-1", "limit", "limit: the route takes no such query parameter"),
])
def test_query_parameters_are_refused_not_ignored(client, method, path, field, needle):
    """`POST /v1/plan?gpus=8&profile=dgx2` planned the body's 4 GPUs on paper-machine-b."""
    r = client.request(method, path, json={} if method == "POST" else None)
    assert _field_error(r, field) == needle


def test_a_broken_multipart_form_is_a_422_naming_the_body(client):
    r = client.post("/v1/scan", content=b"xx", headers={"content-type": "multipart/form-data"})
    assert "body: not a valid form" in _field_error(r, "body")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/plan", "POST"), ("PUT", "/v1/health", "GET, HEAD"), ("DELETE", "/v1/profiles", "GET, HEAD"),
    ("POST", "/v1/jobs/abc", "GET, HEAD, DELETE"), ("PUT", "/v1/jobs/place", "GET, HEAD, POST, DELETE"),
    ("OPTIONS", "/v1/plan", "POST"),
])
def test_a_wrong_method_is_405_naming_the_allowed_ones(client, method, path, allow):
    r = client.request(method, path)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow and r.json()["detail"] == f"{method} is not allowed on {path}; use {allow}"
    head = client.head("/v1/health")  # what load balancers' health checks send
    assert head.status_code == 200 and head.content == b""
    assert client.get("/v1/no-such-route").status_code == 404


def test_a_compared_machine_s_own_inventory_replaces_the_request_s(client):
    """The page's what-if of a plan made with an inventory sends that inventory with its devices changed,
    per machine: each row is what /v1/plan answers for its own inventory."""
    inv, own = "2xA100-PCIe-40GB,2xP5510", "2xA100-PCIe-40GB,2xPM1743"
    rows = client.post("/v1/compare/machines", json={"machines": [{"profile": "paper-machine-b"},
                                                                  {"profile": "paper-machine-b", "inventory": own}],
                                                     "inventory": inv}).json()
    plans = [client.post("/v1/plan", json={"inventory": i}).json() for i in (inv, own)]
    assert [r["inventory"] for r in rows] == [p["inventory"] for p in plans] == ["2 x A100-PCIe-40GB, 2 x P5510",
                                                                                 "2 x A100-PCIe-40GB, 2 x PM1743"]
    assert [r["epoch_read_s"] for r in rows] == [p["predicted"]["epoch_read_s"] for p in plans]
    assert rows[1]["epoch_read_s"] < rows[0]["epoch_read_s"]
