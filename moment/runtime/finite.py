"""The training steps' losses and whether they were finite, kept on the device and checked every few steps.

Why not every step: reading a loss on the host waits for the device to finish the step (a host sync that
stalls the queue of kernels on a GPU), and agreeing across ranks costs a collective. So each step only
records, on the device, its loss and a code (0: finite; 1: the loss is not, the batch's features are; 2:
the features are not, so neither is the loss), and every `CHECK_EVERY` steps, before every checkpoint and
at the end of an epoch, one all-reduce (the loss curve's, which the run does anyway) carries the losses
and every rank's codes: every rank then knows the first bad step and stops there together, with one
message. Training runs on at most `CHECK_EVERY - 1` steps past a bad one, and nothing after it is saved.

Once the ranks step together (their module in DDP), the checks come every `CHECK_EVERY` batches of the train
loader rather than of each rank's tracked steps, and each first agrees on every rank's count (a tiny all-reduce):
a loop that tracks on rank 0 alone (as logging code does) is one message on every rank, where checks counted by
each rank's own steps issued collectives the others never joined (gloo aborts on that; NCCL waits for ever).
Ranks that may leave a loader at different batches (no DDP: lookups, inference) keep the checks at their own
steps, with no collective where no rank tracked anything, so a rank that left early is never waited for.

A finite loss can diverge too (`--lr 1e6`: 1.5, then 1e14, 1e13, ... to the end): after a check every rank
holds the same mean-loss curve, so the rule `divergence_at` applied to it stops every rank at the same step with
no collective of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from moment.errors import MomentError

#: steps (or, in lockstep, a train loader's batches) between checks of the losses (each: one all-reduce, two
#: in lockstep, and one host sync)
CHECK_EVERY = 32


def check_due(batch: int) -> bool:
    """In lockstep: whether the losses are checked once the loop is done with a train loader's batch `batch` (its
    index in the epoch, the same on every rank)."""
    return (batch + 1) % CHECK_EVERY == 0


FINE, DIVERGED, BAD_FEATURES = 0, 1, 2

#: Divergence: DIVERGE_STEPS steps in a row whose mean loss is over DIVERGE_FACTOR times the run's reference
#: loss, the smallest of its first REFERENCE_STEPS steps. Why these: the first steps are a fresh model's loss,
#: whatever the loss function's scale (node or link, a user's own); their smallest is not raised by a model
#: that blows up at step 2, as their median would be; training that learns or is noisy stays within a few
#: times it, and only a model blowing up goes four orders of magnitude over it; several steps in a row, so a
#: brief spike is not one. A reference <= 0 (a loss that can be 0 or negative) has no scale: never checked.
DIVERGE_FACTOR = 1e4
DIVERGE_STEPS = 3
REFERENCE_STEPS = 4


def step_code(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The step's code, on the device, without a host sync: the sum of the features is not finite exactly
    when one of them is not (or they are so large that it overflows: garbage as well), and costs one pass."""
    ok_x = torch.isfinite(x.sum())
    return torch.where(torch.isfinite(loss), FINE, torch.where(ok_x, DIVERGED, BAD_FEATURES))


@dataclass(frozen=True)
class BadStep:
    """The first step whose loss was not finite on some rank."""

    step: int  # the run's step number (1-based)
    epoch: int  # 0-based
    batch: int  # 0-based index in the epoch
    ranks: tuple[int, ...]
    bad_features: bool  # a rank's features for it were not finite


@dataclass(frozen=True)
class Divergence:
    """The step at which the finite mean loss had grown past the divergence rule's bound (`divergence_at`)."""

    step: int  # the run's step number (1-based): the last of the DIVERGE_STEPS steps over the bound
    epoch: int  # 0-based
    batch: int  # 0-based index in the epoch
    since: int  # the first of those steps
    loss: float  # the mean loss at `step`
    reference: float  # the run's reference loss (the smallest of its first REFERENCE_STEPS)


