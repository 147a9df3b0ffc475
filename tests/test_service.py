"""The placement service (`moment serve`): the same answers as the CLI, safe by default, errors that name
the field and never a 500."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.errors import MomentError  # noqa: E402
from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402
from tests.conftest import fixture_file  # noqa: E402

#: fields that differ between two runs of the same search (wall-clock timings)
_TIMINGS = ("seconds_total", "seconds_per_solve")


def cli(*args: str) -> tuple[int, str]:
    from moment.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in args])
    return rc, out.getvalue()


def untimed(plan: dict) -> dict:
    return {**plan, "search": {k: v for k, v in plan["search"].items() if k not in _TIMINGS}}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("svc")))
    with TestClient(app) as c:
        yield c


@pytest.mark.slow
def test_plan_is_the_cli_json_and_draws_the_diagram(client, tmp_path):
    r = client.post("/v1/plan", json={"profile": "paper-machine-b", "gpus": 4, "ssds": 8, "diagram": True})
    assert r.status_code == 200, r.text
    svc = r.json()
    svg = svc.pop("diagram_svg")
    rc, out = cli("plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--json",
                  "--diagram", tmp_path / "plan.svg")
    assert rc == 0
    assert untimed(svc) == untimed(json.loads(out))
    assert svg.startswith("<svg") and svg == (tmp_path / "plan.svg").read_text()


def test_plan_with_overrides_workload_and_calibration_is_the_cli_json(client, tmp_path):
    cal = {"fitted_on": "paper-machine-b", "params": {"switch_uplink": 0.9, "overhead_s": 1.5},
           "fitted": ["switch_uplink", "overhead_s"]}
    (tmp_path / "cal.yaml").write_text(json.dumps(cal))
    body = {"profile": "paper-machine-b", "inventory": "2xA100-PCIe-40GB,3xP5510", "set": ["nodes.sw1.link.gen=5"],
            "feature_dim": 256, "gpu_cache_share": 0.1, "calibration": cal}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    rc, out = cli("plan", "--profile", "paper-machine-b", "--inventory", "2xA100-PCIe-40GB,3xP5510", "--set",
                  "nodes.sw1.link.gen=5", "--feature-dim", "256", "--gpu-cache-share", "0.1", "--calibration",
                  tmp_path / "cal.yaml", "--json")
    assert rc == 0
    svc, ref = untimed(r.json()), untimed(json.loads(out))
    assert svc["calibration"].pop("file") == "request" and ref["calibration"].pop("file").endswith("cal.yaml")
    assert svc == ref and svc["overrides"] == ["nodes.sw1.link.gen=5"]


def test_compare_simulate_models_profiles_are_the_cli_json(client):
    r = client.post("/v1/compare", json={"profiles": ["paper-machine-b", "paper-machine-a"], "gpus": 2, "ssds": 2,
                                         "set": ["nodes.sw1.link.gen=5"]})
    assert r.status_code == 200, r.text
    rc, out = cli("compare", "paper-machine-b", "paper-machine-a", "--gpus", "2", "--ssds", "2", "--set",
                  "nodes.sw1.link.gen=5", "--json")
    assert rc == 0 and r.json() == json.loads(out) and len(r.json()) == 2

    r = client.post("/v1/simulate", json={"profile": "paper-machine-b", "placement": "paper-c", "steps": 20})
    rc, out = cli("simulate", "--profile", "paper-machine-b", "--placement", "paper-c", "--steps", "20", "--json")
    assert r.status_code == 200 and rc == 0 and r.json() == json.loads(out)

    for what in ("models", "profiles"):
        rc, out = cli(what, "--json")
        assert rc == 0 and client.get(f"/v1/{what}").json() == json.loads(out), what


def test_simulate_replays_a_plan_answer(client):
    plan = client.post("/v1/plan", json={"gpus": 2, "ssds": 2}).json()
    r = client.post("/v1/simulate", json={"plan": plan, "uniform": True})
    assert r.status_code == 200, r.text
    assert r.json()["lp_epoch_s"] == pytest.approx(plan["predicted"]["epoch_read_s"], rel=1e-6)


def test_uploaded_machines_plan_as_their_files_do(client, tmp_path):
    """A profile's YAML text plans as the profile; an NCCL XML reads as `moment scan --from-nccl-xml`."""
    from moment.topology.profiles import PROFILE_DIR

    text = (PROFILE_DIR / "paper-machine-b.yaml").read_text()
    up = client.post("/v1/plan", json={"profile_yaml": text, "gpus": 2, "ssds": 2}).json()
    named = client.post("/v1/plan", json={"profile": "paper-machine-b", "gpus": 2, "ssds": 2}).json()
    assert (up["placement"], up["predicted"]) == (named["placement"], named["predicted"])

    xml = fixture_file("nccl_azure_ndv4-topo.xml")
    rc, out = cli("scan", "--from-nccl-xml", xml, "--name", "ndv4", "--json")
    r = client.post("/v1/scan", files={"nccl_xml": ("t.xml", xml.read_bytes())}, data={"name": "ndv4"})
    assert rc == 0 and r.status_code == 200, r.text
    svc, ref = r.json(), json.loads(out)
    assert svc.pop("source") == "NCCL topology XML (text)" and ref.pop("source") == str(xml)
    assert svc == ref
    # planning the upload = planning the profile `moment scan --out` saves from the same file
    rc, _ = cli("scan", "--from-nccl-xml", xml, "--name", "ndv4", "--out", tmp_path / "ndv4.yaml")
    assert rc == 0
    rc, out = cli("plan", "--profile", tmp_path / "ndv4.yaml", "--gpus", "2", "--ssds", "2", "--json")
    r = client.post("/v1/plan", json={"nccl_xml": xml.read_text(), "name": "ndv4", "gpus": 2, "ssds": 2})
    assert rc == 0 and r.status_code == 200, r.text
    assert untimed(r.json()) == untimed(json.loads(out))


