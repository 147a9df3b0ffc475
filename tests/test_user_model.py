"""`--model MODULE:FACTORY`, `--loss`, `--optimizer`, `--weight-decay` (moment.runtime.model_spec), and one step's
memory measured from the storages torch makes (moment.runtime.step_memory) where a model does not state it."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from runtime_data import CLASSES

from moment.errors import MomentError
from moment.runtime.config import TrainConfig, parse_args
from moment.runtime.model_spec import (OPTIMIZERS, SGD_MOMENTUM, forward, load_loss, make_model, make_optimizer,
                                       measure_step_bytes, training_bytes, unused_parameters)
from moment.runtime.models import SAGE, LayerExtent, build_model, step_bytes
from moment.runtime.step_memory import LiveStorage, storage_bytes, synthetic_blocks

GOOD = "tests.user_models:factory"


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"model": GOOD, **kw})


def _extent(new: list[int], edges: list[int]) -> tuple[list[LayerExtent], int]:
    """Layers (input first) of a batch whose hops add `new` nodes (seeds first) over `edges`, as sampled."""
    nodes, cut = np.cumsum(new).tolist(), np.cumsum([0, *edges]).tolist()
    hops = len(edges)
    return [LayerExtent(nodes[hops - i], nodes[hops - i - 1], cut[hops - i]) for i in range(hops)], nodes[-1]


def _one_line(e: pytest.ExceptionInfo, source: str) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    assert text.startswith(source + ": "), text
    return text


# ------------------------------------------------------------------ the model


def test_a_factory_of_ones_own_builds_the_model_and_forward_gives_the_seeds_logits():
    model = make_model(_cfg(hidden=16), 8, CLASSES, 3)
    assert type(model).__name__ == "SAGE3" and len(model.convs) == 3 and model.convs[1].in_channels == 16
    nodes, blocks = synthetic_blocks(_extent([5, 20, 60, 100], [20, 80, 200])[0])
    x = torch.randn(nodes, 8)
    out = forward(model, GOOD, x, blocks)
    assert out.shape == (5, CLASSES)
    # the whole subgraph went in: the seeds' rows are the model's own on (x, edge_index), not a block's
    model.eval()
    assert torch.equal(forward(model, GOOD, x, blocks), model(x, blocks[0].edge_index)[:5])
    sage = build_model("sage", 8, CLASSES, 3, 16)
    assert forward(sage, "sage", x, blocks).shape == (5, CLASSES)  # built-ins: over the blocks


def test_a_parameter_the_loss_does_not_use_is_found_without_touching_the_model():
    """DDP fails at a second step on a parameter that gets no gradient unless told to look for it: the run finds
    them on the tiny batch, in eval mode, its gradients and running statistics left as they were."""
    torch.manual_seed(0)
    spare = make_model(_cfg(model="tests.user_models:spare_head"), 8, 4, 2)
    before = {n: p.detach().clone() for n, p in spare.named_parameters()}
    assert unused_parameters(spare, "tests.user_models:spare_head", 8, 2) == ["other_task.weight", "other_task.bias"]
    assert spare.training and all(p.grad is None and torch.equal(p, before[n]) for n, p in spare.named_parameters())
    assert unused_parameters(make_model(_cfg(), 8, 4, 2), GOOD, 8, 2) == []
    assert unused_parameters(build_model("sage", 8, 4, 2, 16), "sage", 8, 2) == []


def test_hidden_defaults_to_256_for_a_model_of_ones_own():
    assert _cfg().resolved_hidden() == 256 and _cfg(hidden=12).resolved_hidden() == 12
    assert TrainConfig(model="gat").resolved_hidden() == 64 * 8


MODEL_MISTAKES = {
    "tests.no_such_module:factory": "cannot import tests.no_such_module: no module named 'tests.no_such_module'",
    "tests.user_models_broken:factory": "importing tests.user_models_broken failed: ImportError: this module needs "
                                        "torch_cluster",
    "tests.user_models:nope": "tests.user_models has no attribute 'nope'",
    "tests.user_models:SAGE3.nope": "tests.user_models.SAGE3 has no attribute 'nope'",
    "tests.user_models:NOT_CALLABLE": "tests.user_models:NOT_CALLABLE is not callable (an int)",
    "tests.user_models:raises": "factory(in_dim=8, num_classes=4, num_layers=2, hidden=256) failed: ValueError: but "
                                "got 257",
    "tests.user_models:no_module": "returned a list, not a torch.nn.Module",
    "tests.user_models:no_parameters": "the model has no trainable parameters",
    "tests.user_models:broken_forward": "its forward failed on a tiny batch (x [16, 8], edge_index [2, 24]): "
                                        "RuntimeError: mat1 and mat2 shapes cannot be multiplied",
    "tests.user_models:wrong_width": "gave shape [16, 5]; expected floating-point logits [16, 4]",
    "tests.user_models:too_few_rows": "gave shape [2, 4]; expected",
}


@pytest.mark.parametrize("spec", list(MODEL_MISTAKES))
def test_each_mistake_of_a_factory_is_one_line_naming_it(spec):
    with pytest.raises(MomentError) as e:
        make_model(_cfg(model=spec), 8, CLASSES, 2)
    assert MODEL_MISTAKES[spec] in _one_line(e, f"--model {spec}")


def test_a_models_own_step_statement_must_be_bytes():
    layers, rows = _extent([4, 10], [30])
    with pytest.raises(MomentError) as e:
        training_bytes(_cfg(model="tests.user_models:bad_statement"), 8, CLASSES, layers, rows=rows, float_copy=False)
    assert "its step_bytes(layers, rows, in_dim) returned -1" in _one_line(e, "--model tests.user_models:bad_statement")


# ------------------------------------------------------------------ loss and optimizer


def test_the_loss_is_cross_entropy_or_ones_own():
    assert load_loss(None, CLASSES) is F.cross_entropy
    logits, y = torch.randn(6, CLASSES, requires_grad=True), torch.randint(0, CLASSES, (6,))
    fn = load_loss("tests.user_models:smooth_loss", CLASSES)
    assert torch.equal(fn(logits, y), F.cross_entropy(logits, y, label_smoothing=0.1))


LOSS_MISTAKES = {
    "tests.user_models:vector_loss": "returned a torch.float32 tensor of shape [4]; a loss must be a floating-point "
                                     "scalar tensor",
    "tests.user_models:number_loss": "returned a float; a loss must be",
    "tests.user_models:detached_loss": "returned a loss that does not depend on the logits",
    "tests.user_models:failing_loss": "fn(logits [4, 4], labels [4]) failed: KeyError: 'labels'",
    "tests.user_models:nope": "tests.user_models has no attribute 'nope'",
    "tests.no_such_module:loss": "cannot import tests.no_such_module",
}


@pytest.mark.parametrize("spec", list(LOSS_MISTAKES))
def test_each_mistake_of_a_loss_is_one_line_naming_it_before_the_first_step(spec):
    with pytest.raises(MomentError) as e:
        load_loss(spec, CLASSES)
    assert LOSS_MISTAKES[spec] in _one_line(e, f"--loss {spec}")


def test_a_loss_that_goes_wrong_later_is_named_at_that_step():
    calls = []

    def late(logits, y):  # right on the up-front check, a vector at the first step
        calls.append(1)
        return F.cross_entropy(logits, y, reduction="mean" if len(calls) == 1 else "none")

    import tests.user_models as um

    um.late = late
    try:
        fn = load_loss("tests.user_models:late", CLASSES)
        with pytest.raises(MomentError) as e:
            fn(torch.randn(3, CLASSES, requires_grad=True), torch.zeros(3, dtype=torch.int64))
        assert "returned a torch.float32 tensor of shape [3]" in _one_line(e, "--loss tests.user_models:late")
    finally:
        del um.late


def test_the_optimizers_are_the_options_choices():
    assert set(OPTIMIZERS) == set(typing.get_args(TrainConfig.model_fields["optimizer"].annotation))


def _one_update(optimizer: str, weight_decay: float, grad: float = 0.0, lr: float = 0.1) -> torch.Tensor:
    p = torch.nn.Parameter(torch.tensor([2.0, -4.0]))
    opt = make_optimizer([p], TrainConfig(optimizer=optimizer, weight_decay=weight_decay, lr=lr))
    p.grad = torch.full_like(p, grad)
    opt.step()
    return p.detach()


def test_weight_decay_decays_as_each_optimizer_applies_it():
    w = torch.tensor([2.0, -4.0])
    # AdamW decouples it: with no gradient, the weights shrink by lr * wd and Adam's step is zero
    assert torch.allclose(_one_update("adamw", 0.5), w * (1 - 0.1 * 0.5))
    assert torch.equal(_one_update("adamw", 0.0), w)  # no --weight-decay: AdamW's own 0.01 is not applied
    # Adam adds it to the gradient, which Adam then normalises: a step of lr against each weight's sign
    assert torch.allclose(_one_update("adam", 0.5), w - 0.1 * torch.sign(w), atol=1e-6)
    # SGD adds it to the gradient; the first step's momentum buffer is that gradient
    assert torch.allclose(_one_update("sgd", 0.5), w * (1 - 0.1 * 0.5))
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))], TrainConfig(optimizer="sgd"))
    assert opt.defaults["momentum"] == SGD_MOMENTUM
    assert type(make_optimizer([torch.nn.Parameter(torch.zeros(1))], TrainConfig())) is torch.optim.Adam


# ------------------------------------------------------------------ step memory


def test_live_storage_counts_the_step_tensors_alone_to_the_byte():
    """x * w on 1000 x 8 features, the first 10 rows' sum as the loss, SGD with momentum."""
    R, C, seeds = 1000, 8, 10
    cfg = _cfg(model="tests.user_models:scale", loss="tests.user_models:sum_loss", optimizer="sgd")
    got, note = training_bytes(cfg, C, C, [LayerExtent(R, seeds, 50)], rows=R, float_copy=False)
    f32 = 4
    # held: the weights, SGD's momentum buffer, DDP's gradient-sized bucket; the step: the loss and its seed
    # gradient (a float each), then in the backward the slice's gradient (R x C zeros with the seeds' rows
    # in), beside mul's gradient for w (R x C) and its sum over the rows (C)
    assert got == 3 * C * f32 + 2 * f32 + 2 * R * C * f32 + C * f32, got
    assert note == f"measured one step of {cfg.model} at start: {got / 2**20:,.1f} MiB"
    # a float copy of the features (they are not float32 on disk) is charged beside it, as the built-ins do
    copied, _ = training_bytes(cfg, C, C, [LayerExtent(R, seeds, 50)], rows=R, float_copy=True)
    assert copied == got + R * C * f32


