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
from moment.runtime.sources import in_step
from moment.runtime.tier import ExchangeFetch, LayoutRows, Tier, at


@dataclass
class _Part:
    pos: np.ndarray  # positions in the batch another member serves
    owner: np.ndarray  # the member holding each
    key: np.ndarray  # what that member is asked for (its tier's row, or the node id)
    inner: Any
    rounds: bool = True  # whether the batch takes part in this exchange's rounds (`ExchangeTier.joins`)


class ExchangeTier(Tier):
    """The rows `locate` finds at other members of `group`, over `next`."""

    #: whether the tiers below hold this tier's rows too (the peers' GPU bins are in the layout's files; a split
    #: layout's other machines' rows are not): then only batches every rank takes in step join its rounds
    below_holds = False

    def __init__(self, rows: LayoutRows, next: Tier, device: torch.device | str, group: ExchangeGroup):
        super().__init__(rows, next, device)
        self.exchange = RowExchange(group, self.name)

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

    def joins(self, tag: tuple | None) -> bool:
        """Whether the batch tagged `tag` takes part in this exchange's rounds (`_rounds`)."""
        return self._rounds(in_step(tag))

    def _rounds(self, stepped: bool) -> bool:
        """Whether a sequence of batches (`stepped`: ones every rank takes in step, sources.in_step) takes part in
        this exchange's rounds: every one, unless the tiers below hold its rows too and it is not stepped: then
        it reads them there, and one rank may make it alone."""
        return stepped or not self.below_holds

    def take(self, ids: np.ndarray, pos: np.ndarray | None, tag: tuple | None) -> _Part:
        joins = self.joins(tag)
        found = self.locate(ids) if joins else None
        if found is None:
            none = np.zeros(0, np.int64)
            return _Part(none, none, none, self.next.take(ids, pos, tag), joins)
        mask, owner, key = found
        rest = np.flatnonzero(~mask)
        return _Part(at(pos, np.flatnonzero(mask)), owner, key, self.next.take(ids[rest], at(pos, rest), tag))

    def fetches(self, part: _Part, out: torch.Tensor) -> list[ExchangeFetch]:
        """out[pos] = the rows at `key` of their `owner` members: one round of the exchange per batch, whether
        or not it needs a row (the others may need this rank's), its rows written straight to their positions;
        none for a batch that does not join them."""
        if not part.rounds:
            return self.next.fetches(part.inner, out)
        return [ExchangeFetch(self, self.exchange, self.serve, part.owner, part.key, part.pos, out),
                *self.next.fetches(part.inner, out)]

    def fetches_of_none(self, out: torch.Tensor, tag: tuple | None) -> list[ExchangeFetch]:
        none = np.zeros(0, np.int64)
        mine = [ExchangeFetch(self, self.exchange, self.serve, none, none, none, out)] if self.joins(tag) else []
        return [*mine, *self.next.fetches_of_none(out, tag)]

    def idle_fetches(self, left: bool = False, stepped: bool = True) -> list[ExchangeFetch]:
        mine = [ExchangeFetch.idle(self, self.exchange, self.serve, left)] if self._rounds(stepped) else []
        return [*mine, *self.next.idle_fetches(left, stepped)]
