"""Every path and file option of every command, given hostile paths: a file where a directory is expected
and the reverse, a missing path, a dangling symlink, `/`, an over-long name, non-UTF-8 or binary content,
a foreign directory, no permission. Each is one `error:` line naming the path, exit 2, no traceback,
and nothing under the sandbox is deleted, changed or half-written."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from test_import_saint import write_saint
from test_place import CACHE, INV, TINY
from test_workload_import import write_igb, write_ogb_csv

from moment.cli import main

LONG = "y" * 300
REPO = Path(__file__).resolve().parents[1]


def run(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Real inputs of every kind (dataset, layout, plan, calibration, measurements, prices, hotness,
    profile) and hostile things beside them, in one sandbox."""
    from moment.workload.hotness import presample
    from moment.workload.synth import synthesize

    t = tmp_path_factory.mktemp("paths")
    ds = synthesize(t / "ds", 2000, feature_dim=8, seed=3)
    (t / "prof.yaml").write_text(TINY)
    rc, plan, err = run(["plan", "--profile", t / "prof.yaml", *INV, "--json"])
    assert rc == 0, err
    (t / "plan.json").write_text(plan)
    presample(ds, [5, 5], 64, num_batches=4).save(t / "hot")
    rc, _, err = run(["place", "--dataset", t / "ds", "--profile", t / "prof.yaml", *INV, *CACHE, "--plan",
                      t / "plan.json", "--hotness", t / "hot", "--out", t / "L", "--json"])
    assert rc == 0, err
    shutil.copy(REPO / "tests" / "data" / "paper-machine-b-measured.yaml", t / "measured.yaml")
    (t / "prices.yaml").write_text("devices:\n  P5510: {price_usd: 1000, date: 2025-01, source: me}\n")
    (t / "edges.txt").write_text("0 1\n1 2\n2 0\n")
    (t / "dir").mkdir()
    (t / "afile").write_text("x\n")
    (t / "nonutf8").write_bytes(bytes(range(128, 256)) * 4)
    (t / "binary").write_bytes(b"\x00\x01\x02\x03" * 64)
    (t / "empty").write_bytes(b"")
    os.symlink(t / "nowhere", t / "dangling")
    (t / "junk").mkdir()
    (t / "junk" / "manifest.json").write_bytes(b"\xff\xfe\x00junk")
    (t / "foreign").mkdir()  # a web extension: its own manifest.json, and files no Moment writer made
    (t / "foreign" / "manifest.json").write_text('{"name": "ext", "version": "1"}')
    (t / "foreign" / "background.js").write_text("x")
    (t / "foreign" / "icons").mkdir()
    (t / "foreign" / "icons" / "a.png").write_bytes(b"png")
    write_ogb_csv(t / "ogbsrc")
    write_igb(t / "igbsrc")
    write_saint(t / "saintsrc")
    np.save(t / "e.npy", np.array([[0, 1], [1, 2]]))
    try:
        import torch

        torch.save({"edge_index": torch.tensor([[0, 1], [1, 2]])}, t / "g.pt")
    except ImportError:
        pass
    (t / "cluster.yaml").write_text("servers:\n  - {profile: paper-machine-a, gpus: 2, ssds: 2, count: 2}\n")
    shutil.copytree(t / "ds", t / "dsextra")  # a real dataset with the user's notes in it
    (t / "dsextra" / "notes.txt").write_text("mine")
    return t


# what a hostile path stands for, per kind of option (relative to the sandbox)
IN_FILE = {"dir": "dir", "missing": "missing.yaml", "dangling": "dangling", "long": LONG, "nonutf8": "nonutf8",
           "binary": "binary", "empty": "empty"}
IN_DIR = {"file": "afile", "missing": "missingdir", "dangling": "dangling", "long": LONG, "junk": "junk"}
OUT_FILE = {"dir": "dir", "dangling": "dangling", "root": "/", "long": LONG, "under-file": "afile/x"}
OUT_DIR = {"file": "afile", "dangling": "dangling", "root": "/", "long": LONG, "under-file": "afile/x",
           "foreign": "foreign", "dataset+extra": "dsextra"}
KINDS = {"in_file": IN_FILE, "in_dir": IN_DIR, "out_file": OUT_FILE, "out_dir": OUT_DIR}
PLACE = ["place", "--dataset", "ds", "--profile", "prof.yaml", *INV, *CACHE, "--hotness", "hot"]
ADVISE = ["advise", "--budget", "30000", "--models", "T4,P5510", "--max-gpus", "1", "--max-ssds", "1"]
TRAIN = ["train", "--epochs", "1", "--quiet"]
RUNS_GO_UNDER = "each run is a new folder under --run-dir: what the directory holds is not touched"
ONE_CHECKPOINT_FILE = "a checkpoint directory gets one file of its own (checkpoint.pt), written atomically"

