"""A rank that left the run: what gloo and NCCL say when a peer process is gone, said as Moment says it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from moment.errors import MomentError

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

#: what gloo/NCCL say when a peer process is gone
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted")


def peer_lost(e: BaseException) -> bool:
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", None)
    text = str(e)
    return (dist_error is not None and isinstance(e, dist_error)) or any(s in text for s in PEER_GONE)


class PeerLeft(MomentError):
    """Another rank's process is gone while this one was in a collective with it."""


class LeftRun(MomentError):
    """This rank left the run (`close()` or `abandon()`) while one of its loaders was still open: that loader
    exchanges no more rows."""

    def __init__(self) -> None:
        super().__init__("the run is closed on this rank (close() or abandon()): its loaders read no more batches",
                         hint="open a new run (moment.open_run) to read more")


#: what a rank was doing when a peer left: the feature exchange's rounds (the default)
EXCHANGING = "exchanging feature rows with it"
#: ... or one of the run's own collectives (moment.runtime.dist.DistContext: close, memory, the loss checks, a
#: write's gathers)
WAITING = "waiting for it in one of the run's collectives (a loss check, run.memory(), run.close(), a write's gather)"


@contextlib.contextmanager
def peer_loss(doing: str = EXCHANGING) -> Iterator[None]:
    """Around a collective Moment issues (the feature exchange's, and DistContext's): a peer that is gone is
    one Moment message naming what every rank must do, not gloo's or NCCL's. One rule for every collective, so
    a rank that left is said alike wherever the others meet its absence; `doing`: what this rank was doing."""
    try:
        yield
    except MomentError:
        raise
    except Exception as e:  # noqa: BLE001 - only a lost peer is translated; the rest re-raised
        if not peer_lost(e):
            raise
        raise PeerLeft(
            f"another rank left the run while this one was {doing}: it failed (its own "
            "message says why) or its script ended without closing the run",
            hint="every rank iterates each loader to its end (or breaks out of it at the same batch) and calls "
                 "run.close() before it exits; the exchange serves the others until all have") from None
