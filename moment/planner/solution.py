"""What a solver returns, in the network's own terms (bytes, seconds), before it becomes a contract."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moment.planner.network import FlowNetwork


@dataclass
class Solution:
    solver: str  # 'lp' or 'maxflow-<backend>'
    epoch_read_s: float  # least T in which every GPU receives its demand
    edge_bytes: np.ndarray  # bytes over the epoch on each of network.edges
    served_bytes: dict[str, float]  # bytes over the epoch served by each storage node
    received_bytes: dict[str, float]  # bytes over the epoch received by each GPU
    network: FlowNetwork

    @property
    def edge_rate(self) -> np.ndarray:
        """Average bytes/s on each edge over the epoch."""
        return self.edge_bytes / self.epoch_read_s

    def utilisation(self) -> np.ndarray:
        cap = np.array([e.capacity for e in self.network.edges])
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(np.isfinite(cap), self.edge_rate / cap, 0.0)
        return np.nan_to_num(u)

    def storage_shares(self) -> dict[str, float]:
        total = self.network.total_demand
        return {s: b / total for s, b in self.served_bytes.items()}

    def per_gpu_inlet(self) -> list[float]:
        """bytes/s each GPU receives, in network.gpus order."""
        return [self.received_bytes[g] / self.epoch_read_s for g in self.network.gpus]
