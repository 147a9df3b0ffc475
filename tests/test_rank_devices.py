"""The plan's GPUs reach the ranks. Each GPU bin records its plan GPU, slot and PCI
address; a rank serves the bins of its plan GPU on the CUDA device with that address (local-rank
order when nobody can tell, said so), never on a device another rank has (one map for the machine,
refused before any rank starts when there are more ranks than devices); runs report planned vs achieved
SSD shares per rank."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moment.errors import MomentError
from moment.placement.planning import CacheRows, bins_from_plan
from moment.planner.evaluate import evaluate
from moment.runtime.devices import ORDER, PCI, normalise_pci, plan_gpus_of, rank_devices
from moment.topology.devices import populate, strip
from moment.topology.profiles import load_profile
from moment.workload.spec import WorkloadSpec

BINS = [("gpu0", "0000:17:00.0"), ("gpu1", "0000:65:00.0")]
ADDR = ["0000:17:00.0", "0000:65:00.0", "0000:b1:00.0", "0000:ca:00.0"]  # four GPUs' addresses, in plan order
W = "--nproc N"


def _devices(local_ranks: int, bins, cuda) -> list[int | None]:
    return [r.device_index for r in rank_devices(local_ranks, bins, cuda, W)]


def test_pci_addresses_are_compared_in_one_form() -> None:
    assert normalise_pci("17:00.0") == normalise_pci("00000000:17:00.0") == "0000:17:00.0"
    assert normalise_pci("0000:B1:00.0") == "0000:b1:00.0"
    assert normalise_pci("garbage") is None and normalise_pci(None) is None


def test_a_rank_takes_the_cuda_device_with_its_plan_gpus_address() -> None:
    cuda = ["00000000:65:00.0", "00000000:17:00.0"]  # enumeration order differs from the plan's
    r0, r1 = rank_devices(2, BINS, cuda, W)
    assert (r0.plan_gpus, r0.device_index, r0.how) == (("gpu0",), 1, PCI)
    assert (r1.plan_gpus, r1.device_index, r1.how) == (("gpu1",), 0, PCI)
    assert "gpu1 on cuda:0 at 0000:65:00.0 (matched by pci bus id)" in r1.line("cuda:0")


def test_cuda_visible_devices_reordering_keeps_every_rank_on_its_plan_gpu() -> None:
    """CUDA_VISIBLE_DEVICES=2,0,3,1: cuda:i is no longer the i-th GPU of the plan."""
    bins = [(f"gpu{i}", a) for i, a in enumerate(ADDR)]
    cuda = [ADDR[2], ADDR[0], ADDR[3], ADDR[1]]
    got = rank_devices(4, bins, cuda, W)
    assert [r.device_index for r in got] == [1, 3, 0, 2] and {r.how for r in got} == {PCI}
    assert [cuda[r.device_index] for r in got] == ADDR


@pytest.mark.parametrize(("bins", "cuda", "why"), [
    ([("gpu0", None), ("gpu1", None)], ["0000:17:00.0", "0000:65:00.0"], "the plan has no PCI address for gpu1"),
    (BINS, ["0000:01:00.0", "0000:02:00.0"], "gpu1's address 0000:65:00.0 is not among"),
    (BINS, None, "no CUDA device"),
])
def test_without_an_address_match_local_rank_order_is_used_and_said(bins, cuda, why) -> None:
    r = rank_devices(2, bins, cuda, W)[1]
    assert r.plan_gpus == ("gpu1",) and r.how.startswith(ORDER) and why in r.how
    assert r.device_index == (None if cuda is None else 1)
    assert why in r.line("cuda:1")


def test_a_rank_without_an_address_takes_a_device_no_matched_rank_has() -> None:
    """gpu1's address is missing; gpu0 matched cuda:1, so rank 1 takes cuda:0 (its local-rank place, cuda:1,
    is rank 0's: NCCL would refuse "Duplicate GPU detected")."""
    r0, r1 = rank_devices(2, [("gpu0", ADDR[0]), ("gpu1", None)], [ADDR[1], ADDR[0]], W)
    assert (r0.device_index, r0.how) == (1, PCI)
    assert r1.device_index == 0 and r1.how == f"{ORDER} (the plan has no PCI address for gpu1)"


def test_matched_and_unmatched_ranks_never_share_a_device() -> None:
    bins = [("gpu0", ADDR[0]), ("gpu1", None), ("gpu2", ADDR[2]), ("gpu3", "0000:e3:00.0")]  # gpu3 is not here
    cuda = [ADDR[2], ADDR[0], ADDR[1], ADDR[3]]
    got = rank_devices(4, bins, cuda, W)
    assert [r.device_index for r in got] == [1, 2, 0, 3]
    assert [r.how == PCI for r in got] == [True, False, True, False]


