"""The typed model, YAML profiles, overrides, and device placement."""

from __future__ import annotations

import json

import pytest
import yaml

from moment.errors import MomentError
from moment.topology import bandwidth as bw
from moment.topology.devices import Inventory, check_placement, find_model, populate, strip
from moment.topology.model import Kind, Link
from moment.topology.profiles import (
    apply_override,
    builtin_names,
    dump_yaml,
    load_profile,
    topology_from_dict,
)


def small() -> dict:
    return {
        "name": "small",
        "nodes": [
            {"id": "cpu0", "kind": "socket"},
            {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
            {"id": "sw0", "kind": "switch", "parent": "rc0", "link": {"gen": 4, "width": 16}},
            {"id": "s0", "kind": "slot", "parent": "sw0", "link": {"gen": 4, "width": 16}, "blocks": ["s1"]},
            {"id": "s1", "kind": "slot", "parent": "sw0", "link": {"gen": 4, "width": 16}},
            {"id": "b0", "kind": "slot", "parent": "sw0", "width": 4, "accepts": ["ssd"], "link": {"gen": 4, "width": 4}},
        ],
    }


def test_pcie_table_matches_spec_rates():
    # gen3 x16: 8 GT/s * 128/130 / 8 * 16 = 15.75 GB/s raw payload before protocol overhead
    assert bw.pcie_bytes(3, 16) == pytest.approx(15.754e9 * bw.PCIE_PROTOCOL_EFFICIENCY, rel=1e-3)
    assert bw.pcie_bytes(4, 16) == pytest.approx(2 * bw.pcie_bytes(3, 16), rel=1e-9)
    assert bw.pcie_bytes(1, 1) == pytest.approx(0.25e9 * bw.PCIE_PROTOCOL_EFFICIENCY)
    assert bw.pcie_gen_from_gts(16.0) == 4 and bw.pcie_gen_from_gts(2.5) == 1
    with pytest.raises(ValueError):
        bw.pcie_gen_from_gts(3.3)
    assert Link(gen=4, width=16, bandwidth_gbps=20).bandwidth() == 20e9


def test_builtin_profiles_load_and_round_trip():
    names = builtin_names()
    assert {"paper-machine-a", "paper-machine-b"} <= set(names)
    for name in names:
        t = load_profile(name)
        again = topology_from_dict(yaml.safe_load(dump_yaml(t)), name)
        assert again == t


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d["nodes"][2]["link"].update(gen=9), "PCIe generation"),
        (lambda d: d["nodes"][2]["link"].update(bandwidth_gbps=-1), "bandwidth must be positive"),
        (lambda d: d["nodes"][2]["link"].update(bandwidth_gbps=0), "bandwidth must be positive"),
        (lambda d: d["nodes"][3].update(parent="nowhere"), "parent 'nowhere' does not exist"),
        (lambda d: d["nodes"][3].update(parent="cpu0"), "cannot hang under socket"),
        (lambda d: d["nodes"].append({"id": "s0", "kind": "slot", "parent": "sw0", "link": {"gen": 4, "width": 4}}),
         "used twice"),
        (lambda d: d["nodes"][2].pop("link"), "needs a link"),
        (lambda d: d["nodes"][3].update(blocks=["sw0"]), "not a slot"),
        (lambda d: d.update(nodes=[n for n in d["nodes"] if n["kind"] != "socket"]), "at least one socket"),
        (lambda d: d["nodes"][3].update(kind="warpdrive"), "nodes.s0:"),  # a node is named by its id
        # rates are finite, widths are PCIe widths, and nothing is wider than its slot
        (lambda d: d["nodes"][2]["link"].update(bandwidth_gbps=float("inf")),
         "nodes.sw0.link.bandwidth_gbps: Input should be a finite number"),
        (lambda d: d["nodes"][2]["link"].update(bandwidth_gbps=float("nan")), "nodes.sw0.link.bandwidth_gbps"),
        (lambda d: d["nodes"][0].update(memory_bandwidth_gbps=float("inf")), "nodes.cpu0.memory_bandwidth_gbps"),
        (lambda d: d["nodes"][3]["link"].update(width=3), "nodes.s0.link.width: a PCIe width is one of"),
        (lambda d: d["nodes"][5].update(width=3), "nodes.b0.width: a PCIe width is one of"),
        (lambda d: d["nodes"][5]["link"].update(width=8), "slot 'b0': link.width x8 is wider than the slot (width x4)"),
        (lambda d: d["nodes"].append({"id": "ssd9", "kind": "ssd", "parent": "b0", "link": {"gen": 4, "width": 8}}),
         "ssd 'ssd9': link.width x8 is wider than its slot 'b0' (width x4)"),
        (lambda d: d["nodes"].append({"id": "ssd9", "kind": "ssd", "parent": "b0", "read_gbps": float("inf")}),
         "nodes.ssd9.read_gbps: Input should be a finite number"),
        (lambda d: d["nodes"].append({"id": "ssd9", "kind": "ssd", "parent": "b0", "read_gbps": -1}),
         "nodes.ssd9.read_gbps: Input should be greater than 0"),
        (lambda d: d.update(links=[{"a": "s0", "b": "s1", "kind": "nvlink", "gen": 9}]),
         "links.0: NVLink generation must be one of"),
        # a hand-written layout no inventory could use (it was dropped from the comparison without a word)
        (lambda d: d.update(layouts={"usual": {"gpu": ["s0", "s0"]}}),
         "layout 'usual' names slot 's0' twice in its gpu list"),
        (lambda d: d.update(layouts={"usual": {"gpu": ["b0"], "ssd": ["s1"]}}),
         "layout 'usual' puts a gpu in slot 'b0', which accepts only ssd"),
        (lambda d: d.update(layouts={"usual": {"ssd": ["b0", "nowhere"]}}), "layout 'usual' names 'nowhere', which is not a slot"),
    ],
)
def test_bad_profiles_name_the_problem(mutate, needle):
    d = small()
    mutate(d)
    with pytest.raises(MomentError) as e:
        topology_from_dict(d, "bad.yaml")
    assert "bad.yaml" in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("link, says", [
    # hunt-J D1: each was planned as a real path (NVLink to a socket took the GPU round its PCIe 3.0 x4 slot)
    ({"a": "s0", "b": "cpu0", "kind": "nvlink", "count": 12},
     "links[0] (nvlink) joins slot 's0' (accepts gpu, ssd, nic) to socket 'cpu0': an NVLink joins GPUs, slots "
     "that take GPUs (a bridge) and NVSwitches, or a GPU with its socket"),
    ({"a": "s0", "b": "rc0", "kind": "upi", "count": 3, "gts": 16},
     "links[0] (upi) joins slot 's0' (accepts gpu, ssd, nic) to root_complex 'rc0': a UPI link joins two CPU sockets"),
    ({"a": "s0", "b": "b0", "kind": "nvlink"}, "joins slot 's0' (accepts gpu, ssd, nic) to slot 'b0' (accepts ssd)"),
    ({"a": "s0", "b": "sw0", "kind": "nvlink"}, "to switch 'sw0': an NVLink joins"),
    ({"a": "s0", "b": "s1", "kind": "upi"}, "a UPI link joins two CPU sockets"),
    ({"a": "s0", "b": "s1", "kind": "qpi"}, "a QPI link joins two CPU sockets"),
    ({"a": "s0", "b": "s1", "kind": "pcie"}, "a PCIe peer link joins PCIe switches and root complexes"),
    ({"a": "cpu0", "b": "cpu1", "kind": "nvlink"}, "joins socket 'cpu0' to socket 'cpu1': an NVLink joins"),
    ({"a": "b0", "b": "cpu1", "kind": "xgmi"}, "an xGMI link joins two CPU sockets, or GPUs"),
])
def test_a_peer_link_joins_only_what_its_kind_can(link, says):
    d = small()
    d["nodes"] += [{"id": "cpu1", "kind": "socket"}]
    d["links"] = [link, {"a": "cpu0", "b": "cpu1", "kind": "upi"}]
    with pytest.raises(MomentError) as e:
        topology_from_dict(d, "bad.yaml")
    assert str(e.value).startswith("bad.yaml: ") and says in str(e.value)
    # the same link added by --set blames the --set
    d["links"] = d["links"][1:]
    data = yaml.safe_load(dump_yaml(topology_from_dict(d, "x")))
    with pytest.raises(MomentError) as e:
        apply_override(data, f"links+={json.dumps(link)}")
        topology_from_dict(data, "x")
    assert "joins" in str(e.value)


