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
    assert sw1["label"] == "sw1 → sw0 (PCIe Switch 1), Bus 16"
    assert sw1["current"] == {"gen": 4, "width": 16} and sw1["props"][0] == "gen"
    qpi = links["links.0"]
    assert qpi["kind"] == "upi" and qpi["bandwidth_gbps"] == 28.6
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
    assert got["best_throughput_per_dollar"]["inventory"] and got["best_throughput"]["predicted"]["epoch_read_s"] > 0


def test_advise_takes_the_users_prices(client):
    base = {"profile": "paper-machine-a", "budget": 60000, "models": ["A100-PCIe-40GB", "P5510"], "max_gpus": 1,
            "max_ssds": 1}
    cheap = {"devices": {"A100-PCIe-40GB": {"price_usd": 1000, "date": "2025-01", "source": "a test quote"}}}
    a = client.post("/v1/advise", json=base).json()
    b = client.post("/v1/advise", json={**base, "prices": cheap}).json()
    assert b["best_throughput_per_dollar"]["hardware_usd"] < a["best_throughput_per_dollar"]["hardware_usd"]
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


def test_the_page_is_served_from_the_package(client, tmp_path):
    """`/` serves the package's own static/ files byte for byte, the page names no file that is not
    there, and a build of the package (setuptools' build_py, what a wheel holds) ships every one."""
    import re
    import subprocess
    import sys
    from importlib.resources import files
    from pathlib import Path

    from moment.service import app as app_mod

    static = Path(str(files("moment.service") / "static"))
    assert app_mod.STATIC == static

    def tree(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    shipped = tree(static)
    assert {"index.html", "app.js", "style.css"} <= set(shipped)
    page = client.get("/")
    assert page.status_code == 200 and page.content == shipped["index.html"]
    for name, data in shipped.items():
        r = client.get("/" + name)
        assert r.status_code == 200 and r.content == data, name
    # every file the page loads is one of them (openapi.json is the service's own route)
    refs = set(re.findall(r'(?:src|href)="([^"#:]+)"', shipped["index.html"].decode()))
    assert refs and refs - {"openapi.json"} <= set(shipped), refs
    # nothing fetched from elsewhere: no absolute URLs in the page or its assets
    for name, data in shipped.items():
        text = data.decode()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name
    # what an install ships: the package data that pyproject.toml declares (a fresh egg-info, so that
    # the checkout's own SOURCES.txt cannot add what the declaration leaves out)
    root = Path(__file__).resolve().parents[1]
    out, egg = tmp_path / "lib", tmp_path / "egg"
    egg.mkdir()
    done = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(egg),
                           "build_py", "--build-lib", str(out)], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert tree(out / "moment" / "service" / "static") == shipped


UPLOAD = """\
name: two-slot-box
nodes:
  - {id: cpu0, kind: socket}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: s1, kind: slot, parent: rc0, width: 16, accepts: [gpu], link: {gen: 4, width: 16}}
  - {id: g1, kind: gpu, parent: s1, model: T4}
  - {id: s2, kind: slot, parent: rc0, width: 16, accepts: [gpu], link: {gen: 4, width: 16}}
  - {id: bay0, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
"""


@pytest.mark.parametrize("body, want", [
    ({"profile": "asus-esc8000a-e12"}, {"built_in_gpus": 0, "in_slots": {"gpu": 4, "ssd": 17}, "default_gpus": 4}),
    ({"profile": "hgx-a100-8gpu"}, {"built_in_gpus": 8, "built_in_models": ["A100-SXM4-80GB"], "in_slots": {},
                                    "free_slots": 8, "take_gpu": 0, "take_ssd": 8, "default_gpus": 0}),
    # two slots take a GPU: the GPUs left blank are 2, not the 4 that would not fit
    ({"profile_yaml": UPLOAD}, {"built_in_gpus": 0, "in_slots": {"gpu": 1}, "free_slots": 3, "take_gpu": 2,
                                "take_ssd": 1, "default_gpus": 2}),
])
def test_targets_say_what_the_machine_holds(client, body, want):
    """The page describes a machine from this: cards in slots are replaced by a plan, SXM GPUs are kept."""
    got = client.post("/v1/whatif/targets", json=body).json()["machine"]
    assert {k: got[k] for k in want} == want


