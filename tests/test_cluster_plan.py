"""`moment plan --cluster`: the cluster file's checks, where NICs go, and the epoch's network part."""

from __future__ import annotations

import json

import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.planner.cluster import ClusterPlan, plan_cluster
from moment.planner.plan import make_plan
from moment.topology.cluster import cluster_from_dict, load_cluster
from moment.topology.devices import Inventory
from moment.topology.model import Link
from moment.topology.profiles import load_profile, topology_from_dict
from moment.workload.spec import WorkloadSpec

TWO_B = """name: two-b
servers:
  - {name: b, profile: paper-machine-b, inventory: '4xA100-PCIe-40GB,8xP5510', count: 2}
network: {nic: CX6-Dx-100GbE, switch_gbit: 100}
"""
GB = 1e9


@pytest.fixture(scope="module")
def two_b(tmp_path_factory) -> tuple[ClusterPlan, dict]:
    """Two paper-machine-b servers with one 100 GbE NIC each, through the CLI's JSON."""
    path = tmp_path_factory.mktemp("cluster") / "two-b.yaml"
    path.write_text(TWO_B)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", "--cluster", str(path), "--json"]) == 0
    data = json.loads(buf.getvalue())
    return ClusterPlan.model_validate(data), data


def test_two_machine_b_servers_nic_beside_a_gpu_and_the_network_added(two_b):
    cp, _ = two_b
    wl = WorkloadSpec()
    assert [m.name for m in cp.machines] == ["b0", "b1"] and cp.gpus == 8
    assert cp.remote_fraction == 0.5 and cp.remote_fraction_source == "even split (N-1)/N"
    per_gpu = wl.epoch_bytes() / 8
    assert cp.bytes_per_gpu_per_epoch == pytest.approx(per_gpu)
    for m in cp.machines:
        # each machine's GPUs and SSDs are the single-server plan for its GPUs' share of the epoch
        alone = make_plan(load_profile("paper-machine-b"), Inventory.simple(4, 8),
                          wl.model_copy(update={"bytes_per_gpu_per_epoch": per_gpu}))
        assert {s: d for s, d in m.placement.items() if d != "CX6-Dx-100GbE"} == alone.placement
        assert m.read_s == pytest.approx(alone.predicted.epoch_read_s)
        # the one NIC goes in the free x16 slot under the PCIe switch that holds a GPU: a GPUDirect path
        (nic,) = m.nics
        switch_gpus = [g for g, s in ((m.devices[s], s) for s in m.placement) if g.startswith("gpu")
                       and s.startswith("sw0-")]
        assert nic.slot.startswith("sw0-") and nic.gdr_gpus == switch_gpus and m.gdr_paths == len(switch_gpus) == 1
        assert nic.gpus == ["gpu0", "gpu1", "gpu2", "gpu3"]
        assert {m.gpu_paths[g] for g in nic.gpus} == {"switch", "cpu", "sockets"}
        # 100 GbE: 12.5 GB/s; half the SSD-served bytes of 4 GPUs come in through it
        assert nic.rate_gbps == pytest.approx(12.5)
        remote = 4 * per_gpu * wl.ssd_share * 0.5
        assert m.remote_feature_gb == pytest.approx(remote / GB)
        assert m.remote_feature_s == pytest.approx(remote / 12.5e9)
        # ring all-reduce of a 2-layer GraphSAGE (1024 -> 256 -> 19) over two machines, one NIC each
        params = 2 * 1024 * 256 + 256 + 2 * 256 * 19 + 19
        steps = -(-269_000_000 * 0.01 // 8 // 8000)
        assert cp.steps_per_epoch == steps
        assert m.allreduce_s == pytest.approx(steps * 2 * (1 / 2) * 4 * params / 12.5e9)
        assert m.epoch_s == pytest.approx(m.read_s + m.remote_feature_s + m.allreduce_s)
        assert m.network_share == pytest.approx((m.remote_feature_s + m.allreduce_s) / m.epoch_s)
    assert cp.epoch_s == pytest.approx(max(m.epoch_s for m in cp.machines))


def test_cluster_plan_prints_the_machines_and_the_network_share(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(TWO_B)
    assert main(["plan", "--cluster", str(path), "--diagram", str(tmp_path / "p.svg")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "b0, b1 (each) (paper-machine-b)" in out  # equal machines: one block
    assert "nic0 CX6-Dx-100GbE" in out and "GPUDirect RDMA (same PCIe switch): gpu1" in out
    assert "network" in out and "cluster epoch:" in out
    for name in ("b0", "b1"):
        svg = (tmp_path / f"p-{name}.svg").read_text()
        assert "CX6-Dx-100GbE" in svg
    # a picture that cannot be written stops the command before the first is: none of them is left
    (tmp_path / "q-b1.svg").mkdir()
    assert main(["plan", "--cluster", str(path), "--diagram", str(tmp_path / "q.svg")]) == 2
    assert "q-b1.svg" in capsys.readouterr().err and not (tmp_path / "q-b0.svg").exists()


#: a chassis where the GPUs sit under two switches and a NIC could also go on the root complex
SWITCHED = {
    "name": "switched", "nodes": [
        {"id": "cpu0", "kind": "socket"}, {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "rc0-x16", "kind": "slot", "parent": "rc0", "width": 16, "accepts": ["nic"], "link": {"gen": 4, "width": 16}},
        {"id": "rc0-x4", "kind": "slot", "parent": "rc0", "width": 16, "accepts": ["nic"], "link": {"gen": 3, "width": 4}},
        *[{"id": f"bay{k}", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"],
           "link": {"gen": 4, "width": 4}} for k in (0, 1)],
        *[n for k in (0, 1) for n in (
            {"id": f"sw{k}", "kind": "switch", "parent": "rc0", "link": {"gen": 4, "width": 16}},
            *[{"id": f"sw{k}-{c}", "kind": "slot", "parent": f"sw{k}", "width": 16, "accepts": ["gpu", "nic"],
               "link": {"gen": 4, "width": 16}} for c in "abc"])],
    ]}


def _spec(nics: int, nic: str = "CX6-HDR-200", **extra) -> object:
    return cluster_from_dict({"servers": [{"profile": "switched.yaml", "inventory": "4xA100,2xP5510", "nics": nics, "count": 2}],
                              "network": {"nic": nic, "switch_gbit": 200}, **extra}, "c.yaml")


def _load(_name: str):
    return topology_from_dict(SWITCHED, "switched.yaml")


def test_nics_go_under_the_switches_of_the_gpus_they_serve():
    cp = plan_cluster(_spec(2), load=_load)
    m = cp.machines[0]
    gpu_switch = {m.devices[s]: s.split("-")[0] for s in m.placement if m.devices[s].startswith("gpu")}
    assert sorted(gpu_switch.values()) == ["sw0", "sw0", "sw1", "sw1"]
    nic_switch = {n.nic: n.slot.split("-")[0] for n in m.nics}
    assert sorted(nic_switch.values()) == ["sw0", "sw1"]
    # each GPU uses the NIC under its own switch: four GPUDirect RDMA paths, two GPUs per NIC
    assert m.gdr_paths == 4 and set(m.gpu_paths.values()) == {"switch"}
    for n in m.nics:
        assert len(n.gpus) == 2 and n.gdr_gpus == n.gpus
        assert {gpu_switch[g] for g in n.gpus} == {nic_switch[n.nic]}


def test_a_nic_in_a_narrow_slot_runs_at_its_pcie_link():
    # six GPUs fill the switches; the two NICs are left the root's slots, one of them wired x4:
    # 3.4 GB/s there, not the NIC's 25, and the GPUs are spread so that it sets the pace
    spec = cluster_from_dict({"servers": [{"profile": "s.yaml", "inventory": "6xA100,2xP5510", "nics": 2,
                                           "count": 2}],
                              "network": {"nic": "CX6-HDR-200", "switch_gbit": 200}}, "c.yaml")
    m = plan_cluster(spec, load=_load).machines[0]
    narrow = next(n for n in m.nics if n.slot == "rc0-x4")
    assert narrow.rate_gbps == pytest.approx(Link(gen=3, width=4).bandwidth() / 1e9)
    assert [n.rate_gbps for n in m.nics if n is not narrow] == [pytest.approx(25.0)]
    assert len(narrow.gpus) == 3 and m.remote_feature_s == pytest.approx(narrow.inbound_gb / narrow.rate_gbps)


def test_remote_fraction_and_model_size_are_inputs():
    base = plan_cluster(_spec(1), load=_load)
    none = plan_cluster(_spec(1, remote_fraction=0.0, model_mb=100), load=_load)
    assert none.remote_fraction_source == "cluster file" and none.machines[0].remote_feature_s == 0
    assert none.model_bytes == 100e6 and none.machines[0].allreduce_s == pytest.approx(
        none.steps_per_epoch * 1.0 * 100e6 / 25e9)
    flag = plan_cluster(_spec(1, remote_fraction=0.0), load=_load, remote_fraction=1.0)
    assert flag.remote_fraction == 1.0 and flag.remote_fraction_source == "--remote-fraction"
    assert flag.machines[0].remote_feature_s == pytest.approx(2 * base.machines[0].remote_feature_s)


def test_one_machine_has_no_network_part():
    spec = cluster_from_dict({"servers": [{"profile": "s.yaml", "inventory": "4xA100,2xP5510"}],
                              "network": {"nic": "CX7", "switch_gbit": 400}}, "c.yaml")
    m = plan_cluster(spec, load=_load).machines[0]
    assert m.network_s == 0 and m.epoch_s == m.read_s


BAD = [
    ("[]", "a cluster file must be a YAML mapping"),
    ("network: {nic: CX7, switch_gbit: 100}", "servers: Field required"),
    ("servers: []\nnetwork: {nic: CX7, switch_gbit: 100}", "servers: List should have at least 1 item"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100}]\nnetwork: {nic: FOO, switch_gbit: 100}",
     "network.nic: unknown device model 'FOO'"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100}]\nnetwork: {nic: P5510, switch_gbit: 100}",
     "network.nic: P5510 is an SSD, not a NIC"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100}]\nnetwork: {nic: CX7, ports: 2, switch_gbit: 100}",
     "network.ports 2: CX7 has 1 port"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100}]\nnetwork: {nic: CX7, switch_gbit: 0}",
     "network.switch_gbit: 0.0 is out of range: above 0, at most 3200 Gb/s"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100, gpus: 2}]\nnetwork: {nic: CX7, switch_gbit: 100}",
     "servers[0].gpus: Extra inputs are not permitted"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100, nics: 0}]\nnetwork: {nic: CX7, switch_gbit: 100}",
     "servers[0].nics: 0 is out of range: from 1 to 16 NICs"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100}]\nnetwork: {nic: CX7, switch_gbit: 100}\n"
     "remote_fraction: 1.5", "remote_fraction: 1.5 is out of range: from 0 to 1"),
    ("servers: [{name: a, profile: paper-machine-b, inventory: 4xA100}, {name: a, profile: paper-machine-b, "
     "inventory: 4xA100}]\nnetwork: {nic: CX7, switch_gbit: 100}", "two machines are named 'a'"),
]


