"""Training options: one dataclass, parsed from the command line of `python -m moment.train`.

The same flags are accepted by `moment train` (which forwards them to torchrun unchanged).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moment.errors import MomentError
from moment.workload.spec import default_batch_size
DEFAULT_FANOUTS = {1: [10], 2: [25, 10], 3: [15, 10, 5]}
FEATURES = ("tiered", "memory", "memmap")


@dataclass
class TrainConfig:
    layout: Path | None = None
    dataset: Path | None = None
    model: str = "sage"
    epochs: int = 1
    metrics_json: Path | None = None
    fanouts: list[int] = field(default_factory=list)
    layers: int | None = None
    batch_size: int | None = None
    hidden: int | None = None
    lr: float = 3e-3
    seed: int = 0
    checkpoint_dir: Path | None = None
    checkpoint_every: int | None = None  # None: a quarter epoch when there is a checkpoint_dir
    resume: bool = False
    cpu_cache_limit: str | None = None
    memory_budget: str | None = None
    cache_policy: str = "static"
    io_shape: str = "auto"
    superbatch: int | None = None
    features: str = "tiered"
    drop_page_cache: str = ""
    memmap_random: bool = False
    io_backend: str | None = None
    queue_depth: int = 128
    io_merge_gap: int | None = None
    io_max_request: int | None = None
    direct: bool = True
    verify: bool = False
    pipeline: bool = True
    depth: int = 2
    threads: int | None = None
    device: str | None = None
    quiet: bool = False

    def resolved_fanouts(self) -> list[int]:
        if self.fanouts:
            if self.layers is not None and self.layers != len(self.fanouts):
                raise MomentError(f"--layers {self.layers} but --fanouts gives {len(self.fanouts)} hops",
                                  hint="give one fan-out per layer, e.g. --fanouts 15,10,5 for 3 layers")
            return list(self.fanouts)
        layers = self.layers or 2
        if layers not in DEFAULT_FANOUTS:
            raise MomentError(f"--layers {layers}: choose 1, 2 or 3 (or give --fanouts)")
        return list(DEFAULT_FANOUTS[layers])

    def resolved_batch_size(self, train_nodes: int, world_size: int) -> int:
        """--batch-size, or the paper's 8000 seeds per GPU scaled down for a small graph (default_batch_size)."""
        if self.batch_size is not None:
            return self.batch_size
        return default_batch_size(train_nodes, world_size)

    def resolved_checkpoint_every(self, steps_per_epoch: int) -> int:
        """Steps between checkpoints (0: none; checkpoints also end every epoch when > 0). Not given:
        four per epoch when there is a --checkpoint-dir, so a restart loses at most a quarter epoch."""
        if self.checkpoint_every is not None:
            return self.checkpoint_every
        return max(1, steps_per_epoch // 4) if self.checkpoint_dir is not None else 0

    def resolved_superbatch(self) -> int:
        """Batches decided together: a hyperbatch for block reads, Ginex's superbatch for Belady."""
        if self.superbatch is not None:
            return self.superbatch
        return 4 if (self.io_shape != "rows" or self.cache_policy != "static") else 1

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}

    def check(self) -> None:
        if self.features == "tiered" and self.layout is None:
            raise MomentError("--layout is required (or use --features-in-memory / --features-memmap "
                              "with --dataset)")
        if self.features != "tiered" and self.layout is None and self.dataset is None:
            raise MomentError("--dataset is required without --layout")
        if self.epochs < 1:
            raise MomentError(f"--epochs must be positive (got {self.epochs})")
        if self.batch_size is not None and self.batch_size < 1:
            raise MomentError(f"--batch-size must be positive (got {self.batch_size})")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise MomentError("--checkpoint-every must be >= 0")
        if (self.checkpoint_every or self.resume) and self.checkpoint_dir is None:
            raise MomentError("--checkpoint-every/--resume need --checkpoint-dir")
        if self.memory_budget not in (None, "", "auto"):
            from moment.runtime.budget import resolve_budget

            resolve_budget(self.memory_budget)
        if self.superbatch is not None and self.superbatch < 1:
            raise MomentError(f"--superbatch must be >= 1 (got {self.superbatch})")
        if self.model not in ("sage", "gat"):
            raise MomentError(f"--model {self.model!r}: choose sage or gat")
        self.resolved_fanouts()
        self.check_outputs()

    def check_outputs(self) -> None:
        """Outputs that would only be written at the end (or at a checkpoint) are checked before the run."""
        from moment.outputs import check_output

        if self.metrics_json is not None:
            check_output(self.metrics_json, "--metrics-json")
        if self.checkpoint_dir is not None:
            check_output(self.checkpoint_dir, "--checkpoint-dir", directory=True)


