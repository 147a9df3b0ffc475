"""Data safety: crash-safe `place --overwrite`, dataset verification, dataset identity,
output locks, `moment layout rm`. Crashes are real: a subprocess SIGKILLs itself at a named point
(moment.testpoints), and lock tests run two real processes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_place import CACHE, INV, TINY, run

from moment import testpoints
from moment.cli import main
from moment.errors import MomentError
from moment.locking import lock_path, locked
from moment.placement import open_layout, verify_layout
from moment.placement.reader import load_manifest
from moment.workload.graph import GraphDataset, GraphWriter

REPO = Path(__file__).resolve().parents[1]
N = 5000


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A small dataset, the tiny two-socket profile, a plan for it and saved hotness (fast `place`)."""
    from moment.workload.hotness import heldout_reads, presample
    from moment.workload.synth import synthesize

    tmp = tmp_path_factory.mktemp("safety")
    ds = synthesize(tmp / "ds", N, feature_dim=16, seed=5)
    prof = tmp / "tiny2.yaml"
    prof.write_text(TINY)
    rc, plan_json, err = run(["plan", "--profile", prof, *INV, "--json"])
    assert rc == 0, err
    (tmp / "plan.json").write_text(plan_json)
    presample(ds, [25, 10], 64, seed=0).save(tmp / "hot")
    np.save(tmp / "heldout.npy", heldout_reads(ds, *HELDOUT))  # what each `place` child is given (`cli`)
    return {"tmp": tmp, "ds": ds, "prof": prof}


def place_args(env, out: Path, *extra, dataset: Path | None = None) -> list:
    t = env["tmp"]
    return ["place", "--dataset", dataset or t / "ds", "--profile", env["prof"], *INV, *CACHE, "--plan",
            t / "plan.json", "--hotness", t / "hot", "--out", out, "--json", *extra]


#: `moment ARGS` on a file system without an atomic directory swap (renameat2 RENAME_EXCHANGE)
_NO_EXCHANGE = "import moment.outputs as o\no.exchange = lambda a, b: False\n"
#: the held-out sample (fan-outs, batch size, seed) of `env`'s hotness, which `place --hotness` draws
HELDOUT = ([25, 10], 64, 0)


def given_heldout(path: Path, key: tuple = HELDOUT) -> str:
    """Child code: `place` takes the held-out reads saved at `path` (an .npy), drawn for `key` (fan-outs, batch
    size, seed), instead of sampling them; a place asking for another sample fails. Why: the sampler's torch
    import and sampling were most of a killed `place` child's ~1.3 CPU-s, and those tests are about what it
    writes."""
    return ("import numpy as np\nimport moment.placement.api as api\n"
            f"_h = np.load({str(path)!r})\n"
            "def _given(ds, fanouts, batch_size, seed, progress=None):\n"
            f"    assert ([int(f) for f in fanouts], int(batch_size), int(seed)) == {tuple(key)!r}\n"
            "    return _h\napi.heldout_reads = _given\n")


def cli(args: list, env_vars: dict | None = None, wait: bool = True, exchange: bool = True,
        heldout: Path | None = None, prelude: str = ""):
    """`python -m moment ARGS` as a real process (run from the repository, so it imports this tree);
    `exchange=False`: as on a file system that cannot swap directories atomically; `heldout`: a `place` is
    given that saved held-out sample (`given_heldout`); `prelude`: code the process runs first."""
    e = {**os.environ, **(env_vars or {})}
    pre = ("" if exchange else _NO_EXCHANGE) + ("" if heldout is None else given_heldout(heldout)) + prelude
    code = f"import sys\n{pre}from moment.cli import main\nsys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, *(["-c", code] if pre else ["-m", "moment"]), *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=180, check=False)


def here(args: list) -> tuple[int, str]:
    """`moment ARGS` in this process: its exit status and its stderr as written (test_place's `run` unwraps it),
    for a command that need not be a process of its own (one refused before it writes)."""
    said = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        code = main([str(a) for a in args])
    return code, said.getvalue()


def _mounts(tmp: Path, name: str) -> tuple[Path, Path]:
    a, b = tmp / f"{name}-m1", tmp / f"{name}-m2"
    a.mkdir()
    b.mkdir()
    return a, b