# (option, kind, argv with {P} for the hostile path, cases left out with the reason)
OPTIONS = [
    ("plan --profile", "in_file", ["plan", "--profile", "{P}"], {}),
    ("plan --calibration", "in_file", ["plan", "--calibration", "{P}"], {}),
    ("plan --cluster", "in_file", ["plan", "--cluster", "{P}"], {}),
    ("plan --diagram", "out_file", ["plan", "--diagram", "{P}"], {}),
    ("compare PROFILE", "in_file", ["compare", "{P}", "paper-machine-a"], {}),
    ("compare --calibration", "in_file", ["compare", "paper-machine-a", "--calibration", "{P}"], {}),
    ("export --profile", "in_file", ["export", "--profile", "{P}"], {}),
    ("export --out", "out_file", ["export", "--profile", "paper-machine-b", "--out", "{P}"], {}),
    ("schema --out", "out_file", ["schema", "topology", "--out", "{P}"], {}),
    ("advise --profile", "in_file", [*ADVISE, "--profile", "{P}"], {}),
    ("advise --prices", "in_file", [*ADVISE, "--profile", "paper-machine-b", "--prices", "{P}"],
     {"empty": "an empty price file changes no price"}),
    ("simulate --plan", "in_file", ["simulate", "--plan", "{P}"], {}),
    ("simulate --calibration", "in_file",
     ["simulate", "--profile", "paper-machine-b", "--placement", "paper-c", "--calibration", "{P}"], {}),
    ("simulate --layout", "in_dir", ["simulate", "--layout", "{P}"], {}),
    ("simulate --dataset", "in_dir", ["simulate", "--layout", "L", "--profile", "prof.yaml", "--dataset", "{P}"], {}),
    ("simulate --profile", "in_file", ["simulate", "--placement", "paper-c", "--profile", "{P}"], {}),
    ("calibrate --measured", "in_file", ["calibrate", "--measured", "{P}"], {}),
    ("calibrate --profile", "in_file", ["calibrate", "--measured", "measured.yaml", "--profile", "{P}"], {}),
    ("calibrate --out", "out_file", ["calibrate", "--measured", "measured.yaml", "--out", "{P}"], {}),
    ("probe --ssd-path", "in_dir", ["probe", "--size-mib", "16", "--ssd-path", "ssd0={P}"],
     {"junk": "a directory with any content is a place to measure"}),
    ("probe --profile", "in_file", ["probe", "--size-mib", "16", "--ssd-path", "ssd0=dir", "--profile", "{P}",
                                    "--profile-out", "po.yaml"], {}),
    ("probe --out", "out_file", ["probe", "--size-mib", "16", "--ssd-path", "ssd0=dir", "--out", "{P}"], {}),
    ("probe --profile-out", "out_file", ["probe", "--size-mib", "16", "--ssd-path", "ssd0=dir", "--profile",
                                         "paper-machine-b", "--profile-out", "{P}"], {}),
    ("place --dataset", "in_dir", ["place", "--dataset", "{P}", "--profile", "prof.yaml", *INV, "--out", "newL"], {}),
    ("place --out", "out_dir", [*PLACE, "--plan", "plan.json", "--out", "{P}", "--overwrite"], {}),
    ("place --plan", "in_file", [*PLACE, "--out", "newL", "--plan", "{P}"], {}),
    ("place --hotness", "in_dir", ["place", "--dataset", "ds", "--profile", "prof.yaml", *INV, "--plan", "plan.json",
                                   "--out", "newL", "--hotness", "{P}"], {}),
    ("place --profile", "in_file", ["place", "--dataset", "ds", "--out", "newL", "--profile", "{P}"], {}),
    ("place --ssd-path", "in_dir", [*PLACE, "--plan", "plan.json", "--out", "newL", "--ssd-path", "ssd0={P}"],
     {"junk": "a directory with any content can hold shards"}),
    ("scan --from-nccl-xml", "in_file", ["scan", "--from-nccl-xml", "{P}"], {}),
    ("scan --from-hwloc-xml", "in_file", ["scan", "--from-hwloc-xml", "{P}"], {}),
    ("scan --from-lspci", "in_file", ["scan", "--from-lspci", "{P}"], {}),
    ("scan --from-lspci-vvv", "in_file", ["scan", "--from-lspci-vvv", "{P}"], {}),
    ("scan --from-dmidecode", "in_file", ["scan", "--from-dmidecode", "{P}"], {}),
    ("scan --from-nvidia-smi", "in_file", ["scan", "--from-nvidia-smi", "{P}"], {}),
    ("scan --out", "out_file", ["scan", "--from-lspci", REPO / "tests/data/this-machine/lspci-tv.txt", "--out", "{P}"],
     {}),
    ("train --layout", "in_dir", [*TRAIN, "--layout", "{P}"], {}),
    ("train --dataset", "in_dir", [*TRAIN, "--layout", "L", "--dataset", "{P}"], {}),
    ("train --run-dir", "out_dir", [*TRAIN, "--layout", "L", "--run-dir", "{P}"],
     {"foreign": RUNS_GO_UNDER, "dataset+extra": RUNS_GO_UNDER}),
    ("train --checkpoint-dir", "out_dir", [*TRAIN, "--layout", "L", "--checkpoint-dir", "{P}"],
     {"foreign": ONE_CHECKPOINT_FILE, "dataset+extra": ONE_CHECKPOINT_FILE}),
    ("train --metrics-json", "out_file", [*TRAIN, "--layout", "L", "--metrics-json", "{P}"], {}),
    ("cache simulate --dataset", "in_dir", ["cache", "simulate", "--capacity", "10%", "--dataset", "{P}"], {}),
    ("cache simulate --hotness", "in_dir", ["cache", "simulate", "--capacity", "10%", "--dataset", "ds", "--hotness", "{P}"], {}),
    ("cache simulate --trace-out", "out_file", ["cache", "simulate", "--capacity", "10%", "--dataset", "ds", "--trace-out", "{P}"], {}),
    ("data synth --out", "out_dir", ["data", "synth", "--nodes", "1000", "--out", "{P}", "--overwrite"], {}),
    ("data import ogb SRC", "in_dir", ["data", "import", "ogb", "{P}", "--out", "newds"], {}),
    ("data import ogb --out", "out_dir", ["data", "import", "ogb", "ogbsrc", "--out", "{P}", "--overwrite"], {}),
    ("data import igb --out", "out_dir", ["data", "import", "igb", "igbsrc", "--out", "{P}", "--overwrite"], {}),
    ("data import igb SRC", "in_dir", ["data", "import", "igb", "{P}", "--out", "newds"], {}),
    ("data import graphsaint SRC", "in_dir", ["data", "import", "graphsaint", "{P}", "--out", "newds"], {}),
    ("data import graphsaint --out", "out_dir", ["data", "import", "graphsaint", "saintsrc", "--out", "{P}",
                                                 "--overwrite"], {}),
    ("data import edgelist EDGES", "in_file", ["data", "import", "edgelist", "{P}", "--out", "newds"],
     {"binary": "bytes that are not digits are an edge list with no edges: covered by test_workload_import"}),
    ("data import edgelist --out", "out_dir", ["data", "import", "edgelist", "edges.txt", "--out", "{P}",
                                               "--overwrite"], {}),
    ("data import edgelist --features", "in_file", ["data", "import", "edgelist", "edges.txt", "--out", "newds",
                                                    "--features", "{P}"], {}),
    ("data import edgelist --labels", "in_file", ["data", "import", "edgelist", "edges.txt", "--out", "newds",
                                                  "--labels", "{P}"], {}),
    ("data import edgelist --splits", "in_dir", ["data", "import", "edgelist", "edges.txt", "--out", "newds",
                                                 "--splits", "{P}"], {}),
    ("data import pyg FILE", "in_file", ["data", "import", "pyg", "{P}", "--out", "newds"], {}),
    ("data import pyg --out", "out_dir", ["data", "import", "pyg", "g.pt", "--out", "{P}", "--overwrite"], {}),
    ("data import npy --edge-index", "in_file", ["data", "import", "npy", "--out", "newds", "--edge-index", "{P}"], {}),
    ("data import npy --x", "in_file", ["data", "import", "npy", "--out", "newds", "--edge-index", "e.npy",
                                        "--x", "{P}"], {}),
    ("data import npy --train-idx", "in_file", ["data", "import", "npy", "--out", "newds", "--edge-index", "e.npy",
                                                "--train-idx", "{P}", "--val-idx", "e.npy", "--test-idx", "e.npy"], {}),
    ("data import npy --out", "out_dir", ["data", "import", "npy", "--edge-index", "e.npy", "--out", "{P}",
                                          "--overwrite"], {}),
    ("data info PATH", "in_dir", ["data", "info", "{P}"], {}),
    ("data presample PATH", "in_dir", ["data", "presample", "{P}", "--out", "newhot"], {}),
    ("data presample --out", "out_dir", ["data", "presample", "ds", "--out", "{P}"], {}),
    ("data pack --layout", "in_dir", ["data", "pack", "--layout", "{P}"], {}),
    ("data pack --dataset", "in_dir", ["data", "pack", "--layout", "L", "--dataset", "{P}", "--overwrite"], {}),
    ("serve --data-dir", "in_dir", ["serve", "--port", "{PORT}", "--data-dir", "{P}"],
     {"missing": "a missing data directory is made", "junk": "any directory of its own may hold the service's data"}),
    ("serve --db", "out_file", ["serve", "--port", "{PORT}", "--data-dir", "dir", "--db", "{P}"], {}),
    ("layout verify", "in_dir", ["layout", "verify", "{P}"], {}),
    ("layout rm", "in_dir", ["layout", "rm", "{P}"], {}),
    ("layout info", "in_dir", ["layout", "info", "{P}"], {}),
]
CASES = [pytest.param(argv, kind, case, id=f"{opt} [{case}]")
         for opt, kind, argv, skip in OPTIONS for case in KINDS[kind] if case not in skip]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(root: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(base) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "kind", "case"), CASES)
