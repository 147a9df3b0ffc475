"""`moment compare` and `--set` as people and scripts see them; machines with built-in GPUs."""

from __future__ import annotations

import json

import pytest

from moment.cli import console, main

SET = "links.0.bandwidth_gbps=30"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("width", [120, 80])
def test_compare_never_cuts_a_profile_name(capsys, monkeypatch, width):
    monkeypatch.setattr(console, "width", width)
    code, out, _ = run(capsys, "compare", "paper-machine-a", "paper-machine-b", "hgx-a100-8gpu")
    assert code == 0
    for name in ("paper-machine-a", "paper-machine-b", "hgx-a100-8gpu"):
        assert name in out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width


def test_compare_counts_the_bottlenecks_it_does_not_list(capsys):
    code, out, _ = run(capsys, "compare", "paper-machine-a", "--inventory", "2xA100,16xP5510",
                       "--inventory", "4xA100,8xP5510", "--inventory", "3xA100,16xP5510", "--json")
    assert code == 0
    few_gpus, balanced, three = json.loads(out)
    # 3 GPUs: the SSD reads counted, three links named (a GPU's own link not beside its slot's), 2 more counted
    summary = three["bottleneck_summary"].split(", ")
    assert summary[0] == "5 SSD reads at the drive's limit" and summary[-1] == "+2 more links" and len(summary) == 5
    assert not any(s.endswith(("->gpu0", "->gpu1", "->gpu2")) for s in summary)
    # 2 GPUs, 16 SSDs: four links limit, two per GPU (its slot's and its own): each GPU's slot link is
    # named once; 4 + 8: the 8 SSDs
    named = [b for b in few_gpus["bottlenecks"] if ":read" not in b]
    assert len(named) == 4 and few_gpus["bottleneck_summary"] == ", ".join(named[:2])
    reads = [b for b in balanced["bottlenecks"] if b.endswith(":read")]
    assert len(reads) == len(balanced["bottlenecks"]) == 8
    assert balanced["bottleneck_summary"] == "8 SSD reads at the drive's limit"  # counted, not listed
    code, text, _ = run(capsys, "compare", "paper-machine-a", "--inventory", "4xA100,8xP5510")
    assert "8 SSD reads" in text and "ssd0:read" not in text


@pytest.mark.slow
def test_set_overrides_are_echoed_in_text_and_json(capsys):
    code, out, _ = run(capsys, "compare", "paper-machine-b", "--set", SET)
    assert code == 0 and f"what-if overrides (--set): {SET}" in out
    code, out, _ = run(capsys, "compare", "paper-machine-b", "--set", SET, "--json")
    assert json.loads(out)[0]["overrides"] == [SET]
    code, out, _ = run(capsys, "plan", "-p", "paper-machine-b", "--set", SET, "--json")
    assert json.loads(out)["overrides"] == [SET]
    code, out, _ = run(capsys, "plan", "-p", "paper-machine-b", "--set", SET)
    assert f"what-if overrides (--set): {SET}" in out


def test_compare_says_each_plans_notes_in_text_and_json(capsys, monkeypatch):
    """A compared plan's notes (here: a PCIe 5.0 what-if its Gold 5320 CPU caps at 4.0, so it changes nothing) were
    left out of the rows: `moment plan` said them and `moment compare` did not."""
    monkeypatch.setattr(console, "width", 100)
    argv = ("compare", "paper-machine-a", "paper-machine-b", "--set", "nodes.sw0.link.gen=5", "--fresh")
    code, out, _ = run(capsys, *argv, "--json")
    a, b = json.loads(out)
    code, plan, _ = run(capsys, "plan", "-p", "paper-machine-a", "--set", "nodes.sw0.link.gen=5", "--json")
    assert a["notes"] == json.loads(plan)["notes"] and len(a["notes"]) == 1 and b["notes"] == []  # (B: PCIe 5.0)
    code, out, _ = run(capsys, *argv)
    said = " ".join(out.split())
    assert code == 0 and f"note: paper-machine-a (4 x A100-PCIe-40GB, 8 x P5510): {a['notes'][0]}" in said, out
    assert "note: paper-machine-b" not in said and max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("override, needle", [
    ("nodes.sw0.link.gen=9", "nodes.sw0.link.gen=9: PCIe generation must be 1-6"),  # the key once
    ("links.0.bandwidth_gbps=-3", "links.0.bandwidth_gbps=-3: must be positive"),
    ("nodes.sw0.parent=ghost", "parent 'ghost' does not exist"),
])
def test_bad_set_value_blames_the_override_not_the_shipped_file(capsys, override, needle):
    code, _, err = run(capsys, "plan", "-p", "paper-machine-b", "--set", "nodes.sw1.link.gen=5", "--set", override)
    msg = " ".join(err.split())
    assert code == 2 and "Traceback" not in err
    assert msg.startswith(f"error: --set {override}: ") and needle in msg
    assert "topology_profiles/paper-machine-b.yaml:" not in msg


@pytest.mark.slow
def test_builtin_gpus_are_planned_without_gpus_option(capsys):
    for prof, n in (("hgx-a100-8gpu", 8), ("dgx2", 16)):
        code, out, err = run(capsys, "plan", "-p", prof, "--json")
        assert code == 0, err
        plan = json.loads(out)
        assert len(plan["predicted"]["gpus"]) == n and plan["inventory"] == "8 x P5510"
    code, out, _ = run(capsys, "plan", "-p", "hgx-a100-8gpu")
    assert "with 8 x P5510 and 8 built-in A100-SXM4-80GB GPUs" in out
    assert run(capsys, "plan", "-p", "hgx-a100-8gpu", "--gpus", "8", "--json")[0] == 0  # "its own 8"
    code, _, err = run(capsys, "plan", "-p", "hgx-a100-8gpu", "--gpus", "4")
    msg = " ".join(err.split())
    assert code == 2 and "--gpus 4: 'hgx-a100-8gpu' has 8 built-in GPUs" in msg and "leave out --gpus" in msg
    code, out, _ = run(capsys, "compare", "dgx2", "paper-machine-b", "--json")
    rows = json.loads(out)
    assert code == 0 and [len(r["per_gpu_inlet_gbps"]) for r in rows] == [16, 4]