def _policy(layout: Path) -> str:
    return json.loads((layout / "manifest.json").read_text())["plan"]["policy"]


def _assert_clean(layout: Path, mounts) -> None:
    """Nothing but the layout and the shard directories its manifest points to."""
    assert not layout.with_name(layout.name + ".partial").exists()
    assert not layout.with_name(layout.name + ".old").exists()
    assert not lock_path(layout).exists()
    used = {Path(s.path).parent for s in load_manifest(layout).shards if Path(s.path).is_absolute()}
    assert {d for m in mounts for d in m.iterdir()} == used


def _bit_exact(env, layout: Path) -> None:
    feats = np.asarray(env["ds"].features_memmap())
    assert np.array_equal(open_layout(layout).rows(np.arange(N)), feats)


# ---- 1. `place --overwrite` keeps the old layout valid until the new one is complete ------------------


@pytest.mark.slow
@pytest.mark.parametrize("point,survivor", [("layout-written", "ddak"), ("layout-shards-renamed", "ddak"),
                                            ("layout-swapped", "hash"), ("layout-old-shards-removed", "hash")])
def test_overwrite_killed_at_each_commit_step_leaves_a_valid_layout(env, point, survivor):
    t = env["tmp"]
    out = t / f"L-{point}"
    m1, m2 = _mounts(t, point)
    ssd = ["--ssd-path", f"ssd1={m1}", "--ssd-path", f"ssd2={m2}"]
    rc, _, err = run(place_args(env, out, *ssd))
    assert rc == 0, err
    r = cli(place_args(env, out, *ssd, "--overwrite", "--policy", "hash"), {testpoints.CRASH_ENV: point},
            heldout=t / "heldout.npy")
    assert r.returncode == -9, r.stderr  # SIGKILLed itself: no clean-up ran
    rc, o, err = run(["layout", "verify", out, "--json"])
    assert rc == 0 and json.loads(o)["ok"], err  # old or new, but complete, at LAYOUT
    assert _policy(out) == survivor
    _bit_exact(env, out)
    # the next writer cleans up after the crash (and the stale lock file does not block it)
    rc, _, err = run(place_args(env, out, *ssd, "--overwrite", "--policy", "degree"))
    assert rc == 0, err
    assert _policy(out) == "degree" and verify_layout(out).ok
    _assert_clean(out, (m1, m2))


def test_overwrite_without_atomic_exchange_restores_the_old_layout(env, monkeypatch):
    """File systems without RENAME_EXCHANGE: LAYOUT goes to LAYOUT.old, then LAYOUT.partial to LAYOUT;
    a crash between the two leaves the old layout at LAYOUT.old, which the next writer puts back."""
    import moment.placement.layout as layout_mod

    t = env["tmp"]
    out = t / "L-noexchange"
    m1, m2 = _mounts(t, "noexchange")
    ssd = ["--ssd-path", f"ssd1={m1}", "--ssd-path", f"ssd2={m2}"]
    assert run(place_args(env, out, *ssd))[0] == 0

    class Killed(BaseException):
        pass

    def reach(point):
        if point == "layout-old-moved":
            raise Killed

    import moment.outputs

    monkeypatch.setattr(moment.outputs, "exchange", lambda a, b: False)
    monkeypatch.setattr(layout_mod.testpoints, "reach", reach)
    real_recover = layout_mod._recover
    monkeypatch.setattr(layout_mod, "_recover", lambda out, mounts, *published: None)  # as if killed: no clean-up
    with pytest.raises(Killed):
        run(place_args(env, out, *ssd, "--overwrite", "--policy", "hash"))
    assert not out.exists() and verify_layout(out.with_name(out.name + ".old")).ok
    rc, _, err = run(["layout", "verify", out])
    assert rc == 2 and f"{out.name}.old" in err
    monkeypatch.setattr(layout_mod, "_recover", real_recover)
    monkeypatch.setattr(layout_mod.testpoints, "reach", lambda point: None)
    rc, _, err = run(place_args(env, out, *ssd, "--overwrite", "--policy", "degree"))
    assert rc == 0, err
    assert _policy(out) == "degree" and verify_layout(out).ok
    _assert_clean(out, (m1, m2))
    _bit_exact(env, out)