def test_views_of_tensors_made_before_and_freed_ones_are_not_held():
    a = torch.zeros(1000)
    with LiveStorage() as live:
        v = a[:10]  # a view of a tensor made before: not the step's
        b = torch.ones(256)  # 1 KiB, alive
        c = torch.ones(512)  # 2 KiB, freed
        del c
        b.add_(1)  # in place: nothing new
        assert live.live == 1024 and live.peak == 3072
    assert v.shape == (10,) and storage_bytes([a, a[3:], b]) == 4000 + 1024


# the built-in GraphSAGE states its step from its autograd graph (tests/test_models.py checks it against the
# kernel's high-water mark); measuring it must agree. Measured/stated on CPU: 1.001 (128-d in, 256 hidden,
# bench-shaped 1024-seed batch), 1.031 (3 layers), 1.003 (16-d in, 512 hidden), GAT 1.009
SAGE_BATCHES = [(64, 128, [256, 2000, 15000], [2200, 19000]), (32, 64, [128, 900, 6000, 20000], [900, 7000, 24000])]


@pytest.mark.parametrize("in_dim,hidden,new,edges", SAGE_BATCHES)
def test_a_measured_step_of_the_built_in_sage_matches_its_statement(in_dim, hidden, new, edges):
    layers, rows = _extent(new, edges)
    torch.manual_seed(0)
    model = build_model("sage", in_dim, CLASSES, len(edges), hidden)
    measured = measure_step_bytes(model, TrainConfig(model="sage", hidden=hidden), in_dim, CLASSES, layers)
    stated = step_bytes("sage", in_dim, CLASSES, hidden, layers, rows=rows, float_copy=False)
    assert 0.97 <= measured / stated <= 1.08, (measured, stated, measured / stated)


