"""Multi-label node classification (PPI, Yelp, ogbn-proteins: a 0/1 target a class): stored as uint8 [N, C],
given to a loss as float targets, trained with binary cross entropy and scored by micro-F1, through the same
tiered pipeline as single-label data (the same loss curve as the in-memory run), in `moment train` and in a
loop of one's own."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_data import make_layout

torch = pytest.importorskip("torch")

from moment.errors import MomentError  # noqa: E402 - after the skip: these need torch
from moment.runtime.config import TrainConfig  # noqa: E402
from moment.runtime.model_spec import load_loss  # noqa: E402
from moment.runtime.pipeline import seed_labels  # noqa: E402
from moment.runtime.train import train  # noqa: E402
from moment.workload import batch_bytes  # noqa: E402
from moment.workload.graph import GraphDataset, write_graph  # noqa: E402

C = 6
FAST = {"fanouts": [10, 5], "hidden": 32, "threads": 1, "quiet": True, "lr": 0.01}


def targets_of(x: np.ndarray) -> np.ndarray:
    """Learnable 0/1 targets: each class a thresholded projection of the features (a node has 0 to C)."""
    w = np.random.default_rng(7).standard_normal((x.shape[1], C))
    return (x @ w > 1.0).astype(np.uint8)


@pytest.fixture(scope="module")
def multi(runtime_dataset, tmp_path_factory):
    """The session's runtime graph with multi-label targets in place of its classes, and its layout."""
    ds = runtime_dataset
    root = tmp_path_factory.mktemp("multilabel")
    y = targets_of(np.asarray(ds.features_memmap(), dtype=np.float32))
    out = write_graph(root / "ds", indptr=ds.indptr, indices=ds.indices, features=ds.features_memmap(), labels=y,
                      train_idx=ds.train_idx, val_idx=ds.val_idx, test_idx=ds.test_idx)
    return out, y, make_layout(out, root / "L")


def test_the_dataset_holds_a_target_a_class(multi):
    ds, y, _ = multi
    ds.verify()
    assert ds.multilabel and ds.num_classes == C and ds.labels.dtype == np.uint8
    np.testing.assert_array_equal(ds.labels, y)
    assert ds.summary()["multilabel"] and GraphDataset.open(ds.path).multilabel  # from the manifest alone
    assert 0.1 < y.mean() < 0.5  # neither all 0 nor all 1: the F1 below means something


def test_a_target_that_is_not_0_or_1_is_refused_naming_the_file(multi, tmp_path):
    ds, y, _ = multi
    bad = y.copy()
    bad[5, 2] = 2
    with pytest.raises(MomentError, match=r"labels\.npy: multi-label labels must be 0 or 1, found 2"):
        write_graph(tmp_path / "bad", indptr=ds.indptr, indices=ds.indices, features=ds.features_memmap(),
                    labels=bad, train_idx=ds.train_idx, val_idx=ds.val_idx, test_idx=ds.test_idx)
    assert not (tmp_path / "bad").exists()


def test_moment_train_learns_with_binary_cross_entropy_and_reports_micro_f1(multi):
    _, _, layout = multi
    ref = train(TrainConfig(layout=layout, epochs=3, features="memory", pipeline=False, **FAST))
    m = train(TrainConfig(layout=layout, epochs=3, **FAST))
    assert m["val_metric"] == "micro_f1" and "val_accuracy" not in m
    assert m["loss_curve"] == ref["loss_curve"] and m["val_micro_f1_curve"] == ref["val_micro_f1_curve"]
    f1 = m["val_micro_f1_curve"]
    assert f1[-1] > 0.6 and f1[-1] > f1[0], f1  # above what predicting every class gives (2p/(1+p) < 0.6)
    assert m["loss_curve"][-1] < m["loss_curve"][0] < 0.75  # BCE from about ln 2, not cross entropy's ln C


def test_an_own_loop_gets_float_targets_and_a_loss_of_its_own_sees_them(multi):
    from moment import open_run

    ds, y, layout = multi
    with open_run(layout, fanouts=[10, 5], batch_size=256, threads=1, quiet=True) as run:
        assert run.multilabel and run.num_classes == C
        batch = next(iter(run.loader("train", 0)))
        assert batch.y.dtype == torch.float32 and tuple(batch.y.shape) == (batch.batch_size, C)
        np.testing.assert_array_equal(batch.y.numpy(), y[batch.n_id[: batch.batch_size].numpy()])
    labels = torch.from_numpy(y)
    assert seed_labels(labels, torch.tensor([3, 1])).dtype == torch.float32
    assert seed_labels(torch.tensor([2, 0, 1]), torch.tensor([2])).dtype == torch.int64
    loss = load_loss(None, C, multilabel=True)
    assert loss is torch.nn.functional.binary_cross_entropy_with_logits


def test_a_batch_charges_its_float_targets():
    assert batch_bytes.id_bytes(10, 20, num_targets=4 * C) - batch_bytes.id_bytes(10, 20) == 4 * C * 4


def test_a_loss_of_ones_own_gets_the_targets_in_moment_train(multi, monkeypatch):
    """examples/own_loop.py's model and loss (`--model`, `--loss`) train the multi-label data as given."""
    from runtime_data import REPO

    monkeypatch.syspath_prepend(str(REPO))
    _, _, layout = multi
    m = train(TrainConfig(layout=layout, epochs=2, model="examples.own_loop:factory", loss="examples.own_loop:loss",
                          **FAST))
    assert m["val_metric"] == "micro_f1" and m["loss_curve"][-1] < m["loss_curve"][0], m["loss_curve"]