@pytest.mark.slow
def test_a_layout_moved_away_keeps_its_shards_when_one_is_placed_where_it_was(env):
    """hunt-K D2: a new `place --out L` (killed, then run again) took the SSD shard directory of the layout moved
    from L to L-moved for a killed write's orphan: deleted, then written again with other rows."""
    t = env["tmp"]
    out, moved = t / "L-moved", t / "L-moved-away"
    m1, m2 = _mounts(t, "moved")
    ssd = ["--ssd-path", f"ssd1={m1}", "--ssd-path", f"ssd2={m2}"]
    assert run(place_args(env, out, *ssd))[0] == 0
    out.rename(moved)
    r = cli(place_args(env, out, *ssd, "--policy", "hash"), {testpoints.CRASH_ENV: "layout-written"},
            heldout=t / "heldout.npy")
    assert r.returncode == -9, r.stderr
    assert verify_layout(moved).ok
    rc, _, err = run(place_args(env, out, *ssd, "--policy", "degree"))
    assert rc == 0, err
    rc, o, err = run(["layout", "verify", moved, "--json"])
    assert rc == 0 and json.loads(o)["ok"], o + err
    _bit_exact(env, moved)
    assert _policy(out) == "degree" and verify_layout(out).ok
    assert not out.with_name(out.name + ".partial").exists()  # the killed write's leftovers went, the moved one's
    for m in (m1, m2):  # shard directories stayed, and the new layout's are beside them
        assert {d.name for d in m.iterdir()} == {Path(s.path).parent.name for x in (moved, out)
                                                 for s in load_manifest(x).shards if s.path.startswith(str(m))}


def test_overwrite_refuses_what_is_not_a_layout(env):
    out = env["tmp"] / "not-a-layout"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, _, err = run(place_args(env, out, "--overwrite"))
    assert rc == 2 and "not a Moment layout" in err and "refusing to replace it" in err
    assert (out / "notes.txt").read_text() == "mine"


def test_place_refuses_an_ssd_path_that_a_replace_or_rm_would_delete(env):
    """hunt-K D1: a shard written inside the layout it replaces, or inside a shard directory (its old one, or
    another layout's), went when that was removed; such an --ssd-path is refused before anything is written."""
    t = env["tmp"]
    out, mnt = t / "L-ssdin", t / "ssdin-m"
    mnt.mkdir()
    assert run(place_args(env, out, "--ssd-path", f"ssd1={mnt}"))[0] == 0
    (shards,) = mnt.iterdir()
    before = sorted(p.name for p in out.rglob("*")), sorted(p.name for p in mnt.rglob("*"))
    for path, what in ((out, "a Moment layout's directory"), (out / "shards", "a Moment layout's directory"),
                       (shards, "a Moment shard directory")):
        for extra in (["--overwrite"], []):  # replacing it, or a new layout beside it
            rc, _, err = run(place_args(env, out if extra else t / "L-ssdin-2", *extra, "--ssd-path",
                                        f"ssd1={mnt}", "--ssd-path", f"ssd2={path}"))
            assert rc == 2 and f"error: {path}: SSD bin ssd2: mount path is in {what}" in err, err
    assert (sorted(p.name for p in out.rglob("*")), sorted(p.name for p in mnt.rglob("*"))) == before
    assert not (t / "L-ssdin-2").exists() and verify_layout(out).ok


# ---- 2. `place` verifies the dataset against its manifest ---------------------------------------------


def _copy_dataset(env, name: str) -> Path:
    d = env["tmp"] / name
    shutil.copytree(env["tmp"] / "ds", d)
    return d


@pytest.mark.slow
def test_place_refuses_a_flipped_byte_naming_the_file(env):
    d = _copy_dataset(env, "ds-flip")
    f = d / "features.npy"
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size - 100)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0x01]))
    out = env["tmp"] / "L-flip"
    code, said = here(place_args(env, out, dataset=d))
    assert code == 2 and "Traceback" not in said
    lines = said.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and "sha256 mismatch" in lines[0], said
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()
    # --no-verify skips the full re-hash, and says so; its sampled blocks (all of so small a file) still
    # find the flip, as the start of a run would
    rc, o, err = run(place_args(env, out, "--no-verify", dataset=d))
    assert rc == 2 and str(f) in err and "block checksum" in err, err
    rc, o, err = run(place_args(env, out, "--no-verify"))
    assert rc == 0 and "not verified (--no-verify)" in err
    assert json.loads(o)["dataset_verified"] is False


