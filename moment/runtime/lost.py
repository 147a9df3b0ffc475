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
    """Another rank's process is gone while this one exchanged feature rows with it."""


@contextlib.contextmanager
def peer_loss() -> Iterator[None]:
    """Around a collective of the feature exchange: a peer that is gone is one Moment message naming what
    every rank must do, not gloo's or NCCL's."""
    try:
        yield
    except MomentError:
        raise
    except Exception as e:  # noqa: BLE001 - only a lost peer is translated; the rest re-raised
        if not peer_lost(e):
            raise
        raise PeerLeft(
            "another rank left the run while this one was exchanging feature rows with it: it failed (its own "
            "message says why) or its script ended without closing the run",
            hint="every rank iterates each loader to its end (or breaks out of it at the same batch) and calls "
                 "run.close() before it exits; the exchange serves the others until all have") from None
