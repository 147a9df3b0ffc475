"""What a training run's ranks record for `moment doctor --gpu` (moment.runtime.gpucheck), when the
environment asks (`MOMENT_RECORD_RUN=DIR`): a digest of every training batch (the sampled ids and blocks,
the labels, the feature bytes as they reached the model) and, at the end, the GPUs on which the rank's
process holds a CUDA context (NVML). Two runs of the same batches (the tiered pipelined store and the
features in memory) must record the same digests, bit for bit on any device; each rank must hold a
context on its own GPU only.

Recording copies every batch to the host (a sync per step): it is a check, never on in a real run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from moment.errors import MomentError
from moment.io.device import process_gpus

# Imports inside functions: the record's writer loads only when the doctor asks for a record.

RECORD_ENV = "MOMENT_RECORD_RUN"


def digest(*tensors: torch.Tensor) -> str:
    """A short digest of the tensors' bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:24]


class RunRecord:
    """One rank's record; `of_env()` is None unless the environment asks for it."""

    def __init__(self, where: Path):
        self.where = where
        self.batches: list[dict[str, Any]] = []

    @classmethod
    def of_env(cls) -> RunRecord | None:
        where = os.environ.get(RECORD_ENV)
        return cls(Path(where)) if where else None

    def add(self, epoch: int, item: Any) -> None:
        """A training batch as the model sees it (moment.runtime.run.Batch)."""
        self.batches.append({"epoch": epoch, "batch": item.index, "ids": digest(item.n_id),
                             "blocks": digest(*(b.edge_index for b in item.blocks)), "labels": digest(item.y),
                             "features": digest(item.x)})

    def write(self, rank: int, device: torch.device, pci: str | None) -> Path:
        """DIR/run-rank<R>.json: the batches, the rank's device and its PCI address (as matched), and the GPUs
        NVML says its process holds a context on (None: NVML cannot tell)."""
        from moment.outputs import atomic_write

        try:
            self.where.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MomentError(f"{RECORD_ENV}={self.where}: cannot make the directory: {e.strerror}") from None
        out = self.where / f"run-rank{rank}.json"
        doc = {"rank": rank, "pid": os.getpid(), "device": str(device), "pci": pci, "batches": self.batches,
               "gpu_contexts": process_gpus(os.getpid())}
        atomic_write(out, json.dumps(doc), RECORD_ENV)
        return out
