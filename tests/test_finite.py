"""The NaN guard without a host sync per step (moment.runtime.finite): each step records its loss and a code
on the device; a check every few steps (one all-reduce, the loss curve's) finds the first bad step of any
rank. The trainer's use of it is tests/test_train.py's non-finite tests and tests/test_train_launch.py's."""

from __future__ import annotations

import pytest
import torch

from moment.runtime import finite
from moment.runtime.finite import BAD_FEATURES, DIVERGED, FINE, BadStep, StepLog, first_bad, step_code


class NoHost(torch.Tensor):
    """A tensor whose values may not be read on the host: what a GPU tensor costs a sync to read."""

    READS = {torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu,
             torch.Tensor.__float__, torch.Tensor.__int__}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls.READS:
            raise AssertionError(f"{func.__name__} reads the device's value on the host")
        return super().__torch_function__(func, types, args, kwargs or {})


def dev(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(NoHost)


def test_a_step_is_coded_on_the_device_without_reading_it():
    ok, nan = torch.ones(4, 3), torch.ones(4, 3)
    nan[2, 1] = float("nan")
    cases = [(1.5, ok, FINE), (float("nan"), ok, DIVERGED), (float("inf"), ok, DIVERGED),
             (float("nan"), nan, BAD_FEATURES), (0.7, nan, FINE)]  # a finite loss is a good step
    for loss, x, want in cases:
        code = step_code(dev(torch.tensor(loss)), dev(x))
        assert int(code.as_subclass(torch.Tensor)) == want, (loss, want)
    log = StepLog(0, 1)
    log.record(dev(torch.tensor(0.5)), dev(ok), 1, 0, 0)  # recording reads nothing either
    assert len(log) == 1 and not log.due


def test_the_first_bad_step_of_any_rank_is_named_with_its_ranks_and_cause():
    where = [(11, 0, 10), (12, 0, 11), (13, 1, 0)]
    assert first_bad([[0, 0, 0], [0, 0, 0]], where) is None
    assert first_bad([[0, 0, 1], [0, 2, 1]], where) == BadStep(12, 0, 11, (1,), True)
    assert first_bad([[0, 1, 1], [0, 1, 2]], where) == BadStep(12, 0, 11, (0, 1), False)


def test_a_check_is_one_reduction_of_the_losses_and_every_ranks_codes(monkeypatch):
    """Two ranks simulated by one reduction that adds the other rank's vector: the mean losses come back in
    step order and rank 1's bad step (its second) is found, though rank 0's were all finite."""
    monkeypatch.setattr(finite, "CHECK_EVERY", 3)
    ranks = [StepLog(0, 2), StepLog(1, 2)]
    x = torch.ones(5, 2)
    for step, (a, b) in enumerate([(1.0, 3.0), (2.0, float("nan")), (4.0, 8.0)], start=1):
        ranks[0].record(torch.tensor(a), x, step, 0, step - 1)
        ranks[1].record(torch.tensor(b), x, step, 0, step - 1)
    assert ranks[0].due
    sent = []

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        sent.append(t)
        return t if len(sent) % 2 == 0 else t + other  # rank 0 first: it gets rank 1's vector added

    other = torch.cat([torch.tensor([3.0, 0.0, 8.0], dtype=torch.float64),
                       torch.tensor([0, 0, 0, 0, 1, 0], dtype=torch.float64)])
    losses, bad = ranks[0].check(all_reduce)
    assert losses == [2.0, 1.0, 6.0] and bad == BadStep(2, 0, 1, (1,), False)
    assert len(sent) == 1 and sent[0].shape == (3 + 2 * 3,)  # one reduction: 3 losses, 2 ranks x 3 codes
    assert len(ranks[0]) == 0 and ranks[0].check(all_reduce) == ([], None)  # nothing since: no collective


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the sync debug mode)")
def test_recording_steps_on_cuda_never_synchronises():
    log = StepLog(0, 1)
    x = torch.ones(100, 8, device="cuda")
    loss = torch.tensor(0.3, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(5):
            log.record(loss * i, x, i + 1, 0, i)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert log.check(lambda t: t)[1] is None
