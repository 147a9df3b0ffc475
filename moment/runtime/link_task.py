"""Link prediction on top of the node models: the decoder, the loss, the held-out metric, the output width.

The model (SAGE or GAT, unchanged) embeds a link batch's endpoints (moment.workload.links: the batch's
seeds), `hidden` wide instead of `num_classes`; a label edge's logit is the dot product of its endpoints'
embeddings (PyG's standard link decoder), trained with binary cross-entropy against `edge_label`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from moment.errors import MomentError
from moment.workload.links import LinkNeighborSampler, with_in_edges
from moment.workload.sampler import CSRGraph, NeighborSampler
from moment.runtime.models import hidden_width

TASKS = ("node", "link")
_F32 = torch.float32.itemsize  # the decoder computes on the model's float32 output


def out_dim(task: str, model: str, hidden: int | None, num_classes: int) -> int:
    """The model's output width for `task`: node classification's `num_classes`; link prediction's embeddings
    are as wide as a hidden layer (GAT: one head's width, its last layer has one head)."""
    if task == "node":
        return int(num_classes)
    if task == "link":
        return hidden_width(model, hidden)
    raise MomentError(f"--task {task!r}: choose {' or '.join(TASKS)}")


def sampler_for(task: str, graph: CSRGraph, fanouts: Sequence[int], negatives: int = 1) -> Any:
    """The sampler a run of `task` draws its batches with: node classification's NeighborSampler, or link
    prediction's LinkNeighborSampler (positives and `negatives` negatives per positive, then the endpoints'
    neighbourhoods). Picklable with functools.partial (the memmap baseline's workers make their own)."""
    if task == "link":
        return LinkNeighborSampler(graph, fanouts, negatives)
    return NeighborSampler(graph, fanouts)


def train_seeds(task: str, graph: CSRGraph, train_idx: np.ndarray) -> np.ndarray:
    """The nodes a run's batches are drawn from: the training nodes; for link prediction those with an in-edge
    (a node without one gives no positive, so every batch is full)."""
    return with_in_edges(graph, train_idx).numpy() if task == "link" else train_idx


def link_logits(h: torch.Tensor, edge_label_index: torch.Tensor) -> torch.Tensor:
    """Each label edge's logit: the dot product of its endpoints' rows of `h` (the model's output over the
    batch's seeds; `edge_label_index` holds local ids into them)."""
    return (h[edge_label_index[0]] * h[edge_label_index[1]]).sum(dim=-1)


def link_loss(logits: torch.Tensor, edge_label: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy with logits. A batch without labels (its seeds had no in-neighbour) gives 0,
    still tied to the model's graph, so its backward runs (every DDP rank must run one) and adds nothing."""
    if logits.numel() == 0:
        return logits.sum()
    return F.binary_cross_entropy_with_logits(logits, edge_label.to(logits.dtype))


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact ROC AUC: the probability that a random positive scores above a random negative, ties counting
    half (Mann-Whitney U from the scores' ranks, tied ranks averaged). O(n log n); `labels` 1/0 (or bool).

    Needs every evaluated score in one place (AUC does not add up over ranks' shares): gather them first."""
    s = scores.detach().reshape(-1).to(torch.float64)
    y = labels.detach().reshape(-1) > 0.5
    if s.numel() != y.numel():
        raise ValueError(f"{s.numel()} scores but {y.numel()} labels")
    if bool(torch.isnan(s).any()):
        raise ValueError("ROC AUC of NaN scores")
    pos = int(y.sum())
    neg = y.numel() - pos
    if not pos or not neg:
        raise ValueError(f"ROC AUC needs positive and negative labels, got {pos} and {neg}")
    _, inv, counts = torch.unique(s, sorted=True, return_inverse=True, return_counts=True)
    below = counts.cumsum(0) - counts  # scores strictly below each distinct value
    rank = (below.to(torch.float64) + (counts.to(torch.float64) + 1) / 2)[inv]  # 1-based, ties averaged
    return float((rank[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def link_accuracy(logits: torch.Tensor, edge_label: torch.Tensor) -> float:
    """The share of label edges on the right side of logit 0 (probability 1/2); NaN without labels."""
    if logits.numel() == 0:
        return float("nan")
    return float(((logits.detach() > 0) == (edge_label.detach() > 0.5)).to(torch.float64).mean())


def decoder_bytes(num_labels: int, num_endpoints: int, width: int) -> int:
    """The most the decoder and loss of a link step hold beside the model's saved tensors (models.step_bytes'
    `head_bytes`), for `num_labels` label edges over `num_endpoints` embeddings `width` wide.

    Forward: the two gathered endpoint rows (kept for the product's backward) and their product. Backward:
    the product's two gradients beside the kept rows, then the two gathers' gradients, each as large as the
    embeddings, beside the product's gradients."""
    edge = num_labels * width
    return max(4 * edge, 2 * edge + 2 * num_endpoints * width) * _F32
