"""A tier whose rows other members of an exchange group hold: the peer tier and the remote tier.

Why one class: both take part in one round of the collective exchange (moment.runtime.exchange) per completed
batch, asking the members that hold a batch's rows for them and serving what the others ask, whether or not
the batch needs a row. They differ only in whom they ask for what (`locate`: this node's other GPUs' tiers,
or the machines of a split layout) and in how they serve (`serve`: from the rank's GPU tier, or read from
its machine's layout), which each subclass states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moment.runtime.exchange import ExchangeGroup, RowExchange
from moment.runtime.tier import ExchangeFetch, LayoutRows, Tier, at


@dataclass
class _Part:
    pos: np.ndarray  # positions in the batch another member serves
    owner: np.ndarray  # the member holding each
    key: np.ndarray  # what that member is asked for (its tier's row, or the node id)
    inner: Any


class ExchangeTier(Tier):
    """The rows `locate` finds at other members of `group`, over `next`."""

    def __init__(self, rows: LayoutRows, next: Tier, device: torch.device | str, group: ExchangeGroup):
        super().__init__(rows, next, device)
        self.exchange = RowExchange(group)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(mask of `ids` another member holds, its owner, the key to ask for) for those; None: none of them."""
        raise NotImplementedError

    def serve(self, keys: torch.Tensor) -> Any:
        """The rows at `keys` another member asked this one for (a tensor, or a `Deferred` still being read)."""
        raise NotImplementedError

    @property
    def served_rows(self) -> int:
        """Rows this rank sent to the others."""
        return self.exchange.served_rows

    def take(self, ids: np.ndarray, pos: np.ndarray | None, tag: tuple | None) -> _Part:
        found = self.locate(ids)
        if found is None:
            none = np.zeros(0, np.int64)
            return _Part(none, none, none, self.next.take(ids, pos, tag))
        mask, owner, key = found
        rest = np.flatnonzero(~mask)
        return _Part(at(pos, np.flatnonzero(mask)), owner, key, self.next.take(ids[rest], at(pos, rest), tag))

    def fetches(self, part: _Part, out: torch.Tensor) -> list[ExchangeFetch]:
        """out[pos] = the rows at `key` of their `owner` members: one round of the exchange per batch, whether
        or not it needs a row (the others may need this rank's), its rows written straight to their positions."""
        return [ExchangeFetch(self, self.exchange, self.serve, part.owner, part.key, part.pos, out),
                *self.next.fetches(part.inner, out)]

    def fetches_of_none(self, out: torch.Tensor) -> list[ExchangeFetch]:
        none = np.zeros(0, np.int64)
        return [ExchangeFetch(self, self.exchange, self.serve, none, none, none, out), *self.next.fetches_of_none(out)]

    def idle_fetches(self, left: bool = False) -> list[ExchangeFetch]:
        return [ExchangeFetch.idle(self, self.exchange, self.serve, left), *self.next.idle_fetches(left)]
