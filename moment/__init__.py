"""Moment: plan and run multi-GPU out-of-core GNN training."""

__version__ = "0.1.0"
