"""Outputs: unwritable paths, a full disk and absurd sizes are one message naming
the input, before any work and with nothing left behind; what is written follows the umask."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.outputs import check_output, current_umask

HERE = Path(__file__).resolve().parent / "data" / "this-machine"


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def one_message(rc: int, err: str, *needles: str) -> None:
    """Exit 2, no traceback, the message (first line, unwrapped) names every needle."""
    assert rc == 2, err
    err = err.lstrip()  # a transient progress bar leaves an empty line
    assert "Traceback" not in err and err.startswith("error:"), err
    first = " ".join(err.split("\n  hint:")[0].split())
    for n in needles:
        assert n in first, (n, first)


def _unwritable(d: Path) -> bool:
    try:
        (d / ".moment-test-probe").touch()
    except OSError:
        return True
    (d / ".moment-test-probe").unlink()
    return False


@pytest.fixture
def readonly(tmp_path):
    """A directory nobody can write in: a 0555 directory, or (root ignores modes) one of a read-only
    file system such as /sys."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        if _unwritable(d):
            yield d
            return
        for cand in (Path("/sys"), Path("/proc/sys")):
            if cand.is_dir() and _unwritable(cand):
                yield cand
                return
        pytest.skip("no unwritable directory on this machine")
    finally:
        d.chmod(0o755)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from moment.workload.synth import synthesize

    root = tmp_path_factory.mktemp("outputs")
    synthesize(root / "ds", 2000, feature_dim=8, seed=1)
    return root / "ds"


def _listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


# ---- the helper --------------------------------------------------------------------------------------


def test_check_output(tmp_path, readonly):
    (tmp_path / "afile").write_text("x")
    assert check_output(tmp_path / "new.yaml", "--out") == tmp_path / "new.yaml"
    assert check_output(tmp_path / "a" / "b", "--out", directory=True) == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checking creates nothing
    cases = [
        (dict(path=tmp_path / "afile" / "sub", directory=True), "is a file, not a directory"),
        (dict(path=tmp_path / "afile" / "x.svg"), "is a file, not a directory"),
        (dict(path=tmp_path / "missing" / "x.svg"), "does not exist"),
        (dict(path=tmp_path), "is a directory"),
        (dict(path=tmp_path / "afile", directory=True), "not a directory"),
        (dict(path=readonly / "x.yaml"), "cannot write in"),
        (dict(path=readonly / "new" / "ds", directory=True), "cannot write in"),
        (dict(path=""), "empty path"),
    ]
    for kw, msg in cases:
        with pytest.raises(MomentError, match=msg) as e:
            check_output(what="--out", **kw)
        assert str(e.value).startswith("--out")


# ---- item 5: unwritable outputs fail up front, with one message ----------------------------------------


def test_unwritable_outputs_are_one_message(tmp_path, readonly, dataset, monkeypatch):
    import moment.planner.plan as plan_mod

    def no_solving(*a, **k):
        raise AssertionError("the output must be checked before solving")

    monkeypatch.setattr(plan_mod, "make_plan", no_solving)
    before = _listing(tmp_path)
    cases = [
        (["data", "synth", "--nodes", "1000", "--out", readonly / "ds"], "--out"),
        (["data", "presample", dataset, "--out", readonly / "hot"], "--out"),
        (["data", "import", "edgelist", HERE / "lspci-tv.txt", "--out", readonly / "g"], "--out"),
        (["plan", "--diagram", readonly / "p.svg"], "--diagram"),
        (["plan", "--diagram", readonly / "p.png"], "--diagram"),
        (["scan", "--from-lspci", HERE / "lspci-tv.txt", "--out", readonly / "m.yaml"], "--out"),
        (["export", "--profile", "paper-machine-b", "--format", "nccl-xml", "-o", readonly / "t.xml"], "--out"),
        (["schema", "topology", "--out", readonly / "s.json"], "--out"),
        (["place", "--dataset", dataset, "--out", readonly / "L"], "--out"),
        (["cache", "simulate", "--dataset", dataset, "--capacity", "10%", "--trace-out", readonly / "t.npz"],
         "--trace-out"),
    ]
    for argv, option in cases:
        rc, out, err = run(*argv)
        one_message(rc, err, option, str(argv[-1]), "cannot write in")
    assert _listing(tmp_path) == before


