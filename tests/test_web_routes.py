"""The page's own routes, without a browser: `/v1/whatif/targets` lists `set` paths that really change the
link they name, and `/v1/advise` answers what `moment advise --json` prints."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the service needs the `serve` extra (fastapi, uvicorn)")

from fastapi.testclient import TestClient  # noqa: E402

from moment.service.app import create_app  # noqa: E402
from moment.service.config import Settings  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("web")))) as c:
        yield c


# width x2: narrower than every slot (a link may not be wider than its slot) and no link's own width
NEW = {"gen": 5, "width": 2, "bandwidth_gbps": 12.5, "count": 3, "gts": 20}


def _link_of(topo, target: str):
    """The link object a target path names (`nodes.X.link` or `links.N`)."""
    parts = target.split(".")
    if parts[0] == "links":
        return topo.links[int(parts[1])]
    key = parts[1]
    node = topo.nodes[int(key)] if key.isdigit() else topo.node(key)
    return node.link


@pytest.mark.parametrize("profile", ["paper-machine-b", "hgx-a100-8gpu"])
def test_every_target_path_changes_the_link_it_names(client, profile):
    import copy

    import yaml

    from moment.topology.profiles import PROFILE_DIR, apply_override, topology_from_dict

    raw = yaml.safe_load((PROFILE_DIR / f"{profile}.yaml").read_text())

    def load(overrides=()):  # load_profile without re-reading the file each time
        data = copy.deepcopy(raw)
        for ov in overrides:
            apply_override(data, ov)
        return topology_from_dict(data, profile)

    r = client.post("/v1/whatif/targets", json={"profile": profile})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["profile"] == profile
    links = body["links"]
    groups = [t["group"] for t in links]
    assert groups[0] == "Switch uplinks" and "Socket and peer links" in groups
    assert len({t["target"] for t in links}) == len(links)
    base = load()
    for t in links:
        for prop in t["props"]:
            changed = load([f"{t['target']}.{prop}={NEW[prop]}"])
            assert getattr(_link_of(changed, t["target"]), prop) == NEW[prop], (t, prop)
            assert getattr(_link_of(base, t["target"]), prop) != NEW[prop] or prop == "count"
        # the figure shown is the one the planner uses
        if t["bandwidth_gbps"] is not None:
            assert abs(_link_of(base, t["target"]).bandwidth() / 1e9 - t["bandwidth_gbps"]) < 1e-3


def test_machine_b_lists_its_switch_cascade_and_socket_link(client):
    links = {t["target"]: t for t in client.post("/v1/whatif/targets", json={"profile": "paper-machine-b"}).json()["links"]}
    sw1 = links["nodes.sw1.link"]
    assert sw1["label"] == "PCIe Switch 1 (sw1) → sw0, Bus 16"
    assert sw1["current"] == {"gen": 4, "width": 16} and sw1["props"][0] == "gen"
    qpi = links["links.0"]
    assert qpi["kind"] == "upi" and qpi["bandwidth_gbps"] == 20.0
    assert qpi["props"][0] == "bandwidth_gbps"  # a measured figure wins over the link table: change it first


def test_an_uploaded_profile_with_an_awkward_id_is_named_by_position(client):
    from moment.topology.profiles import apply_override, topology_from_dict

    text = """\
name: up
nodes:
  - {id: cpu0, kind: socket}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: sw.0, kind: switch, parent: rc0, link: {gen: 3, width: 16}}
  - {id: s1, kind: slot, parent: sw.0, width: 16, link: {gen: 3, width: 16}}
