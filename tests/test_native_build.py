"""The package build makes every native part: a plain (non-editable) install reports the native DDAK
kernel, sampler loops and I/O engines, with no compiler needed at run time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _sources(dst: Path) -> None:
    """Copy the files git would commit (a clean checkout), so the build leaves nothing in the work tree."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def test_plain_install_reports_native_ddak_and_io_engines(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the build would fall back to NumPy DDAK and Python I/O")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: cannot list the tracked sources to build")
    src, target = tmp_path / "src", tmp_path / "site"
    _sources(src)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list((target / "moment" / "placement").glob("_ddak*.so")), "the build did not make the DDAK kernel"
    env = {**os.environ, "PYTHONPATH": str(target), "MOMENT_CACHE": str(tmp_path / "cache")}
    env.pop("MOMENT_NO_NATIVE", None)
    code = ("import json, moment; from moment.cli.version_cmds import native_report; "
            "print(json.dumps({'file': moment.__file__, **native_report()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert rep["file"].startswith(str(target)), f"imported the checkout, not the install: {rep['file']}"
    assert rep["ddak"]["engine"] == "native" and rep["ddak"]["detail"].startswith("package build"), rep["ddak"]
    assert rep["io_backends"]["pthreads"] == "usable", rep["io_backends"]
    assert rep["sampler"]["engine"] == "native" and rep["sampler"]["detail"].startswith("package build"), rep["sampler"]
    assert list((target / "moment" / "workload").glob("_sampling*.so")), "the build did not make the sampler loops"
    # nothing was compiled at run time: the installed kernel was used
    assert not (tmp_path / "cache").exists()
