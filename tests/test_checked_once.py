"""What a launch checks once, not once per rank: `moment train`'s launcher (or a script's torchrun agent with
--preload-index) checks the dataset and hands its ranks the identity of what it checked, and a rank opening that
dataset unchanged does not read and check it again; the launcher hands them the batch extent its budget check
charged, and a rank of that run takes it instead of sampling its first batches again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from runtime_data import TRAIN_ARGS, make_dataset

from moment.errors import MomentError
from moment.workload.graph import CHECKED_ENV, GraphDataset


@pytest.fixture
def own_dataset(runtime_dataset, tmp_path) -> Path:
    """A copy of the session's dataset this test may damage."""
    out = tmp_path / "ds"
    shutil.copytree(runtime_dataset.path, out)
    return out


@pytest.fixture
def no_checks(monkeypatch):
    """Fails the test when a dataset's blocks or structure are read; returns the list of the checks attempted."""
    tried: list[str] = []

    def refuse(name):
        def fail(self, *a, **k):
            if self.__dict__.get("_validated"):  # asked again (the sampler asks), answered from the verdict
                return None
            tried.append(name)
            raise AssertionError(f"the dataset was checked again ({name})")
        return fail

    for name in ("spot_check", "validate"):
        monkeypatch.setattr(GraphDataset, name, refuse(name))
    return tried


def test_a_vouched_dataset_is_not_checked_again_and_any_other_is(own_dataset, monkeypatch):
    notes, checked = GraphDataset.open(own_dataset).vouch()
    assert notes == [] and len(checked) == 64
    assert GraphDataset.open(own_dataset).identity() == checked  # another process opening it: the same identity
    with monkeypatch.context() as m:
        m.setattr(GraphDataset, "validate", lambda self: pytest.fail("validated again"))
        m.setattr(GraphDataset, "spot_check", lambda self: pytest.fail("spot-checked again"))
        assert GraphDataset.open(own_dataset).check(checked) == []
    calls = []
    real = GraphDataset.validate
    monkeypatch.setattr(GraphDataset, "validate", lambda self: calls.append(1) or real(self))
    GraphDataset.open(own_dataset).check("0" * 64)  # another dataset's verdict
    GraphDataset.open(own_dataset).check("")  # none
    assert len(calls) == 2


