"""Atomic checkpoints that let `--resume` continue exactly where training stopped.

A checkpoint holds the model, optimiser, position (epoch, step within the epoch) and every RNG
state that influences what comes next, so a resumed run draws the same batches and dropout masks.
"""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moment import testpoints
from moment.errors import MomentError
from moment.outputs import atomic_file

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

if TYPE_CHECKING:
    import torch

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
#: the first line of a checkpoint: the SHA-256 of the torch.save bytes after it. torch.load reads a flipped bit
#: in a weight as a valid number, and the resumed run then trained on silently from damaged weights
CHECKSUM_LINE = b"MOMENT-CHECKPOINT sha256="


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """Every generator this rank draws from; of CUDA's, only its own `device`'s (a torch.device; None or CPU:
    none), so a resume on a machine that sees fewer GPUs still finds each rank's state."""
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def own_cuda_state(saved: Any, device_index: int | None) -> Any | None:
    """The CUDA generator state a rank restores on its device `device_index` (None: the rank runs on CPU,
    nothing to restore). `saved`: the rank's own device's state, or, in older checkpoints, a list of every
    GPU's that the rank saw when it saved (by device index: the rank's device's entry, when there is one)."""
    if device_index is None or saved is None:
        return None
    if isinstance(saved, (list, tuple)):
        return saved[device_index] if device_index < len(saved) else None
    return saved


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore what `rng_state` saved; CUDA's generator on this rank's own `device` only."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    index = _cuda_index(device)
    cuda = own_cuda_state(state.get("cuda"), index)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, torch.device("cuda", index))


def _cuda_index(device: torch.device | None) -> int | None:
    """`device`'s CUDA index (None: not a CUDA device; "cuda" alone is the current one)."""
    import torch

    if device is None or device.type != "cuda":
        return None
    return torch.cuda.current_device() if device.index is None else device.index


def save_checkpoint(directory: str | Path, payload: dict[str, Any]) -> Path:
    """Write `payload` to DIR/checkpoint.pt with `atomic_file` (never half-written; the previous one stays
    until the new one is complete). Serialised in memory first: writing to the file itself, torch turns a
    full disk into "unexpected pos" (a RuntimeError); written here, it is the OSError (ENOSPC) it is."""
    import torch

    buf = io.BytesIO()
    torch.save({"format": FORMAT_VERSION, **payload}, buf)
    final = Path(directory) / CHECKPOINT_NAME
    with atomic_file(final) as f:
        testpoints.reach("checkpoint-write")
        f.write(CHECKSUM_LINE + hashlib.sha256(buf.getbuffer()).hexdigest().encode() + b"\n")
        f.write(buf.getbuffer())
    return final


def load_checkpoint(directory: str | Path) -> dict[str, Any] | None:
    """The last complete checkpoint in DIR, or None if there is none yet."""
    import torch

    path = Path(directory) / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise MomentError(f"cannot read checkpoint: {e.strerror}", source=str(path)) from None
    body = memoryview(raw)
    if raw.startswith(CHECKSUM_LINE):  # (a checkpoint of an earlier version has none: read as it is)
        end = len(CHECKSUM_LINE) + 64
        body = body[end + 1 :]
        if hashlib.sha256(body).hexdigest().encode() != raw[len(CHECKSUM_LINE) : end]:
            raise MomentError("the checkpoint is damaged: its bytes differ from those written (checksum)",
                              source=str(path), hint="resume from an intact copy, or train again without --resume")
    try:
        data = torch.load(io.BytesIO(body), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - a corrupt file is a user-visible condition, not a crash
        raise MomentError(f"cannot read checkpoint: {e}", source=str(path)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        raise MomentError("not a Moment checkpoint (or from an incompatible version)", source=str(path))
    return data
