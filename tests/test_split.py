"""A graph split across machines (moment.placement.split) and the checks of a run across machines
(moment.runtime.rendezvous), without starting agents: tests/test_multinode.py starts them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from moment.cli import main
from moment.errors import MomentError
from moment.placement import split as sp
from moment.placement.reader import load_manifest, open_layout, verify_layout
from moment.runtime.exchange import ExchangeGroup
from moment.runtime.remote_tier import RemoteTier
from moment.runtime.rendezvous import (SHARED_SETTINGS, RankFacts, RunFacts, check_agents, machine_ranks,
                                       parse_rendezvous)
from moment.runtime.store import Collectives, RankPlace, StoreOptions, open_tiers


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


# ---- the split of the rows ---------------------------------------------------------------------------
def test_the_hottest_rows_go_everywhere_and_the_rest_is_dealt_out_snake_fashion():
    order = np.array([7, 3, 9, 0, 1, 2, 4, 5, 6, 8], np.int64)  # hottest first
    owners = sp.split_rows(order, 3, 2)
    assert owners[[7, 3]].tolist() == [-1, -1]
    assert owners[order[2:]].tolist() == [0, 1, 2, 2, 1, 0, 0, 1]  # snake: 0 1 2 | 2 1 0 | 0 1
    rng = np.random.default_rng(0)
    reads = rng.zipf(1.6, 100_000).astype(np.float64)
    order = np.argsort(-reads, kind="stable")
    owners = sp.split_rows(order, 4, 1000)
    counts = np.bincount(owners[owners >= 0], minlength=4)
    assert counts.max() - counts.min() <= 1 and (owners == -1).sum() == 1000
    shares = [sp.remote_read_share(owners, reads, k) for k in range(4)]
    assert max(shares) - min(shares) < 0.01  # each machine reads about as much of the others
    assert np.array_equal(owners, sp.split_rows(order, 4, 1000))  # deterministic
    assert (sp.split_rows(order, 2, 10**9) == -1).all()  # everything replicated: nothing split


def test_the_remote_read_share_is_stated_from_a_sample_the_split_was_not_chosen_from(tmp_path):
    """The hottest rows of a sample are replicated, so that same sample under-states the reads of the other
    machines' rows; a held-out sample states what another epoch reads."""
    from moment.placement.assignment import hotness_order
    from moment.workload.hotness import heldout_reads, presample
    from moment.workload.synth import synthesize

    ds = synthesize(tmp_path / "ds", 200_000, feature_dim=4, train_fraction=0.0025, seed=3)
    hot = presample(ds, (25, 10), 1024, seed=0)
    owners = sp.split_rows(hotness_order(hot.feature_reads), 2, 20_000)
    epoch = presample(ds, (25, 10), 1024, seed=777).feature_reads  # another epoch of training
    truth = sp.remote_read_share(owners, epoch, 0)
    stated = sp.remote_read_share(owners, heldout_reads(ds, (25, 10), 1024, seed=0), 0)
    assert abs(stated - truth) < 0.1 * truth
    assert sp.remote_read_share(owners, hot.feature_reads, 0) < 0.7 * truth  # the bias this guards against


def test_a_split_states_each_machines_remote_share_from_the_held_out_sample(split_layout, runtime_dataset):
    from moment.workload.hotness import heldout_reads

    m = sp.load_split(split_layout)
    owners = np.load(split_layout / sp.OWNERS)
    held = heldout_reads(runtime_dataset, (10, 5), 64, seed=0)  # runtime_data.make_split's hotness
    assert [x.remote_read_share for x in m.machines] == pytest.approx(
        [sp.remote_read_share(owners, held, k) for k in range(2)], abs=1e-12)
    assert 0 < m.machines[0].remote_read_share < 1