def test_a_file_written_again_after_the_check_is_checked(own_dataset):
    """The same bytes written again (a new file, as a copy or a rewrite makes) are checked again; a file damaged
    in place after the launcher's check is found by the rank's."""
    checked = GraphDataset.open(own_dataset).vouch()[1]
    labels = own_dataset / "labels.npy"
    shutil.copy(labels, own_dataset / "labels.tmp")
    os.replace(own_dataset / "labels.tmp", labels)
    assert GraphDataset.open(own_dataset).identity() != checked
    checked = GraphDataset.open(own_dataset).vouch()[1]
    ind = np.load(own_dataset / "indices.npy", mmap_mode="r+")
    ind[len(ind) // 2] = 10**6  # a neighbour id outside the graph, written where it was (same inode and size)
    ind.flush()
    del ind
    st = os.stat(own_dataset / "indices.npy")
    # a new time even where the clock ticks coarsely
    os.utime(own_dataset / "indices.npy", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(MomentError, match=r"indices\.npy: bytes .* do not match the manifest's block checksum"):
        GraphDataset.open(own_dataset).check(checked)


def test_a_dataset_changed_while_it_was_checked_is_vouched_for_by_nobody(own_dataset, monkeypatch):
    real = GraphDataset.validate

    def touched_meanwhile(self):
        real(self)
        (own_dataset / "labels.npy").touch()

    monkeypatch.setattr(GraphDataset, "validate", touched_meanwhile)
    assert GraphDataset.open(own_dataset).vouch() == ([], "")
    ds = GraphDataset.open(own_dataset)
    (own_dataset / "val_idx.npy").unlink()
    assert ds.identity() == ""  # a file gone: no verdict matches


def test_a_dataset_without_block_checksums_keeps_its_note(tmp_path, monkeypatch):
    ds = make_dataset(tmp_path, nodes=300, dim=8)
    man = ds.path / "manifest.json"
    raw = json.loads(man.read_text())
    for rec in raw["files"].values():
        rec["block_sha256"] = rec["block_bytes"] = None
    man.write_text(json.dumps(raw))
    notes, checked = GraphDataset.open(ds.path).vouch()
    assert len(notes) == 1 and "no block checksums" in notes[0] and checked
    monkeypatch.setattr(GraphDataset, "validate", lambda self: pytest.fail("validated again"))
    assert GraphDataset.open(ds.path).check(checked) == notes


@pytest.fixture
def fake_start_sizes(monkeypatch, tmp_path):
    """A fresh rank's and agent's sizes stated, not measured (a fresh interpreter importing torch: not these tests'),
    and the records (start sizes, extents) kept in the test's own folder."""
    from moment.runtime import start_sizes as ss

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(ss, "_start", lambda model=None: model)
    monkeypatch.setattr(ss, "_collect", lambda model: (100 << 20, 300 << 20, 80 << 20))
    monkeypatch.setattr(ss, "_ahead", {})
    monkeypatch.setattr(ss, "_measured", {})


def test_the_launcher_hands_its_ranks_the_dataset_it_checked(runtime_layout, runtime_dataset, tmp_path,
                                                             fake_start_sizes):
    """With a budget, the extent it charged too."""
    from moment.cli.train_cmds import _precheck
    from moment.runtime.sizing import EXTENT_ENV

    args = ["--layout", str(runtime_layout), *TRAIN_ARGS]
    _, env, _ = _precheck(args, 2, tmp_path / "runs")
    assert env == {CHECKED_ENV: runtime_dataset.identity()}
    _, env, _ = _precheck([*args, "--memory-budget", "3GiB"], 2, tmp_path / "runs")
    assert env[CHECKED_ENV] == runtime_dataset.identity() and json.loads(env[EXTENT_ENV])["rows"] > 0


def test_a_rank_trusts_the_launchers_check_only_for_that_dataset(runtime_layout, runtime_dataset, no_checks,
                                                                 monkeypatch):
    import moment

    monkeypatch.setenv(CHECKED_ENV, runtime_dataset.identity())
    with moment.open_run(runtime_layout, fanouts=[5, 5], batch_size=64) as run:
        assert next(iter(run.loader("train", 0))).batch_size == 64
    assert no_checks == []
    monkeypatch.setenv(CHECKED_ENV, "0" * 64)
    with pytest.raises(AssertionError, match="checked again"):
        moment.open_run(runtime_layout, fanouts=[5, 5], batch_size=64)


def test_a_scripts_agent_checks_the_dataset_of_its_preload_index_once(runtime_layout, runtime_dataset, monkeypatch):
    from moment.runtime import agent

    monkeypatch.setenv(CHECKED_ENV, "")  # restored after the test: keep_index sets it in this process
    monkeypatch.setattr("moment.placement.opened._KEPT", {})
    agent.keep_index(str(runtime_layout), given=True)
    assert os.environ[CHECKED_ENV] == runtime_dataset.identity()
    monkeypatch.setenv(CHECKED_ENV, "")
    agent.keep_index(str(runtime_layout))  # moment train's agent: its launcher checked the dataset
    assert os.environ[CHECKED_ENV] == ""
    monkeypatch.setenv(CHECKED_ENV, "")

    def damaged(self):
        raise MomentError("damaged", source=str(self.path))

    monkeypatch.setattr(GraphDataset, "vouch", damaged)  # or gone: the script may read another copy
    agent.keep_index(str(runtime_layout), given=True)  # left to the ranks, which say why
    assert os.environ[CHECKED_ENV] == ""


def test_a_rank_takes_the_batch_extent_its_launcher_charged(runtime_layout, runtime_dataset, monkeypatch,
                                                            fake_start_sizes):
    """The launcher's extent is every rank's largest, which the ranks agree on when each samples its own; a rank
    of another run (another world size) or given a damaged figure samples its own."""
    from moment.runtime import sizing
    from moment.runtime.config import parse_args
    from moment.runtime.sizing import EXTENT_ENV
    from moment.workload.sampler import CSRGraph, SeedBatches

    monkeypatch.delenv(EXTENT_ENV, raising=False)
    cfg = parse_args(["--layout", str(runtime_layout), *TRAIN_ARGS], check=False)
    ds = runtime_dataset
    graph, train_idx = CSRGraph.from_dataset(ds), np.asarray(ds.train_idx)

    def inputs(rank: int, world: int = 2):
        b = SeedBatches(train_idx, cfg.resolved_batch_size(train_idx.size, world), seed=cfg.seed, rank=rank,
                        world_size=world)
        return sizing.run_inputs(cfg, ds, graph, [b], cfg.resolved_fanouts(), 1 << 20, 0, 2, None)

    own = [inputs(r) for r in range(2)]  # each rank's own batches, before they agree on the largest
    assert sizing.extent_env(cfg, ds, 2) == {}  # nothing checked yet
    sizing.preview_inputs(cfg, ds, 2)  # the launcher's check
    handed = sizing.extent_env(cfg, ds, 2)
    rec = json.loads(handed[EXTENT_ENV])
    assert rec["rows"] == max(i.rows_max for i in own) and rec["edges"] == max(i.edges_max for i in own)
    monkeypatch.setenv(EXTENT_ENV, handed[EXTENT_ENV])
    sampled = []
    real = sizing._batch_extent
    monkeypatch.setattr(sizing, "_batch_extent", lambda *a, **k: sampled.append(1) or real(*a, **k))
    for r in range(2):
        got = inputs(r)
        assert (got.rows_max, got.edges_max, got.training_bytes) == (rec["rows"], rec["edges"],
                                                                        max(i.training_bytes for i in own))
    assert sampled == []
    inputs(0, world=3)  # another run's ranks
    monkeypatch.setenv(EXTENT_ENV, handed[EXTENT_ENV][:-9])  # cut short
    inputs(0)
    monkeypatch.setenv(EXTENT_ENV, json.dumps({**rec, "rows": "many"}))
    inputs(0)
    assert sampled == [1, 1, 1]
