"""Every number of a cluster file has a physical bound, equal servers are planned once,
machine names are checked in one place, and the messages name the real cause."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.topology.cluster import MAX_MACHINES, cluster_from_dict

SERVER = {"profile": "paper-machine-b", "inventory": "4xA100-PCIe-40GB,8xP5510"}
NET = {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}


def spec(servers=None, **top) -> dict:
    return {"servers": servers or [dict(SERVER)], "network": dict(NET), **top}


def refused(data: dict) -> str:
    with pytest.raises(MomentError) as e:
        cluster_from_dict(data, "c.yaml")
    return str(e.value)


@pytest.mark.parametrize("count", [10**20, int("9" * 400), MAX_MACHINES + 1])
def test_a_count_past_the_bound_is_refused_before_any_work(count):
    t0 = time.monotonic()
    msg = refused(spec([{**SERVER, "count": count}]))
    assert "servers[0].count" in msg and f"{MAX_MACHINES}" in msg.replace(",", "")
    assert time.monotonic() - t0 < 1


def test_the_machines_of_all_entries_together_are_bounded():
    half = MAX_MACHINES // 2 + 1
    msg = refused(spec([{**SERVER, "name": "a", "count": half}, {**SERVER, "name": "b", "count": half}]))
    assert f"{2 * half}" in msg.replace(",", "") and f"{MAX_MACHINES}" in msg.replace(",", "")


@pytest.mark.parametrize("field,value,where", [
    ("model_mb", 1e300, "model_mb"), ("remote_fraction", 2.0, "remote_fraction"),
])
def test_physical_quantities_have_physical_ranges(field, value, where):
    msg = refused(spec(**{field: value}))
    assert where in msg and "is out of range:" in msg and "\n" not in msg.split("  hint:")[0].strip()


def test_switch_rate_and_nics_have_ranges():
    assert "network.switch_gbit" in refused({"servers": [SERVER], "network": {**NET, "switch_gbit": 1e300}})
    assert "servers[0].nics" in refused(spec([{**SERVER, "nics": 10**20}]))


@pytest.mark.parametrize("field", ["count", "nics"])
def test_a_boolean_is_not_an_integer(field):
    assert f"servers[0].{field}" in refused(spec([{**SERVER, field: True}]))
    assert "network.ports" in refused({"servers": [SERVER], "network": {**NET, "ports": True}})


def test_expanded_machine_names_must_be_unique():
    msg = refused(spec([{**SERVER, "name": "b", "count": 2}, {**SERVER, "name": "b0"}]))
    assert "'b0'" in msg and "two machines" in msg


def test_a_long_name_is_refused_for_its_length():
    msg = refused(spec([{**SERVER, "name": "x" * 400}]))
    assert "400 characters" in msg and "64" in msg and "use letters" not in msg


def test_place_and_plan_ask_the_same_name_check():
    from moment.placement import split

    with pytest.raises(MomentError, match="two machines are named 'b0'"):
        split.check_names(["b0", "b1", "b0"])
    with pytest.raises(MomentError, match="400 characters"):
        split.check_names(["x" * 400])


@pytest.mark.parametrize("name", ["owners.npy", "cluster.json", "Owners.NPY"])
def test_a_machine_may_not_take_the_name_of_a_splits_own_file(name, tmp_path):
    """hunt-K D11: a server named `owners.npy` (or `cluster.json`) passed the cluster file's check, and `place
    --cluster` then said "Q.partial/owners.npy: layout already exists / pass --overwrite" (with --overwrite too):
    its layout directory would take the split's own file's place. The one name check refuses it, for plan and
    place alike, naming the cluster file and the machine."""
    from moment.placement import split

    msg = refused(spec([{**SERVER, "name": name}, {**SERVER, "name": "m0"}]))
    assert msg.startswith(f"c.yaml: invalid cluster file: machine name {name!r}: a split layout keeps its own "
                          f"{name.lower()}"), msg
    with pytest.raises(MomentError, match="no machine may take that name"):
        split.check_names(["m0", name])
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(spec([{**SERVER, "name": name}, {**SERVER, "name": "m0"}])))
    for argv in (["plan", "--cluster", path], ["place", "--dataset", tmp_path / "ds", "--cluster", path,
                                                "--out", tmp_path / "Q", "--overwrite"]):
        code, text = _cli([str(a) for a in argv])
        assert code == 2 and f"{path}: invalid cluster file: machine name {name!r}" in text, text
        assert "partial" not in text and "Traceback" not in text
    assert not (tmp_path / "Q").exists() and not (tmp_path / "Q.partial").exists()


def _cli(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue() + err.getvalue()


def test_the_calibration_hint_is_true(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(spec()))
    code, text = _cli(["plan", "--cluster", str(path), "--calibration", "x.yaml"])
    assert code != 0 and "--calibration" in text
    assert "put them in the cluster file" not in text


def test_equal_servers_are_planned_once_and_printed_per_kind(tmp_path, monkeypatch):
    import moment.planner.plan as plan_mod

    calls = []
    real = plan_mod.make_plan
    monkeypatch.setattr(plan_mod, "make_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(spec([{**SERVER, "name": "b", "count": 200}])))
    t0 = time.monotonic()
    code, text = _cli(["plan", "--cluster", str(path)])
    assert code == 0, text
    assert len(calls) == 1 and time.monotonic() - t0 < 30
    assert "b0 ... b199" in text and len(text.splitlines()) < 60