def _fanouts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fan-outs must be integers like 25,10, got {text!r}") from None
    if not out or any(f <= 0 for f in out):
        raise argparse.ArgumentTypeError(f"fan-outs must be positive integers, got {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m moment.train",
        description="Data-parallel out-of-core GNN training from a Moment layout (launch with torchrun "
                    "for several ranks; without it, one process).")
    a = p.add_argument
    a("--layout", type=Path, help="layout directory written by `moment place`")
    a("--dataset", type=Path, help="dataset directory (default: the one the layout was made from)")
    a("--model", default="sage", choices=["sage", "gat"])
    a("--epochs", type=int, default=1)
    a("--metrics-json", type=Path, help="write the run's summary here (rank 0, atomically)")
    a("--fanouts", type=_fanouts, default=[], help="per-hop fan-outs, outermost last, e.g. 25,10")
    a("--layers", type=int, choices=[1, 2, 3], help="GNN layers (default: number of fan-outs, else 2)")
    a("--batch-size", type=int, help="seeds per rank and step (default: min(8000, max(64, "
                                     "train_nodes // (world_size * 8))))")
    a("--hidden", type=int, help="hidden width (default: 256 for sage, 64x8 heads for gat)")
    a("--lr", type=float, default=3e-3)
    a("--seed", type=int, default=0)
    a("--checkpoint-dir", type=Path, help="write checkpoints here; a torchrun restart resumes from the last one "
                                           "(`moment train` picks one in the run directory when not given)")
    a("--checkpoint-every", type=int, metavar="STEPS",
      help="steps between checkpoints (default: a quarter epoch with --checkpoint-dir; 0: none)")
    a("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir "
                                            "(automatic after a torchrun restart)")
    a("--memory-budget", metavar="BYTES|auto",
      help="memory for the whole run on this machine (all local ranks), e.g. 3GiB; auto: the cgroup limit "
           "or available memory, less a margin. Every large buffer is sized from it and the split is "
           "printed at start; a budget below the run's minimum is refused (the message names it)")
    a("--cpu-cache-limit", help="cap the CPU cache, e.g. 2GiB or 10%% of the features (default: what the "
                                "budget leaves; without a budget, the layout's CPU bins)")
    a("--cache-policy", default="static", choices=["static", "lru", "belady-superbatch"],
      help="CPU cache policy: static (hottest rows by pre-sampled hotness, one copy shared by the local "
           "ranks), lru, or belady-superbatch (Ginex: the next superbatch's accesses decide what stays)")
    a("--io-shape", default="auto", choices=["auto", "rows", "block", "packed"],
      help="how misses are read: packed (DiskGNN: each batch's misses from the contiguous segment "
           "`moment data pack` wrote for it), block (a hyperbatch's misses in large merged reads, AGNES) or "
           "rows (each batch's rows, merged only within shared blocks); auto (default): packed when the "
           "layout has a pack made for this run's ranks, batch size, fan-outs and seed, else block")
    a("--superbatch", type=int, metavar="BATCHES",
      help="batches decided and read together (default 4 with --io-shape block or a dynamic policy, else 1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--features-in-memory", dest="features", action="store_const", const="memory",
                   help="baseline: the dataset's whole feature matrix in RAM (the correctness reference)")
    g.add_argument("--features-memmap", dest="features", action="store_const", const="memmap",
                   help="baseline: index a numpy memmap of features.npy, as plain PyG code does")
    a("--drop-page-cache", nargs="?", const="epoch", default="", choices=["epoch", "batch"],
      help="memmap baseline: drop features.npy from the page cache at every epoch start (or batch)")
    a("--memmap-random", action="store_true", help="memmap baseline: madvise(MADV_RANDOM), no read-around")
    a("--io-backend", choices=["io_uring", "pthreads", "python"], help="default: fastest usable")
    a("--queue-depth", type=int, default=128)
    a("--io-merge-gap", type=int, metavar="BYTES",
      help="merge SSD reads across gaps this small (default: 0 for rows; for block, per job the gap whose "
           "reads cost least on the disk)")
    a("--io-max-request", type=int, metavar="BYTES", help="largest merged SSD read (default: 128 KiB for "
                                                          "rows, 1 MiB for block)")
    a("--buffered", dest="direct", action="store_false", help="read shards through the page cache")
    a("--verify", action="store_true", help="check shard chunk checksums on first use")
    a("--no-pipeline", dest="pipeline", action="store_false", help="run the stages one after another")
    a("--depth", type=int, default=2, help="batches buffered between pipeline stages")
    a("--threads", type=int, help="torch intra-op threads per rank (default: cores / local ranks)")
    a("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    a("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(features="tiered")
    return p


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    ns = build_parser().parse_args(argv)
    cfg = TrainConfig(**vars(ns))
    cfg.check()
    return cfg
