"""GraphSAGE and GAT over sampled mini-batch blocks, from torch-geometric's layers.

A mini-batch is a list of blocks, outermost hop first: block l maps the first `num_src[l]` nodes of
the batch (local ids) onto the first `num_dst[l]` of them (targets come first, as the sampler
orders them): exactly `MiniBatch.blocks()`. Each layer shrinks the node set to its targets, so the last layer leaves the seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from moment.runtime.config import DEFAULT_HIDDEN
from moment.workload.sampler import Block  # the sampler's `MiniBatch.blocks()` items

# Imports inside functions: torch (and PyG) load only where a tensor is made, so planning, placement and the
# CLI stay torch-free.

__all__ = ["GAT", "SAGE", "Block", "LayerExtent", "build_model", "hidden_width", "load_layers", "step_bytes", "weights"]

GAT_HEADS = 8  # the paper's GAT: 8 heads of `hidden` each in every layer but the last
_F32 = 4  # bytes of a float32: the models compute in float32 (`item.x.float()`)


def load_layers() -> None:
    """Import torch-geometric's layers now (~130 MiB of RSS), so that a rank's fixed cost, measured before
    it touches data, includes them: the models import them lazily, after the budget is split."""
    import torch_geometric.nn  # noqa: F401


class SAGE(nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        dims = self.dims(in_dim, hidden, out_dim, num_layers)
        self.convs = nn.ModuleList(SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers))
        self.dropout = dropout

    @staticmethod
    def dims(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[int]:
        """Every layer's input width, then the output's."""
        return [in_dim] + [hidden] * (num_layers - 1) + [out_dim]

    @staticmethod
    def layer_weights(a: int, b: int) -> int:
        """Parameters of one SAGEConv(a, b): lin_l with its bias, lin_r without."""
        return 2 * a * b + b

    @staticmethod
    def layer_bytes(e: LayerExtent, a: int, b: int, last: bool) -> tuple[int, int]:
        """(the most one SAGEConv layer of a -> b widths holds while it runs, forward or backward; what its
        forward leaves saved for the backward while the later layers run).

        Forward: the gathered messages (one per edge, `a` wide; the input features need no gradient, so they
        are dropped once aggregated) beside the aggregation's sum and mean. Backward of a hidden layer: the
        saved ReLU output, dropout mask and output, and two gradients of the same size, beside the saved mean.
        Saved: the mean (lin_l's input), and of a hidden layer the ReLU output, the dropout mask and output."""
        fwd = (e.edges + 2 * e.dst) * a
        bwd = e.dst * a + (5 if not last else 3) * e.dst * b
        return max(fwd, bwd) * _F32, e.dst * (a + (3 * b if not last else b)) * _F32

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        for i, (conv, b) in enumerate(zip(self.convs, blocks)):
            x = conv((x[: b.num_src], x[: b.num_dst]), b.edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        return x


class GAT(nn.Module):
    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, heads: int = GAT_HEADS,
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

    @staticmethod
    def dims(in_dim: int, hidden: int, out_dim: int, num_layers: int, heads: int = GAT_HEADS) -> list[int]:
        """Every layer's input width, then the output's (a hidden layer's output: its heads side by side)."""
        return [in_dim] + [hidden * heads] * (num_layers - 1) + [out_dim]

    @staticmethod
    def layer_weights(a: int, w: int) -> int:
        """Parameters of one GATConv whose heads are `w` wide together: its projection, the two attention
        vectors and the bias."""
        return a * w + 3 * w

    @staticmethod
    def layer_bytes(e: LayerExtent, a: int, w: int, last: bool, heads: int = GAT_HEADS) -> tuple[int, int]:
        """(the most one GATConv layer whose heads are `w` wide together holds while it runs; what its forward
        leaves saved while the later layers run), as `SAGE.layer_bytes`.

        Every source node is projected (`w` wide) and every edge carries a projected message, weighted by its
        attention (a second edge-sized tensor); the backward holds the gradients of both beside the saved
        ones: two source-sized, three edge-sized and two target-sized tensors at the most. Saved: the
        projection, the messages, the attention (a few values per edge and head) and the hidden layer's
        output, ELU output, dropout mask and output."""
        h = 1 if last else heads
        run = (2 * e.src + 3 * e.edges + 2 * e.dst) * w
        saved = (e.src + e.edges + (4 if not last else 1) * e.dst) * w + 4 * e.edges * h
        return run * _F32, saved * _F32

    def forward(self, x: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        for i, (conv, b) in enumerate(zip(self.convs, blocks)):
            x = conv((x[: b.num_src], x[: b.num_dst]), b.edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.elu(x), p=self.dropout, training=self.training)
        return x


@dataclass(frozen=True)
class LayerExtent:
    """One layer's block at a batch's extent: its source nodes, target nodes and edges (`Block`)."""

    src: int
    dst: int
    edges: int


_MODELS = {"sage": SAGE, "gat": GAT}


def hidden_width(name: str, hidden: int | None) -> int:
    """A hidden layer's width (GAT: per head): `hidden`, else the paper's settings: GraphSAGE 256, GAT 64."""
    return hidden or (DEFAULT_HIDDEN if name == "sage" else 64)


def step_bytes(name: str, in_dim: int, num_classes: int, hidden: int | None, layers: Sequence[LayerExtent], *,
               rows: int, float_copy: bool, head_bytes: int = 0, optimizer_slots: int = 2) -> int:
    """What one training step of `name` holds beyond the batch's features: the most any layer holds while it
    runs (forward or backward) beside what the layers before it saved, and the model's weights with their
    gradients, DDP's gradient buckets and the optimizer's state (`optimizer_slots` weight-sized tensors: Adam's
    two moments, SGD's momentum; moment.runtime.model_spec.OPTIMIZERS).
    `num_classes`: the model's output width (a link model's: its embeddings', moment.runtime.link_task.out_dim);
    `layers`: the batch's blocks at its extent, input layer first; `rows`: its input rows; `float_copy`: the
    features are not float32, so the step holds a float32 copy of them (`x.float()`); `head_bytes`: the most
    what runs on the model's output holds, beside every layer's saved tensors (the link decoder:
    moment.runtime.link_task.decoder_bytes).

    Stated from the layers' autograd graphs (torch 2.13, torch-geometric 2.x), checked against measured
    steps (tests/test_models.py): the memory budget charges it as the run's "training" item."""
    cls = _model(name)
    dims = cls.dims(in_dim, hidden_width(name, hidden), num_classes, len(layers))
    most = saved = 0
    for i, e in enumerate(layers):
        run, keep = cls.layer_bytes(e, dims[i], dims[i + 1], i == len(layers) - 1)
        most = max(most, saved + run)
        saved += keep
    most = max(most, saved + head_bytes)
    return (most + (rows * in_dim * _F32 if float_copy else 0)
            + (3 + optimizer_slots) * weights(name, in_dim, num_classes, hidden, len(layers)) * _F32)


def weights(name: str, in_dim: int, num_classes: int, hidden: int | None, num_layers: int) -> int:
    """Parameters of `build_model(name, in_dim, num_classes, num_layers, hidden)`, without building it."""
    cls = _model(name)
    dims = cls.dims(in_dim, hidden_width(name, hidden), num_classes, num_layers)
    return sum(cls.layer_weights(dims[i], dims[i + 1]) for i in range(num_layers))


def _model(name: str) -> type[SAGE] | type[GAT]:
    if name not in _MODELS:
        from moment.errors import MomentError

        raise MomentError(f"--model {name!r}: choose sage or gat")
    return _MODELS[name]


def build_model(name: str, in_dim: int, num_classes: int, num_layers: int = 2, hidden: int | None = None) -> nn.Module:
    """The paper's settings: GraphSAGE hidden 256; GAT hidden 64 with 8 heads."""
    return _model(name)(in_dim, hidden_width(name, hidden), num_classes, num_layers)
