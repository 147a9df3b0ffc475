"""Pre-sampling counts match the sampler's batches exactly; skew, persistence, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.workload.graph import GraphDataset
from moment.workload.hotness import Hotness, presample
from moment.workload.synth import synthesize


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> GraphDataset:
    return synthesize(tmp_path_factory.mktemp("h") / "g", 8000, feature_dim=8, seed=1)


def test_counts_match_a_manual_replay(ds: GraphDataset) -> None:
    import torch

    from moment.workload.sampler import CSRGraph, NeighborSampler, SeedBatches

    hot = presample(ds, [5, 3], 100, epochs=2, seed=4)
    sb = SeedBatches(ds.train_idx, 100, seed=4)
    s = NeighborSampler(CSRGraph.from_dataset(ds), [5, 3], seed=4)
    feat = np.zeros(ds.num_nodes, np.int64)
    adj = np.zeros(ds.num_nodes, np.int64)
    n = 0
    drawn = []  # ids drawn per batch before de-duplication: the seeds and one per sampled edge
    ratios = []
    for e in range(2):
        for b in sb.epoch(e):
            mb = s.sample(b)
            feat += np.bincount(mb.n_id.numpy(), minlength=ds.num_nodes)
            adj += np.bincount(torch.cat(mb.targets_per_hop).numpy(), minlength=ds.num_nodes)
            drawn.append(len(b) + mb.edge_index.shape[1])
            ratios.append(mb.n_id.numel() / drawn[-1])
            n += 1
    np.testing.assert_array_equal(hot.feature_reads, feat)
    np.testing.assert_array_equal(hot.adjacency_reads, adj)
    assert hot.num_batches == n == 2 * len(sb)
    assert feat.max() <= n  # once per batch at most
    assert np.all(hot.feature_reads[np.asarray(ds.train_idx)] >= 2)  # every seed at least once per epoch
    assert hot.sampled_total == sum(drawn) and hot.unique_ratio == pytest.approx(np.mean(ratios))
    assert 0 < hot.unique_ratio < 1 and hot.sampled_total > hot.total_feature_reads
    assert hot.meta["sampled_per_s"] > 0 and hot.meta["epochs"] == 2


def test_skew_and_order(ds: GraphDataset) -> None:
    hot = presample(ds, [10, 5], 64, epochs=4, seed=0)
    assert hot.num_batches == 32
    sk = hot.skew()
    assert list(sk) == [0.01, 0.05, 0.10]
    assert 0.01 <= sk[0.01] <= sk[0.05] <= sk[0.10] <= 1.0
    assert sk[0.01] > 0.03 and sk[0.10] > 0.2  # skewed (32 batches cap a node at 32 reads)
    assert hot.share_of_top(0.05) == pytest.approx(sk[0.05])
    assert hot.share_of_top(0) == 0 and hot.share_of_top(1) == 1
    o = hot.order()
    f = hot.feature_reads[o]
    assert np.all(np.diff(f) <= 0)
    ties = o[f == f[-1]]
    assert np.all(np.diff(ties) > 0)  # ties by node id
    c = hot.curve(11)
    assert c[0] == (0.0, 0.0) and c[-1][1] == pytest.approx(1.0)
    s = hot.summary()
    assert s["skew"]["top_0.01"] == sk[0.01] and s["fanouts"] == [10, 5]


def test_deterministic(ds: GraphDataset) -> None:
    a = presample(ds, [5, 5], 64, num_batches=4, seed=2)
    b = presample(ds, [5, 5], 64, num_batches=4, seed=2)
    c = presample(ds, [5, 5], 64, num_batches=4, seed=3)
    assert np.array_equal(a.feature_reads, b.feature_reads)
    assert not np.array_equal(a.feature_reads, c.feature_reads)


def test_save_load(ds: GraphDataset, tmp_path: Path) -> None:
    hot = presample(ds, [5], 200, num_batches=2)
    out = hot.save(tmp_path / "hot")
    back = Hotness.load(out)
    assert np.array_equal(back.feature_reads, hot.feature_reads)
    assert np.array_equal(back.adjacency_reads, hot.adjacency_reads)
    assert back.meta == hot.meta and back.unique_ratio == hot.unique_ratio
    hot.save(out)  # overwrite in place
    with pytest.raises(MomentError, match="no hotness.json"):
        Hotness.load(tmp_path)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    with pytest.raises(MomentError, match="not a Moment hotness"):
        hot.save(tmp_path / "plain")
    assert (tmp_path / "plain" / "notes.txt").read_text() == "mine"
    np.save(out / "feature_reads.npy", np.zeros(3, np.int64))
    with pytest.raises(MomentError, match="shape") as e:
        Hotness.load(out)
    assert "feature_reads.npy" in str(e.value)


def test_bad_arguments(ds: GraphDataset) -> None:
    with pytest.raises(MomentError, match="batch-size"):
        presample(ds, [5], 0)
    with pytest.raises(MomentError, match="fan-outs"):
        presample(ds, [5, 0], 10)
    with pytest.raises(MomentError, match="num-batches"):
        presample(ds, [5], 10, num_batches=0)


@pytest.fixture(scope="module")
def two_batches(ds: GraphDataset, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Code that makes a child's `presample` return the 2-batch hotness sampled here once (for those arguments
    only): the child imports no torch and samples nothing (most of its ~1.4 CPU-s), and the save is what is tested."""
    import pickle

    f = tmp_path_factory.mktemp("two") / "hot.pickle"
    f.write_bytes(pickle.dumps(presample(ds, [5], 200, num_batches=2)))
    return ("import pickle\nimport moment.workload.hotness as h\n"
            f"_hot = pickle.loads(open({str(f)!r}, 'rb').read())\n"
            "def _given(ds, fanouts, batch_size, *, epochs, num_batches, seed, progress=None):\n"
            "    assert (list(fanouts), batch_size, epochs, num_batches, seed) == ([5], 200, 1, 2, 0)\n"
            "    return _hot\nh.presample = _given\n")


