"""The device budget (moment.runtime.device_budget): what a rank holds on its GPU is stated item by item, the GPU
tier gets what is left, too small a budget is refused naming the minimum, and on CUDA the host budget charges no
stand-in of the GPU tier and exactly the pinned staging ring. All on CPU: the device's free memory is injected."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fake_device import FakeCudaLayer

from moment.errors import MomentError
from moment.io.device import DeviceMemory, StagingRing, ring_bytes, slot_bytes, upload_chunk
from moment.placement.opened import Layout
from moment.runtime.config import TrainConfig
from moment.runtime.device_budget import (CUDA_CONTEXT_BYTES, MIN_HEADROOM, NCCL_COMM_BYTES, DeviceShape,
                                          device_budget, headroom, resolve_device_budget)
from moment.runtime.run_plan import RunInputs, resolve_run

MiB, GiB = 2**20, 2**30
FAN, BS = (10, 5), 96


def _shape(**kw) -> DeviceShape:
    base = dict(row_bytes=512, own_gpu_rows=1_000_000, rows_max=50_000, batch_ids_bytes=2 * MiB, held_batches=4,
                training_bytes=300 * MiB, exchange_bytes=40 * MiB, communicators=2)
    return DeviceShape(**{**base, **kw})


def test_the_budget_comes_from_the_devices_free_memory_or_the_option():
    mem = DeviceMemory(free=70 * GiB, total=80 * GiB)
    assert headroom(80 * GiB) == 4 * GiB and headroom(GiB) == MIN_HEADROOM
    for spec in (None, "auto", " AUTO "):
        got, how = resolve_device_budget(spec, mem)
        assert got == 66 * GiB and how.startswith("auto: the device's free memory 70.00 GiB less 4.00 GiB"), spec
    assert resolve_device_budget("40GiB", mem) == (40 * GiB, "given")
    assert resolve_device_budget("80%", mem)[0] == 64 * GiB
    # the launcher reads no device: a share or auto is resolved by each rank; bytes are known
    assert resolve_device_budget(None, None)[0] is None and resolve_device_budget("80%", None)[0] is None
    assert resolve_device_budget("40GiB", None) == (40 * GiB, "given")
    assert resolve_device_budget(None, DeviceMemory(100 * MiB, GiB))[0] == 0  # less free than headroom: nothing
    for spec, said in (("71GiB", r"--device-memory-budget 71GiB: 71.00 GiB is more than the device has free "
                                 r"\(70.00 GiB of 80.00 GiB\)"),
                       ("90%", r"more than the device has free"), ("150%", r"must be at most 100%"),
                       ("0", "must be positive"), ("lots", "give bytes"), ("", "give bytes")):
        with pytest.raises(MomentError, match=said):
            resolve_device_budget(spec, mem)


def test_each_item_is_stated_and_the_gpu_tier_gets_the_rest():
    r = _shape()
    free = device_budget(None, "unknown", r)
    items = {i.name: i.bytes for i in free.items}
    assert items == {"cuda context": CUDA_CONTEXT_BYTES, "nccl buffers": 2 * NCCL_COMM_BYTES, "training": 300 * MiB,
                     "batches": 4 * (50_000 * 512 + 2 * MiB), "gpu tier gather": 50_000 * 512,
                     "peer exchange": 40 * MiB, "gpu tier": 1_000_000 * 512}
    assert free.used == sum(items.values()) and not free.capped and free.notice() is None  # unbounded: every row
    fixed = free.used - items["gpu tier"]
    capped = device_budget(fixed + 300_000 * 512 + 100, "given", r)
    assert (capped.gpu_rows, capped.wanted_rows, capped.capped) == (300_000, 1_000_000, True)
    assert capped.used <= capped.total and capped.as_dict()["predicted_peak_bytes"] == capped.used
    assert "caps each rank's GPU tier at 300,000 of the 1,000,000 rows" in capped.notice()
    assert capped.lines()[0].startswith("device memory budget per rank: ") and capped.lines()[-1] == capped.notice()
    roomy = device_budget(64 * GiB, "given", r)
    assert roomy.gpu_rows == 1_000_000 and not roomy.capped and roomy.notice() is None
    one = device_budget(None, "unknown", _shape(communicators=0, exchange_bytes=0, own_gpu_rows=0))
    assert {i.name for i in one.items} == {"cuda context", "training", "batches"}  # one rank, no GPU bins


def test_fixed_needs_above_the_budget_are_refused_naming_the_minimum():
    r = _shape()
    fixed = sum(i.bytes for i in device_budget(None, "", r).items if i.name != "gpu tier")
    assert device_budget(fixed, "given", r).gpu_rows == 0  # the least budget: no GPU-tier row, but it runs
    with pytest.raises(MomentError) as e:
        device_budget(fixed - 1, "given", r)
    need = -(-fixed // MiB)
    assert "below the minimum" in str(e.value) and "cuda context 768.00 MiB" in str(e.value)
    assert f"--device-memory-budget {need}MiB" in e.value.hint


# ---- in the run plan ----------------------------------------------------------------------------------------


def _inputs(ds, memory: DeviceMemory | None = None) -> RunInputs:
    n = ds.num_nodes
    return RunInputs(train_nodes=int(np.asarray(ds.train_idx).size), graph_bytes=MiB, labels_bytes=n, rows_max=3000,
                     edges_max=20_000, process_bytes=300 * MiB, sampler_map_bytes=8 * n,
                     batch_ids_bytes=3000 * 8 + 20_000 * 16, held_batches=4, training_bytes=16 * MiB,
                     exchange_bytes=3 * MiB, device_memory=memory)


def _plan(ds, layout, device="cuda", memory=None, world=2, **kw):
    cfg = TrainConfig(layout=layout, fanouts=list(FAN), batch_size=BS, **kw)
    return resolve_run(cfg, Layout.open(layout), world_size=world, local_world_size=world,
                       inputs=_inputs(ds, memory), device=device)


def test_a_cuda_plan_carries_the_device_budget_and_caps_each_ranks_gpu_tier(runtime_dataset, runtime_layout):
    ds, rb = runtime_dataset, runtime_dataset.row_bytes
    bins = {s.bin: s.rows for s in Layout.open(runtime_layout).manifest.shards if s.kind == "gpu"}
    whole = _plan(ds, runtime_layout).memory.device  # no free memory known, no option: every row
    assert whole.budget_bytes is None and whole.gpu_rows == whole.gpu_rows_wanted == max(bins.values())
    names = [i.name for i in whole.items]
    assert names == ["cuda context", "nccl buffers", "training", "batches", "gpu tier gather", "peer exchange",
                     "gpu tier"]
    assert whole.items[1].bytes == NCCL_COMM_BYTES  # one communicator: the world group carries the exchange too
    fixed = whole.predicted_peak_bytes - whole.items[-1].bytes
    # the device's free memory as the ranks agreed it: the default budget is it less headroom
    mem = DeviceMemory(free=fixed + MIN_HEADROOM + 150 * rb, total=4 * GiB)
    plan = _plan(ds, runtime_layout, memory=mem)
    dev = plan.memory.device
    assert dev.budget_bytes == fixed + 150 * rb and dev.gpu_rows == 150 < min(bins.values())
    assert [r.gpu_rows for r in plan.ranks] == [150, 150]  # each rank's carve, hottest rows first
    assert all(g.rows == 150 for r in plan.ranks for g in r.gpu_bins)
    assert any("caps each rank's GPU tier at 150 of the 200 rows" in line for line in plan.lines())
    given = _plan(ds, runtime_layout, memory=mem, device_memory_budget=str(fixed + 40 * rb)).memory.device
    assert given.gpu_rows == 40 and given.source == "given"
    doc = plan.memory.as_dict()["device"]
    assert {"budget_bytes", "predicted_peak_bytes", "items"} <= set(doc) and doc["predicted_peak_bytes"] <= doc[
        "budget_bytes"]
    with pytest.raises(MomentError, match=r"below the minimum .* a rank needs on its device"):
        _plan(ds, runtime_layout, memory=mem, device_memory_budget=str(fixed - 1))


def test_a_cpu_run_has_no_device_budget(runtime_dataset, runtime_layout):
    plan = _plan(runtime_dataset, runtime_layout, device="cpu", memory_budget="2GiB")
    assert plan.memory.device is None and plan.memory.as_dict()["device"] is None
    assert all(r.gpu_rows == plan.memory.gpu_rows > 0 for r in plan.ranks)  # the host budget's stand-in grant
    with pytest.raises(MomentError, match=r"--device-memory-budget 8GiB: this run is on the CPU"):
        _plan(runtime_dataset, runtime_layout, device="cpu", device_memory_budget="8GiB")


def test_on_cuda_the_host_budget_charges_no_gpu_stand_in_and_exactly_the_ring(runtime_dataset, runtime_layout):
    """The GPU tier, the batches and the step are in device memory on CUDA: the host budget charges instead the
    pinned staging ring (exactly what the ring allocates) and the GPU table upload's one pinned chunk."""
    ds = runtime_dataset
    cpu = {i.name: i.bytes for i in _plan(ds, runtime_layout, device="cpu", memory_budget="2GiB").memory.items}
    plan = _plan(ds, runtime_layout, memory_budget="2GiB")
    cuda = {i.name: i.bytes for i in plan.memory.items}
    assert {"gpu cache stand-in", "batch features", "training"} <= set(cpu)
    assert not {"gpu cache stand-in", "batch features", "training"} & set(cuda) and plan.memory.gpu_rows == 0
    assert plan.tiers.batch_bytes == 3000 * ds.row_bytes
    dev = FakeCudaLayer()
    ring = StagingRing(dev, plan.tiers.batch_bytes)
    assert cuda["staging ring"] == ring.nbytes() == dev.pinned_bytes() == ring_bytes(3000 * ds.row_bytes)
    assert cuda["staging ring"] == 2 * slot_bytes(3000 * ds.row_bytes)
    table = plan.memory.device.gpu_rows_wanted
    rows, chunk = upload_chunk(ds.row_bytes, table)
    stride = max(s.stride for s in Layout.open(runtime_layout).manifest.shards if s.kind == "gpu")
    assert cuda["gpu table upload"] == chunk + rows * stride and rows == table  # a small table: one chunk of it
    assert chunk == slot_bytes(table * ds.row_bytes) < 1 * MiB
    # the CPU cache gets what the stand-in and the batches no longer take
    assert plan.tiers.cpu_rows >= _plan(ds, runtime_layout, device="cpu", memory_budget="2GiB").tiers.cpu_rows


