"""The built-in models' layers (moment.runtime.layers) against PyG's SAGEConv and GATConv: from one seed,
the same initial weights under the same names, and bit-equal outputs, gradients and losses over several
optimiser steps with dropout on, on blocks from Moment's own sampler (a hub, targets without in-edges, a
block without edges). And a rank's model no longer imports torch-geometric."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moment.runtime import models
from moment.workload.sampler import CSRGraph, NeighborSampler

REPO = Path(__file__).resolve().parents[1]


def graph(n: int, seed: int) -> CSRGraph:
    """In-neighbour lists: node 0 a hub, every 7th node without in-edges."""
    rng = np.random.default_rng(seed)
    rows = [[] if v % 7 == 3 else sorted(set(rng.integers(0, n, 6).tolist())) for v in range(n)]
    rows[0] = list(range(1, n))
    indptr = np.cumsum([0] + [len(r) for r in rows])
    return CSRGraph.from_arrays(indptr.astype(np.int64), np.array([u for r in rows for u in r], dtype=np.int64))


def batches(num_layers: int) -> list:
    s = NeighborSampler(graph(300, 1), [5] * num_layers, seed=0)
    return [s.sample([0, 3, 10, 17, 24]), s.sample(list(range(40, 80))), s.sample([3])]  # [3]: no edges at all


def pyg_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moment's model classes, built from PyG's layers instead (GAT as the models configure it)."""
    pyg = pytest.importorskip("torch_geometric.nn", reason="PyG is the reference: pip install torch_geometric")
    monkeypatch.setattr(models, "SAGEConv", pyg.SAGEConv)
    monkeypatch.setattr(models, "GATConv", functools.partial(pyg.GATConv, add_self_loops=False))


def train(model: torch.nn.Module, mbs: list, steps: int) -> tuple[list[torch.Tensor], dict]:
    """Outputs and losses of `steps` Adam steps (train mode: dropout draws), the last step's gradients."""
    torch.manual_seed(5)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    seen, grads = [], {}
    for i in range(steps):
        mb = mbs[i % len(mbs)]
        x = torch.randn(mb.num_nodes, 12)
        out = model(x, mb.blocks())
        loss = out.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += [out.detach(), loss.detach()]
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        seen += [model(torch.randn(mb.num_nodes, 12), mb.blocks()) for mb in mbs]
    return seen, grads


@pytest.mark.parametrize("name,num_layers", [("sage", 2), ("sage", 3), ("gat", 2), ("gat", 3)])
def test_the_layers_are_bit_equal_to_pygs(monkeypatch, name, num_layers):
    mbs = batches(num_layers)
    torch.manual_seed(0)
    ours = models.build_model(name, 12, 4, num_layers=num_layers, hidden=8)
    pyg_layers(monkeypatch)
    torch.manual_seed(0)
    ref = models.build_model(name, 12, 4, num_layers=num_layers, hidden=8)
    monkeypatch.undo()
    assert {type(c).__module__ for c in ref.convs}.isdisjoint(type(c).__module__ for c in ours.convs)
    # the names and the order of the parameters (an optimiser's state follows the order), then the values
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in ref.named_parameters()]
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values()))
    ours_seen, ours_grads = train(ours, mbs, 6)
    ref_seen, ref_grads = train(ref, mbs, 6)
    assert len(ours_seen) == len(ref_seen)
    for a, b in zip(ours_seen, ref_seen):
        assert a.shape == b.shape and torch.equal(a, b)
    assert ours_grads.keys() == ref_grads.keys()
    assert all(torch.equal(ours_grads[k], ref_grads[k]) for k in ours_grads)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), ref.state_dict().values()))


def test_a_checkpoint_of_pygs_layers_loads_into_ours(monkeypatch):
    pyg_layers(monkeypatch)
    ref = models.build_model("gat", 12, 4)
    monkeypatch.undo()
    ours = models.build_model("gat", 12, 4)
    ours.load_state_dict(ref.state_dict())  # strict: every name, every shape
    mb = batches(2)[1]
    x = torch.randn(mb.num_nodes, 12)
    ours.eval()
    ref.eval()
    assert torch.equal(ours(x, mb.blocks()), ref(x, mb.blocks()))


def test_the_models_and_a_rank_start_do_not_import_pyg():
    code = ("import sys\nfrom moment.runtime.models import build_model\nimport moment.runtime.train\n"
            "import moment.runtime.run\nbuild_model('sage', 8, 2); build_model('gat', 8, 2)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch_geometric'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"