def test_no_two_ranks_share_a_device_whatever_the_order_and_the_missing_addresses() -> None:
    """Every order of four visible GPUs, every subset of the plan's addresses missing, 1 to 4 ranks: all
    devices distinct, and every rank whose address is visible on its device."""
    for order in itertools.permutations(range(4)):
        cuda = [ADDR[i] for i in order]
        for missing in itertools.product((False, True), repeat=4):
            bins = [(f"gpu{i}", None if m else ADDR[i]) for i, m in enumerate(missing)]
            for n in range(1, 5):
                got = rank_devices(n, bins, cuda, W)
                assert len({r.device_index for r in got}) == n, (order, missing, n)
                assert all(cuda[r.device_index] == r.pci for r in got if r.how == PCI)
                if n == 4:
                    assert [r.how == PCI for r in got] == [not m for m in missing]


def test_more_ranks_than_visible_devices_are_refused_naming_both() -> None:
    bins = [(f"gpu{i}", a) for i, a in enumerate([*ADDR, "0000:e3:00.0"])]
    with pytest.raises(MomentError) as e:
        rank_devices(5, bins, ADDR, "--nproc 5")
    assert str(e.value).splitlines()[0] == (
        "--nproc 5: 5 ranks on this machine, but CUDA sees 4 device(s) (cuda:0 at 0000:17:00.0, cuda:1 at 0000:65:00.0, "
        "cuda:2 at 0000:b1:00.0, cuda:3 at 0000:ca:00.0), one rank per GPU at most")
    assert "run 4 rank(s) or fewer" in e.value.hint and "CUDA_VISIBLE_DEVICES" in e.value.hint
    # on CPU there is no such limit: every rank runs on the CPU
    assert _devices(5, bins, None) == [None] * 5


def test_a_gpu_listed_twice_is_one_gpu() -> None:
    """Two visible devices at one PCI address are one GPU to NCCL: never two ranks on them."""
    twice = [ADDR[0], ADDR[0], ADDR[1]]
    assert _devices(2, [("gpu0", None), ("gpu1", None)], twice) == [0, 2]
    assert _devices(2, [("gpu0", ADDR[1]), ("gpu1", ADDR[0])], twice) == [2, 0]
    with pytest.raises(MomentError) as e:
        rank_devices(3, [("gpu0", None), ("gpu1", None), ("gpu2", None)], twice, "--nproc 3")
    assert str(e.value).splitlines()[0] == ("--nproc 3: local ranks 0 and 2 would share one GPU: cuda:0 and "
                                            "cuda:1 are both at 0000:17:00.0, and NCCL refuses a GPU twice")
    assert "CUDA_VISIBLE_DEVICES" in e.value.hint


def test_a_plan_address_twice_goes_to_the_first_rank() -> None:
    r0, r1 = rank_devices(2, [("gpu0", ADDR[0]), ("gpu1", ADDR[0])], [ADDR[1], ADDR[0]], W)
    assert (r0.device_index, r0.how) == (1, PCI)
    assert r1.device_index == 0 and "gpu1's address 0000:17:00.0 is local rank 0's device already" in r1.how


def test_fewer_ranks_than_plan_gpus_share_them_round_robin() -> None:
    gpus = ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert [plan_gpus_of(r, 2, gpus) for r in (0, 1)] == [("gpu0", "gpu2"), ("gpu1", "gpu3")]
    r0, r1 = rank_devices(2, [(g, None) for g in gpus], ["0000:17:00.0", "0000:65:00.0"], W)
    assert (r0.device_index, r1.device_index) == (0, 1) and "several plan GPUs" in r0.how


