"""DiskGNN-style packing: each batch's uncached rows contiguous on disk, read bit-exactly by the store."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from runtime_data import make_dataset, make_layout

import moment
from moment.cli import main
from moment.errors import MomentError
from moment.placement import verify_layout
from moment.placement.opened import Layout
from moment.placement import pack as pack_mod
from moment.placement.pack import (SPLIT_CODES, Segments, cached_set_bytes, load_pack, pack_bytes_bound, pack_path,
                                   write_pack)
from moment.placement.requests import cached_rows
from moment.runtime.disk_tier import DiskTier
from moment.runtime.store import RankPlace, StoreOptions, open_tiers
from moment.workload.seeds import SPLIT_TAGS, sampling_key
from moment.workload import trace as trace_mod
from moment.workload.trace import sample_eval_trace, sample_trace

FAN, BS, SEED = (10, 5), 96, 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    ds = make_dataset(root)
    layout = make_layout(ds, root / "L")
    cached = ds.num_nodes // 10
    man = write_pack(layout, ds, world_size=2, batch_size=BS, fanouts=FAN, seed=SEED, epochs=2, cached_rows=cached)
    return ds, layout, man, np.load(ds.file("features"))


#: the pack the killed writers below write: (world_size, batch_size, fanouts, seed, epochs)
KILLED = (1, 64, (5,), 0, 1)


@pytest.fixture(scope="module")
def sampled(packed, tmp_path_factory):
    """The killed writers' batches, sampled once here: a child given them (`_GIVEN`) imports no torch and samples
    nothing (that was most of each child's ~1.3 CPU-s), and what is tested is how it puts the pack in place."""
    import pickle

    ds, ranks, bs, fan, seed, epochs = packed[0], *KILLED
    args = dict(seed=seed, epochs=epochs, rank=0, world_size=ranks)
    f = tmp_path_factory.mktemp("sampled") / "traces.pickle"
    f.write_bytes(pickle.dumps({"train": sample_trace(ds, fan, bs, **args),
                                "val": sample_eval_trace(ds, fan, bs, split="val", **args)}))
    return f


#: child code: `moment.workload.trace`'s samplers return the `sampled` fixture's traces (for its arguments only)
_GIVEN = ("import pickle\nimport moment.workload.trace as t\n_tr = pickle.loads(open({path!r}, 'rb').read())\n"
          "def _given(dataset, fanouts, batch_size, *, split='train', seed, epochs, rank, world_size, progress=None):\n"
          "    assert (world_size, batch_size, tuple(int(f) for f in fanouts), seed, epochs, rank) == "
          f"{(*KILLED, 0)!r}\n"
          "    return _tr[split]\nt.sample_trace = t.sample_eval_trace = _given\n")


def _trace(ds, rank, epochs=2):
    return sample_trace(ds, FAN, BS, seed=SEED, epochs=epochs, rank=rank, world_size=2)


def _read_ahead(store, tr, epochs, rank, feats):
    """Submit the training batches of `tr` (`epochs` of them, rank `rank`) tagged as a run tags them, completing
    each, bit-exact, once `store.lookahead` more are submitted; returns those still pending."""
    per, pend = len(tr) // epochs, []
    for t in range(len(tr)):
        b = tr.batch(t)
        pend.append((b, store.submit(torch.from_numpy(b), tag=((SEED, t // per, rank), t % per))))
        if len(pend) > store.lookahead:
            b0, p0 = pend.pop(0)
            assert torch.equal(store.complete(p0), torch.from_numpy(feats[b0]))
    return pend


def _eval_trace(ds, rank, epochs=2):
    return sample_eval_trace(ds, FAN, BS, seed=SEED, epochs=epochs, rank=rank, world_size=2)


def test_segments_hold_each_batch_uncached_rows_in_order(packed):
    """Every training batch's segment, then every validation batch's (the batches a run evaluates after each
    epoch), each holding its batch's rows outside the cached ones, in the batch's order, at an aligned offset."""
    ds, layout, man, feats = packed
    hot = np.load(layout / "order.npy")[: man.cached_rows]
    assert man.epochs == 2 and man.world_size == 2 and len(man.files) == 2 and man.eval_splits == ["val"]
    assert man.segment_order == "batch"
    for r in range(2):
        tr, ev = _trace(ds, r), _eval_trace(ds, r)
        k = ev.meta["per_epoch"]
        assert k >= 2 and len(ev) == 2 * k
        seg = Segments.load(pack_path(layout) / man.files[r].index)
        raw = np.fromfile(pack_path(layout) / man.files[r].data, np.uint8)
        assert raw.size == man.files[r].bytes and raw.size % man.align == 0
        assert len(seg.epoch) == len(tr) + len(ev)
        batches = [("train", t // (len(tr) // 2), t % (len(tr) // 2), tr.batch(t)) for t in range(len(tr))]
        batches += [("val", t // k, t % k, ev.batch(t)) for t in range(len(ev))]
        for t, (split, e, i, ids) in enumerate(batches):
            assert seg.find(e, i, split) == t and seg.split[t] == SPLIT_CODES[split]
            want = ids[~np.isin(ids, hot)]
            assert np.unique(want).size == want.size  # a sampled batch's ids are distinct
            got = seg.ids[seg.id_start[t]: seg.id_start[t + 1]]
            assert np.array_equal(got, want)
            assert seg.offset[t] % man.align == 0
            rows = raw[seg.offset[t]: seg.offset[t] + got.size * ds.row_bytes].reshape(got.size, ds.row_bytes)
            assert np.array_equal(rows, feats[got].view(np.uint8).reshape(got.size, -1))
        assert seg.find(2, 0, "val") is None and seg.find(0, k, "val") is None
    assert man.bytes > 0 and man.feature_bytes == ds.num_nodes * ds.row_bytes


@pytest.mark.parametrize("cpu_rows", ["same", "larger", "smaller"])
def test_store_reads_tagged_batches_from_the_pack_bit_exactly(packed, cpu_rows):
    ds, layout, man, feats = packed
    rows = {"same": man.cached_rows, "larger": man.cached_rows + 40, "smaller": man.cached_rows // 2}[cpu_rows]
    store = open_tiers(layout, RankPlace(rank=1, local_rank=1, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=rows, gpu_rows=0, shape="packed", superbatch=3,
                                    buffer_bytes=256 << 10, pack_seed=SEED))
    tr = _trace(ds, 1, epochs=3)  # the third epoch was not packed: read from the layout
    per = len(tr) // 3
    pend = _read_ahead(store, tr, 3, 1, feats)
    untagged = np.arange(0, ds.num_nodes, 7)  # an evaluation batch: not packed
    pend.append((untagged, store.submit(untagged)))
    for b0, p0 in pend:
        assert torch.equal(store.complete(p0), torch.from_numpy(feats[b0]))
    st = store.tier_stats()
    assert st["packed_rows"] > 0 and store.memory()["pack_index"] > 0
    # packed epochs: every miss comes from the pack when the cache is what the pack assumed
    packed_misses = sum(np.setdiff1d(np.unique(tr.batch(t)), np.load(layout / "order.npy")[:rows]).size
                        for t in range(2 * per))
    # every packed batch reads its segment whole, as written: all its misses when the cache holds at least what the
    # pack assumed; with a smaller one, the misses no segment holds (the pack took them as cached) from the layout
    assert store.find(DiskTier).segment_batches == 2 * per
    # the rows the pack took as cached that this smaller cache does not hold are counted as read apart from the
    # segments, and the run knows the --cached that fits it: a static cache without GPU rows holds the hottest `rows`
    hot = np.load(layout / "order.npy")
    gap = hot[rows: man.cached_rows]
    assert st["pack_left_out_rows"] == sum(int(np.isin(tr.batch(t), gap).sum()) for t in range(2 * per))
    assert store.find(DiskTier).pack_fit == rows and st["pack_fit"] == rows
    if cpu_rows == "smaller":
        seg = Segments.load(pack_path(layout) / man.files[1].index)
        assert st["packed_rows"] == sum(seg.rows_in(seg.find(t // per, t % per)) for t in range(2 * per))
        assert st["packed_rows"] < packed_misses and st["pack_left_out_rows"] > 0
    else:
        assert st["packed_rows"] == packed_misses and st["pack_left_out_rows"] == 0
    store.close()


def test_a_run_whose_caches_hold_less_than_the_pack_assumed_is_told_the_pack_that_fits_it(packed, tmp_path):
    """The rows a pack leaves out for larger caches than a run's are read one by one beside the segments (on the
    bench's 8M layout: 284,654 SSD reads against 2,358): when they are most of a run's reads, its note gives the
    `moment data pack` for its caches, and a pack written with it leaves out no row those caches miss."""
    import shlex
    import shutil

    from moment.runtime.train import left_out_note

    ds, layout, man, feats = packed
    rows = man.cached_rows // 2
    m = {"per_rank": [{"pack_fit": rows}, {"pack_fit": rows + 5}], "pack_left_out_rows": 600, "ssd_requests": 1000}
    (note,) = left_out_note(man, layout, ds.path, m)
    assert f"caches of the {man.cached_rows:,} hottest rows" in note and f"hold the hottest {rows:,}" in note
    assert left_out_note(man, layout, ds.path, {**m, "pack_left_out_rows": 500}) == []  # not most of the reads
    assert left_out_note(man, layout, ds.path, {**m, "per_rank": [{"pack_fit": None}]}) == []  # not known
    words = shlex.split(note.split("A pack for this run's caches: ", 1)[1])
    assert words[:3] == ["moment", "data", "pack"] and words[words.index("--cached") + 1] == str(rows)
    fitted = shutil.copytree(layout, tmp_path / "L")
    words[words.index("--layout") + 1] = str(fitted)
    assert main([*words[1:], "--json"]) == 0
    store = open_tiers(fitted, RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=rows, gpu_rows=0, shape="packed", superbatch=3, buffer_bytes=256 << 10,
                                    pack_seed=SEED))
    tr = _trace(ds, 0)
    for t in range(len(tr)):
        b = tr.batch(t)
        got = store.complete(store.submit(torch.from_numpy(b), tag=((SEED, t // (len(tr) // 2), 0), t % (len(tr) // 2))))
        assert torch.equal(got, torch.from_numpy(feats[b]))
    st = store.tier_stats()
    assert st["pack_left_out_rows"] == 0 and st["segment_batches"] == len(tr) and st["pack_fit"] == rows
    store.close()


@pytest.mark.parametrize("shape", ["packed", "block"])
def test_a_packed_batch_is_read_at_once_when_the_reader_is_idle_and_with_its_superbatch_when_busy(packed, shape,
                                                                                                  monkeypatch):
    """A packed batch is its own segment: held for its superbatch while the reader has nothing in flight, it left
    the disk idle. So it goes out at once then, and with the next batches of its superbatch while the reader is
    busy (each batch its own job still: its buffer goes back once that batch is completed); a block read, and a
    batch no segment holds, keep their hyperbatch (merging its batches' rows is its point). The rows are exact
    either way."""
    from moment.runtime.gather import Reader

    ds, layout, man, feats = packed
    store = open_tiers(layout, RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=man.cached_rows, gpu_rows=0, shape=shape, superbatch=4,
                                    buffer_bytes=64 << 20, pack_seed=SEED))
    reader = store.find(DiskTier).reader
    issued, submit, busy = [], reader.submit, [False]
    monkeypatch.setattr(reader, "submit", lambda job: issued.append(job) or submit(job))
    monkeypatch.setattr(Reader, "busy", property(lambda self: busy[0]))
    tr = _trace(ds, 0)
    assert len(tr) // 2 >= 5
    pend = [store.submit(torch.from_numpy(tr.batch(0)), tag=((SEED, 0, 0), 0))]
    assert len(issued) == (1 if shape == "packed" else 0)  # the reader was idle
    busy[0] = True
    for t in range(1, 5):
        pend.append(store.submit(torch.from_numpy(tr.batch(t)), tag=((SEED, 0, 0), t)))
        # packed: batch 0 alone, then 1-4 when their superbatch closes, a job each; block: 0-3 in one job
        assert len(issued) == ((1 + 4 * (t == 4)) if shape == "packed" else int(t == 3 or t == 4))
    busy[0] = False
    pool, released, given = store.find(DiskTier).pool, [], []
    release = pool.release
    monkeypatch.setattr(pool, "release", lambda dest: given.append(1) or release(dest))
    for t, p in enumerate(pend):
        assert torch.equal(store.complete(p), torch.from_numpy(feats[tr.batch(t)]))
        released.append(len(given))
    if shape == "packed":  # each completed batch gave its buffer back at once, not with the superbatch's last
        assert released == [1, 2, 3, 4, 5], released
    n = len(issued)
    untagged = store.submit(torch.from_numpy(tr.batch(5)))  # no segment holds it: it waits for its superbatch
    assert len(issued) == n
    assert torch.equal(store.complete(untagged), torch.from_numpy(feats[tr.batch(5)]))
    store.close()


@pytest.mark.parametrize("disk", ["this VM's", "requests free"])
def test_a_cache_far_larger_than_the_pack_assumed_reads_a_segment_whole_where_that_costs_the_disk_no_more(
        packed, disk):
    """A run whose CPU cache holds five times the rows the pack took as cached (a --data-only run's, with no model
    step to fit) asks about two fifths of each segment: on this VM's disk model the general path's reads of those
    rows (gaps merged) cost about what one read of the whole segment costs, so each batch reads its segment whole
    and skips the general path's sort, search and merge. On a disk whose requests cost nothing, a cache of all but
    the coldest 2.5% of the rows leaves each segment a few rows to read, in fewer bytes than the segment: the
    general path. Every row bit-exact either way."""
    import dataclasses

    ds, layout, man, feats = packed
    rows = 5 * man.cached_rows if disk == "this VM's" else ds.num_nodes - ds.num_nodes // 40
    store = open_tiers(layout, RankPlace(rank=1, local_rank=1, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=rows, gpu_rows=0, shape="packed", superbatch=3,
                                    buffer_bytes=256 << 10, pack_seed=SEED))
    disk_tier = store.find(DiskTier)
    if disk == "requests free":
        disk_tier.shape = dataclasses.replace(disk_tier.shape, iops=float("inf"))
    tr = _trace(ds, 1)
    per = len(tr) // 2
    for t in range(len(tr)):
        b = tr.batch(t)
        assert torch.equal(store.complete(store.submit(torch.from_numpy(b), tag=((SEED, t // per, 1), t % per))),
                           torch.from_numpy(feats[b]))
    st = store.tier_stats()
    seg = Segments.load(pack_path(layout) / man.files[1].index)
    whole = sum(seg.rows_in(seg.find(t // per, t % per)) for t in range(len(tr))) * ds.row_bytes
    asked = st["rows"]["ssd"] * ds.row_bytes
    assert asked < 0.5 * whole  # the cache holds most of each segment's rows: the first rule (1/4 more) refuses
    if disk == "requests free":
        assert disk_tier.segment_batches == 0 and st["ssd_bytes_read"] < whole
    else:
        assert disk_tier.segment_batches == len(tr) and st["ssd_bytes_read"] >= whole
    store.close()


def test_a_run_reads_its_validation_batches_from_the_pack(packed):
    """A validation batch tagged as the run's loader tags it reads its uncached rows from its segment (one
    read, not one per row), bit-exact; an epoch the pack does not hold, and the test split, from the layout."""
    ds, layout, man, feats = packed
    hot = np.load(layout / "order.npy")[: man.cached_rows]
    store = open_tiers(layout, RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=man.cached_rows, gpu_rows=0, shape="packed", superbatch=1,
                                    buffer_bytes=256 << 10, pack_seed=SEED))
    try:
        ev = _eval_trace(ds, 0, epochs=3)  # the third epoch's were not packed
        k = ev.meta["per_epoch"]
        for t in range(len(ev)):
            b, before = ev.batch(t), store.tier_stats()["packed_rows"]
            got = store.complete(store.submit(torch.from_numpy(b), tag=((SEED, t // k, 0, SPLIT_TAGS["val"]), t % k)))
            assert torch.equal(got, torch.from_numpy(feats[b]))
            misses = np.setdiff1d(np.unique(b), hot).size
            assert store.tier_stats()["packed_rows"] - before == (misses if t < 2 * k else 0)
        before = store.tier_stats()["packed_rows"]
        b = ev.batch(0)
        got = store.complete(store.submit(torch.from_numpy(b), tag=((SEED, 0, 0, SPLIT_TAGS["test"]), 0)))
        assert torch.equal(got, torch.from_numpy(feats[b])) and store.tier_stats()["packed_rows"] == before
    finally:
        store.close()


PAST = "past the layout's pack"


def test_a_loop_of_its_own_is_told_once_when_it_reads_past_the_pack(packed, tmp_path, capsys):
    """A script's loop (`moment.open_run`) decides its epochs: the first train loader of an epoch its pack does not
    hold says so on stderr, once, with the `moment data pack` that packs it; a run that gave its epochs is told at
    its start (`run.notes`, as `moment train` is), and its loaders say nothing more."""
    ds, layout, man, _ = packed
    copy = tmp_path / "L"
    shutil.copytree(layout, copy)
    one = write_pack(copy, ds, world_size=1, batch_size=BS, fanouts=FAN, seed=SEED, epochs=1,
                     cached_rows=man.cached_rows, overwrite=True)
    opts = dict(fanouts=list(FAN), batch_size=BS, seed=SEED, memory_budget="2GiB", data_only=True)
    with moment.open_run(copy, **opts) as run:
        assert run.plan.io_shape == "packed" and not any("read from the layout" in n for n in run.notes)
        capsys.readouterr()
        assert sum(1 for _ in run.loader("train", 0)) > 0
        assert PAST not in capsys.readouterr().err
        for epoch in (1, 2):
            assert sum(1 for _ in run.loader("train", epoch)) > 0
        err = " ".join(capsys.readouterr().err.split())  # unwrapped
        assert err.count(PAST) == 1 and "epoch 1 (run.loader counts from 0)" in err and "epochs 0..0" in err
        assert err.endswith(f"give their number to: {one.command(copy, epochs=2)}")
    with moment.open_run(copy, epochs=3, **opts) as run:
        assert f"note: epochs 2..3 read from the layout (the pack holds 1); to pack them all: " \
               f"{one.command(copy, epochs=3)}" in run.notes
        capsys.readouterr()
        for epoch in range(3):
            assert sum(1 for _ in run.loader("train", epoch)) > 0
        assert PAST not in capsys.readouterr().err


def test_pack_read_amplification_is_low(packed):
    ds, layout, man, feats = packed
    store = open_tiers(layout, RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=man.cached_rows, gpu_rows=0, shape="packed", superbatch=1,
                                    buffer_bytes=256 << 10, pack_seed=SEED))
    tr = _trace(ds, 0, epochs=1)
    for t in range(len(tr)):
        x = store.complete(store.submit(tr.batch(t), tag=((SEED, 0, 0), t)))
        assert torch.equal(x, torch.from_numpy(feats[tr.batch(t)]))
    st = store.tier_stats()
    assert st["packed_rows"] * ds.row_bytes <= st["ssd_bytes_read"] <= st["packed_rows"] * ds.row_bytes + \
        len(tr) * 2 * man.align  # one aligned run per segment: no more than its padding
    store.close()


def test_pack_mismatches_are_refused(packed, tmp_path):
    ds, layout, man, _ = packed
    with pytest.raises(MomentError, match="made for 2 ranks"):
        open_tiers(layout, RankPlace(world_size=3), StoreOptions(shape="packed", pack_seed=SEED))
    assert man.mismatch(world_size=2, batch_size=BS, fanouts=FAN, seed=SEED) is None
    assert "batch size 64 (pack: 96)" in man.mismatch(world_size=2, batch_size=64, fanouts=FAN, seed=SEED)
    with pytest.raises(MomentError, match="already has a pack"):
        write_pack(layout, ds, world_size=1, batch_size=BS, fanouts=FAN, seed=SEED, epochs=1, cached_rows=0)
    other = make_layout(ds, tmp_path / "L2")
    with pytest.raises(MomentError, match="needs a pack"):
        open_tiers(other, options=StoreOptions(shape="packed"))


def test_damaged_pack_is_caught_with_verify(packed, tmp_path):
    import shutil

    ds, layout, man, _ = packed
    copy = tmp_path / "L"
    shutil.copytree(layout, copy)
    data = pack_path(copy) / man.files[0].data
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(MomentError, match="checksum"):
        open_tiers(copy, RankPlace(world_size=2), StoreOptions(shape="packed", verify=True, pack_seed=SEED))


@pytest.mark.slow
def test_a_folder_at_the_packs_place_that_is_not_a_pack_is_never_replaced(packed, tmp_path, capsys):
    """LAYOUT/pack holding a person's files but no pack.json was taken for no pack and swapped out, its files
    deleted, without --overwrite: refused with or without it; an empty one is replaced."""
    import shutil

    _, layout, _, _ = packed
    copy = tmp_path / "L"
    shutil.copytree(layout, copy)
    shutil.rmtree(copy / "pack")
    (copy / "pack").mkdir()
    (copy / "pack" / "notes.txt").write_text("mine\n")
    args = ["data", "pack", "--layout", str(copy), "--ranks", "1", "--fanouts", "10,5", "--batch-size", "128"]
    for extra in ([], ["--overwrite"]):
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert err.strip().startswith(f"error: {copy / 'pack'}: exists and is not a pack (it has no pack.json): refusing to "
                              "replace it") and "Traceback" not in err
        assert sorted(p.name for p in (copy / "pack").iterdir()) == ["notes.txt"]
    (copy / "pack" / "notes.txt").unlink()
    assert main(args) == 0 and load_pack(copy).batch_size == 128


def test_cli_pack_json_and_overwrite(packed, tmp_path, capsys, monkeypatch):
    """--json, --overwrite and the refusals; under --memory-budget a fresh rank's and agent's sizes are stated (as
    measured on a CPU-only torch: 2 MiB each alone, 330 MiB shared), not measured in a fresh interpreter importing
    torch (2.2 CPU-s, moment.runtime.start_sizes, tested in test_run_plan): what this tests is the pack's budget."""
    import shutil

    from moment.runtime import start_sizes as ss

    monkeypatch.setattr(ss, "_start", lambda model=None: model)
    monkeypatch.setattr(ss, "_collect", lambda model: (2 << 20, 2 << 20, 330 << 20))
    monkeypatch.setattr(ss, "_write_record", lambda *a, **k: None)
    monkeypatch.setattr(ss, "_ahead", {})
    monkeypatch.setattr(ss, "_measured", {})

    ds, layout, man, _ = packed
    copy = tmp_path / "L"
    shutil.copytree(layout, copy)
    args = ["data", "pack", "--layout", str(copy), "--ranks", "1", "--fanouts", "10,5", "--batch-size", "128",
            "--cached", "5%", "--json"]
    assert main(args) == 2
    assert "already has a pack" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranks"] == 1 and doc["cached_rows"] == ds.num_nodes // 20 and doc["disk_overhead"] > 0
    assert load_pack(copy).batch_size == 128 and not list(copy.glob(".pack*"))
    assert main(["data", "pack", "--layout", str(copy), "--cached", "200%", "--overwrite"]) == 2
    assert "--cached" in capsys.readouterr().err
    gpus = len(Layout.open(copy).gpu_devices())  # more ranks than the run may have: refused before it is written
    assert main(["data", "pack", "--layout", str(copy), "--ranks", str(gpus + 1), "--overwrite"]) == 2
    assert f"--ranks {gpus + 1}: {gpus + 1} ranks on this machine, but the layout was placed for {gpus} GPU(s)" in \
        " ".join(capsys.readouterr().err.split())
    # --memory-budget: leave out what the run's CPU cache will hold under that budget
    assert main(["data", "pack", "--layout", str(copy), "--ranks", "2", "--fanouts", "10,5", "--memory-budget",
                 "3GiB", "--overwrite", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cached_rows"] == ds.num_nodes  # everything fits in 3 GiB
    assert main(["data", "pack", "--layout", str(copy), "--memory-budget", "1MiB", "--overwrite"]) == 2
    assert "budget" in capsys.readouterr().err
    # for people: the options of the run that reads it, its epochs among them, and what the later ones cost
    assert main(["data", "pack", "--layout", str(copy), "--ranks", "1", "--fanouts", "10,5", "--batch-size", "128",
                 "--epochs", "2", "--overwrite"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("train with: --io-shape packed --epochs 2 --batch-size 128 --fanouts 10,5 --seed 0 (torchrun "
            "--nproc-per-node 1); epochs past 2 are read from the layout, many times slower") in out


def test_layout_rm_removes_the_pack_with_the_layout(packed, tmp_path):
    import shutil

    _, layout, _, _ = packed
    copy = shutil.copytree(layout, tmp_path / "L")
    assert main(["layout", "rm", str(copy)]) == 0
    assert not copy.exists()


@pytest.mark.slow
def test_killed_pack_writer_leaves_the_old_pack_and_is_cleaned_up(packed, sampled, tmp_path):
    import os
    import shutil
    import subprocess
    import sys

    ds, layout, man, _ = packed
    copy = shutil.copytree(layout, tmp_path / "L")
    code = ("import os, signal, sys\n" + _GIVEN.format(path=str(sampled)) +
            "import moment.placement.pack as p\n"
            "real = p._write_rank\n"
            "def die(*a, **k):\n"
            "    real(*a, **k)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "p._write_rank = die\n"
            "from moment.workload.graph import GraphDataset\n"
            f"p.write_pack({str(copy)!r}, GraphDataset.open({str(ds.path)!r}), world_size=1, batch_size=64, "
            "fanouts=(5,), seed=0, epochs=1, cached_rows=0, overwrite=True)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ}, capture_output=True, timeout=120, check=False)
    assert r.returncode == -9, r.stderr[-2000:]
    assert load_pack(copy) == man  # the old pack is whole
    assert list(copy.glob(".pack.tmp-*"))
    twin = shutil.copytree(copy, tmp_path / "twin")  # the debris is Moment's: `layout rm` takes it too (it refused)
    from moment.cli import main

    assert main(["layout", "rm", str(twin)]) == 0 and not twin.exists()
    write_pack(copy, ds, world_size=1, batch_size=64, fanouts=(5,), seed=0, epochs=1, cached_rows=0, overwrite=True)
    assert not list(copy.glob(".pack.*")) and load_pack(copy).world_size == 1


@pytest.mark.parametrize("point,exchange,new", [
    ("pack-written", True, False), ("pack-swapped", True, True),
    ("pack-old-moved", False, False), ("pack-swapped", False, True)])
@pytest.mark.slow
def test_killed_at_each_commit_step_the_old_or_the_new_pack_is_whole(packed, sampled, tmp_path, point, exchange,
                                                                     new):
    """kill -9 while the new pack goes in place (an atomic swap, or two renames where the file system has
    none): after the next writer's recovery the layout has the old pack or the new one, whole. The writer is
    given its batches (`sampled`)."""
    import os
    import shutil
    import subprocess
    import sys

    from moment import testpoints
    from moment.outputs import remove_stale

    ds, layout, man, _ = packed
    copy = shutil.copytree(layout, tmp_path / "L")
    code = (_GIVEN.format(path=str(sampled)) + "import moment.outputs as o\n"
            + ("" if exchange else "o.exchange = lambda a, b: False\n")
            + "import moment.placement.pack as p\nfrom moment.workload.graph import GraphDataset\n"
            f"p.write_pack({str(copy)!r}, GraphDataset.open({str(ds.path)!r}), world_size=1, batch_size=64, "
            "fanouts=(5,), seed=0, epochs=1, cached_rows=0, overwrite=True)\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, testpoints.CRASH_ENV: point},
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == -9, r.stderr[-2000:]
    at_path = (copy / "pack").exists()
    assert at_path == (point != "pack-old-moved")  # two renames: the moment between them has no pack there
    assert len(list(copy.glob(".pack.*"))) + at_path == 2  # the other version: temporary or set aside
    remove_stale(copy / "pack", set_aside=True)  # what the next writer does first, holding the lock
    assert not list(copy.glob(".pack.*"))
    got = load_pack(copy)
    assert (got.world_size == 1) if new else (got == man)
    assert verify_layout(copy).ok


def test_solve_cached_rows_climbs_to_the_fixed_point_and_keeps_the_smaller_on_oscillation():
    from moment.placement.pack import solve_cached_rows

    # the cache shrinks a row per 10 index bytes; the index shrinks 4 bytes per cached row
    c = solve_cached_rows(lambda idx: 1000 - idx // 10, lambda c: 4000 - 4 * c, 5000)
    assert c == 1000 - (4000 - 4 * c) // 10 == 1000
    steps = {0: 7, 7: 3, 3: 7}  # not monotone: 3 <-> 7; the pack at 3 leaves out no more than the run caches
    assert solve_cached_rows(lambda i: steps[i], lambda c: c, 10) == 3


def test_pack_under_a_budget_leaves_out_exactly_what_the_run_will_cache(packed, tmp_path, capsys):
    """The pack's cached rows are the run's CPU cache rows with this pack's own index charged."""
    import shutil

    from moment.runtime.config import TrainConfig
    from moment.runtime.sizing import preview_plan

    ds, layout, _, _ = packed
    copy = shutil.copytree(layout, tmp_path / "L")

    def split(shape: str, budget: int, **kw):
        cfg = TrainConfig(layout=copy, dataset=ds.path, memory_budget=str(budget), fanouts=list(FAN),
                          batch_size=BS, seed=SEED, io_shape=shape)
        return preview_plan(cfg, ds, 2, **kw)

    def rows_without_index(budget: int) -> int:
        try:
            return split("block", budget, pack_index_bytes=0).memory.cpu_rows
        except MomentError:  # below the minimum
            return -1

    # the smallest budget whose CPU cache gets half the rows when no pack index is charged
    n = ds.num_nodes
    lo, hi = 0, 8 << 30
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rows_without_index(mid) < n // 2 else (lo, mid)
    budget = hi
    old = rows_without_index(budget)  # what the pack used to leave out
    assert n // 2 <= old < n
    assert main(["data", "pack", "--layout", str(copy), "--ranks", "2", "--fanouts", "10,5", "--batch-size",
                 str(BS), "--seed", str(SEED), "--memory-budget", str(budget), "--overwrite", "--json"]) == 0
    man = load_pack(copy)
    assert json.loads(capsys.readouterr().out)["cached_rows"] == man.cached_rows
    run = split("packed", budget)  # the run reads this pack: its index is charged
    index = {it.name: it.bytes for it in run.memory.items}["pack index"]
    assert index == max(Segments.load(pack_path(copy) / f.index).memory_bytes for f in man.files) + \
        cached_set_bytes(ds.num_nodes)
    assert man.cached_rows == run.memory.cpu_rows < old
    # sized as the packed run that reads it (a packed run on CPU claims the heap's reuse before its cache; sized as
    # a block run, whose cache comes first, the pack left out rows that run does not cache)
    assert split("block", budget, pack_index_bytes=0).io_shape == "packed"
    seg = Segments.load(pack_path(copy) / man.files[0].index)
    hot = np.load(copy / "order.npy")[: man.cached_rows]
    assert not np.isin(seg.ids, hot).any() and seg.ids.size > 0


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_pack_index_is_one_clear_error(packed, tmp_path, damage):
    """A flipped byte (zip CRC) or a cut file: `pack index unreadable`, from the loader and from the
    budget's size check alike, never a zipfile traceback."""
    import shutil

    from moment.placement.pack import pack_index_bytes

    copy = shutil.copytree(packed[1], tmp_path / "L")
    index = pack_path(copy) / load_pack(copy).files[0].index
    raw = bytearray(index.read_bytes())
    index.write_bytes(raw[:50] if damage == "truncate" else raw[:100] + bytes(b ^ 0xFF for b in raw[100:107])
                      + raw[107:])
    with pytest.raises(MomentError, match="pack index unreadable"):
        Segments.load(index)
    with pytest.raises(MomentError, match="pack index unreadable"):
        pack_index_bytes(copy, load_pack(copy))


def test_a_segment_finds_the_rows_it_holds_among_a_jobs_sorted_rows():
    """Segments.held: the positions in a job's sorted, distinct rows of the rows one segment holds, at the
    segment's offsets (row k of the segment at offset + k * row_bytes), its ids sorted (older packs) or in
    their batch's order; an empty segment holds none."""
    rng = np.random.default_rng(5)
    a, b = np.sort(rng.choice(1000, 40, replace=False)), rng.choice(1000, 30, replace=False)
    seg = Segments(np.array([0, 0, 0]), np.array([0, 1, 2]), np.array([0, 40 * 64, 70 * 64]),
                   np.array([0, 40, 70, 70]), np.concatenate([a, b]))
    job = np.unique(np.concatenate([a[::2], b, rng.choice(1000, 50)]))
    for s, have in ((0, a), (1, b), (2, a[:0])):
        where, at = seg.held(s, job, 64)
        assert np.array_equal(np.sort(where), np.flatnonzero(np.isin(job, have)))
        assert np.array_equal(job[where], have[(at - int(seg.offset[s])) // 64])
    assert seg.held(0, job[:0], 64)[0].shape == (0,)


def _as_sorted_pack(layout, dest, row_bytes):
    """A copy of the layout whose pack is as packs were written before `segment_order`: each segment's ids
    and rows sorted by node id, and no `segment_order` in its manifest."""
    import hashlib
    import shutil

    copy = shutil.copytree(layout, dest)
    d = pack_path(copy)
    doc = json.loads((d / "pack.json").read_text())
    del doc["segment_order"]
    for f in doc["files"]:
        seg = Segments.load(d / f["index"])
        raw = np.fromfile(d / f["data"], np.uint8)
        ids = seg.ids.copy()
        for t in range(len(seg.epoch)):
            a, b = int(seg.id_start[t]), int(seg.id_start[t + 1])
            o = np.argsort(seg.ids[a:b], kind="stable")
            ids[a:b] = seg.ids[a:b][o]
            at = int(seg.offset[t])
            rows = raw[at: at + (b - a) * row_bytes].reshape(b - a, -1).copy()
            raw[at: at + rows.nbytes] = rows[o].reshape(-1)
        raw.tofile(d / f["data"])
        with open(d / f["index"], "wb") as out:
            np.savez(out, epoch=seg.epoch, batch=seg.batch, split=seg.split, offset=seg.offset,
                     id_start=seg.id_start, ids=ids)
        f |= {"data_sha256": hashlib.sha256(raw.tobytes()).hexdigest(),
              "index_sha256": hashlib.sha256((d / f["index"]).read_bytes()).hexdigest(),
              "index_bytes": (d / f["index"]).stat().st_size}
    (d / "pack.json").write_text(json.dumps(doc))
    return copy


def test_an_older_pack_in_node_order_verifies_and_is_read_bit_exactly(packed, tmp_path):
    """A pack written before segments kept their batch's order (sorted by node id): it verifies, and a run
    reads it bit-exactly, each batch's segment still whole (its rows found by a search). Its segments must
    be sorted: an index whose ids are not is refused."""
    ds, layout, man, feats = packed
    copy = _as_sorted_pack(layout, tmp_path / "L", ds.row_bytes)
    old = load_pack(copy)
    rep = verify_layout(copy)
    assert old.segment_order == "sorted" and rep.ok, rep.problems
    store = open_tiers(copy, RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=man.cached_rows, gpu_rows=0, shape="packed", superbatch=2,
                                    buffer_bytes=256 << 10, pack_seed=SEED))
    tr = _trace(ds, 0)
    per = len(tr) // 2
    try:
        for t in range(len(tr)):
            x = store.complete(store.submit(tr.batch(t), tag=((SEED, t // per, 0), t % per)))
            assert torch.equal(x, torch.from_numpy(feats[tr.batch(t)]))
        assert store.find(DiskTier).segment_batches == len(tr)
    finally:
        store.close()
    seg = Segments.load(pack_path(layout) / man.files[0].index, sorted_ids=True)  # batch order, read as sorted
    why = seg.problem(num_nodes=ds.num_nodes, row_bytes=ds.row_bytes, align=man.align, data_bytes=man.files[0].bytes,
                      rows=man.files[0].rows, epochs=man.epochs)
    assert why == "a segment's node ids are not sorted and distinct"


def test_a_segment_gives_the_row_of_each_of_a_batchs_misses():
    """Segments.rows_of: in a pack in batch order, the segment's rows when the misses are its ids or a part of
    them in their order, else None (the general path finds them); in an older, sorted pack, each miss's row
    by a search, None when one is missing."""
    ids = np.array([50, 7, 31, 12])
    batch = Segments(np.array([0]), np.array([0]), np.array([0]), np.array([0, 4]), ids.astype(np.int32))
    assert np.array_equal(batch.rows_of(0, ids), np.arange(4))
    assert np.array_equal(batch.rows_of(0, ids[[0, 2, 3]]), [0, 2, 3])  # a larger cache: a part, in order
    assert batch.rows_of(0, ids[::-1]) is None and batch.rows_of(0, np.array([50, 8])) is None
    srt = Segments(np.array([0]), np.array([0]), np.array([0]), np.array([0, 4]), np.sort(ids), sorted_ids=True)
    assert np.array_equal(srt.rows_of(0, ids), [3, 0, 2, 1])
    assert srt.rows_of(0, np.array([50, 8])) is None and srt.rows_of(0, np.array([51])) is None
    empty = Segments(np.array([0]), np.array([0]), np.array([0]), np.array([0, 0]), ids[:0], sorted_ids=True)
    assert empty.rows_of(0, ids[:0]).shape == (0,) and empty.rows_of(0, ids[:1]) is None


def test_a_pack_the_layouts_disk_cannot_hold_is_refused_before_it_is_sampled(packed, tmp_path, monkeypatch):
    """A pack grows with its epochs, so one of many epochs can outgrow the disk after hours of
    sampling and writing: it is refused up front from rank 0's first epoch alone, naming the epochs that fit,
    with the old pack whole and nothing left behind. The estimate is the size a pack is written at, and the
    bound that spares the sampling where the disk has room is above it."""
    ds, layout, man, _ = packed
    copy = shutil.copytree(layout, tmp_path / "L")
    assert pack_bytes_bound(ds, world_size=2, batch_size=BS, fanouts=FAN, epochs=2, align=man.align) >= man.bytes
    real, free = shutil.disk_usage, 10 * man.bytes  # room for about 20 of the pack's 2 epochs
    monkeypatch.setattr(pack_mod.shutil, "disk_usage", lambda p: real(p)._replace(free=free))
    epochs_sampled = []
    for name in ("sample_trace", "sample_eval_trace"):
        def counted(*a, _f=getattr(trace_mod, name), **k):
            epochs_sampled.append(k["epochs"])
            return _f(*a, **k)
        monkeypatch.setattr(trace_mod, name, counted)
    with pytest.raises(MomentError) as e:
        write_pack(copy, ds, world_size=2, batch_size=BS, fanouts=FAN, seed=SEED, epochs=200, cached_rows=man.cached_rows,
                   overwrite=True)
    msg = str(e.value)
    assert "a pack of 200 epoch(s) would take about" in msg and "the disk holding the layout has" in msg, msg
    fits = int(msg.split("--epochs ")[1].split()[0])
    assert 0.8 * 19 <= fits <= 1.2 * 19, msg  # 0.95 of the room for 20 epochs, estimated within 20%
    assert epochs_sampled == [1, 1]  # rank 0's first epoch, its training and validation batches
    assert load_pack(copy) == man and not list(copy.glob(".pack.*"))
    write_pack(copy, ds, world_size=2, batch_size=BS, fanouts=FAN, seed=SEED, epochs=fits,
               cached_rows=man.cached_rows, overwrite=True)  # what it says fits is packed
    assert load_pack(copy).epochs == fits


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """A pack that takes no row as cached, of a layout whose rows (512 B) are its alignment: every read of a
    segment goes straight into the batch's buffer."""
    root = tmp_path_factory.mktemp("whole")
    ds = make_dataset(root, dim=128)
    layout = make_layout(ds, root / "L", align=512)
    write_pack(layout, ds, world_size=2, batch_size=BS, fanouts=FAN, seed=SEED, epochs=2, cached_rows=0)
    return ds, layout, np.load(ds.file("features"))


def _whole_store(layout, rank=1, buffer_bytes=64 << 20):
    return open_tiers(layout, RankPlace(rank=rank, local_rank=rank, world_size=2, local_world_size=2),
                      StoreOptions(cpu_rows=400, gpu_rows=0, shape="packed", superbatch=3, buffer_bytes=buffer_bytes,
                                   pack_seed=SEED))


def _no_copies(monkeypatch):
    """Make every row copy of the tiers fail: a batch read whole must not make one."""
    from moment.runtime import cpu_tier, disk_tier, gather

    def refuse(*a, **k):
        raise AssertionError("a row was copied")

    for mod in (cpu_tier, disk_tier, gather):
        monkeypatch.setattr(mod, "copy_rows", refuse)


def test_a_whole_pack_is_read_straight_into_each_batchs_own_buffer(whole, monkeypatch):
    """Every row of a batch in its segment, in its order: the batch is read as the segment into the buffer its
    tensor is (CPU), no tier routes it and no row is copied, bit-exact; the caches serve none of its rows."""
    ds, layout, feats = whole
    store = _whole_store(layout)
    try:
        _no_copies(monkeypatch)
        tr = _trace(ds, 1)
        for b0, p0 in _read_ahead(store, tr, 2, 1, feats):
            assert torch.equal(store.complete(p0), torch.from_numpy(feats[b0]))
        st = store.tier_stats()
        rows = sum(tr.batch(t).size for t in range(len(tr)))
        assert st["segment_batches"] == len(tr) and st["rows"]["ssd"] == st["packed_rows"] == rows
        assert st["rows"]["cpu"] == 0 and st["direct_rows"] >= rows
    finally:
        store.close()


def test_a_whole_batch_after_batches_held_for_their_superbatch_and_a_dropped_one_stay_in_order(whole):
    """Batches through the tiers (not packed: held for their superbatch) and batches read whole, mixed and some
    dropped unread: every completed one bit-exact, each whole one's buffer no other batch's."""
    ds, layout, feats = whole
    store = _whole_store(layout, rank=0)
    try:
        tr = _trace(ds, 0)
        per = len(tr) // 2
        other = np.arange(0, ds.num_nodes, 11)  # untagged: through the caches, held for the superbatch
        pend = [(other, store.submit(torch.from_numpy(other)))]
        for t in range(4):
            pend.append((tr.batch(t), store.submit(torch.from_numpy(tr.batch(t)), tag=((SEED, 0, 0), t))))
        pend.append((other[::-1].copy(), store.submit(torch.from_numpy(other[::-1].copy()))))
        got = []
        for k, (b, p) in enumerate(pend):
            if k == 2:
                store.cancel(p)
                continue
            got.append((b, store.complete(p)))
        for b, x in got:
            assert torch.equal(x, torch.from_numpy(feats[b]))
        assert len({x.data_ptr() for _, x in got}) == len(got)
        assert store.tier_stats()["segment_batches"] == 4 and per >= 4
    finally:
        store.close()


def test_where_the_batch_is_a_copy_of_a_staging_slot_a_whole_pack_is_read_through_the_tiers(whole, monkeypatch):
    """CUDA lends a batch's staging slot at completion only (the ring's `lend` says None): the batch goes
    through the caches, its misses read from the same segment, bit-exact."""
    from moment.io.device import StagingRing

    ds, layout, feats = whole
    monkeypatch.setattr(StagingRing, "lend", lambda self, nbytes, align: None)
    store = _whole_store(layout)
    try:
        tr = _trace(ds, 1)
        per = len(tr) // 2
        for t in range(len(tr)):
            b = tr.batch(t)
            got = store.complete(store.submit(torch.from_numpy(b), tag=((SEED, t // per, 1), t % per)))
            assert torch.equal(got, torch.from_numpy(feats[b]))
        assert store.tier_stats()["rows"]["cpu"] > 0
    finally:
        store.close()


def test_cli_pack_whole_takes_no_row_as_cached_and_is_one_of_the_three_choices(whole, tmp_path, capsys):
    ds, layout, _ = whole
    copy = shutil.copytree(layout, tmp_path / "L")
    args = ["data", "pack", "--layout", str(copy), "--ranks", "2", "--fanouts", "10,5", "--overwrite"]
    assert main([*args, "--whole", "--cached", "5%"]) == 2
    assert "give one of --whole and --cached, not both" in capsys.readouterr().err
    assert main([*args, "--whole"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "every row of each batch" in out and "no kind given" not in out
    assert load_pack(copy).cached_rows == 0
    # --fitted: the layout's GPU and CPU bins left out, as --cached says it more exactly (no conflict)
    m = Layout.open(copy).manifest
    bins = sum(s.rows for s in m.shards if s.kind in ("gpu", "cpu"))
    assert bins > 0
    assert main([*args, "--fitted", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["cached_rows"] == bins and got["whole"] is False and got["chosen"] is None
    assert main([*args, "--fitted", "--cached", "5%", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cached_rows"] == cached_rows("5%", m.dataset.num_nodes, m.row.row_bytes)


@pytest.mark.parametrize("driver", [False, True])
def test_cli_pack_with_no_kind_is_whole_without_a_gpu_driver_and_fitted_with_one(whole, tmp_path, capsys,
                                                                                  monkeypatch, driver):
    """Asked for no kind, the pack suits the run this machine makes: on CPU (no GPU driver) whole, each batch
    read straight into its buffer; on CUDA fitted to the caches (a batch is a staging slot's copy there), and
    the person is told which and why."""
    monkeypatch.setattr(pack_mod, "no_gpu_driver", lambda: not driver)
    ds, layout, _ = whole
    copy = shutil.copytree(layout, tmp_path / "L")
    args = ["data", "pack", "--layout", str(copy), "--ranks", "2", "--fanouts", "10,5", "--overwrite"]
    assert main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["whole"] is (not driver) and (got["cached_rows"] > 0) is driver
    assert ("has a GPU driver" if driver else "has no GPU driver") in got["chosen"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"(no kind given: {got['chosen']})" in out


def test_cli_pack_with_no_kind_is_fitted_where_a_whole_one_would_not_fit_and_asked_for_whole_is_refused(
        whole, tmp_path, capsys, monkeypatch):
    """A whole pack the disk cannot take, where the fitted one fits: asked for no kind, the fitted one is written
    and the person told why; asked for --whole, refused (nothing written), as before."""
    ds, layout, _ = whole
    copy = shutil.copytree(layout, tmp_path / "L")
    args = ["data", "pack", "--layout", str(copy), "--ranks", "2", "--fanouts", "10,5", "--epochs", "2", "--overwrite"]
    sizes = {}
    for kind in ("--whole", "--fitted"):
        assert main([*args, kind, "--json"]) == 0
        sizes[kind] = json.loads(capsys.readouterr().out)["bytes"]
    assert sizes["--whole"] > 1.5 * sizes["--fitted"], sizes
    room = (sizes["--whole"] * sizes["--fitted"]) ** 0.5  # between the two, as rank 0's estimate is
    real = shutil.disk_usage
    monkeypatch.setattr(pack_mod.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=int(room / pack_mod.PACK_ROOM_SHARE)))
    monkeypatch.setattr(pack_mod, "no_gpu_driver", lambda: True)
    assert main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["whole"] is False and got["bytes"] == sizes["--fitted"]
    assert "a whole pack would take about" in got["chosen"] and "as --fitted does" in got["chosen"]
    assert main([*args, "--whole"]) == 2
    assert "would take about" in capsys.readouterr().err
    assert load_pack(copy).cached_rows > 0  # the fitted pack stays


def test_a_segment_is_a_batch_whole_only_when_it_is_every_row_in_the_batchs_order():
    seg = Segments(ids=np.array([5, 2, 9, 7], np.int64), id_start=np.array([0, 3, 4]), offset=np.array([0, 4096]),
                   epoch=np.zeros(2, np.int64), batch=np.arange(2), split=np.zeros(2, np.int8))
    assert seg.whole(0, np.array([5, 2, 9])) and seg.whole(1, np.array([7]))
    assert not seg.whole(0, np.array([2, 5, 9])) and not seg.whole(0, np.array([5, 2]))
    assert not seg.whole(0, np.array([5, 2, 9, 7]))


def test_a_batch_read_whole_runs_each_exchange_round_a_batch_asking_nothing_runs():
    """Every rank runs one round of each exchange per batch, in the chain's order: a batch read whole asks no
    other rank for a row, and still runs that round, as any batch whose rows are all its own does."""
    from types import SimpleNamespace

    from moment.runtime.exchange_tier import ExchangeTier, _Part

    def tier(nxt):
        t = ExchangeTier.__new__(ExchangeTier)
        t.exchange, t.serve, t.next = SimpleNamespace(group=SimpleNamespace(size=3)), object(), nxt
        return t

    last = DiskTier.__new__(DiskTier)
    last.next = None
    chain = tier(tier(last))
    out = torch.zeros(4, 8, dtype=torch.uint8)
    none = np.zeros(0, np.int64)
    asked = chain.fetches(_Part(none, none, none, _Part(none, none, none, None)), out)
    whole = chain.fetches_of_none(out, None)
    assert [f.tier for f in whole] == [f.tier for f in asked] == [chain, chain.next]
    assert all([w.size for w in f.want] == [0, 0, 0] and f.sink is not None for f in whole)
    # an exchange whose rows the tiers below hold too (the peers'): only a training batch, which every rank takes
    # in step, joins its rounds; an evaluation batch or a lookup (one rank's alone) runs the other exchange's only
    chain.below_holds = True
    train, val = (sampling_key(1, 0, 0), 3), (sampling_key(1, 0, 0, "val"), 3)
    assert [f.tier for f in chain.fetches_of_none(out, train)] == [chain, chain.next]
    assert [f.tier for f in chain.idle_fetches()] == [chain, chain.next]
    for tag in (val, None):
        assert [f.tier for f in chain.fetches_of_none(out, tag)] == [chain.next], tag
        assert not chain.joins(tag) and chain.next.joins(tag), tag
        part = _Part(none, none, none, _Part(none, none, none, None), rounds=False)  # what `take` gives it
        assert [f.tier for f in chain.fetches(part, out)] == [chain.next], tag
    assert [f.tier for f in chain.idle_fetches(stepped=False)] == [chain.next]


def test_batches_read_whole_stay_within_the_reads_budget(whole):
    """A batch read whole holds its buffer while its read is in flight: the chain asks to be submitted at most as
    many ahead as the reads' budget holds (its batches' extent known), and a batch beyond it goes through the
    tiers, bit-exact either way."""
    ds, layout, feats = whole
    tr = _trace(ds, 1)
    b0, b1 = tr.batch(0), tr.batch(1)
    budget = (b0.size + b1.size - 1) * 512  # the first batch's read, not both at once
    store = _whole_store(layout, buffer_bytes=budget)
    try:
        assert store.find(DiskTier).read_budget == budget
        store.batch_bytes = budget // 3
        assert store.lookahead == 2  # the reads' budget holds three batches of the extent: the next and two more
        store.batch_bytes = 0
        assert store.lookahead == 2 * 3  # the extent not known: the superbatches' own
        pend = [(b, store.submit(torch.from_numpy(b), tag=((SEED, 0, 1), t))) for t, b in enumerate((b0, b1))]
        for b, p in pend:
            assert torch.equal(store.complete(p), torch.from_numpy(feats[b]))
        st = store.tier_stats()
        assert st["whole_batches"] == 1 and st["segment_batches"] == 2 and st["rows"]["cpu"] > 0
    finally:
        store.close()


def test_the_run_says_which_pack_suits_the_resource_that_bound_it(packed, whole):
    """A fitted pack's CPU run bound by its cores with its SSDs mostly idle is pointed to `--whole`; a whole
    pack's run with its SSDs busy throughout, to the pack that fits its caches; otherwise nothing is said."""
    import shlex

    from moment.runtime.train import pack_kind_note

    fitted, full = packed[2], load_pack(whole[1])

    def m(busy, **kw):
        return {"device": "cpu", "limiting_stage": "train", "data_only": False,
                "per_rank": [{"disks": [{"busy_share": busy}], "pack_fit": 700}, {"disks": [], "pack_fit": 650}]} | kw

    (note,) = pack_kind_note(fitted, packed[1], None, m(0.2))
    assert "busy 20%" in note and shlex.split(note.split(": ")[-1])[-2:] == ["--whole", "--overwrite"]
    for quiet in (m(0.6), m(0.2, device="cuda:0"), m(0.2, limiting_stage="sample"), m(0.2, data_only=True),
                  m(None)):
        assert pack_kind_note(fitted, packed[1], None, quiet) == []
    (note,) = pack_kind_note(full, whole[1], None, m(0.9, data_only=True))
    words = shlex.split(note.split("half the bytes: ")[1])
    assert words[words.index("--cached") + 1] == "650"
    assert pack_kind_note(full, whole[1], None, m(0.5)) == []
    (note,) = pack_kind_note(full, whole[1], None, m(0.1, device="cuda:0"))  # not read whole there
    assert "on cuda:0 a whole pack's batches go through the caches" in note and "--cached 650" in note


@pytest.mark.parametrize("verify", [False, True])
def test_a_whole_pack_of_rows_smaller_than_the_alignment_is_read_bit_exactly(packed, tmp_path, verify):
    """Rows of 128 B in a layout aligned to 4 KiB: a segment's reads go straight into the batch where whole aligned
    blocks of rows allow, the rest through the reader's staging, bit-exact; with --verify (each layout chunk a
    read touches re-hashed) the batches go through the tiers instead."""
    ds, layout, _, feats = packed
    copy = shutil.copytree(layout, tmp_path / "L")
    write_pack(copy, ds, world_size=2, batch_size=BS, fanouts=FAN, seed=SEED, epochs=1, cached_rows=0, overwrite=True)
    store = open_tiers(copy, RankPlace(rank=0, local_rank=0, world_size=2, local_world_size=2),
                       StoreOptions(cpu_rows=200, gpu_rows=0, shape="packed", superbatch=2, buffer_bytes=64 << 20,
                                    pack_seed=SEED, verify=verify))
    try:
        tr = _trace(ds, 0, epochs=1)
        pend = [(tr.batch(t), store.submit(torch.from_numpy(tr.batch(t)), tag=((SEED, 0, 0), t)))
                for t in range(len(tr))]
        for b, p in pend:
            assert torch.equal(store.complete(p), torch.from_numpy(feats[b]))
        assert store.tier_stats()["whole_batches"] == (0 if verify else len(tr))
    finally:
        store.close()