def test_paths_under_a_file_and_missing_directories(tmp_path, monkeypatch):
    import moment.planner.plan as plan_mod

    monkeypatch.setattr(plan_mod, "make_plan", lambda *a, **k: (_ for _ in ()).throw(AssertionError("solved")))
    (tmp_path / "afile").write_text("x")
    rc, _, err = run("data", "synth", "--nodes", "1000", "--out", tmp_path / "afile" / "sub")
    one_message(rc, err, "--out", "afile is a file, not a directory")
    for suffix in ("png", "svg"):  # both forms alike: checked before solving, no directory made
        rc, _, err = run("plan", "--diagram", tmp_path / "missing" / "dir" / f"p.{suffix}")
        one_message(rc, err, "--diagram", "does not exist")
    rc, _, err = run("plan", "--diagram", tmp_path / "p.pdf")
    one_message(rc, err, "--diagram", ".svg or .png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_moment_train_checks_metrics_json_before_starting_ranks(tmp_path, readonly, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    import subprocess

    monkeypatch.setattr(subprocess, "call", lambda *a, **k: pytest.fail("torchrun must not start"))
    rc, _, err = run("train", "--nproc", "2", "--layout", tmp_path, "--metrics-json", readonly / "m.json")
    one_message(rc, err, "--metrics-json", "cannot write in")


def test_train_outputs_are_checked_before_the_run(tmp_path, readonly):
    from moment.runtime.config import parse_args

    with pytest.raises(MomentError, match="--metrics-json .*cannot write in"):
        parse_args(["--layout", str(tmp_path), "--metrics-json", str(readonly / "m.json")])
    with pytest.raises(MomentError, match="--metrics-json .*does not exist"):
        parse_args(["--layout", str(tmp_path), "--metrics-json", str(tmp_path / "no" / "m.json")])
    with pytest.raises(MomentError, match="--checkpoint-dir .*cannot write in"):
        parse_args(["--layout", str(tmp_path), "--checkpoint-dir", str(readonly / "ck")])


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_gb_per_gpu_must_be_a_finite_positive_number(value):
    rc, _, err = run("plan", "--gb-per-gpu", value)
    one_message(rc, err, "--gb-per-gpu")


def test_huge_node_id_is_refused_before_allocating(tmp_path, monkeypatch):
    import moment.sizes

    monkeypatch.setattr(moment.sizes, "available_memory", lambda: 8 << 30)
    e = tmp_path / "e.txt"
    e.write_text("0 1\n1 99999999999\n")
    rc, _, err = run("data", "import", "edgelist", e, "--out", tmp_path / "g")
    one_message(rc, err, "e.txt", "largest node id is 99,999,999,999", "100,000,000,000 nodes", "8.0 GiB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.txt"]


# ---- item 5: a full disk while writing ---------------------------------------------------------------


def _full_disk_after(monkeypatch, target, attr: str, calls: int = 2):
    """Make `target.attr` raise ENOSPC from its `calls`-th call on."""
    real = getattr(target, attr)
    n = {"calls": 0}

    def fake(*a, **k):
        n["calls"] += 1
        if n["calls"] >= calls:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*a, **k)

    monkeypatch.setattr(target, attr, fake)


def test_full_disk_during_synth_leaves_nothing(tmp_path, monkeypatch):
    from moment.workload.graph import NpyStreamWriter

    _full_disk_after(monkeypatch, NpyStreamWriter, "_put", calls=5)
    rc, _, err = run("data", "synth", "--nodes", "3000", "--feature-dim", "8", "--out", tmp_path / "ds")
    one_message(rc, err, str(tmp_path / "ds"), "no space left on the device")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_presample_leaves_nothing(tmp_path, dataset, monkeypatch):
    _full_disk_after(monkeypatch, np, "save", calls=2)
    rc, _, err = run("data", "presample", dataset, "--batch-size", "64", "--num-batches", "2",
                     "--out", tmp_path / "hot")
    one_message(rc, err, str(tmp_path / "hot"), "no space left on the device")
    assert list(tmp_path.iterdir()) == []


def test_full_disk_during_place_leaves_nothing(tmp_path, dataset, monkeypatch):
    import moment.placement.layout as layout_mod

    _full_disk_after(monkeypatch, layout_mod, "_save_npy", calls=1)
    rc, _, err = run("place", "--dataset", dataset, "--gpus", "2", "--ssds", "2", "--batches", "2",
                     "--gpu-cache", "5%", "--cpu-cache", "5%", "--out", tmp_path / "L")
    one_message(rc, err, "L", "cannot write the layout", "no space left on the device")
    assert list(tmp_path.iterdir()) == []


