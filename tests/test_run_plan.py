"""The run plan: every derived decision of a run made once (moment.runtime.run_plan), without torch, from
a layout opened once; the components state their own memory; nothing rewrites the configuration."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from runtime_data import make_dataset, make_layout

from moment.caching import POLICIES, make_policy
from moment.caching.policies import SlotMap
from moment.caching.tiers import FixedSlots, cache_state_bytes
from moment.cli import main
from moment.errors import MomentError
from moment.placement.manifest import LayoutManifest
from moment.placement.opened import Layout
from moment.placement.pack import PackManifest, write_pack
from moment.runtime.config import TrainConfig
from moment.runtime.gather import BufferPool, Reader, staging_bytes
from moment.runtime.run_plan import RunInputs, planned_ssd_shares, resolve_run

REPO = Path(__file__).resolve().parents[1]
FAN, BS, SEED = (10, 5), 96, 3
RUN_POLICIES = ("static", "lru", "belady-superbatch")
MiB = 2**20


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A layout without a pack, and one with a pack made for 2 ranks at (FAN, BS, SEED)."""
    root = tmp_path_factory.mktemp("runplan")
    ds = make_dataset(root)
    plain = make_layout(ds, root / "plain")
    packed = make_layout(ds, root / "packed")
    write_pack(packed, ds, world_size=2, batch_size=BS, fanouts=FAN, seed=SEED, epochs=1,
               cached_rows=ds.num_nodes // 10)
    return root, ds, plain, packed


def _inputs(ds) -> RunInputs:
    """Inputs as a caller would measure them (plain numbers here: resolve_run takes them as given)."""
    n = ds.num_nodes
    return RunInputs(train_nodes=int(np.asarray(ds.train_idx).size), graph_bytes=MiB, labels_bytes=n,
                     rows_max=3000, edges_max=20_000, process_bytes=300 * MiB, sampler_map_bytes=8 * n,
                     batch_ids_bytes=3000 * 8 + 20_000 * 16, held_batches=4,
                     training_bytes=16 * MiB)


def _plan(ds, layout: Path, world: int = 2, device: str = "cpu", **kw):
    cfg = TrainConfig(**{"layout": layout, "fanouts": list(FAN), "batch_size": BS, "seed": SEED, **kw})
    return resolve_run(cfg, Layout.open(layout), world_size=world, local_world_size=world, inputs=_inputs(ds),
                       device=device)


@pytest.mark.parametrize("which,shape,kw,why", [
    ("plain", "rows", {"io_shape": "rows"}, "--io-shape rows"),
    ("plain", "block", {"io_shape": "block"}, "--io-shape block"),
    ("plain", "block", {}, "the layout has no pack"),  # auto without a pack
    ("packed", "packed", {}, None),  # auto with a pack made for this run
    ("packed", "packed", {"io_shape": "packed"}, None),
    ("packed", "block", {"seed": SEED + 1}, f"seed {SEED + 1} (pack: {SEED})"),  # auto, a pack for other batches
])
def test_each_io_shape_and_the_pack_match(data, which, shape, kw, why):
    _, ds, plain, packed = data
    layout = {"plain": plain, "packed": packed}[which]
    plan = _plan(ds, layout, **{"memory_budget": "2GiB", **kw})
    assert plan.io_shape == plan.tiers.shape == shape
    assert plan.io_shape_requested == kw.get("io_shape", "auto")
    assert plan.pack.why == why
    assert plan.pack.checked == (kw.get("io_shape", "auto") in ("auto", "packed"))
    items = {i.name: i.bytes for i in plan.memory.items}
    if shape == "packed":  # the pack's index is charged, as large as the largest rank's
        assert plan.pack.matches and plan.pack.index_bytes == Layout.open(packed).pack_index_bytes > 0
        assert items["pack index"] == plan.pack.index_bytes
    else:
        assert "pack index" not in items
    # a hyperbatch for block and packed reads, one batch for row reads (static cache), and twice that ahead
    assert (plan.tiers.superbatch, plan.tiers.lookahead) == ((1, 2) if shape == "rows" else (4, 8))
    assert plan.tiers.merge_gap == (0 if shape == "rows" else -1)


def test_the_epochs_past_the_pack_are_named_where_the_run_is_planned(data, tmp_path):
    """A run of more epochs than its pack holds reads the later ones from the layout, many times slower (the 8M
    bench: 0.4 s packed, 4.7 s after): the dry run says which and how to pack them, as the run's notes do."""
    _, ds, _, packed = data
    for epochs, short in ((1, None), (2, "epoch 2 read from the layout"), (3, "epochs 2..3 read from the layout")):
        plan = _plan(ds, packed, memory_budget="2GiB", epochs=epochs)
        assert (plan.pack.epochs, plan.pack.run_epochs) == (1, epochs)
        assert plan.pack.unpacked() == short and (plan.pack.repack is None) == (short is None)
        shape_line = plan.lines()[1]
        assert shape_line.startswith("I/O shape packed (auto): reads the layout's pack")
        if short is None:
            assert "read from the layout" not in shape_line
        else:
            repack = (f"moment data pack --layout {packed} --ranks 2 --epochs {epochs} --batch-size {BS} --fanouts "
                      f"{','.join(map(str, FAN))} --seed {SEED} --cached {ds.num_nodes // 10} --overwrite")
            assert plan.pack.repack == repack
            assert shape_line.endswith(f"it holds 1 epoch(s): {short}, at about block's speed (to pack them all: "
                                       f"{repack})")
        # and the run's end says it again (`moment train`'s notes, and its metrics' `notes`)
        assert plan.pack.notes() == ([] if short is None else
                                     [f"note: {short} (the pack holds 1); to pack them all: {repack}"])
    # the command given packs them: the same run planned again reads every epoch from the pack
    copy = tmp_path / "L"
    shutil.copytree(packed, copy)
    hint = _plan(ds, copy, memory_budget="2GiB", epochs=3).pack.repack
    assert main(shlex.split(hint)[1:]) == 0
    again = _plan(ds, copy, memory_budget="2GiB", epochs=3)
    assert (again.pack.epochs, again.pack.unpacked(), again.pack.repack) == (3, None, None)
    assert again.pack.cached_rows == ds.num_nodes // 10
    # a run that does not read the pack says nothing of its epochs
    block = _plan(ds, packed, memory_budget="2GiB", epochs=3, io_shape="block")
    assert block.pack.epochs == 0 and block.pack.unpacked() is None


def test_a_packed_run_without_a_pack_for_it_is_refused(data):
    _, ds, plain, packed = data
    with pytest.raises(MomentError, match="needs a pack in the layout"):
        _plan(ds, plain, io_shape="packed")
    with pytest.raises(MomentError, match=r"the pack was sampled for other batches: batch size 64 \(pack: 96\)"):
        _plan(ds, packed, io_shape="packed", batch_size=64)
    with pytest.raises(MomentError, match=r"sampled for other batches: ranks 3 \(pack: 2\)"):
        _plan(ds, packed, world=3, io_shape="packed")


@pytest.mark.parametrize("policy", RUN_POLICIES)
def test_each_cache_policy(data, policy):
    _, ds, plain, _ = data
    n = ds.num_nodes
    two = _plan(ds, plain, memory_budget="2GiB", cache_policy=policy, io_shape="rows")
    one = _plan(ds, plain, world=1, memory_budget="2GiB", cache_policy=policy, io_shape="rows")
    assert two.cache_policy == two.tiers.policy == policy
    # a static cache is one segment for the machine's ranks; a changing one each rank's own
    assert two.tiers.shared_cache == two.memory.shared_cache == (policy == "static")
    assert not one.tiers.shared_cache
    cpu = next(i for i in two.memory.items if i.name == "cpu cache")
    assert cpu.shared == (policy == "static") and cpu.bytes == two.tiers.cpu_rows * ds.row_bytes
    # the policy's bookkeeping is what the policy says it holds for the rows the plan gives it
    state = next(i for i in two.memory.items if i.name == "cache policy state")
    assert state.bytes == cache_state_bytes(policy, n, two.tiers.cpu_rows) > n
    # Belady decides a superbatch at a time, LRU is batch-granular like it: rows reads still route 4
    assert two.tiers.superbatch == (1 if policy == "static" else 4)


def test_each_rank_its_plan_gpus_gpu_rows_and_ssd_shares(data):
    _, ds, plain, _ = data
    lay = Layout.open(plain)
    rows = {s.bin: s.rows for s in lay.manifest.shards}
    cpu = _plan(ds, plain, memory_budget="2GiB")
    assert [(r.rank, r.local_rank, r.plan_gpus) for r in cpu.ranks] == [(0, 0, ("gpu0",)), (1, 1, ("gpu1",))]
    assert all(r.gpu_rows == cpu.memory.gpu_rows for r in cpu.ranks)  # CPU runs: the budget's grant
    cuda = _plan(ds, plain, device="cuda", memory_budget="2GiB")  # device memory: all of the rank's bins
    assert [r.gpu_rows for r in cuda.ranks] == [rows["gpu0"], rows["gpu1"]]
    shares = planned_ssd_shares(lay)
    assert set(shares) == {s.bin for s in lay.manifest.shards if s.kind == "ssd"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(r.ssd_shares == shares for r in cpu.ranks)
    doc = json.loads(cpu.model_dump_json())
    assert {"io_shape", "cache_policy", "ranks", "memory", "pack", "tiers"} <= set(doc)
    assert {"rank", "plan_gpus", "ssd_shares"} <= set(doc["ranks"][0])
    assert {"budget_bytes", "predicted_peak_bytes", "items", "cpu_rows"} <= set(doc["memory"])


def test_the_components_state_their_own_memory(data):
    """What the budget charges is what each component holds (a stated size that drifted from its
    arrays would break the measured-peak check only by luck)."""
    import torch

    from moment.runtime.pipeline import Pipeline
    from moment.workload.sampler import CSRGraph, MiniBatch, NeighborSampler

    _, ds, plain, _ = data
    lay = Layout.open(plain)
    n, cap = ds.num_nodes, 300
    rank = np.arange(n, dtype=np.int32)
    for name in RUN_POLICIES:
        p = make_policy(name, cap, n, rank=rank.copy())
        assert p.memory_bytes() == POLICIES[name].state_bytes(n, cap), name
    assert SlotMap(cap, n).memory_bytes() == SlotMap.state_bytes(n, cap)
    assert FixedSlots(np.arange(cap, dtype=np.int64), n).memory_bytes() == FixedSlots.state_bytes(n, cap)
    assert sum(a.nbytes for a in lay.load_index()) == lay.index_bytes
    reader = Reader([lay.shard_file(s) for s in lay.manifest.shards], lay.row_bytes, lay.manifest.row.align,
                    pool=BufferPool(MiB))
    try:
        assert reader.staging_bytes == staging_bytes(lay.manifest.row.align)
    finally:
        reader.close()
    sampler = NeighborSampler(CSRGraph.from_dataset(ds), list(FAN))
    mb = sampler.sample(torch.arange(50))
    assert sampler._map.nbytes == NeighborSampler.map_bytes(n)
    assert mb.n_id.nbytes + mb.edge_index.nbytes == MiniBatch.id_bytes(mb.num_nodes, mb.edge_index.shape[1])
    # 1 queued, 1 ahead, 1 assembled, 1 trained, and a loader paused beside it: its loop's batch and its next
    assert Pipeline.held_batches(2) == Pipeline.held_batches(1) == 6


NO_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed (this test hides it)")

sys.meta_path.insert(0, NoTorch())
from moment.placement.opened import Layout
from moment.runtime.config import TrainConfig
from moment.runtime.run_plan import RunInputs, resolve_run

cfg = TrainConfig(layout=sys.argv[1], fanouts=[10, 5], batch_size=96, seed=3, memory_budget="2GiB")
inputs = RunInputs(train_nodes=1200, graph_bytes=1 << 20, labels_bytes=4000, rows_max=3000, edges_max=20000,
                   process_bytes=300 << 20, sampler_map_bytes=32000, batch_ids_bytes=344000, held_batches=4,
                   training_bytes=16 << 20)
plan = resolve_run(cfg, Layout.open(sys.argv[1]), world_size=2, local_world_size=2, inputs=inputs)
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print(plan.model_dump_json())
"""


def test_resolve_run_needs_no_torch(data):
    _, _, _, packed = data
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", NO_TORCH, str(packed)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["io_shape"] == "packed"


@pytest.fixture(scope="module")
def one_rank_run(data):
    """A one-process run on a layout whose pack was made for it (--io-shape auto finds it), its manifests'
    reads counted: the metrics, the config before and after, and the counts."""
    from moment.runtime.train import train

    root, ds, _, packed = data
    layout = shutil.copytree(packed, root / "one")
    write_pack(layout, ds, world_size=1, batch_size=BS, fanouts=FAN, seed=SEED, epochs=1, cached_rows=0,
               overwrite=True)
    counts = {"layout": 0, "pack": 0}
    by_layout, by_pack = LayoutManifest.model_validate.__func__, PackManifest.model_validate_json.__func__

    def layout_read(cls, *a, **k):
        counts["layout"] += 1
        return by_layout(cls, *a, **k)

    def pack_read(cls, *a, **k):
        counts["pack"] += 1
        return by_pack(cls, *a, **k)

    cfg = TrainConfig(layout=layout, fanouts=list(FAN), batch_size=BS, seed=SEED, hidden=16, threads=1, quiet=True)
    before = cfg.model_dump()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LayoutManifest, "model_validate", classmethod(layout_read))
        mp.setattr(PackManifest, "model_validate_json", classmethod(pack_read))
        m = train(cfg)
    return layout, cfg, before, m, counts


def test_a_run_reads_each_manifest_once(one_rank_run):
    *_, m, counts = one_rank_run
    assert m["io_shape"] == "packed" and m["packed_rows"] > 0  # the pack was found, opened and read from
    assert counts == {"layout": 1, "pack": 1}


def test_a_cpu_runs_metrics_state_no_device_budget(one_rank_run):
    """`memory.device` has the keys of a CUDA run's, null: a CPU run holds nothing on a device."""
    *_, m, _ = one_rank_run
    assert m["memory"]["device"] == {"budget_bytes": None, "predicted_peak_bytes": None, "items": [],
                                     "measured_peak_bytes": None}


def test_nothing_rewrites_the_configuration(one_rank_run):
    _, cfg, before, m, _ = one_rank_run
    assert cfg.model_dump() == before and cfg.io_shape == "auto"  # what the user asked, after the run
    assert m["config"]["io_shape"] == "auto" and m["io_shape"] == "packed"  # what it resolved to: the plan's
    with pytest.raises(ValidationError, match="frozen"):
        cfg.io_shape = "block"


def test_dry_run_prints_the_plan_and_starts_no_rank(data, monkeypatch, capsys):
    import moment.cli.train_launch as launch
    from moment.cli import main

    _, _, _, packed = data
    started: list[list[str]] = []
    real = subprocess.Popen

    class Spy(real):  # every process started from here on (the rank-size probe is one; no torchrun may be)
        def __init__(self, args, *a, **k):
            started.append([str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)])
            super().__init__(args, *a, **k)

    def no_torchrun(*a, **k):
        raise AssertionError("--dry-run started torchrun")

    monkeypatch.setattr(subprocess, "Popen", Spy)
    monkeypatch.setattr(launch, "run", no_torchrun)
    counts = {"layout": 0, "pack": 0}
    by_layout, by_pack = LayoutManifest.model_validate.__func__, PackManifest.model_validate_json.__func__
    monkeypatch.setattr(LayoutManifest, "model_validate",
                        classmethod(lambda cls, *a, **k: counts.__setitem__("layout", counts["layout"] + 1)
                                    or by_layout(cls, *a, **k)))
    monkeypatch.setattr(PackManifest, "model_validate_json",
                        classmethod(lambda cls, *a, **k: counts.__setitem__("pack", counts["pack"] + 1)
                                    or by_pack(cls, *a, **k)))
    args = ["--layout", str(packed), "--nproc", "2", "--fanouts", "10,5", "--batch-size", str(BS), "--seed",
            str(SEED), "--memory-budget", "2GiB"]
    assert main(["train", "--dry-run", "--json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["io_shape"] == "packed" and doc["cache_policy"] == "static"
    # what the pack leaves out for the caches, beside what this run's CPU cache holds: a user compares the two
    assert doc["pack"]["cached_rows"] == json.loads((packed / "pack" / "pack.json").read_text())["cached_rows"] > 0
    assert [(r["rank"], r["plan_gpus"]) for r in doc["ranks"]] == [(0, ["gpu0"]), (1, ["gpu1"])]
    assert all(sum(r["ssd_shares"].values()) == pytest.approx(1.0) for r in doc["ranks"])
    assert doc["memory"]["budget_bytes"] == 2 << 30 and doc["memory"]["predicted_peak_bytes"] > 0
    assert {i["name"] for i in doc["memory"]["items"]} >= {"process", "cpu cache", "pack index"}
    assert counts == {"layout": 1, "pack": 1}  # the launcher opens the layout once too
    assert main(["train", "--dry-run", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "I/O shape packed (auto)" in out and "rank 1 (local 1): gpu1" in out and "memory budget: 2.00 GiB" in out
    assert f"leaving out the {doc['pack']['cached_rows']:,} hottest rows for the caches" in out
    # neither torchrun nor a rank (`-m moment.runtime.agent`, `-m moment.train`) was started
    assert not [c for c in started if {"moment.runtime.agent", "moment.train"} & set(c)], started
    assert not (packed.parent / (packed.name + ".runs")).exists()  # no run directory either
    assert main(["train", "--json", *args]) == 2
    assert "--json goes with --dry-run" in capsys.readouterr().err
    for flag, value in (("--metrics-json", "m.json"), ("--checkpoint-dir", "ck"), ("--run-dir", "runs")):
        # a flag naming where a run writes does nothing in a dry run: refused, and nothing is written
        target = packed.parent / value
        assert main(["train", "--dry-run", *args, flag, str(target)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert err.startswith(f"error: {flag}: a dry run trains nothing") and not target.exists(), err


@pytest.mark.slow
def test_the_fresh_rank_is_measured_while_the_launcher_checks_and_never_outlives_it(monkeypatch, tmp_path):
    """`measure_ahead` starts the fresh interpreter at once and the first size asked for collects it (one
    interpreter per model, not two); a user's `--model` module is imported by the fresh interpreter as the agent
    imports it for its ranks (what it holds is charged once, as pages the ranks share); one left running when the launcher exits (a user error first) is stopped."""
    import subprocess as sp

    from moment.runtime import start_sizes as ss

    # a user's model module holding 96 MiB once imported (written bytes: resident), found from the current directory
    (tmp_path / "heavy_model.py").write_text("BLOB = b'x' * (96 << 20)\n\ndef make(**kw):\n    raise AssertionError\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing recorded: every size is measured
    started = []
    real = ss._start
    monkeypatch.setattr(ss, "_start", lambda model=None: started.append(real(model)) or started[-1])
    monkeypatch.setattr(ss, "_ahead", {})
    monkeypatch.setattr(ss, "_measured", {})
    try:
        ss.measure_ahead(budgeted=True, model="sage")
        ss.measure_ahead(budgeted=True, model="gat")  # once: a built-in model imports nothing more
        ss.measure_ahead(budgeted=True, model="heavy_model:make")  # a second interpreter, at the same time
        assert len(started) == 2 and all(p.poll() is None for p in started)  # running while the caller goes on
        agent, rank, shared = ss.fresh_sizes("sage")
        assert len(started) == 2 and 0 < rank < 32 << 20 and agent > 0  # collected, not measured again
        assert shared > 128 << 20  # torch and the runtime the agent loaded, which its forked ranks share
        assert ss.fresh_sizes() == (agent, rank, shared) and ss.fresh_sizes("gat") == (agent, rank, shared)
        _, user_rank, user_shared = ss.fresh_sizes("heavy_model:make")
        assert len(started) == 2 and user_shared - shared > 80 << 20 and user_rank < 32 << 20, (shared, user_shared)
        assert ss.start_sizes("heavy_model:make")[1] == user_rank
        monkeypatch.setattr(ss, "_measured", {})
        ss.record_path().unlink()
        ss.measure_ahead(budgeted=False)
        left = started[-1]
        ss._stop_ahead()  # what atexit runs
        assert left.poll() is not None and left.returncode != 0
        assert isinstance(left, sp.Popen)
    finally:
        ss._stop_ahead()


@pytest.mark.slow
def test_the_fresh_interpreter_imports_the_users_module_before_it_forks_and_its_rank_dies_with_it(monkeypatch,
                                                                                                  tmp_path):
    """The fresh interpreter imports a user's model module as the agent does, before it forks the rank it
    measures: killed (the launcher's exit, `_stop_ahead`) while that import is slow, it has forked no rank yet;
    and a rank it forked ends with it (its pipe's end), whenever it is killed."""
    import subprocess as sp
    import time

    from moment.runtime import start_sizes as ss

    (tmp_path / "slow_model.py").write_text("import time\nopen('importing', 'w').close()\ntime.sleep(60)\n\n"
                                            "def make(**kw): ...\n")
    monkeypatch.chdir(tmp_path)
    p = ss._start("slow_model:make")
    deadline = time.monotonic() + 120
    while not (tmp_path / "importing").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "importing").exists() and p.poll() is None, "the fresh interpreter did not import it"
    assert not sp.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    p.kill()
    p.wait()

    # a rank whose interpreter is killed before it was told to go (stopped once it forked)
    script = ("import os, signal\nfork = os.fork\n"
              "def stopping():\n    pid = fork()\n    if pid:\n        os.kill(os.getpid(), signal.SIGSTOP)\n    return pid\n"
              "os.fork = stopping\n" + ss.script(None))
    p = sp.Popen([sys.executable, "-c", script], stdout=sp.PIPE, stderr=sp.DEVNULL, text=True)
    child, deadline = [], time.monotonic() + 120
    while not child and p.poll() is None and time.monotonic() < deadline:
        child = sp.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        time.sleep(0.1)
    assert child, "the fresh interpreter forked no rank"
    p.kill()
    p.wait()

    def running() -> bool:  # neither gone nor a zombie
        try:
            return open(f"/proc/{child[0]}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    gone = time.monotonic() + 10
    while running() and time.monotonic() < gone:
        time.sleep(0.1)
    assert not running()


def test_a_recorded_fresh_rank_is_reused_by_a_dry_run_and_a_recent_one_by_a_budgeted_launch(monkeypatch, tmp_path):
    """A measurement is recorded. A preview that checks no budget takes a record of this installation of any
    age; a budgeted one only a record made in the last RECENT_S seconds since this boot (the page cache it
    was measured in). A record taken is every size the process asks for after (the ranks' figures are the
    preview's), said with when it was measured; one of another installation, boot or model, too old, or
    unreadable, is measured again."""
    import json

    from moment.runtime import start_sizes as ss

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    started = []
    monkeypatch.setattr(ss, "_start", lambda model=None: started.append(model))  # no interpreter: a fake measurement
    monkeypatch.setattr(ss, "_collect", lambda p: (100, 300, 50))
    monkeypatch.setattr(ss, "_ahead", {})
    monkeypatch.setattr(ss, "_taken", {})
    monkeypatch.setattr(ss, "_measured", {})

    def ahead(budgeted: bool, model: str | None = None) -> tuple[int, int, int, str | None]:
        ss._measured.clear()
        ss._taken.clear()
        ss.measure_ahead(budgeted=budgeted, model=model)
        return ss.start_sizes(model)

    def record(model: str | None = None) -> dict:
        return next(r for r in json.loads(ss.record_path().read_text())["records"] if r["key"] == ss._record_key(model))

    def rewrite(**changes) -> None:  # the built-in models' record
        ss.record_path().write_text(json.dumps({"records": [{**record(), **changes}]}))

    try:
        assert ahead(budgeted=True) == (100, 300, 50, None) and len(started) == 1  # nothing recorded: measured
        rec = record()
        assert rec["rank"] == 300 and rec["shared"] == 50 and rec["boot"] == ss._boot() is not None
        for budgeted in (False, True):  # recorded just now: no interpreter, when it was measured said
            agent, rank, shared, when = ahead(budgeted)
            assert (agent, rank, shared) == (100, 300, 50) and when is not None and len(started) == 1
            assert ss.start_sizes() == (agent, rank, shared, when) and ss.start_sizes("gat")[1] == rank
            assert len(started) == 1
        assert ahead(budgeted=True)[3].startswith(rec["date"] + " ")  # a budgeted reuse says the time too
        for stale in ({"at": rec["at"] - ss.RECENT_S - 1}, {"boot": "another-boot"}, {"boot": None},
                      {"at": rec["at"] + 3600}):  # too old, another boot, none, from the future
            rewrite(**stale)
            assert ahead(budgeted=True)[3] is None and len(started) == 2  # measured again, and recorded anew
            started.pop()
            rewrite(**stale)
            assert ahead(budgeted=False)[3] == rec["date"] and len(started) == 1  # a dry run's check takes it
        for bad, budgeted in [("{", False), ("{", True), ("[]", False), (json.dumps({"records": 3}), False),
                              (json.dumps({"records": [{**rec, "key": {"python": "other"}}]}), False),
                              (json.dumps({"records": [{**rec, "at": "soon"}]}), True),
                              (json.dumps({"records": [None, {**rec, "rank": -1}]}), False)]:  # unreadable, another
            ss.record_path().write_text(bad)  # installation, a bad figure
            assert ahead(budgeted)[3] is None  # measured again
        assert record()["rank"] == 300
        assert ahead(False, "mine:make")[3] is None and started[-1] == "mine:make"  # another model's module
        # each kept beside the other, the newest first: switching between them measures neither again
        assert [r["key"] for r in json.loads(ss.record_path().read_text())["records"]] == [
            ss._record_key("mine:make"), ss._record_key()]
        count = len(started)
        assert ahead(True)[3] is not None and ahead(True, "mine:make")[3] is not None and len(started) == count
        for k in range(ss.RECORDS_KEPT + 2):  # the oldest go past RECORDS_KEPT
            ahead(False, f"m{k}:make")
        keys = [r["key"] for r in json.loads(ss.record_path().read_text())["records"]]
        assert len(keys) == ss.RECORDS_KEPT and keys[0] == ss._record_key(f"m{ss.RECORDS_KEPT + 1}:make")
        assert ss._record_key() not in keys
        # a user's module, found as a rank imports it (the current directory first), not run: an edit measures anew
        monkeypatch.chdir(tmp_path)
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("raise AssertionError('not imported')\n")
        (tmp_path / "pkg" / "net.py").write_text("def make(**kw): ...\n")
        assert ss._module_file("pkg.net:make")[0] == str(tmp_path / "pkg" / "net.py")
        before = len(started)
        assert ahead(True, "pkg.net:make")[3] is None and len(started) == before + 1
        assert ahead(True, "pkg.net:make")[3] is not None and len(started) == before + 1  # not edited since
        (tmp_path / "pkg" / "net.py").write_text("import heavy_library\ndef make(**kw): ...\n")
        assert ahead(True, "pkg.net:make")[3] is None and ahead(False, "pkg.net:make")[3] is not None
        assert len(started) == before + 2 and "pkg" not in sys.modules
        assert "preload('mine:make')" in ss.script("mine:make") and "preload(None)" in ss.script("sage")
    finally:
        ss._measured.clear()


def test_the_launcher_hands_the_ranks_the_fresh_rank_of_the_users_model(runtime_layout, monkeypatch, tmp_path):
    """`moment train --model MODULE:FACTORY --memory-budget`: the fresh rank the launcher measures (and hands every
    rank as its fixed cost) imports the user's module, as the rank does before it measures itself."""
    from moment.cli.train_cmds import _precheck
    from moment.runtime import start_sizes as ss
    from moment.runtime.sizing import AGENT_ENV, BASE_ENV, EXTENT_ENV, SHARED_ENV
    from moment.workload.graph import CHECKED_ENV

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(ss, "_start", lambda model=None: model)  # a fake measurement: larger with the user's module
    monkeypatch.setattr(ss, "_collect", lambda model: (100 << 20, (300 if model is None else 350) << 20, 80 << 20))
    monkeypatch.setattr(ss, "_ahead", {})
    monkeypatch.setattr(ss, "_measured", {})
    common = ["--layout", str(runtime_layout), "--memory-budget", "3GiB"]
    _, env, _ = _precheck([*common, "--model", "examples.own_loop:factory", "--fanouts", "5,5,5"], 2)
    assert env.pop(CHECKED_ENV)  # and the dataset it checked (tests/test_dataset_vouched.py)
    assert json.loads(env.pop(EXTENT_ENV))["rows"] > 0  # and the batch extent it charged
    assert env == {BASE_ENV: str(350 << 20), AGENT_ENV: str(100 << 20), SHARED_ENV: str(80 << 20)}
    _, env, _ = _precheck([*common, "--model", "gat"], 2)
    assert env[BASE_ENV] == str(300 << 20)


def test_a_dry_run_with_a_recorded_start_size_loads_no_torch_and_prints_the_same_plan(runtime_layout, tmp_path):
    """With a fresh rank's size recorded, the first dry run samples the batch extent (torch) and records it;
    the next reuses it and loads no torch (nor PyG), printing the same plan; a record it cannot read is
    sampled again, with the same plan."""
    from moment.runtime import start_sizes as ss

    (tmp_path / "moment").mkdir()
    (tmp_path / "moment" / "start_sizes.json").write_text(json.dumps(
        {"key": ss._record_key(), "agent": 200 << 20, "rank": 400 << 20, "shared": 80 << 20,
         "date": "2026-01-02"}))
    # what the dry run loaded, said at exit (after the CLI's sys.exit)
    wrapper = ("import atexit, runpy, sys\n"
               "atexit.register(lambda: sys.stderr.write(f'\\nloaded torch={\"torch\" in sys.modules} '\n"
               "                                         f'pyg={\"torch_geometric\" in sys.modules}\\n'))\n"
               "sys.argv = ['moment', *sys.argv[1:]]\n"
               "runpy.run_module('moment', run_name='__main__', alter_sys=True)\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH")]))}

    def dry_run(*extra: str) -> tuple[str, str]:
        r = subprocess.run([sys.executable, "-c", wrapper, "train", "--dry-run", "--layout", str(runtime_layout),
                            *extra], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr.strip().splitlines()[-1]

    first, loaded = dry_run()
    assert loaded == "loaded torch=True pyg=False" and "recorded 2026-01-02" in first
    assert (tmp_path / "moment" / "extents.json").is_file()
    again, loaded = dry_run()
    assert loaded == "loaded torch=False pyg=False" and again == first
    json_out, loaded = dry_run("--json")
    assert loaded == "loaded torch=False pyg=False" and json.loads(json_out)["memory"]
    (tmp_path / "moment" / "extents.json").write_text("{")  # unreadable: sampled again
    resampled, loaded = dry_run()
    assert loaded == "loaded torch=True pyg=False" and resampled == first