def test_blank_gpus_are_as_many_as_the_machine_takes(client):
    """GPUs left out: 4, or as many as the free slots that take one (a plan of 4 on this box failed)."""
    r = client.post("/v1/plan", json={"profile_yaml": UPLOAD, "ssds": 1})
    assert r.status_code == 200, r.text
    assert r.json()["inventory"] == "2 x A100-PCIe-40GB, 1 x P5510"


SXM_BOX = """\
name: sxm-box
nodes:
  - {id: cpu0, kind: socket}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: sw0, kind: switch, parent: rc0, link: {gen: 4, width: 16}}
  - {id: g0, kind: gpu, parent: sw0, model: A100-SXM4-80GB, link: {gen: 4, width: 16}}
"""


def test_a_machine_without_a_free_slot_says_so_once(client):
    """Its GPUs built in, no slot: one sentence, about the request as a whole (it named the GPUs field with
    "the inventory is empty", and the page advised planning fewer GPUs)."""
    assert client.post("/v1/whatif/targets", json={"profile_yaml": SXM_BOX}).json()["machine"]["free_slots"] == 0
    r = client.post("/v1/plan", json={"profile_yaml": SXM_BOX, "ssds": 0})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == "'sxm-box' has no free slot, so there is nothing to place around its 1 built-in GPU"
    assert r.json()["errors"][0]["field"] == "body" and "hint" not in r.json()


def test_no_ssd_names_the_ssds_and_each_remedy_by_its_field(client):
    """The planner's "no SSD" is about the SSD count (the inventory when one is given), and its hint's two
    remedies name their fields, so the page gives only the one it has an input for."""
    r = client.post("/v1/plan", json={"profile": "paper-machine-b", "gpus": 4, "ssds": 0})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["errors"] == [{"field": "ssds", "message": body["detail"]}] and "no SSD" in body["detail"]
    assert [x["field"] for x in body["remedies"]] == ["ssds", "gpu_cache_share"] and body["hint"]
    r = client.post("/v1/plan", json={"profile": "paper-machine-b", "inventory": "4xA100"})
    assert r.json()["errors"][0]["field"] == "inventory" and r.json()["remedies"][0]["field"] == "inventory"


def test_compare_machines_plans_uploads_and_whatifs_as_plan_does(client):
    inv = {"gpus": 2, "ssds": 1, "ssd_model": "P5510"}
    machines = [{"profile": "paper-machine-b"}, {"profile_yaml": UPLOAD},
                {"profile_yaml": UPLOAD, "set": ["nodes.bay0.link.width=1"]},  # its only bay, narrowed
                {"profile": "paper-machine-b", "ssd_model": "PM1743"}]
    r = client.post("/v1/compare/machines", json={"machines": machines, **inv})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert [row["profile"] for row in rows] == ["paper-machine-b", "two-slot-box", "two-slot-box", "paper-machine-b"]
    assert rows[2]["overrides"] == ["nodes.bay0.link.width=1"] and "PM1743" in rows[3]["inventory"]
    for m, row in zip(machines, rows):  # each row is the plan of that machine
        plan = client.post("/v1/plan", json={**inv, **m}).json()
        assert row["epoch_read_s"] == plan["predicted"]["epoch_read_s"] and row["inventory"] == plan["inventory"]
    assert rows[2]["epoch_read_s"] > rows[1]["epoch_read_s"] and rows[3]["epoch_read_s"] < rows[0]["epoch_read_s"]
    bad = client.post("/v1/compare/machines", json={"machines": [{"profile": "paper-machine-b"}, {"profile": "nope"}]})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "machines.1.profile" and "nope" in bad.json()["detail"]


