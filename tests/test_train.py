"""Training runtime: learns, is reproducible and exactly resumable, and runs under torchrun (gloo, 2 ranks)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_data import CLASSES, make_dataset, make_layout, torchrun, train_args

import moment.runtime.finite as finite_mod
import moment.runtime.run as run_mod
import moment.runtime.sizing as sizing_mod
import moment.runtime.start_sizes as start_sizes_mod
import moment.runtime.train as train_mod
from moment import testpoints
from moment.errors import MomentError
from moment.io.diskstats import block_device
from moment.placement.manifest import load_manifest
from moment.runtime.collective_trace import TRACE_ENV, check
from moment.runtime.config import TrainConfig, parse_args
from moment.runtime.train import train

REPO = Path(__file__).resolve().parents[1]
FAST = {"fanouts": [10, 5], "hidden": 32, "threads": 1, "quiet": True, "lr": 0.01}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, runtime_dataset, runtime_layout):
    """A directory of this module's own, the session's shared dataset and layout (read-only)."""
    return tmp_path_factory.mktemp("train"), runtime_dataset, runtime_layout


def _cfg(layout: Path, **kw) -> TrainConfig:
    return TrainConfig(layout=layout, **{**FAST, **kw})


@pytest.fixture(scope="module")
def reference(setup):
    """Single process, full feature matrix in memory, 2 epochs: the run everything is compared with."""
    _, _, layout = setup
    return train(_cfg(layout, epochs=2, features="memory", pipeline=False))


def test_single_process_learns_and_tiers_are_exact(setup, reference, tmp_path):
    _, ds, layout = setup
    m = train(_cfg(layout, epochs=2, metrics_json=tmp_path / "m.json"))
    assert m["val_accuracy"] > 1.0 / CLASSES + 0.3, m["val_accuracy_curve"]
    # same batches, same features bit for bit: the tiered pipelined run repeats the in-memory serial run
    assert m["loss_curve"] == reference["loss_curve"]
    assert m["val_accuracy"] == reference["val_accuracy"]
    doc = json.loads((tmp_path / "m.json").read_text())
    for k in ("epochs", "val_accuracy", "num_classes", "seeds_per_s", "stage_seconds", "loss_curve",
              "tier_bytes", "world_size", "backend"):
        assert k in doc, k
    assert set(doc["stage_seconds"]) == {"sample", "gather_submit", "gather_wait", "train", "exchange", "exchange_wait"}
    assert doc["world_size"] == 1 and doc["num_classes"] == CLASSES and doc["epochs"] == 2
    assert doc["tier_bytes"]["ssd"] > 0 and doc["tier_bytes"]["gpu"] > 0 and doc["tier_bytes"]["cpu"] > 0
    assert doc["batch_size"] == min(8000, max(64, ds.train_idx.size // 8))
    assert len(doc["loss_curve"]) == doc["steps"] == 2 * 8
    # the rates say what they are: every training seed twice over the pipeline's wall time; a CPU-cache hit
    # rate over the rows no GPU tier held; the memory hit rate over all rows
    assert doc["seeds_per_s"] == pytest.approx(2 * ds.train_idx.size / doc["pipeline_wall_s"])
    rows = doc["tier_rows"]
    assert rows["ssd"] > 0 and rows["cpu"] > 0 and rows["gpu"] > 0
    assert doc["cpu_hit_rate"] == pytest.approx(rows["cpu"] / (rows["cpu"] + rows["ssd"]))
    assert doc["memory_hit_rate"] == pytest.approx(1 - rows["ssd"] / sum(rows.values()))


def test_the_limiting_stage_is_the_busiest():
    from moment.runtime.pipeline import StageTimes

    assert StageTimes(sample=3, gather_submit=1, gather_wait=1, train=2, wall=9).limiting() == "sample"
    assert StageTimes(sample=1, gather_submit=1.5, gather_wait=1, train=2, wall=9).limiting() == "gather"
    assert StageTimes(sample=1, gather_submit=0.5, gather_wait=1, train=2, wall=9).limiting() == "train"


def test_reproducible_with_fixed_seed(setup, reference):
    _, _, layout = setup
    a = train(_cfg(layout, epochs=2, features="memmap"))
    assert a["loss_curve"] == reference["loss_curve"]
    other = train(_cfg(layout, epochs=1, seed=1, features="memory"))
    assert other["loss_curve"] != reference["loss_curve"][: len(other["loss_curve"])]


def test_checkpoint_resume_continues_exactly(setup, reference, tmp_path, monkeypatch):
    _, _, layout = setup

    class Crash(Exception):
        pass

    def crash():
        raise Crash

    monkeypatch.setattr(testpoints, "_exit", crash)
    monkeypatch.setenv(testpoints.EXIT_ENV, "train-step:11")
    ck = tmp_path / "ck"
    with pytest.raises(Crash):
        train(_cfg(layout, epochs=2, checkpoint_dir=ck, checkpoint_every=4))
    monkeypatch.delenv(testpoints.EXIT_ENV)
    m = train(_cfg(layout, epochs=2, checkpoint_dir=ck, checkpoint_every=4, resume=True))
    assert m["resumed_from_step"] == 8
    assert m["loss_curve"] == reference["loss_curve"]
    assert m["val_accuracy_curve"] == reference["val_accuracy_curve"]
    with pytest.raises(MomentError, match="batch_size"):
        train(_cfg(layout, epochs=2, checkpoint_dir=ck, resume=True, batch_size=77))


def test_config_errors(setup):
    _, _, layout = setup
    with pytest.raises(MomentError, match="--layout"):
        parse_args([])
    with pytest.raises(MomentError, match="--layers"):
        parse_args(["--layout", str(layout), "--layers", "3", "--fanouts", "5,5"])
    with pytest.raises(MomentError, match="checkpoint-dir"):
        parse_args(["--layout", str(layout), "--resume"])
    cfg = parse_args(["--layout", str(layout), "--features-memmap", "--fanouts", "4,3,2"])
    assert cfg.features == "memmap" and cfg.resolved_fanouts() == [4, 3, 2]
    assert cfg.resolved_batch_size(100_000, 2) == 6250 and cfg.resolved_batch_size(10**8, 1) == 8000
    assert cfg.resolved_batch_size(100, 4) == 64


NAN_BITS = 0x7FC00000  # a float32 quiet NaN: what a shard overwritten with garbage may hold


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_the_likely_cause(setup, tmp_path):
    """Corrupt features (every shard NaN) and a diverging model (a huge learning rate) each stop the run
    at the first step whose loss is not finite, instead of training to exit 0 with loss NaN."""
    _, _, layout = setup
    bad = shutil.copytree(layout, tmp_path / "L")
    for f in (bad / "shards").iterdir():
        f.write_bytes(np.full(f.stat().st_size // 4, NAN_BITS, np.uint32).tobytes())
    with pytest.raises(MomentError) as e:
        train(_cfg(bad, epochs=1))
    msg = " ".join(str(e.value).split())
    assert "training stopped at step 1 (epoch 1, batch 1 of 8) on rank 0" in msg, msg
    assert "the feature rows read for the batch hold NaN or infinite values" in msg
    assert f"check it with `moment layout verify {bad}`" in msg
    with pytest.raises(MomentError) as e:
        train(_cfg(layout, epochs=1, lr=1e30))
    msg = " ".join(str(e.value).split())
    assert re.search(r"training stopped at step [2-8] \(epoch 1, batch [2-8] of 8\) on rank 0: the loss is not "
                     r"finite though the batch's features are: the model diverged \(learning rate 1e\+30\)", msg), msg
    assert "lower the learning rate (--lr)" in msg


def test_a_finite_loss_that_diverges_stops_the_run_naming_the_step_and_the_learning_rate(setup, monkeypatch):
    """`--lr 1e6` keeps every loss finite but 1e12 times the first: it trained on to exit 0. It stops at the
    step where the divergence rule trips (moment.runtime.finite.divergence_at), naming the learning rate."""
    _, _, layout = setup
    with monkeypatch.context() as m:  # without the rule: finite, and huge
        m.setattr(finite_mod, "DIVERGE_FACTOR", float("inf"))
        curve = train(_cfg(layout, epochs=1, lr=1e6))["loss_curve"]
    assert np.isfinite(curve).all() and min(curve[1:]) > 1e10 * curve[0], curve
    with pytest.raises(MomentError) as e:
        train(_cfg(layout, epochs=1, lr=1e6))
    msg = " ".join(str(e.value).split())
    assert re.search(r"training stopped at step 4 \(epoch 1, batch 4 of 8\): the loss diverged \(learning rate "
                     r"1e\+06\): \S+e\+1\d at this step, more than 10000 times the smallest of the run's first "
                     r"losses \(1\.\d+\) for 3 steps in a row, since step 2", msg), msg
    assert "lower the learning rate (--lr) and start again" in msg and "not finite" not in msg


def test_resume_refuses_a_checkpoint_of_another_run_naming_each_difference(setup, tmp_path):
    root, ds, layout = setup
    ck = tmp_path / "ck"
    first = train(_cfg(layout, epochs=1, checkpoint_dir=ck))
    other = make_dataset(tmp_path, seed=2, name="other")  # the same shape, other values
    with pytest.raises(MomentError) as e:
        train(_cfg(None, dataset=other.path, features="memory", epochs=2, checkpoint_dir=ck, resume=True))
    msg = " ".join(str(e.value).split())
    assert msg.startswith(f"{ck}: the checkpoint is from another run (checkpoint vs this run): dataset "
                          f"{ds.dataset_id[:12]} ({ds.path}) vs {other.dataset_id[:12]} ({other.path})"), msg
    relaid = make_layout(ds, tmp_path / "L2", row_mode="pad")  # the same dataset placed again: another layout
    with pytest.raises(MomentError, match=r"checkpoint vs this run\): layout [0-9a-f]{12} \(.*\) vs [0-9a-f]{12} "):
        train(_cfg(relaid, epochs=2, checkpoint_dir=ck, resume=True))
    with pytest.raises(MomentError) as e:
        train(_cfg(layout, epochs=2, checkpoint_dir=ck, resume=True, hidden=64, lr=0.1))
    assert "checkpoint vs this run): hidden 32 vs 64; lr 0.01 vs 0.1\n" in str(e.value), str(e.value)
    # a checkpoint whose recorded settings match but whose weights do not: one line, not load_state_dict's
    import torch

    from moment.runtime.checkpoint import load_checkpoint, save_checkpoint

    doc = load_checkpoint(ck)
    name = next(iter(doc["model"]))
    doc["model"][name] = torch.zeros(3, 3)
    save_checkpoint(tmp_path / "odd", doc)
    with pytest.raises(MomentError, match=f"the checkpoint's model does not fit this run's: .*{name}"):
        train(_cfg(layout, epochs=2, checkpoint_dir=tmp_path / "odd", resume=True))
    m = train(_cfg(layout, epochs=2, checkpoint_dir=ck, resume=True))  # its own run resumes
    assert m["resumed_from_step"] == first["steps"]


def test_a_full_disk_at_a_checkpoint_names_the_file_and_keeps_the_last_good_one(setup, tmp_path, monkeypatch):
    from moment import testpoints
    from moment.runtime.checkpoint import load_checkpoint

    _, _, layout = setup
    ck = tmp_path / "ck"
    monkeypatch.setattr(testpoints, "_reached", {})
    monkeypatch.setenv(testpoints.ENOSPC_ENV, "checkpoint-write:2")  # the second checkpoint meets a full disk
    with pytest.raises(MomentError) as e:
        train(_cfg(layout, epochs=1, checkpoint_dir=ck, checkpoint_every=3))
    msg = " ".join(str(e.value).split())
    assert msg.startswith(f"{ck / 'checkpoint.pt'}: cannot write the checkpoint at step 6: no space left on the "
                          "device; the last good checkpoint (step 3) is kept"), msg
    assert f"--resume --checkpoint-dir {ck}" in msg
    assert load_checkpoint(ck)["step"] == 3 and [p.name for p in ck.iterdir()] == ["checkpoint.pt"]


def test_more_ranks_than_the_layouts_gpus_are_refused_before_any_starts(setup, monkeypatch, capsys):
    from moment.cli import main
    from moment.runtime.dist import setup as dist_setup

    _, _, layout = setup  # 2 GPU bins
    assert main(["train", "--nproc", "3", "--layout", str(layout)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--nproc 3: 3 ranks on this machine, but the layout was placed for 2 GPU(s) (gpu0, gpu1)" in err, err
    # under torchrun directly, every rank refuses before the process group (no MASTER_ADDR is needed)
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(MomentError, match=r"torchrun --nproc-per-node 3: 3 ranks on this machine, but the layout "
                                          r"was placed for 2 GPU\(s\)"):
        dist_setup("cpu", run_mod.layout_gpus(_cfg(layout)))


@pytest.mark.parametrize("gone", ["index.npy", "order.npy"])
def test_a_layout_missing_a_file_is_refused_before_any_rank_starts_and_by_a_dry_run(setup, tmp_path, capsys, gone):
    """A layout without its index.npy was planned by --dry-run (exit 0) and trained as a FileNotFoundError
    traceback from each rank: the launcher checks the layout's files, as a rank checks its shards."""
    from moment.cli import main
    from moment.placement.opened import Layout

    _, _, layout = setup
    copy = shutil.copytree(layout, tmp_path / "L")
    (copy / gone).unlink()
    for dry in (["--dry-run"], []):
        assert main(["train", *dry, "--layout", str(copy), "--epochs", "1"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"error: {copy / gone}: the layout's" in err and "is missing" in err and "Traceback" not in err, err
    if gone == "index.npy":  # a script's own open_run, which no launcher checked
        with pytest.raises(MomentError, match="cannot read the layout's index: no such file"):
            Layout.open(copy).load_index()


def test_a_read_only_run_dir_is_refused_naming_run_dir(setup, tmp_path, capsys, monkeypatch):
    """A --run-dir on a read-only file system was refused naming --checkpoint-dir (not given) at a path the run
    never uses: the run directory itself is tried, and named as given."""
    import errno
    import tempfile

    import moment.outputs as outputs_mod
    from moment.cli import main

    _, _, layout = setup
    ro, real = tmp_path / "ro", tempfile.mkstemp
    ro.mkdir()

    def read_only(*a, dir=None, **k):
        if dir is not None and Path(dir).resolve() == ro.resolve():
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(outputs_mod.tempfile, "mkstemp", read_only)
    assert main(["train", "--layout", str(layout), "--epochs", "1", "--run-dir", str(ro)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: --run-dir {ro}: cannot write in {ro}: read-only file system" in err, err
    assert "--checkpoint-dir" not in err and not list(ro.iterdir())


def test_a_layout_on_a_read_only_mount_is_refused_naming_the_default_run_dir_and_planned_by_a_dry_run(
        setup, tmp_path, capsys, monkeypatch):
    """A layout on a read-only mount (machine 1's part of a split, which never writes a checkpoint, too): the run
    and even --dry-run (which writes nothing) were refused naming --checkpoint-dir, not given, at
    LAYOUT.runs/checkpoint, a path the run never uses (hunt-E 4). The run names its default run directory and how
    to give another; a dry run plans."""
    import errno
    import tempfile

    import moment.cli.train_launch as tl
    import moment.outputs as outputs_mod
    from moment.cli import main

    _, _, layout = setup
    mount = tmp_path / "mnt"
    copy = shutil.copytree(layout, mount / "L")
    real = tempfile.mkstemp

    def read_only(*a, dir=None, **k):
        if dir is not None and Path(dir).resolve().is_relative_to(mount.resolve()):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(outputs_mod.tempfile, "mkstemp", read_only)
    monkeypatch.setattr(tl, "run", lambda *a, **k: pytest.fail("torchrun must not start"))
    assert main(["train", "--layout", str(copy), "--epochs", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (f"error: the run directory (--run-dir's default) {mount}/L.runs: cannot write in {mount}: read-only "
            "file system hint: pass --run-dir DIR") in err, err
    assert "--checkpoint-dir" not in err
    assert main(["train", "--dry-run", "--layout", str(copy), "--epochs", "1"]) == 0
    assert "--checkpoint-dir" not in capsys.readouterr().err
    assert not (mount / "L.runs").exists()


@pytest.fixture(scope="module")
def two_ranks(two_rank_run):
    return two_rank_run


@pytest.mark.slow
def test_torchrun_two_ranks(two_ranks, reference):
    m = two_ranks
    assert m["world_size"] == 2 and m["dist_backend"] == "gloo" and m["backend"] in ("io_uring", "pthreads", "python")
    assert m["batch_size"] * 2 == reference["batch_size"]  # same global batch
    assert len(m["loss_curve"]) == m["steps"] == 16
    assert abs(m["val_accuracy"] - reference["val_accuracy"]) < 0.05, (m["val_accuracy"], reference["val_accuracy"])
    assert m["tier_bytes"]["gpu"] > 0 and m["tier_bytes"]["cpu"] > 0 and m["memory"]["items"]
    # the peer tier: rows of the other rank's GPU bin come from its memory (a shared segment on CPU)
    assert m["tier_rows"]["peer"] > 0 and m["tier_bytes"]["peer"] == m["tier_rows"]["peer"] * 128
    assert np.isfinite(m["loss_curve"]).all() and m["loss_curve"][-1] < m["loss_curve"][0]
    # each rank serves its own plan GPU's bin (local-rank order on CPU) and reports its SSD shares
    assert [(r["rank"], r["plan_gpus"]) for r in m["per_rank"]] == [(0, ["gpu0"]), (1, ["gpu1"])]
    assert all(r["matched_by"].startswith("local-rank order") and r["ssd_shares"] for r in m["per_rank"])


@pytest.mark.slow
def test_the_validation_nodes_predictions_score_the_accuracy_the_run_reported(two_rank_dir, two_ranks, setup):
    """`--predict FILE --predict-nodes val` after the last epoch: rank 0 writes every validation node once, in
    the split's order, and the classes it predicts score exactly the last epoch's reported accuracy."""
    _, ds, _ = setup
    rows = (two_rank_dir / "val.csv").read_text().splitlines()
    assert rows[0] == "node,class,probability"  # the dataset keeps no ids of its own
    node, cls, prob = np.array([[float(x) for x in r.split(",")] for r in rows[1:]]).T
    np.testing.assert_array_equal(node, ds.val_idx)
    assert (cls == ds.labels[ds.val_idx]).mean() == two_ranks["val_accuracy"]
    assert (prob >= 1.0 / CLASSES).all() and (prob <= 1).all()
    assert two_ranks["predictions"]["nodes"] == ds.val_idx.size


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to list a rank's threads")
def test_a_finished_rank_has_torn_down_its_process_group(two_rank_dir):
    """At the interpreter's exit no gloo thread is left: the group is destroyed while the interpreter is
    alive (after the run's close, held until its exit handlers: moment.runtime.dist._RETIRED), not as it finalizes,
    where its threads can abort the rank (moment.runtime.dist.import_before_group).
    The shared 2-rank launch runs through tests/exit_ranks.py, which records the threads."""
    for rank in (0, 1):
        threads = json.loads((two_rank_dir / f"rank{rank}.json").read_text())["threads"]
        assert threads and not [t for t in threads if "gloo" in t], (rank, threads)


@pytest.mark.slow
def test_two_ranks_every_policy_and_shape_match_the_memmap_baseline(setup, two_ranks, tmp_path):
    """Same batches, same bytes on every rank: a shared CPU cache, a per-rank Belady cache, block and
    row reads, and a memory budget all give the memmap baseline's loss curve exactly. The memmap baseline and
    the two packed runs are one launch (tests/train_runs.py: one after the other in the same ranks, one torch
    start-up instead of three); the Belady run is plain torchrun's (its ranks fresh interpreters, measured
    beside their agent), a launch of its own."""
    import shutil

    from moment.cli import main

    root, ds, layout = setup
    base, out = tmp_path / "base.json", tmp_path / "b.json"
    # DiskGNN's packed batches: a pack made by the CLI for this run's batches (auto picks it), and the pack asked
    # for with no kind on a machine with no GPU driver (this one), which is whole
    packed, whole = tmp_path / "L", tmp_path / "W"
    shutil.copytree(layout, packed)
    assert main(["data", "pack", "--layout", str(packed), "--ranks", "2", "--epochs", "2", "--fanouts", "10,5",
                 "--fitted", "--json"]) == 0
    shutil.copytree(packed, whole)
    assert main(["data", "pack", "--layout", str(whole), "--ranks", "2", "--epochs", "2", "--fanouts", "10,5",
                 "--overwrite", "--json"]) == 0
    runs = [train_args(layout, base, "--dataset", str(ds.path), "--features-memmap", "--no-pipeline"),
            train_args(packed, tmp_path / "p.json", "--memory-budget", "3GiB", "--cpu-cache-limit", "10%"),
            train_args(whole, tmp_path / "w.json", "--memory-budget", "3GiB", "--cpu-cache-limit", "10%")]
    torchrun([json.dumps(runs)], script=REPO / "tests" / "train_runs.py")
    ref = json.loads(base.read_text())["loss_curve"]
    assert two_ranks["loss_curve"] == ref
    torchrun(train_args(layout, out, "--cache-policy", "belady-superbatch", "--io-shape", "rows",
                    "--memory-budget", "3GiB", "--peer-tier", "off"), forked=False)
    m = json.loads(out.read_text())
    assert m["loss_curve"] == ref and m["cache_policy"] == "belady-superbatch"
    assert m["tier_rows"]["peer"] == 0  # --peer-tier off: the other GPU's bin is read from the layout
    assert m["memory"]["budget_bytes"] == 3 << 30
    check_memory(m["memory"])  # two ranks and their agent: what they share (libraries, segments) once
    # the agent (torchrun, the ranks' parent) was measured: it imports torch, and holds less than the ranks
    assert 64 << 20 < m["memory"]["measured"]["agent"] < m["memory"]["measured"]["ranks"], m["memory"]["measured"]
    m = json.loads((tmp_path / "p.json").read_text())
    assert m["loss_curve"] == ref and m["io_shape"] == "packed" and m["packed_rows"] > 0
    # validation read its batches' segments too: the same scores as the run that read the layout
    assert m["val_accuracy_curve"] == json.loads(base.read_text())["val_accuracy_curve"] and m["eval_wall_s"] > 0
    assert any(i["name"] == "pack index" for i in m["memory"]["items"])
    check_memory(m["memory"])
    # each rank knows the hottest rows its caches hold (the --cached that fits it); rows the pack left out beyond
    # them are counted, summed over the ranks, and said in a note when they are most of the reads
    fits, pk = [r["pack_fit"] for r in m["per_rank"]], json.loads((packed / "pack" / "pack.json").read_text())
    assert all(isinstance(f, int) and f > 0 for f in fits), fits
    assert min(fits) < pk["cached_rows"] or m["pack_left_out_rows"] == 0
    told = [n for n in m["notes"] if "the pack leaves out for caches" in n]
    assert len(told) == (2 * m["pack_left_out_rows"] > m["ssd_requests"]), (m["pack_left_out_rows"], told)
    # the whole pack: each batch read straight into its own buffer, the same curve, within the budget
    m = json.loads((tmp_path / "w.json").read_text())
    assert m["loss_curve"] == ref and m["whole_batches"] > 0 and m["pack_left_out_rows"] == 0
    check_memory(m["memory"], whole=True)


@pytest.mark.slow
def test_torchruns_agent_is_charged_what_it_holds(two_ranks):
    """The ranks charge their parent's (torchrun's agent's) measured size, not a guess: the pages it alone holds
    (what it shares with its forked ranks, libraries and the runtime they loaded, is charged once apart)."""
    mem = two_ranks["memory"]
    items = {it["name"]: it["machine_bytes"] for it in mem["items"]}
    charged, own = items["torchrun agent"], mem["measured"]["agent"]
    assert own > 0 and abs(own - charged) <= BUDGET_TOL * charged + (8 << 20), (own >> 20, charged >> 20)
    assert items["shared pages"] > 64 << 20  # torch's libraries at least


@pytest.mark.slow
def test_torchrun_killed_rank_resumes_from_checkpoint(restarted_run, two_ranks):
    """Rank 1 exits after its fifth step; torchrun restarts both ranks (the session's restarted_run: checkpoints
    every 2 of the 8 steps of an epoch, the default with a checkpoint directory). Its step-4 checkpoint is
    complete before rank 1 can end step 5 (step 5's gradients wait for rank 0), so the ranks resume from it, and
    train on to the uninterrupted run's curve and accuracy."""
    m = json.loads((restarted_run / "m.json").read_text())
    assert m["resumed_from_step"] == 4
    np.testing.assert_allclose(m["loss_curve"], two_ranks["loss_curve"], rtol=1e-6)
    assert m["val_accuracy"] == two_ranks["val_accuracy"]


def test_budget_below_the_minimum_is_refused(setup, capsys):
    _, _, layout = setup
    with pytest.raises(MomentError, match=r"--memory-budget 50.00 MiB is below the minimum .* needs"):
        train(_cfg(layout, memory_budget="50MiB"))
    assert train_mod.main(["--layout", str(layout), "--memory-budget", "50MiB", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "minimum" in err and "Traceback" not in err


# Predicted (the budget split's items, summed per machine) against measured (each process's peak RSS less
# what it shares, and what they share once: moment.runtime.memory_use) peak, predicted/measured as found
# here: 1.03-1.06 for one CPU rank on 6k 8-KiB rows under a budget the CPU cache fills (static, lru,
# belady-superbatch; block and rows reads), 1.04 on the bench's 16M 1-KiB rows, two ranks, under 5 GiB
# (bench/epoch.py). Outside the tolerance: read buffers granted ahead of use make it 1.10-1.16 under a loose
# budget (the cache limited below the rest: here, 1 GiB with --cpu-cache-limit 50%, the reads fill 27 of the
# 94 MiB the pool is granted), and 1.10-1.12 on the bench's 8M 512-B rows under 3 GiB (a third of what is
# left goes to read buffers there too).
BUDGET_TOL = 0.10


def check_memory(mem: dict, whole: bool = False) -> None:
    """The run lived within its budget and its split predicted its measured peak within BUDGET_TOL, the batches
    charged as many as the pipeline kept alive at once: the split charges the most it can hold, and whether
    it filled in a short run is the scheduler's (a busy machine's run held one or two fewer, 27 MiB each here).
    Those it kept never take more than their charge. A whole pack's batches are read into their own buffers
    (`whole`), in the read buffers' stead and within their budget (Tier._read_whole): those count too."""
    measured, predicted = mem["measured_peak_bytes"], mem["predicted_peak_bytes"]
    assert measured <= mem["budget_bytes"], mem["measured"]
    names = ("batch features", "read buffers") if whole else ("batch features",)
    charged = sum(it["machine_bytes"] for it in mem["items"] if it["name"] in names)
    kept = mem["measured"]["batch_buffers"]
    assert 0 < kept <= charged, (kept >> 20, charged >> 20)
    predicted -= charged - kept
    assert abs(predicted - measured) <= BUDGET_TOL * measured, (predicted >> 20, measured >> 20, mem["measured"])


# Starts a program and prints its peak RSS as the kernel reports it to the parent (wait4). Spawned from
# this small interpreter, not from the test process: a child forked from a large process carries that
# process's high-water mark in its ru_maxrss.
SPAWN_AND_WAIT = ("import os, sys\n"
                  "pid = os.posix_spawn(sys.executable, [sys.executable, *sys.argv[1:]], os.environ)\n"
                  "_, status, usage = os.wait4(pid, 0)\n"
                  "print(usage.ru_maxrss)\n"
                  "sys.exit(os.waitstatus_to_exitcode(status))\n")


@pytest.fixture(scope="module")
def budget_data(tmp_path_factory):
    """8-KiB rows (caches, read buffers and batch features weigh about as much as the process itself)."""
    root = tmp_path_factory.mktemp("budget")
    ds = make_dataset(root, nodes=6000, dim=2048)
    return root, ds, make_layout(ds, root / "L")


def _tight_budget(ds, layout: Path, policy: str) -> int:
    """A budget the CPU cache fills, as the bench's does: the least this run accepts (its refusal names it,
    with room for a process's size to vary between runs) and a third of the features for the cache."""
    from moment.workload.graph import GraphDataset

    cfg = TrainConfig(layout=layout, epochs=1, fanouts=[10, 5], hidden=32, device="cpu", cache_policy=policy,
                      memory_budget="1MiB")
    with pytest.raises(MomentError, match="below the minimum") as e:
        sizing_mod.preview_plan(cfg, GraphDataset.open(ds.path), 1, agent=False)
    least = int(re.search(r"--memory-budget (\d+)MiB", e.value.hint).group(1)) << 20
    return least + ds.num_nodes * ds.row_bytes // 3


def _run_under_budget(root: Path, ds, layout: Path, policy: str) -> tuple[dict, int, int]:
    """One fresh rank, as torchrun starts it, under a budget the CPU cache fills: its metrics, its peak RSS
    as the kernel reports it to its parent, and the budget. The cache gets what the rank's own start leaves,
    so it is capped at half the features: once in CI the preview measured a start 16 MiB over the rank's (a
    700 MB budget, 684 here), and the cache held every row the 8 steps touched, reading nothing from the SSDs."""
    out = root / f"m-{policy}.json"
    budget = _tight_budget(ds, layout, policy)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", SPAWN_AND_WAIT, "-m", "moment.train", "--layout", str(layout),
                        "--epochs", "1", "--fanouts", "10,5", "--hidden", "32", "--threads", "1", "--quiet",
                        "--device", "cpu", "--memory-budget", f"{budget}B", "--cache-policy", policy,
                        "--cpu-cache-limit", "50%",
                        "--metrics-json", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text()), int(r.stdout.split()[-1]) * 1024, budget


@pytest.fixture(scope="module")
def budget_run(budget_data):
    """The default (static) cache's run: the dataset, layout, metrics and the kernel's peak."""
    root, ds, layout = budget_data
    return ds, layout, *_run_under_budget(root, ds, layout, "static")


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["static", "lru", "belady-superbatch"])
def test_budget_split_is_stated_and_respected(budget_data, budget_run, policy):
    """The split names every item, and the run it sized holds no more than its budget at its peak and
    about what the split predicted (a component that takes more than it is charged breaks this), with
    each cache policy (each states its own bookkeeping)."""
    m, kernel_peak, budget = budget_run[2:] if policy == "static" else _run_under_budget(*budget_data, policy)
    assert m["cache_policy"] == policy
    mem = m["memory"]
    assert mem["budget_bytes"] == budget and mem["predicted_peak_bytes"] + mem["margin"] <= mem["budget_bytes"]
    cache = next(it["bytes"] for it in mem["items"] if it["name"] == "cpu cache")
    assert 0 < cache < budget_data[1].num_nodes * budget_data[1].row_bytes  # the cache holds what is left
    names = {it["name"] for it in mem["items"]}
    assert {"process", "graph structure", "layout index", "cpu cache", "read buffers", "sampler",
            "batch features"} <= names
    assert mem["measured"]["since"] == "run start" and mem["measured"]["agent"] == 0  # no torchrun here
    # the run measured itself as its parent sees it (the peak falls in training, after the reset)
    assert abs(mem["measured_peak_bytes"] - kernel_peak) <= 0.02 * kernel_peak, (mem["measured"], kernel_peak)
    assert abs(m["peak_rss_bytes"] - kernel_peak) <= 0.02 * kernel_peak, (m["peak_rss_bytes"], kernel_peak)
    check_memory(mem)
    assert m["cpu_hit_rate"] is not None and m["ssd_bytes_read"] > 0


def test_moment_train_refuses_a_small_budget_before_starting_ranks(setup, capsys):
    from moment.cli import main

    _, _, layout = setup
    assert main(["train", "--nproc", "2", "--layout", str(layout), "--memory-budget", "200MiB"]) == 2
    err = capsys.readouterr().err
    assert "below the minimum" in err and "--memory-budget" in err and "Traceback" not in err
    assert main(["train", "--layout", str(layout), "--memory-budget", "lots"]) == 2


@pytest.mark.slow
def test_a_rank_base_is_what_a_fresh_rank_holds(budget_run):
    """The start-up memory the preview charges is what a fresh rank holds with the runtime loaded and an optimizer
    made (torch loads torch._dynamo then, ~90 MiB), measured in a fresh interpreter (not its caller's RSS) and
    split as `moment train` runs it: a rank forked from its agent shares nearly all of it (charged once), and
    holds little of its own; the same total as a rank started alone charges itself. torch-geometric is not part
    of it any more (it was ~54 MiB more, when the built-in layers came from it)."""
    ds, layout, m, _, _ = budget_run
    env = dict(os.environ)
    bare = subprocess.run([sys.executable, "-c", "import moment.runtime.train, torch\nfrom moment.runtime.budget import "
                           "process_sizes\ntorch.optim.Adam([torch.nn.Parameter(torch.zeros(3))])\n"
                           "print(sum(process_sizes()))"], env=env, capture_output=True, text=True,
                          check=True, timeout=300)
    fresh_rank = int(bare.stdout.split()[-1])  # its RSS
    agent, base, shared = start_sizes_mod.fresh_sizes()
    assert base < 32 << 20 and shared > 128 << 20, (base >> 20, shared >> 20)  # forked: little of its own
    assert abs(agent + base + shared - fresh_rank) < (48 << 20), (agent >> 20, base >> 20, shared >> 20, fresh_rank >> 20)
    cfg = _cfg(layout, memory_budget="2GiB", io_shape="block")
    preview = {it.name: it.bytes for it in sizing_mod.preview_plan(cfg, ds, 1).memory.items}
    assert (preview["process"], preview["shared pages"], preview["torchrun agent"]) == (base, shared, agent)
    charged = {it["name"]: it["bytes"] for it in m["memory"]["items"]}  # a rank started alone, no agent
    assert abs(charged["process"] + charged["shared pages"] - fresh_rank) < (48 << 20), (charged, fresh_rank >> 20)


@pytest.mark.slow
def test_dataloader_workers_baseline_trains_the_same_batches(setup, reference):
    """The PyG-style baseline (sampling and memmap reads in DataLoader worker processes) trains on the
    same batches as every other run: the reference's loss curve bit for bit, every row counted."""
    _, _, layout = setup
    m = train(_cfg(layout, epochs=2, features="memmap", memmap_random=True, loader_workers=2))
    assert m["loss_curve"] == reference["loss_curve"]
    assert m["val_accuracy_curve"] == reference["val_accuracy_curve"]
    assert m["loader_workers"] == 2 and m["tier_rows"] == {"memmap": reference["tier_rows"]["memory"]}
    assert m["stage_seconds"]["sample"] > 0 and m["stage_seconds"]["gather_wait"] > 0
    with pytest.raises(MomentError, match="--loader-workers 2 is for the --features-memmap baseline"):
        parse_args(["--layout", str(layout), "--loader-workers", "2"])
    with pytest.raises(MomentError, match="--drop-page-cache batch cannot be combined with --loader-workers"):
        parse_args(["--layout", str(layout), "--features-memmap", "--loader-workers", "2", "--drop-page-cache", "batch"])
    for name, args in (("--drop-page-cache", []), ("--memmap-random", []),
                       ("--drop-page-cache", ["--features-in-memory", "--drop-page-cache", "batch"])):
        with pytest.raises(MomentError, match=f"{name} is for the --features-memmap baseline"):
            parse_args(["--layout", str(layout), *(args or [name])])  # ignored before: a "cold" run ran warm


def _fed(m: dict) -> tuple:
    """What a run read: rows and bytes per tier, SSD bytes and requests, seeds and batches."""
    return (m["tier_rows"], m["tier_bytes"], m["ssd_bytes_read"], m["ssd_requests"], m["packed_rows"], m["steps"])


@pytest.mark.slow
def test_data_only_reads_what_the_training_run_reads(setup, reference, two_ranks, tmp_path):
    """--data-only runs the data path alone: the same rows and bytes from every tier as the training run of
    the same options (2 ranks on gloo: the peer exchange and the collectives the data path needs), no model,
    so no loss or accuracy; the baselines (in memory, memmap, DataLoader workers) feed alike. With --io-trace
    each rank writes its SSD reads as an fio iolog: block-aligned reads of the layout's files. The ranks wait
    for each other after each train epoch and each validation pass, where training sums its losses and its score,
    from the training thread in the same order, so the epochs start and end together on every rank."""
    _, ds, layout = setup
    out, calls = tmp_path / "d.json", tmp_path / "calls"
    torchrun(train_args(layout, out, "--data-only", "--io-trace", str(tmp_path / "traces")),
             env={TRACE_ENV: str(calls)})
    m = json.loads(out.read_text())
    ranks = [json.loads((calls / f"collectives-rank{r}.json").read_text())["calls"] for r in range(2)]
    assert check(ranks) == []
    for r in ranks:  # between the first epoch's first exchange round and the metrics' sums: two waits an epoch
        ops = [c["op"] for c in r]
        first = ops.index("all_to_all_single")
        assert ops[first:ops.index("all_reduce", first)].count("barrier") == 4, " ".join(ops)
    traced = 0
    for r in range(2):
        lines = (tmp_path / "traces" / f"rank-{r}.iolog").read_text().splitlines()
        reads = [x.split() for x in lines if " read " in x]
        assert lines[0] == "fio version 2 iolog" and reads, r
        assert all(Path(x[0]).is_relative_to(layout.resolve()) and int(x[2]) % 4096 == int(x[3]) % 4096 == 0
                   for x in reads)
        traced += len(reads)
    # the epochs' reads, which the rate counts; the CPU cache's fill at start (rank 0 fills the shared one) apart
    assert traced == m["ssd_requests"], (traced, m["ssd_requests"])
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["rank-0.iolog", "rank-0.setup.iolog",
                                                                      "rank-1.iolog"]
    assert m["data_only"] is True and two_ranks["data_only"] is False
    assert _fed(m) == _fed(two_ranks) and m["tier_rows"]["peer"] > 0 and m["ssd_bytes_read"] > 0
    assert m["loss_curve"] is None and m["val_accuracy"] is None and m["val_metric"] is None
    assert m["seeds_per_s"] > 0 and m["pipeline_wall_s"] > 0 and len(m["epoch_seconds"]) == 2
    cores = os.cpu_count() or 1  # both ranks' CPU in an epoch: some, and no more than the cores give in its time
    assert len(m["epoch_cpu_seconds"]) == 2
    assert all(0 < c <= cores * s + 0.5 for c, s in zip(m["epoch_cpu_seconds"], m["epoch_seconds"], strict=True))
    # the feed rate is the train epochs': their SSD reads and tier bytes, validation's (read after each) apart
    assert len(m["epoch_ssd_bytes"]) == 2 and all(b > 0 for b in m["epoch_ssd_bytes"])
    assert sum(m["epoch_ssd_bytes"]) < m["ssd_bytes_read"], (m["epoch_ssd_bytes"], m["ssd_bytes_read"])
    # (validation reads the peers' rows itself: every peer byte is a train epoch's)
    fed = m["train_tier_bytes"]
    assert all(0 < fed[k] < b for k, b in m["tier_bytes"].items() if b and k != "peer"), fed
    assert fed["peer"] == m["tier_bytes"]["peer"] > 0, fed
    rate, fed = m["tier_mb_per_s"], m["train_tier_bytes"]  # one train wall divides every tier's bytes
    assert rate["cpu"] / rate["ssd"] == pytest.approx(fed["cpu"] / fed["ssd"]), (rate, fed)
    assert m["stage_seconds"]["train"] < two_ranks["stage_seconds"]["train"]
    sizes = m["ssd_request_sizes"]  # the reads by size, as the bench's fio measures the disk for this mix
    assert sum(x["requests"] for x in sizes) == m["ssd_requests"] and sum(x["bytes"] for x in sizes) == m["ssd_bytes_read"]
    assert all(x["from_bytes"] <= x["bytes"] / x["requests"] < 2 * x["from_bytes"] for x in sizes)
    assert sizes == two_ranks["ssd_request_sizes"]
    # the devices under the SSD bins, counted by the kernel over each epoch (none where the layout is on tmpfs)
    dev = block_device(layout)
    disks = [d for x in m["machines"] for d in x["disks"]]
    assert [d["device"] for d in disks] == ([dev.name] if dev else []), disks
    for d in disks:
        bins = [s.bin for s in load_manifest(layout).shards if s.kind == "ssd"]
        assert d["files"] in (bins, [*bins, "pack"]), d
        assert len(d["spans"]) == 2 and 0 <= d["busy_share"] <= 1 and d["read_bytes"] >= 0
        assert d["read_MB_per_s_busy"] is None or d["read_MB_per_s_busy"] > 0
    assert [r["disks"] for r in m["per_rank"]][:1] == [disks]
    for kw in ({"features": "memory"}, {"features": "memmap", "memmap_random": True, "loader_workers": 2}):
        d = train(_cfg(layout, epochs=2, data_only=True, **kw))
        rows = {"memmap" if kw["features"] == "memmap" else "memory": reference["tier_rows"]["memory"]}
        assert d["data_only"] and d["tier_rows"] == rows and d["steps"] == reference["steps"], kw
        assert d["loss_curve"] is None and d["seeds_per_s"] > 0


def test_data_only_is_refused_where_it_means_nothing(setup, capsys):
    _, _, layout = setup
    for extra in (["--checkpoint-dir", "/tmp/ck"], ["--checkpoint-dir", "/tmp/ck", "--resume"]):
        with pytest.raises(MomentError, match=r"a --data-only run trains no model, so it has nothing to checkpoint"):
            parse_args(["--layout", str(layout), "--data-only", *extra])
    from moment.cli import main

    assert main(["train", "--dry-run", "--data-only", "--layout", str(layout)]) == 2
    err = capsys.readouterr().err
    assert "a dry run starts no rank and reads nothing" in err and "Traceback" not in err
    with pytest.raises(MomentError, match="opened with data_only=True"):
        with run_mod.open_run(layout, data_only=True, quiet=True, threads=1, fanouts=[10, 5]) as run:
            for batch in run.loader("train", 0):
                run.track(batch.x.float().sum())
