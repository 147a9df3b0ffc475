"""The Python API: `moment` exports one request and one function per use case (what the commands and the
service run) and `open_run`, each loaded on first use, so a planning script never loads torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import moment
from runtime_data import REPO

PLANNING = [n for n, mod in moment.API.items() if not mod.startswith("moment.runtime")]


def test_every_exported_name_is_what_its_module_defines():
    import importlib

    for name, module in moment.API.items():
        assert getattr(moment, name) is getattr(importlib.import_module(module), name), name
        assert name in moment.__all__ and name in dir(moment)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        moment.nope  # noqa: B018


def test_planning_through_the_api_loads_no_torch_and_answers_as_the_command():
    code = ("import json, sys, moment\n"
            f"names = {PLANNING!r}\n"
            "[getattr(moment, n) for n in names]\n"
            "r = moment.plan(moment.PlanRequest(profile='paper-machine-b', gpus=4, ssds=8))\n"
            "print(json.dumps(r.json['predicted']['epoch_read_s']), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    api_s, torch_loaded = out.stdout.split()
    cli = subprocess.run([sys.executable, "-m", "moment", "plan", "--profile", "paper-machine-b", "--gpus", "4",
                          "--ssds", "8", "--json"], capture_output=True, text=True, check=True, cwd=REPO)
    import json

    assert torch_loaded == "False"
    assert float(api_s) == json.loads(cli.stdout)["predicted"]["epoch_read_s"]


def test_a_scripts_mistakes_are_moment_errors_naming_the_input(tmp_path):
    """`except moment.MomentError` is what a script catches: a request built wrong (pydantic's ValidationError), a
    function given None or a dict (an AttributeError deep inside), an empty profile name (it planned the default
    machine in `plan` and was the directory '.' elsewhere), an empty comparison, an empty selection of nodes."""
    cases = [
        (lambda: moment.PlanRequest(profile="paper-machine-b", gpus="x"), r"^PlanRequest: gpus: Input should be"),
        (lambda: moment.PlanRequest(bogus=1), r"^PlanRequest: bogus: Extra inputs are not permitted"),
        (lambda: moment.CalibrateRequest(), r"^CalibrateRequest: measured: Field required"),
        (lambda: moment.plan(None), r"^moment.plan takes a PlanRequest, not NoneType"),
        (lambda: moment.advise({"profile": "dgx2"}), r"^moment.advise takes an AdviseRequest, not dict"),
        (lambda: moment.plan(moment.PlanRequest(profile="")), r"^an empty profile name"),
        (lambda: moment.compare(moment.CompareRequest(profiles=[])), r"^nothing to compare"),
        (lambda: moment.open_dataset(None), r"opened by its directory's path, not NoneType"),
    ]
    for call, says in cases:
        with pytest.raises(moment.MomentError, match=says):
            call()
    from moment.workload.synth import synthesize

    ds = synthesize(tmp_path / "d", 600, feature_dim=2, num_classes=2, seed=0)
    assert moment.open_dataset(ds.path).nodes_of([]).dtype.kind == "i"