def test_scan_reads_an_uploaded_hwloc_xml_as_the_cli(client):
    xml = fixture_file("hwloc_24em64t-2n6c2t-pci.xml")
    rc, out = cli("scan", "--from-hwloc-xml", xml, "--name", "h", "--json")
    r = client.post("/v1/scan", files={"hwloc_xml": ("h.xml", xml.read_bytes())}, data={"name": "h"})
    assert rc == 0 and r.status_code == 200, r.text
    svc, ref = r.json(), json.loads(out)
    assert svc.pop("source") == "hwloc XML (text)" and ref.pop("source") == str(xml)
    assert svc == ref


def test_scan_reads_uploaded_command_outputs(client):
    lspci = fixture_file("lspci-tv_stelline_asus-esc8000a-e12.txt")
    smi = fixture_file("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt")
    rc, out = cli("scan", "--from-lspci", lspci, "--from-nvidia-smi", smi, "--name", "esc", "--json")
    r = client.post("/v1/scan", files={"lspci": ("a", lspci.read_bytes()), "nvidia_smi": ("b", smi.read_bytes())},
                    data={"name": "esc"})
    assert rc == 0 and r.status_code == 200, r.text
    svc, ref = r.json(), json.loads(out)
    # the sources name the files: the CLI's paths, the service's upload fields
    assert {k: v for k, v in svc.items() if k not in ("source", "scan_report")} == \
        {k: v for k, v in ref.items() if k not in ("source", "scan_report")}


@pytest.mark.parametrize(("body", "field"), [
    ({"profile": "../../etc/passwd"}, "profile"),
    ({"profile": "/etc/hosts"}, "profile"),
    ({"gpus": "four"}, "gpus"),
    ({"gpus": -1}, "gpus"),
    ({"gpu": 4}, "gpu"),
    ({"gpu_model": "GeForce 256"}, "gpu_model"),
    ({"inventory": "four A100s"}, "inventory"),
    ({"gpu_cache_share": 2}, "gpu_cache_share"),
    ({"set": ["nodes.nope.link.gen=5"]}, "set"),
    ({"profile": "dgx2", "gpus": 3}, "gpus"),
    ({"calibration": {"fitted_on": "x", "params": {"warp": 1}, "fitted": []}}, "calibration"),
    ({"profile": "paper-machine-b", "nccl_xml": "<system/>"}, "profile"),
])
def test_bad_plan_input_is_a_422_naming_the_field(client, body, field):
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 422, r.text
    assert field in r.json()["detail"], r.json()


