"""The NaN guard without a host sync per step (moment.runtime.finite): each step records its loss and a code
on the device; a check every few steps (one all-reduce, the loss curve's) finds the first bad step of any
rank. The trainer's use of it is tests/test_train.py's non-finite tests and tests/test_train_launch.py's."""

from __future__ import annotations

import pytest
import torch

from moment.errors import MomentError
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


def test_in_lockstep_a_check_agrees_on_the_counts_first_and_a_rank_that_tracked_fewer_is_one_error():
    """Ranks stepping a DDP module together check at the loader's batches whatever each tracked: the counts go first
    (the larger of k and of -k), so a rank that tracked nothing (logging code's `if rank == 0`) makes every rank
    raise the same error, and none sends the losses' reduction, whose sizes would differ."""
    log = StepLog(0, 2)
    log.record(torch.tensor(1.0), torch.ones(2, 2), 1, 0, 0)
    sent = []

    def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        sent.append((tuple(t.shape), op))
        if op == "max":  # the other rank tracked `theirs`, and took as many batches as this one (none)
            return torch.maximum(t, torch.tensor([theirs, -theirs, 0, 0], dtype=t.dtype))
        return t + t  # the other rank's losses and codes as this one's

    theirs = 0
    with pytest.raises(MomentError, match=r"run.track was called for 0 steps on one rank and 1 on another since the "
                                          r"last check: .*\n  hint: call run.track\(loss\) after every optimizer step"):
        log.check(all_reduce, agree=True)
    assert sent == [((4,), "max")]
    sent.clear()
    theirs = 1
    losses, bad = log.check(all_reduce, agree=True)
    assert losses == [1.0] and bad is None and sent == [((4,), "max"), ((1 + 2 * 1,), "sum")]
    sent.clear()
    theirs = 0
    assert log.check(all_reduce, agree=True) == ([], None) and sent == [((4,), "max")]  # nothing since: counts only
    assert finite.check_due(31) and finite.check_due(63) and not finite.check_due(0) and not finite.check_due(32)


def test_ranks_that_left_their_train_loader_at_different_batches_are_told_so_not_that_they_skipped_a_track():
    """Rank 0 broke out after 2 batches, rank 1 ran all 9, each tracking every step it took: the counts differ, and
    the message blamed tracking ("every rank tracks each step it takes") where the cause is the uneven break."""
    log = StepLog(0, 2)
    for i in range(2):
        log.batches += 1
        log.record(torch.tensor(1.0), torch.ones(2, 2), i + 1, 0, i)

    def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return torch.maximum(t, torch.tensor([9, -9, 9, -9], dtype=t.dtype))  # the other rank: 9 batches, 9 steps

    with pytest.raises(MomentError, match=r"^one rank took 2 batches of its train loader and another 9 since the last "
                                          r"check: every rank iterates each train loader to its end, or breaks out "
                                          r"of it at the same batch\n"
                                          r"  hint: break out on every rank at the same batch"):
        log.check(all_reduce, agree=True)
    assert log.batches == 0  # counted afresh from the check on


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


# ---- a finite loss that diverges ------------------------------------------------------------------------

BLOWN = [1.49, 1.28e14, 1.16e13, 8.83e12, 1.79e13, 2.06e13, 1.46e13]  # `--lr 1e6`'s mean losses, step by step


def _trips(curve: list[float]) -> int | None:
    """The 1-based step at which the rule trips on `curve`, checked in one piece."""
    got = finite.divergence_at([], curve)
    return None if got is None else got[0] + 1


def test_a_diverging_loss_trips_the_rule_at_the_same_step_however_the_checks_cut_the_curve():
    assert finite.divergence_at([], BLOWN) == (finite.DIVERGE_STEPS, 1.49)  # step 4: steps 2, 3, 4 over the bound
    for cut in range(len(BLOWN)):  # a check after any step (or a resumed run's restored curve) changes nothing
        before, after = BLOWN[:cut], BLOWN[cut:]
        got = finite.divergence_at(before, after)  # (past step 4 only a run that went on would ask)
        assert got is not None and cut + got[0] + 1 == max(4, cut + 1), cut
    # a model that learns first, then blows up: the bound is the run's first losses', not the recent ones'
    late = [1.4, 1.2, 1.0, 0.9] + [0.8] * 50 + [50.0, 3e4, 2e5, 9e6, 4e7]
    assert _trips(late) == len(late) - 1  # 3e4, 2e5, 9e6: over 1e4 times 0.9 three steps in a row


def test_normal_training_never_trips_the_rule():
    g = torch.Generator().manual_seed(0)
    steps = torch.arange(2000, dtype=torch.float64)
    noise = torch.exp(torch.randn(2000, generator=g, dtype=torch.float64))  # each step x0.1 .. x10 or so
    curves = {
        "falling": (1.4 * torch.exp(-steps / 300) + 1e-3).tolist(),
        "noisy": (1.4 * noise).tolist(),
        "falling to near zero, then spiking": [1.4, 1.0, 0.5, 0.2] + [1e-6] * 100 + [1e-2] * 2 + [1e-6] * 10,
        "a brief rise x3": [1.4, 1.3, 1.2] + [1.1] * 20 + [3.3] * 10 + [1.0] * 20,
        "one step 1e5 times the first": [1.4, 1.3, 1.2, 1.4e5, 1.1, 1.4e5, 1.0],
        "link scale": [0.69, 0.68, 0.7, 0.66, 0.5, 0.45, 0.44],
        "a custom loss's scale": [3e-7, 2e-7, 2.5e-7, 1e-7, 1e-7],
        "large custom scale": [4e9, 3e9, 1e10, 2e9],
        "a loss that starts at zero": [0.0, 5.0, 50.0, 500.0, 5e4, 5e5, 5e6],
        "negative": [-1.0, -2.0, 3.0, 1e9, 1e9, 1e9],
        "two steps": [1.49, 1.28e14],
        "three steps": [1.49, 1.28e14, 1.16e13],
        "one step": [1.49],
        "none": [],
        "NaN": [1.49, float("nan"), float("nan"), float("nan")],  # `first_bad` names that one
    }
    for name, curve in curves.items():
        assert _trips(curve) is None, name


def test_a_check_names_the_step_where_the_loss_diverged_and_a_nan_before_it_wins(monkeypatch):
    """One rank: its check finds the divergence at step 4 (batch 3 of epoch 0, since step 2), and stops at
    the earlier of a NaN step and the divergence."""
    monkeypatch.setattr(finite, "CHECK_EVERY", 8)
    x = torch.ones(5, 2)

    def check(losses: list[float], curve: list[float] = ()):
        log = StepLog(0, 1)
        for i, v in enumerate(losses, start=len(curve) + 1):
            log.record(torch.tensor(v), x, i, 0, i - 1)
        return log.check(lambda t: t, curve)

    losses, stop = check(BLOWN)
    assert losses == pytest.approx(BLOWN)
    assert stop == finite.Divergence(4, 0, 3, since=2, loss=pytest.approx(8.83e12), reference=pytest.approx(1.49))
    assert check(BLOWN[2:], BLOWN[:2])[1].step == 4  # the curve so far comes from earlier checks
    _, stop = check([1.49, 1.28e14, float("nan"), 8.8e12, 1.7e13])
    assert stop == BadStep(3, 0, 2, (0,), False)  # the NaN at step 3 comes first
    _, stop = check(BLOWN[:5] + [float("nan")])
    assert isinstance(stop, finite.Divergence) and stop.step == 4
    assert check([1.4, 1.2, 1.1, 1.0, 0.9])[1] is None
