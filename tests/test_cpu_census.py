"""The suite's own report of what each test costs in CPU (conftest's `--cpu-costliest`), which `make test` prints:
the suite is CPU-bound on two cores, so this, not the wall-time list, says which tests to make cheaper."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# each burns a stated amount of its own CPU (not a fixed loop, which a fast core finishes under the bound)
BURN = '''
import subprocess, sys

SPIN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {}: pass"


def test_a_child_burns():
    subprocess.run([sys.executable, "-c", SPIN.format(0.4)], check=True)


def test_this_process_burns():
    exec(SPIN.format(0.15))


def test_nothing():
    pass
'''


def test_the_costliest_tests_are_listed_with_their_childrens_cpu(tmp_path):
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_burn.py").write_text(BURN)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "--cpu-costliest", "2", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    head, *lines = r.stdout.split("2 costliest tests in CPU (of ")[1].splitlines()
    assert re.match(r"\d+ CPU-s in 3 tests\)", head), head
    rows = [re.match(r"\s*([\d.]+) s  \(own\s+([\d.]+), children\s+([\d.]+)\)  (\S+)$", ln) for ln in lines[:2]]
    assert all(rows), lines[:3]
    assert [m.group(4).rsplit("::", 1)[1] for m in rows] == ["test_a_child_burns", "test_this_process_burns"]
    total, own, children = (float(x) for x in rows[0].groups()[:3])
    assert children >= 0.4 and own < children and abs(total - own - children) <= 0.11  # the child's CPU is the test's
    assert float(rows[1].group(3)) == 0 and float(rows[1].group(2)) >= 0.1


def test_without_the_option_nothing_is_measured_or_listed(request):
    from conftest import pytest_terminal_summary

    class Config:
        def getoption(self, name):
            assert name == "--cpu-costliest"
            return 0

    assert pytest_terminal_summary(None, Config()) is None  # it would write to the (absent) reporter
    assert not hasattr(request.node, "cpu_start") or request.config.getoption("--cpu-costliest")
