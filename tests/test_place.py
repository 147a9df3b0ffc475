"""`moment place` end to end on a small synthetic graph and a tiny two-socket machine; `moment layout`."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from moment.cli import main
from moment.errors import MomentError
from moment.placement import open_layout
from moment.placement import planning as pl
from moment.runtime.config import parse_args
from moment.workload.graph import GraphDataset
from moment.workload.hotness import Hotness

# Two sockets; both GPUs and one fast SSD under socket 0, two slower SSDs (PCIe 3.0) under socket 1.
TINY = """\
name: tiny2
nodes:
  - {id: cpu0, kind: socket, memory_gib: 1, memory_bandwidth_gbps: 100}
  - {id: cpu1, kind: socket, memory_gib: 1, memory_bandwidth_gbps: 100}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: rc1, kind: root_complex, parent: cpu1}
  - {id: sw0, kind: switch, parent: rc0, link: {gen: 4, width: 16}}
  - {id: g0, kind: slot, parent: sw0, width: 16, link: {gen: 4, width: 16}}
  - {id: g1, kind: slot, parent: sw0, width: 16, link: {gen: 4, width: 16}}
  - {id: s0, kind: slot, parent: sw0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
  - {id: s1, kind: slot, parent: rc1, width: 4, accepts: [ssd], link: {gen: 3, width: 4}}
  - {id: s2, kind: slot, parent: rc1, width: 4, accepts: [ssd], link: {gen: 3, width: 4}}
links:
  - {a: cpu0, b: cpu1, kind: upi, bandwidth_gbps: 10}
"""
INV = ["--gpus", "2", "--ssds", "3"]
CACHE = ["--gpu-cache", "2%", "--cpu-cache", "5%"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), " ".join(err.getvalue().split())  # stderr unwrapped (rich wraps lines)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Dataset (20k nodes, 32-d), profile, a plan JSON for it, saved hotness, and one placed layout."""
    from moment.workload.hotness import presample
    from moment.workload.synth import synthesize

    tmp = tmp_path_factory.mktemp("place")
    ds = synthesize(tmp / "ds", 20_000, feature_dim=32, seed=3)
    prof = tmp / "tiny2.yaml"
    prof.write_text(TINY)
    rc, plan_json, err = run(["plan", "--profile", prof, *INV, "--json"])
    assert rc == 0, err
    (tmp / "plan.json").write_text(plan_json)
    presample(ds, [25, 10], 64, seed=0).save(tmp / "hot")
    rc, out, err = run(["place", "--dataset", tmp / "ds", "--profile", prof, *INV, *CACHE, "--out", tmp / "L",
                        "--batch-size", "64", "--json"])
    assert rc == 0, err
    return {"tmp": tmp, "ds": ds, "prof": prof, "result": json.loads(out)}


def place(env, out: Path, *extra) -> tuple[int, str, str]:
    """A fast `moment place` (saved hotness, given plan)."""
    t = env["tmp"]
    return run(["place", "--dataset", t / "ds", "--profile", env["prof"], *INV, *CACHE, "--plan", t / "plan.json",
                "--hotness", t / "hot", "--out", out, "--json", *extra])


def test_json_structure(env):
    r = env["result"]
    assert {"layout", "plan", "skew", "policies", "workload"} <= set(r)
    assert r["plan"]["machine"] == "tiny2" and r["plan"]["epoch_read_s"] > 0 and r["plan"]["placement"]
    assert set(r["policies"]) == {"ddak", "hash", "degree"}
    for pol in r["policies"].values():
        names = [b["name"] for b in pol["bins"]]
        assert names == ["hbm:gpu0", "hbm:gpu1", "mem:cpu0", "mem:cpu1", "ssd0", "ssd1", "ssd2"]
        assert [b["kind"] for b in pol["bins"]] == ["gpu"] * 2 + ["cpu"] * 2 + ["ssd"] * 3
        assert sum(b["target_share"] for b in pol["bins"]) == pytest.approx(1.0)
        assert sum(b["achieved_share"] for b in pol["bins"]) == pytest.approx(1.0)
        assert sum(b["rows"] for b in pol["bins"]) == 20_000
        assert all(b["bytes"] >= 0 for b in pol["bins"])
    shares = r["plan"]["predicted"]["storage_shares"]
    for b in r["policies"]["ddak"]["bins"]:
        assert b["target_share"] == pytest.approx(shares.get(b["name"], 0.0) / sum(shares.values()))
    # the caches were sized to 2% / 5% of the rows; the workload's shares come from the hotness curve
    assert r["cache"]["gpu_rows_per_gpu"] == 400 and r["cache"]["cpu_rows_per_socket"] == 1000
    assert 0 < r["workload"]["gpu_cache_share"] < r["workload"]["gpu_cache_share"] + r["workload"]["cpu_cache_share"] < 1
    assert r["skew"]["top_0.01"] > 0.01  # skewed access


def test_ddak_tracks_targets_at_least_as_well_as_hash(env):
    pols = env["result"]["policies"]
    assert pols["ddak"]["l1_error"] <= pols["hash"]["l1_error"] + 1e-12


def test_layout_verifies_and_reads_bit_exact(env):
    r = env["result"]
    rc, out, err = run(["layout", "verify", r["layout"], "--json"])
    assert rc == 0, err
    assert json.loads(out)["ok"] is True
    reader = open_layout(r["layout"], expected_machine="tiny2")
    ids = np.arange(20_000)
    feats = np.asarray(env["ds"].features_memmap())
    assert np.array_equal(reader.rows(ids).view(np.uint8), feats.view(np.uint8))
    perm = np.random.default_rng(0).permutation(20_000)[:777]
    assert np.array_equal(reader.rows(perm), feats[perm])
    rc, out, _ = run(["layout", "info", r["layout"], "--json"])
    info = json.loads(out)
    assert rc == 0 and info["plan"]["machine"] == "tiny2" and len(info["bins"]) == 7
    ddak_bins = r["policies"]["ddak"]["bins"]
    assert [b["achieved_share"] for b in info["bins"]] == pytest.approx([b["achieved_share"] for b in ddak_bins])
    assert [b["bytes"] for b in info["bins"]][:4] == [b["bytes"] for b in ddak_bins][:4]  # unpadded caches


def test_simulate_replays_the_layout_as_the_readme_shows(env):
    """`moment simulate --layout L` (and with `--dataset`): each rank's sampled batches looked up in the
    layout's index, over the placement the layout was made for."""
    r, t = env["result"], env["tmp"]
    shares = {b["name"]: b["achieved_share"] for b in r["policies"]["ddak"]["bins"]}
    for extra in ([], ["--dataset", t / "ds"]):
        rc, out, err = run(["simulate", "--layout", r["layout"], "--profile", env["prof"], "--batch-size", "64",
                            "--json", *extra])
        assert rc == 0, err
        rep = json.loads(out)
        assert rep["source"] == "layout" and [g["gpu"] for g in rep["per_gpu"]] == ["gpu0", "gpu1"]
        assert rep["steps"] == -(-(len(env["ds"].train_idx) // 2) // 64)  # 2 ranks, 64 seeds per step
        assert rep["epoch_s"] > 0 and rep["lp_epoch_s"] > 0
        # every bin the layout wrote is read; a bin that holds rows is read in about its share
        assert set(rep["realised_shares"]) == set(shares)
        assert rep["realised_shares"]["ssd0"] > 0 and rep["realised_shares"]["hbm:gpu0"] > 0


def test_flipped_byte_fails_verify_naming_the_shard(env):
    out = env["tmp"] / "Lflip"
    rc, _, err = place(env, out, "--ssd-path", f"ssd1={env['tmp']}")
    assert rc == 0, err
    m = json.loads((out / "manifest.json").read_text())
    shard = next(s for s in m["shards"] if s["bin"] == "ssd1")
    assert Path(shard["path"]).is_absolute() and Path(shard["path"]).parent.parent == env["tmp"]
    assert run(["layout", "verify", out])[0] == 0
    f = Path(shard["path"])
    data = bytearray(f.read_bytes())
    data[1000] ^= 0xFF
    f.write_bytes(bytes(data))
    rc, _, err = run(["layout", "verify", out])
    assert rc == 1
    assert "ssd1" in err and "offset 0" in err
    end = min(shard["chunk_bytes"], shard["bytes"])  # the chunk ends with the file (it named a chunk past it)
    assert f"checksum mismatch in chunk 0 (bytes 0..{end})" in " ".join(err.split()), err
    rc, o, _ = run(["layout", "verify", out, "--json"])
    rep = json.loads(o)
    assert rc == 1 and rep["first_bad_shard"] == "ssd1" and rep["first_bad_offset"] == 0


def test_plan_reuse_is_deterministic_and_other_policies(env):
    t = env["tmp"]
    rc1, o1, e1 = place(env, t / "La")
    rc2, o2, _ = place(env, t / "Lb", "--policy", "hash")
    assert rc1 == 0 and rc2 == 0, e1
    a, b = json.loads(o1), json.loads(o2)
    for r in (a, b):
        r["policies"]["ddak"].pop("seconds")
    assert a["plan"]["source"].endswith("plan.json") and a["policies"]["ddak"] == b["policies"]["ddak"]
    assert json.loads((t / "Lb" / "manifest.json").read_text())["plan"]["policy"] == "hash"
    ia, ib = np.load(t / "La" / "index.npy"), np.load(t / "Lb" / "index.npy")
    assert not np.array_equal(ia, ib)


def _no_output(out: Path) -> None:
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


@pytest.mark.parametrize("case", ["not_dataset", "policy", "machine", "inventory", "garbage_plan", "ssd_missing",
                                  "ssd_name", "cache"])
def test_bad_input(env, case):
    t = env["tmp"]
    out = t / f"bad-{case}"
    plan = json.loads((t / "plan.json").read_text())
    extra: list = []
    if case == "not_dataset":
        rc, _, err = run(["place", "--dataset", t, "--profile", env["prof"], *INV, "--out", out])
        assert rc == 2 and "no manifest.json" in err
        return _no_output(out)
    if case == "policy":
        extra, want = ["--policy", "random"], "--policy"
    elif case == "machine":
        plan["machine"] = "paper-machine-b"
        (t / "p-machine.json").write_text(json.dumps(plan))
        rc, _, err = run(["place", "--dataset", t / "ds", "--profile", env["prof"], *INV, "--plan",
                          t / "p-machine.json", "--out", out])
        assert rc == 2 and "for machine 'paper-machine-b', not 'tiny2'" in err
        return _no_output(out)
    elif case == "inventory":
        rc, _, err = run(["place", "--dataset", t / "ds", "--profile", env["prof"], "--gpus", "2", "--ssds", "2",
                          "--plan", t / "plan.json", "--out", out])
        assert rc == 2 and "inventory" in err
        return _no_output(out)
    elif case == "garbage_plan":
        (t / "p-garbage.json").write_text('{"machine": "tiny2"}')
        rc, _, err = run(["place", "--dataset", t / "ds", "--profile", env["prof"], *INV, "--plan",
                          t / "p-garbage.json", "--out", out])
        assert rc == 2 and "not a plan" in err
        return _no_output(out)
    elif case == "ssd_missing":
        extra, want = ["--ssd-path", f"ssd0={t / 'nowhere'}"], "--ssd-path ssd0 directory not found"
    elif case == "ssd_name":
        extra, want = ["--ssd-path", f"ssd9={t}"], "ssd9"
    else:
        extra, want = ["--gpu-cache", "lots"], "--gpu-cache"
    rc, _, err = place(env, out, *extra)
    assert rc == 2 and want in err, err
    _no_output(out)


def test_full_ssd_reaches_the_user(env, monkeypatch):
    import moment.placement.layout as layout_mod

    real = shutil.disk_usage

    def tiny_disk(path):
        u = real(path)
        return type(u)(u.total, u.total, 0)

    monkeypatch.setattr(layout_mod.shutil, "disk_usage", tiny_disk)
    out = env["tmp"] / "Lfull"
    rc, _, err = place(env, out, "--ssd-path", f"ssd2={env['tmp']}")
    assert rc == 2 and "not enough free space" in err
    _no_output(out)
    assert not list(env["tmp"].glob("moment-Lfull-*"))


def test_existing_layout_is_not_replaced_without_overwrite(env):
    rc, _, err = place(env, Path(env["result"]["layout"]))
    assert rc == 2 and "already exists" in err


# ---- the library pieces ---------------------------------------------------------------------------


def test_workload_from_hotness_reads_the_curve(env):
    ds: GraphDataset = env["ds"]
    counts = np.zeros(ds.num_nodes, dtype=np.int64)
    counts[:10] = 100  # 1000 reads on 10 nodes
    counts[10:110] = 5  # 500 reads on the next 100
    counts[110:610] = 1  # 500 on the next 500
    hot = Hotness(counts, counts, num_batches=4, unique_ratio=0.5, meta={"batches_per_epoch": 2})
    wl = pl.workload_from_hotness(ds, hot, 5, 50, n_gpus=2, n_sockets=2, fanouts=[25, 10], batch_size=64)
    assert wl.gpu_cache_share == pytest.approx(0.5)  # the 10 hottest
    assert wl.cpu_cache_share == pytest.approx(0.25)  # the next 100
    # 2000 reads in 2 epochs -> 1000 reads per epoch x 128 B over 2 GPUs
    assert wl.bytes_per_gpu_per_epoch == pytest.approx(1000 * 128 / 2)
    assert wl.unique_ratio == 0.5 and wl.num_nodes == ds.num_nodes
    big = pl.workload_from_hotness(ds, hot, 10**9, 10**9, n_gpus=2, n_sockets=2, fanouts=[25, 10], batch_size=64)
    assert big.gpu_cache_share == pytest.approx(1.0) and big.cpu_cache_share == pytest.approx(0.0)


def test_the_cache_shares_are_read_off_a_held_out_sample(env):
    """The rows are chosen by the hotness; their share of the reads is the held-out sample's."""
    ds: GraphDataset = env["ds"]
    counts = np.zeros(ds.num_nodes, dtype=np.int64)
    counts[:10] = 100
    counts[10:110] = 5
    hot = Hotness(counts, counts, num_batches=2, unique_ratio=0.5, meta={"batches_per_epoch": 2})
    other = np.ones(ds.num_nodes, dtype=np.int64)  # the next epoch reads every row alike
    wl = pl.workload_from_hotness(ds, hot, 5, 50, n_gpus=2, n_sockets=2, fanouts=[25, 10], batch_size=64,
                                  heldout=other)
    assert wl.gpu_cache_share == pytest.approx(10 / ds.num_nodes)  # the hotness's 10 hottest rows
    assert wl.cpu_cache_share == pytest.approx(100 / ds.num_nodes)
    assert wl.bytes_per_gpu_per_epoch == pytest.approx(1500 * 128 / 2)  # the volume stays the hotness's


def test_cache_sizes(env):
    ds = env["ds"]  # 20k rows of 128 B
    assert pl.parse_cache("10%", "--x") == ("share", 0.1)
    assert pl.parse_cache("0.5", "--x") == ("gib", 0.5)
    # sizes as every other option reads them (moment.sizes), beside GiB: 2GB was refused
    assert pl.parse_cache("8GiB", "--x") == pl.parse_cache("8G", "--x") == ("gib", 8.0)
    assert pl.parse_cache("512MiB", "--x") == ("gib", 0.5) and pl.parse_cache("2GB", "--x") == ("gib", 2e9 / 2**30)
    assert pl.cache_rows(pl.parse_cache("12800B", "--x"), 1.0, ds) == 100
    assert pl.cache_rows(("share", 0.1), 1.0, ds) == 2000
    assert pl.cache_rows(None, 1.0, ds) == 20_000  # 1 GiB holds the whole dataset: capped
    assert pl.cache_rows(("gib", 128 * 100 / 2**30), 1.0, ds) == 100
    for bad in ("x", "-1", "150%", "2XB", "5e", "nan", "inf", "1e3%"):
        with pytest.raises(MomentError):
            pl.parse_cache(bad, "--gpu-cache")
    # a number as every size spells it (moment.sizes.NUMBER): with an exponent too, one past a float's range the
    # largest float (refused as too large, never an overflow)
    assert pl.parse_cache("5e3", "--x") == ("gib", 5000.0) and pl.parse_cache("2.5e1%", "--x") == ("share", 0.25)
    assert pl.parse_cache("1e400", "--x") == pl.parse_cache("9" * 400, "--x") == ("gib", sys.float_info.max)


@pytest.mark.parametrize("argv, says", [
    (["--gpu-cache", "1e20"], "--gpu-cache '1e20' is larger than the"),
    (["--gpu-cache", "99999999999999999999999"], "--gpu-cache '99999999999999999999999' is larger than the"),
    (["--cpu-cache", "1e400"], "--cpu-cache '1e400' is larger than the"),
    (["--fanouts", "3000000000"], "--fanouts 3000000000: each must be at most 2147483648"),
    (["--fanouts", "25,0"], "--fanouts 25,0: each must be a positive integer"),
], ids=["gpu-cache-exponent", "gpu-cache-digits", "cpu-cache-overflow", "fanout-too-large", "fanout-zero"])
def test_place_reads_sizes_and_fanouts_by_the_rules_train_does(env, argv, says):
    """hunt-D D13: --gpu-cache 1e20 was 'expected GiB' while 99999999999999999999999 was read (and refused as too
    large), and --fanouts 3000000000 was accepted though train refuses a fan-out above 2**31: place reads a size's
    number as `moment.sizes` does and asks train's fan-out rule (moment.workload.spec.fanouts_refused)."""
    out = env["tmp"] / "refused"
    rc, _, err = run(["place", "--dataset", env["tmp"] / "ds", "--profile", env["prof"], *INV, *CACHE, *argv,
                      "--out", out])
    assert rc == 2 and err.startswith(f"error: {says}") and "Traceback" not in err, err
    assert not out.exists()
    if argv[0] == "--fanouts":
        with pytest.raises(MomentError, match=re.escape(says)):
            parse_args(argv, check=False)
    with pytest.raises(MomentError):
        pl.parse_ssd_paths(["ssd1"])


def test_default_pool_suits_the_graph_and_a_losing_ddak_is_explained(env):
    """A large pool quantises DDAK's shares more coarsely than the baselines' single-node round-robin
    (on 20k nodes the paper's 100 already can): the default pool is sized to the hotness, and a pool
    that loses gets a note that says why, in numbers (text and JSON)."""
    r = env["result"]
    pols = r["policies"]
    assert pols["ddak"]["pool"] < 100
    assert pols["ddak"]["mean_rel_error"] <= min(pols["degree"]["mean_rel_error"], pols["hash"]["mean_rel_error"])
    assert r["policy_note"] is None
    rc, out, err = place(env, env["tmp"] / "L100", "--pool", "5000")
    assert rc == 0, err
    coarse = json.loads(out)
    assert coarse["policies"]["ddak"]["pool"] == 5000
    assert coarse["policy_note"] and "pools of 5000" in coarse["policy_note"]
    assert f"--pool {pols['ddak']['pool']}" in coarse["policy_note"]
    rc, text, err = run(["place", "--dataset", env["tmp"] / "ds", "--profile", env["prof"], *INV, *CACHE,
                         "--plan", env["tmp"] / "plan.json", "--hotness", env["tmp"] / "hot",
                         "--out", env["tmp"] / "L100b", "--pool", "5000", "--report"])
    assert rc == 0, err
    assert "note:" in text and "matches the planner's shares more closely than DDAK" in " ".join(text.split())


def test_the_layouts_re_evaluation_predicts_with_the_plans_max_flow_solver():
    """`moment place` re-evaluates the recommended placement for the measured workload with the solver the plan
    used (OR-Tools, whose library the plan loaded), not a second one (networkx: 0.14 s more of each `moment
    place`)."""
    from moment.planner.maxflow import DEFAULT_BACKEND
    from moment.topology.devices import Inventory
    from moment.topology.profiles import load_profile
    from moment.workload.spec import WorkloadSpec

    topo = load_profile("paper-machine-b")
    plan = pl.recommended_plan(topo, Inventory.simple(2, 2))
    again = pl.replan(plan, topo, WorkloadSpec(feature_dim=64))
    assert plan.predicted_maxflow.solver == again.predicted_maxflow.solver == f"maxflow-{DEFAULT_BACKEND}"
    assert DEFAULT_BACKEND == "ortools" and again.workload.feature_dim == 64


def test_a_machine_without_ssds_places_when_its_caches_hold_every_row(env):
    """hunt-K D5: `place --ssds 0` judged the machine by the planner's default cache shares (15% + 10% of the
    reads), not the --gpu-cache/--cpu-cache given, so no SSD-less machine could be placed for, and its hint
    named no option `place` has. Caches that hold every row place (every row in a cache bin, read back
    bit-exact); caches that do not are refused before any sampling, with what they hold and the options."""
    t = env["tmp"]
    base = ["place", "--dataset", t / "ds", "--profile", env["prof"], "--gpus", "2", "--ssds", "0",
            "--hotness", t / "hot"]
    out = t / "Lnossd"
    rc, _, err = run([*base, *CACHE, "--out", out])
    assert rc == 2 and err.count("error:") == 1 and "Traceback" not in err, err
    assert ("ds: the machine has no SSD, so its caches must hold all 20,000 rows of the dataset (2.4 MiB), but "
            "they hold 2,800: 2 GPUs x 400 rows (--gpu-cache) + 2 sockets x 1,000 rows (--cpu-cache)") in err, err
    assert "hint: raise --cpu-cache (e.g. --cpu-cache 48%) or --gpu-cache" in err and "cache shares" not in err
    _no_output(out)
    rc, o, err = run([*base, "--gpu-cache", "2%", "--cpu-cache", "48%", "--out", out, "--json"])  # (as it says)
    assert rc == 0, err
    r = json.loads(o)
    rows = {b["name"]: b["rows"] for b in r["policies"]["ddak"]["bins"]}
    assert set(rows) == {"hbm:gpu0", "hbm:gpu1", "mem:cpu0", "mem:cpu1"} and sum(rows.values()) == 20_000
    assert r["notes"] == []  # (no advice to shrink the caches to exercise SSDs it has not got)
    assert run(["layout", "verify", out])[0] == 0
    feats = np.asarray(env["ds"].features_memmap())
    assert np.array_equal(open_layout(out).rows(np.arange(20_000)), feats)
    # training on it reads no SSD by design: no note advising to cap its caches to exercise SSDs it has not got
    from types import SimpleNamespace

    from moment.placement.opened import Layout
    from moment.runtime.train import Trainer

    no_ssds = SimpleNamespace(layout=Layout.open(out), plan=object(), store_info=None, source=None)
    no_ssds.has_ssds = Trainer.has_ssds.fget(no_ssds)
    assert not no_ssds.has_ssds and Trainer.memory_notes(no_ssds) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc here")
def test_an_ssd_path_on_a_kernel_file_system_is_refused_for_what_it_is_before_sampling(env, monkeypatch):
    """hunt-K D8: `--ssd-path ssd0=/proc` said the mount path was not writable "(No such file or directory)" of a
    directory that is there, and only once the layout was written: the kernel's file system takes no files."""
    import moment.placement.api as api

    monkeypatch.setattr(api, "presample", lambda *a, **k: pytest.fail("sampled before checking --ssd-path"))
    out = env["tmp"] / "Lproc"
    rc, _, err = run(["place", "--dataset", env["tmp"] / "ds", "--profile", env["prof"], *INV, *CACHE,
                      "--ssd-path", "ssd0=/proc", "--out", out])
    assert rc == 2 and err.startswith("error: /proc: SSD bin ssd0: mount path is not writable: its file system takes "
                                      "no new files (a kernel file system, as /proc and /sys are)"), err
    assert "no such file" not in err.lower()
    _no_output(out)
    rc, _, err = run(["data", "synth", "--nodes", "100", "--out", "/proc/x"])  # (every output's check says it so)
    assert rc == 2 and "cannot write in /proc: its file system takes no new files" in err, err


def test_an_empty_path_is_refused_as_given():
    """hunt-K D8: `place --out ""` was told "--out .: names no file or directory of its own": typer (and train's
    parser) made Path("") of it, which is `.`. Every path option and argument refuses it as given."""
    for argv, says in ((["place", "--dataset", "ds", "--out", ""], "error: --out '': empty path"),
                       (["place", "--dataset", "", "--out", "L"], "error: --dataset '': empty path"),
                       (["layout", "rm", ""], "error: LAYOUT '': empty path"),
                       (["cache", "simulate", "--dataset", "ds", "--capacity", "1%", "--trace-out", ""],
                        "error: --trace-out '': empty path")):
        rc, _, err = run(argv)
        assert rc == 2 and err.startswith(says) and "." not in err.split(":")[0], err
    with pytest.raises(MomentError, match="--layout: '' is an empty path"):
        parse_args(["--layout", ""], check=False)
