"""Training options: one typed model, the only source of their defaults, types and help.

`python -m moment.train`'s parser is derived from it (each field's `Flag` says how it is spelled on
the command line), and `moment train` forwards every option to it unchanged, so an option added here
is accepted everywhere at once.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from moment.errors import MomentError, validation_lines
from moment.workload.spec import default_batch_size

DEFAULT_FANOUTS = {1: [10], 2: [25, 10], 3: [15, 10, 5]}
FEATURES = ("tiered", "memory", "memmap")


@dataclass(frozen=True)
class Flag:
    """How a TrainConfig field is given on the command line (the default is the field's own)."""

    help: str = ""
    name: str | None = None  # default: --field-name
    metavar: str | None = None
    action: str | None = None  # store_true / store_false / store_const
    const: Any = None
    nargs: str | None = None
    group: str | None = None  # flags of one group are mutually exclusive


def _fanouts(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"fan-outs must be integers like 25,10, got {text!r}") from None
    if not out or any(f <= 0 for f in out):
        raise argparse.ArgumentTypeError(f"fan-outs must be positive integers, got {text!r}")
    return out


class TrainConfig(BaseModel):
    """Every option of a training run; defaults here and nowhere else."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    layout: Annotated[Path | None, Flag("layout directory written by `moment place`")] = None
    dataset: Annotated[Path | None, Flag("dataset directory (default: the one the layout was made from)")] = None
    model: Annotated[Literal["sage", "gat"], Flag("GNN: GraphSAGE or GAT")] = "sage"
    epochs: Annotated[int, Flag("epochs to train")] = 1
    metrics_json: Annotated[Path | None, Flag("write the run's summary here (rank 0, atomically)")] = None
    fanouts: Annotated[list[int], Flag("per-hop fan-outs, outermost last, e.g. 25,10")] = []
    layers: Annotated[Literal[1, 2, 3] | None, Flag("GNN layers (default: number of fan-outs, else 2)")] = None
    batch_size: Annotated[int | None, Flag("seeds per rank and step (default: min(8000, max(64, "
                                           "train_nodes // (world_size * 8))))")] = None
    hidden: Annotated[int | None, Flag("hidden width (default: 256 for sage, 64x8 heads for gat)")] = None
    lr: Annotated[float, Flag("learning rate (Adam)")] = 3e-3
    seed: Annotated[int, Flag("seed of sampling, shuffling and the model's initial weights")] = 0
    checkpoint_dir: Annotated[Path | None, Flag(
        "write checkpoints here; a torchrun restart resumes from the last one (`moment train` picks one in "
        "the run directory when not given)")] = None
    checkpoint_every: Annotated[int | None, Flag(
        "steps between checkpoints (default: a quarter epoch with --checkpoint-dir; 0: none)",
        metavar="STEPS")] = None
    resume: Annotated[bool, Flag("continue from the checkpoint in --checkpoint-dir (automatic after a "
                                 "torchrun restart)", action="store_true")] = False
    memory_budget: Annotated[str | None, Flag(
        "memory for the whole run on this machine (all local ranks), e.g. 3GiB; auto: the cgroup limit or "
        "available memory, less a margin. Every large buffer is sized from it and the split is printed at "
        "start; a budget below the run's minimum is refused (the message names it)",
        metavar="BYTES|auto")] = None
    cpu_cache_limit: Annotated[str | None, Flag(
        "cap the CPU cache, e.g. 2GiB or 10%% of the features (default: what the budget leaves; without a "
        "budget, the layout's CPU bins)")] = None
    cache_policy: Annotated[Literal["static", "lru", "belady-superbatch"], Flag(
        "CPU cache policy: static (hottest rows by pre-sampled hotness, one copy shared by the local ranks), "
        "lru, or belady-superbatch (Ginex: the next superbatch's accesses decide what stays)")] = "static"
    io_shape: Annotated[Literal["auto", "rows", "block", "packed"], Flag(
        "how misses are read: packed (DiskGNN: each batch's misses from the contiguous segment `moment data "
        "pack` wrote for it), block (a hyperbatch's misses in large merged reads, AGNES) or rows (each "
        "batch's rows, merged only within shared blocks); auto (default): packed when the layout has a pack "
        "made for this run's ranks, batch size, fan-outs and seed, else block")] = "auto"
    superbatch: Annotated[int | None, Flag(
        "batches decided and read together (default 4 with --io-shape block or a dynamic policy, else 1)",
        metavar="BATCHES")] = None
    features: Annotated[Literal["tiered", "memory", "memmap"], Flag(
        "baseline: the dataset's whole feature matrix in RAM (the correctness reference)",
        name="--features-in-memory", action="store_const", const="memory", group="features"), Flag(
        "baseline: index a numpy memmap of features.npy, as plain PyG code does",
        name="--features-memmap", action="store_const", const="memmap", group="features")] = "tiered"
    drop_page_cache: Annotated[Literal["", "epoch", "batch"], Flag(
        "memmap baseline: drop features.npy from the page cache at every epoch start (or batch)",
        nargs="?", const="epoch")] = ""
    memmap_random: Annotated[bool, Flag("memmap baseline: madvise(MADV_RANDOM), no read-around",
                                        action="store_true")] = False
    io_backend: Annotated[Literal["io_uring", "pthreads", "python"] | None, Flag(
        "default: fastest usable")] = None
    queue_depth: Annotated[int, Flag("I/O requests in flight per rank")] = 128
    io_merge_gap: Annotated[int | None, Flag(
        "merge SSD reads across gaps this small (default: 0 for rows; for block, per job the gap whose reads "
        "cost least on the disk)", metavar="BYTES")] = None
    io_max_request: Annotated[int | None, Flag(
        "largest merged SSD read (default: 128 KiB for rows, 1 MiB for block)", metavar="BYTES")] = None
    peer_tier: Annotated[bool, Flag(
        "read the rows of other local GPUs' cache bins from the layout's files instead of copying them from "
        "those GPUs' memory (the peer tier: device to device on CUDA, a shared segment on CPU runs)",
        name="--no-peer-tier", action="store_false")] = True
    direct: Annotated[bool, Flag("read shards through the page cache", name="--buffered",
                                 action="store_false")] = True
    verify: Annotated[bool, Flag("check shard chunk checksums on first use", action="store_true")] = False
    pipeline: Annotated[bool, Flag("run the stages one after another", name="--no-pipeline",
                                   action="store_false")] = True
    depth: Annotated[int, Flag("batches buffered between pipeline stages")] = 2
    threads: Annotated[int | None, Flag("torch intra-op threads per rank (default: cores / local ranks)")] = None
    device: Annotated[Literal["cpu", "cuda"] | None, Flag("default: cuda when available")] = None
    quiet: Annotated[bool, Flag("no progress bar or summary", action="store_true")] = False

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

    def resolved_hidden(self) -> int:
        """--hidden, or 256 for GraphSAGE and 64 x 8 heads = 512 for GAT."""
        return self.hidden or (256 if self.model == "sage" else 512)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

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
        self.resolved_fanouts()
        self.check_outputs()

    def check_outputs(self) -> None:
        """Outputs that would only be written at the end (or at a checkpoint) are checked before the run."""
        from moment.outputs import check_output

        if self.metrics_json is not None:
            check_output(self.metrics_json, "--metrics-json")
        if self.checkpoint_dir is not None:
            check_output(self.checkpoint_dir, "--checkpoint-dir", directory=True)



def _flags(name: str) -> list[Flag]:
    return [m for m in TrainConfig.model_fields[name].metadata if isinstance(m, Flag)]


def _value_type(annotation: Any) -> tuple[Any, list | None]:
    """(argparse type, choices) of a field's annotation: Optional stripped, Literal → choices."""
    base = annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        base = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(base) is Literal:
        values = [v for v in typing.get_args(base) if v != ""]
        return type(values[0]), values
    if typing.get_origin(base) is list:
        return _fanouts, None
    return base, None


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m moment.train`, one flag per TrainConfig field (in field order)."""
    p = argparse.ArgumentParser(
        prog="python -m moment.train",
        description="Data-parallel out-of-core GNN training from a Moment layout (launch with torchrun "
                    "for several ranks; without it, one process).")
    groups: dict[str, Any] = {}
    for name, info in TrainConfig.model_fields.items():
        for flag in _flags(name):
            target = p
            if flag.group is not None:
                if flag.group not in groups:
                    groups[flag.group] = p.add_mutually_exclusive_group()
                target = groups[flag.group]
            kw: dict[str, Any] = {"dest": name, "help": flag.help}
            if flag.action is not None:
                kw["action"] = flag.action
                if flag.action == "store_const":
                    kw["const"] = flag.const
            else:
                kind, choices = _value_type(info.annotation)
                kw.update(type=kind, choices=choices)
                if flag.metavar:
                    kw["metavar"] = flag.metavar
                if flag.nargs:
                    kw.update(nargs=flag.nargs, const=flag.const)
            target.add_argument(flag.name or "--" + name.replace("_", "-"), **kw)
        p.set_defaults(**{name: info.default})
    return p


def option_names() -> list[str]:
    """Every flag `python -m moment.train` takes (what `moment train --help` lists)."""
    return [f.name or "--" + n.replace("_", "-") for n in TrainConfig.model_fields for f in _flags(n)]


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    ns = build_parser().parse_args(argv)
    try:
        cfg = TrainConfig(**vars(ns))
    except ValidationError as e:
        raise MomentError("training options: " + "; ".join(validation_lines(e))) from None
    cfg.check()
    return cfg