"""
    r = client.post("/v1/whatif/targets", json={"profile_yaml": text})
    assert r.status_code == 200, r.text
    targets = {t["nodes"][0]: t["target"] for t in r.json()["links"]}
    assert targets == {"sw.0": "nodes.2.link", "s1": "nodes.s1.link"}
    import yaml

    data = yaml.safe_load(text)
    apply_override(data, "nodes.2.link.gen=5")
    assert topology_from_dict(data, "x").node("sw.0").link.gen == 5


def test_targets_errors_name_the_field(client):
    r = client.post("/v1/whatif/targets", json={"profile": "no-such-box"})
    assert r.status_code == 422 and "profile" in r.json()["detail"] and "no-such-box" in r.json()["detail"]
    r = client.post("/v1/whatif/targets", json={"profile_yaml": "name: [unclosed"})
    assert r.status_code == 422 and "YAML" in r.json()["detail"]


def test_advise_is_the_cli_json(client):
    import contextlib
    import io
    import json

    from moment.cli import main

    req = {"profile": "paper-machine-a", "budget": 60000, "models": ["A100-PCIe-40GB", "P5510"],
           "max_gpus": 2, "max_ssds": 2}
    r = client.post("/v1/advise", json=req)
    assert r.status_code == 200, r.text
    got = r.json()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["advise", "--profile", "paper-machine-a", "--budget", "60000", "--models", "A100-PCIe-40GB,P5510",
                   "--max-gpus", "2", "--max-ssds", "2", "--json"])
    assert rc == 0
    want = json.loads(out.getvalue())
    got.pop("elapsed_s")
    want.pop("elapsed_s")
    assert got == want
    assert got["best_per_dollar"]["inventory"] and got["best_throughput"]["predicted"]["epoch_read_s"] > 0


def test_advise_takes_the_users_prices(client):
    base = {"profile": "paper-machine-a", "budget": 60000, "models": ["A100-PCIe-40GB", "P5510"], "max_gpus": 1,
            "max_ssds": 1}
    cheap = {"devices": {"A100-PCIe-40GB": {"price_usd": 1000, "date": "2025-01", "source": "a test quote"}}}
    a = client.post("/v1/advise", json=base).json()
    b = client.post("/v1/advise", json={**base, "prices": cheap}).json()
    assert b["best_per_dollar"]["hardware_usd"] < a["best_per_dollar"]["hardware_usd"]
    assert b["prices"]["origin"] == "shipped + prices"
    assert b["prices"]["devices"]["A100-PCIe-40GB"]["source"].endswith("a test quote")
    bad = client.post("/v1/advise", json={**base, "prices": {"devices": {"A100-PCIe-40GB": {"price_usd": -1}}}})
    assert bad.status_code == 422 and "price" in bad.json()["detail"]


@pytest.mark.parametrize("body, status, words", [
    ({"profile": "paper-machine-a", "budget": 1000, "models": ["A100-PCIe-40GB", "P5510"], "max_gpus": 1,
      "max_ssds": 1}, 422, "buys nothing"),
    ({"profile": "paper-machine-a", "budget": 60000, "models": ["NoSuchGPU"]}, 422, "NoSuchGPU"),
    ({"profile": "paper-machine-a", "budget": -5}, 422, "budget"),
    ({"profile": "paper-machine-a", "budget": 60000, "pue": 0.5}, 422, "pue"),
])
def test_advise_errors_are_422_in_words(client, body, status, words):
    r = client.post("/v1/advise", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]


def test_page_routes_need_the_token_when_the_service_has_one(tmp_path):
    with TestClient(create_app(Settings(data_dir=tmp_path, token="s3cret"))) as c:
        assert c.post("/v1/whatif/targets", json={"profile": "paper-machine-b"}).status_code == 401
        ok = c.post("/v1/whatif/targets", json={"profile": "paper-machine-b"},
                    headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.post("/v1/advise", json={"budget": 1}).status_code == 401


def test_the_page_is_served_from_the_package(client):
    page = client.get("/")
    assert page.status_code == 200 and "<script src=\"app.js\">" in page.text
    for asset in ("app.js", "style.css"):
        r = client.get("/" + asset)
        assert r.status_code == 200 and len(r.text) > 1000
    # nothing fetched from elsewhere: no absolute URLs in the page or its assets
    for asset in ("", "app.js", "style.css"):
        text = client.get("/" + asset).text
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
