"""Training options: one typed model, the only source of their defaults, types and help.

`python -m moment.train`'s parser is derived from it (each field's `Flag` says how it is spelled on
the command line), and `moment train` forwards every option to it unchanged, so an option added here
is accepted everywhere at once.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from moment.errors import MomentError
from moment.workload.parquet import check_matrix_output, need_pyarrow, parquet_output
from moment.workload.seeds import SEED_LIMIT
from moment.workload.spec import FANOUTS_HELP, default_batch_size, fanouts_refused, split_fanouts

# Imports inside functions: parsing options loads no I/O engine, budget or torch: `moment train --help` and
# the dry run start fast.

DEFAULT_FANOUTS = {1: [10], 2: [25, 10], 3: [15, 10, 5]}
BUILT_IN_MODELS = ("sage", "gat")  # moment.runtime.models builds them; anything else is MODULE:ATTR
DEFAULT_HIDDEN = 256  # GraphSAGE's hidden width in the paper, and a model of the user's own
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_CALLABLE = re.compile(rf"({_DOTTED}):({_DOTTED})")
FEATURES = ("tiered", "memory", "memmap")
HELP_HINT = "--help describes every option"
#: the same, for a script's `open_run(**options)`: its keywords are the flags'
KEYWORDS_HINT = "open_run takes `python -m moment.train --help`'s options as keywords (--batch-size: batch_size=)"


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
        out = split_fanouts(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"fan-outs must be integers like 25,10, got {text!r}: {e}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"fan-outs must be positive integers, got {text!r}")
    return out


def effective_fanouts(fanouts: list[int], max_degree: int, given: bool = True) -> tuple[list[int], str | None]:
    """The fan-outs a graph whose largest in-degree is `max_degree` samples with: each at most that degree
    (a larger one takes every neighbour of every node, as that degree does), and a note naming them when
    one given on the command line (`given`) is larger, so that a run's figures are not read as the flag's."""
    eff = [min(int(f), max(int(max_degree), 1)) for f in fanouts]
    if eff == list(fanouts) or not given:
        return eff, None
    hops = [str(i + 1) for i, (f, e) in enumerate(zip(fanouts, eff, strict=True)) if f != e]
    which = f"hop {hops[0]} samples" if len(hops) == 1 else f"hops {', '.join(hops)} sample"
    return eff, (f"--fanouts {','.join(map(str, fanouts))}: {which} at most {max_degree} neighbours (the graph's "
                 f"largest degree); using {','.join(map(str, eff))}")


def callable_spec(text: str) -> tuple[str, str] | None:
    """'pkg.module:attr' -> ('pkg.module', 'attr') (attr may be dotted: 'pkg.mod:Class.make'); None when
    `text` is not of that form. Its form only: moment.runtime.model_spec imports it."""
    m = _CALLABLE.fullmatch(text.strip())
    return (m.group(1), m.group(2)) if m else None


class TrainConfig(BaseModel):
    """Every option of a training run; defaults here and nowhere else."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), frozen=True)  # derived: the RunPlan

    layout: Annotated[Path | None, Flag("layout directory written by `moment place`")] = None
    dataset: Annotated[Path | None, Flag("dataset directory (default: the one the layout was made from)")] = None
    model: Annotated[str, Flag(
        "GNN: sage (GraphSAGE), gat, or your own as MODULE:FACTORY (imported with the current directory on the "
        "path, e.g. mypkg.models:make): called with the keywords in_dim, num_classes, num_layers and hidden, it "
        "returns a torch.nn.Module that takes (x, edge_index) of the whole sampled subgraph (local ids, seeds "
        "first, as PyG's models do); the first batch-size rows of its output are the seeds' logits. A method "
        "step_bytes(layers, rows, in_dim) states one step's activations for the memory budget; without it one "
        "step is measured at start", metavar="sage|gat|MODULE:FACTORY")] = "sage"
    task: Annotated[Literal["node", "link"], Flag(
        "node: classify the training nodes (cross-entropy on their labels); link: link prediction, as PyG's "
        "LinkNeighborLoader trains it (each training node's in-edge from a random neighbour is a positive, "
        "--negatives random destinations per positive; the model embeds the endpoints, a dot product scores "
        "an edge, binary cross-entropy; validated by ROC AUC on the validation nodes' edges)")] = "node"
    negatives: Annotated[int, Field(ge=1, le=100), Flag("link prediction: negative edges per positive")] = 1
    epochs: Annotated[int, Field(ge=1), Flag("epochs to train")] = 1
    metrics_json: Annotated[Path | None, Flag("write the run's summary here (rank 0, atomically)")] = None
    predict: Annotated[Path | None, Flag(
        "after the last epoch, write each node's predicted class here (CSV, or Parquet when FILE ends in .parquet; "
        "rank 0, atomically): node, its id in the graph's own ids when the import numbered them, the class (its "
        "name when the labels were names) and its probability; on a multi-label dataset the classes whose logit "
        "is above 0", metavar="FILE")] = None
    predict_nodes: Annotated[Literal["all", "train", "val", "test"], Flag(
        "the nodes --predict writes: every node, or a split's")] = "all"
    embed: Annotated[Path | None, Flag(
        "after the last epoch, write the model's output for every node here (rank 0, atomically), a float32 .npy "
        "[N, width] whose row i is node i (or Parquet when FILE ends in .parquet: node, id, embedding): with "
        "--task link each node's embedding, otherwise its logits",
        metavar="FILE")] = None
    io_trace: Annotated[Path | None, Flag(
        "write each rank's SSD reads to DIR/rank-N.iolog when it ends, as fio replays them (fio --read_iolog "
        "FILE --replay_no_stall=1 --direct=1): the disk's rate for exactly this run's reads (the caches' fill at "
        "start apart, in DIR/rank-N.setup.iolog)", metavar="DIR")] = None
    fanouts: Annotated[list[int], Flag(FANOUTS_HELP)] = []
    layers: Annotated[Literal[1, 2, 3] | None, Flag("GNN layers (default: number of fan-outs, else 2)")] = None
    batch_size: Annotated[int | None, Field(ge=1), Flag("seeds per rank and step (default: min(8000, max(64, "
                                           "train_nodes // (world_size * 8))))")] = None
    hidden: Annotated[int | None, Field(ge=1), Flag("hidden width (default: 256 for sage; for gat the width per head, "
                                                         "64, with 8 heads)")] = None
    lr: Annotated[float, Field(gt=0, allow_inf_nan=False), Flag("learning rate (of --optimizer)")] = 3e-3
    loss: Annotated[str | None, Flag(
        "loss as MODULE:FUNCTION, called as fn(logits, labels) with the seeds' logits and int64 labels (float 0/1 "
        "targets [B, C] on a multi-label dataset); it returns a scalar tensor (default: cross entropy; binary cross "
        "entropy with logits on multi-label targets)", metavar="MODULE:FUNCTION")] = None
    optimizer: Annotated[Literal["adam", "adamw", "sgd"], Flag(
        "adam, adamw (weight decay decoupled from the gradient) or sgd (momentum 0.9)")] = "adam"
    weight_decay: Annotated[float, Field(ge=0, allow_inf_nan=False), Flag(
        "the optimizer's weight decay (adam and sgd: an L2 term added to the gradient; adamw: decoupled; "
        "default 0 for each, AdamW's own 0.01 included)")] = 0.0
    seed: Annotated[int, Field(ge=0, le=SEED_LIMIT - 1), Flag("seed of sampling, shuffling and the model's initial weights")] = 0
    checkpoint_dir: Annotated[Path | None, Flag(
        "write checkpoints here; a torchrun restart resumes from the last one (`moment train` picks one in "
        "the run directory when not given)")] = None
    checkpoint_every: Annotated[int | None, Field(ge=0), Flag(
        "steps between checkpoints (default: a quarter epoch with --checkpoint-dir; 0: none)",
        metavar="STEPS")] = None
    resume: Annotated[bool, Flag("continue from the checkpoint in --checkpoint-dir (automatic after a "
                                 "torchrun restart)", action="store_true")] = False
    memory_budget: Annotated[str | None, Flag(
        "memory for the whole run on this machine (all local ranks), e.g. 3GiB; auto: the cgroup limit or "
        "available memory, less a margin. Every large buffer is sized from it and the split is printed at "
        "start; a budget below the run's minimum is refused (the message names it)",
        metavar="BYTES|auto")] = None
    device_memory_budget: Annotated[str | None, Flag(
        "device memory per rank on a CUDA run, e.g. 40GiB or 80%% of the device; auto (default): the device's "
        "free memory less headroom. What a rank holds on its GPU is stated item by item at start (CUDA context, "
        "NCCL buffers, a training step, the batches in flight, exchange rounds); the GPU tier gets the rest, at "
        "most its GPU bins' rows. Fixed needs above the budget are refused (the message names the minimum)",
        metavar="BYTES|SHARE|auto")] = None
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
    superbatch: Annotated[int | None, Field(ge=1), Flag(
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
    loader_workers: Annotated[int, Field(ge=0), Flag(
        "memmap baseline: sample and gather in this many torch DataLoader worker processes per rank, "
        "overlapping training, as PyG's NeighborLoader(num_workers=N) does (0: in the rank's own pipeline)",
        metavar="N")] = 0
    io_backend: Annotated[Literal["io_uring", "pthreads", "python"] | None, Flag(
        "default: fastest usable")] = None
    queue_depth: Annotated[int, Flag("I/O requests in flight per rank")] = 128
    io_merge_gap: Annotated[int | None, Field(ge=0), Flag(
        "merge SSD reads across gaps this small (default: 0 for rows; for block, per job the gap whose reads "
        "cost least on the disk)", metavar="BYTES")] = None
    io_max_request: Annotated[int | None, Field(ge=1), Flag(
        "largest merged SSD read (default: 128 KiB for rows, 1 MiB for block)", metavar="BYTES")] = None
    peer_tier: Annotated[Literal["auto", "on", "off"], Flag(
        "the rows of other local GPUs' cache bins: copied from those GPUs' memory (on: the peer tier, a "
        "collective exchange per training batch, NCCL on GPUs, gloo on CPU runs; evaluation reads them as off "
        "does) or read from the rank's own CPU cache and the layout's files (off); auto: on CUDA, off on CPU")] = "auto"
    direct: Annotated[bool, Flag("read shards through the page cache", name="--buffered",
                                 action="store_false")] = True
    verify: Annotated[bool, Flag("check shard chunk checksums on first use", action="store_true")] = False
    pipeline: Annotated[bool, Flag("run the stages one after another", name="--no-pipeline",
                                   action="store_false")] = True
    depth: Annotated[int, Field(ge=1), Flag("batches buffered between pipeline stages")] = 2
    threads: Annotated[int | None, Field(ge=1), Flag("torch intra-op threads per rank (default: cores / local ranks)")] = None
    device: Annotated[Literal["cpu", "cuda"] | None, Flag("default: cuda when available")] = None
    quiet: Annotated[bool, Flag("no progress bar or summary", action="store_true")] = False
    data_only: Annotated[bool, Flag(
        "run the data path alone (sampling, every tier's reads, the exchanges between ranks) without the model: "
        "no forward, backward, optimizer or gradient all-reduce. Measures the feed rate (seeds/s, SSD bytes/s) "
        "a machine sustains; the metrics say data_only and carry no loss or accuracy", action="store_true")] = False

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

    def resolved_superbatch(self, io_shape: str | None = None) -> int:
        """Batches decided together: a hyperbatch for block reads, Ginex's superbatch for Belady.
        `io_shape`: the shape the run plan resolved --io-shape to (default: --io-shape as given)."""
        if self.superbatch is not None:
            return self.superbatch
        return 4 if ((io_shape or self.io_shape) != "rows" or self.cache_policy != "static") else 1

    def peer_tier_on(self, device: str) -> bool:
        """Whether ranks on `device` exchange the rows of each other's GPU tiers (`--peer-tier`).

        Why auto is off on CPU: there gloo moves a peer's rows through the host's TCP stack (a copy into and out
        of a socket on each side, per batch, on the cores that train), which costs a rank more than taking them
        from its own CPU cache or SSDs. bench/epoch.py, 2 ranks on 2 cores, steady epochs without the tier / with
        it: 8M x 128 under 3 GiB 1.51, 1.53 / 1.69, 1.69 s; 16M x 256 under 5 GiB 3.85, 3.82 / 4.37, 4.24 s. On
        CUDA NCCL moves them device to device (NVLink or PCIe peer to peer), far cheaper than a host or SSD read."""
        return self.peer_tier == "on" or (self.peer_tier == "auto" and device == "cuda")

    def resolved_hidden(self) -> int:
        """The hidden layers' width: --hidden (GAT: per head, x 8 heads), else 256 for GraphSAGE and a model of
        the user's own (its factory's `hidden`), 64 x 8 for GAT."""
        if self.model == "gat":
            return (self.hidden or 64) * 8
        return self.hidden or DEFAULT_HIDDEN

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v in BUILT_IN_MODELS or callable_spec(v):
            return v
        raise ValueError(f"choose {' or '.join(BUILT_IN_MODELS)}, or give your model's factory as MODULE:FACTORY "
                         "(e.g. mypkg.models:make)")

    @field_validator("fanouts")
    @classmethod
    def _fanouts_bound(cls, v: list[int]) -> list[int]:
        why = fanouts_refused(v)
        if why:
            raise ValueError(why)
        return v

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str | None) -> str | None:
        if v is None or callable_spec(v):
            return v
        raise ValueError("give your loss function as MODULE:FUNCTION (e.g. mypkg.losses:focal), or leave "
                         "--loss out for cross entropy")

    @field_validator("queue_depth")
    @classmethod
    def _queue_depth(cls, v: int) -> int:
        from moment.io.engines import MAX_QUEUE_DEPTH  # the I/O layer owns the bound (imported late: numpy)

        if not 1 <= v <= MAX_QUEUE_DEPTH:
            raise ValueError(f"must be an integer from 1 to {MAX_QUEUE_DEPTH}")
        return v

    @field_validator("cpu_cache_limit")
    @classmethod
    def _cpu_cache_limit(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from moment.sizes import parse_size

        try:
            millionths = parse_size(v, 10**6) if v.strip() else None  # a share: of 10**6
        except MomentError:
            millionths = None
        if millionths is None:
            raise ValueError("must be bytes (e.g. 2GiB) or a share of the features (e.g. 10%)")
        if v.strip().endswith("%") and millionths > 10**6:
            raise ValueError("a share of the features must be at most 100%")
        return v

    def check(self, run_dir: bool = False) -> None:
        """What the field types cannot say: options that need each other, the budget against the machine,
        the outputs. Both entry points (`moment train` before torchrun starts, and every rank) call it.
        `run_dir`: `moment train` checks it, which gives a run without --checkpoint-dir its run directory's
        (--checkpoint-every needs none; that directory is checked as the run directory, moment.runtime.runs)."""
        if self.features == "tiered" and self.layout is None:
            raise MomentError("--layout is required (or use --features-in-memory / --features-memmap "
                              "with --dataset)")
        if self.features != "tiered" and self.layout is None and self.dataset is None:
            raise MomentError("--dataset is required without --layout")
        for name, flag in (("drop_page_cache", "--drop-page-cache"), ("memmap_random", "--memmap-random")):
            if getattr(self, name) and self.features != "memmap":  # (were ignored: a "cold" run ran warm)
                raise MomentError(f"{flag} is for the --features-memmap baseline: other runs read through their own "
                                  "tiers, which it does not touch", hint=f"add --features-memmap --dataset DIR, or "
                                  f"leave {flag} out")
        if self.loader_workers and self.features != "memmap":
            raise MomentError(f"--loader-workers {self.loader_workers} is for the --features-memmap baseline "
                              "(Moment's own runs overlap their stages in the rank's pipeline)",
                              hint="add --features-memmap --dataset DIR, or leave --loader-workers out")
        if self.loader_workers and self.drop_page_cache == "batch":
            raise MomentError("--drop-page-cache batch cannot be combined with --loader-workers: the workers "
                              "read several batches at once, so no batch starts cold",
                              hint="use --drop-page-cache epoch, or --loader-workers 0")
        if self.task == "link" and self.loss is not None:
            raise MomentError(f"--loss {self.loss} is for node classification: --task link trains with binary "
                              "cross-entropy on the edges' dot-product scores", hint="leave --loss out with --task link")
        if self.data_only and (self.checkpoint_dir is not None or self.checkpoint_every or self.resume):
            flag = ("--resume" if self.resume else "--checkpoint-every" if self.checkpoint_every
                    else "--checkpoint-dir")
            raise MomentError(f"{flag}: a --data-only run trains no model, so it has nothing to checkpoint or "
                              "resume", hint=f"drop {flag} or --data-only")
        if (self.resume or (self.checkpoint_every and not run_dir)) and self.checkpoint_dir is None:
            raise MomentError("--checkpoint-every/--resume need --checkpoint-dir")
        if self.predict is not None and (self.task == "link" or self.data_only):
            flag = "--task link" if self.task == "link" else "--data-only"
            raise MomentError(f"--predict writes each node's class, which {flag} does not train",
                              hint=f"drop --predict or {flag}")
        if self.embed is not None and self.data_only:
            raise MomentError("--embed writes the model's output, and a --data-only run trains no model",
                              hint="drop --embed or --data-only")
        if self.predict_nodes != "all" and self.predict is None:
            raise MomentError(f"--predict-nodes {self.predict_nodes} names the nodes --predict writes: give --predict FILE")
        if self.memory_budget is not None:
            from moment.runtime.budget import resolve_budget

            resolve_budget(self.memory_budget)
        if self.device_memory_budget is not None:  # its form here; its size against the device in each rank
            from moment.runtime.device_budget import resolve_device_budget

            resolve_device_budget(self.device_memory_budget, None)
        self.resolved_fanouts()
        self.check_outputs()

    def check_outputs(self) -> None:
        """Outputs that would only be written at the end (or at a checkpoint) are checked before the run."""
        from moment.outputs import check_output

        if self.metrics_json is not None:
            check_output(self.metrics_json, "--metrics-json")
        if self.checkpoint_dir is not None:
            check_output(self.checkpoint_dir, "--checkpoint-dir", directory=True)
        if self.io_trace is not None:
            check_output(self.io_trace, "--io-trace", directory=True)
        if self.embed is not None:
            check_matrix_output(self.embed, "--embed")
        for path, flag in ((self.predict, "--predict"), (self.embed, "--embed")):
            if path is not None:
                check_output(path, flag)
                if parquet_output(path):
                    need_pyarrow(f"writing {path} as Parquet", flag)


def _flags(name: str) -> list[Flag]:
    return [m for m in TrainConfig.model_fields[name].metadata if isinstance(m, Flag)]


def flag_of(name: str) -> str:
    """How field `name` is spelled on the command line (its first flag)."""
    flags = _flags(name)
    return (flags[0].name if flags and flags[0].name else None) or "--" + name.replace("_", "-")


def _base(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _is_list(name: str) -> bool:
    return typing.get_origin(_base(TrainConfig.model_fields[name].annotation)) is list


def allowed(name: str, keywords: bool = False) -> str:
    """The values field `name` takes, for people: 'an integer >= 1', 'a finite number > 0', ... (`keywords`: as
    a Python caller writes them)."""
    info = TrainConfig.model_fields[name]
    base = _base(info.annotation)
    kind = {int: "an integer", float: "a finite number"}.get(base)
    if typing.get_origin(base) is Literal:  # "" is the option left out (--drop-page-cache's)
        values = [repr(v) if keywords else str(v) for v in typing.get_args(base) if v != ""]
        return "one of " + ", ".join(values) + (" (or '' for none)" if "" in typing.get_args(base) else "")
    if _is_list(name):
        return f"a list of positive integers, one per layer (e.g. {'[25, 10]' if keywords else '25,10'})"
    if kind is None:
        return "a valid value (see --help)"
    lo = next((("", m.ge) for m in info.metadata if getattr(m, "ge", None) is not None), None) or next(
        ((">", m.gt) for m in info.metadata if getattr(m, "gt", None) is not None), None)
    hi = next((m.le for m in info.metadata if getattr(m, "le", None) is not None), None)
    if lo and hi is not None and not lo[0]:
        return f"{kind} from {lo[1]} to {hi}"
    if lo:
        return f"{kind} {lo[0] or '>='} {lo[1]}"
    return kind


def _option_error(err: ValidationError, keywords: bool = False) -> MomentError:
    """One line for the options pydantic refused: each names its flag (`keywords`: its keyword argument, for
    a Python caller), the value given and what is allowed."""
    spell = (lambda n: f"{n}=") if keywords else flag_of
    parts, unknown = [], False
    flags = _keyword_spellings() if keywords else {}
    for e in err.errors():
        name = e["loc"][0] if e["loc"] else ""
        if name not in TrainConfig.model_fields and e["type"] == "extra_forbidden":  # a misspelt option
            flag = "--" + str(name).replace("_", "-")
            if flag in flags:  # a flag written as a keyword: --no-pipeline is pipeline=False
                parts.append(f"{name}=: open_run takes {flag} as {flags[flag]}")
                continue
            unknown = True
            parts.append(f"unknown option {spell(name) if keywords else name}")
            continue
        if name not in TrainConfig.model_fields:
            parts.append(f"{name}: {e['msg']}" if name else e["msg"])
            continue
        given = e.get("input")
        if isinstance(given, list) and not keywords:  # as it was typed: --fanouts 0,5
            given = ",".join(map(str, given))
        elif keywords and _is_list(name):
            given = repr(given)  # fanouts='25,10' is not fanouts=[25, 10]
        given = given if isinstance(given, str) and given.strip() else repr(given)
        why = e["msg"].removeprefix("Value error, ") if e["type"] == "value_error" else f"must be {allowed(name, keywords)}"
        parts.append(f"{spell(name)}{'' if keywords else ' '}{given}: {why}")
    # the mapping of flags to keywords helps with a keyword open_run does not know, not with one it does
    return MomentError("; ".join(parts), hint=(KEYWORDS_HINT if unknown else None) if keywords else HELP_HINT)


def make_config(*, keywords: bool = False, **values: Any) -> TrainConfig:
    """TrainConfig(**values), with refused values as one MomentError naming each flag (`keywords`: each keyword
    argument, and the joint checks run too, their flags' mapping to keywords in the hint) and its range."""
    if keywords:
        _check_keyword_types(values)
    if keywords and isinstance(values.get("fanouts"), list | tuple) and not values["fanouts"]:
        # a config keeps [] for "not given" (the default's); a caller that gives [] means none, which is no model
        raise MomentError("fanouts=[]: give one fan-out per layer (e.g. [25, 10]), or leave fanouts out for the "
                          "default")
    try:
        cfg = TrainConfig(**values)
        if keywords:  # (a caller of its own: the run's start checks it again, at no cost)
            cfg.check()
        return cfg
    except ValidationError as e:
        raise _option_error(e, keywords) from None
    except MomentError as e:  # the options' joint checks spell them as flags: a script reads its keywords
        if not keywords:
            raise
        raise keyword_error(e) from None


def _check_keyword_types(values: dict[str, Any]) -> None:
    """What pydantic's coercion lets through from Python but the command line never could: True as a batch
    size of 1, and a model or loss function object where its import path is taken (each rank imports it)."""
    for name, v in values.items():
        if name not in TrainConfig.model_fields:
            continue  # pydantic names it
        if isinstance(v, bool) and _base(TrainConfig.model_fields[name].annotation) in (int, float):
            raise MomentError(f"{name}={v!r}: must be {allowed(name, True)}, not a bool")
        if _is_list(name) and isinstance(v, list | tuple) and any(isinstance(x, bool) for x in v):  # True was 1
            raise MomentError(f"{name}={list(v)!r}: must be {allowed(name, True)}, not bools")
        if name in ("model", "loss") and callable(v):
            what = "model's factory" if name == "model" else "loss function"
            where = f"{getattr(v, '__module__', None) or 'mypkg.models'}:{getattr(v, '__qualname__', 'make')}"
            raise MomentError(
                f"{name}={getattr(v, '__qualname__', type(v).__name__)}: give your {what} by its import path, "
                f"'MODULE:{'FACTORY' if name == 'model' else 'FUNCTION'}' (here '{where}'), which every rank imports",
                hint="or build the model in your script and train it in your own loop with run.ddp(model)"
                if name == "model" else None)


def _keyword_spellings() -> dict[str, str]:
    """Each flag -> how a script's `open_run` says it: the keyword, with the value a flag without one stands for."""
    out = {}
    for name in TrainConfig.model_fields:
        for flag in _flags(name):
            value = {"store_const": f"={flag.const!r}", "store_true": "=True", "store_false": "=False"}
            out[flag.name or "--" + name.replace("_", "-")] = name + value.get(flag.action or "", "")
    return out


def as_keywords(text: str) -> str:
    """A message about training options, its flags spelt as `open_run` keywords (`--dataset DIR` -> `dataset=DIR`);
    a command in backticks (`moment place --dataset DIR`) is left as it is typed."""
    spell = _keyword_spellings()

    def one(m: re.Match) -> str:
        word = spell.get(m.group(1))
        if word is None:
            return m.group(0)
        value = m.group(2)
        if value is None:
            return word
        return f"{word}={value}" if "=" not in word else f"{word} {value}"
    parts = text.split("`")
    return "`".join(re.sub(r"(--[a-z][a-z0-9-]*)(?: ([A-Z][A-Z_]*)\b)?", one, part) if i % 2 == 0 else part
                    for i, part in enumerate(parts))


def keyword_error(e: MomentError, hint: str | None = None) -> MomentError:
    """`e` as a script that gave `open_run` its options reads it (`as_keywords`; `hint` where `e` has none); `e`
    itself, its type kept, when nothing in it is a flag."""
    message, new_hint = as_keywords(e.message), as_keywords(e.hint) if e.hint else hint
    if message == e.message and new_hint == e.hint:
        return e
    kind = type(e) if type(e).__init__ is MomentError.__init__ else MomentError  # AgreedError stays one
    return kind(message, source=e.source, hint=new_hint, field=e.field, remedies=e.remedies)


def _value_type(annotation: Any) -> tuple[Any, list | None]:
    """(argparse type, choices) of a field's annotation: Optional stripped, Literal -> choices; numbers stay
    text, so that the model checks them and says which range it takes."""
    base = _base(annotation)
    if typing.get_origin(base) is Literal:
        values = [v for v in typing.get_args(base) if v != ""]
        return type(values[0]), values
    if typing.get_origin(base) is list:
        return _fanouts, None
    if base in (int, float):
        return str, None
    if base is Path:
        return _path, None
    return base, None


def _path(text: str) -> Path:
    """A path flag's value; an empty one is refused as given (Path("") is `.`, which errors then named)."""
    if text == "":
        raise argparse.ArgumentTypeError("'' is an empty path: give the name of a file or directory")
    return Path(text)


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one MomentError line instead of the usage text and exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        raise MomentError(message.removeprefix("argument "), hint=HELP_HINT)


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m moment.train`, one flag per TrainConfig field (in field order)."""
    p = _Parser(
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
                elif kind is str and _base(info.annotation) in (int, float):
                    kw["metavar"] = name.upper()
                if flag.nargs:
                    kw.update(nargs=flag.nargs, const=flag.const)
            target.add_argument(flag.name or "--" + name.replace("_", "-"), **kw)
        p.set_defaults(**{name: info.default})
    return p


def _attach_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """'--lr -1e-3' -> '--lr=-1e-3': argparse takes a value that starts with '-' for an option (unless it
    looks like a plain negative number) and answers 'expected one argument'; the model then says which
    range the option takes."""
    takes_value = {s for a in parser._actions for s in a.option_strings if a.nargs is None and a.type is not None}
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if (a in takes_value and nxt is not None and nxt.startswith("-") and nxt != "--"
                and nxt.split("=", 1)[0] not in parser._option_string_actions):
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def option_names() -> list[str]:
    """Every flag `python -m moment.train` takes (what `moment train --help` lists)."""
    return [f.name or "--" + n.replace("_", "-") for n in TrainConfig.model_fields for f in _flags(n)]


def user_model(model: str | None) -> str | None:
    """`model` where it names a user's MODULE:FACTORY; None for a built-in model (or none)."""
    return None if model is None or model in BUILT_IN_MODELS else model


def _rank_options(argv: list[str]) -> argparse.Namespace | None:
    """A rank's command line read as the rank reads it; None for a request for help and a line that does not
    parse (the rank says why)."""
    if "-h" in argv or "--help" in argv:
        return None
    p = build_parser()
    try:
        ns, _ = p.parse_known_args(_attach_values(list(argv), p))
    except MomentError:
        return None
    return ns


def user_model_in(argv: list[str]) -> str | None:
    """The user's `--model MODULE:FACTORY` a rank's command line names; None for a built-in model, and as
    `_rank_options`."""
    ns = _rank_options(argv)
    return None if ns is None else user_model(ns.model)


def layout_in(argv: list[str]) -> str | None:
    """The layout a rank's command line reads its features from (--layout of a tiered run); None for a
    baseline, and as `_rank_options`."""
    ns = _rank_options(argv)
    return None if ns is None or ns.features != "tiered" or ns.layout is None else str(ns.layout)


def parse_args(argv: list[str] | None = None, *, check: bool = True) -> TrainConfig:
    """The options of a run, validated (the one place both `moment train` and every rank validate them);
    `check=False` leaves `TrainConfig.check` to the caller (`moment train` adds a checkpoint directory)."""
    p = build_parser()
    ns = p.parse_args(_attach_values(list(sys.argv[1:] if argv is None else argv), p))
    cfg = make_config(**vars(ns))
    if check:
        cfg.check()
    return cfg
