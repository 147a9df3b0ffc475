"""Per-step replay: equals the LP on a uniform trace, honours the step barrier, reads real layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.planner.baselines import named_layouts
from moment.planner.lp import solve_lp
from moment.planner.network import build_network
from moment.planner.replay import Replayer, layout_demands, synthetic_demands
from moment.topology.bandwidth import GB
from moment.topology.devices import Inventory, populate, strip
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec
from tests.test_planner import SSD, TINY_PLACEMENT, tiny

REPO = Path(__file__).resolve().parents[1]


def _named(profile: str, name: str):
    bare, _ = strip(load_profile(profile))
    lay = {b.name: b for b in named_layouts(bare, Inventory.simple(4, 8, "A100-PCIe-40GB", SSD))}[name]
    return build_network(populate(bare, lay.placement), WorkloadSpec())


@pytest.mark.parametrize("profile,layout", [("paper-machine-a", "paper-a"), ("paper-machine-a", "paper-d"),
                                            ("paper-machine-b", "paper-c"), ("paper-machine-b", "paper-moment")])
def test_uniform_trace_equals_lp(profile, layout):
    net = _named(profile, layout)
    sol = solve_lp(net)
    B = synthetic_demands(net, sol.storage_shares(), 84, 4096, uniform=True)
    rep = Replayer(net).run(B, sol.epoch_read_s, "uniform")
    assert rep.epoch_s == pytest.approx(sol.epoch_read_s, rel=1e-6)
    assert rep.aggregate_s == pytest.approx(sol.epoch_read_s, rel=1e-6)
    assert all(g.idle_s == pytest.approx(0.0, abs=1e-6 * rep.epoch_s) for g in rep.per_gpu)
    assert rep.limiting_links and rep.limiting_links[0].steps == 84
    assert "matches the LP" in rep.why


def test_uniform_trace_equals_lp_with_several_routes():
    """NVLink machine: (storage, GPU) pairs with several routes are split by a per-step LP."""
    net = build_network(load_profile("hgx-a100-8gpu"), WorkloadSpec(gpu_cache_share=0.5, cpu_cache_share=0.5))
    r = Replayer(net)
    assert r.multi  # the LP path is the one under test
    sol = solve_lp(net)
    rep = r.run(synthetic_demands(net, sol.storage_shares(), 6, 4096, uniform=True), sol.epoch_read_s, "uniform")
    assert rep.epoch_s == pytest.approx(sol.epoch_read_s, rel=1e-6)


def _tiny_net():
    return build_network(populate(tiny(), TINY_PLACEMENT), WorkloadSpec())


def test_barrier_slowest_gpu_sets_the_pace():
    net = _tiny_net()
    S = {s.id: i for i, s in enumerate(net.storage)}
    rate = 6.5 * GB  # P5510 read rate (its x4 link and the 8 GB/s slot are faster)
    B = np.zeros((2, 2, len(net.storage)))
    B[0, 0, S["ssd0"]], B[0, 1, S["ssd1"]] = 8 * GB, 16 * GB  # step 0: gpu1 reads twice as much
    B[1, 0, S["ssd0"]], B[1, 1, S["ssd1"]] = 16 * GB, 8 * GB  # step 1: the other way round
    rep = Replayer(net).run(B, 1.0, "test")
    assert rep.epoch_s == pytest.approx(2 * 16 * GB / rate)
    assert rep.aggregate_s == pytest.approx(24 * GB / rate)  # the same bytes in one step: no barrier
    assert rep.steps_effect == pytest.approx(32 / 24 - 1)
    for g in rep.per_gpu:  # each GPU is busy 16/6.5 + 8/6.5 s and waits 8/6.5 s
        assert g.busy_s == pytest.approx(24 * GB / rate)
        assert g.idle_s == pytest.approx(8 * GB / rate)
    assert {x.id for x in rep.limiting_links} == {"ssd0:read", "ssd1:read"}
    assert all(x.steps == 1 for x in rep.limiting_links)


def test_shared_link_limits_both_gpus():
    """Both GPUs read CPU memory over the 5 GB/s switch uplink: the uplink limits, nobody idles."""
    net = _tiny_net()
    m = [i for i, s in enumerate(net.storage) if s.id == "mem:cpu0"][0]
    B = np.zeros((1, 2, len(net.storage)))
    B[0, 0, m], B[0, 1, m] = 2 * GB, 3 * GB
    rep = Replayer(net).run(B, 1.0, "test")
    assert rep.epoch_s == pytest.approx(1.0)
    assert rep.limiting_links[0].id == "rc0->sw0"
    assert [g.idle_s for g in rep.per_gpu] == pytest.approx([0.0, 0.0], abs=1e-12)


def test_synthetic_is_seeded_and_keeps_the_bytes():
    net = _tiny_net()
    sol = solve_lp(net)
    a = synthetic_demands(net, sol.storage_shares(), 10, 4096, seed=3)
    b = synthetic_demands(net, sol.storage_shares(), 10, 4096, seed=3)
    assert np.array_equal(a, b)
    assert a.sum(axis=(0, 2)) == pytest.approx([net.demand[g] for g in net.gpus])
    assert not np.array_equal(a, synthetic_demands(net, sol.storage_shares(), 10, 4096, seed=4))


def test_layout_demands_counts_rows_per_bin():
    net = _tiny_net()
    names = ["hbm:gpu0", "hbm:gpu1", "mem:cpu0", "ssd0", "ssd1"]
    bin_of_node = np.array([3, 4, 4, 2, 0])  # node -> bin
    B = layout_demands(net, bin_of_node, names, [[np.array([0, 1, 2])], [np.array([2, 3]), np.array([4])]], 100)
    col = {s.id: i for i, s in enumerate(net.storage)}
    assert B.shape == (2, 2, len(net.storage))
    assert B[0, 0, col["ssd0"]] == 100 and B[0, 0, col["ssd1"]] == 200
    assert B[0, 1, col["ssd1"]] == 100 and B[0, 1, col["mem:cpu0"]] == 100
    assert B[1, 1, col["hbm:gpu0"]] == 100 and B[1, 0].sum() == 0
    with pytest.raises(MomentError, match="not storage nodes"):
        layout_demands(net, bin_of_node, names[:-1] + ["ssd9"], [[np.array([0])], [np.array([1])]], 100)


def test_unreachable_reads_are_an_error():
    net = _tiny_net()
    r = Replayer(net)
    r.reachable[0, 0] = False  # pretend gpu0 cannot reach the first storage node
    B = np.zeros((1, 2, len(net.storage)))
    B[0, 0, 0] = 1.0
    with pytest.raises(MomentError, match="cannot reach"):
        r.run(B, 1.0, "test")


def test_cli_simulate_json_and_plan_file(tmp_path, capsys):
    import json

    from moment.cli import main

    assert main(["simulate", "--profile", "paper-machine-a", "--placement", "paper-c", "--uniform", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"epoch_s", "per_gpu", "lp_epoch_s", "limiting_links"} <= set(out)
    assert out["epoch_s"] == pytest.approx(out["lp_epoch_s"], rel=1e-6)
    assert main(["plan", "--profile", "paper-machine-a", "--gpus", "4", "--ssds", "8", "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    assert main(["simulate", "--plan", str(plan), "--steps", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 20 and len(out["per_gpu"]) == 4 and out["source"] == "synthetic" and "notes" not in out
    # a plan of an edited copy of a built-in profile (its name kept) was replayed on the built-in machine silently
    text = (REPO / "topology_profiles" / "paper-machine-a.yaml").read_text()
    slow = tmp_path / "slow-bays.yaml"
    slow.write_text("\n".join(ln.replace("link: {gen: 4", "link: {gen: 2") if "accepts: [ssd]" in ln else ln
                              for ln in text.splitlines()))  # every SSD bay PCIe 2.0
    assert slow.read_text() != text
    assert main(["plan", "--profile", str(slow), "--gpus", "4", "--ssds", "8", "--json"]) == 0
    edited = tmp_path / "edited.json"
    edited.write_text(capsys.readouterr().out)
    planned = json.loads(edited.read_text())["predicted"]["epoch_read_s"]
    assert main(["simulate", "--plan", str(edited), "--steps", "20"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"note: the plan predicted {planned:.2f} s for this placement, and the machine replayed here " \
           "(paper-machine-a) gives" in said and "give its profile with --profile FILE" in said
    assert main(["simulate", "--plan", str(edited), "--profile", str(slow), "--steps", "20", "--json"]) == 0
    assert "notes" not in json.loads(capsys.readouterr().out)
    assert main(["simulate", "--plan", str(plan), "--placement", "paper-c"]) == 2
    assert main(["simulate", "--profile", "paper-machine-a", "--placement", "nope"]) == 2


def test_cli_simulate_bounds_the_work_up_front(capsys):
    """A step count whose per-step arrays would not fit is one error line before anything is allocated
    (it used to die in numpy with a 41.7 GiB allocation); a negative seed is one line too."""
    import time

    from moment.cli import main

    t0 = time.perf_counter()
    assert main(["simulate", "--profile", "paper-machine-b", "--placement", "paper-c", "--steps", "100000000"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--steps 100000000: replaying 100,000,000 steps would hold about" in err and "GiB" in err
    assert "at most" in err and time.perf_counter() - t0 < 30
    assert main(["simulate", "--profile", "paper-machine-b", "--placement", "paper-c", "--seed", "-1"]) == 2
    assert "--seed -1: must be 0 or more" in capsys.readouterr().err
    # a machine with several routes per pair solves each step by LP: bounded by a step count too
    net = build_network(load_profile("hgx-a100-8gpu"), WorkloadSpec())
    with pytest.raises(MomentError, match="each step is an LP"):
        synthetic_demands(net, {s.id: 1.0 for s in net.storage}, 20_500, 4096, uniform=True)
