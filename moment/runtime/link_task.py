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

from moment.runtime.footprint import TASKS, decoder_bytes, out_dim
from moment.workload.links import LinkNeighborSampler, with_in_edges
from moment.workload.sampler import CSRGraph, NeighborSampler

# the output width and the decoder's memory are stated in moment.runtime.footprint (torch-free); named here
__all__ = ["TASKS", "decoder_bytes", "link_accuracy", "link_logits", "link_loss", "out_dim", "roc_auc",
           "sampler_for", "train_seeds"]


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
