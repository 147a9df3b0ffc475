"""The service is optional: without fastapi/uvicorn installed the planner works and `moment serve`
says what to install, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import contextlib, io, sys
sys.modules['fastapi'] = None  # as if not installed: importing it raises ImportError
sys.modules['uvicorn'] = None
from moment.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(['plan', '--gpus', '2', '--ssds', '2', '--json']) == 0
    assert main(['--help']) == 0
assert main(['serve', '--data-dir', sys.argv[1]]) == 2
assert 'moment.service.app' not in sys.modules
"""


def test_planner_and_cli_work_without_the_service_packages(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "moment[serve]" in lines[0], r.stderr
