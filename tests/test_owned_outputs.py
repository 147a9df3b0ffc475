"""What a writer may delete: --overwrite replaces only what Moment wrote (never a directory that merely
has a manifest.json, never files a person put in a dataset, layout or hotness directory); a killed
writer's temporaries are removed by the next writer of the same output, never a running writer's;
`layout rm` removes the layout's training runs by the same rule. Kills are real SIGKILLs of a `moment`
process (moment.testpoints)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_data_safety import cli, paused
from test_place import CACHE, INV, TINY

from moment import testpoints
from moment.cli import main
from moment.errors import MomentError
from moment.outputs import atomic_write, remove_stale
from moment.workload.graph import GraphDataset

REPO = Path(__file__).resolve().parents[1]


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), " ".join(err.getvalue().split())


def listing(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_size if p.is_file() else -1 for p in sorted(d.rglob("*"))}


def dead_pid() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    t = tmp_path_factory.mktemp("owned")
    assert run("data", "synth", "--nodes", "2000", "-d", "4", "--out", t / "ds")[0] == 0
    (t / "prof.yaml").write_text(TINY)
    rc, plan, err = run("plan", "--profile", t / "prof.yaml", *INV, "--json")
    assert rc == 0, err
    (t / "plan.json").write_text(plan)
    (t / "edges.txt").write_text("0 1\n1 2\n2 0\n")
    return t


def _foreign(d: Path) -> Path:
    """A folder with a manifest.json Moment did not write (a browser extension)."""
    d.mkdir()
    (d / "manifest.json").write_text('{"manifest_version": 3, "name": "ext"}')
    (d / "background.js").write_text("chrome.runtime.onInstalled.addListener(() => {});")
    (d / "icons").mkdir()
    (d / "icons" / "16.png").write_bytes(b"\x89PNG")
    return d


def _writers(env, out: Path) -> dict[str, list]:
    return {
        "data synth": ["data", "synth", "--nodes", "500", "-d", "4", "--out", out, "--overwrite"],
        "data import edgelist": ["data", "import", "edgelist", env / "edges.txt", "--out", out, "--overwrite"],
        "data presample": ["data", "presample", env / "ds", "--out", out, "--num-batches", "2"],
        "place": ["place", "--dataset", env / "ds", "--profile", env / "prof.yaml", *INV, *CACHE, "--plan",
                  env / "plan.json", "--out", out, "--overwrite"],
    }


def test_a_file_output_inside_a_directory_moment_wrote_is_refused(env, tmp_path):
    """`cache simulate --trace-out ds/features.npy` replaced the dataset's features (and a file the manifest does
    not name makes the directory one `layout rm` and `--overwrite` refuse): a single-file output is refused in
    a dataset, layout, pack, split or hotness directory, or below one, before anything is sampled; beside one, or
    in a folder that merely has a manifest.json, it is written."""
    ds = env / "ds"
    before = listing(ds)
    (tmp_path / "hot").mkdir()
    (tmp_path / "hot" / "hotness.json").write_text('{"schema_version": 1, "num_nodes": 2000}')
    (ds / "sub").mkdir()
    for out, owner in ((ds / "features.npy", f"the dataset {ds}"), (ds / "sub" / "t.npz", f"the dataset {ds}"),
                       (tmp_path / "hot" / "t.npz", f"the hotness record {tmp_path / 'hot'}")):
        rc, _, err = run("cache", "simulate", "--dataset", ds, "--capacity", "10%", "--trace-out", out)
        assert rc == 2 and err.startswith(f"error: --trace-out {out}: is inside {owner}, which Moment wrote"), err
        assert "Traceback" not in err and not out.with_name("t.npz").exists()
    (ds / "sub").rmdir()
    assert listing(ds) == before and not GraphDataset.open(ds).check()
    ext = _foreign(tmp_path / "extension")
    for out in (tmp_path / "t.npz", ext / "t.npz"):
        rc, _, err = run("cache", "simulate", "--dataset", ds, "--capacity", "10%", "--trace-out", out)
        assert rc == 0 and out.is_file(), err


@pytest.mark.parametrize("writer", ["data synth", "data import edgelist", "data presample", "place"])
def test_overwrite_refuses_a_folder_that_merely_has_a_manifest(env, tmp_path, writer):
    out = _foreign(tmp_path / "extension")
    before = listing(out)
    rc, _, err = run(*_writers(env, out)[writer])
    assert rc == 2 and err.startswith(f"error: {out}: exists and is not a Moment") and "refusing to replace" in err
    assert "Traceback" not in err
    assert listing(out) == before


def test_overwrite_of_a_link_to_a_dataset_says_it_is_a_link(tmp_path):
    """A link to a real dataset was "exists and is not a dataset directory": it is one, behind a link."""
    (tmp_path / "edges.txt").write_text("0 1\n1 2\n2 0\n")
    argv = ["data", "import", "edgelist", tmp_path / "edges.txt", "--feature-dim", "1", "--random-split",
            "0.34,0.33,0.33", "--out"]
    assert run(*argv, tmp_path / "real")[0] == 0
    (tmp_path / "lnk").symlink_to("real")
    before = listing(tmp_path / "real")
    rc, _, err = run(*argv, tmp_path / "lnk", "--overwrite")
    assert rc == 2 and err == (f"error: {tmp_path / 'lnk'}: is a symbolic link to real: refusing to replace it "
                               f"hint: give the directory itself ({os.path.realpath(tmp_path / 'real')})"), err
    assert listing(tmp_path / "real") == before and (tmp_path / "lnk").is_symlink()


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["data synth", "data import edgelist", "data presample", "place"])
def test_overwrite_refuses_its_own_kind_holding_a_persons_files(env, tmp_path, writer):
    """A real dataset / hotness / layout with files its manifest does not name: refused, naming them."""
    out = tmp_path / "mine"
    argv = _writers(env, out)[writer]
    assert run(*argv)[0] == 0  # a real one, written by the same command
    (out / "notes.txt").write_text("mine")
    (out / "results").mkdir()
    (out / "results" / "run1.csv").write_text("1,2")
    before = listing(out)
    rc, _, err = run(*argv)
    assert rc == 2 and "holds notes.txt, results/, which " in err and "refusing to replace it" in err, err
    assert listing(out) == before
    (out / "notes.txt").unlink()
    (out / "results" / "run1.csv").unlink()
    (out / "results").rmdir()
    rc, _, err = run(*argv)  # its own files only: replaced
    assert rc == 0, err


def test_remove_stale_spares_running_writers(tmp_path):
    out = tmp_path / "ds"
    dead, live = dead_pid(), os.getpid()
    stale = [tmp_path / f".ds.tmp-{dead}-abc123", tmp_path / f".ds.tmp-{dead}-x_9"]
    stale[0].mkdir()
    (stale[0] / "features.npy").write_bytes(b"0" * 100)
    stale[1].write_text("half a file")
    running = tmp_path / f".ds.tmp-{live}-def456"
    running.mkdir()
    other = [tmp_path / f".ds2.tmp-{dead}-abc", tmp_path / f".ds.tmp-{dead}", tmp_path / "ds.tmp-1-a"]
    for p in other:  # another output's, or not a temporary name at all
        p.write_text("x")
    old = tmp_path / f".ds.old-{dead}"
    old.mkdir()
    assert sorted(remove_stale(out)) == sorted(stale)
    assert running.is_dir() and all(p.exists() for p in other) and old.is_dir()  # .old: only with set_aside
    remove_stale(out, set_aside=True)
    assert out.is_dir() and not old.exists()  # the set-aside version went back where it was


def test_atomic_write_removes_a_killed_writers_temporary(tmp_path):
    f = tmp_path / "plan.svg"
    dead = tmp_path / f".plan.svg.tmp-{dead_pid()}-k1ll3d"
    dead.write_bytes(b"\0" * 1000)
    live = tmp_path / f".plan.svg.tmp-{os.getpid()}-l1v3"
    live.write_bytes(b"\0")
    atomic_write(f, "<svg/>")
    assert f.read_text() == "<svg/>" and not dead.exists() and live.exists()


def test_atomic_write_through_a_symlink_keeps_the_link(tmp_path):
    (tmp_path / "plans").mkdir()
    target = tmp_path / "plans" / "v3.json"
    target.write_text("old")
    (tmp_path / "plan.json").symlink_to(target)
    atomic_write(tmp_path / "plan.json", "new")
    assert (tmp_path / "plan.json").is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["plan.json", "plans", "v3.json"]


@pytest.mark.slow
def test_killed_synth_leaves_a_temporary_the_next_run_removes(tmp_path):
    out = tmp_path / "ds"
    args = ["data", "synth", "--nodes", "3000", "-d", "16", "--out", out]
    p = paused(args, tmp_path / "pause", "dataset-written")  # all arrays written, not yet in place
    p.send_signal(signal.SIGKILL)  # kill -9
    p.wait(timeout=60)
    (tmp_path / "pause").unlink()
    temps = [x for x in tmp_path.iterdir() if x.name.startswith(f".ds.tmp-{p.pid}-")]
    assert len(temps) == 1 and (temps[0] / "features.npy").stat().st_size > 3000 * 16 * 4 and not out.exists()
    r = cli(args)
    assert r.returncode == 0, r.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ds"]
    GraphDataset.open(out, verify=True)


def test_crash_between_the_renames_puts_the_old_dataset_back(tmp_path):
    out = tmp_path / "ds"
    assert run("data", "synth", "--nodes", "1000", "-d", "4", "--seed", "1", "--out", out)[0] == 0
    first = GraphDataset.open(out).dataset_id
    r = cli(["data", "synth", "--nodes", "1000", "-d", "4", "--seed", "2", "--out", out, "--overwrite"],
            {testpoints.CRASH_ENV: "dataset-old-moved"}, exchange=False)
    assert r.returncode == -signal.SIGKILL
    assert not out.exists() and any(x.name.startswith(".ds.old-") for x in tmp_path.iterdir())
    rc, _, err = run("data", "synth", "--nodes", "1000", "-d", "4", "--seed", "3", "--out", out)
    assert rc == 2 and "already exists" in err  # the next writer put the old dataset back first
    assert GraphDataset.open(out, verify=True).dataset_id == first
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ds"]


@pytest.mark.parametrize("exchange", [True, False], ids=["swap", "two-renames"])
def test_crash_after_the_new_dataset_is_in_place_keeps_it_and_the_next_writer_removes_the_old(tmp_path, exchange):
    out = tmp_path / "ds"
    assert run("data", "synth", "--nodes", "1000", "-d", "4", "--seed", "1", "--out", out)[0] == 0
    first = GraphDataset.open(out).dataset_id
    r = cli(["data", "synth", "--nodes", "1000", "-d", "4", "--seed", "2", "--out", out, "--overwrite"],
            {testpoints.CRASH_ENV: "dataset-swapped"}, exchange=exchange)
    assert r.returncode == -signal.SIGKILL
    second = GraphDataset.open(out, verify=True).dataset_id
    assert second != first and len(list(tmp_path.glob(".ds.[ot]*-*"))) == 1  # the old one, set aside
    assert run("data", "synth", "--nodes", "1000", "-d", "4", "--seed", "3", "--out", out, "--overwrite")[0] == 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["ds"]


# ---- layout rm: a file is not a layout; the layout's runs go with it ----------------------------------


@pytest.fixture
def layout(env, tmp_path):
    out = tmp_path / "L"
    rc, _, err = run(*_writers(env, out)["place"][:-1])
    assert rc == 0, err
    return out


def _run_dir(layout: Path, stamp: str = "20250101-120000") -> Path:
    run_dir = layout.with_name(layout.name + ".runs") / stamp
    (run_dir / "checkpoint").mkdir(parents=True)
    (run_dir / "torchrun.log").write_text("$ torchrun ...\n")
    (run_dir / "checkpoint" / "checkpoint.pt").write_bytes(b"ckpt")
    return run_dir


def test_layout_rm_of_a_file_says_it_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    rc, _, err = run("layout", "rm", tmp_path / "afile")
    assert rc == 2 and err == f"error: {tmp_path / 'afile'}: is a file, not a layout directory"
    assert (tmp_path / "afile").read_text() == "x"


def test_layout_rm_removes_the_layouts_runs(layout):
    _run_dir(layout)
    _run_dir(layout, "20250101-120000-2")
    killed = _run_dir(layout, "20250102-080000") / "checkpoint" / f".checkpoint.pt.tmp-{dead_pid()}-abc"
    killed.write_bytes(b"half")  # a run killed while it saved a checkpoint
    rc, out, err = run("layout", "rm", layout, "--json")
    assert rc == 0, err
    runs = layout.with_name("L.runs")
    assert json.loads(out)["removed_dirs"][-1] == str(runs)
    assert sorted(x.name for x in layout.parent.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("what", ["notes.txt", "20250101-120000/plot.png", "20250101-120000/checkpoint/best.pt",
                                  "my-experiment/"])
def test_layout_rm_refuses_runs_it_did_not_write(layout, what):
    _run_dir(layout)
    runs = layout.with_name("L.runs")
    p = runs / what
    p.mkdir() if what.endswith("/") else p.write_text("mine")
    before = listing(layout.parent)
    rc, _, err = run("layout", "rm", layout)
    assert rc == 2 and f"error: {runs}: holds {what}, which no training run wrote" in err, err
    assert listing(layout.parent) == before  # the layout too: nothing is deleted unless every check passes


# ---- a file of another kind given where one kind is expected ------------------------------------------


CLUSTER = """\
servers:
  - {profile: paper-machine-b, inventory: "4xA100-PCIe-40GB,8xP5510", count: 2}