def test_targets_say_the_generation_a_links_cpu_drives(client):
    """A link at a root port runs at its CPU's PCIe generation (`CappedLink`), and the page suggested gen + 1 there
    (PCIe 5.0 on paper-machine-a's Gold 5320 uplinks): a what-if that changes nothing. Each target says its cap,
    as the topology's one rule gives it; a switch's downstream links and the socket link have none."""
    def targets(body):
        return {t["target"]: t for t in client.post("/v1/whatif/targets", json=body).json()["links"]}

    def epoch(*sets):
        r = client.post("/v1/plan", json={"profile": "paper-machine-a", "set": list(sets)})
        assert r.status_code == 200, r.text
        return r.json()["predicted"]["epoch_read_s"]

    a = targets({"profile": "paper-machine-a"})
    cap = {"gen": 4, "cpu": "Xeon Gold 5320", "socket": "cpu0"}
    assert a["nodes.sw0.link"]["gen_cap"] == cap and a["nodes.rc0-bay1.link"]["gen_cap"] == cap
    assert a["nodes.sw1.link"]["gen_cap"] == {**cap, "socket": "cpu1"}
    assert a["nodes.sw0-bay1.link"]["gen_cap"] is None and a["links.0"]["gen_cap"] is None
    # what it says: past the cap a generation changes nothing (planned at the cap), below it it does
    assert epoch("nodes.sw0.link.gen=5", "nodes.sw1.link.gen=5") == epoch() < epoch("nodes.sw0.link.gen=2")
    b = targets({"profile": "paper-machine-b"})  # Sapphire Rapids: PCIe 5.0, so gen + 1 is real there
    assert b["nodes.sw0.link"]["gen_cap"]["gen"] == 5 and b["nodes.sw1.link"]["gen_cap"] is None
    # a link written above its CPU's generation keeps it (`current`) and says the one it runs at
    old = UPLOAD.replace("kind: socket}", "kind: socket, model: Xeon E5-2680 v4}").replace("gen: 4, width: 16", "gen: 5, width: 16")
    s1 = targets({"profile_yaml": old})["nodes.s1.link"]
    assert s1["current"]["gen"] == 5 and s1["gen_cap"] == {"gen": 3, "cpu": "Xeon E5-2680 v4", "socket": "cpu0"}


def test_targets_say_the_widest_a_link_may_be(client):
    """The page suggested twice a link's lanes where its slot takes no more (x8 on paper-machine-b's x4 bay
    `rc0-bay1`: refused as wider than the slot). Each target says the most lanes it may have, as the topology's
    rule gives it: a slot's link and its card's, the slot's `width`; another PCIe link, the widest PCIe link."""
    from moment.topology import bandwidth as bw

    def targets(profile):
        r = client.post("/v1/whatif/targets", json={"profile": profile})
        return {t["target"]: (t["max_width"], t["max_width_slot"]) for t in r.json()["links"]}

    b = targets("paper-machine-b")
    assert b["nodes.rc0-bay1.link"] == (4, "rc0-bay1") and b["nodes.rc0-x16.link"] == (16, "rc0-x16")
    assert b["nodes.sw0.link"] == (max(bw.PCIE_WIDTHS), None) and b["links.0"] == (None, None)
    assert targets("paper-machine-a")["nodes.nic0.link"] == (16, "rc1-nic")  # a card in a slot: the slot's
    # the widths the page may suggest: PCIe's, up to the slot's (x12 doubled is x24, which PCIe has not)
    widths = {t["target"]: t["widths"] for t in client.post("/v1/whatif/targets", json={"profile": "paper-machine-b"})
              .json()["links"]}
    assert widths["nodes.rc0-bay1.link"] == [1, 2, 4] and widths["nodes.sw0.link"] == list(bw.PCIE_WIDTHS)
    assert widths["links.0"] is None and 24 not in widths["nodes.sw0.link"]
    # what it says: the widest is planned, one step wider is refused
    for width, status in ((4, 200), (8, 422)):
        r = client.post("/v1/plan", json={"profile": "paper-machine-b", "set": [f"nodes.rc0-bay1.link.width={width}"]})
        assert r.status_code == status, r.text
    assert "wider than the slot (width x4)" in r.text


def test_compare_rows_carry_their_plans_notes(client):
    """A compared machine's plan says what `moment plan` says beside its figures (a link its CPU caps, a rate
    above its wire rate): the rows had no notes, so a what-if that changed nothing looked like a result."""
    sets = ["nodes.sw0.link.gen=5"]
    plan = client.post("/v1/plan", json={"profile": "paper-machine-a", "set": sets}).json()
    assert len(plan["notes"]) == 1 and plan["notes"][0].startswith("Xeon Gold 5320 of socket 'cpu0' drives PCIe 4.0")
    r = client.post("/v1/compare/machines", json={"machines": [{"profile": "paper-machine-a", "set": sets},
                                                               {"profile": "paper-machine-a"}]})
    assert r.status_code == 200, r.text
    assert [row["notes"] for row in r.json()] == [plan["notes"], []]
    r = client.post("/v1/compare", json={"profiles": ["paper-machine-a"], "overrides": sets})
    assert r.status_code == 200, r.text
    assert r.json()[0]["notes"] == plan["notes"]