def test_a_split_layout_holds_each_machines_rows_bit_exact_and_refuses_the_others(split_layout, runtime_dataset):
    m = sp.load_split(split_layout)
    assert sp.verify_split(split_layout).ok
    owners = np.load(split_layout / sp.OWNERS)
    feats = np.load(runtime_dataset.file("features"))
    assert (owners == -1).sum() == m.replicated_rows == 560
    for x in m.machines:
        r = open_layout(split_layout / x.layout)
        held = sp.held_by(owners, x.index)
        assert held.size == x.held_rows and r.manifest.split.machine == x.index
        assert np.array_equal(r.rows(held), feats[held])  # bit for bit
        far = np.flatnonzero((owners != x.index) & (owners != -1))
        with pytest.raises(MomentError, match=f"node {far[0]} is on machine m{1 - x.index}"):
            r.rows(far[:3])
        assert verify_layout(split_layout / x.layout).ok  # a machine's layout on its own
    assert m.machines[0].owned_rows + m.machines[1].owned_rows + m.replicated_rows == runtime_dataset.num_nodes


@pytest.mark.slow
def test_layout_rm_of_one_machine_keeps_working_and_verify_names_it_missing(split_layout, tmp_path, capsys):
    s = shutil.copytree(split_layout, tmp_path / "S")
    assert main(["layout", "rm", str(s / "m0")]) == 0
    assert not (s / "m0").exists() and (s / "m1").is_dir()
    capsys.readouterr()
    assert main(["layout", "verify", str(s)]) == 1
    assert "machine m0's layout is missing" in _err(capsys)
    assert main(["layout", "info", str(s), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [x["present"] for x in info["machines"]] == [False, True]
    run = s / "m1.runs" / "20260101-000000"  # a training run of machine m1's layout
    run.mkdir(parents=True)
    (run / "torchrun.log").write_text("$ torchrun\n")
    (s / "notes.txt").write_text("mine")
    assert main(["layout", "rm", str(s)]) == 2
    assert "notes.txt" in _err(capsys) and (s / "m1").is_dir()  # nothing deleted
    (s / "notes.txt").unlink()
    assert main(["layout", "rm", str(s)]) == 0 and not s.exists()


def test_a_layout_is_never_placed_inside_a_split_or_a_dataset(split_layout, runtime_dataset, tmp_path, capsys):
    """`place --out SPLIT/m0 --overwrite` replaced machine m0's part with a whole-dataset layout (exit 0) and the
    split no longer verified; `--out SPLIT/extra` made a layout `layout rm SPLIT` then refused: both refused, as a
    layout inside a dataset, before anything is sampled."""
    s = shutil.copytree(split_layout, tmp_path / "S")
    args = ["place", "--dataset", str(runtime_dataset.path), "--profile", "paper-machine-b", "--gpus", "2", "--ssds",
            "2", "--gpu-cache", "2%", "--cpu-cache", "5%"]
    for out, extra, owner in ((s / "m0", ["--overwrite"], f"the split layout {s}"), (s / "extra", [], f"the split "
                              f"layout {s}"), (runtime_dataset.path / "L", [], f"the dataset {runtime_dataset.path}")):
        assert main([*args, "--out", str(out), *extra]) == 2
        assert _err(capsys).startswith(f"error: {out}: is inside {owner}, which a layout placed there would damage")
    assert not (s / "extra").exists() and not (runtime_dataset.path / "L").exists()
    assert main(["layout", "verify", str(s)]) == 0


def test_a_machines_missing_index_or_damaged_shard_is_named_once(split_layout, tmp_path, capsys):
    """The owners' agreement read a machine's index before its layout was verified: a missing one was a
    FileNotFoundError; a damaged shard's line named its path twice."""
    s = shutil.copytree(split_layout, tmp_path / "S")
    (s / "m0" / "index.npy").unlink()
    assert main(["layout", "verify", str(s)]) == 1
    err = _err(capsys)
    assert f"{s / 'm0' / 'index.npy'}: missing" in err and "Traceback" not in err, err
    shard = next((s / "m1" / "shards").glob("*.shard"))
    with open(shard, "r+b") as f:
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    assert main(["layout", "verify", str(s)]) == 1
    err = _err(capsys)
    assert f"{shard}: shard of bin" in err and f"{shard}: {shard}" not in err, err


def test_an_edited_machine_manifest_is_named_once_and_the_split_can_still_be_removed(split_layout, tmp_path, capsys):
    """A machine's manifest has its own checksum as the cluster manifest does: an edit (two SSD shards' files and
    checksums swapped) is the damaged file of `layout verify SPLIT`, named once; its machine's run refuses it; what
    the layouts own is still known, so `layout rm` removes the split (and one machine's layout alone)."""
    s = shutil.copytree(split_layout, tmp_path / "S")
    mf = s / "m0" / "manifest.json"
    doc = json.loads(mf.read_text())
    a, b = [x for x in doc["shards"] if x["kind"] == "ssd"][:2]
    a["path"], b["path"], a["chunk_sha256"], b["chunk_sha256"] = b["path"], a["path"], b["chunk_sha256"], a["chunk_sha256"]
    mf.write_text(json.dumps(doc))
    says = "the layout manifest was edited or damaged: its checksum does not match its content"
    assert main(["layout", "verify", str(s)]) == 1
    err = _err(capsys)
    assert f"layout damaged: file {mf} {mf}: {says}" in err and f"{mf}: {mf}" not in err and "hint" not in err, err
    with pytest.raises(MomentError, match=says):
        open_layout(s / "m0")
    shutil.copytree(s, tmp_path / "S2")
    assert main(["layout", "rm", str(s / "m0")]) == 0 and not (s / "m0").exists()
    assert main(["layout", "rm", str(tmp_path / "S2")]) == 0 and not (tmp_path / "S2").exists()


def test_a_damaged_cluster_manifest_or_owners_file_is_one_message(split_layout, tmp_path, capsys):
    s = shutil.copytree(split_layout, tmp_path / "S")
    mf = s / sp.CLUSTER_MANIFEST
    text = mf.read_text()
    mf.write_text(text.replace('"replicated_rows": 560', '"replicated_rows": 561'))
    for argv in (["layout", "verify", str(s)], ["layout", "rm", str(s)], ["layout", "info", str(s)]):
        assert main(argv) == 2
        err = _err(capsys)
        assert "the cluster manifest is damaged: its checksum does not match its content" in err, argv
        assert "Traceback" not in err
    assert (s / "m0").is_dir()
    mf.write_text("{not json")
    assert main(["layout", "verify", str(s)]) == 2 and "not readable JSON" in _err(capsys)
    mf.write_text(text)
    owners = np.load(s / sp.OWNERS)
    owners[:5] = 1 - owners[:5].clip(0, 1)
    np.save(s / sp.OWNERS, owners)
    assert main(["layout", "verify", str(s)]) == 1 and f"{s / sp.OWNERS}: checksum mismatch" in _err(capsys)


@pytest.mark.slow
def test_verify_refuses_a_machine_layout_of_another_split(split_layout, runtime_dataset, tmp_path, capsys):
    from runtime_data import make_split

    s = shutil.copytree(split_layout, tmp_path / "S")
    other = make_split(runtime_dataset, tmp_path / "S2", replicate="30%")
    shutil.rmtree(s / "m1")
    shutil.copytree(other / "m1", s / "m1")
    assert main(["layout", "verify", str(s)]) == 1
    assert "machine m1's layout: it belongs to another split" in _err(capsys)


def test_a_machines_layout_alone_trains_only_with_the_others(split_layout, tmp_path, capsys):
    m0 = split_layout / "m0"
    with pytest.raises(MomentError, match="which only a run on all of them can fetch"):
        open_tiers(m0)  # one process: no other machine to ask
    base = ["train", "--run-dir", str(tmp_path / "runs"), "--layout"]
    cases = [
        (base + [str(m0)], "this is machine m0's part of a layout split over 2 machines"),
        (["train", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29999", *base[1:], str(m0)],
         "--node-rank 1, but this is machine m0's layout, node rank 0"),
        (["train", "--nnodes", "3", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29999", *base[1:], str(m0)],
         "--nnodes 3, but the layout is split over 2 machines"),
        (base + [str(split_layout)], "this is a split layout of 2 machines, not one machine's layout"),
        (["data", "pack", "--layout", str(m0), "--ranks", "2"], "its batches read rows other machines own"),
    ]
    for argv, said in cases:
        assert main(argv) == 2, argv
        err = _err(capsys)
        assert said in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "runs").exists()  # refused before a run directory or torchrun


@pytest.mark.slow
def test_the_remote_tier_serves_only_the_rows_its_machine_holds(split_layout, runtime_dataset):
    """A remote tier's serving side alone (its exchange unused): the rows another machine asks for, bit for bit
    from this machine's files; a row it does not hold is refused, not read from the wrong place."""
    owners = np.load(split_layout / sp.OWNERS)
    feats = torch.from_numpy(np.load(runtime_dataset.file("features")))
    group = ExchangeGroup(None, (0, 1), 0, torch.device("cpu"))  # machine 0 of 2; no round is run here
    store = open_tiers(split_layout / "m0", RankPlace(), StoreOptions(cpu_rows=100, shape="block"),
                       Collectives(barrier=lambda: None, remote=group))
    try:
        far = store.find(RemoteTier)
        assert store.chain().__next__().name in ("gpu", "remote") and far is not None
        mine = np.flatnonzero(owners != 1)
        rows = far.serve(torch.from_numpy(mine[::7])).wait()  # read while the exchange goes on: waited for here
        assert torch.equal(rows.view(feats.dtype).reshape(-1, feats.shape[1]), feats[mine[::7]])
        with pytest.raises(MomentError, match="asked machine m0 for rows it does not own"):
            far.serve(torch.from_numpy(np.flatnonzero(owners == 1)[:4]))
        part = far.take(np.arange(runtime_dataset.num_nodes), None, None)
        assert np.array_equal(np.sort(part.key), np.flatnonzero(owners == 1)) and (part.owner == 1).all()
    finally:
        store.close()


def test_the_budget_charges_what_the_remote_tier_states(split_layout, runtime_layout, runtime_dataset):
    from moment.runtime import footprint
    from moment.runtime.config import TrainConfig
    from moment.runtime.run_plan import resolve_run
    from moment.runtime.sizing import run_inputs
    from moment.placement.opened import Layout
    from moment.workload.sampler import CSRGraph, SeedBatches

    lay = Layout.open(split_layout / "m1")
    cfg = TrainConfig(layout=lay.path, fanouts=[10, 5], batch_size=64, memory_budget="2GiB")
    batches = SeedBatches(np.asarray(runtime_dataset.train_idx), 64, seed=0, rank=0, world_size=2)
    inputs = run_inputs(cfg, runtime_dataset, CSRGraph.from_dataset(runtime_dataset), [batches], [10, 5],
                        400 << 20, 0, 1, lay)
    plan = resolve_run(cfg, lay, world_size=2, local_world_size=1, inputs=inputs)
    items = {i.name: i.bytes for i in plan.memory.items}
    rb = runtime_dataset.row_bytes
    assert items["remote exchange"] == footprint.remote_round_bytes(inputs.rows_max, rb, 2) > 0
    assert items["remote reader"] == footprint.remote_reader_bytes(lay.manifest.row.align) > 0
    assert plan.tiers.remote_tier and plan.split.name == "m1" and plan.split.machine == 1
    assert plan.split.remote_rows == {"m0": lay.split.remote[0].rows}
    assert any("remote tier on: machine m1 (node rank 1)" in line for line in plan.lines())
    whole = resolve_run(cfg, Layout.open(runtime_layout), world_size=2, local_world_size=1, inputs=inputs)
    assert "remote exchange" not in {i.name for i in whole.memory.items} and not whole.tiers.remote_tier


# ---- the flags and the machines of a run across machines ------------------------------------------------
@pytest.mark.parametrize("args,said", [
    ((0, None, None), "--nnodes 0: must be an integer >= 1"),
    ((1, 0, None), "--node-rank go"),
    ((1, None, "127.0.0.1:29500"), "--rdzv-endpoint go"),
    ((2, None, "127.0.0.1:29500"), "give this machine's --node-rank (0 to 1)"),
    ((2, 2, "127.0.0.1:29500"), "--node-rank 2: must be 0 to 1"),
    ((2, -1, "127.0.0.1:29500"), "--node-rank -1: must be 0 to 1"),
    ((2, 0, None), "give --rdzv-endpoint HOST:PORT"),
    ((2, 0, "127.0.0.1"), "expected HOST:PORT"),
    ((2, 0, ":29500"), "expected HOST:PORT"),
    ((2, 0, "127.0.0.1:0"), "is not an integer from 1 to 65535"),
    ((2, 0, "127.0.0.1:70000"), "is not an integer from 1 to 65535"),
    ((2, 0, "127.0.0.1:http"), "is not an integer from 1 to 65535"),
    ((2, 0, "0.0.0.0:29500"), "0.0.0.0 is not an address an agent can connect to"),
    ((2, 0, "http://node0:29500"), "is neither an IP address nor a hostname"),
    ((2, 0, "node 0:29500"), "is neither an IP address nor a hostname"),
    ((2, 0, "no-such-host.invalid:29500"), "cannot resolve no-such-host.invalid"),
    # the part that is wrong is the one quoted
    ((2, 0, "127.0.0.1:29400:1"), "the port '29400:1' is not an integer"),
    ((2, 0, "[::1"), "'[::1' opens '[' without its ']'"),
    ((2, 0, "[::1]29500"), "'29500' after '[::1]' is not ':PORT'"),
    ((2, 0, "[::1]"), "no ':PORT' after '[::1]'"),
    ((2, 0, "[::1]:0"), "the port '0' is not an integer"),
])
def test_the_rendezvous_flags_are_one_message_each(args, said):
    with pytest.raises(MomentError) as e:
        parse_rendezvous(*args)
    assert said in str(e.value)


def test_the_rendezvous_torchrun_gets():
    assert parse_rendezvous(1, None, None) is None
    r = parse_rendezvous(2, 1, "127.0.0.1:29500", 30)
    assert r.loopback and r.endpoint == "127.0.0.1:29500"
    assert r.torchrun_args() == ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29500",
                                 "--rdzv-id=moment", "--rdzv-conf=join_timeout=30", "--local-addr=127.0.0.1"]
    assert r.env() == {"MOMENT_NODE_RANK": "1", "MOMENT_NNODES": "2", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert parse_rendezvous(2, 0, "localhost:29500").loopback
    import socket

    host = parse_rendezvous(3, 2, f"{socket.gethostname()}:29500")
    assert host.host == socket.gethostname() and host.timeout_s == 600  # a hostname as given


def test_ranks_are_numbered_by_machine_and_disagreeing_machines_are_refused():
    def facts(*nodes, lws=1, nnodes=2, backend="gloo"):
        return [RankFacts(n, nnodes, lr, lws, backend, f"h{n}") for n in nodes for lr in range(lws)]

    assert machine_ranks(facts(1, 0)) == [1, 0]  # torchrun's order is not the machines'
    assert machine_ranks(facts(1, 0, lws=2)) == [2, 3, 0, 1]
    with pytest.raises(MomentError, match="two machines gave --node-rank 0"):
        machine_ranks(facts(0, 0))
    bad = facts(0, 1)
    bad[1] = RankFacts(1, 2, 0, 2, "gloo", "h1")
    with pytest.raises(MomentError, match="--nproc 1 on node 0 .h0., 2 on node 1"):
        machine_ranks(bad)
    bad = facts(0, 1)
    bad[1] = RankFacts(1, 3, 0, 1, "gloo", "h1")
    with pytest.raises(MomentError, match="different --nnodes: 2 on node 0"):
        machine_ranks(bad)
    bad[1] = RankFacts(1, 2, 0, 1, "nccl", "h1")
    with pytest.raises(MomentError, match="CPU and GPU machines cannot train together"):
        machine_ranks(bad)
    assert RankFacts.decode(bad[1].encode()) == bad[1]


def test_machines_training_different_things_are_refused():
    s = (("epochs", "1"), ("seed", "0"))

    def f(node, **kw):
        base = dict(node_rank=node, host="h", dataset_id="d" * 64, dataset="ds", layout=f"L{node}", split_id=None,
                    split_machine=None, split_machines=(), settings=s)
        return RunFacts(**(base | kw))

    check_agents([f(0), f(1)])  # two whole layouts of one dataset
    with pytest.raises(MomentError, match="different datasets"):
        check_agents([f(0), f(1, dataset_id="e" * 64)])
    split = dict(split_id="a" * 64, split_machines=("m0", "m1"))
    check_agents([f(0, split_machine=0, **split), f(1, split_machine=1, **split)])
    with pytest.raises(MomentError, match="not of one split"):
        check_agents([f(0, split_machine=0, **split), f(1)])
    with pytest.raises(MomentError, match="not of one split"):
        check_agents([f(0, split_machine=0, **split), f(1, split_machine=1, **(split | {"split_id": "b" * 64}))])
    with pytest.raises(MomentError, match=r"node 1 \(h\) has machine m0's layout"):
        check_agents([f(0, split_machine=0, **split), f(1, split_machine=0, **split)])
    with pytest.raises(MomentError, match="split over 2 machines .m0, m1., but 1 machines train"):
        check_agents([f(0, split_machine=0, **split)])
    with pytest.raises(MomentError, match="different settings .node 0 .h. vs node 1 .h..: epochs 1 vs 2"):
        check_agents([f(0), f(1, settings=(("epochs", "2"), ("seed", "0")))])
    # a machine that ends in a prediction pass while another does not would wait in its gathers for ever
    assert {"predict", "predict_nodes", "embed"} <= set(SHARED_SETTINGS)


def test_place_with_machines_refuses_what_does_not_go_with_a_split(runtime_dataset, tmp_path, capsys):
    base = ["place", "--dataset", str(runtime_dataset.path), "--out", str(tmp_path / "S")]
    for extra, said in [(["--machines", "0"], "--machines 0: a split needs at least 1 machine"),
                        (["--machines", "2", "--report"], "--report does not go with"),
                        (["--cluster", "c.yaml", "--ssd-path", f"ssd0={tmp_path}"], "--ssd-path does not go with"),
                        (["--machines", "2", "--cluster", "c.yaml"], "give one"),
                        (["--replicate", "10%"], "--replicate goes with --machines"),
                        (["--machines", "2", "--replicate", "120%"], "at most 100%")]:
        assert main(base + extra) == 2, extra
        err = _err(capsys)
        assert said in err and "Traceback" not in err, (extra, err)
    assert not (tmp_path / "S").exists()


def test_a_machines_layout_records_its_split(split_layout):
    m0, m1 = (load_manifest(split_layout / n) for n in ("m0", "m1"))
    assert m0.split.id == m1.split.id == sp.load_split(split_layout).id
    assert (m0.split.machine, m1.split.machine) == (0, 1) and m0.split.remote[0].name == "m1"
    assert m0.layout_id() != m1.layout_id()


@pytest.mark.slow
def test_a_split_killed_while_it_is_written_leaves_the_old_one_whole(split_layout, runtime_dataset, tmp_path, capsys):
    """kill -9 while machine m1's layout is written, then after the new split is swapped in: the old split, or the
    new one, complete at SPLIT; the next write (here, in this process) cleans up what the killed one left. Its
    hotness and held-out sample are sampled here once and given to each (`given_heldout`): a child drawing them
    imported torch and sampled, most of its ~1.5 CPU-s, before the write under test."""
    from test_data_safety import cli, given_heldout

    from moment import testpoints
    from moment.workload.hotness import heldout_reads, presample

    key = ([25, 10], 256, 0)  # the hotness's fan-outs, batch size and seed: its held-out sample's
    presample(runtime_dataset, key[0], key[1], seed=key[2]).save(tmp_path / "hot")
    np.save(tmp_path / "heldout.npy", heldout_reads(runtime_dataset, *key))
    s = shutil.copytree(split_layout, tmp_path / "S")
    old = sp.load_split(s).id
    argv = ["place", "--dataset", str(runtime_dataset.path), "--profile", "paper-machine-b", "--gpus", "2", "--ssds",
            "2", "--gpu-cache", "2%", "--cpu-cache", "5%", "--machines", "2", "--replicate", "30%", "--out", str(s),
            "--hotness", str(tmp_path / "hot"), "--overwrite", "--no-verify", "--json"]
    for point in ("layout-written", "split-swapped"):
        r = cli(argv, {testpoints.CRASH_ENV: point}, prelude=given_heldout(tmp_path / "heldout.npy", key))
        assert r.returncode == -9, r.stderr
        assert sp.verify_split(s).ok
        assert (sp.load_split(s).id == old) == (point == "layout-written")
    assert main(argv) == 0, capsys.readouterr().err
    assert sp.verify_split(s).ok and not (tmp_path / "S.partial").exists() and not (tmp_path / "S.old").exists()


def test_a_split_partial_of_the_users_is_neither_removed_nor_written_over(split_layout, runtime_dataset, tmp_path,
                                                                           capsys):
    """hunt-K D9: SPLIT.partial without Moment's mark for SPLIT (the user's) is refused, named and kept, by place
    and by layout rm; it was deleted as a killed write's leftover."""
    s = shutil.copytree(split_layout, tmp_path / "S")
    mine = tmp_path / "S.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    place = ["place", "--dataset", str(runtime_dataset.path), "--profile", "paper-machine-b", "--gpus", "2", "--ssds",
             "2", "--gpu-cache", "2%", "--cpu-cache", "5%", "--machines", "2", "--out", str(s), "--overwrite"]
    for argv in (place, ["layout", "rm", str(s)]):
        assert main(argv) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"error: {mine}: exists, and is not what a killed write or removal of S left" in err, err
        assert (mine / "notes.txt").read_text() == "my notes" and sp.verify_split(s).ok


@pytest.mark.slow
def test_place_with_a_cluster_file_writes_one_layout_per_server(runtime_dataset, tmp_path, capsys):
    cluster = tmp_path / "two.yaml"
    cluster.write_text("servers:\n  - {name: b, profile: paper-machine-b, inventory: '2xA100-PCIe-40GB,2xP5510', "
                       "count: 2}\nnetwork: {nic: CX6-Dx-100GbE, switch_gbit: 100}\n")
    out = tmp_path / "S"
    base = ["place", "--dataset", str(runtime_dataset.path), "--gpu-cache", "2%", "--cpu-cache", "5%", "--no-verify",
            "--out", str(out), "--cluster"]
    assert main([*base, str(cluster), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in res["machines"]] == ["b0", "b1"] and sp.verify_split(out).ok
    assert res["replicated_rows"] == 560 and all(m["inventory"] == "2 x A100-PCIe-40GB, 2 x P5510" for m in res["machines"])
    cluster.write_text(cluster.read_text().replace("paper-machine-b", "no-such-machine"))
    assert main([*base, str(cluster), "--overwrite"]) == 2
    err = _err(capsys)
    assert "servers[0].profile" in err and "Traceback" not in err and sp.verify_split(out).ok


# ---- a split of one machine is the whole; the options a split shares with `place` ------------------------

_PLACE = ["--profile", "paper-machine-b", "--gpus", "2", "--ssds", "2", "--gpu-cache", "2%", "--cpu-cache", "5%",
          "--no-verify"]


@pytest.fixture(scope="module")
def hot_dir(runtime_dataset, tmp_path_factory) -> Path:
    from moment.workload.hotness import presample

    d = tmp_path_factory.mktemp("split-hot") / "hot"
    presample(runtime_dataset, (10, 5), 64).save(d)
    return d


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    import subprocess
    import sys

    p = tmp_path_factory.mktemp("split-plan") / "plan.json"
    r = subprocess.run([sys.executable, "-m", "moment", "plan", "--profile", "paper-machine-b", "--gpus", "2", "--ssds",
                        "2", "--json"], capture_output=True, text=True, check=True)
    p.write_text(r.stdout)
    return p


def _same_layout(whole: Path, part: Path) -> None:
    """The layout at `part` (a machine of a split) holds what the layout at `whole` holds: every file's bytes,
    the same bins, shards, index, hotness order and manifest extras; only the split's record (and so the manifest's
    own checksum) differs."""
    a, b = load_manifest(whole), load_manifest(part)
    assert a.split is None and b.split is not None and b.split.remote == []
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    for k in set(da) | set(db):
        if k not in ("split", "sha256"):  # the split's record, so the manifest's own checksum
            assert da[k] == db[k], k
    files = sorted(f.relative_to(whole).as_posix() for f in whole.rglob("*") if f.is_file() and f.name != "manifest.json")
    assert files and files == sorted(f.relative_to(part).as_posix() for f in part.rglob("*")
                                     if f.is_file() and f.name != "manifest.json")
    for f in files:
        assert (whole / f).read_bytes() == (part / f).read_bytes(), f


@pytest.mark.parametrize("plan", [False, True])
def test_a_split_of_one_machine_writes_the_whole_layout(runtime_dataset, hot_dir, plan_file, tmp_path, capsys, plan):
    """`--machines 1` and a whole-machine `place` on the same inputs place every row alike and write the same
    bytes (the split adds only its cluster manifest, owners file and the machine's split record)."""
    extra = ["--hotness", str(hot_dir)] + (["--plan", str(plan_file)] if plan else [])
    base = ["place", "--dataset", str(runtime_dataset.path), *_PLACE, *extra, "--json"]
    assert main([*base, "--out", str(tmp_path / "L")]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert main([*base, "--out", str(tmp_path / "S"), "--machines", "1"]) == 0
    split = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in split["machines"]] == ["m0"] and sp.verify_split(tmp_path / "S").ok
    _same_layout(tmp_path / "L", tmp_path / "S" / "m0")
    m0 = split["machines"][0]
    assert m0["held_rows"] == runtime_dataset.num_nodes and m0["remote_read_share"] == 0
    assert (m0["machine"], m0["inventory"]) == (whole["plan"]["machine"], whole["plan"]["inventory"])
    assert load_manifest(tmp_path / "S" / "m0").extra["hardware"]["source"] == whole["hardware"]["source"]
    assert split["presample"]["fanouts"] == whole["presample"]["fanouts"]


def test_a_split_takes_a_plan_for_every_machine(runtime_dataset, hot_dir, plan_file, tmp_path, capsys):
    out = tmp_path / "S"
    base = ["place", "--dataset", str(runtime_dataset.path), *_PLACE, "--hotness", str(hot_dir), "--machines", "2"]
    assert main([*base, "--plan", str(plan_file), "--out", str(out), "--json"]) == 0
    plan = json.loads(plan_file.read_text())
    for name in ("m0", "m1"):
        m = load_manifest(out / name)
        assert m.plan.placement == plan["placement"] and str(plan_file) in m.extra["hardware"]["source"]
    assert sp.verify_split(out).ok
    # a plan of other hardware is refused before anything is written
    assert main([*base, "--gpus", "1", "--plan", str(plan_file), "--out", str(tmp_path / "T")]) == 2
    assert "the plan places" in _err(capsys) and not (tmp_path / "T").exists()


def test_a_split_writes_its_shards_under_ssd_paths_and_owns_them(runtime_dataset, hot_dir, tmp_path, capsys):
    """--ssd-path with --machines: every machine's SSD shard under DIR, in a directory named for that machine's
    layout; verify reads them, --overwrite and `layout rm` remove them with the split."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "S"
    base = ["place", "--dataset", str(runtime_dataset.path), *_PLACE, "--hotness", str(hot_dir), "--machines", "2",
            "--ssd-path", f"ssd0={mnt}", "--out", str(out)]
    assert main(base) == 0
    capsys.readouterr()

    def shard_dirs() -> list[str]:
        return sorted(d.name for d in mnt.iterdir())

    first = shard_dirs()
    assert len(first) == 2 and all("m0" in d or "m1" in d for d in first)
    for name in ("m0", "m1"):
        m = load_manifest(out / name)
        ext = [s for s in m.shards if Path(s.path).is_absolute()]
        assert len(ext) == 1 and ext[0].bin == "ssd0" and Path(ext[0].path).parent.parent == mnt
    assert sp.verify_split(out).ok
    assert main([*base, "--overwrite"]) == 0
    capsys.readouterr()
    again = shard_dirs()
    assert len(again) == 2 and set(again).isdisjoint(first) and sp.verify_split(out).ok
    assert main(["layout", "rm", str(out / "m1")]) == 0  # one machine's layout alone, as it was written
    assert len(shard_dirs()) == 1
    assert main(["layout", "rm", str(out)]) == 0
    assert shard_dirs() == [] and not out.exists()
    assert main(["place", "--dataset", str(runtime_dataset.path), *_PLACE, "--machines", "2", "--ssd-path",
                 f"ssd9={mnt}", "--hotness", str(hot_dir), "--out", str(out)]) == 2
    assert "ssd9" in _err(capsys) and not out.exists() and shard_dirs() == []


def test_a_split_says_when_the_hotness_overrides_the_defaults(runtime_dataset, hot_dir, tmp_path):
    from moment.placement.api import SplitMachine, place_split
    from moment.planner.api import parse_inventory
    from moment.topology.profiles import load_profile

    topo, inv = load_profile("paper-machine-b"), parse_inventory(None, 2, 2)
    said: list[str] = []
    place_split(runtime_dataset, tmp_path / "S", [SplitMachine(f"m{k}", topo, inv) for k in range(2)],
                hotness=hot_dir, gpu_cache="2%", cpu_cache="5%", verify=False, notice=said.append)
    assert any(s.startswith("using the hotness's fan-outs 10,5") for s in said), said
