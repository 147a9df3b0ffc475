"""A training run's checkpoints: what they record about the run, resuming from one, saving one.

Why its own module: what makes a resume exact (the keys a checkpoint must share with the run, the position
and every generator's state) is one rule, kept apart from the loop that trains. A checkpoint of another
run is refused naming every difference; rank 0 alone reads and writes the file (under `moment train
--nnodes` only machine 0 has it) and every rank resumes from what it broadcasts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from moment.errors import MomentError
from moment.outputs import reason
from moment.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from moment.runtime.dist import AgreedError
from moment.runtime.run import Run

#: what a checkpoint written before a setting existed trained with (it records no value for it)
OLDER_RUNS = {"task": "node", "negatives": 1, "loss": None, "optimizer": "adam", "weight_decay": 0.0}
#: what a checkpoint must share with the run that resumes it: the data (dataset and layout identity), the
#: model's shape, and what decides the batches and updates (an exact resume repeats the uninterrupted run)
RESUME_KEYS = ("dataset_id", "layout_id", "model", "layers", "hidden", "feature_dim", "num_classes", "world_size",
               "batch_size", "seed", "fanouts", "lr", "task", "negatives", "loss", "optimizer", "weight_decay")


@dataclass
class Position:
    """Where a run stands, beside its weights: what a checkpoint saves and a resume restores."""

    epoch: int = 0
    next_batch: int = 0
    val_curve: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)


class Checkpoints:
    """`run`'s checkpoints of `module` and `opt` (in --checkpoint-dir; none without one)."""

    def __init__(self, run: Run, module: torch.nn.Module, opt: torch.optim.Optimizer):
        self.run, self.module, self.opt = run, module, opt
        self.cfg, self.ctx = run.cfg, run.ctx
        self.resumed_from: int | None = None

    def fields(self) -> dict[str, Any]:
        """What this run's checkpoints record about it (RESUME_KEYS, and where the data was, for messages)."""
        run, cfg = self.run, self.cfg
        layout = None
        if run.layout is not None and cfg.features == "tiered":
            layout = run.layout.manifest.layout_id()
        return {"dataset_id": run.dataset.dataset_id, "dataset": str(run.dataset.path), "layout_id": layout,
                "layout": str(cfg.layout) if layout else None, "model": cfg.model,
                "layers": len(run.fanouts), "hidden": cfg.resolved_hidden(),
                "feature_dim": run.dataset.feature_dim, "num_classes": run.dataset.num_classes,
                "world_size": self.ctx.world_size, "batch_size": run.batch_size, "seed": cfg.seed,
                "fanouts": run.fanouts, "lr": cfg.lr, "task": cfg.task, "negatives": cfg.negatives,
                "loss": cfg.loss, "optimizer": cfg.optimizer, "weight_decay": cfg.weight_decay}

    def check(self, ck: dict[str, Any]) -> None:
        """Refuse a checkpoint of another run, naming every difference: resuming another dataset's weights
        would report that run's accuracy as this one's, and another shape cannot load at all."""
        theirs, mine = {**OLDER_RUNS, **(ck.get("run") or {})}, self.fields()

        def show(k: str, run: dict[str, Any]) -> str:
            v = run.get(k)
            if v is None:
                return "not recorded" if k in ("dataset_id", "layout_id") and run is theirs else "none"
            if k in ("dataset_id", "layout_id"):
                where = run.get(k.removesuffix("_id"))
                return f"{v[:12]}" + (f" ({where})" if where else "")
            return repr(v)

        # the layout only decides where rows are read from: compared when both runs read one
        keys = [k for k in RESUME_KEYS if k != "layout_id" or (mine[k] and theirs.get(k))]
        diff = [f"{k.removesuffix('_id')} {show(k, theirs)} vs {show(k, mine)}" for k in keys if theirs.get(k) != mine[k]]
        if diff:
            raise AgreedError(
                f"the checkpoint is from another run (checkpoint vs this run): {'; '.join(diff)}",
                source=str(self.cfg.checkpoint_dir),
                hint="resume with the data and settings the checkpoint was made with, or start a new run "
                     "(another --checkpoint-dir, without --resume)")

    def resume(self, at: Position) -> str | None:
        """Load the checkpoint into the weights, `at` and the run (step, loss curve) on --resume or after a
        torchrun restart; returns what to tell the user."""
        cfg, restart = self.cfg, self.run.restarts
        if cfg.checkpoint_dir is None:
            if restart > 0:
                return (f"restart {restart}: a rank failed; there is no --checkpoint-dir, so training starts again "
                        "from epoch 1 (the progress before the failure is lost)")
            if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
                return "no --checkpoint-dir: a torchrun restart would start again from epoch 1"
            return None
        if not (cfg.resume or restart > 0):
            return None
        ck = self._shared()
        if ck is None:
            if cfg.resume and restart == 0:
                raise MomentError("--resume: no checkpoint here yet", source=str(cfg.checkpoint_dir))
            return f"restart {restart}: a rank failed before the first checkpoint; training starts again from epoch 1"
        try:
            self.module.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:  # the recorded settings matched, the weights did not
            raise AgreedError(f"the checkpoint's model does not fit this run's: {str(e).strip().splitlines()[-1]}",
                              source=str(cfg.checkpoint_dir), hint="start a new run (without --resume)") from None
        at.epoch, at.next_batch, self.run.step = ck["epoch"], ck["next_batch"], ck["step"]
        self.run.loss_curve, at.val_curve = list(ck["loss_curve"]), list(ck["val_curve"])
        at.epoch_seconds = list(ck.get("epoch_seconds", []))
        states = ck.get("rng_states") or []
        if self.ctx.rank < len(states):
            set_rng_state(states[self.ctx.rank], self.ctx.device)
        self.resumed_from = self.run.saved_step = self.run.step
        why = f"restart {restart}: a rank failed; " if restart > 0 else ""
        where = (f"all {cfg.epochs} epochs were done" if at.epoch >= cfg.epochs
                 else f"epoch {at.epoch + 1}, batch {at.next_batch}")
        return f"{why}resumed from step {self.run.step} ({where}) from {cfg.checkpoint_dir}"

    def _shared(self) -> dict[str, Any] | None:
        """Rank 0's last checkpoint (None: none yet), checked against this run there, on every rank."""
        got: tuple[str, Any] | None = None
        if self.ctx.is_main:
            try:
                ck = load_checkpoint(self.cfg.checkpoint_dir)
                if ck is not None:
                    self.check(ck)
                got = ("ok", ck)
            except MomentError as e:
                got = ("error", str(e))
        got = self.ctx.broadcast_object(got)
        if got[0] == "error":
            raise AgreedError(got[1])
        return got[1]

    def save(self, at: Position) -> None:
        """Collective (every rank, at the same step): the losses checked first, so nothing past a bad step is
        saved; every rank's generators gathered; rank 0 writes."""
        run = self.run
        run.sync_losses()
        states = self.ctx.all_gather_object(rng_state(self.ctx.device))
        payload = {
            "model": self.module.state_dict(), "optimizer": self.opt.state_dict(),
            "epoch": at.epoch, "next_batch": at.next_batch, "step": run.step,
            "loss_curve": run.loss_curve, "val_curve": at.val_curve, "epoch_seconds": at.epoch_seconds,
            "rng_states": states, "run": self.fields(), "config": self.cfg.to_dict(),
        }
        self.ctx.on_main(lambda: self._write(payload))
        run.saved_step = run.step

    def _write(self, payload: dict[str, Any]) -> None:
        """Write the checkpoint (rank 0); a failure (a full disk) names the file and keeps the last good one."""
        ck, saved = self.cfg.checkpoint_dir, self.run.saved_step
        try:
            save_checkpoint(ck, payload)
        except OSError as e:
            kept = (f"the last good checkpoint (step {saved}) is kept" if saved is not None
                    else "no checkpoint was written before")
            raise MomentError(f"cannot write the checkpoint at step {self.run.step}: {reason(e)}; {kept}",
                              source=str(Path(ck) / CHECKPOINT_NAME),
                              hint="free some space (or give another --checkpoint-dir), then continue with "
                                   f"--resume --checkpoint-dir {ck}" if saved is not None else
                                   "free some space or give another --checkpoint-dir") from None