def test_peer_links_of_real_machines_are_kept():
    d = small()
    d["nodes"] += [{"id": "cpu1", "kind": "socket"}, {"id": "rc1", "kind": "root_complex", "parent": "cpu1"},
                   {"id": "g0", "kind": "gpu", "parent": "rc1", "model": "V100", "link": {"gen": 3, "width": 16}},
                   {"id": "g1", "kind": "gpu", "parent": "rc1", "model": "V100", "link": {"gen": 3, "width": 16}},
                   {"id": "nvs", "kind": "nvswitch", "parent": "rc1"},
                   {"id": "sw1", "kind": "switch", "parent": "rc1", "link": {"gen": 4, "width": 16}}]
    d["links"] = [{"a": "cpu0", "b": "cpu1", "kind": "upi"}, {"a": "s0", "b": "s1", "kind": "nvlink"},  # bridge
                  {"a": "g0", "b": "cpu1", "kind": "nvlink", "count": 3},  # POWER9: NVLink to the CPU
                  {"a": "g0", "b": "nvs", "kind": "nvlink"}, {"a": "g1", "b": "g0", "kind": "xgmi"},
                  {"a": "s0", "b": "g1", "kind": "xgmi"}, {"a": "cpu1", "b": "cpu0", "kind": "xgmi"},
                  {"a": "sw0", "b": "sw1", "kind": "pcie"}]
    assert len(topology_from_dict(d, "ok.yaml").links) == 8


