"""A checkpoint keeps each rank's own CUDA generator only, so a resume on a machine that sees fewer GPUs
(another CUDA_VISIBLE_DEVICES, a smaller machine) restores every rank's state instead of raising
IndexError. The choice is `own_cuda_state`, a pure function; the CUDA calls around it run here against a
stand-in for `torch.cuda` (tests/test_cuda_layer.py runs them on a GPU)."""

from __future__ import annotations

import pytest
import torch

from moment import testpoints
from moment.runtime.checkpoint import load_checkpoint, own_cuda_state, rng_state, save_checkpoint, set_rng_state

OLD = ["s0", "s1", "s2", "s3"]  # a checkpoint from before: every GPU's state the rank saw (4 GPUs)


@pytest.mark.parametrize(("saved", "index", "want"), [
    ("mine", 1, "mine"),  # the rank's own device's state, whatever its index now
    ("mine", 5, "mine"),
    (OLD, 1, "s1"),  # the old format on fewer GPUs: the rank's device's entry
    (OLD, 3, "s3"),
    (OLD[:2], 3, None),  # the old format from fewer GPUs than this device's index: nothing to take
    ("mine", None, None),  # the rank runs on CPU now
    (None, 0, None),  # saved on CPU
])
def test_a_rank_restores_its_own_devices_state(saved, index, want) -> None:
    assert own_cuda_state(saved, index) == want


class FakeCuda:
    """`torch.cuda` on a machine with `n` GPUs, as far as the generators go: a device's state is its index
    and how often it was set; a device beyond the machine's raises IndexError, as torch's does."""

    def __init__(self, n: int) -> None:
        self.n, self.states, self.current = n, {i: torch.tensor([i]) for i in range(n)}, 0

    def _index(self, device) -> int:
        i = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
        i = self.current if i is None else i
        if i >= self.n:
            raise IndexError(f"cuda:{i} on a machine with {self.n} GPUs")
        return i

    def install(self, monkeypatch) -> FakeCuda:
        for name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
                     "is_available", "device_count", "current_device"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda") -> None:
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(i) for i in range(self.n)]

    def set_rng_state_all(self, states) -> None:
        for i, s in enumerate(states):
            self.set_rng_state(s, torch.device("cuda", i))

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.n

    def current_device(self) -> int:
        return self.current


def test_a_checkpoint_from_four_gpus_resumes_on_two(tmp_path, monkeypatch) -> None:
    """Saved by the rank on cuda:3 of a 4-GPU machine, resumed by that rank on cuda:1 of a 2-GPU one."""
    four = FakeCuda(4).install(monkeypatch)
    four.states[3] = torch.tensor([33])
    save_checkpoint(tmp_path, {"rng": rng_state(torch.device("cuda", 3))})
    state = load_checkpoint(tmp_path)["rng"]
    assert torch.equal(state["cuda"], torch.tensor([33]))  # its own device's state, not every GPU's
    two = FakeCuda(2).install(monkeypatch)
    set_rng_state(state, torch.device("cuda", 1))
    assert [two.states[i].item() for i in range(2)] == [0, 33]


def test_an_old_checkpoint_with_every_gpus_state_resumes_on_fewer(tmp_path, monkeypatch) -> None:
    state = {**rng_state(), "cuda": [torch.tensor([10 + i]) for i in range(4)]}
    two = FakeCuda(2).install(monkeypatch)
    set_rng_state(state, torch.device("cuda", 1))
    assert [two.states[i].item() for i in range(2)] == [0, 11]
    two.current = 1
    set_rng_state({**state, "cuda": torch.tensor([7])}, torch.device("cuda"))  # "cuda" alone: the current one
    assert [two.states[i].item() for i in range(2)] == [0, 7]


def test_a_cpu_rank_saves_and_restores_no_cuda_state(monkeypatch) -> None:
    cuda = FakeCuda(2).install(monkeypatch)
    state = rng_state(torch.device("cpu"))
    assert "cuda" not in state and "cuda" not in rng_state()
    set_rng_state({**state, "cuda": torch.tensor([9])}, torch.device("cpu"))  # a GPU run resumed on CPU
    assert [cuda.states[i].item() for i in range(2)] == [0, 1]


@pytest.mark.parametrize("env, fires", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, True),  # the last rank by default
    ({"RANK": "0", "WORLD_SIZE": "2"}, False),
    ({"RANK": "0", "WORLD_SIZE": "2", testpoints.RANK_ENV: "0"}, True),  # the rank the point's own setting names
    ({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "1"}, False),  # a restart gets past it
    ({}, True),  # one process, no torchrun: rank 0 of 1
])
def test_a_point_every_rank_reaches_fires_on_the_rank_its_setting_names(monkeypatch, env, fires):
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", testpoints.RANK_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv(testpoints.ENOSPC_ENV, "train-step:3")
    testpoints.reach_rank("train-step", 2)  # before the count: nothing anywhere
    if fires:
        with pytest.raises(OSError):
            testpoints.reach_rank("train-step", 3)
    else:
        testpoints.reach_rank("train-step", 3)


def test_a_damaged_checkpoint_is_refused_and_one_of_an_earlier_version_still_reads(tmp_path) -> None:
    """A flipped bit in a weight is a valid float to torch.load: the checksum line is what finds it."""
    from moment.errors import MomentError
    from moment.runtime.checkpoint import CHECKPOINT_NAME, CHECKSUM_LINE, FORMAT_VERSION

    weights = torch.arange(4096, dtype=torch.float32)
    path = save_checkpoint(tmp_path, {"model": {"w": weights}, "step": 32})
    assert torch.equal(load_checkpoint(tmp_path)["model"]["w"], weights)
    raw = bytearray(path.read_bytes())
    body = raw.index(b"\n") + 1
    raw[body + len(raw[body:]) // 2] ^= 0x10  # a mantissa bit, mid-file: inside the weights
    path.write_bytes(raw)
    with pytest.raises(MomentError, match=f"{CHECKPOINT_NAME}: the checkpoint is damaged: its bytes differ"):
        load_checkpoint(tmp_path)
    older = tmp_path / "older"  # written before the checksum line: no line, read as it is
    older.mkdir()
    torch.save({"format": FORMAT_VERSION, "step": 7}, older / CHECKPOINT_NAME)
    assert load_checkpoint(older)["step"] == 7 and not (older / CHECKPOINT_NAME).read_bytes().startswith(CHECKSUM_LINE)