def divergence_at(curve: Sequence[float], new: list[float]) -> tuple[int, float] | None:
    """Where the rule trips among the mean losses `new` that follow the run's `curve`: the index in `new` of
    the last of the DIVERGE_STEPS steps over the bound, and the reference (None: nowhere). A pure
    function of the losses up to each step, so every rank, and a resumed run, trips at the same step; it reads
    only the curve's first and last few losses (a long run's check costs no more)."""
    n = len(curve)
    head = list(curve[:REFERENCE_STEPS]) + new[:max(0, REFERENCE_STEPS - n)]
    seq = list(curve[max(0, n - DIVERGE_STEPS + 1):]) + new  # the steps a window of the new ones reaches
    off = len(seq) - len(new)
    for j in range(len(new)):
        ref = min(head[:n + j + 1])
        window = seq[max(0, off + j - DIVERGE_STEPS + 1):off + j + 1]
        # a NaN is never over the bound: `first_bad` names that step
        if ref > 0 and len(window) == DIVERGE_STEPS and all(v > DIVERGE_FACTOR * ref for v in window):
            return j, ref
    return None


def first_bad(codes: list[list[float]], where: list[tuple[int, int, int]]) -> BadStep | None:
    """The first step (column) with a nonzero code on any rank (row), from every rank's codes; `where`
    names each column's (step, epoch, batch)."""
    for j, w in enumerate(where):
        bad = tuple(r for r, row in enumerate(codes) if row[j])
        if bad:
            return BadStep(*w, ranks=bad, bad_features=any(codes[r][j] == BAD_FEATURES for r in bad))
    return None


class StepLog:
    """The steps since the last check: their losses and codes on the device, where each was."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self._losses: list[torch.Tensor] = []
        self._codes: list[torch.Tensor] = []
        self._where: list[tuple[int, int, int]] = []
        self.batches = 0  # train batches handed out since the last check (the run counts them)

    def __len__(self) -> int:
        return len(self._losses)

    @property
    def due(self) -> bool:
        return len(self) >= CHECK_EVERY

    def record(self, loss: torch.Tensor, x: torch.Tensor, step: int, epoch: int, batch: int) -> None:
        self._losses.append(loss.detach())
        self._codes.append(step_code(loss.detach(), x))
        self._where.append((step, epoch, batch))

    def check(self, all_reduce: Callable[..., torch.Tensor], curve: Sequence[float] = (), *, agree: bool = False
              ) -> tuple[list[float], BadStep | Divergence | None]:
        """One all-reduce (collective: every rank calls it after the same steps): the mean loss of each step
        over the ranks, and the first step to stop at: a bad step of any rank, or where the mean losses
        diverged after the run's `curve` so far (None: neither). `agree` (lockstep: every rank calls it at the
        same batch, whatever it tracked): the ranks' counts first (`all_reduce(t, "max")`), unequal ones a
        MomentError on every rank, naming why where it is that: the ranks took different numbers of train batches
        (one left its train loader before the others: fine while none tracks), else some skipped a `track`."""
        k, b = len(self), self.batches
        self.batches = 0
        if agree:
            t = torch.tensor([k, -k, b, -b], dtype=torch.float64)
            most, fewest, most_b, fewest_b = (int(v) for v in all_reduce(t, "max").tolist())
            if most != -fewest and most_b != -fewest_b:  # why: the ranks left the loader at different batches
                raise MomentError(f"one rank took {-fewest_b} batches of its train loader and another {most_b} since "
                                  "the last check: every rank iterates each train loader to its end, or breaks out of "
                                  "it at the same batch",
                                  hint="break out on every rank at the same batch (DDP needs its ranks to step "
                                       "together too), e.g. at a step count all of them agree on")
            if most != -fewest:
                raise MomentError(f"run.track was called for {-fewest} steps on one rank and {most} on another since "
                                  "the last check: every rank tracks each step it takes",
                                  hint="call run.track(loss) after every optimizer step, on every rank")
        if not k:
            return [], None
        mine = torch.stack(self._losses).to(torch.float64)
        codes = torch.zeros(self.world_size, k, dtype=torch.float64, device=mine.device)
        codes[self.rank] = torch.stack(self._codes).to(torch.float64)
        got = all_reduce(torch.cat([mine, codes.flatten()])).cpu().tolist()
        where, self._losses, self._codes, self._where = self._where, [], [], []
        rows = [got[k + r * k: k + (r + 1) * k] for r in range(self.world_size)]
        losses = [v / self.world_size for v in got[:k]]
        bad = first_bad(rows, where)
        upto = k if bad is None else where.index((bad.step, bad.epoch, bad.batch))
        d = divergence_at(curve, losses[:upto])
        if d is None:
            return losses, bad
        j, ref = d
        return losses, Divergence(*where[j], since=where[j][0] - DIVERGE_STEPS + 1, loss=losses[j], reference=ref)
