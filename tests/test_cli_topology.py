"""The `moment` planner and scanner commands, as scripts use them."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, fixture_file

from moment.cli import main
from moment.topology.model import Kind, Topology
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec


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
    # the SSD-bound optimum: the uncached share of the epoch from 8 P5510s at 6.5 GB/s each, and every
    # GPU fed its quarter of the epoch's bytes in that time
    wl = WorkloadSpec()
    assert pred["epoch_read_s"] == pytest.approx(wl.epoch_bytes() * wl.ssd_share / (8 * 6.5e9), rel=1e-6)
    assert pred["per_gpu_inlet_gbps"] == pytest.approx([wl.epoch_bytes() / 4 / pred["epoch_read_s"] / 1e9] * 4)
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


def test_a_machine_without_a_slot_for_one_card_says_so_in_the_singular(capsys, tmp_path):
    """A scanned VM or a hand-written machine with no GPU slot: one card needs one slot, and it has none."""
    f = tmp_path / "tiny.yaml"
    f.write_text("name: tiny\nnodes:\n"
                 "- {id: cpu0, kind: socket, memory_gib: 64, memory_bandwidth_gbps: 100}\n"
                 "- {id: rc0, parent: cpu0, kind: root_complex}\n"
                 "- {id: bay0, parent: rc0, link: {kind: pcie, gen: 4, width: 4}, kind: slot, width: 4, accepts: [ssd]}\n")
    code, out, err = run(capsys, "plan", "--profile", str(f), "--gpus", "1", "--ssds", "1")
    assert code == 2, (out, err)
    assert "1 x A100-PCIe-40GB needs 1 free slot that takes a GPU (x16 or wider), but 'tiny' has none" in \
        " ".join(err.split()), err


@pytest.mark.parametrize("argv, says, where", [
    (["plan", "--gpus", "abc"], "Invalid value for '--gpus'", "moment plan"),
    (["plan", "--no-such-flag"], "No such option: --no-such-flag", "moment plan"),
    (["no-such-command"], "No such command 'no-such-command'", "moment"),
    (["layout", "rm"], "Missing argument 'layout'", "moment layout rm"),
])
def test_a_bad_flag_or_value_is_one_line_with_where_to_look_not_a_usage_box(capsys, argv, says, where):
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out, (out, err)
    assert err.splitlines() == [f"error: {says}" + err.splitlines()[0].split(says, 1)[1], f"  hint: see {where} --help"]
    assert "Usage:" not in err and "Traceback" not in err


def test_bad_profile_file_names_file_and_field(capsys, tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\nnodes:\n  - {id: cpu0, kind: socket}\n  - {id: s0, kind: slot, parent: ghost}\n")
    code, _, err = run(capsys, "plan", "--profile", str(p))
    assert code == 2 and "mine.yaml" in err and "ghost" in err


MARKUP_PROFILE = """\
name: "[bold]base[/bold] [x]"
nodes:
  - {id: cpu0, kind: socket, memory_gib: 256, memory_bandwidth_gbps: 150}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: sw0, kind: switch, parent: rc0, label: "PEX [x16] [bold]sw[/bold]", link: {gen: 4, width: 16}}
  - {id: slot1, kind: slot, parent: sw0, width: 16, accepts: [gpu], link: {gen: 4, width: 16}}
  - {id: slot2, kind: slot, parent: sw0, width: 16, accepts: [gpu], link: {gen: 4, width: 16}}
  - {id: slot3, kind: slot, parent: sw0, width: 16, accepts: [gpu], link: {gen: 3, width: 4}}
  - {id: "bay[0]", kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
  - {id: bay1, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
layouts:
  "[red]usual": {gpu: [slot1, slot2], ssd: ["bay[0]", bay1]}
"""


def test_the_users_text_is_printed_as_written_not_as_markup(capsys, tmp_path, monkeypatch):
    """hunt-J D12: `--set nodes.slot1.accepts=[gpu]` was echoed as `nodes.slot1.accepts=`, a label
    `PEX [x16] [bold]sw[/bold]` as `PEX sw`, a name `[bold]base[/bold] [x]` as `base `."""
    monkeypatch.setenv("COLUMNS", "200")
    p = tmp_path / "base.yaml"
    p.write_text(MARKUP_PROFILE)
    code, out, err = run(capsys, "plan", "--profile", str(p), "--gpus", "2", "--ssds", "2",
                         "--set", "nodes.slot1.accepts=[gpu]")
    assert code == 0, err
    assert "what-if overrides (--set): nodes.slot1.accepts=[gpu]" in out
    assert "Moment plan for [bold]base[/bold] [x] with 2 x A100-PCIe-40GB" in out
    assert "cpu0 / rc0 / PEX [x16] [bold]sw[/bold]" in out and "bay[0]->rc0" in out
    assert "│ [red]usual " in out and "([red]usual, " in out
    m = tmp_path / "m.yaml"
    m.write_text(f"machine: {p}\ngpus: 2\nssds: 2\nmeasurements:\n"
                 "  - {layout: '[red]usual', epoch_s: 45}\n  - {gpu: [slot3, slot1], ssd: [bay1, 'bay[0]'], epoch_s: 190}\n")
    code, out, err = run(capsys, "calibrate", "--measured", str(m), "--fit", "ssd_read")
    assert code == 0, err
    assert "calibration fitted on [bold]base[/bold] [x]" in out and "│ [red]usual " in out
    assert "gpu=slot3,slot1;ssd=bay1,bay[0]" in out


def test_scan_json_kinds_from_real_files(capsys, fixtures_dir, tmp_path):
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
    # the JSON, scan report and all, is a profile to plan (its report was an extra input before)
    scanned = tmp_path / "scanned.json"
    scanned.write_text(out)
    code, plan, err = run(capsys, "plan", "--profile", str(scanned), "--gpus", "2", "--ssds", "2", "--json")
    assert code == 0 and json.loads(plan)["placement"], err


def test_scan_writes_a_profile_that_loads_back_and_nccl_xml_round_trips(capsys, tmp_path):
    out_yaml = tmp_path / "here.yaml"
    code, _, err = run(capsys, "scan", "--out", str(out_yaml))
    assert code == 0 and ("missing:" in err or "used:" in err)
    code, out, _ = run(capsys, "scan", "--json")
    assert code == 0
    doc = json.loads(out)
    doc.pop("scan_report")  # what was read and assumed: said on stderr, not part of the profile
    scanned = Topology.model_validate(doc)
    assert load_profile(str(out_yaml)).nodes == scanned.nodes  # the file is the machine scanned
    xml = tmp_path / "b.xml"
    assert run(capsys, "export", "--profile", "paper-machine-b", "--format", "nccl-xml", "-o", str(xml))[0] == 0
    code, out, _ = run(capsys, "scan", "--from-nccl-xml", str(xml), "--json")
    assert code == 0

    def tree(nodes) -> set:  # NCCL's XML has no empty slots: sockets, root complexes, switches and links
        return {(n.id, n.kind.value, n.parent, (n.link.gen, n.link.width) if n.link else None)
                for n in nodes if n.kind != Kind.slot}

    back = Topology.model_validate(json.loads(out))
    assert tree(back.nodes) == tree(load_profile("paper-machine-b").nodes)
    assert len(tree(back.nodes)) == 6


def test_compare_and_listings(capsys):
    code, out, _ = run(capsys, "compare", "paper-machine-a", "paper-machine-b", "--gpus", "2", "--ssds", "4", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["profile"] for r in rows] == ["paper-machine-a", "paper-machine-b"]
    shipped = sorted(p.stem for p in (REPO / "topology_profiles").glob("*.yaml"))
    assert [r["name"] for r in json.loads(run(capsys, "profiles", "--json")[1])] == shipped
    models = {m["name"]: m for m in json.loads(run(capsys, "models", "--json")[1])}
    assert (models["P5510"]["kind"], models["P5510"]["read_gbps"], models["P5510"]["lanes"]) == ("ssd", 6.5, 4)
    assert (models["A100-PCIe-40GB"]["kind"], models["A100-PCIe-40GB"]["gen"], models["A100-PCIe-40GB"]["lanes"]) == \
        ("gpu", 4, 16)
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