def test_hostile_path(env, argv, kind, case, monkeypatch):
    monkeypatch.chdir(env)  # the cases name paths relative to the sandbox
    import uvicorn

    def serving(*_a, **_k):
        raise AssertionError("moment serve accepted the path and started serving")

    monkeypatch.setattr(uvicorn, "run", serving)
    path = KINDS[kind][case]
    before = _tree(env)
    port = str(_free_port())
    rc, _, err = run([a.replace("{P}", path).replace("{PORT}", port) if isinstance(a, str) else a for a in argv])
    after = _tree(env)
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and lines and lines[0].startswith("error:"), err
    assert sum(ln.startswith("error:") for ln in lines) == 1, err
    named = path.split("/")[0] if case == "under-file" else path[:40]
    assert named in " ".join(err.split()), err
    assert after == before  # nothing deleted, changed or left behind


def _drop_privileges() -> list[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a command as another user (permissions bind root only by mode)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not found: cannot run a command as another user")
    cmd = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    if subprocess.run([*cmd, sys.executable, "-c", "import moment"], cwd=REPO, capture_output=True).returncode:
        pytest.skip("user nobody cannot run this interpreter or import moment here")
    return cmd


@pytest.fixture
def shared_tmp(machine_temp):
    """A directory every user may traverse (pytest's own tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="moment-perm-", dir=machine_temp))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["plan", "--profile", "{D}/secret.yaml"],
    ["calibrate", "--measured", "{D}/secret.yaml"],
    ["data", "info", "{D}/closed"],
    ["layout", "info", "{D}/closed"],
    ["probe", "--size-mib", "16", "--ssd-path", "ssd0={D}/readonly"],
    ["schema", "topology", "--out", "{D}/readonly/s.json"],
    ["data", "synth", "--nodes", "500", "--out", "{D}/readonly/ds"],
    ["data", "synth", "--nodes", "500", "--out", "{D}/closed/ds"],
    ["place", "--dataset", "{D}/ds", "--profile", "{D}/prof.yaml", *INV, "--out", "{D}/readonly/L"],
], ids=lambda a: " ".join(a[:2]) + " " + a[-1].replace("{D}/", ""))
def test_no_permission_is_one_message(env, shared_tmp, argv):
    """Root ignores modes: the command runs as user nobody, on paths only root may read or write."""
    cmd = _drop_privileges()
    d = shared_tmp
    (d / "secret.yaml").write_text(TINY)
    (d / "secret.yaml").chmod(0o600)
    (d / "closed").mkdir(mode=0o700)
    (d / "closed" / "manifest.json").write_text("{}")
    (d / "readonly").mkdir(mode=0o755)
    shutil.copytree(env / "ds", d / "ds")
    shutil.copy(env / "prof.yaml", d / "prof.yaml")
    for p in (d / "ds", *(d / "ds").iterdir(), d / "prof.yaml"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    before = _tree(d)
    r = subprocess.run([*cmd, sys.executable, "-m", "moment", *(a.replace("{D}", str(d)) for a in argv)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2 and err.startswith("error:") and "Traceback" not in err, r.stderr
    assert "permission denied" in err and str(d) in err, err
    assert _tree(d) == before
