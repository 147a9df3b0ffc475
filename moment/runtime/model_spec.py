"""The model, loss and optimizer a run trains with (`--model`, `--loss`, `--optimizer`, `--weight-decay`), and what
one of its steps holds for the memory budget.

`--model` is `sage`, `gat` (moment.runtime.models, over the sampler's blocks) or the user's own as
`MODULE:FACTORY`. The factory is called with the keywords `in_dim`, `num_classes`, `num_layers` and `hidden`
and returns a `torch.nn.Module` that takes `(x, edge_index)` of the whole sampled subgraph, as PyG's models
do: local ids, seeds first, row 0 of `edge_index` the neighbour and row 1 the target (PyG's source_to_target
flow); the first `batch_size` rows of its output are the seeds' logits. `--loss MODULE:FUNCTION` is called as
`fn(logits, labels)` (int64 classes; on a multi-label dataset float 0/1 targets [B, C]) and returns a scalar
tensor; the default is cross entropy (binary cross entropy with logits on a multi-label dataset).

A model of the user's own that does something wrong (its module cannot be imported, the factory is missing,
not callable or raises, it returns no module, a module without parameters, or its forward fails or returns
another shape on a tiny batch) stops the run at its start, before any step, in one line naming `--model SPEC` and
the exception's last line: the factory is the user's code, and a traceback through the trainer would only
hide which part of it failed. `--loss` likewise, checked on tiny logits up front and cheaply at every step.

Step memory protocol: a module may state what one of its training steps holds beyond the batch's features,
its weights, their gradients and the optimizer's state (its activations, what autograd saves and their
gradients, at the most), as a method

    def step_bytes(self, layers: list[LayerExtent], rows: int, in_dim: int) -> int

(`layers`: each layer's block at the batch's extent, input layer first: its source nodes, target nodes and
edges; `rows`: the batch's input rows). `training_bytes` adds the weights, their gradients, DDP's gradient
buckets and the optimizer's state (`OPTIMIZERS`). A module that states nothing is measured: one step on a
synthetic batch of the extent, on the run's device (moment.runtime.step_memory), and the run says so.

Trainer wiring (moment.runtime.train): `make_model(cfg, in_dim, num_classes, num_layers)`,
`make_optimizer(module.parameters(), cfg)`, `load_loss(cfg.loss, num_classes, multilabel)`, and per step
`loss_fn(forward(model, cfg.model, x, blocks), y)`; the budget's "training" item is `training_bytes(...)`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from moment.errors import MomentError
from moment.io.device import DeviceLayer
from moment.runtime.config import BUILT_IN_MODELS, TrainConfig, callable_spec
from moment.runtime.footprint import OPTIMIZER_SLOTS, LayerExtent, stated_training_bytes
from moment.runtime.models import build_model, load_optimizers
from moment.runtime.step_memory import LiveStorage, storage_bytes, synthetic_blocks
from moment.workload.sampler import Block

__all__ = ["OPTIMIZERS", "SGD_MOMENTUM", "LossFn", "forward", "is_built_in", "load_callable", "load_loss", "load_rank_code",
           "make_model", "make_optimizer", "measure_step_bytes", "probe_extent", "training_bytes"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SGD_MOMENTUM = 0.9  # `--optimizer sgd`: plain SGD rarely trains a GNN in the epochs Adam needs; momentum does
#: --optimizer: (class, its fixed keywords, weight-sized tensors it keeps per parameter: the budget's share)
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any], int]] = {
    "adam": (torch.optim.Adam, {}, OPTIMIZER_SLOTS["adam"]),  # weight decay: L2, added to the gradient
    "adamw": (torch.optim.AdamW, {}, OPTIMIZER_SLOTS["adamw"]),  # weight decay decoupled (Loshchilov & Hutter)
    "sgd": (torch.optim.SGD, {"momentum": SGD_MOMENTUM}, OPTIMIZER_SLOTS["sgd"]),
}
#: the tiny batch a model of the user's own is checked on: seeds, and per hop new nodes and edges
_PROBE_SEEDS, _PROBE_NEW, _PROBE_EDGES = 4, 6, 12


def _last_line(e: BaseException) -> str:
    """'ValueError: the message's last line': what a one-line error quotes of the user's exception."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1]}" if lines else type(e).__name__


