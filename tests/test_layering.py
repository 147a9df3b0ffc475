"""Planning and scanning never load torch: `moment plan` must work where only the base install exists."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
import moment.planner, moment.planner.plan, moment.planner.replay, moment.planner.calibration
import moment.topology, moment.topology.profiles, moment.topology.scan
from moment.cli import main
rc = main(["plan", "--profile", "paper-machine-b", "--gpus", "4", "--ssds", "8", "--json"])
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert rc == 0, rc
assert not loaded, f"torch loaded by planning: {loaded[:5]}"
"""


def test_planning_and_scanning_load_no_torch():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"placement"' in r.stdout  # the plan was printed