@pytest.mark.parametrize("point,exchange,survivor", [
    ("hotness-written", True, 1), ("hotness-swapped", True, 2),
    ("hotness-old-moved", False, 1), ("hotness-swapped", False, 2)])
@pytest.mark.slow
def test_a_killed_save_leaves_the_old_or_the_new_hotness_and_the_next_save_cleans_up(ds, two_batches, tmp_path, point,
                                                                                       exchange, survivor):
    """kill -9 at each step of putting the new hotness in place (with the file system's atomic swap, and
    with two renames where it has none): the next writer finds the old or the new one whole. The killed
    `moment data presample` is given its counts (`two_batches`)."""
    from test_data_safety import cli

    from moment import testpoints
    from moment.outputs import remove_stale

    out = tmp_path / "hot"
    presample(ds, [5], 200, num_batches=1).save(out)
    args = ["data", "presample", ds.path, "--fanouts", "5", "--batch-size", "200", "--num-batches", "2", "--out", out]
    r = cli(args, {testpoints.CRASH_ENV: point}, exchange=exchange, prelude=two_batches)
    assert r.returncode == -9, r.stderr
    left = [p.name for p in tmp_path.iterdir() if p.name != ".hot.lock"]  # (a dead holder's lock blocks no one)
    assert len(left) == 2, left  # versions: at the path, under a temporary name, or set aside
    if point != "hotness-old-moved":  # with two renames, the moment between them has no hotness at the path
        assert Hotness.load(out).num_batches == survivor
    remove_stale(out, set_aside=True)  # what the next save does first, holding the lock
    assert Hotness.load(out).num_batches == survivor
    presample(ds, [5], 200, num_batches=3).save(out)
    assert Hotness.load(out).num_batches == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hot"]


def _damage(d: Path, how: str) -> str:
    """Damage the hotness at `d` as `how` says; the file the error must name."""
    import json

    f, a = d / "feature_reads.npy", np.load(d / "feature_reads.npy")
    if how == "negative":
        np.save(f, np.full_like(a, -5))
    elif how == "nan":
        b = a.astype(np.float64)
        b[3] = np.nan
        np.save(f, b)
    elif how == "dtype":
        np.save(f, a.astype(np.float32))
    elif how == "length":
        np.save(f, a[:-1])
    elif how == "too-many":
        a[7] = 10**6
        np.save(f, a)
    elif how == "swapped":  # the two arrays exchanged: neighbours sampled of a row never read
        np.save(f, np.load(d / "adjacency_reads.npy"))
        np.save(d / "adjacency_reads.npy", a)
        return "adjacency_reads.npy"
    elif how == "reversed":  # both reversed: every rule holds, only the checksum tells
        for g in (f, d / "adjacency_reads.npy"):
            np.save(g, np.load(g)[::-1])
    else:  # an edit to hotness.json: the fan-outs the counts were sampled at
        doc = json.loads((d / "hotness.json").read_text())
        doc["meta"]["fanouts"] = [3]
        (d / "hotness.json").write_text(json.dumps(doc))
        return "hotness.json"
    return "feature_reads.npy"


@pytest.mark.parametrize("how, says", [
    ("negative", "negative counts (node 0: -5)"), ("nan", "holds float64 values (NaN among them)"),
    ("dtype", "holds float32 values, not the integer counts"), ("length", "holds counts of shape (7999,), but"),
    ("too-many", "node 7 is counted 1000000 reads in 2 batch(es)"), ("swapped", "its row read only 0"),
    ("reversed", "its checksum does not match the one hotness.json records"),
    ("edited-json", "edited or damaged: its checksum does not match its content")])
def test_damaged_hotness_is_refused_where_it_is_read_naming_the_file(ds, tmp_path, how, says):
    """hunt-K D6: a damaged --hotness was used unchecked (cache simulate printed hit rates of negative counts,
    place blamed the dataset and --batches, or said 'order is not sorted' naming nothing). `Hotness.load`, which
    place and cache simulate both read it through, checks the counts against what every pre-sampling writes and
    against the checksums presample records: one error line naming the file."""
    import contextlib
    import io

    from moment.cli import main

    d = presample(ds, [5], 200, num_batches=2).save(tmp_path / "hot")
    name = _damage(d, how)
    for argv in (["cache", "simulate", "--dataset", ds.path, "--capacity", "10%"],
                 ["place", "--dataset", ds.path, "--gpus", "1", "--ssds", "1", "--out", tmp_path / "L"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main([str(a) for a in [*argv, "--hotness", d]])
        text = " ".join(err.getvalue().split())
        assert rc == 2 and text.startswith(f"error: {d / name}: ") and says in text, text
        assert text.count("error:") == 1 and "Traceback" not in text
    assert not (tmp_path / "L").exists()


def test_hotness_written_before_its_checksums_is_read_by_the_rules_alone(ds, tmp_path):
    import json

    hot = presample(ds, [5], 200, num_batches=2)
    d = hot.save(tmp_path / "hot")
    doc = json.loads((d / "hotness.json").read_text())
    assert set(doc["files"]) == {"feature_reads.npy", "adjacency_reads.npy"} and len(doc["sha256"]) == 64
    del doc["files"], doc["sha256"]
    (d / "hotness.json").write_text(json.dumps(doc))
    assert np.array_equal(Hotness.load(d).feature_reads, hot.feature_reads)
    _damage(d, "negative")
    with pytest.raises(MomentError, match="negative counts"):
        Hotness.load(d)
