"""The built-in models' graph layers in plain torch: PyG's `SAGEConv` (mean aggregation) and `GATConv`
(no self-loops added, no edge features), op for op.

Importing torch-geometric costs a training rank ~0.85 CPU-s and ~54 MiB at its start beyond what torch's
optimizers load anyway (measured with an Adam step: 3.7 -> 2.8 CPU-s, 376 -> 322 MiB); the two layers need
none of it. Each layer below computes what PyG 2.8's `MessagePassing` path computes for an `edge_index`
tensor, adding the same numbers in the same order (index_select of the sources, scatter_add_ into the
targets, PyG's segment softmax; SAGE's sum without the per-edge messages, `_NeighbourSum`), and draws its
initial weights with the same calls in the same order (PyG's `Linear` initialises in its constructor and the
layer resets it again), so that a seed gives bit-equal weights, outputs, gradients and loss curves:
tests/test_layers.py checks all four against PyG's layers. Parameter names match PyG's, so checkpoints load
either way.

An edge_index is (2, E): row 0 the source (neighbour) in `x_src`, row 1 the target in `x_dst`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: PyG's `Linear` default: kaiming_uniform with a = sqrt(5) over the input width
_KAIMING_A = math.sqrt(5)


def _uniform_(t: Tensor, bound: float) -> None:
    t.data.uniform_(-bound, bound)


def _glorot_(t: Tensor) -> None:
    _uniform_(t, math.sqrt(6.0 / (t.size(-2) + t.size(-1))))


class Linear(nn.Module):
    """PyG's `Linear` with a known input width: `F.linear`, weights drawn as PyG draws them."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, glorot: bool = False):
        super().__init__()
        self.in_channels, self.out_channels, self.glorot = in_channels, out_channels, glorot
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.glorot:
            _glorot_(self.weight)
        else:
            _uniform_(self.weight, math.sqrt(6 / ((1 + _KAIMING_A ** 2) * self.in_channels)))
        if self.bias is not None:
            _uniform_(self.bias, 1.0 / math.sqrt(self.in_channels))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def _expand(index: Tensor, ref: Tensor) -> Tensor:
    """A per-row index broadcast over `ref`'s trailing dimensions (PyG's `broadcast` along dim 0)."""
    return index.view((-1,) + (1,) * (ref.dim() - 1)).expand_as(ref)


def _scatter_sum(src: Tensor, index: Tensor, rows: int) -> Tensor:
    return src.new_zeros((rows,) + tuple(src.shape[1:])).scatter_add_(0, _expand(index, src), src)


class _NeighbourSum(torch.autograd.Function):
    """Each target's sum of its sources' rows: `_scatter_sum(x_src.index_select(0, src), dst, rows)` without
    the messages (one source row per edge), a step's largest tensors, each a fresh mapping whose pages the
    kernel zeroed. The forward is an embedding bag per target, which adds its rows in edge order as
    scatter_add_ does; the backward, only where `x_src` needs a gradient (not the input layer's features), is
    the gathered path's own (scatter_add_'s gather, index_select's index_add_), so both are bit-equal to it.
    `count`: each target's edges (`_neighbour_mean`'s, which also divides by it)."""

    @staticmethod
    def forward(ctx: Any, x_src: Tensor, src: Tensor, dst: Tensor, count: Tensor) -> Tensor:
        ctx.save_for_backward(src, dst)
        ctx.src_rows = x_src.size(0)
        if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):  # the sampler's blocks are in target order
            src = src[torch.argsort(dst, stable=True)]  # stable: each target's edges keep their order
        offsets = torch.zeros_like(count)
        torch.cumsum(count[:-1], 0, out=offsets[1:])
        return F.embedding_bag(src, x_src, offsets, mode="sum")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        src, dst = ctx.saved_tensors
        messages = grad.index_select(0, dst)
        return grad.new_zeros((ctx.src_rows, *grad.shape[1:])).index_add_(0, src, messages), None, None, None


def _neighbour_mean(x_src: Tensor, edge_index: Tensor, rows: int) -> Tensor:
    src, dst = edge_index[0], edge_index[1]
    count = dst.new_zeros(rows).index_add_(0, dst, torch.ones_like(dst))  # a target beyond `rows` fails here
    out = _NeighbourSum.apply(x_src, src, dst, count)
    return out / _expand(count.clamp(min=1).to(out.dtype), out)


def _segment_softmax(src: Tensor, index: Tensor, rows: int) -> Tensor:
    """Softmax of the edges' scores over each target's incoming edges (PyG's `softmax` with an index)."""
    detached = src.detach()
    src_max = detached.new_zeros((rows,) + tuple(src.shape[1:])).scatter_reduce_(
        0, _expand(index, detached), detached, reduce="amax", include_self=False)
    out = (src - src_max.index_select(0, index)).exp()
    out_sum = _scatter_sum(out, index, rows) + 1e-16
    return out / out_sum.index_select(0, index)


class SAGEConv(nn.Module):
    """GraphSAGE's layer: the mean of the neighbours through `lin_l` (with bias) plus the target through
    `lin_r` (without)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin_l = Linear(in_channels, out_channels, bias=True)
        self.lin_r = Linear(in_channels, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin_l.reset_parameters()
        self.lin_r.reset_parameters()

    def forward(self, x: tuple[Tensor, Tensor], edge_index: Tensor) -> Tensor:
        x_src, x_dst = x
        out = _neighbour_mean(x_src, edge_index, x_dst.size(0))
        return self.lin_l(out) + self.lin_r(x_dst)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, aggr=mean"


class GATConv(nn.Module):
    """GAT's layer with `heads` heads, concatenated: one shared projection `lin`, attention vectors
    `att_src`/`att_dst`, leaky ReLU (slope 0.2), a softmax over each target's incoming edges, a sum of the
    weighted sources and a bias. Self-loops are not added (the sampler's blocks hold what the model sees)."""

    negative_slope = 0.2
    dropout = 0.0  # on the attention weights, as PyG's default

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1):
        super().__init__()
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.lin = Linear(in_channels, heads * out_channels, bias=False, glorot=True)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.bias = nn.Parameter(torch.empty(heads * out_channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()
        _glorot_(self.att_src)
        _glorot_(self.att_dst)
        self.bias.data.fill_(0.0)

    def forward(self, x: tuple[Tensor, Tensor], edge_index: Tensor) -> Tensor:
        h, c = self.heads, self.out_channels
        x_src = self.lin(x[0]).view(-1, h, c)
        x_dst = self.lin(x[1]).view(-1, h, c)
        alpha_src = (x_src * self.att_src).sum(dim=-1)
        alpha_dst = (x_dst * self.att_dst).sum(-1)
        src, dst = edge_index[0], edge_index[1]
        rows = x_dst.size(0)
        alpha = alpha_src.index_select(0, src) + alpha_dst.index_select(0, dst)
        if dst.numel():
            alpha = F.leaky_relu(alpha, self.negative_slope)
            alpha = _segment_softmax(alpha, dst, rows)
            alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        out = _scatter_sum(alpha.unsqueeze(-1) * x_src.index_select(0, src), dst, rows)
        return out.view(-1, h * c) + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"
