"""The service's requests take the data placement a prediction assumes (`data`), as the CLI's --data."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("svc")))) as c:
        yield c


def test_plan_request_takes_data_and_answers_both_figures(client):
    planned = client.post("/v1/plan", json={"profile": "paper-machine-a"}).json()
    even = client.post("/v1/plan", json={"profile": "paper-machine-a", "data": "even"}).json()
    assert planned["data"] == "planned" and even["data"] == "even"
    for b in planned["baselines"] + even["baselines"]:
        assert b["predicted_even"]["epoch_read_s"] >= b["predicted"]["epoch_read_s"] * (1 - 1e-9)
    assert even["predicted_even"]["epoch_read_s"] == pytest.approx(planned["predicted_even"]["epoch_read_s"])


@pytest.mark.parametrize("route, body", [
    ("/v1/plan", {"profile": "paper-machine-a", "data": "hash"}),
    ("/v1/compare", {"profiles": ["paper-machine-a"], "data": "hash"}),
    ("/v1/simulate", {"profile": "paper-machine-b", "placement": "paper-c", "data": "hash"}),
    ("/v1/advise", {"profile": "paper-machine-a", "budget": 60000, "data": "hash"}),
])
def test_an_unknown_data_placement_is_a_422_naming_the_field(client, route, body):
    r = client.post(route, json=body)
    assert r.status_code == 422
    assert any(e["field"] == "data" and "'planned' or 'even'" in e["message"] for e in r.json()["errors"])


def test_compare_simulate_and_advise_answer_under_the_data_asked_for(client):
    rows = client.post("/v1/compare", json={"profiles": ["paper-machine-a"], "data": "even"}).json()
    plan = client.post("/v1/plan", json={"profile": "paper-machine-a", "data": "even"}).json()
    assert rows[0]["data"] == "even"
    assert rows[0]["epoch_read_s"] == pytest.approx(plan["predicted_even"]["epoch_read_s"])
    rows = client.post("/v1/compare/machines", json={"machines": [{"profile": "paper-machine-a"}],
                                                      "data": "even"}).json()
    assert rows[0]["data"] == "even"

    rep = client.post("/v1/simulate", json={"profile": "paper-machine-b", "placement": "paper-c", "uniform": True,
                                            "data": "even"}).json()
    assert rep["data"] == "even"
    rep = client.post("/v1/simulate", json={"plan": plan, "uniform": True}).json()
    assert rep["data"] == "even"  # the plan's

    adv = client.post("/v1/advise", json={"profile": "paper-machine-a", "budget": 80000, "data": "even",
                                          "models": ["A100-PCIe-40GB", "P5510"], "max_gpus": 2, "max_ssds": 3})
    assert adv.status_code == 200 and adv.json()["data"] == "even"