def test_training_bytes_states_measures_or_takes_the_models_word():
    layers, rows = _extent([64, 400, 2000], [450, 4000])
    sage_adam, note = training_bytes(TrainConfig(hidden=32), 16, CLASSES, layers, rows=rows, float_copy=False)
    assert note is None and sage_adam == step_bytes("sage", 16, CLASSES, 32, layers, rows=rows, float_copy=False)
    sage_sgd, _ = training_bytes(TrainConfig(hidden=32, optimizer="sgd"), 16, CLASSES, layers, rows=rows,
                                 float_copy=False)
    weights = sum(SAGE.layer_weights(a, b) for a, b in zip([16, 32], [32, CLASSES])) * 4
    assert sage_adam - sage_sgd == weights  # SGD keeps one weight-sized buffer, Adam two
    before = torch.random.get_rng_state()
    mine, note = training_bytes(_cfg(hidden=32), 16, CLASSES, layers, rows=rows, float_copy=False)
    assert torch.equal(torch.random.get_rng_state(), before)  # the run's initial weights are not moved
    assert note.startswith(f"measured one step of {GOOD} at start: ") and note.endswith(" MiB")
    # SAGE3 is PyG's layers run over the whole subgraph, every layer over every node and edge: the built-in's
    # statement at that extent, plus the per-edge messages PyG's layer gathers (32 wide in the second layer's
    # forward, where this step holds the most) and the built-in's does not (it states one value per edge)
    whole = [LayerExtent(rows, rows, layers[0].edges)] * len(layers)
    messages = whole[1].edges * (32 - 1) * 4
    assert 0.97 <= mine / (step_bytes("sage", 16, CLASSES, 32, whole, rows=rows, float_copy=False) + messages) <= 1.08
    stated, note = training_bytes(_cfg(model="tests.user_models:stated", hidden=32), 16, CLASSES, layers, rows=rows,
                                  float_copy=False)
    # the model's word for its activations, plus its weights, gradients, DDP's bucket and Adam's two moments
    assert note is None and stated == 1000 * 2 + rows + 16 + 5 * weights


