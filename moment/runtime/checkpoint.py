"""Atomic checkpoints that let `--resume` continue exactly where training stopped.

A checkpoint holds the model, optimiser, position (epoch, step within the epoch) and every RNG
state that influences what comes next, so a resumed run draws the same batches and dropout masks.
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import numpy as np

from moment import testpoints
from moment.errors import MomentError
from moment.outputs import atomic_file

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def rng_state() -> dict[str, Any]:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        f.write(buf.getbuffer())
    return final


def load_checkpoint(directory: str | Path) -> dict[str, Any] | None:
    """The last complete checkpoint in DIR, or None if there is none yet."""
    import torch

    path = Path(directory) / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - a corrupt file is a user-visible condition, not a crash
        raise MomentError(f"cannot read checkpoint: {e}", source=str(path)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        raise MomentError("not a Moment checkpoint (or from an incompatible version)", source=str(path))
    return data
