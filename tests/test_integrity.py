"""Corrupt or foreign data is found where the checksums are checked (`layout verify`, `place`, `data info
--verify`, the start of a run), never as an IndexError in a rank or as silent garbage.

Each edit below recomputes the checksums that cover the edited file, so only the structural check (or,
for a kept manifest, the sampled block checksums) can catch it."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from runtime_data import make_dataset, make_layout

from moment.cli import main
from moment.errors import MomentError
from moment.placement.manifest import manifest_sha256
from moment.placement.pack import Segments, load_pack, pack_path, write_pack
from moment.runtime.config import TrainConfig
from moment.runtime.store import RankPlace, StoreOptions, open_tiers
from moment.runtime.tier import Tier
from moment.runtime.train import train
from moment.workload.graph import GraphDataset, hash_blocks
from moment.workload.synth import synthesize

NODES = 1500
FAST = {"fanouts": [5, 5], "hidden": 16, "threads": 1, "quiet": True, "epochs": 1}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    ds = make_dataset(root, nodes=NODES)
    layout = make_layout(ds, root / "L")
    write_pack(layout, ds, world_size=1, batch_size=64, fanouts=(5,), seed=0, epochs=1, cached_rows=NODES // 10)
    other_ds = synthesize(root / "ds2", NODES, feature_dim=ds.feature_dim, num_classes=4, seed=2,
                          train_fraction=0.3)
    other = make_layout(other_ds, root / "L2")
    write_pack(other, other_ds, world_size=1, batch_size=64, fanouts=(5,), seed=0, epochs=1, cached_rows=0)
    return root, ds, layout, other


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _edit_dataset(src: Path, dst: Path, name: str, at, value, *, keep_manifest: bool = False) -> Path:
    """A copy of the dataset with `name[at] = value`; its manifest's checksums recomputed unless kept."""
    shutil.copytree(src, dst)
    doc = json.loads((dst / "manifest.json").read_text())
    f = dst / doc["files"][name]["file"]
    a = np.load(f, mmap_mode="r+")
    a[at] = value
    a.flush()
    del a
    if not keep_manifest:
        whole, blocks, size = hash_blocks(f)
        doc["files"][name] |= {"sha256": whole, "block_sha256": blocks, "block_bytes": size}
        (dst / "manifest.json").write_text(json.dumps(doc))
    return dst


def _write_layout_manifest(layout: Path, doc: dict) -> None:
    """The edited layout manifest `doc` written with its own checksum made to match (only what it protects can
    then tell the edit)."""
    (layout / "manifest.json").write_text(json.dumps(doc | {"sha256": manifest_sha256(doc)}))


def _edit_layout_file(layout: Path, rel: str, key: str, edit) -> None:
    """Apply `edit` to the layout's .npy `rel` and record its new checksum in the layout manifest."""
    f = layout / rel
    a = np.load(f)
    edit(a)
    np.save(f, a)
    doc = json.loads((layout / "manifest.json").read_text())
    doc[key] |= {"sha256": _sha(f), "bytes": f.stat().st_size}
    _write_layout_manifest(layout, doc)


def _verify(layout: Path, capsys) -> tuple[int, str]:
    """`moment layout verify --json`: its exit code and its problems, one a line."""
    code = main(["layout", "verify", str(layout), "--json"])
    return code, "\n".join(json.loads(capsys.readouterr().out)["problems"])


def _store(layout: Path, **kw) -> Tier:
    return open_tiers(layout, RankPlace(world_size=1), StoreOptions(shape="packed", pack_seed=0, **kw))


# ---- the pack ------------------------------------------------------------------------------------------