# ------------------------------------------------------------------ the options and a run


def test_the_options_parse(tmp_path: Path):
    cfg = parse_args(["--dataset", str(tmp_path), "--features-in-memory", "--model", GOOD, "--loss",
                      "tests.user_models:smooth_loss", "--optimizer", "adamw", "--weight-decay", "1e-4"])
    assert (cfg.model, cfg.loss, cfg.optimizer, cfg.weight_decay) == (GOOD, "tests.user_models:smooth_loss",
                                                                      "adamw", 1e-4)
    base = parse_args(["--dataset", str(tmp_path), "--features-in-memory"])
    assert (base.model, base.loss, base.optimizer, base.weight_decay) == ("sage", None, "adam", 0.0)


def test_run_inputs_measure_a_model_of_ones_own_and_say_so(runtime_dataset):
    from moment.runtime.sizing import run_inputs
    from moment.workload.sampler import CSRGraph, SeedBatches

    ds = runtime_dataset
    batches = SeedBatches(np.asarray(ds.train_idx), 64, seed=0)
    graph = CSRGraph.from_dataset(ds)
    mine = run_inputs(_cfg(hidden=32, fanouts=[10, 5]), ds, graph, [batches], [10, 5], 0, 0, 1, None)
    sage = run_inputs(TrainConfig(hidden=32, fanouts=[10, 5]), ds, graph, [batches], [10, 5], 0, 0, 1, None)
    assert mine.training_note.startswith(f"measured one step of {GOOD} at start") and sage.training_note is None
    assert mine.training_bytes > sage.training_bytes > 0  # all its layers run over the whole subgraph


def test_a_run_trains_a_model_and_loss_of_ones_own(runtime_dataset, tmp_path):
    from moment.runtime.train import train

    cfg = TrainConfig(dataset=runtime_dataset.path, features="memory", model=GOOD, loss="tests.user_models:smooth_loss",
                      optimizer="adamw", weight_decay=1e-4, fanouts=[10, 5, 3], hidden=32, lr=0.01, epochs=2,
                      threads=1, quiet=True, checkpoint_dir=tmp_path / "ck")
    m = train(cfg)
    curve = m["loss_curve"]
    assert m["model"] == GOOD and len(curve) == m["steps"] >= 8
    assert np.mean(curve[-4:]) < 0.8 * np.mean(curve[:4]), curve
    assert m["val_accuracy"] > 1.0 / CLASSES + 0.2, m["val_accuracy_curve"]
    # its checkpoint records the loss and optimizer: resuming with another is refused, naming it
    with pytest.raises(MomentError, match="optimizer 'adamw' vs 'sgd'"):
        train(cfg.model_copy(update={"optimizer": "sgd", "resume": True}))
    # a wrong factory stops the run in one line before it trains
    with pytest.raises(MomentError) as e:
        train(cfg.model_copy(update={"model": "tests.user_models:wrong_width", "checkpoint_dir": None}))
    assert "gave shape" in _one_line(e, "--model tests.user_models:wrong_width")


def test_a_factory_is_imported_from_the_current_directory_as_python_m_would(tmp_path, monkeypatch):
    """`moment train` is a script elsewhere: its sys.path does not start with the directory it runs in."""
    from moment.runtime.model_spec import load_callable

    (tmp_path / "my_models_here.py").write_text("def make(**kw):\n    return kw\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_models_here", raising=False)
    assert load_callable("my_models_here:make", "--model")(a=1) == {"a": 1}
