"""What a training step holds, as the model states it (moment.runtime.models.step_bytes: the memory budget's
"training" item), against a step measured in a fresh process (tests/model_step.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from moment.errors import MomentError
from moment.runtime.models import LayerExtent, build_model, step_bytes

REPO = Path(__file__).resolve().parents[1]

# [model, in_dim, hidden, classes, [seeds, new nodes of hop 1, ...], [edges of hop 1, ...]]: batches shaped as
# the bench's (1024 seeds, fan-outs 25,10), a three-layer one, wide hidden layers over narrow features, GAT, and
# link steps (a seventh item: label edges; the output as wide as a hidden layer), one whose decoder holds the most,
# and a narrow hidden layer over wide features, whose forward holds the most (a rule counting per-edge messages,
# which the SAGE layer never makes, states it 5x over). The two large GAT steps are a quarter of the bench's
# batch: ~100 and ~200 MiB measured, their per-edge, per-head tensors still most of it (the ratio 0.99-1.02 at a
# quarter as at full size, where they cost 4 of the test's 11 CPU-s); the small ones stay whole (a quarter of
# the three-layer GAT measured 1.07-1.08, a half of the link SAGE 1.14: the process's own pages weigh more)
CONFIGS = [["sage", 128, 256, 4, [1024, 9000, 68000], [9300, 78000]],
           ["sage", 512, 8, 4, [1024, 9000, 68000], [9300, 78000]],
           ["sage", 64, 128, 4, [512, 4000, 30000, 60000], [4000, 32000, 70000]],
           ["sage", 16, 512, 4, [512, 4300, 34000], [4400, 38000]],
           ["gat", 128, 64, 4, [128, 1075, 8500], [1100, 9500]],
           ["gat", 32, 16, 4, [256, 1300, 5000, 23000], [1100, 6400, 24000]],
           ["sage", 16, 512, 512, [1536, 12000, 60000], [13000, 70000], 16384],
           ["gat", 128, 64, 64, [384, 3000, 15000], [3250, 17500], 512]]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures the kernel's high-water mark (Linux)")
def test_a_step_holds_what_its_model_states(tmp_path):
    """Within -5%/+15% of a measured step (the budget's prediction rests on it), for SAGE and GAT: a rule
    that ignores GAT's per-edge, per-head tensors or a third layer's larger first block is many times off.
    The high-water mark also counts pages beyond the tensors (GAT's step measured 0.969 of its statement
    once in a parallel suite, 0.99-1.05 alone), hence -5%."""
    out = tmp_path / "steps.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def measure(configs: list) -> list[dict]:
        r = subprocess.run([sys.executable, str(REPO / "tests" / "model_step.py"), str(out), json.dumps(configs)],
                           env=env, capture_output=True, text=True, timeout=300)
        if r.returncode and "cannot reset" in r.stderr + r.stdout:
            pytest.skip("the kernel does not let a process reset its high-water mark")
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(out.read_text())

    steps = measure(CONFIGS)
    # pages beyond the tensors only ever add to a high-water mark: a step measured high under load is measured
    # again, and the lower figure kept
    again = [c for c, got in zip(CONFIGS, steps) if got["stated"] / got["measured"] < 0.95]
    if again:
        redo = iter(measure(again))
        steps = [min(got, next(redo), key=lambda g: g["measured"]) if got["stated"] / got["measured"] < 0.95
                 else got for got in steps]
    for got in steps:
        ratio = got["stated"] / got["measured"]
        assert 0.95 <= ratio <= 1.15, (got, ratio)
        assert got["weights_stated"] == got["weights"]  # the parameters the model states, without building it


def test_a_step_states_a_float_copy_of_features_that_are_not_float32():
    layers = [LayerExtent(5000, 600, 6000), LayerExtent(600, 64, 700)]
    f32 = step_bytes("sage", 100, 4, 32, layers, rows=5000, float_copy=False)
    assert step_bytes("sage", 100, 4, 32, layers, rows=5000, float_copy=True) == f32 + 5000 * 100 * 4
    with pytest.raises(MomentError, match="--model 'gcn'"):
        step_bytes("gcn", 100, 4, 32, layers, rows=5000, float_copy=False)


@pytest.mark.parametrize("args, kwargs, words", [(("gcn", 64, 4), {}, "build_model('gcn'): choose 'sage' or 'gat'"),
                                                 (("sage", 0, 4), {}, "build_model(in_dim=0): must be an integer >= 1"),
                                                 (("gat", "64", 4), {}, "build_model(in_dim='64')"),
                                                 (("sage", 64, 0), {}, "build_model(num_classes=0)"),
                                                 (("sage", 64, 4), {"num_layers": 0}, "build_model(num_layers=0)"),
                                                 (("gat", 64, 4), {"hidden": -1}, "build_model(hidden=-1)"),
                                                 (("sage", 64, 4), {"hidden": True}, "build_model(hidden=True)")])
def test_a_scripts_model_sizes_are_checked_before_torch_sees_them(args, kwargs, words):
    """A zero input width was a ZeroDivisionError, a negative hidden width torch's negative dimension, and zero
    layers a model with no layer at all."""
    with pytest.raises(MomentError) as e:
        build_model(*args, **kwargs)
    assert str(e.value).startswith(words), str(e.value)


def test_numpy_sizes_build_the_same_model():
    torch.manual_seed(0)
    a = build_model("gat", np.int64(16), np.int32(3), num_layers=np.int64(2), hidden=np.int64(8))
    torch.manual_seed(0)
    b = build_model("gat", 16, 3, num_layers=2, hidden=8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