def test_gpu_slot_not_connected_to_a_root_complex(tmp_path):
    d = small()
    d["nodes"][2]["parent"] = "cpu0"  # switch hung directly off a socket
    with pytest.raises(MomentError, match="cannot hang under socket"):
        topology_from_dict(d, "x.yaml")


def test_an_override_picks_a_list_element_by_id_before_index():
    """hunt-J D3: slots numbered as the board prints them ('1', '2', ...): `nodes.3` edited nodes[3], slot '2'."""
    d = small()
    for n, new_id in zip(d["nodes"][3:], ("4", "3", "sw.0")):  # nodes[3] is slot '4', nodes[4] slot '3'
        n["id"] = new_id
    d["nodes"][3]["blocks"] = ["3"]
    apply_override(d, "nodes.3.link.gen=1")
    apply_override(d, "nodes[sw.0].link.gen=2")
    apply_override(d, "nodes.'sw.0'.width=8")
    apply_override(d, "nodes.1.label=by index")  # no id '1': the second node
    t = topology_from_dict(d, "x")
    assert t.node("3").link.gen == 1 and t.node("4").link.gen == 4 and t.node("sw.0").link.gen == 2
    assert t.node("sw.0").width == 8 and t.nodes[1].label == "by index"
    apply_override(d, 'nodes."sw.0".link.gen=3')
    assert d["nodes"][5]["link"]["gen"] == 3
    with pytest.raises(MomentError, match=r"""--set 'nodes."sw.0.link.gen=3': the " that opens a segment is never"""):
        apply_override(d, 'nodes."sw.0.link.gen=3')


