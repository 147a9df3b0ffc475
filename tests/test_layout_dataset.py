"""A layout knows the dataset it was placed from (`Layout.dataset_dir`, `Layout.dataset`): found, checked to be
that dataset, and one clear error when it was moved, deleted, replaced or never was a dataset."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from runtime_data import make_dataset, make_layout

from moment.errors import MomentError
from moment.placement import BinSet, ddak, write_layout
from moment.placement.opened import Layout

NODES = 600


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    root = tmp_path_factory.mktemp("placed")
    ds = make_dataset(root, NODES)
    return root, ds, make_layout(ds, root / "L")


def test_the_layout_finds_and_checks_its_dataset(placed, tmp_path):
    _, ds, path = placed
    lay = Layout.open(path)
    assert lay.dataset_dir == ds.path and lay.dataset.path == ds.path
    assert lay.dataset.dataset_id == ds.dataset_id == lay.manifest.dataset.id
    assert lay.dataset is lay.dataset  # opened once
    from moment.runtime.config import make_config
    from moment.runtime.run import dataset_dir

    assert dataset_dir(make_config(layout=path)) == ds.path  # the trainer asks the layout
    assert dataset_dir(make_config(layout=path, dataset=tmp_path)) == tmp_path  # --dataset wins


def test_a_moved_deleted_or_replaced_dataset_is_one_error(tmp_path):
    here = make_dataset(tmp_path, NODES, name="ds")
    path = make_layout(here, tmp_path / "L")
    moved = tmp_path / "elsewhere"
    shutil.move(here.path, moved)
    with pytest.raises(MomentError, match=rf"L: the dataset it was placed from is no longer at {here.path} "
                                          r"\(moved or deleted\).*\n  hint: give the dataset's directory"):
        _ = Layout.open(path).dataset_dir
    make_dataset(tmp_path, NODES, seed=2, name="ds")  # another dataset where it was
    with pytest.raises(MomentError, match="the layout was placed from another dataset"):
        _ = Layout.open(path).dataset
    shutil.rmtree(here.path)
    shutil.move(moved, here.path)  # back where it was placed from: found again
    assert Layout.open(path).dataset.dataset_id == here.dataset_id


def test_a_layout_of_a_bare_features_file_has_no_dataset(tmp_path):
    feats = np.arange(NODES * 4, dtype=np.float32).reshape(NODES, 4)
    np.save(tmp_path / "features.npy", feats)
    bins = BinSet.uniform(gpus=1, cpus=1, ssds=1, gpu_rows=30, cpu_rows=60, ssd_rows=NODES, gpu_share=0.1,
                          cpu_share=0.3)
    path = write_layout(tmp_path / "L", tmp_path / "features.npy", ddak(np.arange(NODES), bins, pool=4))
    with pytest.raises(MomentError, match="placed from the features file .*features.npy, which is not in a dataset"):
        _ = Layout.open(path).dataset
