"""PyG's `FeatureStore` interface over any feature source: the tiered store or a baseline.

It reads through the same `submit`/`complete` calls the training pipeline uses, so a PyG user's
`store["node", "x", idx]` takes exactly the path a training batch takes (tiers, checksums, I/O shape).
Under torchrun with the tiered store's peer tier, each lookup is a round of the ranks' collective
exchange: every rank makes its lookups and then calls `source.finish()` (as the pipeline does after
each epoch), or all make as many.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch_geometric.data import FeatureStore, TensorAttr

from moment.errors import MomentError

GROUP, ATTR = "node", "x"  # the key the features are found under


class PygFeatureStore(FeatureStore):
    """Read-only: ``store["node", "x", idx]``, ``store["node"].x[idx]``, ``get_tensor(...)``."""

    def __init__(self, source: Any):
        super().__init__()
        self.source = source
        self.num_nodes = int(source.num_nodes)
        self.row_shape = tuple(source.row_shape)

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        raise MomentError("the feature store is read-only (features come from the layout or dataset)")

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        raise MomentError("the feature store is read-only (features come from the layout or dataset)")

    def _check_attr(self, attr: TensorAttr) -> None:
        if (attr.group_name, attr.attr_name) != (GROUP, ATTR):
            raise KeyError(f"no tensor ({attr.group_name!r}, {attr.attr_name!r}); this store holds "
                           f"({GROUP!r}, {ATTR!r})")

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        self._check_attr(attr)
        idx = attr.index
        if idx is None:
            idx = np.arange(self.num_nodes)
        elif isinstance(idx, slice):
            idx = np.arange(self.num_nodes)[idx]
        elif isinstance(idx, torch.Tensor):
            idx = idx.detach().cpu().numpy()
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_nodes):
            raise MomentError(f"node ids must be in [0, {self.num_nodes})")
        return self.source.complete(self.source.submit(idx))

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...]:
        self._check_attr(attr)
        return (self.num_nodes, *self.row_shape)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        return [TensorAttr(group_name=GROUP, attr_name=ATTR)]