def test_the_ranks_agree_on_the_least_free_device_memory(runtime_dataset):
    """Every rank resolves the same plan: the device memory is agreed, as the least of the ranks' devices."""
    from moment.runtime.sizing import run_inputs
    from moment.workload.sampler import CSRGraph, SeedBatches

    ds = runtime_dataset

    class TwoRanks:  # the other rank's device has less free memory and less in all
        def all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
            other = t.clone()
            other[-2:] = torch.tensor([-(3 * GiB), -(40 * GiB)], dtype=t.dtype)
            return torch.maximum(t, other)

    batches = SeedBatches(np.asarray(ds.train_idx), BS, seed=0, rank=0, world_size=1)
    cfg = TrainConfig(fanouts=list(FAN), batch_size=BS, dataset=ds.path, features="memory")
    got = run_inputs(cfg, ds, CSRGraph.from_dataset(ds), [batches], list(FAN), 300 * MiB, 0, 2, None, ctx=TwoRanks(),
                     device_memory=DeviceMemory(free=9 * GiB, total=80 * GiB))
    assert got.device_memory == DeviceMemory(free=3 * GiB, total=40 * GiB) and got.process_bytes == 300 * MiB
    alone = run_inputs(cfg, ds, CSRGraph.from_dataset(ds), [batches], list(FAN), 300 * MiB, 0, 1, None)
    assert alone.device_memory is None  # a CPU rank reads no device