def test_yaml_errors_name_file_and_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nnodes:\n  - {id: cpu0, kind: socket\n")
    with pytest.raises(MomentError, match=r"broken.yaml: not valid YAML at line \d+"):
        load_profile(str(p))
    with pytest.raises(MomentError, match="file not found"):
        load_profile(str(tmp_path / "missing.yaml"))
    with pytest.raises(MomentError, match="unknown profile 'no-such-machine'"):
        load_profile("no-such-machine")
    p.write_text("- just\n- a list\n")
    with pytest.raises(MomentError, match="YAML mapping"):
        load_profile(str(p))


def test_overrides_by_id_index_and_append():
    d = yaml.safe_load(dump_yaml(load_profile("paper-machine-b")))
    apply_override(d, "nodes.sw1.link.gen=5")
    apply_override(d, "links[0].bandwidth_gbps=40")
    apply_override(d, "links+={a: sw1-x16a, b: sw1-x16b, kind: nvlink, count: 4}")
    t = topology_from_dict(d, "x")
    assert t.node("sw1").link.gen == 5
    assert t.links[0].bandwidth() == 40e9
    assert t.links[1].kind == "nvlink" and t.links[1].bandwidth() == 100e9
    with pytest.raises(MomentError, match="no element with id 'nope'"):
        apply_override(d, "nodes.nope.link.gen=5")
    with pytest.raises(MomentError, match="PATH=VALUE"):
        apply_override(d, "nodes.sw1.link.gen")
    with pytest.raises(MomentError, match="out of range"):
        apply_override(d, "links.7.count=2")


def test_populate_and_strip_round_trip():
    t = topology_from_dict(small(), "small")
    placed = populate(t, {"s0": "A100-PCIe-40GB", "b0": "P5510"})
    assert [g.id for g in placed.of_kind(Kind.gpu)] == ["gpu0"]
    assert placed.node("gpu0").parent == "s0" and placed.node("ssd0").read_gbps == 6.5
    bare, removed = strip(placed)
    assert removed == {"s0": "A100-PCIe-40GB", "b0": "P5510"}
    assert bare == t


def test_placement_rules():
    t = topology_from_dict(small(), "small")
    with pytest.raises(MomentError, match="covers slot 's1'"):
        check_placement(t, {"s0": "A100", "s1": "A100"})
    with pytest.raises(MomentError, match="does not fit slot 'b0'"):
        check_placement(t, {"b0": "A100"})
    with pytest.raises(MomentError, match="not a slot"):
        check_placement(t, {"sw0": "P5510"})
    with pytest.raises(MomentError, match="unknown device model"):
        find_model("GeForce 256")
    check_placement(t, {"s0": "T4", "s1": "T4"})  # single-width cards do not block
    assert Inventory.simple(4, 8).describe() == "4 x A100-PCIe-40GB, 8 x P5510"


def test_unconnected_sockets_are_refused_naming_file_and_fix(tmp_path):
    """Two sockets and no link between them: refused at validation (it was only an LP status later)."""
    p = tmp_path / "nolink.yaml"
    p.write_text("""name: nolink
nodes:
  - {id: cpu0, kind: socket}
  - {id: cpu1, kind: socket}
  - {id: cpu2, kind: socket}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: s0, kind: slot, parent: rc0, width: 16, link: {gen: 4, width: 16}}
links:
  - {a: cpu0, b: cpu1, kind: upi, count: 2}
""")
    with pytest.raises(MomentError, match=r"nolink\.yaml.*sockets cpu0, cpu1 and cpu2 are not connected.*"
                                          r"add a `links:` entry such as \{a: cpu1, b: cpu2, kind: upi"):
        load_profile(str(p))
    p.write_text(p.read_text() + "  - {a: cpu2, b: cpu0, kind: upi, count: 2}\n")
    assert len(load_profile(str(p)).links) == 2


def test_a_slot_that_blocks_itself_is_refused_naming_it(tmp_path):
    """It counted as taken by itself, and the plan then said no slot was wide enough."""
    p = tmp_path / "blk.yaml"
    p.write_text("""name: n
nodes:
  - {id: cpu0, kind: socket}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: s0, kind: slot, parent: rc0, width: 16, blocks: [s0], link: {gen: 4, width: 16}}
""")
    with pytest.raises(MomentError, match=r"blk\.yaml.*slot 's0' blocks itself"):
        load_profile(str(p))


def test_a_model_listed_twice_is_described_once(capsys):
    """`--inventory 2xA100,2xA100` plans 4 A100s (the search merges the lines); the plan says so."""
    from moment.cli import main

    inv = Inventory(items=[{"model": "A100-PCIe-40GB", "count": 2}, {"model": "P5510", "count": 4},
                           {"model": "A100", "count": 2}])
    assert inv.describe() == "4 x A100-PCIe-40GB, 4 x P5510"
    assert main(["plan", "-p", "paper-machine-b", "--inventory", "2xA100,2xA100,4xP5510", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inventory"] == "4 x A100-PCIe-40GB, 4 x P5510"


def test_a_truth_value_is_never_read_as_a_number(capsys):
    """`--set nodes.sw0.link.bandwidth_gbps=true` planned the switch's uplink at 1 GB/s (pydantic takes a bool for a
    number): every number field of a profile refuses one, naming the field; the numbers themselves still read."""
    from moment.cli import main

    base = ["plan", "--profile", "paper-machine-b", "--gpus", "2", "--ssds", "2"]
    for spec, said in (("nodes.sw0.link.bandwidth_gbps=true", "nodes.sw0.link: bandwidth_gbps: true is a truth "
                        "value, not a number"), ("nodes.cpu0.memory_gib=false", "memory_gib: false is a truth value")):
        assert main([*base, "--set", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --set {spec}: ") and said in err and "Traceback" not in err, err
    assert main([*base, "--set", "nodes.sw0.link.bandwidth_gbps=20"]) == 0
    for bad in ({"gen": True}, {"width": False}, {"bandwidth_gbps": True}):
        (name, value), = bad.items()
        with pytest.raises(ValueError, match=f"{name}: {str(value).lower()} is a truth value, not a number"):
            Link(**bad)
