"""The peer tier: rows on the GPU tier of another rank of this node come from that rank, not from the layout.

Why: every local rank holds the GPU-cache bins of the plan GPUs it serves (moment.runtime.devices); a
row in a bin of another GPU of the same node is one device-to-device transfer away (NVLink or PCIe
peer to peer), far closer than the layout's file a rank would otherwise read it from. At start-up the
members of the node's group (node = rank // local_world_size, as torchrun numbers ranks) tell each
other what their GPU tier holds (`TierMap`: where each bin's rows start in the owner's tier and how
many it holds); then every completed batch is one round of the collective exchange
(moment.runtime.exchange): this rank asks each owner for rows of its tier, and serves what the others
ask of its own. NCCL on GPUs, gloo on CPU: the same code.

A rank takes part in every round, whether or not its batch needs a peer's row (the others may need
its rows), so the store calls `gather` for every batch it completes and `finish` at the end of each
sequence of batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from moment.runtime.exchange import ExchangeGroup, RowExchange


@dataclass
class TierMap:
    """What one rank's GPU tier holds: bin b's first `limit[b]` slots, from row `base[b]` of the tier."""

    base: np.ndarray
    limit: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.limit.sum())


class PeerTier:
    """The GPU tiers of the group's other members: which rows they hold, and a round of the exchange per
    batch that fetches them (and serves this rank's own tier, `own`, to the others)."""

    def __init__(self, group: ExchangeGroup, maps: list[TierMap], own: torch.Tensor):
        self.exchange = RowExchange(group)
        self._own = own
        me = group.index
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

    @property
    def served_rows(self) -> int:
        """Rows this rank's tier sent to the others."""
        return self.exchange.served_rows

    def lookup(self, bins: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mask of rows a peer holds, the member holding each, its row in that member's tier)."""
        mask = slots < self.limit[bins]
        b = bins[mask]
        return mask, self.owner[b], self.base[b] + slots[mask]

    def gather(self, owner: np.ndarray, idx: np.ndarray, out: torch.Tensor, pos: np.ndarray) -> None:
        """out[pos] = row idx of member owner's tier; one round of the exchange (collective: every member
        calls it once per batch, with nothing to ask as well)."""
        order = np.argsort(owner, kind="stable")
        owner, idx, pos = owner[order], idx[order], pos[order]
        cuts = np.searchsorted(owner, np.arange(self.exchange.group.size + 1))
        rows, _ = self.exchange.round([idx[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)], self._serve)
        if pos.size:
            out[torch.from_numpy(pos).to(out.device)] = rows.to(out.device)

    def finish(self) -> None:
        """This rank's sequence of batches is done: serve the others until theirs are."""
        self.exchange.finish(self._serve)

    def _serve(self, idx: torch.Tensor) -> torch.Tensor:
        return self._own[idx.to(self._own.device)]

    def close(self) -> None:
        self._own = None  # not a view of it: close may run in the garbage collector, at interpreter shutdown


def open_peers(own_map: TierMap, own: torch.Tensor, group: ExchangeGroup) -> PeerTier:
    """The peer tier of this rank, whose GPU tier is `own` (laid out as `own_map`). Collective: every
    member of `group` calls it."""
    maps = group.all_gather_object((own_map.base, own_map.limit))
    return PeerTier(group, [TierMap(b, lim) for b, lim in maps], own)
