"""`moment plan` says in words why the recommended layout beats each usual layout (paper-machine-b)."""

from __future__ import annotations

import json

import pytest

from moment.cli import main
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec


@pytest.fixture(scope="module")
def plan_b():
    return make_plan(load_profile("paper-machine-b"), Inventory.simple(4, 8), WorkloadSpec())


def _by_name(plan):
    return {e.layout: e for e in plan.explanation}


def test_one_explanation_per_layout_recommended_first(plan_b):
    assert plan_b.explanation[0].layout == "recommended"
    assert [e.layout for e in plan_b.explanation[1:]] == [b.name for b in plan_b.baselines]
    rec = plan_b.explanation[0]
    assert "all 8 SSDs are read at their limit (6.50 GB/s each)" in rec.text
    assert rec.limits[0].kind == "ssd-read" and rec.limits[0].count == 8


def test_switch_uplink_named_with_its_numbers(plan_b):
    """paper-b puts all 4 GPUs under sw1: the explanation names sw1's uplink, its capacity, the GPUs
    and what they get, all from the baseline's own LP solution."""
    e = _by_name(plan_b)["paper-b"]
    base = next(b for b in plan_b.baselines if b.name == "paper-b")
    assert e.slower_by == pytest.approx(base.predicted.epoch_read_s / plan_b.predicted.epoch_read_s)
    assert f"paper-b is {e.slower_by:.2f}× slower" in e.text
    up = next(lim for lim in e.limits if lim.link == "sw0->sw1")
    assert up.capacity_gbps == pytest.approx(27.13, abs=0.05)
    assert up.gpus == ["sw1-x16a", "sw1-x16b", "sw1-x16c", "sw1-x16d"]
    assert up.gpu_gbps == pytest.approx(min(base.predicted.per_gpu_inlet_gbps))
    assert up.recommended_utilisation is None  # the recommended layout puts nothing under sw1
    assert "share switch sw1's uplink sw0→sw1 (PCIe 4.0 x16, 27.1 GB/s), which caps them at 7.97 GB/s" in up.text
    assert set(e.limits[i].link for i in range(len(e.limits))) <= set(base.bottlenecks)


def test_socket_link_limit_compared_with_the_recommended_layout():
    """At its book rates paper-moment's reads are SSD-bound (as the paper measured it); with the socket
    link slowed to 20 GB/s the socket link is what holds it back, and the explanation says so."""
    slow = make_plan(load_profile("paper-machine-b", ["links.0.bandwidth_gbps=20"]), Inventory.simple(4, 8),
                     WorkloadSpec())
    e = _by_name(slow)["paper-moment"]
    upi = next(lim for lim in e.limits if lim.kind == "upi")
    rec_upi = next(lu for lu in slow.links if lu.id == upi.link)
    assert upi.recommended_utilisation == pytest.approx(rec_upi.utilisation)
    assert f"runs at {rec_upi.utilisation:.0%}" in upi.text and "cpu1→cpu0" in upi.text
    # the SSD reads limit both layouts, so they are not why paper-moment is slower
    assert all(lim.kind != "ssd-read" for lim in e.limits)


def test_equal_layouts_are_as_fast(plan_b):
    e = _by_name(plan_b)["paper-moment"]
    assert e.slower_by == pytest.approx(1.0, abs=1e-3) and e.text.startswith("paper-moment is as fast")


def test_numbers_follow_the_machine_not_a_template():
    """Slow sw1's uplink to 20 GB/s: the explanation's capacity and GPU rate change with it."""
    topo = load_profile("paper-machine-b", ["nodes.sw1.link.bandwidth_gbps=20"])
    plan = make_plan(topo, Inventory.simple(4, 8), WorkloadSpec())
    up = next(lim for lim in _by_name(plan)["paper-b"].limits if lim.link == "sw0->sw1")
    assert up.capacity_gbps == pytest.approx(20.0)
    base = next(b for b in plan.baselines if b.name == "paper-b")
    assert up.gpu_gbps == pytest.approx(min(base.predicted.per_gpu_inlet_gbps))
    assert f"20.0 GB/s), which caps them at {up.gpu_gbps:.2f} GB/s each" in up.text
    assert "sw1's uplink" in up.text and up.gpu_gbps < 7.9  # slower than with the 27.1 GB/s uplink


