"""Models and losses of a user's own for tests/test_user_model.py, given as `--model tests.user_models:NAME`
(`--loss tests.user_models:NAME`): the good ones a user would write, and one of each mistake."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SAGE3(nn.Module):
    """A plain PyG model over the whole sampled subgraph: num_layers SAGEConvs on (x, edge_index)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int):
        super().__init__()
        from torch_geometric.nn import SAGEConv

        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=0.2, training=self.training)
        return x


def factory(*, in_dim: int, num_classes: int, num_layers: int, hidden: int) -> nn.Module:
    return SAGE3(in_dim, hidden, num_classes, num_layers)


class Scale(nn.Module):
    """logits = x * w (in_dim == num_classes): a step whose tensors are known to the byte."""

    def __init__(self, width: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return x * self.w


def scale(*, in_dim: int, num_classes: int, num_layers: int, hidden: int) -> nn.Module:
    return Scale(num_classes)


class Stated(SAGE3):
    """SAGE3 that states its step's activations: a fixed figure the test recognises."""

    def step_bytes(self, layers, rows: int, in_dim: int) -> int:
        return 1000 * len(layers) + rows + in_dim


def stated(*, in_dim: int, num_classes: int, num_layers: int, hidden: int) -> nn.Module:
    return Stated(in_dim, hidden, num_classes, num_layers)


def sum_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return logits.sum()


def smooth_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross entropy with label smoothing: a real loss of a user's own."""
    return F.cross_entropy(logits, y, label_smoothing=0.1)


# ---- mistakes, one each

NOT_CALLABLE = 3


def raises(**kw) -> nn.Module:
    raise ValueError("hidden must be even\nbut got 257")


def no_module(**kw):
    return [1, 2]


def no_parameters(**kw) -> nn.Module:
    return nn.ReLU()


class _Broken(nn.Module):
    def __init__(self, in_dim: int):
        super().__init__()
        self.lin = nn.Linear(in_dim + 1, 4)

    def forward(self, x, edge_index):
        return self.lin(x)


def broken_forward(*, in_dim: int, **kw) -> nn.Module:
    return _Broken(in_dim)


class _Linear(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, rows: int | None = None):
        super().__init__()
        self.lin, self.rows = nn.Linear(in_dim, out_dim), rows

    def forward(self, x, edge_index):
        return self.lin(x[: self.rows])


def wrong_width(*, in_dim: int, num_classes: int, **kw) -> nn.Module:
    return _Linear(in_dim, num_classes + 1)


def too_few_rows(*, in_dim: int, num_classes: int, **kw) -> nn.Module:
    return _Linear(in_dim, num_classes, rows=2)


class _BadStatement(SAGE3):
    def step_bytes(self, layers, rows, in_dim):
        return -1


def bad_statement(*, in_dim: int, num_classes: int, num_layers: int, hidden: int) -> nn.Module:
    return _BadStatement(in_dim, hidden, num_classes, num_layers)


def vector_loss(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def number_loss(logits, y):
    return 1.0


def detached_loss(logits, y):
    return F.cross_entropy(logits.detach(), y)


def failing_loss(logits, y):
    raise KeyError("labels")


class SpareHead(nn.Module):
    """A model with a second head its forward does not use (one for another task): DDP must look for it."""

    def __init__(self, in_dim: int, num_classes: int):
        super().__init__()
        self.head = nn.Linear(in_dim, num_classes)
        self.other_task = nn.Linear(in_dim, 3)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def spare_head(*, in_dim: int, num_classes: int, num_layers: int, hidden: int) -> nn.Module:
    return SpareHead(in_dim, num_classes)
