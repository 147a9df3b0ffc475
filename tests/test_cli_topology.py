"""The `moment` planner and scanner commands, as scripts use them."""

from __future__ import annotations

import json

import pytest

from moment.cli import main
from conftest import fixture_file


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_interface(capsys):
    code, out, _ = run(capsys, "plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--json")
    assert code == 0
    plan = json.loads(out)
    assert len(plan["placement"]) == 12
    pred = plan["predicted"]
    assert len(pred["per_gpu_inlet_gbps"]) == 4 and all(x > 0 for x in pred["per_gpu_inlet_gbps"])
    assert pred["epoch_read_s"] > 0
    assert plan["links"] and all("utilisation" in lu for lu in plan["links"])
    assert plan["search"]["raw_candidates"] > plan["search"]["distinct_candidates"] > 1
    names = {b["name"] for b in plan["baselines"]}
    assert {"paper-a", "paper-b", "paper-c", "paper-d"} <= names
    for b in plan["baselines"]:
        assert len(b["predicted"]["per_gpu_inlet_gbps"]) == 4
        assert b["predicted"]["epoch_read_s"] >= pred["epoch_read_s"] * (1 - 1e-6)


def test_plan_tables_and_diagram(capsys, tmp_path):
    svg, png = tmp_path / "plan.svg", tmp_path / "plan.png"
    code, out, _ = run(capsys, "plan", "--profile", "paper-machine-a", "--gpus", "2", "--ssds", "4",
                       "--diagram", str(svg))
    assert code == 0 and "recommended placement" in out and "paper-c" in out
    assert svg.read_text().startswith("<svg") and "gpu0" in svg.read_text()
    assert run(capsys, "plan", "--profile", "paper-machine-a", "--gpus", "1", "--ssds", "2",
               "--diagram", str(png))[0] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_what_if_override_changes_the_prediction(capsys):
    base = json.loads(run(capsys, "plan", "-p", "paper-machine-a", "--gpus", "4", "--ssds", "8", "--json")[1])
    faster = json.loads(run(capsys, "plan", "-p", "paper-machine-a", "--gpus", "4", "--ssds", "12",
                            "--ssd-model", "PM1743", "--json")[1])
    assert faster["predicted"]["epoch_read_s"] < base["predicted"]["epoch_read_s"]


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--profile", "no-such-machine"], "unknown profile 'no-such-machine'"),
    (["plan", "--gpus", "40"], "need 40 free slots"),
    (["plan", "--gpu-model", "GeForce 256"], "unknown device model"),
    (["plan", "--set", "nodes.sw0.link.gen=9"], "PCIe generation"),
    (["plan", "--set", "links.0.bandwidth_gbps=-3"], "must be positive"),
    (["plan", "--inventory", "four A100"], "expected COUNTxMODEL"),
    (["plan", "--maxflow-backend", "magic"], "choose networkx or ortools"),
    (["plan", "--diagram", "plan.pdf"], "use a .svg or .png"),
    (["schema", "everything"], "choose one of"),
    (["scan", "--from-nccl-xml", "/nonexistent/topo.xml"], "/nonexistent/topo.xml"),
])
def test_user_errors_are_one_message_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert needle in " ".join(err.split()) and "Traceback" not in err


def test_bad_profile_file_names_file_and_field(capsys, tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\nnodes:\n  - {id: cpu0, kind: socket}\n  - {id: s0, kind: slot, parent: ghost}\n")
    code, _, err = run(capsys, "plan", "--profile", str(p))
    assert code == 2 and "mine.yaml" in err and "ghost" in err


def test_scan_json_kinds_from_real_files(capsys, fixtures_dir):
    code, out, _ = run(capsys, "scan", "--from-nccl-xml", str(fixture_file("nccl_simai_8xA100-4xCX6_topo.xml")), "--json")
    assert code == 0
    nodes = json.loads(out)["nodes"]
    kinds = {n["kind"] for n in nodes}
    assert {"socket", "root_complex", "switch", "gpu", "nic"} <= kinds
    assert sum(n["kind"] == "gpu" for n in nodes) == 8
    code, out, _ = run(capsys, "scan", "--from-lspci", str(fixture_file("lspci-tv_stelline_asus-esc8000a-e12.txt")),
                       "--from-nvidia-smi", str(fixture_file("nvidia-smi-topo_stelline_asus-esc8000a-e12.txt")), "--json")
    nodes = json.loads(out)["nodes"]
    assert sum(n["kind"] == "gpu" for n in nodes) == 4 and sum(n["kind"] == "ssd" for n in nodes) == 17
    assert all(n["kind"] != "gpu" or "ASPEED" not in (n.get("label") or "") for n in nodes)


def test_scan_this_machine_and_round_trip_to_plan(capsys, tmp_path):
    out_yaml = tmp_path / "here.yaml"
    code, _, err = run(capsys, "scan", "--out", str(out_yaml))
    assert code == 0 and out_yaml.exists()
    assert "missing:" in err or "used:" in err
    code, out, _ = run(capsys, "export", "--profile", "paper-machine-b", "--format", "nccl-xml")
    assert code == 0 and out.lstrip().startswith("<") and "<system" in out


def test_compare_and_listings(capsys):
    code, out, _ = run(capsys, "compare", "paper-machine-a", "paper-machine-b", "--gpus", "2", "--ssds", "4", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["profile"] for r in rows] == ["paper-machine-a", "paper-machine-b"]
    assert json.loads(run(capsys, "profiles", "--json")[1])
    assert json.loads(run(capsys, "models", "--json")[1])
    schema = json.loads(run(capsys, "schema", "topology")[1])
    assert "nodes" in schema["properties"]


def test_help_paragraphs_are_reflowed_not_ragged(capsys):
    # docstrings are wrapped at the source's width; --help joins each paragraph so rich wraps it once
    from moment.cli import _register, app

    _register()
    plan = next(c for c in app.registered_commands if c.name == "plan")
    paragraphs = plan.help.split("\n\n")
    assert len(paragraphs) >= 3 and all("\n" not in p for p in paragraphs)
    assert paragraphs[-1].startswith("Example: moment plan")  # an example keeps its own paragraph
    rc, out, _ = run(capsys, "plan", "--help")
    assert rc == 0 and "solved with the realisable LP" in " ".join(out.split())