def test_more_ranks_than_cuda_devices_are_refused_before_any_rank_starts(runtime_layout, tmp_path, monkeypatch,
                                                                         capsys):
    """`moment train --nproc N` refuses them before torchrun starts; under torchrun directly every rank
    refuses alike before the process group; on CPU there is no such limit."""
    from moment.cli import main
    from moment.cli.train_cmds import _precheck
    from moment.runtime import devices
    from moment.runtime.dist import AgreedError, setup

    monkeypatch.setattr(devices, "cuda_pci_addresses", lambda: [ADDR[0]])  # a machine with one GPU
    assert main(["train", "--nproc", "2", "--device", "cuda", "--layout", str(runtime_layout), "--run-dir",
                 str(tmp_path / "runs")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--nproc 2: 2 ranks on this machine, but CUDA sees 1 device(s) (cuda:0 at 0000:17:00.0)" in err, err
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(AgreedError, match=r"torchrun --nproc-per-node 2: 2 ranks on this machine, but CUDA sees 1 "):
        setup("cuda", [("gpu0", None), ("gpu1", None)])
    _precheck(["--layout", str(runtime_layout), "--device", "cpu"], 2)
    assert not (tmp_path / "runs").exists()


def test_bins_record_the_plan_gpu_its_slot_and_the_scanned_cards_address() -> None:
    """A machine scanned with a card in rc0-x16: the plan's GPU in that slot takes the card's address."""
    topo = load_profile("paper-machine-b")
    bare, _ = strip(topo)
    scanned = populate(bare, {"rc0-x16": "A100-PCIe-40GB"})
    data = scanned.model_dump()
    for n in data["nodes"]:
        if n["id"] == "gpu0":
            n["pci"] = "0000:17:00.0"
    scanned = type(scanned).model_validate(data)
    placement = {"rc0-x16": "A100-PCIe-40GB", "rc1-x16a": "A100-PCIe-40GB", "rc0-bay0": "P5510"}
    ev = evaluate(bare, placement, WorkloadSpec())
    bins = {b.name: b for b in bins_from_plan(ev, scanned, cache=CacheRows(gpu=10, cpu=10), row_bytes=64,
                                                ssd_stride=4096)}
    assert (bins["hbm:gpu0"].device, bins["hbm:gpu0"].slot, bins["hbm:gpu0"].pci) == ("gpu0", "rc0-x16", "0000:17:00.0")
    assert (bins["hbm:gpu1"].device, bins["hbm:gpu1"].slot, bins["hbm:gpu1"].pci) == ("gpu1", "rc1-x16a", None)
    assert (bins["ssd0"].device, bins["ssd0"].slot) == ("ssd0", "rc0-bay0")


@pytest.fixture(scope="module")
def layout(runtime_dataset, runtime_layout):
    return runtime_dataset, runtime_layout  # the session's, read-only


def test_each_local_rank_holds_its_plan_gpus_bins(layout) -> None:
    """The CPU stand-in of the GPU tier: local rank r holds exactly the rows of the bins it serves."""
    from moment.placement.reader import load_manifest
    from moment.runtime.gpu_tier import GpuTier
    from moment.runtime.store import RankPlace, StoreOptions, open_tiers

    ds, path = layout
    m = load_manifest(path)
    gpu_bins = [s.bin for s in m.shards if s.kind == "gpu"]
    held = {}
    for r in (0, 1):
        st = open_tiers(path, RankPlace(rank=r, local_rank=r, world_size=2, local_world_size=2),
                            StoreOptions(shared_cache=False))
        try:
            gpu = st.find(GpuTier)
            assert [s.bin for s, k in zip(m.shards, gpu.held.limit) if k > 0] == [gpu_bins[r]]
            held[r] = gpu.rows
            want = next(s.rows for s in m.shards if s.bin == gpu_bins[r])
            assert gpu.rows == want
        finally:
            st.close()
    assert held[0] > 0 and held[1] > 0


@pytest.mark.slow
def test_a_run_reports_planned_and_achieved_ssd_shares_per_rank(layout) -> None:
    """Planned: each SSD's storage share in the layout's manifest, among the SSDs; achieved: the share of
    the rows the run read that each SSD served. With row reads (one batch per read job) and the CPU cache
    holding the layout's CPU bin, those are every row the run's tiers counted as read from disk."""
    from moment.placement.reader import load_manifest
    from moment.runtime.config import TrainConfig
    from moment.runtime.train import train

    ds, path = layout
    m = train(TrainConfig(layout=path, fanouts=[5, 3], hidden=16, threads=1, quiet=True, cpu_cache_limit="10%",
                          io_shape="rows"))
    (r,) = m["per_rank"]
    assert r["rank"] == 0 and r["device"] == "cpu" and r["matched_by"].startswith(ORDER)
    shares = r["ssd_shares"]
    man = load_manifest(path)
    ssd = [s.bin for s in man.shards if s.kind == "ssd"]
    target = {b.name: b.target_share for b in man.bins}
    assert list(shares) == ssd
    assert [v["planned"] for v in shares.values()] == pytest.approx([target[b] / sum(target[x] for x in ssd)
                                                                     for b in ssd])
    rows = [v["rows"] for v in shares.values()]
    assert sum(rows) == m["tier_rows"]["ssd"] and min(rows) > 0
    assert [v["achieved"] for v in shares.values()] == pytest.approx([x / sum(rows) for x in rows], rel=1e-12)
    # DDAK spreads the SSD rows evenly here (equal targets): achieved follows planned
    assert np.allclose([v["achieved"] for v in shares.values()], [v["planned"] for v in shares.values()], atol=0.15)
