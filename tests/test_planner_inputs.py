"""The planner's, fidelity's and cost commands' counts and device models: a wrong one is one error line
naming the flag (no usage dump, no traceback, no misleading "no GPU"), and an inventory given twice
(--inventory with --gpus/--ssds/--gpu-model/--ssd-model) is refused rather than half ignored."""

from __future__ import annotations

import pytest

from moment.cli import main

MEASURED = "machine: paper-machine-a\ngpus: 4\nssds: 8\nmeasurements:\n" + "".join(
    f"  - {{layout: {n}, epoch_s: {v}}}\n" for n, v in (("paper-a", 15.9), ("paper-b", 26.7), ("paper-c", 14.9),
                                                          ("paper-d", 24.1)))
SIM = ["simulate", "--profile", "paper-machine-b", "--placement", "paper-c"]
ADVISE = ["advise", "--profile", "paper-machine-b", "--budget", "60000"]
CASES = [
    (["plan", "--gpus", "-1"], "--gpus -1: must not be negative"),
    (["plan", "--ssds", "-2"], "--ssds -2: must not be negative"),
    (["compare", "paper-machine-b", "--ssds", "-1"], "--ssds -1: must not be negative"),
    ([*SIM, "--gpus", "-1"], "--gpus -1: must not be negative"),
    ([*SIM, "--steps", "-5"], "--steps -5: must be positive"),
    ([*SIM, "--seed", "-1"], "--seed -1: must be 0 or more"),
    ([*ADVISE, "--top", "-1"], "--top -1: give 1 or more"),
    ([*ADVISE, "--max-gpus", "-1"], "--max-gpus -1: must not be negative"),
    ([*ADVISE, "--max-ssds", "-3"], "--max-ssds -3: must not be negative"),
    (["advise", "--profile", "paper-machine-b", "--budget", "-5"], "--budget -5: give a positive amount"),
    (["calibrate", "--measured", "{m}", "--gpus", "-1"], "--gpus -1: must not be negative"),
    # a model of the other kind says so, in every command that takes one
    (["plan", "--gpu-model", "P5510"], "--gpu-model P5510: P5510 is an SSD, not a GPU"),
    (["plan", "--ssd-model", "a100"], "--ssd-model a100: A100-PCIe-40GB is a GPU, not an SSD"),
    (["plan", "--ssd-model", "CX7"], "--ssd-model CX7: CX7 is a NIC, not an SSD"),
    (["compare", "paper-machine-b", "--gpu-model", "PM1743"], "--gpu-model PM1743: PM1743 is an SSD, not a GPU"),
    (["calibrate", "--measured", "{m}", "--ssd-model", "H100"], "--ssd-model H100: H100-PCIe-80GB is a GPU, not an SSD"),
    (["place", "--dataset", "{m}", "--out", "{m}.L", "--gpu-model", "P5510"], "--gpu-model P5510: P5510 is an SSD, not a GPU"),
    # --inventory names every device; counts or models beside it would be ignored
    (["plan", "--inventory", "2xA100,2xP5510", "--gpus", "3"], "--inventory lists every device to place, so --gpus"),
    (["plan", "--inventory", "2xA100,2xP5510", "--ssds", "8"], "so --ssds would be ignored"),
    (["plan", "--inventory", "2xA100", "--gpu-model", "H100", "--ssd-model", "P5510"],
     "so --gpu-model, --ssd-model would be ignored"),
    (["compare", "paper-machine-b", "--inventory", "2xA100,2xP5510", "--gpus", "1"], "so --gpus would be ignored"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv, want", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_one_line_naming_the_flag(argv, want, tmp_path, capsys):
    m = tmp_path / "measured.yaml"
    m.write_text(MEASURED)
    assert main([a.replace("{m}", str(m)) for a in argv]) == 2
    cap = capsys.readouterr()
    err = " ".join(cap.err.split())
    assert err.startswith("error: ") and want in err, err
    assert "Usage:" not in err and "Traceback" not in err and not cap.out


def test_counts_and_models_left_out_keep_their_defaults(capsys):
    import json

    assert main(["plan", "--profile", "paper-machine-a", "--gpus", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["inventory"] == "2 x A100-PCIe-40GB, 8 x P5510"