def _garbage(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    raw[100:4196] = bytes(range(256)) * 16
    p.write_bytes(bytes(raw))


def _cut(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _bad_index(layout: Path, name: str, value: int | None) -> None:
    """A pack index whose array `name` ends in `value` (None: without that array, as an older pack's index),
    its checksum and size recomputed."""
    man = load_pack(layout)
    f = pack_path(layout) / man.files[0].index
    with np.load(f) as z:
        arrays = dict(z)
    if value is None:
        del arrays[name]
    else:
        arrays[name][-1] = value
    with open(f, "wb") as out:
        np.savez(out, **arrays)
    doc = json.loads((pack_path(layout) / "pack.json").read_text())
    doc["files"][0] |= {"index_sha256": _sha(f), "index_bytes": f.stat().st_size}
    (pack_path(layout) / "pack.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("damage, file, says, at_start", [
    ("garbage", "rank0.bin", "checksum mismatch", None),  # same size: only hashing finds it (--verify)
    ("garbage", "rank0.npz", "checksum mismatch", "checksum mismatch"),  # the index is hashed at every start
    ("cut", "rank0.bin", "cut or replaced", "cut or replaced"),
    ("cut", "rank0.npz", "cut or replaced", "cut or replaced"),
    ("ids", "rank0.npz", "pack index is malformed: a node id is outside", "a node id is outside"),
    ("split", "rank0.npz", "pack index is malformed: a segment's split is not one of", "a segment's split is not"),
    ("foreign", "pack.json", "made for another layout (at ", "made for another layout"),
], ids=["garbage", "garbage-index", "cut-data", "cut-index", "index-ids", "index-split", "foreign"])
def test_layout_verify_finds_a_damaged_or_foreign_pack(env, tmp_path, capsys, damage, file, says, at_start):
    _, _, layout, other = env
    copy = shutil.copytree(layout, tmp_path / "L")
    if damage == "foreign":  # another layout's pack copied in
        shutil.rmtree(pack_path(copy))
        shutil.copytree(pack_path(other), pack_path(copy))
    elif damage in ("ids", "split"):
        _bad_index(copy, damage, NODES + 7 if damage == "ids" else 7)
    else:
        (_garbage if damage == "garbage" else _cut)(pack_path(copy) / file)
    code, err = _verify(copy, capsys)
    assert code == 1 and f"{pack_path(copy) / file}: " in err and says in err, err
    if damage == "foreign":
        assert str(other) in err  # the layout it was made for, by name
    if at_start is None:  # a run that does not hash finds garbage of the right size only with --verify
        with pytest.raises(MomentError, match="checksum mismatch"):
            _store(copy, verify=True)
    else:  # a run refuses it before reading a batch, without hashing
        with pytest.raises(MomentError, match=at_start):
            _store(copy)


def test_a_sound_pack_verifies(env, capsys):
    code, err = _verify(env[2], capsys)
    assert code == 0, err


def test_an_older_pack_without_evaluation_batches_verifies_and_is_read(env, tmp_path, capsys):
    """A pack index written before packs held validation batches (no `split` array): every segment a training
    batch's; it verifies, and a run reads it."""
    copy = shutil.copytree(env[2], tmp_path / "L")
    _bad_index(copy, "split", None)
    code, err = _verify(copy, capsys)
    assert code == 0, err
    seg = Segments.load(pack_path(copy) / load_pack(copy).files[0].index)
    assert not seg.split.any() and seg.find(0, 0) == 0 and seg.find(0, 0, "val") is None
    _store(copy).close()


# ---- shards --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".rows", ".shard"])
def test_layout_verify_finds_a_shard_filled_with_garbage(env, tmp_path, capsys, suffix):
    copy = shutil.copytree(env[2], tmp_path / "L")
    shard = sorted((copy / "shards").glob(f"*{suffix}"))[0]
    shard.write_bytes(np.random.default_rng(0).integers(0, 256, shard.stat().st_size, np.uint8).tobytes())
    code, err = _verify(copy, capsys)
    assert code == 1 and f"shard of bin {shard.stem}" in err and str(shard) in err, err


# ---- the layout index and order -----------------------------------------------------------------------


def _set(at, value):
    def edit(a):
        a[at] = value
    return edit


@pytest.mark.parametrize("rel, key, edit, says", [
    ("index.npy", "index", _set((3, 0), 9), "node 3 is in bin 9, but the layout has bins 0..4"),
    ("index.npy", "index", _set((3, 1), 10**6), "node 3 is at row 1000000 of bin"),
    ("index.npy", "index", _set((3, 1), -5), "node 3 is at row -5 of bin"),
    ("index.npy", "index", lambda a: a.__setitem__(3, a[4]), "share a row"),
    ("order.npy", "order_file", _set(0, NODES + 1), "hotness order is malformed: a node id is outside"),
], ids=["bin", "slot-high", "slot-negative", "shared-row", "order"])
def test_an_edited_layout_is_refused_by_verify_and_at_train_start(env, tmp_path, capsys, rel, key, edit, says):
    _, ds, layout, _ = env
    copy = shutil.copytree(layout, tmp_path / "L")
    shutil.rmtree(pack_path(copy))
    _edit_layout_file(copy, rel, key, edit)
    code, err = _verify(copy, capsys)
    assert code == 1 and says in err and str(copy / rel) in err, err
    with pytest.raises(MomentError, match=says.replace("(", r"\(")) as e:
        train(TrainConfig(layout=copy, dataset=ds.path, **FAST))
    assert str(copy / rel) in str(e.value)


def test_a_manifest_whose_shard_rows_exceed_its_bytes_is_refused(env, tmp_path, capsys):
    """One row moved from an SSD bin to a cache bin in the layout's manifest (the total still matches):
    the cache bin's rows no longer fit its bytes, so a read through the index would run past its file."""
    _, ds, layout, _ = env
    copy = shutil.copytree(layout, tmp_path / "L")
    shutil.rmtree(pack_path(copy))
    doc = json.loads((copy / "manifest.json").read_text())
    cache = next(s for s in doc["shards"] if s["kind"] == "gpu")
    next(s for s in doc["shards"] if s["kind"] == "ssd")["rows"] -= 1
    cache["rows"] += 1
    _write_layout_manifest(copy, doc)
    says = f"bin {cache['bin']} has {cache['rows']} rows of {cache['stride']} B, more than its {cache['bytes']} B"
    code, err = _verify(copy, capsys)
    assert code == 1 and says in err, err
    with pytest.raises(MomentError, match=says):
        train(TrainConfig(layout=copy, dataset=ds.path, **FAST))


def _last(key: str, value):
    def edit(doc):
        doc["shards"][-1][key] = value
    return edit


def _dataset_field(key: str, value):
    def edit(doc):
        doc["dataset"][key] = value
    return edit


@pytest.mark.parametrize("edit, says", [
    (_last("chunk_bytes", -5), "chunk_bytes: Input should be greater than 0"),
    (_last("chunk_bytes", 0), "chunk_bytes: Input should be greater than 0"),
    (_last("chunk_sha256", []), "0 chunk checksums for"),
    (_dataset_field("row_shape", [4]), "row_shape [4] of <f4 is 16 B, but row.row_bytes is 128 B"),
    (_dataset_field("dtype", "<f2"), "row_shape [32] of <f2 is 64 B, but row.row_bytes is 128 B"),
    (_dataset_field("dtype", "nope"), "dtype 'nope' with row_shape [32] is not a numeric row"),
], ids=["chunk-negative", "chunk-zero", "chunk-sums", "row-shape", "dtype", "dtype-unknown"])
def test_a_manifest_whose_fields_contradict_is_damage_to_verify_and_refused_by_train(env, tmp_path, capsys, edit,
                                                                                       says):
    """A negative chunk size crashed `layout verify` (pread's EINVAL), a zero one was blamed on chunk 0, and a row
    shape or dtype that disagrees with the row's bytes passed verify and killed the run reshaping its first
    batch: the manifest model checks them, verify names the manifest as the damaged file (exit 1), a run refuses."""
    _, ds, layout, _ = env
    copy = shutil.copytree(layout, tmp_path / "L")
    shutil.rmtree(pack_path(copy))
    doc = json.loads((copy / "manifest.json").read_text())
    edit(doc)
    (copy / "manifest.json").write_text(json.dumps(doc))
    code, err = _verify(copy, capsys)
    assert code == 1 and err.startswith(f"{copy / 'manifest.json'}: ") and says in err, err
    assert main(["layout", "verify", str(copy)]) == 1
    assert f"layout damaged: file {copy / 'manifest.json'}" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(MomentError, match=re.escape(says)):
        train(TrainConfig(layout=copy, dataset=ds.path, **FAST))


def _swap_ssd_shards(doc: dict) -> None:
    """Two SSD bins' files and their chunk checksums swapped: each file still matches the checksums it is listed
    with, but every node of the one bin reads the other bin's rows (another node's features)."""
    a, b = [s for s in doc["shards"] if s["kind"] == "ssd"][:2]
    a["path"], b["path"] = b["path"], a["path"]
    a["chunk_sha256"], b["chunk_sha256"] = b["chunk_sha256"], a["chunk_sha256"]


def test_an_edited_manifest_is_refused_by_its_own_checksum_by_every_reader(env, tmp_path, capsys):
    """The layout manifest carries a checksum of its own content, as a split's cluster.json does: an edit that
    keeps every file matching its listed checksums (two SSD shards swapped) passed `layout verify` and a run then
    trained on other nodes' features. Verify names the manifest (exit 1); train, open_run and layout info refuse
    in one line naming it; layout rm removes it, place --overwrite writes it again."""
    _, ds, layout, _ = env
    copy = shutil.copytree(layout, tmp_path / "L")
    shutil.rmtree(pack_path(copy))
    mf = copy / "manifest.json"
    doc = json.loads(mf.read_text())
    assert doc["sha256"] == manifest_sha256(doc)  # written by write_layout
    _swap_ssd_shards(doc)
    mf.write_text(json.dumps(doc, indent=1))
    says = f"{mf}: the layout manifest was edited or damaged: its checksum does not match its content"
    code, err = _verify(copy, capsys)
    assert code == 1 and err == says, err
    assert main(["layout", "verify", str(copy)]) == 1
    assert f"layout damaged: file {mf}" in " ".join(capsys.readouterr().err.split())
    assert main(["layout", "info", str(copy)]) == 2
    err = capsys.readouterr().err
    assert says in " ".join(err.split()) and "re-run `moment place`" in err and "Traceback" not in err, err
    with pytest.raises(MomentError, match="edited or damaged") as e:
        train(TrainConfig(layout=copy, dataset=ds.path, **FAST))
    assert str(mf) in str(e.value)
    from moment.runtime.run import open_run

    with pytest.raises(MomentError, match="edited or damaged"):
        open_run(copy, dataset=ds.path)
    gone = shutil.copytree(copy, tmp_path / "gone")  # what it owns is still known: it can be removed
    assert main(["layout", "rm", str(gone)]) == 0 and not gone.exists()
    assert main(["place", "--dataset", str(ds.path), "--gpus", "2", "--ssds", "2", "--fanouts", "5", "--batch-size",
                 "64", "--out", str(copy), "--overwrite"]) == 0
    capsys.readouterr()
    assert main(["layout", "verify", str(copy)]) == 0


def test_verify_and_info_say_when_the_layouts_dataset_changed_or_went(tmp_path, capsys):
    """A dataset synthesized again at the layout's path (another seed: every row differs), or moved away: `layout
    verify` said OK and `layout info` named no dataset, while train and data pack refused the pair. The layout is
    still whole (OK, exit 0), and both say so."""
    ds = make_dataset(tmp_path, nodes=800, dim=4, name="d")
    layout = make_layout(ds, tmp_path / "L")
    assert main(["layout", "info", str(layout)]) == 0
    assert f"dataset {ds.path} (id {ds.dataset_id[:12]})" in " ".join(capsys.readouterr().out.split())
    make_dataset(tmp_path, nodes=800, dim=4, name="d", seed=7)
    for said in ("is not the one it was placed from: the layout was placed from another dataset",
                 "the dataset it was placed from is no longer at"):
        if "no longer" in said:
            shutil.rmtree(ds.path)
        assert main(["layout", "verify", str(layout), "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        assert rep["ok"] and len(rep["notes"]) == 1 and said in rep["notes"][0], rep
        assert main(["layout", "info", str(layout)]) == 0
        assert "note: " in capsys.readouterr().out


def test_a_manifest_written_before_its_checksum_is_read_and_verify_says_so(env, tmp_path, capsys):
    """A layout of an earlier Moment (its manifest has no `sha256`) still verifies and trains; verify notes that
    an edit to its manifest cannot be detected."""
    _, ds, layout, _ = env
    old = shutil.copytree(layout, tmp_path / "L")
    doc = json.loads((old / "manifest.json").read_text())
    del doc["sha256"]
    (old / "manifest.json").write_text(json.dumps(doc, indent=1))
    assert main(["layout", "verify", str(old), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and len(rep["notes"]) == 1 and "has no checksum of its own" in rep["notes"][0], rep
    assert main(["layout", "verify", str(old)]) == 0
    out, err = capsys.readouterr()
    assert "layout OK" in out and "note: " in err and "place the layout again" in " ".join(err.split()), err
    assert main(["layout", "verify", str(layout), "--json"]) == 0 and json.loads(capsys.readouterr().out)["notes"] == []
    train(TrainConfig(layout=old, dataset=ds.path, **FAST))


# ---- the dataset's graph arrays ------------------------------------------------------------------------


@pytest.mark.parametrize("name, at, value, says", [
    ("indices", slice(0, None, 7), NODES + 99, f"neighbour id {NODES + 99} out of range"),
    ("indptr", 100, 1, "indptr is not monotone"),
    ("labels", slice(0, None, 5), 300, "label 300 out of range"),
    ("train_idx", 3, NODES * 3, f"node id {NODES * 3} out of range"),
], ids=["indices", "indptr", "labels", "train_idx"])
def test_edited_graph_arrays_are_refused_before_any_sampling(env, tmp_path, capsys, name, at, value, says):
    _, ds, layout, _ = env
    bad = _edit_dataset(ds.path, tmp_path / "ds", name, at, value)
    for args in (["data", "info", str(bad), "--verify"], ["cache", "simulate", "--dataset", str(bad),
                                                          "--capacity", "10%", "--fanouts", "5"]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert says in err and str(bad / f"{name}.npy") in err, err
    with pytest.raises(MomentError, match=says):  # a run that reads features from the dataset itself
        train(TrainConfig(dataset=bad, features="memory", **FAST))
    with pytest.raises(MomentError, match=says):  # a layout's run: refused before the dataset pairing
        train(TrainConfig(layout=layout, dataset=bad, **FAST))


def test_place_refuses_an_edited_graph_with_and_without_verify(env, tmp_path, capsys):
    _, ds, _, _ = env
    bad = _edit_dataset(ds.path, tmp_path / "ds", "indices", slice(0, None, 7), NODES + 99)
    base = ["place", "--dataset", str(bad), "--gpus", "2", "--ssds", "2", "--fanouts", "5", "--batch-size", "64"]
    for extra in ([], ["--no-verify"]):
        assert main([*base, "--out", str(tmp_path / f"L{len(extra)}"), *extra]) == 2
        assert f"{bad / 'indices.npy'}: neighbour id {NODES + 99} out of range" in capsys.readouterr().err
        assert not (tmp_path / f"L{len(extra)}").exists()


# ---- a changed copy whose manifest was kept ----------------------------------------------------------


@pytest.mark.parametrize("name", ["features", "indices"])
def test_a_changed_copy_with_the_original_manifest_is_refused(env, tmp_path, capsys, name):
    """The copy's manifest (so its dataset id) is the original's: the layout accepts it as its dataset;
    the sampled block checksums find the changed file at the start of a run and of a pack."""
    _, ds, layout, _ = env
    at = slice(None) if name == "features" else slice(0, None, 11)
    value = 0.5 if name == "features" else 1  # in range: no structural check can see it
    bad = _edit_dataset(ds.path, tmp_path / "ds", name, at, value, keep_manifest=True)
    assert GraphDataset.open(bad).dataset_id == ds.dataset_id
    says = "do not match the manifest's block checksum"
    with pytest.raises(MomentError, match=says) as e:
        train(TrainConfig(layout=layout, dataset=bad, **FAST))
    assert str(bad / f"{name}.npy") in str(e.value)
    copy = shutil.copytree(layout, tmp_path / "L")
    assert main(["data", "pack", "--layout", str(copy), "--dataset", str(bad), "--cached", "5%",
                 "--fanouts", "5", "--overwrite"]) == 2
    assert says in capsys.readouterr().err
    assert main(["data", "info", str(bad), "--verify"]) == 2  # the full check reads every byte
    assert "sha256 mismatch" in capsys.readouterr().err


def test_a_dataset_without_block_checksums_is_checked_by_size_and_says_so(env, tmp_path):
    """Datasets written before the block checksums: the run still starts, with a note naming the files
    it could only compare by size; the full check still reads every byte."""
    _, ds, _, _ = env
    old = shutil.copytree(ds.path, tmp_path / "ds")
    doc = json.loads((old / "manifest.json").read_text())
    for rec in doc["files"].values():
        del rec["block_sha256"], rec["block_bytes"]
    (old / "manifest.json").write_text(json.dumps(doc))
    notes = GraphDataset.open(old).check()
    assert len(notes) == 1 and "no block checksums" in notes[0] and "features.npy" in notes[0]
    GraphDataset.open(old, verify=True)


def test_block_checksums_that_disagree_with_the_file_are_found_by_the_full_check(env, tmp_path):
    _, ds, _, _ = env
    d = shutil.copytree(ds.path, tmp_path / "ds")
    doc = json.loads((d / "manifest.json").read_text())
    doc["files"]["labels"]["block_sha256"][0] = "0" * 63 + "1"
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(MomentError, match="block checksums do not match the file") as e:
        GraphDataset.open(d, verify=True)
    assert "labels.npy" in str(e.value)