def _a(obj: Any) -> str:
    """'an int', 'a list': the type of `obj` for a message."""
    name = type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def is_built_in(spec: str) -> bool:
    return spec in BUILT_IN_MODELS


def load_rank_code(spec: str | None) -> None:
    """Load what a rank of a run of `--model spec` loads later, before its fixed cost is measured: what torch's
    optimizers import on first use and a user's model module (PyG's layers, say)."""
    load_optimizers()
    if spec is not None and not is_built_in(spec):
        load_callable(spec, "--model")


def import_named(mod_name: str, source: str) -> ModuleType:
    """The module `mod_name`, imported with the current directory first on sys.path as `python -m` has it (so
    `examples.models` works from a checkout under `moment train` too, whose entry point is a script elsewhere).
    Anything wrong is one MomentError naming `source`."""
    if not all(part.isidentifier() for part in mod_name.split(".")):
        raise MomentError(f"{mod_name!r} is not a module name (e.g. mypkg.models)", source=source)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        missing = f"no module named {e.name!r}" if e.name else _last_line(e)
        where = "" if e.name == mod_name else f" (importing {mod_name})"
        raise MomentError(f"cannot import {mod_name}: {missing}{where}", source=source) from None
    except Exception as e:  # noqa: BLE001 - the user's module failed as it was imported: say how, in one line
        raise MomentError(f"importing {mod_name} failed: {_last_line(e)}", source=source) from None


def load_callable(spec: str, flag: str) -> Callable[..., Any]:
    """The callable `spec` ('pkg.module:attr', attr possibly dotted) names, its module imported as `import_named`
    imports it. Anything wrong is one MomentError naming `flag SPEC`."""
    source = f"{flag} {spec}"
    parts = callable_spec(spec)
    if parts is None:
        raise MomentError("not of the form MODULE:ATTR (e.g. mypkg.models:make)", source=source)
    mod_name, attr = parts
    obj: Any = import_named(mod_name, source)
    for i, name in enumerate(attr.split(".")):
        if not hasattr(obj, name):
            owner = ".".join([mod_name, *attr.split(".")[:i]])
            raise MomentError(f"{owner} has no attribute {name!r}", source=source)
        obj = getattr(obj, name)
    if not callable(obj):
        raise MomentError(f"{mod_name}:{attr} is not callable ({_a(obj)})", source=source)
    return obj


# ------------------------------------------------------------------ the model


def probe_extent(num_layers: int) -> list[LayerExtent]:
    """The tiny batch a model is checked on: 4 seeds, 6 new nodes and 12 edges per hop (input layer first)."""
    nodes = [_PROBE_SEEDS + _PROBE_NEW * h for h in range(num_layers + 1)]
    return [LayerExtent(nodes[num_layers - i], nodes[num_layers - i - 1], _PROBE_EDGES * (num_layers - i))
            for i in range(num_layers)]


def make_model(cfg: TrainConfig, in_dim: int, num_classes: int, num_layers: int) -> nn.Module:
    """The run's model, on the CPU: a built-in one (moment.runtime.models.build_model), or the factory's,
    checked on a tiny batch (`_check_model`) so that a wrong one stops the run in one line before any data is
    read. Its initial weights follow torch's global RNG, which the caller seeds."""
    if is_built_in(cfg.model):
        return build_model(cfg.model, in_dim, num_classes, num_layers, cfg.hidden)
    factory = load_callable(cfg.model, "--model")
    kw = {"in_dim": in_dim, "num_classes": num_classes, "num_layers": num_layers, "hidden": cfg.resolved_hidden()}
    source = f"--model {cfg.model}"
    call = f"factory({', '.join(f'{k}={v}' for k, v in kw.items())})"
    try:
        module = factory(**kw)
    except Exception as e:  # noqa: BLE001 - the user's factory failed: one line, no traceback
        raise MomentError(f"{call} failed: {_last_line(e)}", source=source) from None
    if not isinstance(module, nn.Module):
        raise MomentError(f"{call} returned {_a(module)}, not a torch.nn.Module", source=source)
    _check_model(module, cfg.model, in_dim, num_classes, num_layers)
    return module


