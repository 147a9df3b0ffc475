"""The CUDA layer stays thin and listed: only the modules `tools/cuda_tests.py`'s CUDA_LAYER names have
CUDA-only lines, each names the tests that run those lines where CUDA exists, and docs/cuda.md lists them.
Below, the CUDA tests of lines no other test reaches (they skip without CUDA; `moment doctor --gpu` runs them
on a GPU machine)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tools.cuda_tests import CUDA_LAYER

REPO = Path(__file__).resolve().parents[1]
#: what makes a line CUDA-only: a call into torch.cuda, a branch on the device type or on NCCL, pinned host
#: memory, a stream recorded on a tensor
CUDA_ONLY = re.compile(r"""torch\.cuda\b|\.type\s*[!=]=\s*["'](?:cuda|cpu)["']|["']nccl["']|record_stream|pin_memory""")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _prose(tree: ast.AST) -> set[int]:
    """The lines of docstrings (what they say about CUDA is not code)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            lines |= set(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _cuda_modules() -> dict[str, list[int]]:
    """Each module with CUDA-only code lines (comments and docstrings aside), and those lines."""
    found: dict[str, list[int]] = {}
    for p in sorted((REPO / "moment").rglob("*.py")):
        text = p.read_text()
        prose = _prose(ast.parse(text))
        for no, line in enumerate(text.splitlines(), start=1):
            if no not in prose and CUDA_ONLY.search(line.split("#", 1)[0]):
                found.setdefault(p.relative_to(REPO).as_posix(), []).append(no)
    return found


def test_only_the_listed_modules_have_cuda_only_lines():
    found = _cuda_modules()
    unlisted = {m: lines for m, lines in found.items() if m not in CUDA_LAYER}
    assert not unlisted, (f"CUDA-only lines outside the CUDA layer: {unlisted}; move them into moment/io/device.py "
                          "(or list the module in tools/cuda_tests.py's CUDA_LAYER with the tests that run them, and in docs/cuda.md)")
    assert sorted(CUDA_LAYER) == sorted(found), "a listed module has no CUDA-only line any more: drop it from the list"


def test_every_listed_module_names_tests_that_run_on_cuda_and_the_document_lists_both():
    doc = (REPO / "docs" / "cuda.md").read_text()
    for module, tests in CUDA_LAYER.items():
        assert tests, module
        assert f"`{module}`" in doc, f"docs/cuda.md does not list {module}"
        for t in tests:
            text = (REPO / t).read_text()
            assert "torch.cuda.is_available()" in text or "torch.cuda.device_count()" in text, (module, t)
            assert t in doc, f"docs/cuda.md does not name {t}"


def test_the_pattern_finds_what_it_is_for():
    for line in ('x = torch.cuda.Stream()', 'if dev.type == "cuda":', 'b = "nccl" if c else "gloo"',
                 't.record_stream(s)', "torch.empty(4, pin_memory=True)", "self._torch.cuda.Event()"):
        assert CUDA_ONLY.search(line), line
    for line in ('device: Literal["cpu", "cuda"]', "read_nccl_xml(path)", 'result["cuda"]'):
        assert not CUDA_ONLY.search(line), line


def test_without_cuda_no_device_has_an_address():
    from moment.runtime.devices import cuda_pci_addresses

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert cuda_pci_addresses() is None


# ---- where CUDA exists ----------------------------------------------------------------------------------


@cuda
def test_a_checkpoint_restores_the_cuda_generators(tmp_path):
    """moment.runtime.checkpoint: an exact resume on a GPU repeats the CUDA random draws (dropout) too; the
    checkpoint holds the rank's own device's generator only (the last device: not the current one)."""
    from moment.runtime.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state

    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    torch.cuda.manual_seed_all(7)
    save_checkpoint(tmp_path, {"rng": rng_state(dev)})
    first = torch.rand(8, device=dev)
    torch.cuda.manual_seed_all(8)
    state = load_checkpoint(tmp_path)["rng"]
    assert isinstance(state["cuda"], torch.Tensor)  # one generator's state, not a list of every GPU's
    set_rng_state(state, dev)
    assert torch.equal(torch.rand(8, device=dev), first)


@cuda
def test_every_cuda_device_has_a_pci_address_and_a_rank_takes_one():
    """moment.runtime.devices and dist.setup's CUDA branch (one rank: no process group)."""
    from moment.runtime.devices import cuda_pci_addresses
    from moment.runtime.dist import setup

    addrs = cuda_pci_addresses()
    assert len(addrs) == torch.cuda.device_count()
    assert all(a is None or re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0", a) for a in addrs), addrs
    ctx = setup("cuda", [("gpu0", None)])
    assert ctx.device == torch.device("cuda", 0) and ctx.backend is None and torch.cuda.current_device() == 0
    assert ctx.serves.plan_gpus == ("gpu0",)


@cuda
def test_ddp_wraps_the_model_on_the_ranks_cuda_device(tmp_path):
    """`Run.ddp` (what moment.runtime.train uses) gives DDP the rank's CUDA device (DeviceLayer.ddp_device_ids): one
    NCCL rank runs that line."""
    import torch.distributed as dist

    from moment.runtime.config import TrainConfig
    from moment.runtime.dist import DistContext
    from moment.runtime.gpucheck import make_layout
    from moment.runtime.train import train

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    layout = make_layout(tmp_path, 1)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    ctx = DistContext(0, 0, 1, 1, dev, "nccl")
    try:
        m = train(TrainConfig(layout=layout, epochs=1, fanouts=[10, 5], hidden=32, threads=1, quiet=True,
                              device="cuda"), ctx)
    finally:
        ctx.close()
    assert m["dist_backend"] == "nccl" and m["steps"] > 0 and np.isfinite(m["loss_curve"]).all()