network: {nic: CX6-Dx-100GbE, switch_gbit: 100}
"""


@pytest.mark.slow
def test_every_kind_moment_writes_is_recognised(env, layout, tmp_path):
    import yaml

    from moment.documents import kind_of

    t = tmp_path
    assert run("export", "--profile", "paper-machine-b", "--out", t / "prof.yaml")[0] == 0
    assert run("calibrate", "--measured", REPO / "tests/data/paper-machine-b-measured.yaml", "--out",
               t / "cal.yaml")[0] == 0
    assert run("data", "presample", env / "ds", "--out", t / "hot", "--num-batches", "2")[0] == 0
    for argv, name in ((["compare", "paper-machine-a", "paper-machine-b"], "cmp.json"),
                       (["simulate", "--profile", "paper-machine-b", "--placement", "paper-c"], "sim.json")):
        rc, out, _ = run(*argv, "--json")
        (t / name).write_text(out)
    (t / "prices.yaml").write_text("devices:\n  P5510: {price_usd: 1000, date: 2025-01, source: me}\n")
    (t / "cluster.yaml").write_text(CLUSTER)
    assert run("plan", "--cluster", t / "cluster.yaml")[0] == 0  # a cluster file as `plan --cluster` reads one
    want = {"prof.yaml": "profile", "cal.yaml": "calibration", "prices.yaml": "price file",
            "cluster.yaml": "cluster file", str(layout / "manifest.json"): "layout",
            "cmp.json": "comparison", "sim.json": "replay", "hot/hotness.json": "hotness",
            str(REPO / "tests/data/paper-machine-b-measured.yaml"): "measurement file",
            str(env / "plan.json"): "plan", str(env / "ds/manifest.json"): "dataset"}
    for f, kind in want.items():
        assert kind_of(yaml.safe_load((t / f).read_text())).name == kind, f


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "found", "hint"), [
    (["plan", "--calibration", "{measured}"], "a measurement file", "moment calibrate --measured {measured}"),
    (["calibrate", "--measured", "{cal}"], "a calibration", "pass it as --calibration {cal}"),
    (["plan", "--profile", "{plan}"], "a plan", "pass it as --plan {plan}"),
    (["simulate", "--plan", "{prof}"], "a profile", "pass it as --profile {prof}"),
    (["advise", "--profile", "paper-machine-b", "--budget", "1", "--prices", "{cal}"], "a calibration", ""),
    (["plan", "--calibration", "{plan}"], "a plan", "--plan"),
    (["data", "info", "{layout}"], "a layout", "--layout"),
    (["layout", "info", "{ds}"], "a dataset", "--dataset"),
    (["plan", "--profile", "{cluster}"], "a cluster file", "moment plan --cluster {cluster}"),
    (["plan", "--cluster", "{prof}"], "a profile", "pass it as --profile {prof}"),
    # directories: a hotness has no manifest.json, and none of the others has a hotness.json
    (["layout", "verify", "{hot}"], "a hotness", "--hotness"),
    (["data", "info", "{hot}"], "a hotness", "--hotness"),
    (["cache", "simulate", "--dataset", "{ds}", "--capacity", "10%", "--hotness", "{layout}"], "a layout", "--layout"),
    (["place", "--dataset", "{ds}", "--profile", "{t}/prof.yaml", *INV, "--plan", "{plan}", "--hotness", "{ds}", "--out",
      "{t}/never"], "a dataset",
     "--dataset"),
])
def test_a_file_of_another_kind_says_what_it_is(env, layout, argv, found, hint):
    t = env
    names = {"measured": REPO / "tests/data/paper-machine-b-measured.yaml", "cal": t / "cal.yaml",
             "plan": t / "plan.json", "prof": t / "prof.yaml", "layout": layout, "ds": t / "ds",
             "cluster": t / "cluster.yaml", "hot": t / "hot", "t": t}
    if not (t / "cal.yaml").exists():
        assert run("calibrate", "--measured", names["measured"], "--out", t / "cal.yaml")[0] == 0
    if not (t / "hot").exists():
        assert run("data", "presample", t / "ds", "--out", t / "hot", "--num-batches", "2")[0] == 0
    (t / "cluster.yaml").write_text(CLUSTER)
    rc, _, err = run(*(a.format(**names) for a in argv))
    assert rc == 2 and f"this is {found} (" in err and "Extra inputs" not in err, err
    assert hint.format(**names) in err.split("hint:")[1]


def test_a_non_utf8_input_names_the_byte(tmp_path):
    f = tmp_path / "rand.yaml"
    f.write_bytes(b"name: x\nnodes: [\xff\xfe]\n")
    rc, _, err = run("plan", "--profile", f)
    assert rc == 2 and err == f"error: {f}: not a text file: byte 0xff at offset 16 (line 2) is not UTF-8; expected a profile"


# ---- probe -----------------------------------------------------------------------------------------------


def test_probe_refuses_a_missing_directory_and_creates_nothing(tmp_path):
    rc, _, err = run("probe", "--size-mib", "16", "--ssd-path", f"ssd0={tmp_path / 'nvme9'}")
    assert rc == 2 and f"--ssd-path ssd0 {tmp_path / 'nvme9'}: does not exist" in err
    assert list(tmp_path.iterdir()) == []


def test_probe_removes_its_scratch_file_unless_kept(tmp_path):
    from moment.io.probe import probe_ssd, scratch_path

    size = 16 << 20
    r = probe_ssd(tmp_path, file_bytes=size, rand_reads=1000, repeats=1)
    assert r.seq_read_gbps > 0 and list(tmp_path.iterdir()) == []
    probe_ssd(tmp_path, file_bytes=size, rand_reads=1000, repeats=1, keep=True)
    assert [p.name for p in tmp_path.iterdir()] == [scratch_path(tmp_path, size).name]


def test_calibrate_and_probe_check_their_outputs_before_the_work(tmp_path, monkeypatch):
    import moment.io.probe as probe
    import moment.planner.calibration as cal

    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: pytest.fail("fitted before checking --out"))
    monkeypatch.setattr(probe, "probe_ssd", lambda *a, **k: pytest.fail("measured before checking the outputs"))
    measured = REPO / "tests/data/paper-machine-b-measured.yaml"
    for argv, flag in ((["calibrate", "--measured", measured, "--out", tmp_path / "no" / "cal.yaml"], "--out"),
                       (["probe", "--size-mib", "16", "--ssd-path", f"ssd0={tmp_path}", "--out", "/"], "--out"),
                       (["probe", "--size-mib", "16", "--ssd-path", f"ssd0={tmp_path}", "--profile", "paper-machine-a",
                         "--profile-out", tmp_path / "no" / "p.yaml"], "--profile-out")):
        rc, _, err = run(*argv)
        assert rc == 2 and err.startswith(f"error: {flag} "), err
    with pytest.raises(MomentError, match="does not exist"):
        probe.check_probe_dir(tmp_path / "nvme9", 16 << 20)