@pytest.mark.parametrize("bad,word", [("0" * 64, "zeroed"), ("abc", "malformed"), ("Z" * 64, "malformed")])
def test_place_refuses_a_zeroed_or_malformed_manifest_checksum(env, bad, word):
    d = _copy_dataset(env, f"ds-{word}-{len(bad)}{bad[0]}")
    m = json.loads((d / "manifest.json").read_text())
    m["files"]["features"]["sha256"] = bad
    (d / "manifest.json").write_text(json.dumps(m))
    out = env["tmp"] / f"L-{word}"
    for extra in ([], ["--no-verify"]):  # a bogus checksum is never copied into a layout
        rc, _, err = run(place_args(env, out, *extra, dataset=d))
        assert rc == 2 and f"checksum of features.npy is {word}" in err, err
        assert not out.exists()


def test_place_says_the_dataset_was_verified(env):
    out = env["tmp"] / "L-verified"
    rc, o, err = run(place_args(env, out))
    assert rc == 0, err
    r = json.loads(o)
    assert r["dataset_verified"] is True and "verify_s" in r["timings"]
    assert load_manifest(out).dataset.id == env["ds"].dataset_id
    rc, o, err = run([a for a in place_args(env, env["tmp"] / "L-verified-text") if a != "--json"])
    assert rc == 0 and "dataset checksums: verified against its manifest" in " ".join(o.split()), err


# ---- 3. a layout trains only with the dataset it was placed from -------------------------------------