@pytest.mark.slow
def test_dry_run_json_states_the_device_budget(runtime_layout, capsys):
    from moment.cli import main

    args = ["--layout", str(runtime_layout), "--nproc", "2", "--fanouts", "10,5", "--batch-size", str(BS),
            "--device", "cuda", "--device-memory-budget", "6GiB"]
    assert main(["train", "--dry-run", "--json", *args]) == 0
    out, err = capsys.readouterr()
    dev = json.loads(out)["memory"]["device"]
    # planned here for a GPU machine: said so, since this run would stop at its start here
    assert ("CUDA is not available here: this is the plan of the run on a machine with GPUs" in " ".join(err.split())
            ) == (not torch.cuda.is_available()), err
    assert dev["budget_bytes"] == 6 * GiB and dev["source"] == "given"
    assert dev["predicted_peak_bytes"] == sum(i["bytes"] for i in dev["items"]) <= 6 * GiB
    assert {i["name"] for i in dev["items"]} >= {"cuda context", "nccl buffers", "training", "batches", "gpu tier"}
    assert main(["train", "--dry-run", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "device memory budget per rank: 6.00 GiB (given)" in out
    assert main(["train", "--dry-run", *args[:-2], "--device-memory-budget", "1GiB"]) == 2
    assert "--device-memory-budget 1.00 GiB (given) is below the minimum" in " ".join(capsys.readouterr().err.split())


def test_the_metrics_state_the_device_budget_beside_the_measured_peak():
    from moment.runtime.run import device_memory

    planned = {"budget_bytes": 8 * GiB, "predicted_peak_bytes": 5 * GiB, "items": [{"name": "x", "bytes": 1}]}
    assert device_memory(planned, [3 * GiB, 4 * GiB]) == {**planned, "measured_peak_bytes": 4 * GiB}  # busiest rank
    assert device_memory(None, []) == {"budget_bytes": None, "predicted_peak_bytes": None, "items": [],
                                       "measured_peak_bytes": None}  # a CPU run: the same keys, null
