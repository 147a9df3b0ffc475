"""Calibration: applying parameters, recovering known ones from noisy synthetic measurements, files, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from moment.cli import main
from moment.errors import MomentError
from moment.planner.calibration import (
    Measurement,
    MeasurementFile,
    Model,
    apply_calibration,
    calibrate,
    load_calibration,
    load_measurements,
)
from moment.topology.bandwidth import GB
from moment.topology.devices import Inventory
from moment.topology.profiles import load_profile

INV = Inventory.simple(4, 8, "A100-PCIe-40GB", "P5510")
LAYOUTS = ["paper-a", "paper-b", "paper-c", "paper-d"]


def test_apply_scales_link_classes_only():
    topo = load_profile("paper-machine-a")
    cal = apply_calibration(topo, {"switch_uplink": 0.5, "socket_link": 0.25, "rc_port": 0.8, "ssd_read": 0.9})
    assert cal.node("sw0").link.bandwidth() == pytest.approx(0.5 * topo.node("sw0").link.bandwidth())
    assert cal.node("rc0-bay0").link.bandwidth() == pytest.approx(0.8 * topo.node("rc0-bay0").link.bandwidth())
    assert cal.node("sw0-x16a").link.bandwidth() == topo.node("sw0-x16a").link.bandwidth()  # switch_port = 1
    assert cal.links[0].bandwidth() == pytest.approx(0.25 * 20 * GB)
    assert cal.ssd_read_scale == 0.9
    assert apply_calibration(topo, {}).model_dump() == topo.model_dump()


def _synthetic(truth: dict, noise: float, seed: int = 0) -> MeasurementFile:
    ms = [Measurement(layout=name, epoch_s=1.0) for name in LAYOUTS]
    model = Model(load_profile("paper-machine-a"), INV, ms, data="even")
    rng = np.random.default_rng(seed)
    y = model.predict(truth) * (1 + noise * rng.standard_normal(len(ms)))
    return MeasurementFile(machine="paper-machine-a", gpus=4, ssds=8, data="even",
                           measurements=[Measurement(layout=n, epoch_s=float(v)) for n, v in zip(LAYOUTS, y)])


def test_recovers_known_parameters_from_noisy_measurements():
    truth = {"socket_link": 0.55, "switch_uplink": 0.8, "overhead_s": 3.0}
    mf = _synthetic(truth, noise=0.005, seed=1)
    cal = calibrate(load_profile("paper-machine-a"), INV, mf, ["socket_link", "switch_uplink", "overhead_s"],
                    loo=False)
    assert cal.params["socket_link"] == pytest.approx(0.55, abs=0.03)
    assert cal.params["switch_uplink"] == pytest.approx(0.8, abs=0.05)
    assert cal.params["overhead_s"] == pytest.approx(3.0, abs=1.0)
    assert max(abs(r.rel_err) for r in cal.residuals) < 0.02
    # untouched parameters keep their defaults
    assert cal.params["rc_port"] == 1.0 and cal.params["ssd_read"] == 1.0


def test_device_measurement_fits_ssd_read():
    mf = MeasurementFile(machine="paper-machine-a", gpus=4, ssds=8,
                         measurements=[Measurement(device="ssd0", read_gbps=5.2),
                                       Measurement(device="ssd1", read_gbps=5.2)])
    cal = calibrate(load_profile("paper-machine-a"), INV, mf, ["ssd_read"])
    assert cal.params["ssd_read"] == pytest.approx(5.2 / 6.5, rel=1e-4)
    assert cal.loo_max_rel_err == pytest.approx(0.0, abs=1e-4)
    # the residuals' figures are rates here, and say so (their field names say seconds, for older files' sake)
    assert [(r.unit, round(r.measured_s, 6)) for r in cal.residuals] == [("GB/s", 5.2), ("GB/s", 5.2)]


def test_duplicates_and_too_few_distinct_measurements_are_refused():
    """A fit must be testable: every measurement says something new, and there is at least one more
    of them than parameters (a layout listed four times fitted 3 parameters with a LOO error of 0.0%)."""
    topo = load_profile("paper-machine-a")
    fit3 = ["switch_uplink", "socket_link", "overhead_s"]
    four_times = MeasurementFile(measurements=[Measurement(layout="paper-a", epoch_s=15.9 + i) for i in range(4)])
    with pytest.raises(MomentError, match=r"measurements #1 \(paper-a\), #2 \(paper-a\), #3 \(paper-a\), "
                                          r"#4 \(paper-a\) measure the same layout"):
        calibrate(topo, INV, four_times, fit3)
    # paper-a again, with its GPUs in the other two x16 slots of each switch: alike by symmetry
    mirrored = MeasurementFile(measurements=[
        Measurement(layout="paper-a", epoch_s=15.9), Measurement(layout="paper-c", epoch_s=14.9),
        Measurement(gpu=["sw0-x16c", "sw1-x16c", "sw0-x16d", "sw1-x16d"], ssd=topo.layouts["paper-a"].ssd,
                    epoch_s=16.0),
        Measurement(layout="paper-d", epoch_s=24.1)])
    with pytest.raises(MomentError, match=r"#1 \(paper-a\), #3 \(gpu=sw0-x16c.*\) measure the same layout"):
        calibrate(topo, INV, mirrored, fit3)
    reads = MeasurementFile(measurements=[Measurement(device="ssd0", read_gbps=5.2),
                                          Measurement(device="ssd0", read_gbps=5.3)])
    with pytest.raises(MomentError, match="measure the same device's read rate"):
        calibrate(topo, INV, reads, ["ssd_read"])
    three = MeasurementFile(measurements=[Measurement(layout=n, epoch_s=v)
                                          for n, v in zip(LAYOUTS, (15.9, 26.7, 14.9))])
    with pytest.raises(MomentError, match="3 distinct epoch measurements cannot test a fit of 3 parameters"):
        calibrate(topo, INV, three, fit3)
    assert calibrate(topo, INV, three, ["socket_link", "overhead_s"]).loo_max_rel_err is not None


def test_bad_inputs_name_the_input(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("machine: paper-machine-a\nmeasurements:\n  - {layout: paper-a}\n")
    with pytest.raises(MomentError, match="m.yaml: not a measurement file"):
        load_measurements(bad)
    mf = MeasurementFile(measurements=[Measurement(layout="nope", epoch_s=3.0)])
    with pytest.raises(MomentError, match="layout 'nope' is not in profile"):
        calibrate(load_profile("paper-machine-a"), INV, mf, ["overhead_s"])
    with pytest.raises(MomentError, match="unknown parameter"):
        calibrate(load_profile("paper-machine-a"), INV, mf, ["warp_drive"])
    cal = tmp_path / "c.yaml"
    cal.write_text("fitted_on: x\nfitted: []\nparams: {socket_link: 3.0}\n")
    with pytest.raises(MomentError, match="outside its bounds"):
        load_calibration(cal)


@pytest.mark.slow
def test_cli_calibrate_then_plan_applies_it(tmp_path, capsys):
    mf = _synthetic({"socket_link": 0.5, "overhead_s": 2.0}, noise=0.0)
    m = tmp_path / "m.yaml"
    m.write_text(yaml.safe_dump(mf.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--measured", str(m), "--fit", "socket_link,overhead_s", "--out", str(out),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) >= {"params", "residuals", "loo_max_rel_err"}
    assert {"layout", "measured_s", "predicted_s"} <= set(got["residuals"][0]) and got["residuals"][0]["unit"] == "s"
    assert got["params"]["socket_link"] == pytest.approx(0.5, abs=0.01)
    assert main(["plan", "--profile", "paper-machine-a", "--gpus", "4", "--ssds", "8", "--calibration", str(out),
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["calibration"]["file"] == str(out)
    assert plan["calibration"]["params"]["socket_link"] == pytest.approx(0.5, abs=0.01)
    # the baselines are predicted on the calibrated machine: paper-d crosses the slowed socket link
    d = next(b for b in plan["baselines"] if b["name"] == "paper-d")
    assert d["predicted"]["epoch_read_s"] > 12.4 * 1.2
    assert plan["calibration"]["predicted_epoch_s"]["paper-d"] == pytest.approx(
        d["predicted"]["epoch_read_s"] + plan["calibration"]["params"]["overhead_s"])
    assert plan["calibration"]["fitted_on"] == "paper-machine-a" and not plan["calibration"]["other_machine"]
    # applied to another machine, the plan says so (in words and in the JSON)
    assert main(["plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--calibration", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "fitted on paper-machine-a" in text and "by link class only" in text
    assert main(["plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--calibration", str(out),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["other_machine"] is True


def test_calibrate_fits_the_default_parameters_its_help_names(capsys):
    """Without --fit, the CLI fits calibration.DEFAULT_FIT, and its --help says which ones."""
    import re

    from moment.planner.calibration import DEFAULT_FIT

    assert main(["calibrate", "--measured", "tests/data/paper-machine-b-measured.yaml", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fitted"] == list(DEFAULT_FIT)
    assert got["loo_max_rel_err"] <= 0.15  # the paper's machine B under the default fit
    assert main(["calibrate", "--help"]) == 0
    assert f"(default:{','.join(DEFAULT_FIT)}whereameasurementdependsonthem" in re.sub(
        r"[\s│]", "", capsys.readouterr().out)


def test_calibrate_profile_is_a_machine_by_its_name_not_its_path(tmp_path, capsys):
    """--profile FILE names the machine its `name:` says: a copy of the measured machine's profile fits as the
    built-in does (it was refused, its path compared with the file's machine), and another machine's
    profile is refused by that machine's name."""
    measured = "tests/data/paper-machine-b-measured.yaml"
    assert main(["calibrate", "--measured", measured, "--json"]) == 0
    builtin = json.loads(capsys.readouterr().out)
    for name in ("paper-machine-b", "paper-machine-a"):
        assert main(["export", "--profile", name, "--out", str(tmp_path / f"{name}.yaml")]) == 0
    assert main(["calibrate", "--measured", measured, "--profile", str(tmp_path / "paper-machine-b.yaml"),
                 "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["params"] == builtin["params"]
    assert main(["calibrate", "--measured", measured, "--profile", str(tmp_path / "paper-machine-a.yaml")]) == 2
    assert "the measurements are of 'paper-machine-b', not 'paper-machine-a'" in capsys.readouterr().err


def _measured(tmp_path, times: tuple[float, float, float]):
    m = tmp_path / "m.yaml"
    m.write_text("machine: paper-machine-a\ngpus: 4\nssds: 8\nmeasurements:\n" + "".join(
        f"  - {{layout: {lay}, epoch_s: {t}}}\n" for lay, t in zip(("paper-a", "paper-b", "paper-c"), times)))
    return m


def test_measurements_no_calibration_can_reach_are_refused(tmp_path, capsys):
    """Epochs 20-40x faster than the machine at its book rates (milliseconds read as seconds, or a step
    for an epoch): refused naming the file, each measurement and the likely cause; nothing written.
    (A fit to them sat on its bounds, the book rates, with residuals of +2000%, and was written.)"""
    m, out = _measured(tmp_path, (0.5, 0.6, 0.55)), tmp_path / "cal.yaml"
    assert main(["calibrate", "--measured", str(m), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {m}: 3 of the 3 measurements are more than 2x faster than paper-machine-a" in err
    assert "paper-a 0.5 s measured, at best 13 s (26x)" in err
    assert "milliseconds" in err and "one training step" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize("value, field", [(".inf", "epoch_s"), (".nan", "epoch_s"), ("-.inf", "epoch_s")])
def test_a_measurement_that_is_no_number_is_refused_by_name(tmp_path, capsys, value, field):
    """hunt-J D9: `epoch_s: .inf` ended in an AssertionError traceback from the fit (.nan: 'greater than 0')."""
    m, out = _measured(tmp_path, (value, 20, 9.5)), tmp_path / "cal.yaml"
    assert main(["calibrate", "--measured", str(m), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {m}: not a measurement file: measurements.0.{field}: Input should be a finite number" in err
    assert "Traceback" not in err and not out.exists()
    m.write_text(m.read_text().replace(f"{{layout: paper-a, epoch_s: {value}}}", f"{{device: ssd0, read_gbps: {value}}}"))
    assert main(["calibrate", "--measured", str(m), "--out", str(out)]) == 2
    assert "measurements.0.read_gbps: Input should be a finite number" in " ".join(capsys.readouterr().err.split())


def test_a_measurement_far_slower_than_the_model_can_be_is_noted(tmp_path, capsys, monkeypatch):
    """hunt-J D9: `epoch_s: 1e300` was fitted without a word (residual -100%), printed as a 300-digit number."""
    monkeypatch.setenv("COLUMNS", "200")
    m, out = _measured(tmp_path, (1e300, 20, 9.5)), tmp_path / "cal.yaml"
    assert main(["calibrate", "--measured", str(m), "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("note: 1 of the 3 measurements are more than 2x slower than paper-machine-a can be with every parameter "
            "at its slow bound (paper-a 1e+300 s measured, at worst ") in text and "a time not in seconds" in text
    assert "│ paper-a │ 1e+300 s │" in text and "0" * 20 not in text
    m, out = _measured(tmp_path, (13, 20, 9.5)), tmp_path / "cal.yaml"  # within reach: no such note
    assert main(["calibrate", "--measured", str(m), "--json"]) == 0
    assert not any("slower than" in n for n in json.loads(capsys.readouterr().out)["notes"])


def test_a_fit_resting_on_its_bounds_and_still_slow_says_so(tmp_path, capsys):
    """20-30% faster than the model can be: the fit is written (it is the best there is), with a note."""
    m, out = _measured(tmp_path, (10, 20, 9.5)), tmp_path / "cal.yaml"
    assert main(["calibrate", "--measured", str(m), "--out", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "note: the fit stops at the bound of switch_uplink = 1, socket_link = 1 and still predicts paper-a +30%" \
        in text and "leave-one-out predicted" in text and "left-one-out" not in text
    assert out.exists() and "notes" not in out.read_text()  # said, not written
    assert main(["calibrate", "--measured", str(m), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"][0].startswith("the fit stops at the bound")
    assert main(["calibrate", "--measured", "tests/data/paper-machine-b-measured.yaml", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []  # the paper's measurements: no note


def test_ssd_rates_alone_fit_ssd_read_and_never_a_link_they_do_not_depend_on(tmp_path, capsys):
    """`moment probe --out`'s SSD rates say nothing about the switch uplink or the socket link: the default fit
    leaves them at the book rate with a note and fits ssd_read (it pinned both at their slow bounds, 0.2 and
    0.1, with no note, and plans with it predicted 2.4x slower epochs: hunt-H 2); naming them is refused."""
    rates = MeasurementFile(machine="paper-machine-b", gpus=4, ssds=8, measurements=[
        Measurement(device=f"ssd{i}", read_gbps=r) for i, r in enumerate((3.1, 3.25, 3.4))])
    topo = load_profile("paper-machine-b")
    cal = calibrate(topo, INV, rates)
    assert cal.fitted == ["ssd_read"]
    assert cal.params["switch_uplink"] == 1.0 and cal.params["socket_link"] == 1.0
    assert cal.params["ssd_read"] == pytest.approx(0.5, abs=0.01)
    assert cal.notes == ["switch_uplink, socket_link not fitted (kept at the book rate): no measurement depends "
                         "on them"]
    with pytest.raises(MomentError, match=r"m.yaml: --fit switch_uplink,socket_link: no measurement depends on "
                                          r"switch_uplink, socket_link, so a fit would set them arbitrarily") as e:
        calibrate(topo, INV, rates, ["switch_uplink", "socket_link"], source="m.yaml")
    assert "measure ssd_read directly" in e.value.hint
    with pytest.raises(MomentError, match="no measurement depends on rc_port"):
        calibrate(topo, INV, rates, ["ssd_read", "rc_port"])
    # layouts and a read rate: the layouts fit the links, the rate fits ssd_read (not counted for the links)
    mf = _synthetic({"socket_link": 0.5}, noise=0.0)
    mixed = MeasurementFile(machine="paper-machine-a", gpus=4, ssds=8, data="even",
                            measurements=[*mf.measurements, Measurement(device="ssd0", read_gbps=6.5)])
    cal = calibrate(load_profile("paper-machine-a"), INV, mixed, loo=False)
    assert cal.fitted == ["switch_uplink", "socket_link", "ssd_read"] and cal.notes == []
    assert cal.params["socket_link"] == pytest.approx(0.5, abs=0.01) and cal.params["ssd_read"] == 1.0
    two = MeasurementFile(machine="paper-machine-a", gpus=4, ssds=8, data="even",
                          measurements=[*mf.measurements[:2], Measurement(device="ssd0", read_gbps=6.5)])
    with pytest.raises(MomentError, match=r"2 distinct epoch measurements cannot test a fit of 2 parameters "
                                          r"\(switch_uplink, socket_link\)"):
        calibrate(load_profile("paper-machine-a"), INV, two)


def test_a_fit_resting_on_its_slow_bound_says_so():
    """A rate slower than the slowest the bounds allow: the fit stops at the slow bound, with a note (only a
    fast bound was ever noted: hunt-H 2)."""
    slow = MeasurementFile(measurements=[Measurement(device="ssd0", read_gbps=1.3),
                                         Measurement(device="ssd1", read_gbps=1.3)])
    cal = calibrate(load_profile("paper-machine-b"), INV, slow, ["ssd_read"])
    assert cal.params["ssd_read"] == 0.3
    assert len(cal.notes) == 1 and cal.notes[0].startswith(
        "the fit stops at the slow bound of ssd_read = 0.3 and still predicts ssd0:read +50%, ssd1:read +50%: "
        "the machine measured slower than the calibration's bounds allow")
    assert "plans with it are still faster than measured" in cal.notes[0] and "--ssd-model" in cal.notes[0]


def test_the_documented_probe_then_calibrate_flow_works_for_one_ssd(tmp_path, capsys):
    """`moment probe --ssd-path ssd0=DIR --out probe.yaml` (no --profile: machine null, no counts), then the
    command simulate's hint and planning.md give, `moment calibrate --measured probe.yaml --out cal.yaml`: one
    read rate fits ssd_read exactly (rate / rated). It was refused three ways (no machine; no counts; '1
    distinct measurements cannot test a fit of 1 parameters': hunt-H 3)."""
    probe, out = tmp_path / "probe.yaml", tmp_path / "cal.yaml"
    probe.write_text("machine: null\nmeasurements:\n- {device: ssd0, read_gbps: 3.25}\nprobe: {ssd: {}}\n")
    assert main(["simulate", "--profile", "paper-machine-b", "--placement", "paper-c", "--calibration",
                 str(probe)]) == 2
    hint = " ".join(capsys.readouterr().err.split())
    assert f"`moment calibrate --measured {probe} --out cal.yaml`" in hint
    assert main(["calibrate", "--measured", str(probe), "--out", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fitted"] == ["ssd_read"] and got["params"]["ssd_read"] == pytest.approx(3.25 / 6.5, rel=1e-6)
    assert load_calibration(out).fitted_on == "an unnamed machine (SSD read rates)"
    for machine in ("paper-machine-b", "paper-machine-a"):
        assert main(["plan", "--profile", machine, "--gpus", "4", "--ssds", "8", "--json"]) == 0
        bare = json.loads(capsys.readouterr().out)["predicted"]["epoch_read_s"]
        assert main(["plan", "--profile", machine, "--gpus", "4", "--ssds", "8", "--calibration", str(out)]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert f"recommended {bare / 0.5:.2f} s" in text  # every SSD at half its rated rate: the reads take twice
        assert "by link class only" not in text  # an SSD scale carries to any machine as it is
    # a layout's epoch still needs the machine and the counts
    (tmp_path / "e.yaml").write_text("measurements:\n- {layout: paper-a, epoch_s: 16}\n- {device: ssd0, "
                                     "read_gbps: 3.0}\n")
    assert main(["calibrate", "--measured", str(tmp_path / "e.yaml")]) == 2
    assert "no machine: pass --profile" in capsys.readouterr().err
