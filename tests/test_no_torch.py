"""The planner and the topology layer never load torch: `moment plan` runs on a laptop without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import contextlib, io, sys
import moment.planner, moment.topology
assert 'torch' not in sys.modules, 'importing moment.planner / moment.topology loaded torch'
from moment.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(['plan', '--profile', 'paper-machine-b', '--gpus', '2', '--ssds', '2', '--json'])
assert rc == 0, rc
loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))
assert not loaded, 'moment plan loaded ' + ', '.join(loaded[:5])
"""


def test_planner_topology_and_moment_plan_load_no_torch() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
