"""GraphSAGE and GAT over sampled mini-batch blocks, with PyG's layers written in plain torch
(moment.runtime.layers: bit-equal to PyG's SAGEConv and GATConv, without importing torch-geometric).

A mini-batch is a list of blocks, outermost hop first: block l maps the first `num_src[l]` nodes of
the batch (local ids) onto the first `num_dst[l]` of them (targets come first, as the sampler
orders them): exactly `MiniBatch.blocks()`. Each layer shrinks the node set to its targets, so the last layer leaves the seeds.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import nn

from moment.errors import MomentError
from moment.runtime.footprint import (GAT_HEADS, GatSizes, LayerExtent, SageSizes, hidden_width, step_bytes,
                                      weights)
from moment.runtime.layers import GATConv, SAGEConv
from moment.workload.sampler import Block  # the sampler's `MiniBatch.blocks()` items

# the size rules live in moment.runtime.footprint (torch-free, for a dry run); named here as before
__all__ = ["GAT", "GAT_HEADS", "SAGE", "Block", "LayerExtent", "build_model", "hidden_width", "load_optimizers",
           "step_bytes", "weights"]


def load_optimizers() -> None:
    """Load what torch's optimizers import on first use (torch._dynamo, with sympy: ~90 MiB of RSS, ~0.9 CPU-s),
    so that a rank's fixed cost, measured before it touches data, includes it: a step's optimizer would
    otherwise add it to a budget already split."""
    torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)


class SAGE(SageSizes, nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        dims = self.dims(in_dim, hidden, out_dim, num_layers)
        self.convs = nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers))
        self.dropout = dropout

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        for i, (conv, b) in enumerate(zip(self.convs, blocks)):
            x = conv((x[: b.num_src], x[: b.num_dst]), b.edge_index)
            if i < len(self.convs) - 1:
                # in place: the layer's sum is needed by no backward, and each fresh hidden-layer-sized tensor is
                # a fresh mapping whose pages the kernel zeroes (8M bench: -3% CPU per epoch, three A/B pairs)
                x = F.dropout(F.relu(x, inplace=True), p=self.dropout, training=self.training)
        return x


class GAT(GatSizes, nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, heads: int = GAT_HEADS,
                 dropout: float = 0.5):
        super().__init__()
        self.convs = nn.ModuleList()
        d = in_dim
        for i in range(num_layers):
            last = i == num_layers - 1
            self.convs.append(GATConv(d, out_dim if last else hidden, heads=1 if last else heads))
            d = hidden * heads
        self.dropout = dropout

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        for i, (conv, b) in enumerate(zip(self.convs, blocks)):
            x = conv((x[: b.num_src], x[: b.num_dst]), b.edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.elu(x), p=self.dropout, training=self.training)
        return x


_MODELS = {"sage": SAGE, "gat": GAT}


def build_model(name: str, in_dim: int, num_classes: int, num_layers: int = 2, hidden: int | None = None) -> nn.Module:
    """The paper's settings: GraphSAGE hidden 256; GAT hidden 64 with 8 heads. A script's sizes are checked here:
    a zero or a string reached torch as a division by zero, a negative dimension or no model at all."""
    if name not in _MODELS:
        raise MomentError(f"build_model({name!r}): choose {' or '.join(map(repr, _MODELS))}",
                          hint="a model of your own is built by your script: open_run(model='mypkg.models:make') "
                               "charges its step to the budget")
    sizes = {"in_dim": in_dim, "num_classes": num_classes, "num_layers": num_layers}
    if hidden is not None:
        sizes["hidden"] = hidden
    for key, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise MomentError(f"build_model({key}={v!r}): must be an integer >= 1",
                              hint="e.g. moment.build_model('sage', run.feature_dim, run.num_classes, "
                                   "num_layers=len(run.fanouts))")
    return _MODELS[name](int(in_dim), hidden_width(name, None if hidden is None else int(hidden)), int(num_classes),
                        int(num_layers))