def test_full_ssd_mount_during_place_names_that_mount_not_the_out(tmp_path, dataset, monkeypatch):
    """A shard on an --ssd-path mount that fills up names that file and its --ssd-path; --out, whose file system
    may have plenty of room, was named (and the hint said to choose another output location)."""
    import moment.placement.layout as layout_mod

    ssd, real = tmp_path / "ssd", layout_mod._Writer._shard
    ssd.mkdir()

    def full(self, final, *a, **k):
        if Path(final).is_relative_to(ssd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, final, *a, **k)

    monkeypatch.setattr(layout_mod._Writer, "_shard", full)
    rc, _, err = run("place", "--dataset", dataset, "--gpus", "2", "--ssds", "2", "--batches", "2",
                     "--gpu-cache", "5%", "--cpu-cache", "5%", "--ssd-path", f"ssd0={ssd}", "--out", tmp_path / "L")
    one_message(rc, err, f"--ssd-path ssd0 {ssd}/", "ssd0.shard", "no space left on the device")
    assert f"free some space on {ssd}, or give ssd0 another --ssd-path" in " ".join(err.split()), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ssd"] and not list(ssd.iterdir())


def test_too_little_free_space_shows_the_sizes_in_a_unit_that_tells_them_apart(tmp_path, dataset, monkeypatch):
    """A small layout's refusal read "needs 0.00 GiB here, 0.00 GiB free"."""
    import moment.placement.layout as layout_mod

    monkeypatch.setattr(layout_mod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 20, 1 << 20, 65536))
    rc, _, err = run("place", "--dataset", dataset, "--gpus", "2", "--ssds", "2", "--batches", "2",
                     "--gpu-cache", "5%", "--cpu-cache", "5%", "--out", tmp_path / "L")
    one_message(rc, err, "not enough free space: the layout needs 1.1 MiB here, 64.0 KiB free")
    assert "0.00" not in err


def test_full_disk_during_atomic_write(tmp_path, monkeypatch):
    _full_disk_after(monkeypatch, os, "fsync", calls=1)
    rc, _, err = run("export", "--profile", "paper-machine-b", "-o", tmp_path / "t.yaml")
    one_message(rc, err, "--out", "t.yaml", "no space left on the device")
    assert list(tmp_path.iterdir()) == []


# ---- item 8: modes follow the umask ------------------------------------------------------------------


@pytest.fixture
def umask():
    old = os.umask(0o022)
    try:
        yield lambda m: os.umask(m)
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.slow
@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path, umask, mask, dataset):
    umask(mask)
    assert current_umask() == mask
    file_mode, dir_mode = 0o666 & ~mask, 0o777 & ~mask
    assert run("data", "synth", "--nodes", "1000", "--feature-dim", "4", "--out", tmp_path / "ds")[0] == 0
    assert run("data", "presample", dataset, "--batch-size", "64", "--num-batches", "2",
               "--out", tmp_path / "hot")[0] == 0
    assert run("scan", "--from-lspci", HERE / "lspci-tv.txt", "--out", tmp_path / "m.yaml")[0] == 0
    assert run("export", "--profile", "paper-machine-b", "--format", "nccl-xml", "-o", tmp_path / "t.xml")[0] == 0
    assert run("schema", "plan", "--out", tmp_path / "s.json")[0] == 0
    from moment.planner.diagram import write_diagram
    from moment.topology.profiles import load_profile

    topo = load_profile("paper-machine-b")
    write_diagram(topo, [], tmp_path / "p.svg")
    write_diagram(topo, [], tmp_path / "p.png")
    for d in (tmp_path / "ds", tmp_path / "hot"):
        assert _mode(d) == dir_mode, d
        for f in d.iterdir():
            assert _mode(f) == file_mode, f
    for f in ("m.yaml", "t.xml", "s.json", "p.svg", "p.png"):
        assert _mode(tmp_path / f) == file_mode, f


def test_a_pipe_or_device_given_as_out_is_written_into_not_replaced(tmp_path: Path) -> None:
    """`--out /dev/stdout`, a FIFO a reader waits on, /dev/null: each is a stream to write, not a file to replace
    (a temporary file renamed over it turned /dev/full and /dev/null into regular files, run as root). A FIFO
    and a link to it stand in for the devices here."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    for target in (fifo, tmp_path / "link"):
        got: list[bytes] = []
        reader = threading.Thread(target=lambda got=got: got.append(fifo.read_bytes()), daemon=True)
        reader.start()
        assert main(["export", "--profile", "paper-machine-b", "--out", str(target)]) == 0
        reader.join(timeout=30)
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0].startswith(b"name: paper-machine-b")
    assert os.path.islink(tmp_path / "link") and sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link"]