def test_hints_come_as_their_own_key(client):
    r = client.post("/v1/plan", json={"gpu_model": "GeForce 256"})
    assert r.json()["detail"] == "gpu_model: unknown device model 'GeForce 256'"
    assert r.json()["hint"].startswith("known models: A100-PCIe-40GB")


def test_uploads_are_text_never_paths(client, tmp_path):
    """An upload that looks like a file name is read as (bad) content, never opened."""
    secret = tmp_path / "secret.xml"
    secret.write_text("<system version='1'><cpu numaid='0'/></system>")
    for field in ("nccl_xml", "hwloc_xml", "lspci", "profile_yaml"):
        r = client.post("/v1/plan", json={field: str(secret)})
        assert r.status_code == 422, (field, r.text)
        assert str(tmp_path) not in r.json()["detail"]
    r = client.post("/v1/scan", files={"nccl_xml": ("x", str(secret).encode())})
    assert r.status_code == 422 and "not well-formed" in r.json()["detail"]


def test_limits_answer_413_and_408(tmp_path):
    app = create_app(Settings(data_dir=tmp_path, max_body_bytes=4096, max_upload_bytes=1000, plan_timeout_s=0.05))
    with TestClient(app) as c:
        r = c.post("/v1/plan", json={"profile_yaml": "x" * 5000})
        assert r.status_code == 413 and "4,096" in r.json()["detail"]
        r = c.post("/v1/plan", json={"profile_yaml": "# " + "x" * 2000})
        assert r.status_code == 413 and r.json()["detail"].startswith("profile_yaml:")
        r = c.post("/v1/scan", files={"lspci": ("l", b"y" * 2000)})
        assert r.status_code == 413 and r.json()["detail"].startswith("lspci:")
        r = c.post("/v1/plan", json={"profile": "paper-machine-b", "gpus": 4, "ssds": 8})
        assert r.status_code == 408 and "0.05 s" in r.json()["detail"]
        # a body sent without Content-Length is counted as it arrives
        r = c.post("/v1/plan", content=iter([b'{"profile_yaml": "', b"z" * 5000, b'"}']),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413


@pytest.mark.slow
def test_token_guards_every_route_but_health(tmp_path):
    app = create_app(Settings(data_dir=tmp_path, token="s3cret"))
    with TestClient(app) as c:
        assert c.get("/v1/health").json() == {"status": "ok", "version": "0.1.0", "auth": True}
        for method, path in (("get", "/v1/profiles"), ("get", "/v1/models"), ("post", "/v1/plan"),
                             ("get", "/v1/jobs"), ("post", "/v1/jobs/probe")):
            assert getattr(c, method)(path).status_code == 401, path
            bad = getattr(c, method)(path, headers={"Authorization": "Bearer wrong"})
            assert bad.status_code == 401, path
        # a body (or query) the route would refuse is not read for a client without the token: 401, not 422
        for kw in ({"json": {"nonsense": 1}}, {"content": b'{"gpus": 1, "gpus": 2}'}, {"params": {"gpus": 8}},
                   {"content": b"{}", "headers": {"Content-Type": "text/plain"}}):
            assert c.post("/v1/plan", **kw).status_code == 401, kw
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post("/v1/plan", json={"nonsense": 1}, headers=ok).status_code == 422
        assert c.get("/v1/profiles", headers=ok).status_code == 200
        assert c.get("/openapi.json").status_code == 200


def test_openapi_lists_the_versioned_routes(client):
    spec = client.get("/openapi.json").json()
    assert {"/v1/health", "/v1/profiles", "/v1/models", "/v1/plan", "/v1/compare", "/v1/simulate", "/v1/scan",
            "/v1/jobs/place", "/v1/jobs/probe", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel"} <= set(spec["paths"])
    assert "PlanRequest" in spec["components"]["schemas"]


def test_bind_check_is_one_line():
    from moment.errors import MomentError
    from moment.service.config import check_bind, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "tok")
    with pytest.raises(MomentError) as e:
        check_bind("0.0.0.0", None)
    assert "\n" not in str(e.value) and "token" in str(e.value)


def test_static_page_is_served_when_shipped(tmp_path, monkeypatch):
    import moment.service.app as app_mod

    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><title>moment</title>")
    monkeypatch.setattr(app_mod, "STATIC", static)
    with TestClient(app_mod.create_app(Settings(data_dir=tmp_path / "d"))) as c:
        assert "moment" in c.get("/").text
        assert c.get("/v1/health").status_code == 200
        r = c.get("/v1/nothing-here")
        assert r.status_code == 404 and r.json()["detail"].startswith("no route /v1/nothing-here")


@pytest.mark.slow
def test_service_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; import tempfile\n"
            "from fastapi.testclient import TestClient\n"
            "from moment.service.app import create_app; from moment.service.config import Settings\n"
            "c = TestClient(create_app(Settings(data_dir=Path(tempfile.mkdtemp()))))\n"
            "assert c.post('/v1/plan', json={'gpus': 2, 'ssds': 2}).status_code == 200\n"
            "assert 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]


def test_deadline_stops_the_search_and_bounds_how_many_run():
    import time

    from moment.service.deadline import Searches, run_with_deadline
    from moment.service.errors import Busy, TimedOut

    searches = Searches(1, 1)
    reports = []

    def search(progress):
        for i in range(1000):
            reports.append(i)
            progress(i, 1000)
            time.sleep(0.01)
        return "finished"

    with pytest.raises(TimedOut, match="within the service's limit of 0.1 s"):
        run_with_deadline(search, 0.1, "the plan search", searches)
    # told to stop, the search ends at its next progress report and gives its slot back
    assert searches.slots.acquire(timeout=5)
    n = len(reports)
    time.sleep(0.1)
    assert len(reports) == n < 1000
    # no free slot within the limit: busy
    with pytest.raises(Busy, match="no free slot"):
        run_with_deadline(search, 0.1, "the plan search", searches)
    searches.slots.release()
    assert run_with_deadline(lambda progress: "ok", 5, "x", searches) == "ok"
    with pytest.raises(ValueError, match="boom"):
        run_with_deadline(lambda progress: (_ for _ in ()).throw(ValueError("boom")), 5, "x", searches)
    assert searches.slots.acquire(timeout=1)  # errors give the slot back too


def test_the_data_directory_cannot_be_the_root(tmp_path):
    """Every file a request names must lie under the data directory: `/` would let it name any file."""
    with pytest.raises(MomentError, match="cannot be the file system's root"):
        create_app(Settings(data_dir=Path("/")))
    create_app(Settings(data_dir=tmp_path))  # a directory of its own is fine


def test_the_job_database_is_checked_up_front(tmp_path):
    """A link to nothing (an unmounted disk) or a directory as --db is one error naming it, before any
    job is accepted; a path of its own is made."""
    (tmp_path / "dangling").symlink_to(tmp_path / "not-mounted" / "jobs.sqlite3")
    with pytest.raises(MomentError, match="symbolic link to .*not-mounted.*, which does not exist") as e:
        Settings(data_dir=tmp_path / "d", db=tmp_path / "dangling").checked()
    assert str(tmp_path / "dangling") in e.value.source and not (tmp_path / "not-mounted").exists()
    with pytest.raises(MomentError, match="directory"):
        Settings(data_dir=tmp_path / "d", db=tmp_path).checked()
    assert Settings(data_dir=tmp_path / "d", db=tmp_path / "jobs.db").checked().db == tmp_path / "jobs.db"