@pytest.mark.slow
def test_train_refuses_another_dataset_of_the_same_size(env, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    import moment.runtime.train as train_mod
    from moment.cli.train_cmds import _precheck
    from moment.workload.synth import synthesize

    t = env["tmp"]
    other = synthesize(t / "ds-other", N, feature_dim=16, seed=6)
    assert other.num_nodes == env["ds"].num_nodes and other.dataset_id != env["ds"].dataset_id
    same = GraphDataset.open(_copy_dataset(env, "ds-same"))  # a copy is the same dataset
    assert same.dataset_id == env["ds"].dataset_id
    out = t / "L-train"
    assert run(place_args(env, out))[0] == 0
    _precheck(["--layout", str(out)])
    _precheck(["--layout", str(out), "--dataset", str(same.path)])
    rc, _, err = run(["train", "--layout", out, "--dataset", other.path, "--epochs", "1"])
    assert rc == 2 and "placed from another dataset" in err and str(other.path) in err, err
    capsys.readouterr()
    assert train_mod.main(["--layout", str(out), "--dataset", str(other.path), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "placed from another dataset" in err and "Traceback" not in err
    # a layout written before dataset ids: the features checksum decides, and a note says so
    m = json.loads((out / "manifest.json").read_text())
    del m["dataset"]["id"], m["sha256"]  # (written before both)
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(MomentError, match="placed from other features"):
        _precheck(["--layout", str(out), "--dataset", str(other.path)])
    capsys.readouterr()
    _precheck(["--layout", str(out)])
    assert "records no dataset id" in " ".join(capsys.readouterr().err.split())


# ---- 4. one writer per output ------------------------------------------------------------------------


def paused(args: list, flag: Path, point: str = "locked", heldout: Path | None = None) -> subprocess.Popen:
    """Start `moment ARGS` (`heldout`: as `cli`'s) and wait until it reaches the test point `point` (default: it
    holds its lock); it then waits there for `flag` to go."""
    p = cli(args, {testpoints.PAUSE_ENV: point, testpoints.PAUSE_FILE_ENV: str(flag)}, wait=False, heldout=heldout)
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return p


@pytest.mark.slow
def test_second_place_on_the_same_out_is_refused_naming_the_holder(env):
    t = env["tmp"]
    out = t / "L-locked"
    first = paused(place_args(env, out), t / "pause-place", heldout=t / "heldout.npy")
    try:  # the second, refused, in this process (only the first must be another: the lock's holder)
        code, said = here(place_args(env, out))
    finally:
        (t / "pause-place").unlink()
    o, e = first.communicate(timeout=180)
    assert first.returncode == 0, e
    assert code == 2 and "Traceback" not in said
    lines = said.strip().splitlines()
    assert len(lines) == 1, said
    msg = lines[0]
    assert f"layout is locked by pid {first.pid} on host {socket.gethostname()} since " in msg
    assert f"(moment place --dataset {t / 'ds'}" in msg and str(out) in msg
    assert verify_layout(out).ok and json.loads(o)["layout"] == str(out)
    assert not lock_path(out).exists()


@pytest.mark.slow
def test_lock_of_a_killed_writer_does_not_block(env):
    out = env["tmp"] / "L-stale"
    r = cli(place_args(env, out), {testpoints.CRASH_ENV: "locked"})
    assert r.returncode == -9 and lock_path(out).exists()  # the dead holder's lock file stays
    rc, _, err = run(place_args(env, out))
    assert rc == 0, err
    assert verify_layout(out).ok and not lock_path(out).exists()


def test_a_full_disk_does_not_break_taking_a_lock(tmp_path, monkeypatch):
    """Writing who holds the lock is a courtesy: with no room for it the lock still holds (and is freed);
    the work that needs the room says why it fails."""
    import errno

    def full(*_a):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    out = tmp_path / "out"
    with locked(out, "layout"):
        other = subprocess.run([sys.executable, "-c", f"from moment.locking import locked\nwith locked({str(out)!r}, "
                                "'layout'): pass"], capture_output=True, text=True, timeout=60, check=False)
        assert other.returncode != 0 and "layout is locked by another process" in other.stderr, other.stderr
    assert not lock_path(out).exists()


@pytest.mark.slow
def test_second_data_synth_on_the_same_out_is_refused(tmp_path):
    out = tmp_path / "ds"
    args = ["data", "synth", "-n", "2000", "-d", "4", "--out", out, "--json"]
    first = paused(args, tmp_path / "pause")
    try:
        second = cli([*args, "--overwrite"])
    finally:
        (tmp_path / "pause").unlink()
    assert first.wait(timeout=180) == 0
    assert second.returncode == 2
    assert f"dataset is locked by pid {first.pid}" in second.stderr and "moment data synth" in second.stderr
    GraphDataset.open(out, verify=True)


def test_lock_is_reentrant_in_a_process_and_exclusive_across_opens(tmp_path):
    target = tmp_path / "out"
    with locked(target, "layout"), locked(target, "layout"):
        assert lock_path(target).exists()
        info = json.loads(lock_path(target).read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert not lock_path(target).exists()
    lock_path(target).write_text("{}")  # a stale lock file nobody holds
    with GraphWriter(target) as w:
        w.abort()
    assert not lock_path(target).exists()


# ---- 7. `moment layout rm` ---------------------------------------------------------------------------


def test_layout_rm_removes_the_layout_and_its_shard_directories(env):
    t = env["tmp"]
    out = t / "L-rm"
    m1, m2 = _mounts(t, "rm")
    assert run(place_args(env, out, "--ssd-path", f"ssd1={m1}", "--ssd-path", f"ssd2={m2}"))[0] == 0
    assert run(place_args(env, out, "--ssd-path", f"ssd0={m1}", "--overwrite"))[0] == 0  # moved shards
    dirs = sorted({str(Path(s.path).parent) for s in load_manifest(out).shards if Path(s.path).is_absolute()})
    assert len(dirs) == 1 and list(m2.iterdir()) == []
    rc, o, err = run(["layout", "rm", out, "--json"])
    assert rc == 0, err
    rep = json.loads(o)
    assert rep["removed_dirs"] == [str(out), *dirs] and rep["files"] > 5 and rep["bytes"] > 0
    assert not out.exists() and list(m1.iterdir()) == [] and list(m2.iterdir()) == []
    assert not lock_path(out).exists()
    rc, _, err = run(["layout", "rm", out])
    assert rc == 2 and "layout directory not found" in err
    # text output
    assert run(place_args(env, out))[0] == 0
    rc, o, _ = run(["layout", "rm", out])
    assert rc == 0 and "removed layout" in o and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["foreign_shard_file", "foreign_layout_file", "not_layout", "no_manifest",
                                  "copied", "outside"])
def test_layout_rm_refuses_what_it_does_not_own(env, case):
    t = env["tmp"]
    out = t / f"L-rm-{case}"
    m1, m2 = _mounts(t, f"rm-{case}")
    assert run(place_args(env, out, "--ssd-path", f"ssd1={m1}"))[0] == 0
    shard_dir = next(m1.iterdir())
    target, want = out, None
    if case == "foreign_shard_file":
        (shard_dir / "photos.tar").write_text("x")
        want = "photos.tar, which the layout's manifest does not name"
    elif case == "foreign_layout_file":
        (out / "lists" / "notes.txt").write_text("x")
        want = "lists/notes.txt, which the layout's manifest does not name"
    elif case == "not_layout":
        m = json.loads((out / "manifest.json").read_text())
        m["format"] = "something-else"
        (out / "manifest.json").write_text(json.dumps(m))
        want = "not a Moment layout"
    elif case == "no_manifest":
        target, want = m2, "no manifest.json"
    elif case == "copied":
        target = t / f"L-rm-{case}-copy"
        shutil.copytree(out, target)
        want = "was not written for a layout at"
    else:
        m = json.loads((out / "manifest.json").read_text())
        m["shards"][0]["path"] = "../../etc/passwd"
        (out / "manifest.json").write_text(json.dumps(m))
        want = "outside the layout"
    before = sorted(p for p in t.rglob("*") if f"rm-{case}" in str(p))
    rc, _, err = run(["layout", "rm", target])
    assert rc == 2 and want in err, err
    assert sorted(p for p in t.rglob("*") if f"rm-{case}" in str(p)) == before  # nothing deleted


def test_place_and_rm_keep_a_partial_or_old_that_is_not_a_killed_writes(env):
    """hunt-K D9: LAYOUT.partial / LAYOUT.old of the user's (a layout placed there, a file, a folder of notes) were
    removed or put back by `place --out LAYOUT` and `layout rm LAYOUT` as a killed write's; now only what carries
    Moment's mark for LAYOUT is, anything else is refused, named, and kept."""
    t = env["tmp"]
    a = t / "L-d9"
    for x in (a, t / "L-d9.partial", t / "L-d9.old"):
        assert run(place_args(env, x))[0] == 0
    for argv in (place_args(env, a, "--overwrite", "--policy", "hash"), ["layout", "rm", a]):
        rc, _, err = run(argv)
        assert rc == 2 and f"error: {a}.partial: exists, and is not what a killed write or removal of L-d9 left" \
            in err, err
        assert _policy(a) == "ddak" and verify_layout(a).ok  # nothing was written, removed or put back
        assert verify_layout(t / "L-d9.partial").ok and verify_layout(t / "L-d9.old").ok
    shutil.rmtree(a)  # no layout at L-d9: its .old, a layout of the user's, is not put back either
    shutil.rmtree(t / "L-d9.partial")
    rc, _, err = run(place_args(env, a))
    assert rc == 2 and f"error: {a}.old: exists, and is not" in err and not a.exists(), err
    assert verify_layout(t / "L-d9.old").ok
    f, g = t / "F-d9", t / "G-d9"
    f.with_name("F-d9.partial").write_text("my notes")
    g.with_name("G-d9.partial").mkdir()
    g.with_name("G-d9.partial").joinpath("notes.txt").write_text("my notes")
    for x in (f, g):
        rc, _, err = run(place_args(env, x))
        assert rc == 2 and f"error: {x}.partial: exists" in err and not x.exists(), err
    assert f.with_name("F-d9.partial").read_text() == "my notes"
    assert g.with_name("G-d9.partial").joinpath("notes.txt").read_text() == "my notes"


def test_layout_rm_help_explains():
    r = cli(["layout", "rm", "--help"])
    text = " ".join(r.stdout.split())
    assert r.returncode == 0
    for words in ("every shard directory", "refuses anything it does not own", "--json"):
        assert words in text, text