def test_cli_prints_and_json_carries_the_explanation(capsys):
    assert main(["plan", "-p", "paper-machine-b", "--gpus", "4", "--ssds", "8"]) == 0
    out = capsys.readouterr().out
    assert "why the recommended layout wins" in out
    assert "paper-b is 2.17× slower" in " ".join(out.split())
    assert main(["plan", "-p", "paper-machine-b", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    names = [e["layout"] for e in plan["explanation"]]
    assert names[0] == "recommended" and "paper-moment" in names
    assert all(e["text"] and "limits" in e for e in plan["explanation"])


def _plan(profile: str, gpus: int, ssds: int, ssd_model: str = "P5510", overrides: list[str] | None = None):
    inv = Inventory.simple(gpus, ssds, ssd_model=ssd_model)
    return make_plan(load_profile(profile, overrides or []), inv, WorkloadSpec())


def test_an_ssd_is_counted_once_however_many_of_its_links_are_full():
    """PM1743s fill both the SSD's own link and its bay's: 8 SSDs, not 16 links (the explanation and
    `compare`'s summary)."""
    from moment.planner.explain import bottleneck_summary

    plan = _plan("paper-machine-b", 4, 8, "PM1743")
    assert sum(1 for b in plan.bottlenecks if b.startswith("ssd")) == 8  # 16 full links in all
    rec = plan.explanation[0]
    link = next(lim for lim in rec.limits if lim.kind == "ssd-link")
    assert link.count == 8 and "the links of all 8 SSDs are full (PCIe 4.0 x4, 6.77 GB/s each)" in rec.text
    assert "16 SSDs" not in rec.text
    assert bottleneck_summary(plan) == "8 SSD slots' links (6.8 GB/s)"


def test_a_gpu_fed_by_two_full_links_is_named_once_with_the_tighter():
    """2 GPUs, 16 SSDs: each GPU's slot link and its own link are both full; one sentence per GPU,
    naming the slot's link, and nothing pushed into 'and 1 more'."""
    from moment.planner.explain import bottleneck_summary

    plan = _plan("paper-machine-b", 2, 16)
    rec = plan.explanation[0]
    gpu_limits = [lim for lim in rec.limits if lim.kind == "pcie"]
    assert sorted(lim.gpus[0] for lim in gpu_limits) == sorted(s for s, d in plan.devices.items() if "gpu" in d)
    assert all(lim.link.split("->")[1] == lim.gpus[0] for lim in gpu_limits)  # the slot's link, not the card's
    assert "more saturated link" not in rec.text
    assert bottleneck_summary(plan) == ", ".join(lim.link for lim in gpu_limits)


def test_one_ssd_is_not_all_1_ssds():
    rec = _plan("paper-machine-b", 8, 1).explanation[0]
    assert "the only SSD is read at its limit (6.50 GB/s)" in rec.text and "all 1" not in rec.text


def test_a_gpu_getting_more_than_its_link_says_its_own_cache_counts():
    """The inlet bandwidth counts the GPU's own cache hits: a 27.1 GB/s link 'caps it at 29.29 GB/s'
    says so, and the plan's table is followed by the definition."""
    from moment.planner.contracts import INLET_HELP

    plan = _plan("paper-machine-b", 2, 16)
    lim = next(lim for lim in plan.explanation[0].limits if lim.kind == "pcie")
    assert lim.gpu_gbps > lim.capacity_gbps
    assert f"caps it at {lim.gpu_gbps:.2f} GB/s, its own cache's hits included" in lim.text
    assert "own GPU cache's hits included" in INLET_HELP


def test_plan_table_defines_the_inlet_bandwidth(capsys):
    from moment.planner.contracts import INLET_HELP

    assert main(["plan", "-p", "paper-machine-b", "--gpus", "2", "--ssds", "2"]) == 0
    assert INLET_HELP in " ".join(capsys.readouterr().out.split())


def test_a_profile_layout_the_inventory_cannot_use_is_named_in_a_note(tmp_path, capsys):
    """A layout whose first two GPU slots block each other holds no two double-width GPUs: it is left
    out of the comparison, and the plan says so and why (it disappeared without a word)."""
    f = tmp_path / "blocked.yaml"
    f.write_text("""name: blocked
nodes:
  - {id: cpu0, kind: socket, memory_gib: 256, memory_bandwidth_gbps: 150}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: slot1, kind: slot, parent: rc0, width: 16, blocks: [slot2], link: {gen: 4, width: 16}}
  - {id: slot2, kind: slot, parent: rc0, width: 16, link: {gen: 4, width: 16}}
  - {id: slot3, kind: slot, parent: rc0, width: 16, link: {gen: 4, width: 16}}
  - {id: bay0, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
layouts:
  usual: {gpu: [slot1, slot2], ssd: [bay0]}
  roomy: {gpu: [slot1, slot3], ssd: [bay0]}
""")
    assert main(["plan", "-p", str(f), "--gpus", "2", "--ssds", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [b["name"] for b in plan["baselines"]][:1] == ["roomy"] and "usual" not in str(plan["baselines"])
    assert plan["notes"] == ["layout 'usual' is not compared for this inventory: double-width A100-PCIe-40GB in "
                             "'slot1' covers slot 'slot2', which is in use"]
    assert main(["plan", "-p", str(f), "--inventory", "2xT4,1xP5510", "--json"]) == 0  # single-width: both fit
    plan = json.loads(capsys.readouterr().out)
    assert plan["notes"] == [] and {"usual", "roomy"} <= {b["name"] for b in plan["baselines"]}
    assert main(["plan", "-p", "paper-machine-b", "--gpus", "8", "--ssds", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: layouts 'paper-a', 'paper-b', 'paper-c', 'paper-d', 'paper-moment' are not compared for this "
            "inventory: fewer GPU slots than the 8 GPUs") in out


def test_what_planning_leaves_out_of_the_installed_devices_is_said(tmp_path, capsys):
    """A profile's installed SSDs measured at 1 GB/s (`probe --profile-out` writes that) were planned afresh at the
    model's rated 6.5 GB/s, and an NVLink between its installed GPUs was dropped with them, without a word: the
    plan read as the measured machine's. Both are said; a profile whose devices are as rated says nothing."""
    f = tmp_path / "held.yaml"
    text = """name: held
nodes:
  - {id: cpu0, kind: socket, memory_gib: 256, memory_bandwidth_gbps: 150}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: slot1, kind: slot, parent: rc0, width: 16, accepts: [gpu], link: {gen: 4, width: 16}}
  - {id: slot2, kind: slot, parent: rc0, width: 16, accepts: [gpu], link: {gen: 4, width: 16}}
  - {id: g0, kind: gpu, parent: slot1, model: A100-PCIe-40GB, link: {gen: 4, width: 16}}
  - {id: g1, kind: gpu, parent: slot2, model: A100-PCIe-40GB, link: {gen: 4, width: 16}}
  - {id: bay0, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
  - {id: ssd0, kind: ssd, parent: bay0, model: P5510, read_gbps: RATE, link: {gen: 4, width: 4}}
"""
    f.write_text(text.replace("RATE", "1.0") + "links:\n  - {a: g0, b: g1, kind: nvlink, count: 4}\n")
    assert main(["plan", "-p", str(f), "--gpus", "2", "--ssds", "1", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert notes[0].startswith("the profile's installed SSDs are placed afresh as the inventory's, at their rated "
                               "rates: their measured rates are not used (ssd0 1 GB/s (P5510 rated 6.5))"), notes
    assert notes[1].startswith("the profile's peer links between installed cards are left out with the cards: "
                               "nvlink g0-g1"), notes
    f.write_text(text.replace("RATE", "6.5"))
    assert main(["plan", "-p", str(f), "--gpus", "2", "--ssds", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []
