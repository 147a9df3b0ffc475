"""What a training step holds, measured from the tensors torch makes: one code path on CPU and CUDA.

A model that does not state its step's memory (moment.runtime.model_spec) is run once on a synthetic batch
of the run's extent, and `LiveStorage` counts the bytes of every tensor storage the step makes while it is
alive. Why not the allocator's own figures: CPU has none (the kernel's high-water mark counts pages, freed
ones and other threads' too), and CUDA's `max_memory_allocated` is per device and process, shared with
the pipeline's threads. Counting storages sees the same tensors on both devices, so the figure a CPU rank
measures is the one a CUDA rank measures (CUDA's allocator rounds each block up to 512 B: counted so).
It misses what a kernel allocates inside itself without the dispatcher (scratch space of a few ops), which
is why the built-in models state their step from their autograd graphs instead.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from moment.io.device import allocation_bytes
from moment.runtime.models import LayerExtent
from moment.workload.sampler import Block

__all__ = ["LiveStorage", "storage_bytes", "synthetic_blocks"]


def _bytes(st: torch.UntypedStorage) -> int:
    return allocation_bytes(st.nbytes(), st.device)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts: not counted
        return None


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages under `tensors` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        st = _storage(t)
        if st is not None:
            seen[st._cdata] = _bytes(st)
    return sum(seen.values())


class LiveStorage(TorchDispatchMode):
    """While active: the bytes of the tensor storages made since it started that are still alive (`live`), and
    their most at any moment (`peak`).

    Every op's outputs pass through `__torch_dispatch__` (forward, the autograd engine's backward, whose
    thread-local state carries the mode, and the optimizer's step); a storage that none of the op's inputs
    already had is new, and a weak reference says when it is freed (torch keeps a storage's Python object as
    long as the storage lives, so the reference dies with the memory, not with a Python handle). Views and
    in-place results of tensors made before (weights, the batch's features) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._held: dict[int, tuple[weakref.ref, int]] = {}
        self._lock = threading.Lock()  # CUDA's backward frees on the autograd engine's thread

    def _freed(self, key: int, _ref: weakref.ref) -> None:
        with self._lock:
            _, n = self._held.pop(key, (None, 0))
            self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {st._cdata for t in _tensors((args, kwargs)) if (st := _storage(t)) is not None}
        for t in _tensors(out):
            st = _storage(t)
            if st is None:
                continue
            key, n = st._cdata, _bytes(st)
            with self._lock:
                if key in self._held:  # seen before; it may have been resized (an out= argument)
                    ref, old = self._held[key]
                    self._held[key] = (ref, n)
                    self.live += n - old
                elif key not in inputs:
                    self._held[key] = (weakref.ref(st, lambda r, k=key: self._freed(k, r)), n)
                    self.live += n
                self.peak = max(self.peak, self.live)
        return out


def synthetic_blocks(layers: Sequence[LayerExtent], *, device: torch.device | str = "cpu",
                     generator: torch.Generator | None = None) -> tuple[int, list[Block]]:
    """(nodes, blocks) of a batch of the given extent, cut as `MiniBatch.blocks()` cuts a sampled one.

    `layers`: input layer first, as `moment.runtime.train.Extent` states them (each quantity bounded on its
    own, so they need not nest exactly: the nodes and edges of each hop are the most any layer says). Nodes
    come seeds first, then each hop's new ones; hop h's edges go from any of the first nodes[h] nodes to the
    nodes hop h - 1 added, sorted by target, as the sampler orders them."""
    hops = len(layers)
    g = generator or torch.Generator().manual_seed(0)
    nodes = [max(1, layers[-1].dst)]  # cumulative: seeds, then through hop h
    edges = [0]  # cumulative: through hop h
    for h in range(1, hops + 1):
        outer = layers[hops - h]  # the layer whose inputs hop h adds
        inner = layers[hops - h - 1].dst if h < hops else 0
        nodes.append(max(nodes[-1], outer.src, inner))
        edges.append(max(edges[-1], outer.edges))
    parts = []
    for h in range(1, hops + 1):
        lo, hi = (nodes[h - 2] if h > 1 else 0), nodes[h - 1]
        e = edges[h] - edges[h - 1]
        if hi <= lo:  # the hop before added no node: its edges point at the seeds
            lo, hi = 0, nodes[0]
        parts.append(torch.stack([torch.randint(0, nodes[h], (e,), generator=g),
                                  torch.randint(lo, hi, (e,), generator=g).sort().values]))
    ei = torch.cat(parts, 1).to(device)
    return nodes[-1], [Block(ei[:, : edges[hops - i]], nodes[hops - i], nodes[hops - i - 1]) for i in range(hops)]
