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
