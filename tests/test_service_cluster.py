"""`POST /v1/plan/cluster`: the cluster form of a plan request answers what `moment plan --cluster --json`
prints, and its errors name the field."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402
from tests.test_service import cli  # noqa: E402

CLUSTER = {"name": "two-b", "servers": [{"name": "b", "profile": "paper-machine-b",
                                         "inventory": "4xA100-PCIe-40GB,8xP5510", "count": 2}],
           "network": {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}}


def untimed(cp: dict) -> dict:
    for m in cp["machines"]:
        m["plan"]["search"] = {k: v for k, v in m["plan"]["search"].items() if not k.startswith("seconds")}
    return cp


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("svc")))) as c:
        yield c


def test_cluster_plan_is_the_cli_json_with_a_diagram_per_machine(client, tmp_path):
    r = client.post("/v1/plan/cluster", json={"cluster": CLUSTER, "diagram": True})
    assert r.status_code == 200, r.text
    svc = r.json()
    svgs = svc.pop("diagrams_svg")
    path = tmp_path / "c.json"  # JSON is YAML: the same text as a cluster file
    path.write_text(json.dumps(CLUSTER))
    rc, out = cli("plan", "--cluster", path, "--json")
    assert rc == 0 and untimed(svc) == untimed(json.loads(out))
    assert sorted(svgs) == ["b0", "b1"] and all(s.startswith("<svg") and "CX6-Dx-100GbE" in s for s in svgs.values())


@pytest.mark.parametrize("body, field, want", [
    ({"cluster": {**CLUSTER, "servers": [{"profile": "/etc/passwd", "inventory": "4xA100"}]}},
     "cluster.servers[0].profile", "unknown built-in profile '/etc/passwd'"),
    ({"cluster": {**CLUSTER, "network": {"nic": "P5510", "switch_gbit": 100}}}, "cluster", "P5510 is an SSD, not a NIC"),
    ({"cluster": {**CLUSTER, "servers": [{"profile": "paper-machine-b", "inventory": "4xFOO"}]}}, "cluster",
     "servers[0].inventory: unknown device model 'FOO'"),
    ({"cluster": CLUSTER, "remote_fraction": 2}, "remote_fraction", "less than or equal to 1"),
    ({"cluster": {**CLUSTER, "network": {"nic": "CX7", "switch_gbit": -1}}}, "cluster.network.switch_gbit",
     "-1.0 is out of range: above 0, at most 3200 Gb/s"),
])
def test_a_bad_cluster_request_names_the_field(client, body, field, want):
    r = client.post("/v1/plan/cluster", json=body)
    assert r.status_code == 422, r.text
    err = r.json()
    assert want in json.dumps(err), err
    assert field in json.dumps(err), err
