"""The peer tier: rows on the GPU tier of another rank of this node come from that rank, not from the layout.

Why: every local rank holds the GPU-cache bins of the plan GPUs it serves (moment.runtime.devices); a
row in a bin of another GPU of the same node is one device-to-device transfer away (NVLink or PCIe
peer to peer), far closer than the layout's file a rank would otherwise read it from. At start-up the
members of the node's group (node = rank // local_world_size, as torchrun numbers ranks) tell each
other what their GPU tier holds (`TierMap`: where each bin's rows start in the owner's tier and how
many it holds); then every completed batch is one round of the collective exchange
(moment.runtime.exchange): this rank asks each owner for rows of its tier, and serves what the others
ask of its own. NCCL on GPUs, gloo on CPU: the same code. The rounds are the batch's `fetches`, which the
rank's collective thread starts and finishes (moment.runtime.sources.Staged).

`PeerTier` is the chain's tier (moment.runtime.tier) over the CPU cache: it takes part in a round for
every batch it completes, whether or not the batch needs a peer's row (the others may need its rows),
and serves the others in `finish` at the end of each sequence of batches. A round's rows move in
bounded chunks and are written straight into the batch; what a round holds is what the exchange
states (`RowExchange.round_bytes`), and the memory budget charges it.
"""

from __future__ import annotations

import numpy as np
import torch

from moment.io.device import take_rows
from moment.runtime.exchange import ExchangeGroup
from moment.runtime.exchange_tier import ExchangeTier
from moment.runtime.gpu_tier import TierMap
from moment.runtime.tier import LayoutRows, Tier


class PeerMap:
    """Which rows the group's other members hold on their GPU tiers, from every member's `TierMap`."""

    def __init__(self, maps: list[TierMap], me: int):
        nbins = maps[me].limit.shape[0]
        self.owner = np.full(nbins, -1, np.int64)  # bin -> member whose tier holds it
        self.base, self.limit = np.zeros(nbins, np.int64), np.zeros(nbins, np.int64)
        for i, m in enumerate(maps):
            held = m.limit > 0
            if i != me:  # this rank's own bins are its GPU tier, not a peer's
                self.owner[held], self.base[held], self.limit[held] = i, m.base[held], m.limit[held]

    @property
    def rows(self) -> int:
        """Rows the other members hold."""
        return int(self.limit.sum())

    def lookup(self, bins: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mask of rows a peer holds, the member holding each, its row in that member's tier)."""
        mask = slots < self.limit[bins]
        b = bins[mask]
        return mask, self.owner[b], self.base[b] + slots[mask]


def gather_peer_map(own: TierMap, group: ExchangeGroup) -> PeerMap:
    """What the group's other members hold, told by each (collective: every member calls it at start-up)."""
    maps = group.all_gather_object((own.base, own.limit))
    return PeerMap([TierMap(b, lim) for b, lim in maps], group.index)


class PeerTier(ExchangeTier):
    """The GPU tiers of the group's other members over `next`: a round of the exchange per completed batch
    fetches their rows (and serves this rank's own tier, `own`, to the others)."""

    name = "peer"
    below_holds = True  # the layout's files hold every GPU bin's rows: a batch not taken in step reads them there

    def __init__(self, rows: LayoutRows, next: Tier, device: torch.device | str, group: ExchangeGroup,
                 peers: PeerMap, own: torch.Tensor):
        super().__init__(rows, next, device, group)
        self.peers, self._own = peers, own

    @property
    def rows(self) -> int:
        """Rows the other members hold."""
        return self.peers.rows

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not self.peers.rows:
            return None
        r = self.layout_rows
        return self.peers.lookup(r.bin[ids], r.slot[ids])

    def serve(self, idx: torch.Tensor) -> torch.Tensor:
        return take_rows(self._own, idx)

    def own_memory(self) -> dict[str, int]:
        return {"exchange": self.exchange.peak_bytes}

    def release(self) -> None:
        self._own = None  # not a view of it: close may run in the garbage collector, at interpreter shutdown
