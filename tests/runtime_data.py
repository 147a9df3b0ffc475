"""Tiny learnable graphs and their layouts for the runtime tests (built with the real placement API)."""

from __future__ import annotations

from pathlib import Path

from moment.placement import BinSet, ddak, write_layout
from moment.workload.graph import GraphDataset
from moment.workload.hotness import presample
from moment.workload.synth import synthesize

NODES, DIM, CLASSES = 4000, 32, 4


def make_dataset(root: Path, nodes: int = NODES, dim: int = DIM, *, seed: int = 1, name: str = "ds") -> GraphDataset:
    return synthesize(root / name, nodes, feature_dim=dim, num_classes=CLASSES, seed=seed, train_fraction=0.3,
                      val_fraction=0.1, test_fraction=0.05, overwrite=True)


def make_layout(ds: GraphDataset, out: Path, *, align: int = 4096, row_mode: str = "auto",
                ssd_paths: list[str] | None = None) -> Path:
    """2 GPU bins (5% each), 1 CPU bin (10%), 2 SSDs; DDAK on pre-sampled hotness, caches filled."""
    n = ds.num_nodes
    h = presample(ds, (10, 5), 64)
    bins = BinSet.uniform(gpus=2, cpus=1, ssds=2, gpu_rows=n // 20, cpu_rows=n // 10, ssd_rows=n,
                          gpu_share=0.2, cpu_share=0.2, ssd_paths=ssd_paths)
    a = ddak(h.feature_reads, bins, pool=10, cache_fill="capacity")
    return write_layout(out, ds.file("features"), a, align=align, row_mode=row_mode, chunk_bytes=8192,
                        overwrite=True)
