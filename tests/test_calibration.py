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
    with pytest.raises(MomentError, match="3 distinct measurements cannot test a fit of 3 parameters"):
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
    assert {"layout", "measured_s", "predicted_s"} <= set(got["residuals"][0])
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
    assert f"(default:{','.join(DEFAULT_FIT)})" in re.sub(r"[\s│]", "", capsys.readouterr().out)


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