@pytest.mark.parametrize("text, want", BAD, ids=[w for _, w in BAD])
def test_a_bad_cluster_file_names_the_field(text, want, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(MomentError) as e:
        load_cluster(path)
    assert want in str(e.value) and str(e.value).startswith(str(path))


PLAN_BAD = [
    ("servers: [{profile: nope, inventory: 4xA100}]", "servers[0].profile: unknown profile 'nope'"),
    ("servers: [{profile: paper-machine-b, inventory: 4xA100}, {profile: paper-machine-b, inventory: fourA100}]",
     "servers[1].inventory 'fourA100': expected COUNTxMODEL"),
    ("servers: [{profile: paper-machine-b, inventory: '4xA100,1xCX7'}]", "servers[0].inventory '4xA100,1xCX7': "
     "list GPUs and SSDs only"),
    ("servers: [{profile: paper-machine-b, inventory: '6xA100,8xP5510', nics: 4}]",
     "servers[0].nics: 4 x CX7 do not fit: 'paper-machine-b' has 2 free slots"),
    ("servers: [{profile: paper-machine-b, inventory: 40xA100}]", "servers[0] (paper-machine-b, 40xA100): 40 x"),
    ("servers: [{profile: paper-machine-b, inventory: 8xP5510}]", "the cluster has no GPU"),
]


@pytest.mark.parametrize("servers, want", PLAN_BAD, ids=[w for _, w in PLAN_BAD])
def test_cli_names_the_server_that_cannot_be_planned(servers, want, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(servers + "\nnetwork: {nic: CX7, switch_gbit: 100}\n")
    assert main(["plan", "--cluster", str(path)]) == 2
    cap = capsys.readouterr()
    err = " ".join(cap.err.split())
    assert err.startswith("error: ") and want in err and "Traceback" not in err and not cap.out


@pytest.mark.parametrize("argv, want", [
    (["--gpus", "3"], "--cluster: the cluster file names each server's profile and inventory, so --gpus would be"),
    (["--profile", "dgx2", "--set", "x=1"], "so --profile, --set would be ignored"),
    (["--remote-fraction", "1.5"], "--remote-fraction 1.5: a share of the rows, from 0 to 1"),
    (["--maxflow-backend", "networkx", "--replay"], "so --replay, --maxflow-backend would be ignored"),
])
def test_cli_refuses_options_the_cluster_file_makes_meaningless(argv, want, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(TWO_B)
    assert main(["plan", "--cluster", str(path), *argv]) == 2
    assert want in " ".join(capsys.readouterr().err.split())


def test_remote_fraction_needs_a_cluster(capsys):
    assert main(["plan", "--remote-fraction", "0.5"]) == 2
    assert "--remote-fraction: only with --cluster" in capsys.readouterr().err


def test_a_cluster_file_given_as_a_profile_is_named(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(TWO_B)
    assert main(["plan", "--profile", str(path)]) == 2
    assert "this is a cluster file" in capsys.readouterr().err


def test_the_switch_port_rate_caps_a_faster_nic():
    spec = cluster_from_dict({"servers": [{"profile": "s.yaml", "inventory": "4xA100,2xP5510", "count": 2}],
                              "network": {"nic": "CX7", "switch_gbit": 100}}, "c.yaml")
    (nic,) = plan_cluster(spec, load=_load).machines[0].nics
    assert nic.rate_gbps == pytest.approx(12.5)


def test_a_plan_that_takes_every_nic_slot_holds_one_for_the_nic_first():
    """7 x T4 + 10 x 990-PRO on paper-machine-b: the plan alone puts SSDs in the x16 slots the GPUs leave,
    so no slot is left for the NIC; the cluster plan holds one for it and plans the rest around it."""
    from moment.planner.api import parse_inventory
    from moment.topology.devices import find_model, fits, populate, strip

    topo, inv = load_profile("paper-machine-b"), parse_inventory("7xT4,10x990-PRO", 0, 0)
    alone = make_plan(topo, inv, WorkloadSpec())
    nic = find_model("CX6-Dx-100GbE")
    assert not [s for s in populate(strip(topo)[0], alone.placement).empty_slots() if fits(s, nic)]
    cp = plan_cluster(cluster_from_dict({"servers": [{"profile": "paper-machine-b", "inventory": "7xT4,10x990-PRO",
                                                      "count": 2}],
                                         "network": {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}}, "c.yaml"))
    m = cp.machines[0]
    models = sorted(m.placement.values())
    assert models.count("T4") == 7 and models.count("990-PRO") == 10 and models.count("CX6-Dx-100GbE") == 1
    (n,) = m.nics
    assert fits(topo.node(n.slot), nic) and len(n.gpus) == 7 and cp.epoch_s > m.read_s > 0
