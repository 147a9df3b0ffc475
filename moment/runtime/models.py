"""GraphSAGE and GAT over sampled mini-batch blocks, from torch-geometric's layers.

A mini-batch is a list of blocks, outermost hop first: block l maps the first `num_src[l]` nodes of
the batch (local ids) onto the first `num_dst[l]` of them (targets come first, as the sampler
orders them): exactly `MiniBatch.blocks()`. Each layer shrinks the node set to its targets, so the last layer leaves the seeds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from moment.workload.sampler import Block  # the sampler's `MiniBatch.blocks()` items

__all__ = ["GAT", "SAGE", "Block", "build_model", "load_layers"]


def load_layers() -> None:
    """Import torch-geometric's layers now (~130 MiB of RSS), so that a rank's fixed cost, measured before
    it touches data, includes them: the models import them lazily, after the budget is split."""
    import torch_geometric.nn  # noqa: F401


class SAGE(nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers))
        self.dropout = dropout

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        for i, (conv, b) in enumerate(zip(self.convs, blocks)):
            x = conv((x[: b.num_src], x[: b.num_dst]), b.edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


class GAT(nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, heads: int = 8,
                 dropout: float = 0.5):
        super().__init__()
        from torch_geometric.nn import GATConv

        self.convs = nn.ModuleList()
        d = in_dim
        for i in range(num_layers):
            last = i == num_layers - 1
            self.convs.append(GATConv(d, out_dim if last else hidden, heads=1 if last else heads,
                                      add_self_loops=False))
            d = hidden * heads
        self.dropout = dropout

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        for i, (conv, b) in enumerate(zip(self.convs, blocks)):
            x = conv((x[: b.num_src], x[: b.num_dst]), b.edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.elu(x), p=self.dropout, training=self.training)
        return x


def build_model(name: str, in_dim: int, num_classes: int, num_layers: int = 2, hidden: int | None = None) -> nn.Module:
    """The paper's settings: GraphSAGE hidden 256; GAT hidden 64 with 8 heads."""
    if name == "sage":
        return SAGE(in_dim, hidden or 256, num_classes, num_layers)
    if name == "gat":
        return GAT(in_dim, hidden or 64, num_classes, num_layers, heads=8)
    from moment.errors import MomentError

    raise MomentError(f"--model {name!r}: choose sage or gat")