def _probe_batch(module: nn.Module, in_dim: int, num_layers: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The tiny batch a model of the user's own is tried on (`probe_extent`, seeded): (x, edge_index) on the
    module's device, and its seeds' count (the first rows of the output)."""
    g = torch.Generator().manual_seed(0)
    nodes, blocks = synthetic_blocks(probe_extent(num_layers), generator=g)
    device = next(module.parameters()).device
    return torch.randn(nodes, in_dim, generator=g).to(device), blocks[0].edge_index.to(device), blocks[-1].num_dst


@contextlib.contextmanager
def _evaluating(module: nn.Module) -> Iterator[None]:
    """`module` in eval mode (dropout off, running statistics read, not updated), its own mode back after."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _check_model(module: nn.Module, spec: str, in_dim: int, num_classes: int, num_layers: int) -> None:
    """A forward on a tiny batch (eval mode, no gradients: the weights, their RNG and any running statistics
    are left as they were; lazily sized layers take their sizes), its output against the logits' shape.
    A module without parameters is refused before it: the optimizer would have nothing to train."""
    source = f"--model {spec}"
    if not any(p.requires_grad for p in module.parameters()):
        raise MomentError("the model has no trainable parameters", source=source)
    x, edge_index, seeds = _probe_batch(module, in_dim, num_layers)
    nodes = x.shape[0]
    try:
        with torch.no_grad(), _evaluating(module):
            out = module(x, edge_index)
    except Exception as e:  # noqa: BLE001 - the user's forward failed: one line, no traceback
        raise MomentError(f"its forward failed on a tiny batch (x {list(x.shape)}, edge_index "
                          f"{list(edge_index.shape)}): {_last_line(e)}", source=source) from None
    if (not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.ndim != 2
            or out.shape[0] < seeds or out.shape[1] != num_classes):
        got = (_a(out) if not isinstance(out, torch.Tensor) else
               f"{out.dtype} values of shape {list(out.shape)}" if not out.is_floating_point() else
               f"shape {list(out.shape)}")
        raise MomentError(f"its forward on a tiny batch of {nodes} nodes, {seeds} of them seeds, gave {got}; "
                          f"expected floating-point logits [{nodes}, {num_classes}]: a row per node, seeds first",
                          source=source)


def unused_parameters(module: nn.Module, spec: str, in_dim: int, num_layers: int) -> list[str]:
    """The trainable parameters of a model of the user's own that take no part in its seeds' logits on the tiny
    batch `_check_model` uses (a head for another task, a layer its forward skips). DistributedDataParallel must
    be told to look for them each step (`find_unused_parameters`), or a run of several ranks fails at its second
    step. Eval mode and `autograd.grad`: no running statistic, RNG draw or `.grad` is touched."""
    if is_built_in(spec):
        return []  # each uses every parameter
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    x, edge_index, seeds = _probe_batch(module, in_dim, num_layers)
    with _evaluating(module):
        logits = module(x, edge_index)[:seeds]
        if not logits.requires_grad:
            return [n for n, _ in named]
        grads = torch.autograd.grad(logits.float().sum(), [p for _, p in named], allow_unused=True)
    return [n for (n, _), grad in zip(named, grads, strict=True) if grad is None]


def forward(model: nn.Module, spec: str, x: torch.Tensor, blocks: Sequence[Block]) -> torch.Tensor:
    """The seeds' logits, [batch_size, num_classes], for either kind of model. `model` may be the module or its
    DDP wrapper (which forwards the arguments). Built-in models run layer by layer over `blocks`; a model of
    the user's own gets `(x, edge_index)` of the whole subgraph, which is the input layer's block (it holds
    every hop's edges and every node), and its first batch_size rows (the last block's targets) are taken."""
    if is_built_in(spec):
        return model(x, list(blocks))
    out = model(x, blocks[0].edge_index)
    return out[: blocks[-1].num_dst] if isinstance(out, torch.Tensor) else out


# ------------------------------------------------------------------ loss and optimizer


def load_loss(spec: str | None, num_classes: int, multilabel: bool = False) -> LossFn:
    """The run's loss: cross entropy (binary, with logits, for `multilabel` targets), or `--loss
    MODULE:FUNCTION`, checked on tiny logits now (a loss that is not a differentiable scalar is one line naming
    it) and at every step (host-side checks only: no sync)."""
    if spec is None:
        return F.binary_cross_entropy_with_logits if multilabel else F.cross_entropy
    fn = load_callable(spec, "--loss")
    source = f"--loss {spec}"

    def checked(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        try:
            out = fn(logits, y)
        except Exception as e:  # noqa: BLE001 - the user's loss failed: one line, no traceback
            raise MomentError(f"fn(logits {list(logits.shape)}, labels {list(y.shape)}) failed: {_last_line(e)}",
                              source=source) from None
        if not isinstance(out, torch.Tensor) or out.ndim != 0 or not out.is_floating_point():
            got = (_a(out) if not isinstance(out, torch.Tensor)
                   else f"a {out.dtype} tensor of shape {list(out.shape)}")
            raise MomentError(f"returned {got}; a loss must be a floating-point scalar tensor (reduce it, e.g. "
                              ".mean())", source=source)
        if logits.requires_grad and not out.requires_grad:
            raise MomentError("returned a loss that does not depend on the logits (no gradient flows back)",
                              source=source)
        return out

    g = torch.Generator().manual_seed(0)
    checked(torch.randn(_PROBE_SEEDS, num_classes, generator=g).requires_grad_(),
            random_targets(_PROBE_SEEDS, num_classes, multilabel, g))
    return checked


def random_targets(n: int, num_classes: int, multilabel: bool, g: torch.Generator) -> torch.Tensor:
    """Targets of the kind a run's loss takes: int64 classes [n], or float 0/1 targets [n, num_classes]."""
    if multilabel:
        return (torch.rand(n, num_classes, generator=g) < 0.5).float()
    return torch.randint(0, num_classes, (n,), generator=g)


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """--optimizer with --lr and --weight-decay (OPTIMIZERS: SGD with momentum 0.9; AdamW's decay decoupled)."""
    cls, fixed, _ = OPTIMIZERS[cfg.optimizer]
    return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **fixed)


# ------------------------------------------------------------------ step memory


def training_bytes(cfg: TrainConfig, in_dim: int, num_classes: int, layers: Sequence[LayerExtent], *, rows: int,
                   float_copy: bool, device: torch.device | str = "cpu", head_bytes: int = 0,
                   multilabel: bool = False) -> tuple[int, str | None]:
    """(what one training step holds beyond the batch's features, a note for the run's start or None): the
    budget's "training" item. Built-in models state it (moment.runtime.footprint.step_bytes); a model of the
    user's own states its activations (`step_bytes`, the module docstring's protocol) or is measured on
    `device` (`measure_step_bytes`), and the note says so. Deterministic for a given extent, so every rank
    that measures resolves the same plan. Leaves torch's global RNG as it found it. `head_bytes`: what runs on
    the model's output besides (the link decoder, moment.runtime.footprint.decoder_bytes), added as
    `step_bytes` adds it."""
    built_in = stated_training_bytes(cfg, in_dim, num_classes, layers, rows=rows, float_copy=float_copy,
                                     head_bytes=head_bytes)
    if built_in is not None:
        return built_in, None
    slots = OPTIMIZERS[cfg.optimizer][2]
    device = torch.device(device)
    copy = rows * in_dim * torch.float32.itemsize if float_copy else 0
    with DeviceLayer(device).fork_rng():
        torch.manual_seed(0)
        module = make_model(cfg, in_dim, num_classes, len(layers))
        stated = getattr(module, "step_bytes", None)
        if callable(stated):
            source = f"--model {cfg.model}"
            try:
                got = stated(list(layers), int(rows), int(in_dim))
            except Exception as e:  # noqa: BLE001 - the user's statement failed: one line, no traceback
                raise MomentError(f"its step_bytes(layers, rows, in_dim) failed: {_last_line(e)}",
                                  source=source) from None
            if isinstance(got, bool) or not isinstance(got, int) or got < 0:
                raise MomentError(f"its step_bytes(layers, rows, in_dim) returned {got!r}; it must be the "
                                  "bytes one step's activations hold, an integer >= 0", source=source)
            weights = storage_bytes(module.parameters())
            return got + (3 + slots) * weights + copy + head_bytes, None  # weights, gradients, DDP's buckets, optimizer
        got = measure_step_bytes(module.to(device), cfg, in_dim, num_classes, layers, device=device,
                                 multilabel=multilabel) + copy + head_bytes
    return got, f"measured one step of {cfg.model} at start: {got / 2**20:,.1f} MiB"


def measure_step_bytes(module: nn.Module, cfg: TrainConfig, in_dim: int, num_classes: int,
                       layers: Sequence[LayerExtent], *, device: torch.device | str = "cpu",
                       multilabel: bool = False) -> int:
    """One training step of `module` (--optimizer, --loss) measured on a synthetic batch of extent `layers`
    (random float32 features and random edges of each hop's size, `synthetic_blocks`), on `device`:

        the weights and the optimizer's state (made by a first step on the tiny probe batch, as a run's first
        step makes them) + one gradient-sized copy for DDP's buckets (as the built-in models state it)
        + the most the step's own tensors hold at any moment (`LiveStorage`: activations, saved tensors,
        gradients, the optimizer's temporaries).

    The features (and the edge ids, which the budget charges with the batch) are made before and not counted.
    `module` is trained by it: pass a copy the run will not use."""
    device = torch.device(device)
    opt = make_optimizer(module.parameters(), cfg)
    loss_fn = load_loss(cfg.loss, num_classes, multilabel)
    module.train()
    g = torch.Generator().manual_seed(0)

    def step(extent: Sequence[LayerExtent]) -> None:
        nodes, blocks = synthetic_blocks(extent, generator=g)
        blocks = [Block(b.edge_index.to(device), b.num_src, b.num_dst) for b in blocks]
        x = torch.randn(nodes, in_dim, generator=g).to(device)
        y = random_targets(blocks[-1].num_dst, num_classes, multilabel, g).to(device)
        opt.zero_grad(set_to_none=True)
        with LiveStorage() as live:
            loss_fn(forward(module, cfg.model, x, blocks), y).backward()  # the logits go once the loss has them
            opt.step()
        peaks.append(live.peak)

    peaks: list[int] = []
    source = f"--model {cfg.model}"
    try:
        step(probe_extent(len(layers)))  # the optimizer's state, lazily made kernels' buffers
        held = storage_bytes([*module.parameters(), *module.buffers()]) + storage_bytes(
            t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))
        bucket = storage_bytes(module.parameters())  # DDP's gradient buckets: one gradient-sized copy
        step(layers)
    except MomentError:
        raise
    except torch.OutOfMemoryError:
        raise MomentError(f"measuring one training step at the run's batch extent ran out of {device.type} "
                          "memory", source=source,
                          hint="give the model a step_bytes(layers, rows, in_dim) method, or lower --batch-size "
                               "or --fanouts") from None
    except Exception as e:  # noqa: BLE001 - the user's model failed its first full step: one line
        raise MomentError(f"one training step on a synthetic batch failed: {_last_line(e)}", source=source) from None
    finally:
        opt.zero_grad(set_to_none=True)
        DeviceLayer(device).release_cached()  # the device budget reads the free memory: give back the step's
    return held + bucket + peaks[-1]
