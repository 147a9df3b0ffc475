"""`publish_dir`: a finished directory goes in place so that a kill -9 at any instant leaves the old or the
new version at the path (after the next writer's recovery where the file system cannot swap atomically).
Kills are real: a subprocess SIGKILLs itself at a named point (moment.testpoints)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moment import testpoints
from moment.outputs import exchange, publish_dir, remove_stale

REPO = Path(__file__).resolve().parents[1]

#: makes OUT's next version in a temporary directory (named as every writer names its own) and publishes it
_WRITER = """
import sys, tempfile
from pathlib import Path
import moment.outputs as o
out, version, swap = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if not swap:
    o.exchange = lambda a, b: False  # a file system without RENAME_EXCHANGE
new = Path(tempfile.mkdtemp(prefix=o.temp_prefix(out), dir=out.parent))
(new / "version").write_text(version)
old = o.publish_dir(new, out, "test")
if old is not None:
    import shutil
    shutil.rmtree(old)
"""


def _publish(out: Path, version: str, swap: bool, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(testpoints.CRASH_ENV, None)
    if crash_at:
        env[testpoints.CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, "-c", _WRITER, str(out), version, "1" if swap else "0"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _version(out: Path) -> str:
    return (out / "version").read_text()


@pytest.fixture
def swaps(tmp_path) -> bool:
    """Whether this file system swaps directories atomically (ext4, xfs, btrfs, tmpfs do)."""
    a, b = tmp_path / "probe" / "a", tmp_path / "probe" / "b"
    a.mkdir(parents=True)
    b.mkdir()
    (a / "x").touch()
    swapped = exchange(a, b) and (b / "x").exists()
    shutil.rmtree(tmp_path / "probe")
    return swapped


@pytest.mark.parametrize("swap,point,at_path", [
    (True, "test-old-moved", "new"),  # with the atomic swap there is no moment between two renames: never reached
    (True, "test-swapped", "new"),  # the one atomic step is done; the old version waits at the temporary name
    (False, "test-old-moved", None),  # between the two renames: nothing at the path until the next writer
    (False, "test-swapped", "new"),
])
def test_killed_at_each_step_the_old_or_the_new_version_is_at_the_path(tmp_path, swaps, swap, point, at_path):
    if swap and not swaps:
        pytest.skip("this file system cannot swap directories atomically")
    out = tmp_path / "out"
    assert _publish(out, "old", swap).returncode == 0 and _version(out) == "old"
    r = _publish(out, "new", swap, crash_at=point)
    assert r.returncode == (0 if swap and point == "test-old-moved" else -9), r.stderr
    if at_path is None:
        assert not out.exists()
    else:
        assert _version(out) == at_path
    remove_stale(out, set_aside=True)  # what the next writer does first, holding the lock
    assert _version(out) == (at_path or "old")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing else left behind
    assert _publish(out, "newer", swap).returncode == 0 and _version(out) == "newer"


def test_a_first_version_is_renamed_into_place(tmp_path):
    new, out = tmp_path / ".out.tmp", tmp_path / "out"
    new.mkdir()
    (new / "version").write_text("1")
    assert publish_dir(new, out, "test") is None
    assert _version(out) == "1" and not new.exists()
